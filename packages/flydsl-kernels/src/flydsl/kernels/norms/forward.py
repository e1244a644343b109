"""LayerNorm's and RMSNorm's forwards (the fused residual add included): the three kernels and their launch.

One kernel of each kind serves the three forwards; which inputs and outputs exist is a compile-time
:class:`~flydsl.kernels.rows.configs.NormFlags` (tensors that do not exist are passed as a placeholder that the kernel
never touches). The register kernel (:func:`norm_forward_kernel`) holds a row in registers and reduces from there
(LayerNorm twice: the mean, then the squared deviations, no cancellation); the looped kernel
(:func:`norm_forward_looped_kernel`) walks a row twice in segments, LayerNorm's statistics merged by Chan's update;
the staged kernel (:func:`norm_forward_staged_kernel`) takes long rows through a shared-memory ring
(:func:`~flydsl.kernels.rows.staged_forward.rows_staged_forward`). Which runs: :func:`forward_route`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, math, nvvm
from flydsl.kernels.device import sm_count
from flydsl.kernels.memory import can_allocate
from flydsl.kernels.norms.api import NormTensors
from flydsl.kernels.rows.configs import LoopedForwardConfig, NormFlags, StagedForwardConfig
from flydsl.kernels.rows.launch import device_groups, launch_rows, staged_plan
from flydsl.kernels.rows.layout import RowConfig
from flydsl.kernels.rows.reduce import masked_sum, moments_merge, row_done, row_reduce, row_smem, thread_reduce
from flydsl.kernels.rows.router import Route, RowKernel, RowOp, route
from flydsl.kernels.rows.staged_forward import RowTensors, rows_staged_forward
from flydsl.kernels.rows.tiles import (
    load_row,
    load_vector_chunk,
    load_vector_chunks_raw,
    rounded,
    row_position,
    segment_chunks,
    segment_count,
    store_row,
    vector_chunk,
)
from flydsl.kernels.validation import rows_aligned, vectors_aligned

__all__ = [
    "norm_forward_kernel",
    "norm_forward_looped_kernel",
    "norm_forward_staged_kernel",
    "forward",
    "forward_plan",
    "forward_route",
]


def _weights_early(cfg: RowConfig, *vectors) -> bool:
    """Whether the register forward loads its weight and bias chunks together with x (held in their dtype until
    used), so that a row waits once for all its loads: 16-bit rows of a warp or less whose ``vectors`` (the ones the
    kernel reads) are 16-bit; wider rows and float32 vectors lose occupancy
    (docs/tuning/norms.md#register-forward-layouts)."""
    return cfg.threads_per_row <= 32 and cfg.dtype != "f32" and all(t.dtype.width == 16 for t in vectors)


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
    early = _weights_early(cfg, *(t for t, read in ((weight, flags.weight), (bias, flags.bias)) if read))
    w_kept = load_vector_chunks_raw(cfg, weight, pos, n) if early and flags.weight else None
    b_kept = load_vector_chunks_raw(cfg, bias, pos, n) if early and flags.bias else None
    if fx.const_expr(flags.residual):
        rs, _ = load_row(cfg, residual, pos, n, rows)
        xs = rounded([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
        store_row(cfg, residual_out, pos, n, rows, xs)
    if fx.const_expr(flags.rms):
        mean = fx.Float32(0.0)
        centered = xs
        squares = row_reduce(cfg, pos, smem, 0, thread_reduce([v * v for v in xs]), last=True)
    else:
        mean = row_reduce(cfg, pos, smem, 0, thread_reduce(xs)) * inv_n
        centered = [v - mean for v in xs]  # -mean in the padding: left out of the squares, never stored
        squares = row_reduce(cfg, pos, smem, 1, masked_sum(cfg, [d * d for d in centered], masks), last=True)
    rstd = math.rsqrt(squares * inv_n + eps)

    def normalized(j):  # chunk j of the output
        ys = [d * rstd for d in centered[j * cfg.vec : (j + 1) * cfg.vec]]
        if fx.const_expr(flags.weight):
            ys = [y * w for y, w in zip(ys, vector_chunk(cfg, weight, pos, n, j, w_kept), strict=True)]
        if fx.const_expr(flags.bias):
            ys = [y + b for y, b in zip(ys, vector_chunk(cfg, bias, pos, n, j, b_kept), strict=True)]
        return ys

    store_row(cfg, out, pos, n, rows, normalized)
    _store_stats(flags, pos, rows, mean_out, rstd_out, mean, rstd)
    row_done(cfg)


def _store_stats(flags: NormFlags, pos, rows, mean_out, rstd_out, mean, rstd) -> None:
    """The row's statistics, where the flags ask for them, by its leader thread."""
    if fx.const_expr(flags.mean or flags.rstd):
        if pos.leader & (pos.row < rows):
            if fx.const_expr(flags.mean):
                mean_out[pos.row] = mean
            if fx.const_expr(flags.rstd):
                rstd_out[pos.row] = rstd


@flyc.kernel
def norm_forward_looped_kernel(
    x: fx.Tensor,
    residual: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    residual_out: fx.Tensor,
    mean_out: fx.Tensor,
    rstd_out: fx.Tensor,
    eps: fx.Float32,
    cfg: fx.Constexpr[LoopedForwardConfig],
    flags: fx.Constexpr[NormFlags],
):
    """The looped forward (arguments as :func:`norm_forward_kernel`'s; see :class:`LoopedForwardConfig`): the row
    walked segment by segment, first for its statistics (RMSNorm: the sum of squares; LayerNorm: each segment's
    count, sum and squared deviations about its own mean, merged per thread and then over the row in one reduction
    by Chan's update (:func:`~flydsl.kernels.rows.reduce.moments_merge`), as torch.compile's Welford: no cancellation;
    the fused add writes ``residual_out`` in the first), then again for the output. The second read hits L1 or L2
    (``residual_out`` for the fused add)."""
    rc = cfg.row
    again = replace(rc, hints=cfg.reread)
    rows, n = x.shape
    if fx.const_expr(cfg.static_n):
        if n != cfg.static_n:  # a config built for another N
            fx.nvvm.trap()
        n = cfg.static_n
    pos = row_position(rc)
    if fx.const_expr(cfg.blocks_per_sm):
        flyc.set_kernel_attributes(min_blocks_per_sm=cfg.blocks_per_sm)
    smem = row_smem(rc, phases=1, values=1 if flags.rms else 3)
    inv_n = 1.0 / cfg.static_n if cfg.static_n else 1.0 / n.to(fx.Float32)
    segments = segment_count(rc, n)
    total = fx.Float32(0.0)  # RMSNorm: this thread's sum of squares
    count, part, deviations = fx.Float32(0.0), fx.Float32(0.0), fx.Float32(0.0)  # LayerNorm: its (count, sum, M2)
    for s in range(segments):
        seg = segment_chunks(rc, s)
        xs, in_row = load_row(rc, x, pos, n, rows, chunks=seg)
        if fx.const_expr(flags.residual):
            rs, _ = load_row(rc, residual, pos, n, rows, chunks=seg)
            xs = rounded([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
            store_row(rc, residual_out, pos, n, rows, xs, chunks=seg)
        if fx.const_expr(flags.rms):
            total = total + thread_reduce([v * v for v in xs])
        else:  # the segment's moments about its own mean (0 in the padding: left out), merged into this thread's
            here = masked_sum(rc, [fx.Float32(1.0)] * len(xs), in_row)
            summed = thread_reduce(xs)
            centre = summed * nvvm.rcp_approx(arith.maximum(here, fx.Float32(1.0)))
            spread = masked_sum(rc, [(v - centre) * (v - centre) for v in xs], in_row)
            count, part, deviations = moments_merge((count, part, deviations), (here, summed, spread))
    if fx.const_expr(flags.rms):
        mean = fx.Float32(0.0)
        squares = row_reduce(rc, pos, smem, 0, total, last=True)
    else:
        _, summed, squares = row_reduce(rc, pos, smem, 0, [count, part, deviations], moments_merge, last=True)
        mean = summed * inv_n
    rstd = math.rsqrt(squares * inv_n + eps)
    source = residual_out if flags.residual else x

    def normalized(j):  # chunk j of the output: x re-read, weights loaded (store_row: a group's before its stores)
        ys = [(v - mean) * rstd for v in load_row(again, source, pos, n, rows, chunks=[j])[0]]
        if fx.const_expr(flags.weight):
            ys = [y * w for y, w in zip(ys, load_vector_chunk(rc, weight, pos, n, j), strict=True)]
        if fx.const_expr(flags.bias):
            ys = [y + b for y, b in zip(ys, load_vector_chunk(rc, bias, pos, n, j), strict=True)]
        return ys

    for s in range(segments):
        store_row(rc, out, pos, n, rows, normalized, chunks=segment_chunks(rc, s))
    _store_stats(flags, pos, rows, mean_out, rstd_out, mean, rstd)
    row_done(rc)


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the cluster's pushes)
def norm_forward_staged_kernel(
    x: fx.Tensor,
    residual: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    residual_out: fx.Tensor,
    mean_out: fx.Tensor,
    rstd_out: fx.Tensor,
    exchange: fx.Tensor,
    eps: fx.Float32,
    cfg: fx.Constexpr[StagedForwardConfig],
    flags: fx.Constexpr[NormFlags],
):
    """The staged forward for long rows (arguments as :func:`norm_forward_kernel`'s; x, residual, out and
    residual_out 16-byte aligned rows, N a multiple of 16 bytes): a persistent grid of CTA groups (a CTA, a cluster
    or a team) walking rows through a shared-memory ring; see :func:`rows_staged_forward`. ``exchange``: a team's
    tagged pairs (:func:`forward_exchange`), else any tensor (unused)."""
    tensors = RowTensors(
        x=x,
        out=out,
        residual=residual,
        weight=weight,
        bias=bias,
        residual_out=residual_out,
        mean=mean_out,
        rstd=rstd_out,
        exchange=exchange,
    )
    rows_staged_forward(cfg, flags, tensors, eps)


@functools.cache
def _flags(rms: bool, residual: bool, weight: bool, bias: bool, mean: bool, rstd: bool) -> NormFlags:
    """One NormFlags object per variant: the native dispatcher then matches it by identity, without hashing."""
    return NormFlags(rms=rms, residual=residual, weight=weight, bias=bias, mean=mean, rstd=rstd)


def forward_route(t: NormTensors, rms: bool, staged: bool = True) -> Route:
    """The route :func:`forward` takes for ``t`` (``staged=False``: the register kernel)."""
    op = RowOp.FUSED_ADD_RMS_NORM if t.residual is not None else (RowOp.RMS_NORM if rms else RowOp.LAYER_NORM)
    return route(
        op,
        t.x.shape[1],
        t.x.dtype,
        rows_aligned=rows_aligned(*t.rows()),
        vectors_aligned=vectors_aligned(*t.vectors()),
        sms=sm_count(t.x.device),
        scratch=can_allocate(t.x),
        staged=staged,
    )


def forward(t: NormTensors, eps: float, rms: bool, chosen: Route | None = None) -> None:
    """Launches the forward on validated tensors along ``chosen`` (default :func:`forward_route`)."""
    forward_plan(t, rms, chosen)(*(_obj(v) for v in t), eps)


def forward_plan(t: NormTensors, rms: bool, chosen: Route | None = None) -> Callable:
    """The launch :func:`forward` makes for tensors of ``t``'s signature (shapes, strides, dtypes, alignment, device:
    :mod:`flydsl.kernels.plans`), as a function of the raw tensors in :class:`NormTensors`' order and ``eps``, with
    the route, the flags and the grid fixed; per call it binds the tensors (absent ones: x, which the kernel never
    touches) and a staged route's exchange (:func:`~flydsl.kernels.rows.launch.staged_plan`: a team's made per call,
    the claimed rows' counter held per stream, the launch replayed)."""
    rows, n = t.x.shape
    if rows == 0 or n == 0:
        return _nothing
    chosen = chosen or forward_route(t, rms)
    cfg = chosen.config
    if not isinstance(cfg, _CONFIGS[chosen.kernel]):
        raise ValueError(f"norms forward: no kernel takes a {chosen.kernel} route with {cfg}")
    flags = _flags(rms, *(v is not None for v in (t.residual, t.weight, t.bias, t.mean, t.rstd)))
    if chosen.kernel is RowKernel.STAGED:
        groups = device_groups(cfg, rows, t.x.device)

        def staged(x, out, residual, weight, bias, residual_out, mean, rstd, eps, exchange):
            args = _arguments(x, out, residual, weight, bias, residual_out, mean, rstd)
            launch_rows(norm_forward_staged_kernel, (*args, exchange, eps, cfg, flags), cfg, groups)

        return staged_plan(cfg, t.x, rows, staged)
    if chosen.kernel is RowKernel.LOOPED:
        kernel, grid, block, cluster = norm_forward_looped_kernel, rows, cfg.row.block, None
    else:
        kernel, grid, block = norm_forward_kernel, cfg.grid(rows), cfg.block
        cluster = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None

    def launch(x, out, residual, weight, bias, residual_out, mean, rstd, eps):
        args = _arguments(x, out, residual, weight, bias, residual_out, mean, rstd)
        kernel(*args, eps, cfg, flags).launch(grid=grid, block=block, cluster=cluster)

    return launch


def _arguments(x, out, residual, weight, bias, residual_out, mean, rstd) -> list:
    """The kernels' tensor arguments in their order; absent ones are x (a placeholder never read)."""
    return [v if v is not None else x for v in (x, residual, weight, bias, out, residual_out, mean, rstd)]


def _nothing(*args) -> None:
    """The plan of an empty input: no launch."""


def _obj(t):
    return None if t is None else t.obj


# The configuration each kind of forward kernel takes.
_CONFIGS = {RowKernel.REGISTER: RowConfig, RowKernel.LOOPED: LoopedForwardConfig, RowKernel.STAGED: StagedForwardConfig}
