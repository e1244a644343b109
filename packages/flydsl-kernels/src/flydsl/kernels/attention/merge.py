"""The splits of a paged-decode context merged without a second kernel: each CTA of a split context has written its
split's normalized output and (row maximum in base 2, sum) as float32 partials; the one that counts itself last on
a per-(sequence, KV head, row tile) arrival counter merges them into the output and zeroes the counter. Past
``MERGE_FANIN`` splits the merge takes two levels (groups of splits first), so that no CTA reads more than
``MERGE_FANIN`` partials per row (docs/tuning/attention.md#merge). Called from
:func:`flydsl.kernels.attention.decode.paged_decode_kernel`.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import arith, gpu, nvvm, vector
from flydsl.expr.vector import Vector

__all__ = ["MERGE_FANIN", "NO_MAX", "merge_if_last"]

NO_MAX = -1.0e30  # a running maximum before any key: finite, so that exp2(NO_MAX - NO_MAX) is 1, not NaN
MERGE_FANIN = 16  # partials one CTA merges per row at most (two levels of merging past that)
_MERGE_UNROLL = 8  # partials of every row in flight at a time


def _arrive_last(counters, index, members, tid, arrival):
    """Counts this CTA on ``counters[index]``; True in every thread of the one that counts ``members``-th (which
    zeroes the counter for the next launch). The barriers order the CTA's writes before the count (release) and the
    reads of the others' writes after it (acquire)."""
    gpu.barrier()
    if tid == 0:
        arrival[0] = nvvm.atom_add_acq_rel(counters, 1, index)
    gpu.barrier()
    last = arrival[0] == members - 1
    if last & (tid == 0):
        counters[index] = 0
    return last


def merge_if_last(cfg, out, partial_out, partial_stats, counters, v_scales, place, tid, span):
    """The split that counts itself last on its (b, KV head, row tile) merges the splits' partials into ``out``: no
    second kernel, no host synchronisation. With ``cfg.merge_levels == 2`` the splits come in groups of
    ``MERGE_FANIN``: the last of each group merges the group into a partial of its own (slot ``splits + group``), and
    the last group to do so merges the groups, so that no CTA reads more than ``MERGE_FANIN`` partials per row."""
    b, _hkv, _tile, split = place
    context, first, split_tokens = span
    used = arith.maximum((context - first + (split_tokens - 1)) // split_tokens, 1)  # splits holding positions
    splits = gpu.grid_dim.x.to(fx.Int32)
    unit = b * gpu.grid_dim.y.to(fx.Int32) + gpu.block_idx.y  # this (b, KV head, row tile)
    smem = fx.SmemAllocator()
    arrival = smem.allocate(fx.Int32, 1)
    if fx.const_expr(cfg.merge_levels == 1):
        if _arrive_last(counters, unit, splits, tid, arrival):
            _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, (0, used, None))
    else:
        groups = (splits + (MERGE_FANIN - 1)) // MERGE_FANIN
        group = split // MERGE_FANIN
        members = arith.minimum(splits - group * MERGE_FANIN, MERGE_FANIN)
        units = gpu.grid_dim.z.to(fx.Int32) * gpu.grid_dim.y.to(fx.Int32)
        if _arrive_last(counters, units + unit * groups + group, members, tid, arrival):
            start = group * MERGE_FANIN
            count = arith.minimum(used - start, members)  # may be <= 0: a group past the context
            _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, (start, count, splits + group))
            if _arrive_last(counters, unit, groups, tid, arrival):
                used_groups = (used + (MERGE_FANIN - 1)) // MERGE_FANIN
                _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, (splits, used_groups, None))


def _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, slots):
    """Partials ``[first, first + count)`` merged, for rows ``warp, warp + warps, ...`` of the row tile, all of a
    warp's rows at once: the normalized outputs weighted by ``2^(max - top) * sum``. Lanes take the slots' maxima in
    turn (``top``), then ``D / 32`` values each over the slots with their weights and the weights' sum,
    ``_MERGE_UNROLL`` slots of every row in flight at a time (read through L2: other SMs wrote them). ``into``: None
    writes ``out``; a slot index writes the merge there as a partial of its own (normalized output, ``(top,
    sum)``), zeros and ``(NO_MAX, 0)`` where ``count`` <= 0."""
    b, hkv, tile, _split = place
    first, count, into = slots
    end = first + count
    warp, lane = tid // 32, tid % 32
    per_lane = cfg.head_dim // 32
    load_bytes = min(16, per_lane * 4)
    v_factor = fx.Float32(1.0)
    if fx.const_expr(cfg.v_scale == "tensor"):
        v_factor = v_scales[0]
    rows = []  # (query, head, whether the row exists); a missing row reads the tile's last and stores nothing
    for i in fx.range_constexpr(-(-min(16, cfg.rows) // cfg.warps)):
        local = warp + cfg.warps * i
        global_row = arith.minimum(tile * 16 + local, cfg.rows - 1)
        exists = (tile * 16 + local < cfg.rows) & (local < 16)
        rows.append((global_row // cfg.group, hkv * cfg.group + global_row % cfg.group, exists))
    tops = [fx.Float32(NO_MAX)] * len(rows)
    for s in range(first + lane, end, 32):
        maxima = []
        for r in fx.range_constexpr(len(rows)):
            maxima.append(arith.maximum(tops[r], _stats(partial_stats, (b, rows[r][0], rows[r][1], s))[0]))
        tops = maxima
    tops = [gpu.warp_reduce(t, "max") for t in tops]
    totals = [fx.Float32(0.0)] * len(rows)  # summed with the values: no second round of statistics
    accs = [[fx.Float32(0.0)] * per_lane for _ in rows]
    for first_split in range(first, end, _MERGE_UNROLL):
        loaded = []
        for u in fx.range_constexpr(_MERGE_UNROLL):
            s = arith.minimum(first_split + u, end - 1)
            for query, head, _e in rows:
                m, row_sum = _stats(partial_stats, (b, query, head, s))
                words = []
                for j in fx.range_constexpr(max(1, per_lane * 4 // 16)):
                    col = lane * per_lane + j * (load_bytes // 4)
                    chunk = nvvm.ld_global(partial_out, (b, query, head, s, col), load_bytes, cop="cg")
                    words += [chunk[k] for k in range(load_bytes // 4)]
                loaded.append((first_split + u < end, m, row_sum, words))
        new_accs, new_totals = [], []  # rebuilt, not assigned into: the loop carries what is rebound
        for r in fx.range_constexpr(len(rows)):
            acc, total = accs[r], totals[r]
            for u in fx.range_constexpr(_MERGE_UNROLL):
                inside, m, row_sum, words = loaded[u * len(rows) + r]
                weight = arith.select(inside, nvvm.ex2_approx(m - tops[r], ftz=True) * row_sum, fx.Float32(0.0))
                values = [arith.bitcast(fx.Float32.mlir_type(), w) for w in words]
                acc = [a + v * weight for a, v in zip(acc, values, strict=True)]
                total = total + weight
            new_accs.append(acc)
            new_totals.append(total)
        accs, totals = new_accs, new_totals
    for r, (query, head, exists) in enumerate(rows):
        if fx.const_expr(into is None):
            factor = v_factor / totals[r]
            if exists:
                merged = vector.from_elements(Vector.of(fx.Float32, per_lane), [a * factor for a in accs[r]])
                vector.store(merged.to(out.dtype), out, (b, query, head, lane * per_lane))
        else:
            factor = arith.select(totals[r] > 0.0, 1.0 / totals[r], fx.Float32(0.0))
            if exists:
                merged = vector.from_elements(Vector.of(fx.Float32, per_lane), [a * factor for a in accs[r]])
                vector.store(merged, partial_out, (b, query, head, into, lane * per_lane))
                if lane == 0:
                    partial_stats[b, query, head, into, 0] = tops[r]
                    partial_stats[b, query, head, into, 1] = totals[r]


def _stats(partial_stats, coord):
    """A split's (row maximum, sum) as two Float32, read through L2."""
    pair = nvvm.ld_global(partial_stats, (*coord, 0), 8, cop="cg")
    return arith.bitcast(fx.Float32.mlir_type(), pair[0]), arith.bitcast(fx.Float32.mlir_type(), pair[1])
