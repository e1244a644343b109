"""LayerNorm's and RMSNorm's backward: the kernel and its launch.

For ``xhat = (x - mean) * rstd`` (RMSNorm: ``x * rstd``) and ``g = dy * weight``:
``dx = rstd * (g - xhat * mean(g * xhat) - mean(g))`` (RMSNorm without the last term). A persistent grid walks the
rows, in registers (:mod:`.backward_register`) or through a shared-memory ring (:mod:`.backward_staged`), as the
route says. ``dweight = sum_rows(dy * xhat)`` and ``dbias = sum_rows(dy)`` are reduced in two steps,
deterministically: each CTA group keeps float32 column sums of its columns, written once as a row of a partial
tensor, which :func:`~flydsl.kernels.norms.column_sum.column_sum_kernel` then sums in a fixed order (atomics would
save that kernel but make the result depend on timing). A few rows (at most :data:`DIRECT_ROW_GROUPS` of a CTA's row
groups) take one CTA that writes dweight and dbias itself: one launch instead of two, no partial tensor; at such
sizes the host's time per launch (~4 us) is longer than the kernel's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import cluster, gpu
from flydsl.kernels.device import sm_count
from flydsl.kernels.memory import allocated, can_allocate, empty_rows
from flydsl.kernels.norms.api import NormGradients
from flydsl.kernels.norms.backward_common import BackwardRows, BackwardTensors, PartialRow, store4, sum_index
from flydsl.kernels.norms.backward_register import rows_prefetched, rows_two_pass, write_partial
from flydsl.kernels.norms.backward_staged import rows_staged
from flydsl.kernels.norms.column_sum import column_sum_kernel, column_sum_shape
from flydsl.kernels.plans import ScratchPlan
from flydsl.kernels.rows.configs import BackwardConfig, NormFlags
from flydsl.kernels.rows.launch import device_groups, launch_rows, team_exchange
from flydsl.kernels.rows.reduce import row_smem
from flydsl.kernels.rows.router import Route, RowOp, route
from flydsl.kernels.rows.tiles import row_position
from flydsl.kernels.validation import rows_aligned

__all__ = ["norm_backward_kernel", "backward", "backward_plan", "backward_route", "direct_rows", "DIRECT_ROW_GROUPS"]

# Row groups (rows / rows_per_cta) that one CTA walks alone where the plan goes direct: a walk of 4 row groups costs
# a few microseconds of GPU time, about what the column-sum kernel's launch costs the host.
DIRECT_ROW_GROUPS = 4


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the staged kernel's pushes)
def norm_backward_kernel(
    dy: fx.Tensor,
    x: fx.Tensor,
    weight: fx.Tensor,
    mean_in: fx.Tensor,
    rstd_in: fx.Tensor,
    dx: fx.Tensor,
    dweight: fx.Tensor,
    dbias: fx.Tensor,
    partial: fx.Tensor,
    exchange: fx.Tensor,
    cfg: fx.Constexpr[BackwardConfig],
    flags: fx.Constexpr[NormFlags],
):
    """A persistent grid: CTA group ``g`` (a CTA, a cluster or a team) takes row groups ``g, g + groups, ...``. The
    column sums go to row ``g`` of ``partial``: ``(groups, sums * N)`` float32, dweight in the first N columns, dbias
    in the next N; with ``cfg.direct`` (one CTA) to ``dweight`` and ``dbias`` instead, converted to their dtype
    (else they and ``partial`` may be any tensor: unused). ``exchange``: a team's row sums (``(rows,
    exchange_columns(cfg))`` float32, zeroed), else any tensor (unused)."""
    rc = cfg.row
    rows, n = x.shape
    groups = gpu.grid_dim.x // rc.cluster
    pos = row_position(rc)
    flyc.set_kernel_attributes(min_blocks_per_sm=cfg.blocks_per_sm)
    group = gpu.block_idx.x // rc.cluster
    smem = row_smem(rc, phases=2, values=1 if flags.rms else 2)
    sums_smem = None
    if fx.const_expr(cfg.sums > 0 and cfg.smem_sums):
        sums_smem = fx.SmemAllocator().allocate(fx.Float32, cfg.sums * rc.block * rc.chunks * rc.vec, alignment=16)
    partial_row = PartialRow(cfg, partial, group, pos, n)
    zeros = [fx.Float32(0.0)] * 4
    for s in fx.range_constexpr(0 if cfg.staged else cfg.sums):  # the staged kernel writes its sums once, at the end
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                if fx.const_expr(cfg.smem_sums):
                    store4(fx.local_tile(sums_smem, (4,), (sum_index(cfg, pos, s, pos.row_in_cta, j, q),)), zeros)
                else:
                    partial_row.store(s, j, q, zeros)
    row_groups = (rows + (rc.rows_per_cta - 1)) // rc.rows_per_cta
    ctx = BackwardRows(
        cfg=cfg,
        flags=flags,
        tensors=BackwardTensors(dy, x, weight, mean_in, rstd_in, dx, dweight, dbias),
        smem=smem,
        sums_smem=sums_smem,
        partial_row=partial_row,
        pos=pos,
        n=n,
        rows=rows,
        group=group,
        groups=groups,
        row_groups=row_groups,
        exchange=exchange,
    )
    # Without fma contraction: with it, ptxas spills in the staged bf16 configs whose column sums fill the registers.
    with fx.fp_contract(False):
        if fx.const_expr(cfg.staged):
            rows_staged(ctx)
        elif fx.const_expr(cfg.two_pass):
            rows_two_pass(ctx)
        else:
            rows_prefetched(ctx)
    if fx.const_expr(cfg.sums > 0 and cfg.smem_sums):
        # The CTA's row slots summed (in a fixed order) into its partial row.
        if fx.const_expr(rc.rows_per_cta > 1):
            gpu.barrier()
        if pos.row_in_cta == 0:
            write_partial(ctx)
    if fx.const_expr(rc.cluster_shape is not None):
        cluster.sync()  # peers may still read this CTA's reduction slots


def direct_rows(cfg: BackwardConfig, rows: int) -> bool:
    """Whether ``rows`` rows take ``cfg``'s kernel in one CTA that writes dweight/dbias itself: a config that can be
    direct (:attr:`~flydsl.kernels.rows.configs.BackwardConfig.can_be_direct`), at most :data:`DIRECT_ROW_GROUPS`
    row groups."""
    return cfg.can_be_direct and -(-rows // cfg.row.rows_per_cta) <= DIRECT_ROW_GROUPS


@functools.cache
def _flags(rms: bool, weight: bool, bias: bool) -> NormFlags:
    """One NormFlags object per variant: the native dispatcher then matches it by identity, without hashing."""
    return NormFlags(rms=rms, weight=weight, bias=bias)


def backward_route(t: NormGradients, rms: bool) -> Route:
    """The route :func:`backward` takes for ``t``."""
    rows, n = t.x.shape
    sums = 0 if t.weight is None else (2 if t.dbias is not None else 1)
    op = RowOp.RMS_NORM_BACKWARD if rms else RowOp.LAYER_NORM_BACKWARD
    return route(
        op,
        n,
        t.x.dtype,
        rows_aligned=rows_aligned(t.dy, t.x, t.dx),
        sms=sm_count(t.x.device),
        scratch=can_allocate(t.x),
        sums=sums,
    )


def backward(t: NormGradients, rms: bool, chosen: Route | None = None) -> None:
    """Launches the backward on validated tensors along ``chosen`` (default :func:`backward_route`), then the column
    sums' kernel where there are any."""
    backward_plan(t, rms, chosen)(*(None if v is None else v.obj for v in t))


def backward_plan(t: NormGradients, rms: bool, chosen: Route | None = None) -> Callable:
    """The launches :func:`backward` makes for tensors of ``t``'s signature (:mod:`flydsl.kernels.plans`), as a
    function of the raw tensors in :class:`NormGradients`' order, with the route, the flags and the grids fixed; per
    call it allocates the partial column sums and a team's exchange (a :class:`~flydsl.kernels.plans.ScratchPlan`
    where it does: made per call, the launches replayed; torch's partial sums alone are ``made``, so a replay makes
    them itself)."""
    rows, n = t.x.shape
    if rows == 0 or n == 0:
        return _nothing
    cfg = (chosen or backward_route(t, rms)).config
    if not isinstance(cfg, BackwardConfig):
        raise ValueError(f"norms backward: no kernel takes a route with {cfg} (a BackwardConfig)")
    if direct_rows(cfg, rows):
        cfg = dataclasses.replace(cfg, direct=True)
    sums = 0 if cfg.direct else cfg.sums  # column sums left to the second kernel
    groups = 1 if cfg.direct else device_groups(cfg, rows, t.x.device)
    flags = _flags(rms, t.weight is not None, t.dbias is not None)
    shape = column_sum_shape(groups)
    sum_grid, sum_block = -(-sums * n // shape[0]), shape[0] * shape[1]
    scratch = bool(sums) or cfg.row.team

    def memory(dy, x, weight, mean, rstd, dx, dweight, dbias) -> tuple:
        like = allocated(x) if scratch else None
        partial = empty_rows(like, (groups, sums * n), "dweight/dbias partial sums", scratch=True) if sums else x
        exchange = team_exchange(cfg, like, rows, "backward row sums") if cfg.row.team else x
        return partial, exchange

    def launch(dy, x, weight, mean, rstd, dx, dweight, dbias, partial, exchange):
        args = (dy, x, weight if weight is not None else x, mean if mean is not None else rstd, rstd, dx)
        sums_out = (dweight, dbias if dbias is not None else dweight) if cfg.direct else (partial, partial)
        launch_rows(norm_backward_kernel, (*args, *sums_out, partial, exchange, cfg, flags), cfg, groups)
        if sums:
            column_sum_kernel(partial, dweight, dbias if dbias is not None else dweight, sums, shape).launch(
                grid=sum_grid, block=sum_block
            )

    if not scratch:
        return lambda dy, x, weight, mean, rstd, dx, dweight, dbias: launch(
            dy, x, weight, mean, rstd, dx, dweight, dbias, x, x
        )
    if cfg.row.team or not t.x.is_torch:
        return ScratchPlan(memory, launch)
    import torch

    # Only the partial sums: fresh float32 rows that a replay makes itself (no Python per call).
    def partials(dy, x, *rest) -> tuple:
        return memory(dy, x, *rest)[:1]

    def launch_partials(dy, x, weight, mean, rstd, dx, dweight, dbias, partial):
        launch(dy, x, weight, mean, rstd, dx, dweight, dbias, partial, x)

    return ScratchPlan(partials, launch_partials, ((1, (groups, sums * n), torch.float32),))


def _nothing(*args) -> None:
    """The plan of an empty input: no launch."""
