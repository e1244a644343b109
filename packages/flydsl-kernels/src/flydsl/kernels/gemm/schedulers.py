"""Tile schedulers: which output tiles, and which K steps of them, each worker (a CTA, or a cluster of CTAs) of a
persistent GEMM kernel computes.

Every scheduler answers the same small interface (:class:`TileScheduler`): worker ``worker`` of ``stride`` takes the
work units ``worker, worker + stride, ...`` below ``count``, and ``work(unit)`` is a :class:`WorkUnit`: this CTA's
output tile and the K steps ``[k_begin, k_end)`` it multiplies. The dense GEMM's three schedulers:

* :class:`GroupedTiles`: every tile whole, in a grouped order (``group_m`` tile rows at a time, so that tiles running
  together share rows of A and columns of B in L2: ``fx.TileScheduler``'s order, over cluster tiles);
* :class:`SplitKTiles`: tiles before ``split_from`` whole, each later one as ``split_k`` units of a K part each
  (:func:`split_plan`);
* :class:`StreamKTiles`: whole tiles for all waves but the last one or two, whose K steps are then shared out evenly
  over the workers as ``segments`` (see the class).

The grouped GEMM of a mixture of experts has :class:`ExpertTiles`: row blocks of one expert each, as many as the
routing (on the GPU) says.

A scheduler's methods hold no control flow (they are called from kernels as they are: only plain functions are
traced with their ``if``/``for`` rewritten), so each implements ``worker``, ``stride``, ``count`` and ``work`` with
selects and plain arithmetic. These do it through
:func:`select`, :func:`minimum`, :func:`maximum` and :func:`cast`, which build ``arith`` ops on kernel integers
and compute on Python ints: given an order of Python ints, a scheduler runs on the host, which is how the tests
check that the units of every worker cover each tile's K steps exactly once.

Host-side, the same plans in Python ints: :func:`cluster_tiles`, :func:`split_plan` (also traced in kernels: operators
only) and :func:`stream_k_steps`, which the configuration's cost model and the launch plan use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import flydsl.expr as fx
from flydsl.expr import arith

if TYPE_CHECKING:
    from flydsl.kernels.gemm.config import GemmConfig

__all__ = [
    "ExpertTiles",
    "GroupedTiles",
    "SplitKTiles",
    "StreamKTiles",
    "TileScheduler",
    "WorkUnit",
    "cluster_tiles",
    "dense_scheduler",
    "expert_scheduler",
    "maximum",
    "minimum",
    "select",
    "split_plan",
    "stream_k_steps",
    "cast",
]


def _traced(*values) -> bool:
    return any(isinstance(value, fx.Numeric) for value in values)


def select(condition, true_value, false_value):
    """``arith.select`` on kernel values, ``true_value if condition else false_value`` on Python ones."""
    if _traced(condition, true_value, false_value):
        return arith.select(condition, true_value, false_value)
    return true_value if condition else false_value


def minimum(a, b):
    return arith.minimum(a, b) if _traced(a, b) else min(a, b)


def maximum(a, b):
    return arith.maximum(a, b) if _traced(a, b) else max(a, b)


def cast(value, kind):
    """``value.to(kind)`` for a kernel integer (``kind``: ``fx.Int64``, ``fx.Int32``); a Python int as it is."""
    return value.to(kind) if _traced(value) else value


class WorkUnit(NamedTuple):
    """One unit of a GEMM's work: output tile (``tile_m``, ``tile_n``) of this CTA (in tiles of the configuration's
    ``tile_m`` x ``tile_n``) and its K steps ``[k_begin, k_end)`` (in steps of ``tile_k``); ``b_row0``: the first
    row of B's (N, K) view that its tile column 0 reads (a grouped GEMM's B stacks every group's weights: the
    tile's group's first row; 0 otherwise). Kernel integers, or Python ints where they are known when traced."""

    tile_m: object
    tile_n: object
    k_begin: object
    k_end: object
    b_row0: object = 0


class TileScheduler(Protocol):
    """What a persistent GEMM kernel's warp roles ask of a scheduler: worker ``worker`` (of ``stride`` workers) takes
    units ``worker, worker + stride, ...`` below ``count``; ``work(unit)`` is that unit's :class:`WorkUnit`. The
    producer and the consumers walk the same units in the same order (the pipeline's slots follow it)."""

    worker: object
    count: object

    @property
    def stride(self): ...

    def work(self, unit) -> WorkUnit: ...


class GroupedTiles:
    """Every output tile whole, in the grouped order of ``order`` (an ``fx.TileScheduler`` over cluster tiles: the CTAs
    of a cluster walk the same cluster tile, each then takes its tile of it, rank by rank along ``cluster_m`` or
    ``cluster_n``); units past ``split_from`` are K parts in :class:`SplitKTiles` (here there are none)."""

    def __init__(self, order: fx.TileScheduler, k_tiles, cfg: GemmConfig, rank):
        self.order, self.k_tiles, self.cfg, self.rank = order, k_tiles, cfg, rank
        self.split_from, self.units = split_plan(order.count, order.stride, cfg)  # tiles, then (tile, K part) pairs
        self.worker = order.first
        self.count = self.units

    @property
    def stride(self):
        """The workers (CTAs, or clusters): each takes every ``stride``-th unit."""
        return self.order.stride

    def cta_tile(self, cluster_tile_m, cluster_tile_n):
        """This CTA's (tile row, tile column) in a cluster tile: its cluster's CTAs take consecutive rows
        (``cluster_m``) or columns (``cluster_n``), in rank order."""
        cfg = self.cfg
        tm = cluster_tile_m * cfg.cluster_m + self.rank if cfg.cluster_m > 1 else cluster_tile_m
        tn = cluster_tile_n * cfg.cluster_n + self.rank if cfg.cluster_n > 1 else cluster_tile_n
        return tm, tn

    def work(self, unit) -> WorkUnit:
        ctm, ctn = self.order.coords(unit)
        return WorkUnit(*self.cta_tile(ctm, ctn), 0, self.k_tiles)


class SplitKTiles(GroupedTiles):
    """Tiles before ``split_from`` whole; from it on, each remaining tile is ``cfg.split_k`` units, one per part of its
    K steps (every tile, or with ``cfg.split_tail`` the tiles past the last full wave: :func:`split_plan`). A part
    may have no K steps (``k_begin == k_end``) where K is short."""

    def work(self, unit) -> WorkUnit:
        split, k_tiles, split_from = self.cfg.split_k, self.k_tiles, self.split_from
        part = unit - split_from  # (negative for whole tiles: selected away)
        is_part = unit >= split_from
        ctm, ctn = self.order.coords(select(is_part, split_from + part // split, unit))
        per_split = (k_tiles + (split - 1)) // split
        k_begin = select(is_part, (part % split) * per_split, 0)
        k_end = select(is_part, minimum(k_begin + per_split, k_tiles), k_tiles)
        return WorkUnit(*self.cta_tile(ctm, ctn), k_begin, maximum(k_end, k_begin))


class StreamKTiles(GroupedTiles):
    """Stream-K: the tiles past the last full wave but one (all of them when there are fewer tiles than workers)
    are cut into their K steps, and each worker takes an equal, contiguous range of those steps in tile order, so
    that every SM has the same work. ``count`` units are whole tiles; after them worker ``worker`` has ``segments``
    segments (``segment(i)``), the parts of consecutive stream-K tiles its range covers. The worker that has a tile's
    first K steps (it reaches them last, at the end of its range) finishes the tile from the others' fp32 partials
    (:func:`flydsl.kernels.gemm.partials.add_stream_k_partials`); each worker has at most one segment that is not a
    tile's first part, the first of its range. A finisher waits only for workers after it: no cycle, as long as
    every worker is resident (at most one CTA per SM, clusters of at most 2)."""

    def __init__(self, order: fx.TileScheduler, k_tiles, cfg: GemmConfig, rank):
        super().__init__(order, k_tiles, cfg, rank)
        units, workers = self.units, order.stride
        self.count = select(units % workers == 0, units, maximum(units // workers - 1, 0) * workers)
        self._steps = cast((units - self.count) * k_tiles, fx.Int64)
        self._workers64 = cast(workers, fx.Int64)
        first_step, end_step = self.step_begin(self.worker), self.step_begin(self.worker + 1)
        self.first_tile = first_step // k_tiles  # (among the stream-K tiles)
        self.segments = select(end_step > first_step, (end_step - 1) // k_tiles - self.first_tile + 1, 0)

    def step_begin(self, worker):
        """Worker ``worker``'s first stream-K step: it has steps ``[step_begin(w), step_begin(w + 1))`` (64-bit
        products: tiles x K steps may exceed 2^31 / workers)."""
        return cast(cast(worker, fx.Int64) * self._steps // self._workers64, fx.Int32)

    def segment(self, index):
        """(stream-K tile, its :class:`WorkUnit`) of this worker's ``index``-th segment."""
        tile = self.first_tile + index
        start = tile * self.k_tiles
        k_begin = maximum(self.step_begin(self.worker) - start, 0)
        k_end = minimum(self.step_begin(self.worker + 1) - start, self.k_tiles)
        return tile, WorkUnit(*self.cta_tile(*self.order.coords(self.count + tile)), k_begin, k_end)


class ExpertTiles(GroupedTiles):
    """The grouped GEMM of a mixture of experts: C's rows in blocks of ``tile_m * cluster_m`` (the padded blocks of
    ``flydsl.kernels.moe.align_tokens``: a cluster's tile rows share one expert, so its CTAs share B's tiles), block
    ``i`` multiplied by expert ``expert_of_block[i]``'s weights, which start at row ``expert * rows_per_expert`` of
    the stacked B. Only the blocks below ``padded_count`` (a kernel value read from memory: the routing stays on the
    GPU) are units, in the grouped order of ``order`` over cluster tiles (consecutive blocks mostly share an expert,
    so grouped rows share its weights in L2). Whole tiles; clusters along M only."""

    def __init__(self, order: fx.TileScheduler, k_tiles, cfg: GemmConfig, rank, expert_of_block, rows_per_expert):
        super().__init__(order, k_tiles, cfg, rank)
        self.expert_of_block, self.rows_per_expert = expert_of_block, rows_per_expert

    def work(self, unit) -> WorkUnit:
        ctm, ctn = self.order.coords(unit)
        expert = self.expert_of_block[ctm]
        return WorkUnit(*self.cta_tile(ctm, ctn), 0, self.k_tiles, cast(expert, fx.Int32) * self.rows_per_expert)


def expert_scheduler(blocks, n_extent, k_tiles, cfg: GemmConfig, rank, expert_of_block, rows_per_expert) -> ExpertTiles:
    """:class:`ExpertTiles` over ``blocks`` row blocks (``padded_count // (tile_m * cluster_m)``) and an
    ``n_extent``-column C."""
    if cfg.cluster_n != 1 or cfg.split_k != 1 or cfg.stream_k:
        raise ValueError(f"gemm_ws_grouped: {cfg}: expected whole tiles, no split K, stream-K or cluster along N")
    tiles_n = ((n_extent + (cfg.tile_n - 1)) // cfg.tile_n).to(fx.Int32)
    order = fx.TileScheduler(blocks, tiles_n, group_m=cfg.group_m, cluster_size=cfg.cluster)
    return ExpertTiles(order, k_tiles, cfg, rank, expert_of_block, rows_per_expert)


def dense_scheduler(m_extent, n_extent, k_tiles, cfg: GemmConfig, rank) -> GroupedTiles:
    """The scheduler of ``cfg`` for an (m_extent, n_extent) output of ``k_tiles`` K steps (kernel integers): tiles of
    ``cfg.tile_m`` x ``cfg.tile_n`` grouped into cluster tiles, whole, split in K or streamed; ``rank``: this CTA's
    rank in its cluster (0 without one)."""
    tiles_m = ((m_extent + (cfg.tile_m - 1)) // cfg.tile_m).to(fx.Int32)
    tiles_n = ((n_extent + (cfg.tile_n - 1)) // cfg.tile_n).to(fx.Int32)
    cluster_tiles_m = (tiles_m + (cfg.cluster_m - 1)) // cfg.cluster_m
    cluster_tiles_n = (tiles_n + (cfg.cluster_n - 1)) // cfg.cluster_n
    order = fx.TileScheduler(cluster_tiles_m, cluster_tiles_n, group_m=cfg.group_m, cluster_size=cfg.cluster)
    kind = StreamKTiles if cfg.stream_k else SplitKTiles if cfg.split_k > 1 else GroupedTiles
    return kind(order, k_tiles, cfg, rank)


# --- host side: the same plans in ints -----------------------------------------------------------------------------


def cluster_tiles(m: int, n: int, cfg: GemmConfig) -> int:
    """The whole-tile work units the kernel's scheduler walks for an (m, n) output: cluster tiles (one per cluster of
    CTAs, one per CTA without a cluster)."""
    return -(-m // (cfg.tile_m * cfg.cluster_m)) * -(-n // (cfg.tile_n * cfg.cluster_n))


def split_plan(tiles, workers, cfg: GemmConfig):
    """(the first work unit that is a K part, the count of work units) of ``tiles`` tiles over ``workers`` CTAs (or
    clusters; ints, or the kernel's Int32 values: operators only). Units before the first part are whole tiles;
    from it on, each remaining tile is ``cfg.split_k`` units, one per part of its K steps: every tile without
    ``split_tail``, the tiles past the last full wave with it."""
    if cfg.split_k == 1:
        return tiles, tiles
    split_from = tiles - tiles % workers if cfg.split_tail else 0
    return split_from, split_from + (tiles - split_from) * cfg.split_k


def stream_k_steps(m: int, n: int, k: int, cfg: GemmConfig, sms: int) -> float:
    """The K steps each worker (CTA, or cluster) gets under stream-K (:class:`StreamKTiles`): 0 where the waves of
    tiles are full (stream-K then takes nothing)."""
    units = cluster_tiles(m, n, cfg)
    workers = sms // cfg.cluster
    if units % workers == 0:
        return 0.0
    whole = max(units // workers - 1, 0) * workers
    return (units - whole) * -(-k // 64) / workers
