"""The host side of a block-scaled GEMM's scales (no GPU): the checks of their geometry and of a configuration that
lines up with their blocks, and how the kernel reads the A scales (:func:`a_scales_view`: by TMA, from M-major
columns of 16 bytes, copied so first where they are not). The device side is :mod:`~flydsl.kernels.gemm.block_scales`.
"""

from __future__ import annotations

from typing import NamedTuple

from flydsl.kernels.gemm.block_scales import BLOCK, slot_bytes, tile_takes_blocks
from flydsl.kernels.gemm.config import SMEM_BYTES, GemmConfig, max_stages
from flydsl.kernels.gemm.operands import MatrixSpec, TmaView

__all__ = ["M_MAJOR_COPY", "ScalesPlan", "a_scales_view", "check_block_scales"]

M_MAJOR_COPY = ("transpose", "pad_rows", "transpose")  # preparation steps: a copy in M-major columns of 16 bytes


def a_scales_view(matrix: MatrixSpec, tile_m: int) -> tuple:
    """How the kernel reads the (M, ceil(K / 128)) float32 A scales ``matrix``: (the scales as read, their
    :class:`~flydsl.kernels.gemm.operands.TmaView`: boxes of one K block's ``tile_m`` rows of the (ceil(K / 128), M)
    transpose, the preparation steps that copy them so: () where ``matrix`` is M-major with 16-byte aligned columns
    already, as ``quantize_fp8(x, "group")`` writes them, else :data:`M_MAJOR_COPY`)."""
    (m, blocks), (row_stride, block_stride) = matrix.shape, matrix.strides
    aligned_m = -(-m // 4) * 4
    if blocks == 1:
        block_stride = aligned_m  # one row of the transpose: its stride is never followed
    steps = ()
    if not (matrix.aligned and (row_stride == 1 or m == 1) and block_stride % 4 == 0 and block_stride >= m):
        matrix, block_stride, steps = MatrixSpec((m, blocks), (1, aligned_m), "f32", True), aligned_m, M_MAJOR_COPY
    return matrix, TmaView((blocks, m), (block_stride, 1), "f32", (1, tile_m), "MN", swizzle=0), steps


class ScalesPlan(NamedTuple):
    """The scales of a block-scaled GEMM as its kernel reads them: ``a`` and ``b`` (their geometry), ``a_view`` (the A
    scales' TMA view) and ``a_steps`` (the preparation that copies the A scales so, or ())."""

    a: MatrixSpec
    b: MatrixSpec
    a_view: TmaView
    a_steps: tuple


def check_block_scales(
    block_scales: tuple, m: int, n: int, k: int, cfg: GemmConfig, sources: int = 1, grouped: bool = False
) -> ScalesPlan:
    """The :class:`ScalesPlan` of ``block_scales`` (the geometry of the float32 (M, ceil(K / 128)) A scales and
    (ceil(N / 128), ceil(K / 128)) B scales, any strides) after checking them and a configuration whose K steps and
    tiles line up with the blocks (``sources``: the blocks of B rows a tile takes, a gated tile's two; ``grouped``: a
    grouped GEMM's, whose A scales the routing writes M-major: no copy)."""
    blocks = -(-k // BLOCK)
    if (
        cfg.tile_k != BLOCK
        or not tile_takes_blocks(cfg.tile_n, sources, grouped, cfg.consumer_rows)
        or cfg.schedule != "cooperative"
    ):
        raise ValueError(
            f"blockscale_gemm config: {cfg}: expected tile_k {BLOCK}, a tile_n of at most {BLOCK} whose blocks of B"
            f" rows divide {BLOCK} (or of {BLOCK + BLOCK // 2}, two blocks, in a dense GEMM with 64 rows per"
            " consumer) and the cooperative schedule (one scale block per K step, one B scale per block of rows)"
        )
    if cfg.stages * (cfg.stage_bytes(1) + slot_bytes(cfg.tile_m)) > SMEM_BYTES - 1024:
        raise ValueError(
            f"blockscale_gemm config: {cfg}: {cfg.stages} slots of {cfg.stage_bytes(1)} operand bytes and"
            f" {slot_bytes(cfg.tile_m)} of scales do not fit in shared memory ({SMEM_BYTES - 1024} bytes); expected at"
            f" most {max_stages(cfg.tile_m, cfg.tile_n, store_boxes=0, slot_extra=slot_bytes(cfg.tile_m))} stages"
        )
    a_scales, b_scales = block_scales
    for name, matrix, shape in (("a_scales", a_scales, (m, blocks)), ("b_scales", b_scales, (-(-n // BLOCK), blocks))):
        if matrix.dtype != "f32" or tuple(matrix.shape) != shape:
            raise ValueError(
                f"blockscale_gemm {name}: expected a float32 {shape} tensor, got {matrix.dtype} {tuple(matrix.shape)}"
            )
    read, view, steps = a_scales_view(a_scales, cfg.tile_m)
    if grouped and steps:
        raise ValueError(
            f"gemm_ws_grouped: expected M-major a scales with 16-byte aligned columns, got strides {a_scales.strides}"
        )
    return ScalesPlan(read, b_scales, view, steps)
