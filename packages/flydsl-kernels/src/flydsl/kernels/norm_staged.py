"""The norm backward's staged kernel for long rows (:mod:`flydsl.kernels.normalization` launches it): each thread
copies its 16-byte chunks of dy and x rows ahead into a shared-memory ring (``cp.async``), so that enough bytes are in
flight without registers, and keeps its column sums in registers. A row split over CTAs does not wait at a cluster
barrier per row: the CTAs push their partial sums to each other (a cluster: ``st.async`` into the peers' shared
memory + mbarriers; past 8 CTAs, a team of up to 64 CTAs: tagged pairs in global memory) and write dx ``lag`` rows
later. Also the row math both backward kernels share (:func:`_row_constants`, :func:`_dx`), and the staged
forward (:func:`_rows_staged_forward`), on the same ring (:class:`_RowRing`) and pushes (its teams, opt-in: the
first warp combines the row's tagged pairs, :func:`_team_stats`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from mlir.dialects import llvm as _llvm

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, cluster, gpu, math, nvvm, vector
from flydsl.kernels.norm_config import (
    BackwardConfig,
    NormFlags,
    SoftmaxBackwardFlags,
    SoftmaxFlags,
    StagedForwardConfig,
)
from flydsl.kernels.reduction import (
    RowConfig,
    chunk_index,
    load_vector_chunk,
    load_vector_chunks_raw,
    row_position,
    row_reduce,
    row_smem,
    store_row,
    thread_reduce,
    vector_chunk,
)


def _row_at(pos, row):
    """``pos`` at another row (same thread, same place in the row)."""
    return SimpleNamespace(**{**vars(pos), "row": row})


def _row_constants(rc: RowConfig, flags: NormFlags, pos, smem, parity, dots, inv_n, overlap=None):
    """``c1 = mean(g * xhat)`` and ``c2 = mean(g)`` (0 for RMSNorm) of the row, from the threads' partial sums (and
    what ``overlap`` returned, when given: see :func:`row_reduce`)."""
    reduced = row_reduce(rc, pos, smem, parity, dots, overlap=overlap)
    sums, extra = reduced if overlap is not None else (reduced, None)
    means = [v * inv_n for v in sums]
    c2 = fx.Float32(0.0)
    if fx.const_expr(not flags.rms):
        c2 = means[1]
    return means[0], c2, extra


def _inverse_n(n):
    """``1 / n`` as Float32: a constant where the row length is compiled in (``flyc.mark_static``: no register)."""
    return fx.Float32(1.0 / n) if isinstance(n, int) else 1.0 / n.to(fx.Float32)


def _pinned(values):
    """Float32 scalars pinned where they are computed (:func:`flydsl.expr.vector.pin`)."""
    wide = vector.vector_class(fx.Float32, len(values))
    held = vector.pin(vector.from_elements(wide.mlir_type(), values))
    return [held[e] for e in range(len(values))]


def _load_vector(view, count: int):
    """``count`` contiguous elements of a view (shared memory) as one vector of its dtype."""
    cls = vector.vector_class(view.dtype, count)
    raw, buffer = vector.register_buffer(cls)
    fx.copy(view, buffer)
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


class _RowRing:
    """A ring of ``stages`` rows of this thread's 16-byte chunks of the ``sources`` (2-D tensors of one dtype, read
    at the same row) in shared memory, filled by ``cp.async`` (zeros past N and past the last row), read back by the
    thread that copied them: a thread waits for its own copies (``cp.async.wait_group``), no barrier. Shared by the
    staged backward (dy and x) and the staged forward (x, and the residual of the fused add)."""

    def __init__(self, rc: RowConfig, stages: int, sources, pos, n, rows):
        self.rc, self.sources, self.pos, self.n, self.rows = rc, tuple(sources), pos, n, rows
        self.width = len(self.sources)
        size = stages * self.width * rc.chunks * rc.block * rc.vec
        self.buffer = fx.SmemAllocator().allocate(self.sources[-1].dtype, size, alignment=16)
        self.cols = [chunk_index(rc, pos, j) * rc.vec for j in range(rc.chunks)]

    def _index(self, slot, t: int, j: int):
        return ((slot * self.width + t) * self.rc.chunks + j) * self.rc.block + self.pos.tid

    def issue(self, row, slot) -> None:
        """Copies this thread's chunks of ``row`` into ring slot ``slot``: one commit group."""
        rc, rows = self.rc, self.rows
        row_ok = row < rows
        safe_row = fx.arith.select(row_ok, row, type(row)(0))
        for t in fx.range_constexpr(self.width):
            for j in fx.range_constexpr(rc.chunks):
                col = self.cols[j]
                inside = row_ok & (col < self.n)
                fx.nvvm.cp_async(
                    self.buffer,
                    self.sources[t],
                    16,
                    dst_coord=self._index(slot, t, j) * rc.vec,
                    src_coord=(safe_row, fx.arith.select(inside, col, type(col)(0))),
                    src_bytes=fx.arith.select(inside, fx.Int32(16), fx.Int32(0)),
                )
        fx.nvvm.cp_async_commit_group()

    def chunk(self, slot, t: int, j: int):
        """Chunk ``j`` of source ``t`` of the row in ``slot``: ``vec`` Float32."""
        view = fx.local_tile(self.buffer, (self.rc.vec,), (self._index(slot, t, j),))
        wide = _load_vector(view, self.rc.vec).to(fx.Float32)
        return [wide[e] for e in range(self.rc.vec)]


def _row_stats(flags: NormFlags, mean_in, rstd_in, row, rows):
    """Row ``row``'s rstd and mean (RMSNorm: mean 0); both 0 past the last row, where xhat is then 0 (row 0's
    statistics could make the padding's xhat overflow, and 0 * inf is NaN in the column sums)."""
    inside = row < rows
    safe_row = fx.arith.select(inside, row, type(row)(0))
    zero = fx.Float32(0.0)
    mu = zero
    if fx.const_expr(not flags.rms):
        mu = fx.arith.select(inside, mean_in[safe_row], zero)
    return fx.arith.select(inside, rstd_in[safe_row], zero), mu


class _Ring(_RowRing):
    """The staged backward's ring: dy and x (:class:`_RowRing`), and the row math on them."""

    def __init__(self, cfg: BackwardConfig, flags: NormFlags, tensors, pos, n, rows):
        super().__init__(cfg.row, cfg.stages, tensors[:2], pos, n, rows)
        self.cfg, self.flags, self.tensors = cfg, flags, tensors

    def stats(self, row):
        """rstd and mean of ``row`` (:func:`_row_stats`: 0 past the last row)."""
        return _row_stats(self.flags, self.tensors[3], self.tensors[4], row, self.rows)

    def values(self, slot, j: int, mu):
        """``(dy, d, weight)`` of chunk ``j`` of the row in ``slot``: ``vec`` Float32 each, ``d = x - mean`` (RMSNorm:
        ``x``; the mean is subtracted here, before any product, so that rows far from 0 keep their precision);
        ``weight`` None without one."""
        dys, xs = [self.chunk(slot, t, j) for t in range(2)]
        ds = xs if self.flags.rms else [v - mu for v in xs]
        ws = None
        if fx.const_expr(self.flags.weight):
            ws = load_vector_chunk(self.rc, self.tensors[2], self.pos, self.n, j)
        return dys, ds, ws

    def first_pass(self, slot, rstd, mu, sums):
        """This thread's ``sum(g * xhat)`` (and ``sum(g)``) of the row in ``slot``, and ``sums`` plus its column
        terms (dweight's ``dy * xhat``, then dbias's ``dy``), chunk by chunk (each chunk's values die before the
        next is read); written as explicit ``fma``s (the kernel is traced without contraction, and its issue
        slots are what limits it: ncu, 2026-11-30)."""
        rc = self.rc
        dots = [fx.Float32(0.0)] * (1 if self.flags.rms else 2)
        added = list(sums)
        for j in fx.range_constexpr(rc.chunks):
            dys, ds, ws = self.values(slot, j, mu)
            dot = fx.Float32(0.0)
            for e in fx.range_constexpr(rc.vec):
                xhat = ds[e] * rstd
                g = dys[e] * ws[e] if ws is not None else dys[e]
                dot = fx.math.fma(g, xhat, dot)
                if fx.const_expr(not self.flags.rms):
                    dots[1] = dots[1] + g
                if fx.const_expr(self.cfg.sums > 0):
                    added[j * rc.vec + e] = fx.math.fma(dys[e], xhat, added[j * rc.vec + e])
                if fx.const_expr(self.cfg.sums > 1):
                    at = (rc.chunks + j) * rc.vec + e
                    added[at] = added[at] + dys[e]
            # a chunk past N: its xhat (-mean * rstd) may overflow, and 0 * inf is NaN (its column terms are never
            # stored)
            dots[0] = dots[0] + fx.arith.select(self.cols[j] < self.n, dot, fx.Float32(0.0))
            for s in fx.range_constexpr(self.cfg.sums):  # updated here: LLVM would sink them to the loop's end,
                at = (s * rc.chunks + j) * rc.vec  # keeping every chunk's dy and xhat live until there (spills)
                added[at : at + rc.vec] = _pinned(added[at : at + rc.vec])
        return dots, added

    def store_dx(self, row, slot, rstd, mu, c1, c2) -> None:
        k = rstd * c1  # xhat * c1 = d * (rstd * c1)

        def chunk(j):
            dys, ds, ws = self.values(slot, j, mu)
            g = [a * w for a, w in zip(dys, ws, strict=True)] if ws is not None else dys
            return _dx(rstd, g, ds, k, c2)

        store_row(self.rc, self.tensors[5], _row_at(self.pos, row), self.n, self.rows, chunk)

    def write_sums(self, partial_row, sums) -> None:
        fx.nvvm.cp_async_wait_group(0)  # nothing lands in shared memory after the CTA is gone
        rc = self.rc
        for s in fx.range_constexpr(self.cfg.sums):
            for j in fx.range_constexpr(rc.chunks):
                for q in fx.range_constexpr(rc.vec // 4):
                    at = (s * rc.chunks + j) * rc.vec + 4 * q
                    partial_row.store(s, j, q, sums[at : at + 4])


def _rows_staged(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange):
    """Rows staged through shared memory: each thread copies its chunks of dy and x (``cp.async``, 16 bytes each)
    rows ahead into its own slots of a ring (:class:`_Ring`), so that the bytes in flight cost no registers
    (Little's law: ~32 KB per SM for HBM's bandwidth). A thread reads only what it copied: ``cp.async.wait_group``
    orders it, no barrier. The column sums stay in registers, written once at the end to the CTA's partial row; the
    zero-filled padding adds nothing to them or to the row means. One CTA per row: one block reduction per row, then
    dx from the ring. A cluster per row: see :func:`_rows_pushed`."""
    if fx.const_expr(cfg.row.cluster > 1):
        _rows_pushed(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange)
        return
    rc = cfg.row
    stages = cfg.stages
    inv_n = _inverse_n(n)
    ring = _Ring(cfg, flags, tensors, pos, n, rows)
    for k in fx.range_constexpr(stages - 1):
        ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    slot = fx.Int32(0)
    parity = fx.Int32(0)
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA
        ahead = slot + (stages - 1)
        ring.issue(grp + (stages - 1) * groups, fx.arith.select(ahead >= stages, ahead - stages, ahead))
        next_rstd, next_mu = ring.stats(grp + groups)  # in flight during this row
        fx.nvvm.cp_async_wait_group(stages - 1)  # this row's chunks (this thread's) have landed
        dots, sums = ring.first_pass(slot, rstd, mu, sums)
        c1, c2, _ = _row_constants(rc, flags, _row_at(pos, grp), smem, parity, dots, inv_n)
        ring.store_dx(grp, slot, rstd, mu, c1, c2)
        rstd, mu = next_rstd, next_mu
        slot = fx.arith.select(slot + 1 >= stages, slot + 1 - stages, slot + 1)
        parity = 1 - parity
    ring.write_sums(partial_row, sums)


def _push_pair(a, b, remote, barrier) -> None:
    """``st.async``: two Float32 into a peer's shared memory (``remote``, an ``!llvm.ptr<7>`` from
    ``cluster.map_shared``), completing 8 bytes of the transaction count of its mbarrier ``barrier`` (likewise).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st-async
    """
    i64 = fx.Int64.mlir_type()  # mapa's 64-bit shared::cluster addresses, as they are
    where = _llvm.ptrtoint(i64, remote)
    bar = _llvm.ptrtoint(i64, barrier)
    text = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [$0], {$1, $2}, [$3];"
    _llvm.inline_asm(None, [where, a.value, b.value, bar], text, "l,f,f,l", has_side_effects=True)


_SPIN_LIMIT = 1 << 22  # polls of a team's pair before the kernel traps (a lost peer: fail rather than hang)
_TAG = 1  # marks a team's pair as written (the exchange tensor is zeroed before each launch)


def exchange_columns(cfg: BackwardConfig) -> int:
    """Float32 columns per row of a team's ``exchange`` tensor: per CTA of the row, its pair, each half next to a
    tag: ``(sum(g * xhat), tag, sum(g), tag)``."""
    return 4 * cfg.row.cluster


def _store_tagged(pointer, value) -> None:
    """``st.relaxed.gpu.global.b64``: ``value`` (Float32) and :data:`_TAG` as one 64-bit store (single-copy atomic:
    a reader sees both or neither), no fence: nothing this thread wrote before has to be waited for."""
    text = "{ .reg .b32 lo; .reg .b64 t; mov.b32 lo, $1; mov.b64 t, {lo, $2}; st.relaxed.gpu.global.b64 [$0], t; }"
    _llvm.inline_asm(None, [pointer, value.value, fx.Int32(_TAG).value], text, "l,f,r", has_side_effects=True)


def _load_tagged_pair(pointer):
    """Both halves of a team's pair (16 bytes: value, tag, value, tag) in one ``ld.relaxed.gpu.global.v2.b64``: each
    64-bit element is single-copy atomic (a value with its own tag); (first, second, both tags set)."""
    i32 = fx.Int32.mlir_type()
    struct = _llvm.StructType.get_literal([i32] * 4)
    text = "{ .reg .b64 a, b; ld.relaxed.gpu.global.v2.b64 {a, b}, [$4]; mov.b64 {$0, $1}, a; mov.b64 {$2, $3}, b; }"
    words = _llvm.inline_asm(struct, [pointer], text, "=r,=r,=r,=r,l", has_side_effects=True)
    word = [fx.Int32(_llvm.extractvalue(i32, words, [i])) for i in range(4)]
    first, second = (fx.Float32(fx.arith.bitcast(fx.Float32.mlir_type(), word[i].value)) for i in (0, 2))
    return first, second, (word[1] == _TAG) & (word[3] == _TAG)


def inbox_slots(lag: int) -> int:
    """A cluster's inbox slots (rows of pairs) when each CTA consumes row ``k - lag`` after pushing row ``k``: a peer
    pushing row ``k + slots`` has waited for this CTA's push of row ``k + slots - 1 - lag``, made after this CTA
    consumed row ``k + slots - 2 - 2 lag``, which is row ``k``: the slot is free (simulated in the CPU tests)."""
    return 2 * lag + 2


def _exchange_setup(cfg: BackwardConfig, pos, exchange, slots: int, team_inbox: bool = False):
    """How the CTAs of a row share their partial pairs (``sum(g * xhat)``, ``sum(g)``) in :func:`_rows_pushed`.

    Cluster: each CTA pushes its pair into every peer's inbox slot for the row (``st.async``, completing bytes on
    the peer's mbarrier of the slot); a CTA waits on its own mbarrier. Team (CTAs that are not a cluster): each
    writes its pair into the row's line of ``exchange`` in global memory, each half tagged in one 64-bit store (no
    fence, so no wait for this thread's loads and stores in flight); a CTA's first warp polls the pairs until every
    tag is set, sums them and hands the sums to the CTA through shared memory. Either way the sum runs over the
    ranks in a fixed order: every CTA of the row computes the same means, and the result does not depend on
    timing. ``team_inbox`` (the forward): a team's first warp combines the row's pairs into its statistics
    (:func:`_team_stats`), handed to the CTA through a shared-memory slot of two values."""
    share = SimpleNamespace(rc=cfg.row, pos=pos, exchange=exchange, slots=slots)
    if fx.const_expr(cfg.row.team and team_inbox):
        share.inbox = fx.SmemAllocator().allocate(fx.Float32, slots * 2, alignment=16)
    elif fx.const_expr(cfg.row.team):
        share.means = fx.SmemAllocator().allocate(fx.Float32, 4, alignment=16)  # two rows' sums
    else:
        share.inbox = fx.SmemAllocator().allocate(fx.Float32, slots * cfg.row.cluster * 2, alignment=16)
        share.bars = fx.mbarrier.allocate(fx.SmemAllocator(), slots)
        if pos.tid == 0:
            for i in fx.range_constexpr(slots):
                share.bars[i].init(1)
            fx.mbarrier.fence_init()
        cluster.sync()  # every peer's barriers are initialized before the first push
    return share


def _exchange_push(share, k, row, pair) -> None:
    """This CTA's ``pair`` of row ``row`` (its ``k``-th), to every CTA of the row (itself included)."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid == 0:
            for v in fx.range_constexpr(2):
                _store_tagged(fx.nvvm.address(share.exchange, (row, 4 * pos.rank + 2 * v)), pair[v])
    else:
        box = k % share.slots
        if pos.tid < size:
            remote = cluster.map_shared(share.inbox, pos.tid, coord=(box * size + pos.rank) * 2)
            _push_pair(pair[0], pair[1], remote, cluster.map_shared(share.bars.tensor, pos.tid, coord=box))
        if pos.tid == 0:
            share.bars[box].arrive_expect_tx(size * 8)


def _exchange_sums(share, k, row, parity):
    """The two sums of row ``row`` (this CTA's ``k``-th) over the row's CTAs, once all have pushed."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid < 32:
            _team_sums(share, row, parity, size, pos.tid % 32)
        gpu.barrier()
        return [share.means[parity * 2], share.means[parity * 2 + 1]]
    old = _exchange_wait(share, k)
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for r in fx.range_constexpr(size):
        total = [total[i] + share.inbox[(old * size + r) * 2 + i] for i in range(2)]
    return total


def _exchange_wait(share, k):
    """Waits until every CTA of the cluster has pushed its pair of this CTA's ``k``-th row; returns the inbox slot,
    whose pair from rank ``r`` is ``share.inbox[(slot * cluster + r) * 2 + (0, 1)]``."""
    old = k % share.slots
    share.bars[old].wait((k // share.slots) % 2)
    return old


def _poll_tagged_pair(share, row, rank, ok):
    """Rank ``rank``'s whole pair of ``row`` in the team's exchange line (:func:`_load_tagged_pair`: one L2 round
    trip per poll, not one per half), polled until both tags are set (traps after :data:`_SPIN_LIMIT` polls rather
    than hang); no waiting where ``ok`` is false."""
    where = fx.nvvm.address(share.exchange, (row, 4 * rank))
    first, second, done = _load_tagged_pair(where)
    tries = fx.Int32(0)
    while ok & (~done) & (tries < _SPIN_LIMIT):
        first, second, done = _load_tagged_pair(where)
        tries = tries + 1
    if tries >= _SPIN_LIMIT:
        _llvm.inline_asm(None, [], "trap;", "", has_side_effects=True)
    return first, second


def _team_sums(share, row, parity, size: int, lane) -> None:
    """The first warp: lane ``l`` reads the pairs of ranks ``l, l + 32, ...`` of ``row`` (:func:`_poll_tagged_pair`),
    sums them, then the warp's fixed shuffle tree; the sums go to shared memory slot ``parity``."""
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for i in fx.range_constexpr(-(-size // 32)):
        rank = lane + 32 * i
        ok = rank < size
        pair = _poll_tagged_pair(share, row, fx.arith.select(ok, rank, type(rank)(0)), ok)
        total = [t + fx.arith.select(ok, v, fx.Float32(0.0)) for t, v in zip(total, pair, strict=True)]
    total = [gpu.warp_reduce(v, "add", width=32) for v in total]
    if lane == 0:
        share.means[parity * 2] = total[0]
        share.means[parity * 2 + 1] = total[1]


def _team_stats(share, flags, k, row, n, inv_n):
    """Row ``row``'s statistics (this CTA's ``k``-th; as :func:`_pushed_stats`) in a team: lane ``r`` of the first
    warp polls rank ``r``'s tagged pair in global memory (:func:`_poll_tagged_pair`), the warp combines them
    (:func:`_team_combine`), lane 0 hands the result to the CTA through shared-memory slot ``k % slots``."""
    pos = share.pos
    slot = k % share.slots
    if pos.tid < 32:
        lane = pos.tid % 32
        ok = lane < share.rc.cluster
        rank = fx.arith.select(ok, lane, type(lane)(0))
        first, second = _poll_tagged_pair(share, row, rank, ok)
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


def _rows_pushed(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange):
    """The staged kernel with a row split over CTAs (a cluster, or a team: see :func:`_exchange_setup`), without a
    barrier of all of them per row: each CTA reduces its part of row ``k`` and pushes its pair, then writes dx of
    row ``k - lag``, whose pairs arrived meanwhile. The row's CTAs run up to ``lag`` rows apart: none stalls on the
    slowest at every row. A cluster's inbox slots (``2 * lag + 2``) are reused safely: a peer pushing row ``k +
    slots`` has waited for this CTA's push of row ``k + slots - 1 - lag``, made after this CTA consumed row ``k``.
    The ring holds rows ``k - lag .. k + ahead``."""
    rc = cfg.row
    stages, lag = cfg.stages, cfg.lag
    ahead = stages - 1 - lag
    values = 1 if flags.rms else 2
    inv_n = _inverse_n(n)
    ring = _Ring(cfg, flags, tensors, pos, n, rows)
    share = _exchange_setup(cfg, pos, exchange, inbox_slots(lag))
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    for k in fx.range_constexpr(ahead + 1):
        ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    queue = [fx.Float32(0.0)] * (2 * lag)  # (rstd, mean) of rows k - lag .. k - 1
    k = fx.Int32(0)
    slot = fx.Int32(0)  # k % stages
    for grp in range(group, row_groups + lag * groups, groups):  # lag more steps: the last rows' dx
        next_rstd, next_mu = ring.stats(grp + groups)  # in flight during this row
        fx.nvvm.cp_async_wait_group(ahead)  # row k's chunks (this thread's) have landed
        parity = k % 2
        dots, sums = ring.first_pass(slot, rstd, mu, sums)
        part = row_reduce(block, pos, smem, parity, dots)
        if fx.const_expr(values == 1):
            part = part + [fx.Float32(0.0)]
        if grp < row_groups:
            _exchange_push(share, k, grp, part)
        pending = queue + [rstd, mu]  # (rstd, mean) of rows k - lag .. k
        done = k - lag
        # row k - lag's slot, where row k + ahead + 1 goes once its dx is written (ahead + 1 + lag = stages)
        freed = fx.arith.select(slot >= lag, slot - lag, slot + (stages - lag))
        if done >= 0:  # dx of row k - lag, from its pairs
            total = _exchange_sums(share, done, grp - lag * groups, parity)
            c2 = fx.Float32(0.0)
            if fx.const_expr(not flags.rms):
                c2 = total[1] * inv_n
            ring.store_dx(grp - lag * groups, freed, pending[0], pending[1], total[0] * inv_n, c2)
        ring.issue(grp + (ahead + 1) * groups, freed)
        if fx.const_expr(lag > 0):
            queue = pending[2:]
        rstd, mu = next_rstd, next_mu
        k = k + 1
        slot = fx.arith.select(slot + 1 >= stages, slot + 1 - stages, slot + 1)
    ring.write_sums(partial_row, sums)


def _dx(rstd, g, h, k, c2):
    """``dx = rstd * (g - xhat * c1 - c2)`` as ``rstd * fma(-h, k, g - c2)``: ``h = xhat, k = c1``, or ``h = x -
    mean, k = rstd * c1``. ``g - c2`` first: where ``xhat`` is 0 (N = 1) dx is then exactly 0."""
    return [rstd * fx.math.fma(-v, k, a - c2) for a, v in zip(g, h, strict=True)]


def _round(values, dtype):
    """Values rounded to ``dtype`` and back (what a tensor of that dtype holds)."""
    if fx.const_expr(dtype is fx.Float32):
        return values
    return [v.to(dtype).to(fx.Float32) for v in values]


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
        self.x, self.residual, self.weight, self.bias, self.out, self.residual_out = tensors[:6]
        two = flags.residual or isinstance(flags, SoftmaxBackwardFlags)
        sources = (self.x, self.residual) if two else (self.x,)
        self.ring = _RowRing(cfg.row, cfg.stages, sources, pos, n, rows)
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
            xs = _round([a + b for a, b in zip(xs, rs, strict=True)], self.x.dtype)
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

        store_row(self.rc, self.out, _row_at(self.pos, row), self.n, self.rows, chunk)

    def products(self, slot, j: int):
        """Softmax's backward: chunk ``j`` of dy and of y of the row in ``slot``."""
        return self.ring.chunk(slot, 0, j), self.ring.chunk(slot, 1, j)

    def store_softmax_backward(self, slot, row, dot) -> None:
        """``dx = y * (dy - dot)`` of the row in ``slot``, ``dot = sum(dy * y)`` over the row."""

        def chunk(j):
            dys, ys = self.products(slot, j)
            return [y * (d - dot) for d, y in zip(dys, ys, strict=True)]

        store_row(self.rc, self.out, _row_at(self.pos, row), self.n, self.rows, chunk)

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

        store_row(rc, self.out, _row_at(pos, row), n, self.rows, chunk)


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
    here = _row_at(pos, row)
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


def _rows_staged_forward(cfg: StagedForwardConfig, flags, tensors, eps):
    """The staged forward (the default for long rows; see :func:`flydsl.kernels.normalization.forward`): a
    persistent grid whose CTA group (a CTA, or a cluster for rows longer than one CTA's ring row) takes rows
    ``group, group + groups, ...``. Each thread copies its chunks of x (and the residual) rows ahead into its slots
    of a shared-memory ring (:class:`_RowRing`), so that the bytes in flight take no registers. Per row: the CTA's
    partial pair (see :func:`_forward_partial`) through block reductions. One CTA per row: the row's statistics at
    once, then its output from the ring. A cluster: each CTA pushes its pair into every peer's inbox (``st.async`` +
    mbarrier, as the staged backward's :func:`_rows_pushed`, no cluster barrier per row) and writes the output of
    row ``k - lag``, whose pairs arrived meanwhile; LayerNorm combines the pairs by :func:`_chan`. A ring of a
    single row (lag 0; rows of 128 KB per CTA) copies the next row in once this row's output is written: the SM's
    copies wait meanwhile, other SMs' keep HBM busy. ``flags``: a :class:`NormFlags`, or :class:`SoftmaxFlags` for
    softmax (``tensors``: x and out in their norm places)."""
    rc = cfg.row
    rows, n = tensors[0].shape
    groups = gpu.grid_dim.x // rc.cluster
    pos = row_position(rc)
    flyc.set_kernel_attributes(min_blocks_per_sm=cfg.blocks_per_sm)
    group = gpu.block_idx.x // rc.cluster
    mean_out, rstd_out = tensors[6], tensors[7]
    lag = cfg.lag if rc.cluster > 1 else 0
    ahead = cfg.stages - 1 - lag
    inv_n = 1.0 / n.to(fx.Float32)
    work = _ForwardRows(cfg, flags, tensors, pos, n, rows)
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    smem = row_smem(block, phases=2)  # LayerNorm, softmax: two reductions per row; RMSNorm: alternating rows
    inv_count = inv_n
    share, counts = None, []
    if fx.const_expr(rc.cluster > 1):  # a team's inbox: two slots (the row's block barriers separate their reuse)
        share = _exchange_setup(cfg, pos, tensors[8], 2 if rc.team else inbox_slots(lag), team_inbox=True)
        if fx.const_expr(_layer_norm(flags)):
            if fx.const_expr(not rc.team):  # a team's first warp computes each rank's count where it combines
                counts = [_rank_count(rc, n, r).to(fx.Float32) for r in range(rc.cluster)]
            inv_count = _inverse_count(_rank_count(rc, n, pos.rank))
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
                _exchange_push(share, k, grp, part)
            if done >= 0:  # the output of row k - lag, from its pairs
                if fx.const_expr(rc.team):
                    a, b = _team_stats(share, flags, done, row, n, inv_n)
                else:
                    a, b = _pushed_stats(share, flags, _exchange_wait(share, done), counts, inv_n)
                _finish(
                    work, flags, pos, done % cfg.stages, row, rows, a, b, inv_n, eps, mean_out, rstd_out, part, held
                )
        else:  # one CTA per row: its pair is the row's
            a, b = _own_stats(flags, part, inv_n)
            _finish(work, flags, pos, done % cfg.stages, row, rows, a, b, inv_n, eps, mean_out, rstd_out, part, held)
        # the slot of row k - lag is free (its output is written): row k + ahead + 1 goes there
        work.ring.issue(grp + (ahead + 1) * groups, (k + ahead + 1) % cfg.stages)
        k = k + 1
        parity = 1 - parity
    fx.nvvm.cp_async_wait_group(0)  # nothing lands in shared memory after the CTA is gone
    if fx.const_expr(rc.cluster_shape is not None):
        cluster.sync()  # no CTA leaves while a peer may still push into it


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


def _finish(work, flags, pos, slot, row, rows, a, b, inv_n, eps, mean_out, rstd_out, part=None, held=None) -> None:
    """Row ``row``'s output from ring slot ``slot`` given its statistics ``(a, b)`` (see :func:`_pushed_stats`), and
    the statistics asked for (the leader thread). ``held``: the row's values kept in registers (lag 0), with this
    CTA's own pair ``part`` (softmax: the exps about its own max)."""
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
