"""The splits of a paged-decode context merged: each CTA of a split context has written its split's normalized output
and (row maximum in base 2, sum) as float32 partials, which one of two things merges into the output
(docs/tuning/attention.md#merge):

* up to ``MERGE_FANIN`` splits, the split that counts itself last on a per-(sequence, KV head, row tile) arrival
  counter (:func:`merge_if_last`, called from :func:`flydsl.kernels.attention.decode.paged_decode_kernel`): no
  second kernel;
* past that, :func:`merge_splits_kernel`, launched after the decode kernel as a programmatic dependent launch: a CTA
  per output row, started while the decode kernel runs, its warps sharing the row's partials.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, gpu, nvvm, vector
from flydsl.expr.vector import Vector

__all__ = ["MERGE_FANIN", "NO_MAX", "merge_if_last", "merge_splits_kernel", "merge_warps"]

NO_MAX = -1.0e30  # a running maximum before any key: finite, so that exp2(NO_MAX - NO_MAX) is 1, not NaN
MERGE_FANIN = 16  # splits the last one merges at most; more go to merge_splits_kernel
MERGE_UNROLL = 8  # partials of a row a warp has in flight at a time
MERGE_MAX_WARPS = 16


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
    second kernel, no host synchronisation."""
    b = place[0]
    context, first, split_tokens = span
    used = arith.maximum((context - first + (split_tokens - 1)) // split_tokens, 1)  # splits holding positions
    unit = b * gpu.grid_dim.y.to(fx.Int32) + gpu.block_idx.y  # this (b, KV head, row tile)
    arrival = fx.SmemAllocator().allocate(fx.Int32, 1)
    if _arrive_last(counters, unit, gpu.grid_dim.x.to(fx.Int32), tid, arrival):
        _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, used)


def _merge_rows(cfg, out, partial_out, partial_stats, v_scales, place, tid, end):
    """Partials ``[0, end)`` merged into ``out``, for rows ``warp, warp + warps, ...`` of the row tile, all of a
    warp's rows at once: the normalized outputs weighted by ``2^(max - top) * sum``. Lanes take the slots' maxima in
    turn (``top``), then ``D / 32`` values each over the slots with their weights and the weights' sum,
    ``MERGE_UNROLL`` slots of every row in flight at a time (read through L2: other SMs wrote them)."""
    b, hkv, tile, _split = place
    warp, lane = tid // 32, tid % 32
    per_lane = cfg.head_dim // 32
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
    for s in range(lane, end, 32):
        maxima = []
        for r in fx.range_constexpr(len(rows)):
            maxima.append(arith.maximum(tops[r], _stats(partial_stats, (b, rows[r][0], rows[r][1], s))[0]))
        tops = maxima
    tops = [gpu.warp_reduce(t, "max") for t in tops]
    totals = [fx.Float32(0.0)] * len(rows)  # summed with the values: no second round of statistics
    accs = [[fx.Float32(0.0)] * per_lane for _ in rows]
    for first_split in range(0, end, MERGE_UNROLL):
        loaded = []
        for u in fx.range_constexpr(MERGE_UNROLL):
            s = arith.minimum(first_split + u, end - 1)
            for query, head, _e in rows:
                m, row_sum, words = _partial(partial_out, partial_stats, (b, query, head, s), lane, per_lane)
                loaded.append((first_split + u < end, m, row_sum, words))
        new_accs, new_totals = [], []  # rebuilt, not assigned into: the loop carries what is rebound
        for r in fx.range_constexpr(len(rows)):
            acc, total = accs[r], totals[r]
            for u in fx.range_constexpr(MERGE_UNROLL):
                inside, m, row_sum, words = loaded[u * len(rows) + r]
                weight = arith.select(inside, nvvm.ex2_approx(m - tops[r], ftz=True) * row_sum, fx.Float32(0.0))
                values = [arith.bitcast(fx.Float32.mlir_type(), w) for w in words]
                acc = [a + v * weight for a, v in zip(acc, values, strict=True)]
                total = total + weight
            new_accs.append(acc)
            new_totals.append(total)
        accs, totals = new_accs, new_totals
    for r, (query, head, exists) in enumerate(rows):
        factor = v_factor / totals[r]
        if exists:
            merged = vector.from_elements(Vector.of(fx.Float32, per_lane), [a * factor for a in accs[r]])
            vector.store(merged.to(out.dtype), out, (b, query, head, lane * per_lane))


def _stats(partial_stats, coord):
    """A split's (row maximum, sum) as two Float32, read through L2."""
    pair = nvvm.ld_global(partial_stats, (*coord, 0), 8, cop="cg")
    return arith.bitcast(fx.Float32.mlir_type(), pair[0]), arith.bitcast(fx.Float32.mlir_type(), pair[1])


def _partial(partial_out, partial_stats, coord, lane, per_lane):
    """A split's partial of a row at ``coord`` (b, query, head, split): its (maximum, sum) and this lane's
    ``per_lane`` values (from ``lane * per_lane``) as Int32 words, 16 bytes (8 for D = 64) a load, through L2."""
    m, row_sum = _stats(partial_stats, coord)
    load_bytes = min(16, per_lane * 4)
    words = []
    for j in fx.range_constexpr(max(1, per_lane * 4 // 16)):
        chunk = nvvm.ld_global(partial_out, (*coord, lane * per_lane + j * (load_bytes // 4)), load_bytes, cop="cg")
        words += [chunk[k] for k in range(load_bytes // 4)]
    return m, row_sum, words


# --- the merge as a dependent kernel ----------------------------------------------------------------------------


def merge_warps(head_dim: int, splits: int) -> int:
    """Warps of a :func:`merge_splits_kernel` CTA: enough for one value of a row per thread and, up to 16, for one
    round of ``MERGE_UNROLL`` partials per warp."""
    return min(MERGE_MAX_WARPS, max(head_dim // 32, -(-splits // MERGE_UNROLL)))


@flyc.kernel(dependent_launch=True)
def merge_splits_kernel(
    partial_out: fx.Tensor,
    partial_stats: fx.Tensor,
    out: fx.Tensor,
    v_scales: fx.Tensor,
    head_dim: fx.Constexpr[int],
    warps: fx.Constexpr[int],
    tensor_scale: fx.Constexpr[bool],
):
    """One CTA per output row ``(b, query, head)`` (grid ``B * Q * Hq``, ``32 * warps`` threads): the splits'
    partials of the row (``partial_out`` (B, Q, Hq, splits, D) normalized outputs, ``partial_stats`` (max in base 2,
    sum)) merged into ``out`` (B, Q, Hq, D), times ``v_scales[0]`` with ``tensor_scale``. Launched right after the
    decode kernel as a programmatic dependent launch: its CTAs start while the decode kernel runs (which lets them
    launch at its start) and wait for its partials in ``griddepcontrol.wait``. Warp ``w`` merges partials ``w, w +
    warps, ...`` online, ``MERGE_UNROLL`` at a time (stats and values in one round trip); the warps' merges meet in
    shared memory."""
    flyc.set_kernel_attributes(threads=32 * warps)
    queries, heads, splits = (partial_out.shape[i].to(fx.Int32) for i in (1, 2, 3))
    row = gpu.block_idx.x
    b, query, head = row // (queries * heads), row // heads % queries, row % heads
    tid = gpu.thread_idx.x
    warp, lane = tid // 32, tid % 32
    per_lane = head_dim // 32
    v_factor = fx.Float32(1.0)
    if fx.const_expr(tensor_scale):
        v_factor = v_scales[0]  # not written by the decode kernel: read before the wait
    nvvm.griddepcontrol_wait()
    top, total, acc = fx.Float32(NO_MAX), fx.Float32(0.0), [fx.Float32(0.0)] * per_lane
    stride = warps * MERGE_UNROLL
    for first in range(warp, splits, stride):
        loaded = []
        for u in fx.range_constexpr(MERGE_UNROLL):
            s = first + u * warps
            inside = s < splits
            s = arith.minimum(s, splits - 1)
            m, row_sum, words = _partial(partial_out, partial_stats, (b, query, head, s), lane, per_lane)
            loaded.append((inside, arith.select(inside, m, fx.Float32(NO_MAX)), row_sum, words))
        new_top = top
        for _inside, m, _sum, _words in loaded:
            new_top = arith.maximum(new_top, m)
        rescale = nvvm.ex2_approx(top - new_top, ftz=True)
        acc = [a * rescale for a in acc]
        total = total * rescale
        for inside, m, row_sum, words in loaded:
            weight = arith.select(inside, nvvm.ex2_approx(m - new_top, ftz=True) * row_sum, fx.Float32(0.0))
            acc = [a + weight * arith.bitcast(fx.Float32.mlir_type(), w) for a, w in zip(acc, words, strict=True)]
            total = total + weight
        top = new_top
    smem = fx.SmemAllocator()
    values = smem.allocate(fx.Float32, fl.Layout((warps, head_dim), (head_dim, 1)))
    stats = smem.allocate(fx.Float32, fl.Layout((warps, 2), (2, 1)))
    for k in fx.range_constexpr(per_lane):
        values[warp, lane * per_lane + k] = acc[k]
    if lane == 0:
        stats[warp, 0] = top
        stats[warp, 1] = total
    gpu.barrier()
    if tid < head_dim:  # thread t: value t of the row, over the warps' merges
        best = stats[0, 0]
        for w in fx.range_constexpr(1, warps):
            best = arith.maximum(best, stats[w, 0])
        value, weights = fx.Float32(0.0), fx.Float32(0.0)
        for w in fx.range_constexpr(warps):
            weight = nvvm.ex2_approx(stats[w, 0] - best, ftz=True)
            value = value + weight * values[w, tid]
            weights = weights + weight * stats[w, 1]
        out[b, query, head, tid] = (value * (v_factor / weights)).to(out.dtype)
