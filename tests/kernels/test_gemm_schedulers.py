"""flydsl.kernels.gemm.schedulers on the host: the schedulers run on Python ints (as a grouped MoE scheduler's test
would run it), and every worker's work units together cover each output tile's K steps exactly once, for whole
tiles, split K (every tile, or the last wave's) and stream-K, with and without clusters; the host-side plans
(split_plan, stream_k_steps) agree with what the kernels' schedulers do."""

from __future__ import annotations

import itertools

import pytest

from flydsl.kernels.gemm import GemmConfig
from flydsl.kernels.gemm.schedulers import (
    GroupedTiles,
    SplitKTiles,
    StreamKTiles,
    cluster_tiles,
    split_plan,
    stream_k_steps,
)


class RowMajorOrder:
    """A tile order on Python ints, as ``fx.TileScheduler`` answers it in a kernel: worker ``first`` of
    ``stride``; linear tile t is (t // tiles_n, t % tiles_n) (the schedulers do not depend on the order)."""

    def __init__(self, tiles_m: int, tiles_n: int, worker: int, workers: int):
        self.tiles_m, self.tiles_n, self.first, self.stride = tiles_m, tiles_n, worker, workers
        self.count = tiles_m * tiles_n

    def coords(self, tile: int):
        return tile // self.tiles_n, tile % self.tiles_n


def _cover(cfg: GemmConfig, tiles_m: int, tiles_n: int, k_tiles: int, workers: int):
    """{(tile_m, tile_n): [(k_begin, k_end, worker, finishes), ...]} over every worker and rank of a cluster, from
    its scheduler's units (and stream-K segments): what the producer and consumers of each CTA walk."""
    kind = StreamKTiles if cfg.stream_k else SplitKTiles if cfg.split_k > 1 else GroupedTiles
    cluster_m, cluster_n = -(-tiles_m // cfg.cluster_m), -(-tiles_n // cfg.cluster_n)
    parts: dict = {}
    for worker, rank in itertools.product(range(workers), range(cfg.cluster)):
        schedule = kind(RowMajorOrder(cluster_m, cluster_n, worker, workers), k_tiles, cfg, rank)
        work = [schedule.work(unit) for unit in range(schedule.worker, schedule.count, schedule.stride)]
        if cfg.stream_k:
            work += [schedule.segment(i)[1] for i in range(schedule.segments)]
        for unit in work:
            finishes = not cfg.stream_k or unit.k_begin == 0  # a stream-K tile's first part sums the others
            parts.setdefault((unit.tile_m, unit.tile_n), []).append((unit.k_begin, unit.k_end, worker, finishes))
    return parts


CONFIGS = [
    GemmConfig(cluster_m=1),
    GemmConfig(),  # 2-CTA clusters along M
    GemmConfig(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2),
    GemmConfig(cluster_m=1, split_k=3),
    GemmConfig(split_k=4),
    GemmConfig(tile_n=128, cluster_m=1, split_k=3, split_tail=True),
    GemmConfig(tile_n=128, split_k=2, split_tail=True),
    GemmConfig(cluster_m=1, stream_k=True),
    GemmConfig(stream_k=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("tiles_m,tiles_n", [(1, 1), (3, 5), (8, 17), (16, 33)])
@pytest.mark.parametrize("k_tiles", [1, 5, 64])
@pytest.mark.parametrize("workers", [7, 66])
def test_work_units_cover_every_k_step_once(cfg, tiles_m, tiles_n, k_tiles, workers):
    """Each tile of C (the CTA tiles of cluster tiles, past C's edge included: their CTAs run and mask) gets its K
    steps exactly once, in parts that do not overlap; exactly one part of each tile stores it (split K: the part
    counting last, any; stream-K: the first part, whose worker comes before every other of the tile's, so that it
    only waits for later workers)."""
    parts = _cover(cfg, tiles_m, tiles_n, k_tiles, workers)
    expected = {(m, n) for m in range(-(-tiles_m // cfg.cluster_m) * cfg.cluster_m) for n in range(tiles_n)}
    if cfg.cluster_n > 1:
        expected = {(m, n) for m in range(tiles_m) for n in range(-(-tiles_n // cfg.cluster_n) * cfg.cluster_n)}
    assert set(parts) == expected
    for tile, ranges in parts.items():
        steps = sorted((begin, end) for begin, end, _, _ in ranges if end > begin)
        assert [begin for begin, _ in steps] == [0] + [end for _, end in steps[:-1]], (tile, ranges)
        assert steps[-1][1] == k_tiles, (tile, ranges)
        if cfg.stream_k:
            finishers = [worker for begin, end, worker, finishes in ranges if finishes and end > begin]
            assert len(finishers) == 1 and finishers[0] == min(worker for _, _, worker, _ in ranges), (tile, ranges)
        if cfg.split_k > 1 and len(ranges) > 1:
            assert len(ranges) == cfg.split_k, (tile, ranges)


@pytest.mark.parametrize("tiles_m,tiles_n", [(3, 5), (8, 17), (16, 33), (12, 11)])
@pytest.mark.parametrize("workers", [7, 66])
def test_stream_k_shares_its_steps_evenly(tiles_m, tiles_n, workers):
    """Under stream-K every worker gets the same K steps of the stream-K tiles, within one, and the host's estimate
    (stream_k_steps, the cost model's) is that share."""
    cfg, k_tiles = GemmConfig(cluster_m=1, stream_k=True), 9
    shares = []
    for worker in range(workers):
        schedule = StreamKTiles(RowMajorOrder(tiles_m, tiles_n, worker, workers), k_tiles, cfg, 0)
        segments = [schedule.segment(i)[1] for i in range(schedule.segments)]
        shares.append(sum(unit.k_end - unit.k_begin for unit in segments))
        assert sum(unit.k_begin > 0 for unit in segments) <= 1  # at most one part left to a finisher: its first
    assert max(shares) - min(shares) <= 1
    m, n, k = tiles_m * cfg.tile_m, tiles_n * cfg.tile_n, k_tiles * 64
    assert stream_k_steps(m, n, k, cfg, workers) == pytest.approx(sum(shares) / workers)


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if not c.stream_k], ids=str)
def test_host_split_plan_is_the_kernels(cfg):
    """split_plan on the host (the cost model's and the launch plan's) counts the units the kernels' schedulers walk,
    over cluster tiles."""
    m, n, workers = 3000, 5000, 66
    tiles = cluster_tiles(m, n, cfg)
    tiles_m, tiles_n = -(-m // (cfg.tile_m * cfg.cluster_m)), -(-n // (cfg.tile_n * cfg.cluster_n))
    kind = SplitKTiles if cfg.split_k > 1 else GroupedTiles
    schedule = kind(RowMajorOrder(tiles_m, tiles_n, 0, workers), 9, cfg, 0)
    assert (schedule.split_from, schedule.count) == split_plan(tiles, workers, cfg)
