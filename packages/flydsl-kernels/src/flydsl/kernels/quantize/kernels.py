"""The fp8 quantizer's kernels: rows read once into registers (the row kernels' layout, :mod:`flydsl.kernels.rows`),
their amax reduced, and each value cast to fp8 by the hardware's saturating conversion.

One kernel, three modes (:class:`QuantizeSpec`):

* ``"row"``: each row's scale ``amax / fp8_max`` (one scale per token, or per output channel of a weight) is written,
  and the row cast with it: one read, one write;
* ``"amax"``: each row's amax is raised into one float32 word (``red.max`` on its bits): the tensor's amax;
* ``"cast"``: every row cast with the tensor's scale from that word (written once, by the first row's leader).

Per tensor is ``"amax"`` then ``"cast"``: two reads and one write, the least a tensor larger than the L2 allows.
A row of zeros gets scale 0 and zeros (never 0 / 0); NaN in a row makes its scale NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import arith, nvvm
from flydsl.kernels.rows.layout import RowConfig, forward_row_config
from flydsl.kernels.rows.reduce import row_done, row_reduce, row_smem, thread_reduce
from flydsl.kernels.rows.tiles import load_row, row_position, store_row_fp8

ir = lazy_import("mlir.ir")

__all__ = ["FP8_MAX", "TINY", "QuantizeSpec", "quantize_row_config", "quantize_rows_kernel"]

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}  # the largest finite values
TINY = 1e-30  # amax below this (zeros) casts with scale 1 / 0 avoided: values stay 0


@dataclass(frozen=True)
class QuantizeSpec:
    """``mode`` "row", "amax" or "cast" (module docstring) and the fp8 format ``fmt`` ("e4m3", "e5m2")."""

    mode: str
    fmt: str = "e4m3"

    def __post_init__(self):
        if self.mode not in ("row", "amax", "cast") or self.fmt not in FP8_MAX:
            raise ValueError(f"{self}: mode must be row, amax or cast and fmt e4m3 or e5m2")


HALF_CTA_CHUNKS = 6  # at most: chunks per thread of a row taken by 512 threads rather than 1024 (quantize_row_config)


def quantize_row_config(n: int, dtype: str) -> RowConfig:
    """The row kernels' forward configuration, but a row that would take 1024 threads takes 512 where each then
    holds at most :data:`HALF_CTA_CHUNKS` chunks (54 registers at 5: two CTAs per SM): N = 18432 bf16 ran 0.88 of a
    copy on 1024 threads x 3 chunks (the third a quarter full, 32 warps in the amax's reduction) and 1.00 on 512 x 5
    (H100, ``quantize_bench.py --shapes 4096x18432 --granularities token --row-config``, 2026-12-05)."""
    cfg = forward_row_config(n, dtype)
    if cfg.cluster > 1 or cfg.threads_per_row != 1024:
        return cfg
    chunks = -(-n // (cfg.vec * 512))
    return replace(cfg, threads_per_row=512, chunks=chunks) if chunks <= HALF_CTA_CHUNKS else cfg


@flyc.kernel
def quantize_rows_kernel(
    x: fx.Tensor, out: fx.Tensor, scales: fx.Tensor, amax: fx.Tensor, cfg: fx.Constexpr[RowConfig], spec: fx.Constexpr
):
    """``out`` (rows, N) bytes (the fp8 tensor viewed as uint8) of ``x`` (rows, N) float32/f16/bf16; ``scales``
    float32, (rows,) for mode "row", (1,) for "cast" (unread by "amax"); ``amax`` one int32 word, zero before "amax"
    (unread by "row")."""
    rows, n = x.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=1)
    xs, _ = load_row(cfg, x, pos, n, rows)
    fp8_max = FP8_MAX[spec.fmt]
    if fx.const_expr(spec.mode != "cast"):
        magnitudes = [arith.maximum(v, 0.0 - v) for v in xs]  # |v|, NaN kept
        row_amax = row_reduce(cfg, pos, smem, 0, thread_reduce(magnitudes, "max"), "max", last=True)
    if fx.const_expr(spec.mode == "amax"):
        if pos.leader & (pos.row < rows):
            nvvm.red_max_relaxed(amax, arith.bitcast(ir.IntegerType.get_signless(32), row_amax), 0)
    else:
        if fx.const_expr(spec.mode == "cast"):
            row_amax = arith.bitcast(ir.F32Type.get(), amax[0])
        scale = row_amax * (1.0 / fp8_max)
        inverse = fp8_max / arith.maximum(row_amax, TINY)  # NaN amax: NaN values, as the scale
        store_row_fp8(cfg, out, pos, n, rows, [v * inverse for v in xs], spec.fmt)
        if fx.const_expr(spec.mode == "row"):
            if pos.leader & (pos.row < rows):
                scales[pos.row] = scale
        else:
            if pos.leader & (pos.row == 0):
                scales[0] = scale
    row_done(cfg)
