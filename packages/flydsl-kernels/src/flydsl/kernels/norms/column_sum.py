"""The norms' backward's second step: the per-CTA partial column sums (``dweight``, ``dbias``) added in a fixed
order (deterministic: no atomics) and converted to the weight's dtype (:func:`column_sum_kernel`)."""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu
from flydsl.kernels.norms.backward_common import masked_load
from flydsl.kernels.rows.reduce import thread_reduce

__all__ = ["column_sum_kernel", "column_sum_shape", "COLUMN_SUMS_MANY", "COLUMN_SUMS_FEW"]

# column_sum_kernel's blocks, (columns, slices of the partial rows): many partial rows (the register kernel's grid)
# are split over 16 slices of 32 columns; a few (clusters and teams: 4-66 groups) take one slice of 256 columns
# (docs/tuning/norms.md#column-sum-shapes).
COLUMN_SUMS_MANY, COLUMN_SUMS_FEW = (32, 16), (256, 1)

_COL_UNROLL = 8  # partial rows loaded per thread at once


def column_sum_shape(parts: int) -> tuple:
    """column_sum_kernel's block shape (columns, slices) for ``parts`` partial rows."""
    return COLUMN_SUMS_FEW if parts <= 64 else COLUMN_SUMS_MANY


@flyc.kernel
def column_sum_kernel(
    partial: fx.Tensor, dweight: fx.Tensor, dbias: fx.Tensor, sums: fx.Constexpr[int], shape: fx.Constexpr[tuple]
):
    """``dweight[c] = sum_p partial[p, c]`` and ``dbias[c] = sum_p partial[p, N + c]`` in float32, converted to
    their dtype. A block of ``shape = (columns, slices)`` (:func:`column_sum_shape`) covers ``columns`` columns:
    slice ``s`` adds partial rows ``s*8 .. s*8+7, s*8+8*slices ...`` (8 independent loads in flight per thread),
    then the slices are added through shared memory, always in the same order: deterministic."""
    lanes, count = shape
    flyc.set_kernel_attributes(threads=lanes * count)
    parts = partial.shape[0]
    n = fx.size(dweight.layout).to(fx.Int32)  # a 1-D layout's shape is a scalar
    lane = gpu.thread_idx.x % lanes
    part = gpu.thread_idx.x // lanes
    col = gpu.block_idx.x * lanes + lane
    ok = col < sums * n
    acc = fx.Float32(0.0)
    step = count * _COL_UNROLL
    for p0 in range(part * _COL_UNROLL, parts, step):
        loaded = [masked_load(partial, p0 + u, col, ok & (p0 + u < parts)) for u in range(_COL_UNROLL)]
        acc = acc + thread_reduce(loaded)
    if fx.const_expr(count > 1):
        slices = fx.SmemAllocator().allocate(fx.Float32, fl.Layout((count, lanes)))
        slices[part, lane] = acc
        gpu.barrier()
    if part == 0:
        total = acc
        if fx.const_expr(count > 1):
            total = fx.Float32(0.0)
            for s in fx.range_constexpr(count):
                total = total + slices[s, lane]
        if col < n:
            dweight[col] = total.to(dweight.dtype)
        if fx.const_expr(sums > 1):
            if (col >= n) & ok:
                dbias[col - n] = total.to(dbias.dtype)
