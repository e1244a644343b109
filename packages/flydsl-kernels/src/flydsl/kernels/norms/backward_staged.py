"""The norms' staged backward for long rows: each thread copies its 16-byte chunks of dy and x rows ahead into a
shared-memory ring (``cp.async``, or a CTA's bulk copies), so that enough bytes are in flight without registers, and
keeps its column sums in registers. A row split over CTAs does not wait at a cluster barrier per row: the CTAs push
their partial sums to each other (a cluster: ``st.async`` + mbarriers; past 8 CTAs, a team: tagged pairs in global
memory) and write dx ``lag`` rows later (:func:`rows_staged`)."""

from __future__ import annotations

import dataclasses

import flydsl.expr as fx
from flydsl.kernels.norms.backward_common import BackwardRows, dx_values, row_constants, row_stats
from flydsl.kernels.rows.configs import BackwardConfig, NormFlags
from flydsl.kernels.rows.exchange import exchange_push, exchange_setup, exchange_sums, inbox_slots, team_prefetch
from flydsl.kernels.rows.reduce import row_reduce
from flydsl.kernels.rows.ring import RowRing, bulk_setup, issue_bulk
from flydsl.kernels.rows.tiles import inverse_n, load_vector_chunks_raw, pinned, row_at, store_row, vector_chunk

__all__ = ["rows_staged"]


class _Ring(RowRing):
    """The staged backward's ring: dy and x (:class:`~flydsl.kernels.rows.ring.RowRing`), and the row math on them."""

    def __init__(self, cfg: BackwardConfig, flags: NormFlags, tensors, pos, n, rows):
        super().__init__(cfg.row, cfg.stages, (tensors.dy, tensors.x), pos, n, rows)
        self.cfg, self.flags, self.tensors = cfg, flags, tensors
        # the same columns every row: loaded before the row loop, in their dtype (cfg.keep_weights)
        self.kept = None
        if fx.const_expr(cfg.keep_weights and flags.weight):
            self.kept = load_vector_chunks_raw(cfg.row, tensors.weight, pos, n)

    def stats(self, row):
        """rstd and mean of ``row`` (:func:`~.backward_common.row_stats`: 0 past the last row)."""
        return row_stats(self.flags, self.tensors.mean, self.tensors.rstd, row, self.rows)

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
            ws = vector_chunk(self.rc, self.tensors.weight, self.pos, self.n, j, self.kept)
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
                added[at : at + rc.vec] = pinned(added[at : at + rc.vec])
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
            return dx_values(rstd, g, ds, k, c2)

        store_row(self.rc, self.tensors.dx, row_at(self.pos, row), self.n, self.rows, chunk)

    def write_sums(self, partial_row, sums) -> None:
        fx.nvvm.cp_async_wait_group(0)  # nothing lands in shared memory after the CTA is gone
        rc = self.rc
        for s in fx.range_constexpr(self.cfg.sums):
            for j in fx.range_constexpr(rc.chunks):
                for q in fx.range_constexpr(rc.vec // 4):
                    at = (s * rc.chunks + j) * rc.vec + 4 * q
                    partial_row.store(s, j, q, sums[at : at + 4])


def rows_staged(ctx: BackwardRows):
    """Rows staged through shared memory: each thread copies its chunks of dy and x (``cp.async``, 16 bytes each)
    rows ahead into its own slots of a ring (:class:`_Ring`), so that the bytes in flight cost no registers
    (Little's law: ~32 KB per SM for HBM's bandwidth). A thread reads only what it copied: ``cp.async.wait_group``
    orders it, no barrier. The column sums stay in registers, written once at the end to the CTA's partial row; the
    zero-filled padding adds nothing to them or to the row means. One CTA per row: one block reduction per row, then
    dx from the ring. A cluster per row: see :func:`_rows_pushed`."""
    cfg, flags, tensors, pos, n, rows = ctx.cfg, ctx.flags, ctx.tensors, ctx.pos, ctx.n, ctx.rows
    smem, partial_row = ctx.smem, ctx.partial_row
    group, groups, row_groups = ctx.group, ctx.groups, ctx.row_groups
    if fx.const_expr(cfg.row.cluster > 1):
        _rows_pushed(ctx)
        return
    rc = cfg.row
    stages = cfg.stages
    inv_n = inverse_n(n)
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
        c1, c2, _ = row_constants(rc, flags, row_at(pos, grp), smem, parity, dots, inv_n)
        if fx.const_expr(early):  # after the block reduction: every value this thread read has arrived
            ring.issue(grp + stages * groups, slot)
        ring.store_dx(grp, slot, rstd, mu, c1, c2, held)
        rstd, mu = next_rstd, next_mu
        slot = fx.arith.select(slot + 1 >= stages, slot + 1 - stages, slot + 1)
        parity = 1 - parity
    ring.write_sums(partial_row, sums)


def _rows_pushed(ctx: BackwardRows):
    """The staged kernel with a row split over CTAs (a cluster or a team: :mod:`flydsl.kernels.rows.exchange`),
    without a barrier of all of them per row: each CTA reduces its part of row ``k`` and pushes its pair, then writes
    dx of row ``k - lag``, whose pairs arrived meanwhile. The row's CTAs run up to ``lag`` rows apart: none stalls on
    the slowest at every row. A cluster's inbox slots (``2 * lag + 2``) are reused safely: a peer pushing row ``k +
    slots`` has waited for this CTA's push of row ``k + slots - 1 - lag``, made after this CTA consumed row ``k``.
    The ring holds rows ``k - lag .. k + ahead``."""
    cfg, flags, tensors, pos, n, rows = ctx.cfg, ctx.flags, ctx.tensors, ctx.pos, ctx.n, ctx.rows
    smem, partial_row = ctx.smem, ctx.partial_row
    group, groups, row_groups, exchange = ctx.group, ctx.groups, ctx.row_groups, ctx.exchange
    rc = cfg.row
    stages, lag = cfg.stages, cfg.lag
    ahead = stages - 1 - lag
    values = 1 if flags.rms else 2
    inv_n = inverse_n(n)
    ring = _Ring(cfg, flags, tensors, pos, n, rows)
    if fx.const_expr(cfg.bulk):
        bulk_setup(ring)
    share = exchange_setup(cfg.row, pos, exchange, inbox_slots(lag))
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    # cp.async: rows k + 1 .. k + ahead in flight while row k is read. Bulk copies: a slot is refilled after the
    # block barrier that follows its last reads (row k's reduction), so rows k + 1 .. k + ahead - 1 (and k + ahead
    # from mid-row).
    for k in fx.range_constexpr(ahead if cfg.bulk else ahead + 1):
        if fx.const_expr(cfg.bulk):
            issue_bulk(ring, group + k * groups, fx.Int32(k))
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
            early = team_prefetch(share, grp - lag * groups, k >= lag)
        part = row_reduce(block, pos, smem, parity, dots)
        if fx.const_expr(cfg.bulk):  # every thread is past row k - lag - 1's dx: its slot takes row k + ahead
            later = slot + ahead
            issue_bulk(ring, grp + ahead * groups, fx.arith.select(later >= stages, later - stages, later))
        if fx.const_expr(cfg.hold):  # lag 0, the row in registers: its slot is free now (every value arrived)
            ring.issue(grp + stages * groups, slot)
        if fx.const_expr(values == 1):
            part = part + [fx.Float32(0.0)]
        if grp < row_groups:
            exchange_push(share, k, grp, part)
        pending = queue + [rstd, mu]  # (rstd, mean) of rows k - lag .. k
        done = k - lag
        # row k - lag's slot, where row k + ahead + 1 goes once its dx is written (ahead + 1 + lag = stages)
        freed = fx.arith.select(slot >= lag, slot - lag, slot + (stages - lag))
        if done >= 0:  # dx of row k - lag, from its pairs
            total = exchange_sums(share, done, grp - lag * groups, parity, early)
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
