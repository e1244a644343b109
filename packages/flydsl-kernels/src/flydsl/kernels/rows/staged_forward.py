"""The staged forward's kernel body (:func:`rows_staged_forward`): the default for long rows of the norms and
softmax, and the kernel of softmax's backward. A persistent grid of CTA groups (a CTA, a cluster, or a team) walks
rows through the shared-memory ring (:class:`~flydsl.kernels.rows.ring.RowRing`); each CTA's partial pair of a row is
pushed to its peers (:func:`~flydsl.kernels.rows.exchange.exchange_push`) or, in a team, combined by the first warp
from the tagged pairs in global memory (:func:`_team_stats`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, cluster, gpu, math, nvvm
from flydsl.kernels.rows.configs import NormFlags, SoftmaxBackwardFlags, SoftmaxFlags, StagedForwardConfig
from flydsl.kernels.rows.exchange import (
    exchange_push,
    exchange_setup,
    exchange_wait,
    inbox_slots,
    poll_tagged_pair,
    push_word,
)
from flydsl.kernels.rows.layout import RowConfig
from flydsl.kernels.rows.reduce import row_reduce, row_smem, thread_reduce
from flydsl.kernels.rows.ring import RowRing
from flydsl.kernels.rows.tiles import load_vector_chunks_raw, rounded, row_at, row_position, store_row, vector_chunk

__all__ = ["RowTensors", "rows_staged_forward"]


class RowTensors(NamedTuple):
    """The staged forward's tensors: the ring's sources (``x``, and ``residual``: the fused add's, or softmax's
    backward's ``y`` next to ``dy`` in ``x``), the vectors, the outputs and a team's ``exchange`` (or the claimed
    rows' counter). What a variant does not read may be None."""

    x: object
    out: object
    residual: object = None
    weight: object = None
    bias: object = None
    residual_out: object = None
    mean: object = None
    rstd: object = None
    exchange: object = None


def _team_stats(share, flags, k, row, n, inv_n):
    """Row ``row``'s statistics (this CTA's ``k``-th; as :func:`_pushed_stats`) in a team: lane ``r`` of the first
    warp polls rank ``r``'s tagged pair in global memory (``poll_tagged_pair``), the warp combines them
    (:func:`_team_combine`), lane 0 hands the result to the CTA through shared-memory slot ``k % slots``."""
    pos = share.pos
    slot = k % share.slots
    if pos.tid < 32:
        lane = pos.tid % 32
        ok = lane < share.rc.cluster
        rank = fx.arith.select(ok, lane, type(lane)(0))
        first, second = poll_tagged_pair(share, row, rank, ok)
        a, b = _team_combine(flags, share.rc, n, inv_n, lane, ok, first, second)
        if lane == 0:
            share.inbox[slot * 2] = a
            share.inbox[slot * 2 + 1] = b
    gpu.barrier()
    return share.inbox[slot * 2], share.inbox[slot * 2 + 1]


def _team_combine(flags, rc: RowConfig, n, inv_n, lane, ok, first, second):
    """The row's statistics from rank ``lane``'s pair ``(first, second)`` (lanes past the team: ``ok`` false, left
    out), by the warp's shuffle trees; lane 0's result is the one used, the same in every CTA of the team. LayerNorm:
    Chan's combination as :func:`_chan`; RMSNorm: the sum of squares; softmax: as :func:`_softmax_combine`;
    softmax's backward: the sum of ``sum(dy * y)``."""
    zero = fx.Float32(0.0)
    if fx.const_expr(isinstance(flags, SoftmaxBackwardFlags)):
        return gpu.warp_reduce(fx.arith.select(ok, first, zero), "add", width=32), zero
    if fx.const_expr(isinstance(flags, SoftmaxFlags)):
        top = gpu.warp_reduce(fx.arith.select(ok, first, fx.Float32(float("-inf"))), "max", width=32)
        term = second * nvvm.ex2_approx(first * _LOG2E - top * _LOG2E, ftz=True)
        return top, gpu.warp_reduce(fx.arith.select(ok, term, zero), "add", width=32)
    if fx.const_expr(flags.rms):
        return zero, gpu.warp_reduce(fx.arith.select(ok, first, zero), "add", width=32)
    count = fx.arith.select(ok, _rank_count(rc, n, lane).to(fx.Float32), zero)
    mean = gpu.warp_reduce(count * fx.arith.select(ok, first, zero), "add", width=32) * inv_n
    d = first - mean
    squares = fx.arith.select(ok, second + count * (d * d), zero)
    return mean, gpu.warp_reduce(squares, "add", width=32)


def _clamp(v, lo: int, hi: int):
    v = fx.arith.select(v < lo, type(v)(lo), v)
    return fx.arith.select(v > hi, type(v)(hi), v)


def _rank_count(rc: RowConfig, n, rank):
    """Elements of a row that CTA ``rank`` of its cluster holds (N a multiple of ``vec``): its chunk ``j`` covers row
    chunks ``(j * cluster + rank) * threads_per_row + lane``."""
    total = n // rc.vec
    count = None
    for j in fx.range_constexpr(rc.chunks):
        part = _clamp(total - (j * rc.cluster + rank) * rc.threads_per_row, 0, rc.threads_per_row)
        count = part if count is None else count + part
    return count * rc.vec


def _inverse_count(count):
    """``1 / count`` as Float32 (1 for an empty CTA: its pair is zeros and its count 0, so it adds nothing)."""
    return 1.0 / fx.arith.select(count > 0, count, type(count)(1)).to(fx.Float32)


class _ForwardRows:
    """The staged forward's rows in its ring (x, or x and the residual; softmax's backward: dy and y) and their
    outputs; ``flags``: a :class:`NormFlags`, :class:`SoftmaxFlags` or :class:`SoftmaxBackwardFlags`."""

    def __init__(self, cfg: StagedForwardConfig, flags, tensors, pos, n, rows):
        self.cfg, self.rc, self.flags, self.pos, self.n, self.rows = cfg, cfg.row, flags, pos, n, rows
        self.x, self.residual, self.out, self.residual_out = (
            tensors.x,
            tensors.residual,
            tensors.out,
            tensors.residual_out,
        )
        self.weight, self.bias = tensors.weight, tensors.bias
        two = flags.residual or isinstance(flags, SoftmaxBackwardFlags)
        sources = (self.x, self.residual) if two else (self.x,)
        self.ring = RowRing(cfg.row, cfg.stages, sources, pos, n, rows)
        self.inside = [col < n for col in self.ring.cols]  # chunk masks (N is a multiple of vec)
        # before the row loop: the same columns every row; not float32 weights on 16-bit rows (twice the registers:
        # they spill)
        vectors = [t for t, read in ((self.weight, flags.weight), (self.bias, flags.bias)) if read]
        fits = self.x.dtype.width == 32 or all(t.dtype.width == 16 for t in vectors)
        keep = isinstance(flags, NormFlags) and cfg.keep_weights and fits
        self.kept_weight = load_vector_chunks_raw(cfg.row, self.weight, pos, n) if keep and flags.weight else None
        self.kept_bias = load_vector_chunks_raw(cfg.row, self.bias, pos, n) if keep and flags.bias else None

    def values(self, slot, j: int):
        """Chunk ``j`` of the row in ``slot``: x, or x + residual rounded to the dtype (residual_out's values)."""
        xs = self.ring.chunk(slot, 0, j)
        if fx.const_expr(self.flags.residual):
            rs = self.ring.chunk(slot, 1, j)
            xs = rounded([a + b for a, b in zip(xs, rs, strict=True)], self.x.dtype)
        return xs

    def held(self, slot):
        """The row's first ``cfg.hold`` chunks of values, read once to stay in registers (None for the others, and
        None without ``hold``)."""
        if fx.const_expr(not self.cfg.hold):
            return None
        return [self.values(slot, j) if j < self.cfg.hold else None for j in range(self.rc.chunks)]

    def row_values(self, slot, held):
        """Chunk ``j``'s values of the row in ``slot``: held in registers since the first pass, or read from the
        ring where it is used."""
        return lambda j: held[j] if held is not None and held[j] is not None else self.values(slot, j)

    def store_softmax(self, slot, row, top, scale, held=None, factor=None) -> None:
        """Softmax of the row in ``slot``: ``exp(x - top) * scale``; the chunks whose exps the first passes kept
        (``held``: ``exp(x - m)`` about this CTA's max ``m``): ``held * factor`` (``factor = exp(m - top) *
        scale``)."""
        shift = top * _LOG2E

        def chunk(j):
            if fx.const_expr(held is not None and held[j] is not None):
                return [e * factor for e in held[j]]
            return [nvvm.ex2_approx(v * _LOG2E - shift, ftz=True) * scale for v in self.values(slot, j)]

        store_row(self.rc, self.out, row_at(self.pos, row), self.n, self.rows, chunk)

    def products(self, slot, j: int):
        """Softmax's backward: chunk ``j`` of dy and of y of the row in ``slot``."""
        return self.ring.chunk(slot, 0, j), self.ring.chunk(slot, 1, j)

    def store_softmax_backward(self, slot, row, dot) -> None:
        """``dx = y * (dy - dot)`` of the row in ``slot``, ``dot = sum(dy * y)`` over the row."""

        def chunk(j):
            dys, ys = self.products(slot, j)
            return [y * (d - dot) for d, y in zip(dys, ys, strict=True)]

        store_row(self.rc, self.out, row_at(self.pos, row), self.n, self.rows, chunk)

    def store(self, slot, row, mean, rstd, held=None) -> None:
        """The normalized row in ``slot`` (weight and bias loaded next to each chunk's store, or kept in registers:
        ``cfg.keep_weights``). 16-bit rows: ``v *
        rstd - mean * rstd``, then ``* w + b``, two fma per element (the kernel is issue-bound there; the rounding of
        ``mean * rstd`` stays far under the output's). float32 rows: ``(v - mean) * rstd``, exact to float32 even
        where the mean is large against the spread."""
        rc, pos, n = self.rc, self.pos, self.n
        shift = -mean * rstd
        exact = self.x.dtype is fx.Float32
        values = self.row_values(slot, held)

        def chunk(j):
            vs = values(j)
            ys = [(v - mean) * rstd for v in vs] if exact else [v * rstd + shift for v in vs]
            if fx.const_expr(self.flags.weight):
                ws = vector_chunk(rc, self.weight, pos, n, j, self.kept_weight)
                ys = [y * w for y, w in zip(ys, ws, strict=True)]
            if fx.const_expr(self.flags.bias):
                bs = vector_chunk(rc, self.bias, pos, n, j, self.kept_bias)
                ys = [y + b for y, b in zip(ys, bs, strict=True)]
            return ys

        store_row(rc, self.out, row_at(pos, row), n, self.rows, chunk)


def _forward_partial(work, slot, row, block, smem, parity, inv_count):
    """This CTA's partial pair of the row in ``slot``: RMSNorm ``(sum(v^2), 0)``; LayerNorm ``(m, sum((v - m)^2))``
    with the CTA's own mean ``m = sum(v) * inv_count`` (two block reductions; the zero padding masked out of the
    second); softmax: see :func:`_softmax_partial`. The fused add writes ``residual_out`` here. Returns (the pair,
    the values held for the output: with ``work.cfg.hold`` the float32 values of the row's first chunks (softmax:
    their exps), else None). Softmax's backward: ``(sum(dy * y), 0)``. (A function, not a method of
    :class:`_ForwardRows`: the kernel's control flow is traced through functions only, and a method's ``if`` on a
    kernel value would not be.)"""
    if fx.const_expr(isinstance(work.flags, SoftmaxFlags)):
        return _softmax_partial(work, slot, block, smem)
    rc, pos = work.rc, work.pos
    if fx.const_expr(isinstance(work.flags, SoftmaxBackwardFlags)):  # sum(dy * y): the padding's zeros add nothing
        dot = fx.Float32(0.0)
        for j in fx.range_constexpr(rc.chunks):
            dys, ys = work.products(slot, j)
            dot = dot + thread_reduce([d * y for d, y in zip(dys, ys, strict=True)])
        return [row_reduce(block, pos, smem, parity, dot), fx.Float32(0.0)], None
    here = row_at(pos, row)
    held = work.held(slot)
    values = work.row_values(slot, held)
    part = fx.Float32(0.0)
    for j in fx.range_constexpr(rc.chunks):
        vs = values(j)
        if fx.const_expr(work.flags.residual):
            store_row(rc, work.residual_out, here, work.n, work.rows, vs, chunks=(j,))
        part = part + thread_reduce([v * v for v in vs] if work.flags.rms else vs)
    if fx.const_expr(work.flags.rms):
        return [row_reduce(block, pos, smem, parity, part), fx.Float32(0.0)], held
    total = row_reduce(block, pos, smem, 0, part)
    local = total * inv_count
    squares = fx.Float32(0.0)
    for j in fx.range_constexpr(rc.chunks):  # chunks past N masked out whole (N is a multiple of vec)
        chunk = thread_reduce([(v - local) * (v - local) for v in values(j)])
        squares = squares + fx.arith.select(work.inside[j], chunk, fx.Float32(0.0))
    return [local, row_reduce(block, pos, smem, 1, squares)], held


def _chan(share, old, counts, inv_n):
    """LayerNorm's (mean, sum of squared deviations) of a row from its CTAs' pairs ``(m_r, M2_r)`` (each CTA's own
    mean and the squared deviations about it) in inbox slot ``old`` (Chan, Golub and LeVeque's pairwise update):
    ``M2 = sum_r M2_r + n_r (m_r - mean)^2``. Every term is non-negative (no cancellation as in ``E[x^2] -
    mean^2``). Summed over the ranks in a fixed order: every CTA gets the same values. ``counts``: the ranks' n_r
    (Float32; no inverses held through the row loop: registers are tight)."""
    size = share.rc.cluster
    pairs = [[share.inbox[(old * size + r) * 2 + i] for i in range(2)] for r in range(size)]
    total = fx.Float32(0.0)
    for r in fx.range_constexpr(size):
        total = total + counts[r] * pairs[r][0]
    mean = total * inv_n
    squares = fx.Float32(0.0)
    for r in fx.range_constexpr(size):
        d = pairs[r][0] - mean
        squares = squares + (pairs[r][1] + counts[r] * (d * d))
    return mean, squares


def rows_staged_forward(cfg: StagedForwardConfig, flags, tensors, eps):
    """The staged forward: a persistent grid whose CTA group (a CTA, a cluster or a team) takes rows ``group,
    group + groups, ...`` (or claims them: ``cfg.claim_rows``). Each thread copies its chunks of the sources rows
    ahead into its slots of the ring, so that the bytes in flight take no registers. Per row: the CTA's partial pair
    (:func:`_forward_partial`) through block reductions. One CTA per row: the row's statistics at once, then its
    output from the ring. A cluster or a team: each CTA pushes its pair to its peers and writes the output of row
    ``k - lag``, whose pairs arrived meanwhile; LayerNorm combines the pairs by :func:`_chan`. A ring of a single
    row (lag 0) copies the next row in once this row's output is written. ``flags``: :class:`NormFlags`,
    :class:`SoftmaxFlags` or :class:`SoftmaxBackwardFlags`; ``tensors``: :class:`RowTensors`."""
    rc = cfg.row
    rows, n = tensors.x.shape
    pos = row_position(rc)
    flyc.set_kernel_attributes(min_blocks_per_sm=cfg.blocks_per_sm)
    lag = cfg.lag if rc.cluster > 1 else 0
    inv_n = 1.0 / n.to(fx.Float32)
    work = _ForwardRows(cfg, flags, tensors, pos, n, rows)
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    smem = row_smem(block, phases=2)  # LayerNorm, softmax: two reductions per row; RMSNorm: alternating rows
    inv_count = inv_n
    share, counts = None, []
    if fx.const_expr(rc.cluster > 1):  # a team's inbox: two slots (the row's block barriers separate their reuse)
        share = exchange_setup(rc, pos, tensors.exchange, 2 if rc.team else inbox_slots(lag), team_inbox=True)
        if fx.const_expr(_layer_norm(flags)):
            if fx.const_expr(cfg.equal_shares):  # one count for every rank: one register, not one per rank
                if n % (rc.cluster * rc.threads_per_row * rc.vec) != 0:  # a config built for another N
                    fx.nvvm.trap()
                counts = [(n // rc.cluster).to(fx.Float32)] * rc.cluster
            elif fx.const_expr(not rc.team):  # a team's first warp computes each rank's count where it combines
                counts = [_rank_count(rc, n, r).to(fx.Float32) for r in range(rc.cluster)]
            inv_count = _inverse_count(_rank_count(rc, n, pos.rank))
    loop = _RowLoop(
        cfg=cfg,
        flags=flags,
        work=work,
        pos=pos,
        block=block,
        smem=smem,
        inv_count=inv_count,
        inv_n=inv_n,
        eps=eps,
        mean_out=tensors.mean,
        rstd_out=tensors.rstd,
        share=share,
        counts=counts,
    )
    if fx.const_expr(cfg.claim_rows):
        _claimed_rows(loop, tensors.exchange)
    else:
        _strided_rows(loop)
    fx.nvvm.cp_async_wait_group(0)  # nothing lands in shared memory after the CTA is gone
    if fx.const_expr(rc.cluster_shape is not None):
        cluster.sync()  # no CTA leaves while a peer may still push into it


class _RowLoop(NamedTuple):
    """What the row loops (:func:`_strided_rows`, :func:`_claimed_rows`) take from :func:`rows_staged_forward`."""

    cfg: StagedForwardConfig
    flags: object
    work: _ForwardRows
    pos: object
    block: RowConfig
    smem: object
    inv_count: object
    inv_n: object
    eps: object
    mean_out: object
    rstd_out: object
    share: object
    counts: list


def _strided_rows(loop):
    """The row loop of :func:`rows_staged_forward` where CTA group ``g`` of ``groups`` takes rows ``g, g + groups,
    ...``."""
    cfg, flags, work, pos, block, smem, inv_count, inv_n, eps, mean_out, rstd_out, share, counts = loop
    rc, rows, n = cfg.row, work.rows, work.n
    groups = gpu.grid_dim.x // rc.cluster
    group = gpu.block_idx.x // rc.cluster
    lag = cfg.lag if rc.cluster > 1 else 0
    ahead = cfg.stages - 1 - lag
    for k in fx.range_constexpr(ahead + 1):
        work.ring.issue(group + k * groups, fx.Int32(k))
    k = fx.Int32(0)
    parity = fx.Int32(0)
    for grp in range(group, rows + lag * groups, groups):  # lag more steps in a cluster: the last rows' output
        fx.nvvm.cp_async_wait_group(ahead)  # row k's chunks (this thread's) have landed
        part, held = _forward_partial(work, k % cfg.stages, grp, block, smem, parity, inv_count)
        done = k - lag
        row = grp - lag * groups
        if fx.const_expr(rc.cluster > 1):
            if grp < rows:
                exchange_push(share, k, grp, part)
            if done >= 0:  # the output of row k - lag, from its pairs
                if fx.const_expr(rc.team):
                    a, b = _team_stats(share, flags, done, row, n, inv_n)
                else:
                    a, b = _pushed_stats(share, flags, exchange_wait(share, done), counts, inv_n)
                _finish(loop, done % cfg.stages, row, a, b, part, held)
        else:  # one CTA per row: its pair is the row's
            a, b = _own_stats(flags, part, inv_n)
            _finish(loop, done % cfg.stages, row, a, b, part, held)
        # the slot of row k - lag is free (its output is written): row k + ahead + 1 goes there
        work.ring.issue(grp + (ahead + 1) * groups, (k + ahead + 1) % cfg.stages)
        k = k + 1
        parity = 1 - parity


def _claimed_rows(loop, counter):
    """The row loop of :func:`rows_staged_forward` for ``cfg.claim_rows`` (one CTA per row, or a cluster at lag 0):
    CTA group ``g`` of ``groups`` takes rows ``g, g + groups, ...`` for its first ``stages`` ring rows, then claims
    each next row from ``counter[0]`` (rows ``stages * groups`` on, in the order the groups ask), so that groups whose
    SMs move bytes faster take more rows. The first thread (of the cluster's rank 0) asks one row early: it adds to
    the counter during row ``k`` and hands the answer over in row ``k + 1``, so the atomic's round trip is never
    waited for; the row enters the ring after row ``k + 1``'s output. One CTA: through a shared-memory word that
    the row's block barriers make visible. A cluster: pushed with the row's pairs into every peer's shared memory,
    on the mbarrier that the peers wait on for the pairs. The last group to finish (``counter[1]`` counts them)
    zeroes both words for the next launch."""
    cfg, flags, work, pos, block, smem, inv_count, inv_n, eps, mean_out, rstd_out, share, counts = loop
    rc = cfg.row
    rows, stages = work.rows, cfg.stages
    ahead = stages - 1
    groups = gpu.grid_dim.x // rc.cluster
    first = stages * groups  # the first claimed row
    asker = (pos.tid == 0) & (pos.rank == 0)
    # one CTA: by row parity, written before a row's barriers and read after; a cluster: by inbox slot
    claims = fx.SmemAllocator().allocate(fx.Int32, 2 if rc.cluster == 1 else share.slots)
    queue = []  # the rows in the ring: this row and the next ahead ones
    for j in fx.range_constexpr(stages):
        queue.append(gpu.block_idx.x // rc.cluster + j * groups)
        work.ring.issue(queue[j], fx.Int32(j))
    asked = fx.Int32(0)  # the first thread's claim in flight
    if asker:
        asked = first + nvvm.atom_add_relaxed(counter, 1, 0)
    k = fx.Int32(0)
    parity = fx.Int32(0)
    while queue[0] < rows:
        slot = k % stages
        if fx.const_expr(rc.cluster == 1):
            if asker:
                claims[parity] = asked
                asked = first + nvvm.atom_add_relaxed(counter, 1, 0)
        fx.nvvm.cp_async_wait_group(ahead)  # row k's chunks (this thread's) have landed
        part, held = _forward_partial(work, slot, queue[0], block, smem, parity, inv_count)
        if fx.const_expr(rc.cluster == 1):
            a, b = _own_stats(flags, part, inv_n)
            where = parity
        else:
            exchange_push(share, k, queue[0], part, extra_bytes=4)
            where = k % share.slots
            if asker:
                asked = _push_claim(share, claims, where, asked, first, counter)
            a, b = _pushed_stats(share, flags, exchange_wait(share, k), counts, inv_n)
        _finish(loop, slot, queue[0], a, b, part, held)
        claimed = claims[where]
        work.ring.issue(claimed, slot)  # row k's slot is free: its output is written
        queue = queue[1:] + [claimed]
        k = k + 1
        parity = 1 - parity
    if asker:
        if nvvm.atom_add_acq_rel(counter, 1, 1) == groups - 1:  # every other group has claimed its last row
            counter[0] = 0
            counter[1] = 0


def _push_claim(share, claims, box, asked, first, counter):
    """A cluster's claimed row ``asked`` into every peer's ``claims[box]`` (``st.async`` on the inbox slot's
    mbarrier), then the next claim; returns it."""
    for peer in fx.range_constexpr(share.rc.cluster):
        remote = cluster.map_shared(claims, fx.Int32(peer), coord=box)
        push_word(asked, remote, cluster.map_shared(share.bars.tensor, fx.Int32(peer), coord=box))
    return first + nvvm.atom_add_relaxed(counter, 1, 0)


def _layer_norm(flags) -> bool:
    return isinstance(flags, NormFlags) and not flags.rms


def _own_stats(flags, part, inv_n):
    """:func:`_pushed_stats` of a row held by one CTA, from its pair ``part``."""
    if fx.const_expr(isinstance(flags, (SoftmaxFlags, SoftmaxBackwardFlags))):
        return part[0], part[1]
    if fx.const_expr(flags.rms):
        return fx.Float32(0.0), part[0]
    return part[0], part[1]


def _pushed_stats(share, flags, old, counts, inv_n):
    """The row's statistics from its CTAs' pairs in inbox slot ``old``, summed over the ranks in a fixed order (every
    CTA gets the same): LayerNorm ``(mean, sum of squared deviations)`` (:func:`_chan`), RMSNorm ``(0, sum of
    squares)``, softmax ``(max, sum of exp(x - max))`` (:func:`_softmax_combine`), softmax's backward ``(sum(dy *
    y), 0)``."""
    if fx.const_expr(isinstance(flags, SoftmaxFlags)):
        return _softmax_combine(share, old)
    if fx.const_expr(isinstance(flags, SoftmaxBackwardFlags) or flags.rms):
        size = share.rc.cluster
        total = fx.Float32(0.0)
        for r in fx.range_constexpr(size):
            total = total + share.inbox[(old * size + r) * 2]
        if fx.const_expr(isinstance(flags, SoftmaxBackwardFlags)):
            return total, fx.Float32(0.0)
        return fx.Float32(0.0), total
    return _chan(share, old, counts, inv_n)


def _finish(loop, slot, row, a, b, part=None, held=None) -> None:
    """Row ``row``'s output from ring slot ``slot`` given its statistics ``(a, b)`` (see :func:`_pushed_stats`), and
    the statistics asked for (the leader thread). ``held``: the row's values kept in registers (lag 0), with this
    CTA's own pair ``part`` (softmax: the exps about its own max)."""
    work, flags, pos, inv_n, eps = loop.work, loop.flags, loop.pos, loop.inv_n, loop.eps
    rows, mean_out, rstd_out = work.rows, loop.mean_out, loop.rstd_out
    if fx.const_expr(isinstance(flags, SoftmaxBackwardFlags)):
        work.store_softmax_backward(slot, row, a)
        return
    if fx.const_expr(isinstance(flags, SoftmaxFlags)):
        factor = None
        if fx.const_expr(held is not None):  # exp(x - m) * exp(m - top) / sum, 0 for a part all -inf (its exps are
            # 0 and m is -inf), NaN for a row all -inf (b = 0), as the path without held values
            low = fx.Float32(float("-inf"))
            rescale = fx.arith.select(part[0] > low, nvvm.ex2_approx((part[0] - a) * _LOG2E, ftz=True), fx.Float32(0.0))
            factor = rescale * (1.0 / b)
        work.store_softmax(slot, row, a, 1.0 / b, held, factor)
        return
    mean = a
    rstd = math.rsqrt(b * inv_n + eps)
    work.store(slot, row, mean, rstd, held)
    if fx.const_expr(flags.mean or flags.rstd):
        if pos.leader & (row < rows):
            if fx.const_expr(flags.mean):
                mean_out[row] = mean
            if fx.const_expr(flags.rstd):
                rstd_out[row] = rstd


_LOG2E = 1.4426950408889634


def _softmax_partial(work, slot, block, smem):
    """Softmax's pair of this CTA's part of the row in ``slot``: its max ``m`` and ``sum(exp(x - m))`` (``ex2.approx``
    as the register kernel), two block reductions; the zero padding masked out (-inf for the max, 0 in the sum). A
    CTA holding nothing of the row, or only -inf, pushes ``(-inf, 0)``, which adds nothing in
    :func:`_softmax_combine`. Returns (the pair, with ``work.cfg.hold`` the exps of the held chunks for the output,
    else None)."""
    rc, pos = work.rc, work.pos
    held = work.held(slot)
    values = work.row_values(slot, held)
    low = fx.Float32(float("-inf"))
    top = low
    for j in fx.range_constexpr(rc.chunks):
        vs = [fx.arith.select(work.inside[j], v, low) for v in values(j)]
        top = arith.maximum(top, thread_reduce(vs, "max"))
    top = row_reduce(block, pos, smem, 0, top, "max")
    # A part all -inf (a causal mask's tail held by a whole CTA) is shifted by 0: its exps are 0 and its sum 0, where
    # exp(-inf - -inf) = NaN would make the whole row NaN in _softmax_combine (NaN * 0).
    shift = fx.arith.select(top > low, top * _LOG2E, fx.Float32(0.0))
    total = fx.Float32(0.0)
    exps = []
    for j in fx.range_constexpr(rc.chunks):
        es = [nvvm.ex2_approx(v * _LOG2E - shift, ftz=True) for v in values(j)]
        exps.append(es)
        total = total + thread_reduce([fx.arith.select(work.inside[j], e, fx.Float32(0.0)) for e in es])
    kept = [es if held[j] is not None else None for j, es in enumerate(exps)] if held is not None else None
    return [top, row_reduce(block, pos, smem, 1, total)], kept


def _softmax_combine(share, old):
    """Softmax's ``(max, sum of exp(x - max))`` of a row from its CTAs' pairs ``(m_r, s_r)`` in inbox slot ``old``:
    ``max = max_r m_r``, ``sum = sum_r s_r * exp(m_r - max)`` (every factor <= 1: no overflow)."""
    size = share.rc.cluster
    pairs = [[share.inbox[(old * size + r) * 2 + i] for i in range(2)] for r in range(size)]
    top = pairs[0][0]
    for r in fx.range_constexpr(1, size):
        top = arith.maximum(top, pairs[r][0])
    shift = top * _LOG2E
    total = fx.Float32(0.0)
    for r in fx.range_constexpr(size):
        total = total + pairs[r][1] * nvvm.ex2_approx(pairs[r][0] * _LOG2E - shift, ftz=True)
    return top, total
