"""The splits of a paged-decode context merged without a second kernel: each CTA of a split context has written its
split's normalized output and (row maximum in base 2, sum) as float32 partials; the one that counts itself last on
a per-(sequence, KV head, row tile) arrival counter merges them into the output and zeroes the counter. Past
``MERGE_FANIN`` splits the merge takes two levels (groups of splits first), so that no CTA reads more than
``MERGE_FANIN`` partials per row (docs/tuning/attention.md#merge).

With the splits in clusters (:func:`merge_cluster`), a cluster's CTAs leave their partials in shared memory and
merge them through distributed shared memory after one cluster barrier, each CTA a share of the rows' values: no
global round trips where a cluster holds the whole context, and one level of the merge above otherwise. Called
from :func:`flydsl.kernels.attention.decode.paged_decode_kernel`.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import arith, cluster, gpu, nvvm, vector
from flydsl.expr.vector import Vector

__all__ = ["MAX_CLUSTER", "MERGE_FANIN", "NO_MAX", "merge_cluster", "merge_if_last"]

NO_MAX = -1.0e30  # a running maximum before any key: finite, so that exp2(NO_MAX - NO_MAX) is 1, not NaN
MERGE_FANIN = 16  # partials one CTA merges per row at most (two levels of merging past that)
_MERGE_UNROLL = 8  # partials of every row in flight at a time
MAX_CLUSTER = 8  # CTAs of a cluster (the portable limit)


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


def merge_cluster(cfg, out, partials, merged, v_scales, place, tid, span):
    """The CTAs of a cluster (``cfg.cluster`` consecutive splits) merge the partials they left in shared memory
    (``merged``: values (16, D) and (max, sum) per row): after a cluster barrier, CTA ``rank`` takes items ``rank *
    threads + tid, ...`` of (row, 4 values), reads the cluster's partials of them through DSMEM (all at once) and
    writes the output (``cfg.merge_levels == 0``: the cluster holds the context) or the cluster's partial in slot
    ``split // cluster``, which the last CTA of the (sequence, KV head, row tile) to count itself merges
    (``partials``: ``(partial_out, partial_stats, counters)``)."""
    partial_out, partial_stats, counters = partials
    values, stats = merged
    b, hkv, tile, split = place
    size, d = cfg.cluster, cfg.head_dim
    rank = cluster.block_rank()
    cluster.sync()  # every CTA's partial is in its shared memory
    items = min(16, cfg.rows) * (d // 4)
    v_factor = fx.Float32(1.0)
    if fx.const_expr(cfg.v_scale == "tensor" and cfg.merge_levels == 0):
        v_factor = v_scales[0]
    for rep in fx.range_constexpr(-(-items // (size * cfg.threads))):
        index = rep * size * cfg.threads + rank * cfg.threads + tid
        item = arith.minimum(index, items - 1)
        r, part = item // (d // 4), item % (d // 4)
        maxima = [cluster.load_peer(stats, peer, (r, 0)) for peer in range(size)]
        sums = [cluster.load_peer(stats, peer, (r, 1)) for peer in range(size)]
        loaded = [[cluster.load_peer(values, peer, (r, 4 * part + k)) for k in range(4)] for peer in range(size)]
        top = maxima[0]
        for m in maxima[1:]:
            top = arith.maximum(top, m)
        acc, total = [fx.Float32(0.0)] * 4, fx.Float32(0.0)
        for peer in fx.range_constexpr(size):
            weight = nvvm.ex2_approx(maxima[peer] - top, ftz=True) * sums[peer]
            acc = [a + weight * v for a, v in zip(acc, loaded[peer], strict=True)]
            total = total + weight
        global_row = tile * 16 + r
        query, head = global_row // cfg.group, hkv * cfg.group + global_row % cfg.group
        keep = (index < items) & (global_row < cfg.rows)
        if fx.const_expr(cfg.merge_levels == 0):
            factor = v_factor / total
            if keep:
                row_values = vector.from_elements(Vector.of(fx.Float32, 4), [a * factor for a in acc])
                vector.store(row_values.to(out.dtype), out, (b, query, head, 4 * part))
        else:
            factor = arith.select(total > 0.0, 1.0 / total, fx.Float32(0.0))  # a cluster past the context: zeros
            slot = split // size
            if keep:
                row_values = vector.from_elements(Vector.of(fx.Float32, 4), [a * factor for a in acc])
                vector.store(row_values, partial_out, (b, query, head, slot, 4 * part))
                if part == 0:
                    partial_stats[b, query, head, slot, 0] = top
                    partial_stats[b, query, head, slot, 1] = total
    cluster.sync()  # no CTA leaves (its shared memory) while a peer may still read it
    if fx.const_expr(cfg.merge_levels == 1):
        context, first, split_tokens = span
        used = arith.maximum((context - first + (split_tokens * size - 1)) // (split_tokens * size), 1)
        unit = b * gpu.grid_dim.y.to(fx.Int32) + gpu.block_idx.y
        arrival = fx.SmemAllocator().allocate(fx.Int32, 1)
        if _arrive_last(counters, unit, gpu.grid_dim.x.to(fx.Int32), tid, arrival):
            _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, (0, used, None))


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
