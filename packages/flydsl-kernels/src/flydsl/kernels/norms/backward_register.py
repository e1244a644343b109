"""The norms' backward with rows in registers (the register kernel's row loops): a persistent grid walks the rows;
the two row means are reduced together (one barrier, one cluster barrier for long rows, per row) while the next
row's loads are in flight; ``dweight``/``dbias`` terms go into float32 column sums in shared memory (or in the CTA's
partial row in global memory when they do not fit). Rows longer than the registers hold are read twice, segment by
segment, the second time from L2."""

from __future__ import annotations

import functools

import flydsl.expr as fx
from flydsl.kernels.norms.backward_common import (
    BackwardRows,
    dx_values,
    load4,
    row_constants,
    row_stats,
    store4,
    sum_index,
)
from flydsl.kernels.rows.reduce import masked_sum, thread_reduce
from flydsl.kernels.rows.tiles import load_row, load_row_raw, load_vector_chunk, row_at, row_masks, store_row, widen

__all__ = ["rows_prefetched", "rows_two_pass", "write_partial"]


def _column_sums_add(ctx: BackwardRows, pos, chunks, terms):
    """Adds ``terms[s]`` (this thread's values of ``chunks``) to column sum ``s``."""
    cfg, sums_smem, partial_row = ctx.cfg, ctx.sums_smem, ctx.partial_row
    for s in fx.range_constexpr(cfg.sums):
        for k, j in enumerate(chunks):
            for q in fx.range_constexpr(cfg.row.vec // 4):
                add = terms[s][(k * cfg.row.vec + 4 * q) : (k * cfg.row.vec + 4 * q + 4)]
                if fx.const_expr(cfg.smem_sums):
                    view = fx.local_tile(sums_smem, (4,), (sum_index(cfg, pos, s, pos.row_in_cta, j, q),))
                    old = load4(view)
                    store4(view, [a + b for a, b in zip(old, add, strict=True)])
                else:
                    old = partial_row.load(s, j, q)
                    partial_row.store(s, j, q, [a + b for a, b in zip(old, add, strict=True)])


def _prefetch(ctx: BackwardRows, pos):
    """Row ``pos.row``'s dy and x chunks in their dtype (nothing read past the last row), its rstd and mean."""
    rc, t = ctx.cfg.row, ctx.tensors
    rstd, mu = row_stats(ctx.flags, t.mean, t.rstd, pos.row, ctx.rows)
    return [load_row_raw(rc, t.dy, pos, ctx.n, ctx.rows), load_row_raw(rc, t.x, pos, ctx.n, ctx.rows), rstd, mu]


def rows_prefetched(ctx: BackwardRows):
    """Rows held in registers: while a row is reduced and written, the next row's loads are in flight (in the row's
    dtype: 4 registers per chunk). In a CTA they are issued first; in a cluster after the barrier's arrive, whose
    release would otherwise wait for them (see :func:`~flydsl.kernels.rows.reduce.row_reduce`)."""
    cfg, flags, pos, n, rows = ctx.cfg, ctx.flags, ctx.pos, ctx.n, ctx.rows
    rc = cfg.row
    inv_n = 1.0 / n.to(fx.Float32)
    whole = tuple(range(rc.chunks))
    parity = fx.Int32(0)
    ahead = _prefetch(ctx, pos)  # pos.row: the first row of this CTA
    for grp in range(ctx.group, ctx.row_groups, ctx.groups):  # the same trip count for the whole CTA (and cluster)
        here = row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        after = row_at(pos, (grp + ctx.groups) * rc.rows_per_cta + pos.row_in_cta)
        current = ahead
        if fx.const_expr(rc.cluster == 1):
            ahead = _prefetch(ctx, after)
        rstd, mu = current[2], current[3]
        dys, xs = widen(current[0]), widen(current[1])
        g, xhat, dys = _terms(ctx, here, rstd, mu, whole, dys, xs)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        masks = row_masks(rc, here, n, rows)
        dots = _first_pass(ctx, here, whole, g, xhat, dys, dots, masks)
        if fx.const_expr(rc.cluster == 1):
            c1, c2, _ = row_constants(rc, flags, here, ctx.smem, parity, dots, inv_n)
        else:
            overlap = functools.partial(_prefetch, ctx, after)
            c1, c2, ahead = row_constants(rc, flags, here, ctx.smem, parity, dots, inv_n, overlap)
        store_row(rc, ctx.tensors.dx, here, n, rows, dx_values(rstd, g, xhat, c1, c2))
        parity = 1 - parity


def rows_two_pass(ctx: BackwardRows):
    """Rows longer than the registers hold: each is read twice, segment by segment (the second time from L2)."""
    cfg, flags, pos = ctx.cfg, ctx.flags, ctx.pos
    rc = cfg.row
    inv_n = 1.0 / ctx.n.to(fx.Float32)
    parity = fx.Int32(0)
    for grp in range(ctx.group, ctx.row_groups, ctx.groups):  # the same trip count for the whole CTA (and cluster)
        here = row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        rstd, mu = row_stats(flags, ctx.tensors.mean, ctx.tensors.rstd, here.row, ctx.rows)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        dots = _first_pass_segments(ctx, here, rstd, mu, dots)
        c1, c2, _ = row_constants(rc, flags, here, ctx.smem, parity, dots, inv_n)
        _second_pass_segments(ctx, here, rstd, mu, c1, c2)
        parity = 1 - parity


def _first_pass(ctx: BackwardRows, pos, chunks, g, xhat, dys, dots, masks):
    """Adds the chunks' terms to the column sums; returns ``dots`` plus their ``sum(g * xhat)`` (and ``sum(g)``).
    ``masks``: the chunks' in-range masks; the padding is left out of ``sum(g * xhat)`` (its xhat, ``-mean * rstd``,
    may overflow where a row's mean is huge, and 0 * inf is NaN; its column sums are never stored)."""
    cfg = ctx.cfg
    if fx.const_expr(cfg.sums > 0):
        terms = [[a * h for a, h in zip(dys, xhat, strict=True)], dys]
        _column_sums_add(ctx, pos, chunks, terms[: cfg.sums])
    part = [masked_sum(cfg.row, [a * h for a, h in zip(g, xhat, strict=True)], masks)]
    if fx.const_expr(not ctx.flags.rms):
        part.append(thread_reduce(g))
    return [a + b for a, b in zip(dots, part, strict=True)]


def _segment(cfg, seg):
    return tuple(seg * cfg.segment + k for k in range(cfg.segment))


def _first_pass_segments(ctx: BackwardRows, pos, rstd, mu, dots):
    """The first pass over a row too long for registers: a dynamic loop over segments, so that the compiler does
    not hoist every segment's loads (and their registers)."""
    cfg = ctx.cfg
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, dys = _load_terms(ctx, pos, rstd, mu, chunks)
        masks = row_masks(cfg.row, pos, ctx.n, ctx.rows, chunks)
        dots = _first_pass(ctx, pos, chunks, g, xhat, dys, dots, masks)
    return dots


def _second_pass_segments(ctx: BackwardRows, pos, rstd, mu, c1, c2):
    """dx of a row too long for registers: it is read again, segment by segment (from L2, just read)."""
    cfg = ctx.cfg
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, _ = _load_terms(ctx, pos, rstd, mu, chunks)
        store_row(cfg.row, ctx.tensors.dx, pos, ctx.n, ctx.rows, dx_values(rstd, g, xhat, c1, c2), chunks=chunks)


def _load_terms(ctx: BackwardRows, pos, rstd, mu, chunks):
    """``(dy * weight, xhat, dy)`` of this thread's ``chunks`` of row ``pos.row``."""
    rc = ctx.cfg.row
    dys, _ = load_row(rc, ctx.tensors.dy, pos, ctx.n, ctx.rows, chunks=chunks)
    xs, _ = load_row(rc, ctx.tensors.x, pos, ctx.n, ctx.rows, chunks=chunks)
    return _terms(ctx, pos, rstd, mu, chunks, dys, xs)


def _terms(ctx: BackwardRows, pos, rstd, mu, chunks, dys, xs):
    """``(dy * weight, xhat, dy)`` from the loaded ``dys`` and ``xs`` of ``chunks``."""
    # No mask here: past N dy is loaded as 0 and the padding's column sums are never stored; its sum(g * xhat) term
    # is masked per chunk in _first_pass. Past the last row rstd and the mean are 0 (_prefetch, rows_two_pass).
    if fx.const_expr(ctx.flags.rms):
        xhat = [v * rstd for v in xs]
    else:
        xhat = [(v - mu) * rstd for v in xs]
    g = dys
    if fx.const_expr(ctx.flags.weight):
        ws = []
        for j in chunks:
            ws += load_vector_chunk(ctx.cfg.row, ctx.tensors.weight, pos, ctx.n, j)
        g = [a * w for a, w in zip(dys, ws, strict=True)]
    return g, xhat, dys


def write_partial(ctx: BackwardRows):
    """The CTA's row slots of column sums, added in a fixed order, into its partial row (a direct config: into
    dweight and dbias, the sums being final)."""
    cfg, pos = ctx.cfg, ctx.pos
    rc = cfg.row
    for s in fx.range_constexpr(cfg.sums):
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                total = [fx.Float32(0.0)] * 4
                for slot in fx.range_constexpr(rc.rows_per_cta):
                    view = fx.local_tile(ctx.sums_smem, (4,), (sum_index(cfg, pos, s, slot, j, q),))
                    total = [a + b for a, b in zip(total, load4(view), strict=True)]
                if fx.const_expr(cfg.direct):
                    target = ctx.tensors.dweight if s == 0 else ctx.tensors.dbias
                    ctx.partial_row.store_final(target, j, q, total)
                else:
                    ctx.partial_row.store(s, j, q, total)
