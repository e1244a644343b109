"""LayerNorm and RMSNorm (with the fused residual add), forward and backward, on the shared row-reduction base.

One forward kernel serves the three forwards: which inputs and outputs exist is a compile-time :class:`NormFlags`
(tensors that do not exist are passed as a placeholder that the kernel never touches). LayerNorm reduces twice from
registers (the mean, then the sum of squared deviations: no cancellation); RMSNorm once.

Backward, for ``xhat = (x - mean) * rstd`` (RMSNorm: ``x * rstd``) and ``g = dy * weight``:
``dx = rstd * (g - xhat * mean(g * xhat) - mean(g))`` (RMSNorm without the last term). A persistent grid walks
the rows; the two row means are reduced together (one barrier, and one cluster barrier for long rows, per row) while
the next row's loads are in flight. ``dweight = sum_rows(dy * xhat)`` and ``dbias = sum_rows(dy)`` are reduced in
two steps, deterministically: each CTA (or cluster) keeps float32 column sums of its columns in shared memory (in
its partial row in global memory when they do not fit: LayerNorm past 131072), written once as a partial row;
a second small kernel sums the partial rows in a fixed order. (Atomics would save that kernel but make the result
depend on timing, and contend on the same addresses at small N.) Rows longer than the registers hold are read
twice, segment by segment, the second time from L2. See :func:`backward_config` for the layouts.

Long rows (16-bit N >= 16384, float32 N >= 16384; N a multiple of 16 bytes, rows 16-byte aligned) take the staged
kernel instead: each thread copies its chunks of dy and x rows ahead into a shared-memory ring (``cp.async``), so
that enough bytes are in flight without registers, and keeps its column sums in registers. A row split over CTAs
no longer waits at a cluster barrier per row: the CTAs push their partial sums to each other (a cluster: ``st.async``
into the peers' shared memory + mbarriers; past 8 CTAs, a team of up to 64 CTAs: tagged pairs in global memory, no
fence) and write dx ``lag`` rows later. See :func:`_rows_staged`, :func:`_rows_pushed`.

The forward of long rows (N >= 32768; f32: softmax and the fused add from 65536; at most 32 CTAs of 64 KB per row;
N a multiple of 16 bytes, rows 16-byte aligned; see :func:`forward_shape`) takes the staged kernel by default
(:func:`norm_forward_staged_kernel`; ``forward(..., staged=False)`` or ``FLYDSL_NORM_STAGED_FORWARD=0`` force the
register kernel), on the same ring and pushes: a persistent grid, x (and the residual) copied rows ahead into the
ring, each CTA's partial pair pushed to its peers (past 8 CTAs, a team: written to global memory and polled), the
output written ``lag`` rows later. LayerNorm pushes one pair
per row, ``(sum, sum of squares about the CTA's own mean)``, combined by Chan's update
(:func:`flydsl.kernels.norm_staged_forward._chan`): no cancellation, one exchange per row. Softmax's staged forward
(:mod:`flydsl.kernels.softmax_staged`) shares the kernel and the switch.

RMSNorm and the fused add at 1K-32K, float32 LayerNorm at 2K-8K (``norm_config.LOOPED_FORWARD``; 16-byte aligned
rows and weights) take the looped forward first (:func:`norm_forward_looped_kernel`): one CTA per row walks it in
segments and reads it twice, the second time from L1/L2, as torch.compile's looped reductions do: few registers, and
no more rows in flight than L2 keeps for the re-read; float32 8192 with N compiled in (``static_n``), as
torch.compile's kernels are. The register and looped forwards write their output a group of chunks at a time, the
group's loads (weights, x again) issued before its stores (``RowConfig.store_group``: a load never moves past a
store that may alias it).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from mlir.dialects import llvm as _llvm

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, cluster, gpu, math, nvvm, vector
from flydsl.kernels.host import allocated, can_allocate, claim_counter, empty_rows, max_active_clusters, sm_count
from flydsl.kernels.norm_backward_config import (
    BackwardConfig,
    backward_config,
    backward_groups,
    make_backward_config,
    resident_backward_config,
    staged_backward_config,
    staged_config,
    team_backward_config,
)
from flydsl.kernels.norm_config import (
    FORWARD_KINDS,
    FORWARD_STORE_GROUP,
    STAGED_FORWARD_MIN_N,
    LoopedForwardConfig,
    NormFlags,
    StagedForwardConfig,
    forward_shape,
    looped_forward_config,
    looped_forward_shape,
    routed_staged_forward_config,
    staged_forward_config,
)
from flydsl.kernels.norm_staged import (
    _dx,
    _round,
    _row_at,
    _row_constants,
    _row_stats,
    _rows_staged,
    exchange_columns,
)
from flydsl.kernels.norm_staged_forward import _rows_staged_forward
from flydsl.kernels.reduction import (
    PLAIN_HINTS,
    RowConfig,
    chunk_index,
    forward_row_config,
    load_row,
    load_row_raw,
    load_vector_chunk,
    load_vector_chunks_raw,
    masked_sum,
    moments_merge,
    row_done,
    row_masks,
    row_position,
    row_reduce,
    row_smem,
    segment_chunks,
    segment_count,
    store_row,
    thread_reduce,
    vector_chunk,
    widen,
)

__all__ = [
    "NormFlags",
    "BackwardConfig",
    "backward_config",
    "make_backward_config",
    "backward_groups",
    "max_active_clusters",
    "staged_backward_config",
    "staged_config",
    "team_backward_config",
    "exchange_columns",
    "StagedForwardConfig",
    "staged_forward_config",
    "routed_staged_forward_config",
    "STAGED_FORWARD_MIN_N",
    "forward_shape",
    "FORWARD_KINDS",
    "forward",
    "staged_forward_groups",
    "forward_exchange",
    "team_fits",
    "routable",
    "STAGED_FORWARD",
    "backward",
    "norm_forward_kernel",
    "norm_forward_staged_kernel",
    "norm_forward_looped_kernel",
    "norm_backward_kernel",
    "column_sum_kernel",
    "column_sum_shape",
]


def _weights_early(cfg: RowConfig, *vectors) -> bool:
    """Whether the register forward loads its weight and bias chunks together with x (held in their dtype until
    used), so that a row waits once for all its loads: for 16-bit rows of one warp (H200, LayerNorm bf16 1024: 3.77
    -> 4.24 TB/s) or less (several rows per warp: not measured). Wider rows load them next to the stores: held early
    they cost occupancy (LayerNorm bf16 2048: 4.07 -> 3.89); so do float32 weight and bias (``vectors``: the ones
    the kernel reads; 16-bit rows may have float32 ones), twice the registers."""
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
        xs = _round([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
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
    by Chan's update (:func:`~flydsl.kernels.reduction.moments_merge`), as torch.compile's Welford: no cancellation;
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
            xs = _round([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
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
    or a team) walking rows through a shared-memory ring; see :func:`_rows_staged_forward`. ``exchange``: a team's
    tagged pairs (:func:`forward_exchange`), else any tensor (unused)."""
    tensors = (x, residual, weight, bias, out, residual_out, mean_out, rstd_out, exchange)
    _rows_staged_forward(cfg, flags, tensors, eps)


def _sum_index(cfg: BackwardConfig, pos, s: int, slot, j: int, q: int):
    """Float4 index in shared memory of column sum ``s``, row slot ``slot``, chunk ``j``, quarter ``q`` of this
    thread: lanes contiguous (16-byte accesses without bank conflicts)."""
    rc = cfg.row
    return (((s * rc.rows_per_cta + slot) * rc.chunks + j) * (rc.vec // 4) + q) * rc.threads_per_row + pos.lane


def _load4(view, ok=None):
    cls = vector.vector_class(fx.Float32, 4)
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(cls(0.0).value, raw, alignment=buffer.base_alignment)
    fx.copy(view, buffer, predicate=ok)
    loaded = cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))
    return [loaded[e] for e in range(4)]


def _store4(view, values, ok=None):
    cls = vector.vector_class(fx.Float32, len(values))
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(vector.from_elements(cls.mlir_type(), values).value, raw, alignment=buffer.base_alignment)
    fx.copy(buffer, view, predicate=ok)


class _PartialRow:
    """This thread's columns of the CTA's row of the ``(groups, sums * N)`` float32 partial tensor: 16-byte
    accesses when N is a multiple of 4 (every chunk is then whole or absent), else one element at a time."""

    def __init__(self, cfg: BackwardConfig, partial, group, pos, n):
        self.cfg, self.partial, self.group, self.pos, self.n = cfg, partial, group, pos, n
        self.wide = cfg.row.even

    def _columns(self, s: int, j: int, q: int):
        col = chunk_index(self.cfg.row, self.pos, j) * self.cfg.row.vec + 4 * q
        return col, s * self.n + col

    def load(self, s: int, j: int, q: int):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            return _load4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], col < self.n)
        return [_masked_load(self.partial, self.group, at + e, col + e < self.n) for e in range(4)]

    def store(self, s: int, j: int, q: int, values):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            _store4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], values, col < self.n)
        else:
            for e in fx.range_constexpr(4):
                view = fx.local_tile(self.partial, (1, 1), (self.group, at + e))[0, None]
                _store4(view, [values[e]], col + e < self.n)


def _column_sums_add(cfg: BackwardConfig, sums_smem, partial_row, pos, chunks, terms):
    """Adds ``terms[s]`` (this thread's values of ``chunks``) to column sum ``s``."""
    for s in fx.range_constexpr(cfg.sums):
        for k, j in enumerate(chunks):
            for q in fx.range_constexpr(cfg.row.vec // 4):
                add = terms[s][(k * cfg.row.vec + 4 * q) : (k * cfg.row.vec + 4 * q + 4)]
                if fx.const_expr(cfg.smem_sums):
                    view = fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, pos.row_in_cta, j, q),))
                    old = _load4(view)
                    _store4(view, [a + b for a, b in zip(old, add, strict=True)])
                else:
                    old = partial_row.load(s, j, q)
                    partial_row.store(s, j, q, [a + b for a, b in zip(old, add, strict=True)])


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the staged kernel's pushes)
def norm_backward_kernel(
    dy: fx.Tensor,
    x: fx.Tensor,
    weight: fx.Tensor,
    mean_in: fx.Tensor,
    rstd_in: fx.Tensor,
    dx: fx.Tensor,
    partial: fx.Tensor,
    exchange: fx.Tensor,
    cfg: fx.Constexpr[BackwardConfig],
    flags: fx.Constexpr[NormFlags],
):
    """A persistent grid: CTA group ``g`` (a CTA, or a cluster for long rows) takes row groups ``g, g + groups,
    ...``. Per row: one pass loads dy and x, adds to the column sums and reduces ``sum(g * xhat)`` and ``sum(g)``
    together (one barrier per row; two slots alternate); a second writes dx (from registers, or re-reading the row
    from L2 when it does not fit). The column sums go to row ``g`` of ``partial``: ``(groups, sums * N)``
    float32, dweight in the first N columns, dbias in the next N. ``exchange``: a team's row sums and counters
    (``(rows, exchange_columns(cfg))`` float32, zeroed; see :func:`_exchange_setup`), else any tensor (unused)."""
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
    partial_row = _PartialRow(cfg, partial, group, pos, n)
    zeros = [fx.Float32(0.0)] * 4
    for s in fx.range_constexpr(0 if cfg.staged else cfg.sums):  # the staged kernel writes its sums once, at the end
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                if fx.const_expr(cfg.smem_sums):
                    _store4(fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, pos.row_in_cta, j, q),)), zeros)
                else:
                    partial_row.store(s, j, q, zeros)
    row_groups = (rows + (rc.rows_per_cta - 1)) // rc.rows_per_cta
    tensors = (dy, x, weight, mean_in, rstd_in, dx)
    # Without fma contraction: with it, ptxas spills (40 bytes) in the staged regime's register-bound bf16 configs
    # (N = 32768-131072), whose column sums fill the registers; the backward was tuned as it is.
    with fx.fp_contract(False):
        if fx.const_expr(cfg.staged):
            _rows_staged(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange)
        elif fx.const_expr(cfg.two_pass):
            _rows_two_pass(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups)
        else:
            _rows_prefetched(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups)
    if fx.const_expr(cfg.sums > 0 and cfg.smem_sums):
        # The CTA's row slots summed (in a fixed order) into its partial row.
        if fx.const_expr(rc.rows_per_cta > 1):
            gpu.barrier()
        if pos.row_in_cta == 0:
            _write_partial(cfg, sums_smem, partial_row, pos)
    if fx.const_expr(rc.cluster_shape is not None):
        cluster.sync()  # peers may still read this CTA's reduction slots


def _prefetch(rc: RowConfig, flags: NormFlags, tensors, pos, n, rows):
    """Row ``pos.row``'s dy and x chunks in their dtype (nothing read past the last row), its rstd and mean."""
    dy, x, _, mean_in, rstd_in, _ = tensors
    rstd, mu = _row_stats(flags, mean_in, rstd_in, pos.row, rows)
    return [load_row_raw(rc, dy, pos, n, rows), load_row_raw(rc, x, pos, n, rows), rstd, mu]


def _rows_prefetched(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups):
    """Rows held in registers: while a row is reduced and written, the next row's loads are in flight (in the row's
    dtype: 4 registers per chunk). In a CTA they are issued first; in a cluster after the barrier's arrive, whose
    release would otherwise wait for them (see :func:`row_reduce`)."""
    rc = cfg.row
    dx = tensors[5]
    inv_n = 1.0 / n.to(fx.Float32)
    whole = tuple(range(rc.chunks))
    parity = fx.Int32(0)
    ahead = _prefetch(rc, flags, tensors, pos, n, rows)  # pos.row: the first row of this CTA
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA (and cluster)
        here = _row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        after = _row_at(pos, (grp + groups) * rc.rows_per_cta + pos.row_in_cta)
        current = ahead
        if fx.const_expr(rc.cluster == 1):
            ahead = _prefetch(rc, flags, tensors, after, n, rows)
        rstd, mu = current[2], current[3]
        dys, xs = widen(current[0]), widen(current[1])
        g, xhat, dys = _terms(rc, flags, tensors[2], here, n, rows, rstd, mu, whole, dys, xs)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        masks = row_masks(rc, here, n, rows)
        dots = _first_pass(cfg, flags, sums_smem, partial_row, here, whole, g, xhat, dys, dots, masks)
        if fx.const_expr(rc.cluster == 1):
            c1, c2, _ = _row_constants(rc, flags, here, smem, parity, dots, inv_n)
        else:
            c1, c2, ahead = _row_constants(
                rc,
                flags,
                here,
                smem,
                parity,
                dots,
                inv_n,
                functools.partial(_prefetch, rc, flags, tensors, after, n, rows),
            )
        store_row(rc, dx, here, n, rows, _dx(rstd, g, xhat, c1, c2))
        parity = 1 - parity


def _rows_two_pass(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups):
    """Rows longer than the registers hold: each is read twice, segment by segment (the second time from L2)."""
    rc = cfg.row
    inv_n = 1.0 / n.to(fx.Float32)
    parity = fx.Int32(0)
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA (and cluster)
        here = _row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        rstd, mu = _row_stats(flags, tensors[3], tensors[4], here.row, rows)
        terms = (rc, flags, tensors, here, n, rows, rstd, mu)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        dots = _first_pass_segments(cfg, terms, sums_smem, partial_row, dots)
        c1, c2, _ = _row_constants(rc, flags, here, smem, parity, dots, inv_n)
        _second_pass_segments(cfg, terms, tensors[5], c1, c2)
        parity = 1 - parity


def _first_pass(cfg: BackwardConfig, flags: NormFlags, sums_smem, partial_row, pos, chunks, g, xhat, dys, dots, masks):
    """Adds the chunks' terms to the column sums; returns ``dots`` plus their ``sum(g * xhat)`` (and ``sum(g)``).
    ``masks``: the chunks' in-range masks; the padding is left out of ``sum(g * xhat)`` (its xhat, ``-mean * rstd``,
    may overflow where a row's mean is huge, and 0 * inf is NaN; its column sums are never stored)."""
    if fx.const_expr(cfg.sums > 0):
        terms = [[a * h for a, h in zip(dys, xhat, strict=True)], dys]
        _column_sums_add(cfg, sums_smem, partial_row, pos, chunks, terms[: cfg.sums])
    part = [masked_sum(cfg.row, [a * h for a, h in zip(g, xhat, strict=True)], masks)]
    if fx.const_expr(not flags.rms):
        part.append(thread_reduce(g))
    return [a + b for a, b in zip(dots, part, strict=True)]


def _segment(cfg: BackwardConfig, seg):
    return tuple(seg * cfg.segment + k for k in range(cfg.segment))


def _first_pass_segments(cfg: BackwardConfig, terms, sums_smem, partial_row, dots):
    """The first pass over a row too long for registers: a dynamic loop over segments, so that the compiler does
    not hoist every segment's loads (and their registers)."""
    flags, pos = terms[1], terms[3]
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, dys = _load_terms(*terms, chunks)
        masks = row_masks(cfg.row, pos, terms[4], terms[5], chunks)
        dots = _first_pass(cfg, flags, sums_smem, partial_row, pos, chunks, g, xhat, dys, dots, masks)
    return dots


def _second_pass_segments(cfg: BackwardConfig, terms, dx, c1, c2):
    """dx of a row too long for registers: it is read again, segment by segment (from L2, just read)."""
    rc, pos, n, rows, rstd = terms[0], terms[3], terms[4], terms[5], terms[6]
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, _ = _load_terms(*terms, chunks)
        store_row(rc, dx, pos, n, rows, _dx(rstd, g, xhat, c1, c2), chunks=chunks)


def _load_terms(rc: RowConfig, flags: NormFlags, tensors, pos, n, rows, rstd, mu, chunks):
    """``(dy * weight, xhat, dy)`` of this thread's ``chunks`` of row ``pos.row``."""
    dys, _ = load_row(rc, tensors[0], pos, n, rows, chunks=chunks)
    xs, _ = load_row(rc, tensors[1], pos, n, rows, chunks=chunks)
    return _terms(rc, flags, tensors[2], pos, n, rows, rstd, mu, chunks, dys, xs)


def _terms(rc: RowConfig, flags: NormFlags, weight, pos, n, rows, rstd, mu, chunks, dys, xs):
    """``(dy * weight, xhat, dy)`` from the loaded ``dys`` and ``xs`` of ``chunks``."""
    # No mask here: past N dy is loaded as 0 and the padding's column sums are never stored; its sum(g * xhat) term
    # is masked per chunk in _first_pass. Past the last row rstd and the mean are 0 (_prefetch, _rows_two_pass).
    if fx.const_expr(flags.rms):
        xhat = [v * rstd for v in xs]
    else:
        xhat = [(v - mu) * rstd for v in xs]
    g = dys
    if fx.const_expr(flags.weight):
        ws = []
        for j in chunks:
            ws += load_vector_chunk(rc, weight, pos, n, j)
        g = [a * w for a, w in zip(dys, ws, strict=True)]
    return g, xhat, dys


def _write_partial(cfg: BackwardConfig, sums_smem, partial_row, pos):
    rc = cfg.row
    for s in fx.range_constexpr(cfg.sums):
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                total = [fx.Float32(0.0)] * 4
                for slot in fx.range_constexpr(rc.rows_per_cta):
                    view = fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, slot, j, q),))
                    total = [a + b for a, b in zip(total, _load4(view), strict=True)]
                partial_row.store(s, j, q, total)


# column_sum_kernel's blocks, (columns, slices of the partial rows): many partial rows (the register kernel's
# persistent grid, 2-3 CTAs per SM; the one-CTA staged rows, one per SM) are split over 16 slices of 32 columns;
# a few (clusters and teams: 4-66 groups) take one slice of 256 columns. With 16 slices there, most of each block
# idled and the grid was 8x larger: LayerNorm bf16 131072 launched 8192 blocks of 512 threads to add 15 rows, ~60 us
# against the backward kernel's 440 (H200, GPU time: the kernel alone 3.69 TB/s, the public call 3.19-3.32;
# float32 262144: 3.75 against 3.31-3.37; benchmarks/results/norms_backward_staged_2026-12-01_api.json).
COLUMN_SUMS_MANY, COLUMN_SUMS_FEW = (32, 16), (256, 1)
_COL_UNROLL = 8  # partial rows loaded per thread at once


def column_sum_shape(parts: int) -> tuple:
    """column_sum_kernel's block shape (columns, slices) for ``parts`` partial rows."""
    return COLUMN_SUMS_FEW if parts <= 64 else COLUMN_SUMS_MANY


def _masked_load(t, row, col, ok):
    """``t[row, col]`` where ``ok``, else 0 (and no access out of bounds: row and column clamped to 0)."""
    safe_row = fx.arith.select(ok, row, type(row)(0))
    return fx.arith.select(ok, t[safe_row, fx.arith.select(ok, col, type(col)(0))], fx.Float32(0.0))


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
        loaded = [_masked_load(partial, p0 + u, col, ok & (p0 + u < parts)) for u in range(_COL_UNROLL)]
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


def _launch(kernel, cfg: RowConfig, grid: int, *args) -> None:
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    kernel(*args, cfg).launch(grid=grid, block=cfg.block, cluster=cluster_shape)


@functools.cache
def _flags(*flags: bool) -> NormFlags:
    """One NormFlags object per variant: the native dispatcher then matches it by identity, without hashing."""
    return NormFlags(*flags)


# The default of forward()'s (and softmax.forward()'s) ``staged``: on unless the environment sets
# FLYDSL_NORM_STAGED_FORWARD=0 (the register kernel everywhere, as before the staged forward was timed).
STAGED_FORWARD = os.environ.get("FLYDSL_NORM_STAGED_FORWARD", "1") != "0"


def forward(
    x, residual, weight, bias, out, residual_out, mean, rstd, eps: float, rms: bool, staged: bool | None = None
) -> None:
    """Launches the forward on validated :class:`~flydsl.kernels.host.RowTensor` arguments (None where absent).
    The looped kernel (:func:`norm_forward_looped_kernel`) where :func:`looped_forward_shape` routes the rows and
    rows and weights are 16-byte aligned; else, with ``staged`` (default :data:`STAGED_FORWARD`: on unless the
    environment sets ``FLYDSL_NORM_STAGED_FORWARD=0``), the staged kernel (:func:`norm_forward_staged_kernel`) where
    :func:`routed_staged_forward_config` has one (long rows, N a multiple of 16 bytes: see :func:`forward_shape`) and
    the rows are 16-byte aligned; elsewhere, and always with ``staged=False``, the register kernel."""
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = _flags(rms, residual is not None, weight is not None, bias is not None, mean is not None, rstd is not None)
    placeholder = x.obj
    args = [t.obj if t is not None else placeholder for t in (x, residual, weight, bias, out, residual_out, mean, rstd)]
    kind = "fused" if residual is not None else ("rms" if rms else "layer")
    rows_of = [t for t in (x, residual, out, residual_out) if t is not None]
    vectors = [t for t in (weight, bias) if t is not None]
    looped = looped_forward_shape(n, x.dtype, kind) if staged is not False else None
    if looped is not None and _hintable(rows_of, vectors):  # (its hinted accesses: 16-byte aligned addresses only)
        cfg = looped_forward_config(n, x.dtype, *looped)
        norm_forward_looped_kernel(*args, eps, cfg, flags).launch(grid=rows, block=cfg.row.block)
        return
    if staged or (staged is None and STAGED_FORWARD):
        ring = routed_staged_forward_config(n, x.dtype, kind)
        if ring is not None and routable(ring, x) and _aligned16(*rows_of):
            _launch_staged_forward(args, eps, ring, flags, rows, x.device)
            return
    cfg = forward_row_config(n, x.dtype, 2 if residual is not None else 1, FORWARD_STORE_GROUP[x.dtype])
    cfg = plain_unless_aligned(cfg, rows_of, vectors)
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    norm_forward_kernel(*args, eps, cfg, flags).launch(grid=cfg.grid(rows), block=cfg.block, cluster=cluster_shape)


def team_fits(cfg: StagedForwardConfig, device: int) -> bool:
    """Whether the SMs of ``device`` hold all of one row's CTAs at once (always, but for a team larger than the SMs
    hold: a small MIG slice)."""
    return not cfg.row.team or cfg.row.cluster <= cfg.blocks_per_sm * sm_count(device)


def routable(cfg: StagedForwardConfig, x) -> bool:
    """Whether the routed forward launches ``cfg`` on ``x`` (a RowTensor): anything but a team, or a team that fits
    x's device (:func:`team_fits`) and whose exchange tensor x's framework allocates (torch, cupy; other frameworks
    pass their outputs, and have no way to pass it). Else the register kernel runs."""
    return not cfg.row.team or (team_fits(cfg, x.device) and can_allocate(x))


def staged_forward_groups(cfg: StagedForwardConfig, rows: int, device: int) -> int:
    """The staged forward's persistent grid (CTA groups), sized as the staged backward's (:func:`backward_groups`:
    the driver's max active clusters, or 7/8 of what the SMs hold; teams: as many as the SMs hold at once, an error
    where one does not fit)."""
    rc = cfg.row
    sms = sm_count(device)
    if not team_fits(cfg, device):  # its CTAs would wait for peers that never start
        raise ValueError(
            f"staged forward: a team of {rc.cluster} CTAs per row does not fit device {device} at once"
            f" ({sms} SMs x {cfg.blocks_per_sm} CTA each); use a config with fewer CTAs per row"
        )
    active = None
    if rc.cluster_shape is not None:
        active = max_active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, device)
    return backward_groups(cfg, rows, sms, active)


def _team_exchange(cfg, like, rows: int, what: str):
    """A team's exchange tensor in ``like``'s framework (a RowTensor): each row's line of tagged pairs, zeroed
    ((rows, 4 x team size) float32: one small memset per launch)."""
    exchange = empty_rows(like, (rows, exchange_columns(cfg)), what, scratch=True)
    exchange.zero_() if hasattr(exchange, "zero_") else exchange.fill(0)
    return exchange


def forward_exchange(cfg: StagedForwardConfig, x, rows: int) -> tuple[StagedForwardConfig, object]:
    """The config the staged forward launches on ``x`` (an array of the rows' framework) and its ``exchange``
    argument: a team's tagged pairs (:func:`_team_exchange`); ``claim_rows``' counter (:func:`host.claim_counter`),
    or, where x's framework allocates nothing, ``cfg`` without ``claim_rows`` (every ``groups``-th row); else ``x``
    itself, unused."""
    if cfg.row.team:
        return cfg, _team_exchange(cfg, allocated(x), rows, "forward row pairs")
    if cfg.claim_rows:
        counter = claim_counter(allocated(x))
        return (cfg, counter) if counter is not None else (replace(cfg, claim_rows=False), x)
    return cfg, x


def _launch_staged_forward(args, eps: float, cfg: StagedForwardConfig, flags: NormFlags, rows: int, device) -> None:
    rc = cfg.row
    groups = staged_forward_groups(cfg, rows, device)
    cfg, exchange = forward_exchange(cfg, args[0], rows)
    norm_forward_staged_kernel(*args, exchange, eps, cfg, flags).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )


def _hintable(rows_of, vectors=()) -> bool:
    """Whether hinted (16-byte instruction) accesses may touch these RowTensors: 16-byte aligned rows and vectors."""
    return _aligned16(*rows_of) and all(t.pointer % 16 == 0 for t in vectors)


def plain_unless_aligned(cfg: RowConfig, rows_of, vectors=()) -> RowConfig:
    """``cfg`` without its cache hints (``RowConfig.hints``: 16-byte instructions) unless the row tensors
    ``rows_of`` and the ``vectors`` (weight, bias) are 16-byte aligned; a plain config (the default) is not checked."""
    if cfg.hints is PLAIN_HINTS or _hintable(rows_of, vectors):
        return cfg
    return replace(cfg, hints=PLAIN_HINTS)


def _aligned16(*tensors) -> bool:
    """Every tensor's rows start at 16-byte boundaries (pointer and row stride)."""
    for t in tensors:
        size = 4 if t.dtype == "f32" else 2
        if t.pointer % 16 or (t.shape[0] > 1 and (t.strides[0] * size) % 16):
            return False
    return True


def backward(dy, x, weight, mean, rstd, dx, dweight, dbias, rms: bool) -> None:
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = _flags(rms, False, weight is not None, dbias is not None, False, False)
    sums = 0 if weight is None else (2 if dbias is not None else 1)
    # The staged kernel copies 16-byte chunks: rows (and pointers) must be 16-byte aligned.
    sms = sm_count(x.device)
    cfg = resident_backward_config(n, x.dtype, sums, _aligned16(dy, x, dx), sms)
    if cfg.row.team and not can_allocate(x):  # a team's exchange tensor comes from the input's framework
        cfg = backward_config(n, x.dtype, sums, False)
    rc = cfg.row
    active = None
    if rc.cluster_shape is not None:
        active = max_active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, x.device)
    groups = backward_groups(cfg, rows, sms, active)
    partial = empty_rows(x, (groups, sums * n), "dweight/dbias partial sums", scratch=True) if sums else x.obj
    placeholder = x.obj
    exchange = placeholder
    if rc.team:  # the team's tagged row sums, zeroed (one small memset)
        exchange = _team_exchange(cfg, x, rows, "backward row sums")
    mean_obj = mean.obj if mean is not None else rstd.obj
    w_obj = weight.obj if weight is not None else placeholder
    norm_backward_kernel(dy.obj, x.obj, w_obj, mean_obj, rstd.obj, dx.obj, partial, exchange, cfg, flags).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )
    if sums:
        db_obj = dbias.obj if dbias is not None else dweight.obj
        shape = column_sum_shape(groups)
        column_sum_kernel(partial, dweight.obj, db_obj, sums, shape).launch(
            grid=-(-sums * n // shape[0]), block=shape[0] * shape[1]
        )
