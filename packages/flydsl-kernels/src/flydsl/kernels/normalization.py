"""LayerNorm and RMSNorm (with the fused residual add), forward and backward, on the shared row-reduction base.

One forward kernel serves the three forwards: which inputs and outputs exist is a compile-time :class:`NormFlags`
(tensors that do not exist are passed as a placeholder that the kernel never touches). LayerNorm reduces twice from
registers (the mean, then the sum of squared deviations: no cancellation); RMSNorm once.

Backward, for ``xhat = (x - mean) * rstd`` (RMSNorm: ``x * rstd``) and ``g = dy * weight``:
``dx = rstd * (g - xhat * mean(g * xhat) - mean(g))`` (RMSNorm without the last term). ``dweight = sum_rows(dy *
xhat)`` and ``dbias = sum_rows(dy)`` are reduced in two steps, deterministically: each CTA walks a strided set of
rows (a persistent grid of about two CTAs per SM) and keeps float32 column sums in registers, written once as a
partial row; a second small kernel sums the partial rows. (Atomics would save that kernel but make the result
depend on timing, and contend on the same addresses at small N.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import cluster, gpu, math
from flydsl.kernels.host import empty_rows
from flydsl.kernels.reduction import (
    RowConfig,
    load_row,
    load_vector_chunk,
    load_vector_row,
    masked,
    row_config,
    row_done,
    row_position,
    row_reduce,
    row_smem,
    store_row,
    thread_reduce,
)

__all__ = ["NormFlags", "forward", "backward", "norm_forward_kernel", "norm_backward_kernel", "column_sum_kernel"]


@dataclass(frozen=True)
class NormFlags:
    """Which variant a norm kernel is compiled for."""

    rms: bool
    residual: bool = False  # fused add: x + residual, written to residual_out, then normalized
    weight: bool = False
    bias: bool = False
    mean: bool = False  # write the mean (LayerNorm)
    rstd: bool = False  # write rstd


def _round(values, dtype):
    """Values rounded to ``dtype`` and back (what a tensor of that dtype holds)."""
    if fx.const_expr(dtype is fx.Float32):
        return values
    return [v.to(dtype).to(fx.Float32) for v in values]


@flyc.kernel
def norm_forward_kernel(
    x: fx.Tensor,
    residual: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    residual_out: fx.Tensor,
    mean_out: fx.Tensor,
    rstd_out: fx.Tensor,
    eps: fx.Float32,
    cfg: fx.Constexpr[RowConfig],
    flags: fx.Constexpr[NormFlags],
):
    rows, n = x.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=1 if flags.rms else 2)
    inv_n = 1.0 / n.to(fx.Float32)
    xs, masks = load_row(cfg, x, pos, n, rows)
    if fx.const_expr(flags.residual):
        rs, _ = load_row(cfg, residual, pos, n, rows)
        xs = _round([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
        store_row(cfg, residual_out, pos, n, rows, xs)
    if fx.const_expr(flags.rms):
        mean = fx.Float32(0.0)
        centered = xs
        squares = row_reduce(cfg, pos, smem, 0, thread_reduce([v * v for v in xs]), last=True)
    else:
        mean = row_reduce(cfg, pos, smem, 0, thread_reduce(xs)) * inv_n
        centered = masked([v - mean for v in xs], masks)  # the padding is 0, not -mean
        squares = row_reduce(cfg, pos, smem, 1, thread_reduce([d * d for d in centered]), last=True)
    rstd = math.rsqrt(squares * inv_n + eps)

    def normalized(j):  # chunk j of the output: weight and bias loaded next to its store
        ys = [d * rstd for d in centered[j * cfg.vec : (j + 1) * cfg.vec]]
        if fx.const_expr(flags.weight):
            ys = [y * w for y, w in zip(ys, load_vector_chunk(cfg, weight, pos, n, j), strict=True)]
        if fx.const_expr(flags.bias):
            ys = [y + b for y, b in zip(ys, load_vector_chunk(cfg, bias, pos, n, j), strict=True)]
        return ys

    store_row(cfg, out, pos, n, rows, normalized)
    if fx.const_expr(flags.mean or flags.rstd):
        if pos.leader & (pos.row < rows):
            if fx.const_expr(flags.mean):
                mean_out[pos.row] = mean
            if fx.const_expr(flags.rstd):
                rstd_out[pos.row] = rstd
    row_done(cfg)


@flyc.kernel
def norm_backward_kernel(
    dy: fx.Tensor,
    x: fx.Tensor,
    weight: fx.Tensor,
    mean_in: fx.Tensor,
    rstd_in: fx.Tensor,
    dx: fx.Tensor,
    dw_partial: fx.Tensor,
    db_partial: fx.Tensor,
    cfg: fx.Constexpr[RowConfig],
    flags: fx.Constexpr[NormFlags],
):
    """Rows ``g * rows_per_cta + row_in_cta`` for ``g = group, group + groups, ...``; column sums of ``dy * xhat``
    and ``dy`` go to row ``group * rows_per_cta + row_in_cta`` of the partial tensors."""
    rows, n = x.shape
    groups = gpu.grid_dim.x // cfg.cluster
    pos = row_position(cfg)
    first_row = pos.row
    smem = row_smem(cfg, phases=2)
    inv_n = 1.0 / n.to(fx.Float32)
    ws = [fx.Float32(1.0)] * (cfg.chunks * cfg.vec)
    if fx.const_expr(flags.weight):
        ws = load_vector_row(cfg, weight, pos, n)
    dw_acc = [fx.Float32(0.0)] * (cfg.chunks * cfg.vec)
    db_acc = [fx.Float32(0.0)] * (cfg.chunks * cfg.vec)
    row_groups = (rows + (cfg.rows_per_cta - 1)) // cfg.rows_per_cta
    for grp in range(gpu.block_idx.x // cfg.cluster, row_groups, groups):  # the same trip count for the whole CTA
        row = grp * cfg.rows_per_cta + pos.row_in_cta
        pos.row = row
        valid = row < rows
        safe_row = fx.arith.select(valid, row, fx.Index(0))
        rstd = rstd_in[safe_row]
        dys, _ = load_row(cfg, dy, pos, n, rows)
        xs, masks = load_row(cfg, x, pos, n, rows)
        if fx.const_expr(flags.rms):
            xhat = [v * rstd for v in xs]
        else:
            mu = mean_in[safe_row]
            xhat = masked([(v - mu) * rstd for v in xs], masks)
        g = [a * w for a, w in zip(dys, ws, strict=True)]
        c1 = row_reduce(cfg, pos, smem, 0, thread_reduce([a * b for a, b in zip(g, xhat, strict=True)])) * inv_n
        if fx.const_expr(flags.rms):
            c2 = fx.Float32(0.0)
            _row_barrier(cfg)  # one reduction per row: keep the next row's writes after this row's reads
        else:
            c2 = row_reduce(cfg, pos, smem, 1, thread_reduce(g)) * inv_n
        store_row(cfg, dx, pos, n, rows, [rstd * (a - h * c1 - c2) for a, h in zip(g, xhat, strict=True)])
        dw_acc = [acc + a * h for acc, a, h in zip(dw_acc, dys, xhat, strict=True)]
        db_acc = [acc + a for acc, a in zip(db_acc, dys, strict=True)]
    pos.row = first_row
    partial_rows = groups * cfg.rows_per_cta
    if fx.const_expr(flags.weight):
        store_row(cfg, dw_partial, pos, n, partial_rows, dw_acc)
        if fx.const_expr(flags.bias):
            store_row(cfg, db_partial, pos, n, partial_rows, db_acc)
    if fx.const_expr(cfg.cluster > 1):
        cluster.sync()  # peers may still read this CTA's partials


def _row_barrier(cfg: RowConfig):
    if fx.const_expr(cfg.warps_per_row > 1):
        gpu.barrier()
    if fx.const_expr(cfg.cluster > 1):
        cluster.sync()


_COL_VEC, _COL_LANES, _COL_SLICES = 4, 32, 8  # column reduction: 4 columns per thread, 32 x 8 threads per block


def _masked_load(t, row, col, ok):
    return fx.arith.select(ok, t[row, fx.arith.select(ok, col, fx.Int32(0))], fx.Float32(0.0))


@flyc.kernel
def column_sum_kernel(partial: fx.Tensor, out: fx.Tensor):
    """``out[c] = sum_p partial[p, c]`` in float32 (out in its own dtype): a block covers 128 columns; its 8 warps
    take every 8th partial row, then add their sums through shared memory."""
    parts, n = partial.shape
    lane = gpu.thread_idx.x % _COL_LANES
    part = gpu.thread_idx.x // _COL_LANES
    col = (gpu.block_idx.x * _COL_LANES + lane) * _COL_VEC
    ok = col < n
    acc = [fx.Float32(0.0)] * _COL_VEC
    for p in range(part, parts, _COL_SLICES):
        acc = [acc[e] + _masked_load(partial, p, col + e, ok & (col + e < n)) for e in range(_COL_VEC)]
    sums = fx.SmemAllocator().allocate(fx.Float32, fl.Layout((_COL_SLICES, _COL_LANES * _COL_VEC)))
    for e in fx.range_constexpr(_COL_VEC):
        sums[part, lane * _COL_VEC + e] = acc[e]
    gpu.barrier()
    if part == 0:
        for e in fx.range_constexpr(_COL_VEC):
            total = fx.Float32(0.0)
            for s in fx.range_constexpr(_COL_SLICES):
                total = total + sums[s, lane * _COL_VEC + e]
            if col + e < n:
                out[col + e] = total.to(out.dtype)


@functools.lru_cache(maxsize=1)
def _sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _launch(kernel, cfg: RowConfig, grid: int, *args) -> None:
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    kernel(*args, cfg).launch(grid=grid, block=cfg.block, cluster=cluster_shape)


def forward(x, residual, weight, bias, out, residual_out, mean, rstd, eps: float, rms: bool) -> None:
    """Launches the forward on validated :class:`~flydsl.kernels.host.RowTensor` arguments (None where absent)."""
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = NormFlags(
        rms, residual is not None, weight is not None, bias is not None, mean is not None, rstd is not None
    )
    cfg = row_config(n, x.dtype, held=2 if residual is not None else 1)
    placeholder = x.obj
    args = [t.obj if t is not None else placeholder for t in (x, residual, weight, bias, out, residual_out, mean, rstd)]
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    norm_forward_kernel(*args, eps, cfg, flags).launch(grid=cfg.grid(rows), block=cfg.block, cluster=cluster_shape)


def backward(dy, x, weight, mean, rstd, dx, dweight, dbias, rms: bool) -> None:
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = NormFlags(rms, weight=weight is not None, bias=dbias is not None)
    cfg = row_config(n, x.dtype, held=4)
    groups = min(-(-rows // cfg.rows_per_cta), max(1, 2 * _sm_count() // cfg.cluster))
    partial_rows = groups * cfg.rows_per_cta
    dw_partial = db_partial = x.obj
    if weight is not None:
        dw_partial = empty_rows(x, (partial_rows, n), "dweight partial sums")
        db_partial = empty_rows(x, (partial_rows, n), "dbias partial sums") if dbias is not None else dw_partial
    placeholder = x.obj
    mean_obj = mean.obj if mean is not None else rstd.obj
    w_obj = weight.obj if weight is not None else placeholder
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    norm_backward_kernel(dy.obj, x.obj, w_obj, mean_obj, rstd.obj, dx.obj, dw_partial, db_partial, cfg, flags).launch(
        grid=groups * cfg.cluster, block=cfg.block, cluster=cluster_shape
    )
    for partial, target in ((dw_partial, dweight), (db_partial, dbias)):
        if target is not None:
            blocks = -(-n // (_COL_LANES * _COL_VEC))
            column_sum_kernel(partial, target.obj).launch(grid=blocks, block=_COL_LANES * _COL_SLICES)
