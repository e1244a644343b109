"""A row kernel's reductions, device side: a thread's values combined (:func:`thread_reduce`, :func:`masked_sum`),
then over the row's threads, warps and CTAs (:func:`row_reduce`: shuffles, one value per warp through shared memory,
the peers' partials through distributed shared memory in a cluster), and Chan's merge of ``(count, sum, M2)``
moments (:func:`moments_merge`) for LayerNorm's looped statistics."""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.expr import arith, cluster, gpu, nvvm
from flydsl.kernels.rows.layout import RowConfig

__all__ = ["RowSmem", "row_smem", "thread_reduce", "masked", "masked_sum", "moments_merge", "row_reduce", "row_done"]


class RowSmem(NamedTuple):
    """Shared memory of a kernel's row reductions (:func:`row_smem`)."""

    scratch: object  # one value per warp of each row, reduction and value (None with one warp per row)
    partials: object  # the CTA's partial per reduction and value, read by its peers (None without a cluster)
    values: int  # values reduced together by one row_reduce


def row_smem(cfg: RowConfig, phases: int, values: int = 1):
    """Shared memory for ``phases`` row reductions (each its own slots: no barrier needed to reuse them) of
    ``values`` values each (:func:`row_reduce` of a list reduces them together, through one barrier)."""
    smem = fx.SmemAllocator()
    scratch = None
    if cfg.warps_per_row > 1:
        scratch = smem.allocate(fx.Float32, phases * cfg.rows_per_cta * values * cfg.warps_per_row)
    partials = smem.allocate(fx.Float32, phases * values) if cfg.cluster > 1 else None
    return RowSmem(scratch=scratch, partials=partials, values=values)


def masked(values, masks, other=0.0):
    """``values`` where ``masks`` hold, else ``other``."""
    return [arith.select(m, v, fx.Float32(other)) for v, m in zip(values, masks, strict=True)]


def masked_sum(cfg: RowConfig, values, masks):
    """The sum of this thread's ``values`` where ``masks`` hold (``thread_reduce(masked(values, masks))``), with one
    select per chunk's partial sum when the masks are per chunk (``cfg.even``) instead of one per element."""
    if fx.const_expr(not cfg.even):
        return thread_reduce(masked(values, masks))
    step = cfg.vec
    parts = [thread_reduce(values[i : i + step]) for i in range(0, len(values), step)]
    return thread_reduce(masked(parts, masks[::step]))


def _combine(a, b, op: str):
    if op == "max":
        return arith.maximum(a, b)
    return a + b


def thread_reduce(values, op: str = "add"):
    """The values combined as a balanced tree (short dependency chains)."""
    values = list(values)
    while len(values) > 1:
        paired = [_combine(values[k], values[k + 1], op) for k in range(0, len(values) - 1, 2)]
        values = paired + ([values[-1]] if len(values) % 2 else [])
    return values[0]


def _write_slots(buffer, start, stride, values) -> None:
    for i, v in enumerate(values):
        buffer[start + i * stride] = v


def moments_merge(a, b):
    """Two ``(count, sum, M2)`` triples of Float32 (``M2``: the sum of squared deviations from their mean) as one,
    by Chan, Golub and LeVeque's update ``M2 = M2_a + M2_b + d^2 n_a n_b / n``, ``d = mean_b - mean_a``: every term
    non-negative (no cancellation, unlike ``E[x^2] - mean^2``). Sums, not means, are carried: the row's mean is then
    one tree sum divided once (merged means would round at every level). A triple of count 0 adds nothing. A
    :func:`row_reduce` ``op``."""
    na, sa, qa = a
    nb, sb, qb = b
    n = na + nb
    one = fx.Float32(1.0)
    d = sb * nvvm.rcp_approx(arith.maximum(nb, one)) - sa * nvvm.rcp_approx(arith.maximum(na, one))
    return n, sa + sb, qa + qb + d * d * (na * nb * nvvm.rcp_approx(arith.maximum(n, one)))


def _reduce_lanes(values, op, width: int, final: bool) -> list:
    """``values`` reduced over groups of ``width`` lanes: each on its own (``op`` a name), or as one tuple (``op`` a
    function), of which every lane of the group takes its first lane's at the ``final`` step (so that every thread
    of a row sees the same statistics, whatever op's rounding for its two argument orders)."""
    if not callable(op):
        return [gpu.warp_reduce(v, op, width=width) for v in values]
    merged = list(gpu.warp_reduce(tuple(values), op, width=width))
    return [gpu.shuffle_idx(v, 0, width) for v in merged] if final else merged


def row_reduce(cfg: RowConfig, pos, smem, phase, value, op="add", last: bool = False, overlap=None):
    """``value`` (one Float32 per thread) combined over every thread of the row (``op``: ``"add"`` or ``"max"``);
    every thread gets the result. ``value`` may be a list of up to ``smem.values`` Float32s: reduced together
    (one barrier, one cluster barrier), the results as a list; with ``op`` a function of two such tuples (e.g.
    :func:`moments_merge`), combined as one tuple (rows in one CTA). ``phase``: which of :func:`row_smem`'s slots this
    reduction uses (each reduction of a kernel its own; may be a kernel integer, e.g. a row loop's parity, so that
    consecutive reductions alternate between two slots). ``last``: the kernel's last reduction (the cluster's final
    barrier starts here and ends in :func:`row_done`). ``overlap``: a function of no arguments for work that does not
    depend on the result (e.g. the next row's loads); in a cluster it runs between the barrier's arrive and wait,
    after the arrive's release (which waits for this thread's earlier memory accesses), so that its loads are in
    flight during the wait. With ``overlap``, returns ``(result, what overlap returned)``."""
    many = isinstance(value, (list, tuple))
    values = list(value) if many else [value]
    if len(values) > smem.values:
        raise ValueError(f"row_reduce: {len(values)} values, but row_smem was sized for {smem.values}")
    width = len(values)
    if callable(op) and cfg.cluster > 1:
        raise ValueError("row_reduce: a combine function reduces rows in one CTA, not a cluster's")
    values = _reduce_lanes(values, op, min(32, cfg.threads_per_row), cfg.warps_per_row == 1)
    if fx.const_expr(cfg.warps_per_row > 1):
        lane32 = pos.tid % 32
        warp_in_row = pos.lane // 32
        base = (phase * cfg.rows_per_cta + pos.row_in_cta) * smem.values
        if lane32 == 0:
            _write_slots(smem.scratch, base * cfg.warps_per_row + warp_in_row, cfg.warps_per_row, values)
        gpu.barrier()
        slot = lane32 % cfg.warps_per_row
        partials = [smem.scratch[(base + i) * cfg.warps_per_row + slot] for i in range(width)]
        values = _reduce_lanes(partials, op, cfg.warps_per_row, True)
    if fx.const_expr(cfg.cluster > 1):
        if pos.tid == 0:
            _write_slots(smem.partials, phase * smem.values, 1, values)
        cluster.arrive()  # with release: this CTA's partial is visible cluster-wide once all have arrived
        if fx.const_expr(overlap is not None):
            extra = overlap()
        cluster.wait()
        peer = (pos.tid % 32) % cfg.cluster
        values = [
            gpu.warp_reduce(
                cluster.load_peer(smem.partials, peer, coord=phase * smem.values + i), op, width=cfg.cluster
            )
            for i in range(width)
        ]
        if fx.const_expr(last):
            cluster.arrive(relaxed=True)  # done reading peers; row_done waits before exit
    elif fx.const_expr(overlap is not None):
        extra = overlap()
    result = values if many else values[0]
    return (result, extra) if overlap is not None else result


def row_done(cfg: RowConfig) -> None:
    """Ends a kernel that used :func:`row_reduce`: in a cluster, no CTA exits while a peer may read its partials."""
    if fx.const_expr(cfg.cluster > 1):
        cluster.wait()
