"""How a block-scaled fp8 GEMM's scales reach its promoting consumers: through the pipeline's slots, beside A and B.

The scales are float32, one per row of A and 128-wide block of K (``a_scales`` (M, ceil(K / 128)): M-major with
16-byte aligned columns as :func:`~flydsl.kernels.quantize.quantize_fp8` writes them; any other strides, e.g.
row-major as users may hold them, are first copied so by the plan) and one per 128 x 128 block of B (``b_scales``
(ceil(N / 128), ceil(K / 128)), any strides). Each pipeline slot holds, besides its operand tiles, the scales of its
K step: the ``tile_m`` A scales of the tile's rows and the B scales of the tile's blocks of columns::

    A scales of slot s:  [ a[row0 + 0, kb] ... a[row0 + tile_m - 1, kb] ]    (tile_m floats, 128-byte aligned)
    B scales of slot s:  [ b[column_block, kb] ... | pad ]                    (4 floats)

A tile 64 or 128 wide lies in one block of columns: one B scale. A 192-wide tile straddles two
(:func:`b_scale_blocks`): ``b[n0 // 128, kb]`` and the next block's, and where the second begins depends on the
tile: 128 columns in for the even tiles (n0 = 384 j), 64 for the odd ones (n0 = 384 j + 192). A gated grouped GEMM's
tile (a mixture of experts' first stage) takes its B rows from two blocks, the gate rows and the up rows: it holds
two B scales, ``b[gate_block, kb]`` and ``b[up_block, kb]``, each for its half of the columns.

The producer fills them (:func:`load_step_scales`) beside the slot's operand tiles: the A scales by TMA, one box
of ``tile_m`` floats of the M-major scales (the (ceil(K / 128), M) matrix whose rows are 16-byte aligned:
:func:`~flydsl.kernels.gemm.block_scales_plan.a_scales_view`; rows past M read as zeros, their outputs are never
stored), counted in the slot's transaction bytes; the B scales (one or two floats) by ``cp.async``, after which the
producer arrives on the slot's ``full`` barrier once they have landed (the barrier counts that arrival beside the one
that arms it). A consumer that waited for the slot reads them from shared memory (:func:`step_factors`), once its
MMAs are done. Why so, and what the producer warp's lanes copying the A scales with ``cp.async`` (until 2026-12-07),
loading them in the consumers or multiplying them in the producer cost: docs/tuning/blockscale.md
(#scales-in-slots, #when-consumers-read, #scales-by-tma).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, nvvm

__all__ = [
    "BLOCK",
    "SCALE_PRODUCERS",
    "StagedScales",
    "a_scales_bytes",
    "allocate_scales",
    "b_scale_blocks",
    "load_step_scales",
    "slot_bytes",
    "step_factors",
    "tile_takes_blocks",
]

BLOCK = 128  # the scale blocks: 1 x 128 of A (per row), 128 x 128 of B
SCALE_PRODUCERS = 1  # the arrivals on a slot's full barrier besides the one arming it: the B scales' cp.async
B_SCALES = 4  # B scale places per slot (one per source block of a tile's B rows), 16 bytes


def a_scales_bytes(tile_m: int) -> int:
    """The bytes of one slot's A scales, which its TMA load brings (a transaction count of the slot)."""
    return tile_m * 4


def slot_bytes(tile_m: int) -> int:
    """The shared memory one pipeline slot's scales take: ``tile_m`` A scales and up to :data:`B_SCALES` B scales
    (one per source block of the tile's B rows)."""
    return a_scales_bytes(tile_m) + B_SCALES * 4


class StagedScales(NamedTuple):
    """The scales in global memory (``a``: the TMA descriptor of the M-major A scales,
    :func:`~flydsl.kernels.gemm.block_scales_plan.a_scales_view`; ``b``: the B scales) and their copies per slot in
    shared memory (``a_slots``: (tile_m, stages), ``b_slots``: (:data:`B_SCALES`, stages), float32)."""

    a: object
    b: object
    a_slots: object
    b_slots: object
    tile_m: int


def allocate_scales(smem, a_scales, b_scales, tile_m: int, stages: int) -> StagedScales:
    """The scales' slots in ``smem`` for a pipeline of ``stages`` slots and tiles of ``tile_m`` rows (each slot's A
    scales 128-byte aligned: a TMA box's destination)."""
    a_slots = smem.allocate(fx.Float32, fl.Layout((tile_m, stages), (1, tile_m)), alignment=128)
    b_slots = smem.allocate(fx.Float32, fl.Layout((B_SCALES, stages), (1, B_SCALES)), alignment=16)
    return StagedScales(a_scales, b_scales, a_slots, b_slots, tile_m)


def tile_takes_blocks(tile_n: int, sources: int = 1, grouped: bool = False, consumer_rows: int = 64) -> bool:
    """Whether tiles ``tile_n`` wide (of ``sources`` blocks of B rows: a gated tile's two) line up with the blocks of
    128 B rows: each source's rows dividing 128 (one B scale per source and step), or, dense and not gated, 192 wide
    (two B scales per step, :func:`b_scale_blocks`) with 64 rows per consumer (``consumer_rows``: the sums of 128
    rows beside a block's parts fill a consumer's registers at 128 columns)."""
    if tile_n == BLOCK + BLOCK // 2:
        return sources == 1 and not grouped and consumer_rows == 64
    return tile_n <= BLOCK and BLOCK % (tile_n // sources) == 0


def b_scale_blocks(tile_rows: int, sources: int) -> int:
    """The B scales a pipeline slot holds per K step for tiles of ``tile_rows`` B rows from each of ``sources`` blocks
    of rows: one per source block of a tile at most 128 wide (the gated tile's gate and up rows: one each), two for a
    192-wide tile (it straddles two blocks of 128)."""
    if sources > 1 or tile_rows <= BLOCK:
        return sources
    return 2


def load_step_scales(scales: StagedScales, stage, work, kt, b_tiles, barrier) -> None:
    """The producer's loads of K step ``kt``'s scales of a work unit into slot ``stage`` (once it is free), completing
    on ``barrier`` (the slot's ``full``): the tile's A scales by TMA (its bytes counted in the slot's transaction
    bytes), and by ``cp.async`` the B scale of each of the tile's blocks of rows: of its source blocks (one, or a gated
    tile's gate rows and its up rows: :class:`~flydsl.kernels.gemm.operands.OperandTiles`), or of the blocks of 128
    rows a 192-wide tile touches (past B's last block: the last one, whose columns are never stored), from the tile's
    first row of B (past ``work.b_row0``: a grouped GEMM's expert, whose rows start a block). The caller then arrives
    on ``barrier`` with ``arrive_on_cp_async`` (counted once the B scales have landed)."""
    a, b, a_slots, b_slots, tile_m = scales
    a.load(a_slots[None, stage], (kt, work.tile_m * tile_m), barrier)
    sources = b_tiles.sources
    b_row = work.tile_n * b_tiles.tile_rows
    if fx.const_expr(not isinstance(work.b_row0, int)):
        b_row = b_row + work.b_row0
    for i in fx.range_constexpr(b_scale_blocks(b_tiles.tile_rows, sources)):
        if fx.const_expr(sources > 1):
            block = (b_row + i * b_tiles.source_rows) // BLOCK
        else:
            block = b_row // BLOCK
            if fx.const_expr(i > 0):  # the straddling tile's next block, within B
                block = arith.minimum(block + i, b.shape[0].to(fx.Int32) - 1)
        nvvm.cp_async(b_slots, b, 4, dst_coord=(i, stage), src_coord=(block, kt))


def step_factors(scales: StagedScales, stage, rows: list, sources: int = 1, straddle=None) -> list:
    """The promotion factors of the K step in slot ``stage`` (read after waiting for it, before releasing it): for
    each of ``rows`` (the tile's rows this thread holds, from 0), ``a[row, kb] * b[block, kb]`` for each of the
    tile's ``sources`` blocks of B rows (a list per row). A 192-wide tile (``straddle``: whether its second block
    begins 128 columns in, a kernel Boolean) gets three factors per row, one per 64 columns: the first block's, the
    middle 64 columns' (the first block's or the second's) and the second block's."""
    a_slots, b_slots = scales.a_slots, scales.b_slots
    if straddle is None:
        b_scales = [b_slots[i, stage] for i in range(sources)]
    else:
        first, second = b_slots[0, stage], b_slots[1, stage]
        b_scales = [first, arith.select(straddle, first, second), second]
    return [[a_slots[row, stage] * b_scale for b_scale in b_scales] for row in rows]
