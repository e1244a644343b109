"""The norm backward's staged kernel for long rows (:mod:`flydsl.kernels.normalization` launches it): each thread
copies its 16-byte chunks of dy and x rows ahead into a shared-memory ring (``cp.async``), so that enough bytes are in
flight without registers, and keeps its column sums in registers. A row split over CTAs does not wait at a cluster
barrier per row: the CTAs push their partial sums to each other (a cluster: ``st.async`` into the peers' shared
memory + mbarriers; past 8 CTAs, a team of up to 64 CTAs: tagged pairs in global memory) and write dx ``lag`` rows
later. Also the row math both backward kernels share (:func:`_row_constants`, :func:`_dx`), and the ring
(:class:`_RowRing`) and pushes (:func:`_exchange_setup`) that the staged forward
(:mod:`flydsl.kernels.norm_staged_forward`) runs on."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from mlir.dialects import llvm as _llvm

import flydsl.expr as fx
from flydsl.expr import cluster, gpu, vector
from flydsl.kernels.norm_backward_config import BackwardConfig
from flydsl.kernels.norm_config import NormFlags
from flydsl.kernels.reduction import (
    RowConfig,
    _fill_buffer,
    chunk_index,
    load_vector_chunks_raw,
    row_reduce,
    store_row,
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
    staged backward (dy and x) and the staged forward (x, and the residual of the fused add). Bulk mode (the staged
    backward's ``BackwardConfig.bulk``: :func:`_bulk_setup`, :func:`_issue_bulk`): one thread per CTA fills a slot
    by a bulk copy per source and chunk, every thread waits on the slot's mbarrier."""

    def __init__(self, rc: RowConfig, stages: int, sources, pos, n, rows):
        self.rc, self.sources, self.pos, self.n, self.rows = rc, tuple(sources), pos, n, rows
        self.width, self.stages = len(self.sources), stages
        size = stages * self.width * rc.chunks * rc.block * rc.vec
        self.buffer = fx.SmemAllocator().allocate(self.sources[-1].dtype, size, alignment=16)
        self.cols = [chunk_index(rc, pos, j) * rc.vec for j in range(rc.chunks)]
        self.bars = None  # bulk mode's mbarriers (_bulk_setup)

    def wait_bulk(self, slot, phase) -> None:
        """Waits until ring slot ``slot``'s bulk copies (:func:`_issue_bulk`) of phase ``phase`` have landed."""
        self.bars[slot].wait(phase)

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


def _bulk_setup(ring) -> None:
    """A :class:`_RowRing` in bulk mode (:func:`_issue_bulk`): an mbarrier per slot, and the ring zeroed, so that
    the bytes no copy writes (past N, and slots of rows past the last) read as zeros; ordered before the copies'
    async-proxy writes by a proxy fence and a barrier. (Module functions, not methods: the kernel's control flow is
    traced through functions only.)"""
    rc = ring.rc
    ring.bars = fx.mbarrier.allocate(fx.SmemAllocator(), ring.stages)
    _, filled = _fill_buffer(vector.vector_class(ring.buffer.dtype, rc.vec), 0)
    for slot in fx.range_constexpr(ring.stages):
        for t in fx.range_constexpr(ring.width):
            for j in fx.range_constexpr(rc.chunks):
                fx.copy(filled, fx.local_tile(ring.buffer, (rc.vec,), (ring._index(slot, t, j),)))
    if ring.pos.tid == 0:
        for i in fx.range_constexpr(ring.stages):
            ring.bars[i].init(1)
        fx.mbarrier.fence_init()
    fx.nvvm.fence_proxy_async("shared")
    gpu.barrier()


def _issue_bulk(ring, row, slot) -> None:
    """``ring``'s :meth:`_RowRing.issue` for the whole CTA: one thread copies the CTA's part of ``row`` (for each
    source and chunk ``j``, its threads' ``block`` consecutive 16-byte chunks: one contiguous piece) into ring slot
    ``slot`` by bulk copies completing on the slot's mbarrier (:meth:`_RowRing.wait_bulk`); nothing past N or past
    the last row. The caller makes sure every thread has finished reading the slot (a block barrier since)."""
    rc, n = ring.rc, ring.n
    if ring.pos.tid == rc.block - 32:  # the last warp's first thread: the first warp polls a team's pairs
        row_ok = row < ring.rows
        safe_row = fx.arith.select(row_ok, row, type(row)(0))
        piece = rc.block * rc.vec
        size = ring.buffer.dtype.width // 8
        pieces, total = [], fx.Int32(0)
        for j in fx.range_constexpr(rc.chunks):
            first = (j * rc.cluster + ring.pos.rank) * piece  # the CTA's first column of its chunk j
            left = n - first  # columns from there to N
            count = fx.arith.select(left > piece, type(left)(piece), left)
            nbytes = fx.arith.select(row_ok & (left > 0), count, type(left)(0)).to(fx.Int32) * size
            pieces.append((fx.arith.select(first < n, first, type(first)(0)), nbytes))
            total = total + nbytes * ring.width
        ring.bars[slot].arrive_expect_tx(total)
        for t in fx.range_constexpr(ring.width):
            for j in fx.range_constexpr(rc.chunks):
                first, nbytes = pieces[j]
                start = ((slot * ring.width + t) * rc.chunks + j) * rc.block * rc.vec
                fx.nvvm.cp_async_bulk(
                    ring.buffer, ring.sources[t], nbytes, ring.bars[slot], dst_coord=start, src_coord=(safe_row, first)
                )


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
        # the same columns every row: loaded before the row loop, in their dtype (cfg.keep_weights)
        self.kept = None
        if fx.const_expr(cfg.keep_weights and flags.weight):
            self.kept = load_vector_chunks_raw(cfg.row, tensors[2], pos, n)

    def stats(self, row):
        """rstd and mean of ``row`` (:func:`_row_stats`: 0 past the last row)."""
        return _row_stats(self.flags, self.tensors[3], self.tensors[4], row, self.rows)

    @property
    def folds_mean(self) -> bool:
        """LayerNorm with ``cfg.fma_dx``: the mean is folded into fmas on x rather than subtracted first (fewer float
        operations, which bound the 16-bit kernel; a relative error of ``|mean| / std * 2^-24`` in xhat, within
        16-bit tolerance since 16-bit rows hold no wider mean-to-spread ratio)."""
        return self.cfg.fma_dx and not self.flags.rms

    def values(self, slot, j: int, mu):
        """``(dy, d, weight)`` of chunk ``j`` of the row in ``slot``: ``vec`` Float32 each, ``d = x - mean`` (RMSNorm,
        and LayerNorm that folds the mean (:attr:`folds_mean`): ``x``; else the mean is subtracted here, before any
        product, so that rows far from 0 keep their precision); ``weight`` None without one."""
        dys, xs = [self.chunk(slot, t, j) for t in range(2)]
        ds = xs if self.flags.rms or self.folds_mean else [v - mu for v in xs]
        ws = None
        if fx.const_expr(self.flags.weight):
            ws = vector_chunk(self.rc, self.tensors[2], self.pos, self.n, j, self.kept)
        return dys, ds, ws

    @staticmethod
    def weighted(dys, ws):
        """``g = dy * weight`` (``dy`` without a weight)."""
        return [d * w for d, w in zip(dys, ws, strict=True)] if ws is not None else dys

    def first_pass(self, slot, rstd, mu, sums, valid=None):
        """This thread's ``sum(g * xhat)`` (and ``sum(g)``) of the row in ``slot``, and ``sums`` plus its column
        terms (dweight's ``dy * xhat``, then dbias's ``dy``), chunk by chunk (each chunk's values die before the
        next is read, unless ``cfg.hold``); written as explicit ``fma``s (the kernel is traced without contraction,
        and its issue slots are what limits it: ncu, 2026-11-30). Returns (dots, sums, held): ``held`` (with
        ``cfg.hold``, else None) the ``(g, x - mean)`` of every chunk, for :meth:`store_dx`. ``valid``: 1.0, or 0.0
        for a row past the last whose slot holds an earlier row (bulk copies: nothing zero-fills it): dbias's terms
        ``fma(dy, valid, sum)``, exactly ``dy + sum`` for a row (dweight's terms are 0 there: rstd is)."""
        rc = self.rc
        dots = [fx.Float32(0.0)] * (1 if self.flags.rms else 2)
        added = list(sums)
        held = [] if self.cfg.hold else None
        shift = -mu * rstd if self.folds_mean else None  # xhat = fma(x, rstd, -mean * rstd)
        for j in fx.range_constexpr(rc.chunks):
            dys, ds, ws = self.values(slot, j, mu)
            gs = self.weighted(dys, ws)
            if fx.const_expr(held is not None):
                held.append((gs, ds))
            dot = fx.Float32(0.0)
            for e in fx.range_constexpr(rc.vec):
                xhat = fx.math.fma(ds[e], rstd, shift) if self.folds_mean else ds[e] * rstd
                g = gs[e]
                dot = fx.math.fma(g, xhat, dot)
                if fx.const_expr(not self.flags.rms):
                    dots[1] = dots[1] + g
                if fx.const_expr(self.cfg.sums > 0):
                    added[j * rc.vec + e] = fx.math.fma(dys[e], xhat, added[j * rc.vec + e])
                if fx.const_expr(self.cfg.sums > 1):
                    at = (rc.chunks + j) * rc.vec + e
                    added[at] = added[at] + dys[e] if valid is None else fx.math.fma(dys[e], valid, added[at])
            # a chunk past N: its xhat (-mean * rstd) may overflow, and 0 * inf is NaN (its column terms are never
            # stored)
            dots[0] = dots[0] + fx.arith.select(self.cols[j] < self.n, dot, fx.Float32(0.0))
            for s in fx.range_constexpr(self.cfg.sums):  # updated here: LLVM would sink them to the loop's end,
                at = (s * rc.chunks + j) * rc.vec  # keeping every chunk's dy and xhat live until there (spills)
                added[at : at + rc.vec] = _pinned(added[at : at + rc.vec])
        return dots, added, held

    def store_dx(self, row, slot, rstd, mu, c1, c2, held=None) -> None:
        """dx of ``row`` from ring slot ``slot``, or from ``held`` (:meth:`first_pass`'s)."""
        k = rstd * c1  # xhat * c1 = d * (rstd * c1)
        if fx.const_expr(self.folds_mean):  # dx = rstd * g - rstd * k * x + rstd * (k * mean - c2)
            slope, offset = -(rstd * k), rstd * (k * mu - c2)

        def chunk(j):
            if fx.const_expr(held is not None):
                g, ds = held[j]
            else:
                dys, ds, ws = self.values(slot, j, mu)
                g = self.weighted(dys, ws)
            if fx.const_expr(self.folds_mean):
                return [fx.math.fma(rstd, a, fx.math.fma(slope, v, offset)) for a, v in zip(g, ds, strict=True)]
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
    early = cfg.hold  # the row's values in registers: its slot takes row k + stages once the first pass read it
    for k in fx.range_constexpr(stages - 1 + early):
        ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    slot = fx.Int32(0)
    parity = fx.Int32(0)
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA
        if fx.const_expr(not early):
            ahead = slot + (stages - 1)
            ring.issue(grp + (stages - 1) * groups, fx.arith.select(ahead >= stages, ahead - stages, ahead))
        next_rstd, next_mu = ring.stats(grp + groups)  # in flight during this row
        fx.nvvm.cp_async_wait_group(stages - 1)  # this row's chunks (this thread's) have landed
        dots, sums, held = ring.first_pass(slot, rstd, mu, sums)
        c1, c2, _ = _row_constants(rc, flags, _row_at(pos, grp), smem, parity, dots, inv_n)
        if fx.const_expr(early):  # after the block reduction: every value this thread read has arrived
            ring.issue(grp + stages * groups, slot)
        ring.store_dx(grp, slot, rstd, mu, c1, c2, held)
        rstd, mu = next_rstd, next_mu
        slot = fx.arith.select(slot + 1 >= stages, slot + 1 - stages, slot + 1)
        parity = 1 - parity
    ring.write_sums(partial_row, sums)


def _push_pair(a, b, remote, barrier) -> None:
    """``st.async``: two Float32 into a peer's shared memory (``remote``, an ``!llvm.ptr<7>`` from
    ``cluster.map_shared``), completing 8 bytes of the transaction count of its mbarrier ``barrier`` (likewise)."""
    _st_async(remote, barrier, "v2.f32", "{$1, $2}", [a, b], "f,f")


def _push_word(value, remote, barrier) -> None:
    """``st.async``: one Int32 into a peer's shared memory, completing 4 bytes of its mbarrier ``barrier``'s
    transaction count (as :func:`_push_pair`)."""
    _st_async(remote, barrier, "b32", "$1", [value], "r")


def _st_async(remote, barrier, kind: str, registers: str, values, constraints: str) -> None:
    """``st.async.shared::cluster.mbarrier::complete_tx::bytes.{kind}`` of ``values`` (operands ``registers``).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st-async
    """
    i64 = fx.Int64.mlir_type()  # mapa's 64-bit shared::cluster addresses, as they are
    where, bar = _llvm.ptrtoint(i64, remote), _llvm.ptrtoint(i64, barrier)
    last = len(values) + 1
    text = f"st.async.shared::cluster.mbarrier::complete_tx::bytes.{kind} [$0], {registers}, [${last}];"
    operands = [where, *(v.value for v in values), bar]
    _llvm.inline_asm(None, operands, text, f"l,{constraints},l", has_side_effects=True)


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
    return _tagged_pair(_load_tagged_words(pointer))


def _tagged_pair(words):
    """(first, second, both tags set) of a pair's four words (:func:`_load_tagged_words`)."""
    first, second = (fx.Float32(fx.arith.bitcast(fx.Float32.mlir_type(), words[i].value)) for i in (0, 2))
    return first, second, (words[1] == _TAG) & (words[3] == _TAG)


def _load_tagged_words(pointer, when=None):
    """The four words of a team's pair (:func:`_load_tagged_pair`), as Int32, not looked at: a load whose result
    is first used much later does not stall the warp meanwhile. ``when`` (a kernel boolean): load only where it
    holds, else zeros (tags unset)."""
    i32 = fx.Int32.mlir_type()
    struct = _llvm.StructType.get_literal([i32] * 4)
    load = "ld.relaxed.gpu.global.v2.b64 {a, b}, [$4]; mov.b64 {$0, $1}, a; mov.b64 {$2, $3}, b;"
    if when is None:
        text = f"{{ .reg .b64 a, b; {load} }}"
        words = _llvm.inline_asm(struct, [pointer], text, "=r,=r,=r,=r,l", has_side_effects=True)
    else:
        text = f"{{ .reg .pred p; .reg .b64 a, b; setp.ne.b32 p, $5, 0; mov.b64 a, 0; mov.b64 b, 0; @p {load} }}"
        flag = fx.arith.select(when, fx.Int32(1), fx.Int32(0))
        words = _llvm.inline_asm(struct, [pointer, flag.value], text, "=r,=r,=r,=r,l,r", has_side_effects=True)
    return [fx.Int32(_llvm.extractvalue(i32, words, [i])) for i in range(4)]


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
    (:func:`flydsl.kernels.norm_staged_forward._team_stats`), handed to the CTA through a shared-memory slot of two
    values."""
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


def _exchange_push(share, k, row, pair, extra_bytes: int = 0) -> None:
    """This CTA's ``pair`` of row ``row`` (its ``k``-th), to every CTA of the row (itself included). A cluster's
    ``extra_bytes``: more bytes the slot's mbarrier waits for (pushed by the caller: the staged forward's claimed
    row, :func:`flydsl.kernels.norm_staged_forward._claimed_rows`)."""
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
            share.bars[box].arrive_expect_tx(size * 8 + extra_bytes)


def _exchange_sums(share, k, row, parity, early=None):
    """The two sums of row ``row`` (this CTA's ``k``-th) over the row's CTAs, once all have pushed; ``early``: a
    team's pairs of the row as :func:`_team_prefetch` read them."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid < 32:
            _team_sums(share, row, parity, size, pos.tid % 32, early)
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


def _poll_tagged_pair(share, row, rank, ok, early=None):
    """Rank ``rank``'s whole pair of ``row`` in the team's exchange line (:func:`_load_tagged_pair`: one L2 round
    trip per poll, not one per half), polled until both tags are set (traps after :data:`_SPIN_LIMIT` polls rather
    than hang); no waiting where ``ok`` is false. ``early``: the pair's words as an earlier load found them (no load
    now when its tags are set)."""
    where = fx.nvvm.address(share.exchange, (row, 4 * rank))
    first, second, done = _tagged_pair(early) if early is not None else _load_tagged_pair(where)
    tries = fx.Int32(0)
    while ok & (~done) & (tries < _SPIN_LIMIT):
        first, second, done = _load_tagged_pair(where)
        tries = tries + 1
    if tries >= _SPIN_LIMIT:
        fx.nvvm.trap()
    return first, second


def _team_ranks(size: int, lane, i: int):
    """The rank lane ``lane`` of the first warp reads in its ``i``-th step (``lane + 32 i``; 0 past the team) and
    whether it is in the team."""
    rank = lane + 32 * i
    ok = rank < size
    return fx.arith.select(ok, rank, type(rank)(0)), ok


def _team_prefetch(share, row, when):
    """The pairs of ``row`` as they are now (one load per lane of the first warp and per 32 ranks, none where
    ``when`` is false), issued before :func:`_team_sums` needs them (right after the next row's first pass): the
    peers pushed them about a row ago, so the load's L2 round trip overlaps the block reduction instead of stalling
    the CTA at the exchange (otherwise the first warp reads them while every other warp waits at the barrier)."""
    size, pos = share.rc.cluster, share.pos
    lane = pos.tid % 32
    early = []
    for i in fx.range_constexpr(-(-size // 32)):
        rank, ok = _team_ranks(size, lane, i)
        where = fx.nvvm.address(share.exchange, (fx.arith.select(when, row, type(row)(0)), 4 * rank))
        early.append(_load_tagged_words(where, when & ok & (pos.tid < 32)))
    return early


def _team_sums(share, row, parity, size: int, lane, early=None) -> None:
    """The first warp: lane ``l`` reads the pairs of ranks ``l, l + 32, ...`` of ``row`` (:func:`_poll_tagged_pair`;
    from ``early``, :func:`_team_prefetch`'s, where its tags were set), sums them, then the warp's fixed shuffle
    tree; the sums go to shared memory slot ``parity``."""
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for i in fx.range_constexpr(-(-size // 32)):
        rank, ok = _team_ranks(size, lane, i)
        pair = _poll_tagged_pair(share, row, rank, ok, None if early is None else early[i])
        total = [t + fx.arith.select(ok, v, fx.Float32(0.0)) for t, v in zip(total, pair, strict=True)]
    total = [gpu.warp_reduce(v, "add", width=32) for v in total]
    if lane == 0:
        share.means[parity * 2] = total[0]
        share.means[parity * 2 + 1] = total[1]


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
    if fx.const_expr(cfg.bulk):
        _bulk_setup(ring)
    share = _exchange_setup(cfg, pos, exchange, inbox_slots(lag))
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    # cp.async: rows k + 1 .. k + ahead in flight while row k is read. Bulk copies: a slot is refilled after the
    # block barrier that follows its last reads (row k's reduction), so rows k + 1 .. k + ahead - 1 (and k + ahead
    # from mid-row).
    for k in fx.range_constexpr(ahead if cfg.bulk else ahead + 1):
        if fx.const_expr(cfg.bulk):
            _issue_bulk(ring, group + k * groups, fx.Int32(k))
        else:
            ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    queue = [fx.Float32(0.0)] * (2 * lag)  # (rstd, mean) of rows k - lag .. k - 1
    k = fx.Int32(0)
    slot = fx.Int32(0)  # k % stages
    phase = fx.Int32(0)  # (k // stages) % 2: the fill of the slot's mbarrier that row k's bulk copies complete
    for grp in range(group, row_groups + lag * groups, groups):  # lag more steps: the last rows' dx
        next_rstd, next_mu = ring.stats(grp + groups)  # in flight during this row
        valid = None
        if fx.const_expr(cfg.bulk):
            ring.wait_bulk(slot, phase)
            valid = fx.arith.select(grp < rows, fx.Float32(1.0), fx.Float32(0.0))
        else:
            fx.nvvm.cp_async_wait_group(ahead)  # row k's chunks (this thread's) have landed
        parity = k % 2
        dots, sums, held = ring.first_pass(slot, rstd, mu, sums, valid)
        early = None
        if fx.const_expr(rc.team and cfg.lag > 0 and cfg.prefetch_pairs):  # row k - lag's, while this row reduces
            early = _team_prefetch(share, grp - lag * groups, k >= lag)
        part = row_reduce(block, pos, smem, parity, dots)
        if fx.const_expr(cfg.bulk):  # every thread is past row k - lag - 1's dx: its slot takes row k + ahead
            later = slot + ahead
            _issue_bulk(ring, grp + ahead * groups, fx.arith.select(later >= stages, later - stages, later))
        if fx.const_expr(cfg.hold):  # lag 0, the row in registers: its slot is free now (every value arrived)
            ring.issue(grp + stages * groups, slot)
        if fx.const_expr(values == 1):
            part = part + [fx.Float32(0.0)]
        if grp < row_groups:
            _exchange_push(share, k, grp, part)
        pending = queue + [rstd, mu]  # (rstd, mean) of rows k - lag .. k
        done = k - lag
        # row k - lag's slot, where row k + ahead + 1 goes once its dx is written (ahead + 1 + lag = stages)
        freed = fx.arith.select(slot >= lag, slot - lag, slot + (stages - lag))
        if done >= 0:  # dx of row k - lag, from its pairs
            total = _exchange_sums(share, done, grp - lag * groups, parity, early)
            c2 = fx.Float32(0.0)
            if fx.const_expr(not flags.rms):
                c2 = total[1] * inv_n
            ring.store_dx(grp - lag * groups, freed, pending[0], pending[1], total[0] * inv_n, c2, held)
        if fx.const_expr(not cfg.hold and not cfg.bulk):
            ring.issue(grp + (ahead + 1) * groups, freed)
        if fx.const_expr(lag > 0):
            queue = pending[2:]
        rstd, mu = next_rstd, next_mu
        k = k + 1
        wrapped = slot + 1 >= stages
        phase = fx.arith.select(wrapped, 1 - phase, phase)
        slot = fx.arith.select(wrapped, slot + 1 - stages, slot + 1)
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
