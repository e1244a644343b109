"""The norm backward's configurations: how rows map onto threads, CTAs, clusters and teams for the register kernel
and the staged kernel, and the persistent grid's size (:mod:`flydsl.kernels.normalization` has the kernels and
re-exports these; the forward's configurations are in :mod:`flydsl.kernels.norm_config`). Chosen per (N, dtype,
column sums) from the H200 timings cited in each docstring."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

from flydsl.kernels.host import element_bytes
from flydsl.kernels.norm_config import _MAX_STAGES, _RING_BYTES, _STAGED_THREADS
from flydsl.kernels.reduction import RowConfig, row_config

__all__ = [
    "BackwardConfig",
    "backward_config",
    "backward_groups",
    "make_backward_config",
    "resident_backward_config",
    "staged_backward_config",
    "staged_config",
    "StagedShape",
    "team_backward_config",
]


@dataclass(frozen=True)
class BackwardConfig:
    """How the backward maps rows onto threads: ``row`` (the thread layout, :func:`row_config` with 16 values per
    thread), ``segment`` (chunks held in registers at once: when the thread has more, the row is walked twice, the
    second time from L2), ``sums`` (column sums kept: 0, 1 = dweight, 2 = dweight and dbias), ``smem_sums`` (they
    live in shared memory; else in the CTA's partial row in global memory, read-modify-write, for rows too long
    for shared memory) and ``blocks_per_sm`` (the persistent grid's CTAs per SM: registers capped at 64)."""

    row: RowConfig
    segment: int
    sums: int
    smem_sums: bool
    blocks_per_sm: int
    stages: int = 0  # > 0: rows staged through a shared-memory ring of this many rows (see _rows_staged)
    lag: int = 1  # clusters: rows between a row's push and its dx (see _rows_pushed)
    hold: bool = False  # staged, lag 0: g and x (- mean) held in registers from the first pass to dx
    keep_weights: bool = False  # staged: the weight's chunks loaded once, kept in registers in their dtype
    prefetch_pairs: bool = False  # a team at a lag: its row's pairs read a step early (norm_staged._team_prefetch)
    fma_dx: bool = False  # staged LayerNorm: xhat and dx from x by fmas, the mean folded in (16-bit rows; _Ring)
    bulk: bool = False  # staged, a row over CTAs: one thread per CTA fills the ring by bulk copies (_RowRing)

    def __post_init__(self):
        if self.hold and (not self.staged or (self.lag and self.row.cluster > 1)):
            raise ValueError(f"{self}: hold keeps a row in registers until its dx: the staged kernel at lag 0 only")
        if (self.keep_weights or self.fma_dx) and not self.staged:
            raise ValueError(f"{self}: keep_weights and fma_dx are the staged kernel's")
        if self.bulk and (not self.staged or self.hold or self.row.cluster == 1 or self.row.block <= 32):
            raise ValueError(f"{self}: bulk fills the ring of a row over CTAs (a block barrier per row), not held")

    @property
    def two_pass(self) -> bool:
        return self.segment < self.row.chunks

    @property
    def staged(self) -> bool:
        return self.stages > 0

    @property
    def ring_bytes(self) -> int:
        """Shared memory of the staged ring: ``stages`` rows of dy and x, this CTA's chunks."""
        return self.stages * 2 * self.row.block * self.row.chunks * 16


_BWD_THREADS = 256  # CTA size: short rows share a CTA, longer ones are split over clusters of 256-thread CTAs
_SMEM_BYTES = 200 * 1024  # shared memory per SM the column sums may take (of 227 KB)


class StagedShape(NamedTuple):
    """A staged backward shape (see :func:`staged_backward_config` for each field): CTAs of ``threads`` threads
    holding ``chunks`` 16-byte chunks of each source, ``lag`` rows between a row's push and its dx, taken for rows
    held by at most ``most`` CTAs; ``stages`` (None: as many as fit, up to :data:`_MAX_STAGES`), ``keep``: the
    weight kept in registers, ``fma``: LayerNorm's mean folded into fmas (``BackwardConfig.fma_dx``)."""

    threads: int
    chunks: int
    lag: int
    most: int
    stages: int | None = None
    keep: bool = True
    fma: bool = False


def _staged_shapes(dtype: str, sums: int) -> list:
    """The :class:`StagedShape` s the staged kernel uses, in order of preference: measured on the H200 (kernel alone,
    ``benchmarks/norms_backward_staged.py``) against each other and the register kernel, among the shapes that ptxas
    -v assembles without spills (the column sums take ``sums * chunks * vec`` registers; checked by the CPU tests).
    The weight kept in registers (``keep_weights``) is worth 5-25%: reloaded per row, each CTA's slice of it (as
    many bytes as its slice of dy) came from L2 again (2026-12-01, benchmarks/results/
    norms_backward_staged_2026-12-01_keep*.json, TB/s with against without): 16-bit rows with one sum: one 1024 x 2
    CTA per row (16384), then 1024 x 1 chunk, lag 1, up to 8 CTAs (32768, 65536: 3.68, 3.65 against 3.49-3.57,
    3.27-3.33 for 1024 x 2), then 1024 x 2 (131072: 3.64 against 3.09); 16-bit LayerNorm (two sums): one 1024 x 2
    CTA per row without kept weights (they spill 56 bytes there), then 512 x 2 in a 6-row ring, lag 1 (32768, 65536:
    3.62, 3.60 against 2.90-2.99, 2.95), then 512 x 4 in 3 rows (131072: 3.58 against a team's 2.82; it spills 16
    bytes, loop invariants reloaded per row: 2.42 without kept weights). Float32: 1024 x 2 up to 2 CTAs (16384:
    LayerNorm 3.79 against 3.60, RMSNorm 3.82 against 3.69), then LayerNorm 512 x 2 in 6 rows (32768: 3.73 against
    3.31) and RMSNorm 1024 x 1 (32768: 3.79 against the register kernel's 3.70), then 1024 x 2 up to 8 CTAs (65536:
    3.66 against 3.33, RMSNorm 3.72 against 3.64). Holding the row in registers from the first pass to dx (``hold``,
    lag 0) measured no better than lag 1 with kept weights (LayerNorm bf16 65536: 3.39 against 3.60; f32 32768: 3.75
    against 3.73). 16-bit LayerNorm's one-CTA and 512 x 2 shapes fold the mean into fmas (``fma_dx``: 18% fewer float
    ops; two runs each, 16384: 3.73, 3.72 against 3.61, 3.60 (f16 3.86, 3.83 against 3.78, 3.79); 32768: 3.69, 3.64
    against 3.50, 3.57; 65536: 3.70, 3.64 against 3.55, 3.50); its 512 x 4 shape does not (it spills 24 bytes then:
    2.95-3.19 against 3.52; ``norms_backward_staged_2026-12-01_fma*.json``). 1024 x 1-chunk clusters and teams
    measured 10-15% slower than 512 x 2 (LayerNorm) and 512 x 4 / 1024 x 2 (RMSNorm) (``..._team_shapes_*.json``)."""
    if dtype == "f32":
        middle = StagedShape(512, 2, 1, 8, 6) if sums == 2 else StagedShape(1024, 1, 1, 8)
        return [StagedShape(1024, 2, 1, 2), middle, StagedShape(1024, 2, 1, 8)]
    if sums == 2:
        return [
            StagedShape(1024, 2, 1, 1, keep=False, fma=True),
            StagedShape(512, 2, 1, 8, 6, fma=True),
            StagedShape(512, 4, 1, 8),
        ]
    return [StagedShape(1024, 2, 1, 1), StagedShape(1024, 1, 1, 8), StagedShape(1024, 2, 1, 8)]


def staged_config(n: int, dtype: str, sums: int) -> BackwardConfig | None:
    """The first of :func:`_staged_shapes` that holds a row in its most CTAs, or None."""
    for shape in _staged_shapes(dtype, sums):
        cfg = staged_backward_config(
            n, dtype, sums, shape.chunks, shape.stages, shape.threads, shape.lag, False, shape.keep, shape.fma
        )
        if cfg is not None and cfg.row.cluster <= shape.most:
            return cfg
    return None


@functools.lru_cache(maxsize=1024)
def staged_backward_config(
    n: int,
    dtype: str,
    sums: int,
    chunks: int = 2,
    stages: int | None = None,
    threads: int = _STAGED_THREADS,
    lag: int = 1,
    hold: bool = False,
    keep_weights: bool = False,
    fma_dx: bool = False,
) -> BackwardConfig | None:
    """The staged backward config (see :func:`_rows_staged`) for rows of ``n`` elements: CTAs of ``threads``
    threads holding ``chunks`` 16-byte chunks of a row each, as few CTAs per row (a cluster) as hold it, a ring of
    ``stages`` rows (default: as many as :data:`_RING_BYTES` hold, at most :data:`_MAX_STAGES`). None when a row
    needs more than 8 CTAs or the ring would hold fewer than 2 rows, or when N is not a multiple of 16 bytes (the
    ring is filled by 16-byte copies), or ``hold`` at a lag in a cluster. ``hold``, ``keep_weights`` and ``fma_dx``:
    see :class:`BackwardConfig`."""
    vec = 16 // element_bytes(dtype)
    if n % vec:
        return None
    total = -(-n // vec)
    cluster = 1 << max(0, (-(-total // (threads * chunks)) - 1).bit_length())
    if cluster > 8:
        return None
    stage_bytes = 2 * threads * chunks * 16
    stages = stages or min(_MAX_STAGES, _RING_BYTES // stage_bytes)
    if stages < 2 or stages * stage_bytes > _RING_BYTES or (cluster > 1 and stages < lag + 2):
        return None
    if hold and lag and cluster > 1:
        return None
    layout = RowConfig(dtype, vec, chunks, threads, 1, cluster, True)
    return BackwardConfig(layout, chunks, sums, False, 1, stages, lag, hold, keep_weights, fma_dx=fma_dx)


_MAX_TEAM = 64  # CTAs per row of a team: at least two teams on 132 SMs


def _team_shape(dtype: str, sums: int) -> tuple:
    """(threads, chunks, stages, lag, prefetch_pairs, fma_dx, bulk) of a team by default: 1024 x 2-chunk CTAs, a 3-row
    ring, lag 1 (f32 LayerNorm 131072, 262144: 3.14, 2.91 TB/s against 2.76, 2.50 for 512 threads, 6 rows, lag 2;
    RMSNorm bf16 262144 3.03, f32 131072, 262144: 3.11, 2.94), except 16-bit LayerNorm, whose two sums spill at 1024
    threads: 512 threads, 6 rows, lag 2, the pairs prefetched (131072, 262144: 2.83-2.86, 2.98-3.00 against
    2.71-2.77, 2.68-2.71 at lag 1 without; benchmarks/results/norms_backward_staged_2026-12-01_prefetch_*.json; at
    1024 threads the prefetch measured -4% to +5%, and spilled 8 bytes in RMSNorm bf16 262144's registers: off).
    Every team keeps its weight in registers (2026-12-01: f32 LayerNorm 131072, 262144 3.73, 3.57 against 3.02,
    2.92; RMSNorm bf16 262144 3.37 against 2.98, f32 3.83, 3.77 against 3.14, 3.03). 16-bit RMSNorm: 512 x 4-chunk
    CTAs, 3 rows, lag 1, pairs prefetched (262144, four runs: 3.42, 3.44, 3.37, 3.49 against 3.40, 3.34, 3.25, 3.35
    for 1024 x 2; ..._2026-12-01_rms262144*.json; float32 measured within 2% either way at 512 x 4: not changed).
    16-bit LayerNorm folds its mean into fmas (``fma_dx``; 131072, 262144: 2.96, 3.06 and 2.90, 3.02 against 2.51,
    2.98 and 2.80, 2.95 in two runs). 16-bit LayerNorm fills its ring by bulk copies (``bulk``; 262144: 3.36 against
    3.04-3.06 in one run, ``norms_backward_staged_2026-12-01_session26_bulk_*.json``, ~50 fewer SASS instructions
    per thread per row step; issued by the last warp, not the first, which polls the pairs: 1.18-1.20 against
    1.12-1.13 x the cp.async ring in the same runs; RMSNorm bf16 262144 measured 3.17 at 512 x 4 and 3.47 at 1024 x
    2 against 3.50, float32 LayerNorm 262144 3.54 against 3.50, clusters (one row ahead at 3 stages) 2.83 against
    3.46: not taken there). 16-bit RMSNorm takes LayerNorm's shape with bulk fills since (262144, two runs: 3.63,
    3.63 against the 512 x 4 team's 3.46, 3.49; ``..._session26_bulk_rms_*.json``)."""
    if dtype == "f32":
        return (1024, 2, 3, 1, False, False, False)
    return (512, 2, 6, 2, True, sums == 2, True)


@functools.lru_cache(maxsize=1024)
def team_backward_config(
    n: int,
    dtype: str,
    sums: int,
    chunks: int | None = None,
    stages: int | None = None,
    threads: int | None = None,
    lag: int | None = None,
    smallest: int = 9,
    hold: bool = False,
    keep_weights: bool = True,
    prefetch_pairs: bool | None = None,
    fma_dx: bool | None = None,
    bulk: bool | None = None,
) -> BackwardConfig | None:
    """The staged kernel for rows longer than 8 CTAs hold (see :func:`_rows_pushed`): a team of as many CTAs as hold the
    row (any count, ``smallest`` to :data:`_MAX_TEAM`), consecutive in the grid, exchanging their partial sums
    through global memory; ``chunks``, ``threads``, ``stages``, ``lag``, ``prefetch_pairs``, ``fma_dx`` and ``bulk``
    default to :func:`_team_shape` (``bulk`` not with ``hold``). None when N is not a multiple of 16 bytes, the row
    needs fewer than ``smallest`` (>= 2) or more than :data:`_MAX_TEAM` CTAs, or the ring is too small for the lag
    (``stages < lag + 2``), or ``hold`` at a lag. ``hold``, ``keep_weights``, ``prefetch_pairs``, ``fma_dx`` and
    ``bulk``: see :class:`BackwardConfig`."""
    shape = _team_shape(dtype, sums)
    threads, chunks, stages = threads or shape[0], chunks or shape[1], stages or shape[2]
    lag = shape[3] if lag is None else lag
    prefetch_pairs = shape[4] if prefetch_pairs is None else prefetch_pairs
    fma_dx = shape[5] if fma_dx is None else fma_dx
    bulk = shape[6] and not hold if bulk is None else bulk
    vec = 16 // element_bytes(dtype)
    team = -(-n // (vec * threads * chunks))
    fits = max(2, smallest) <= team <= _MAX_TEAM and lag + 2 <= stages  # the ring holds rows k - lag .. k + 1
    if n % vec or not fits or stages * 2 * threads * chunks * 16 > _RING_BYTES or (hold and lag):
        return None
    layout = RowConfig(dtype, vec, chunks, threads, 1, team, True, team=True)
    prefetch_pairs = prefetch_pairs and lag > 0
    return BackwardConfig(layout, chunks, sums, False, 1, stages, lag, hold, keep_weights, prefetch_pairs, fma_dx, bulk)


@functools.lru_cache(maxsize=1024)
def backward_config(n: int, dtype: str, sums: int, staged: bool = True) -> BackwardConfig:
    """The backward config for rows of ``n`` elements of ``dtype`` keeping ``sums`` column sums (see
    :class:`BackwardConfig`). Float32 rows: two 16-byte chunks of dy and of x per thread (and the next row's in
    flight) at 64 registers, 1024 threads per SM; 16-bit rows: two chunks (16 values) at 80 registers (768 threads
    per SM) in 256-thread CTAs, one chunk at 64 registers in larger CTAs and past 32768. In that order of
    preference: rows that fit a 256-thread CTA (several rows per CTA), rows that fit one CTA of up to 1024 threads
    (measured better than clusters: 8192 bf16 3.69 against 3.20 TB/s, f32 4.04 against 3.62), then (``staged``:
    rows 16-byte aligned) the staged kernel where it was measured faster (:func:`staged_config`; teams:
    :func:`team_backward_config`), clusters of CTAs. The CPU tests check with ptxas -v that none of these spills."""
    wide = dtype == "f32"
    dense, lean = ((2, 64), (2, 64)) if wide else ((2, 80), (1, 64))  # (chunks, registers)
    cfg = make_backward_config(n, dtype, sums, *dense)
    if cfg.row.cluster == 1:
        return cfg
    cfg = make_backward_config(n, dtype, sums, *lean, cta_threads=1024)
    if cfg.row.cluster == 1:
        return cfg
    if staged:
        ring = staged_config(n, dtype, sums)
        if ring is None:  # past 8 CTAs per row: a team (kernel alone, LayerNorm bf16 131072, 262144: 2.37, 2.53
            # TB/s against 1.7-2.3 for the register kernel; RMSNorm bf16 262144, f32 131072, 262144: 3.03, 3.11, 2.94
            # against 2.52, 2.96, 2.71)
            ring = team_backward_config(n, dtype, sums)
        if ring is not None:
            return ring
    if not wide and n <= 8 * _BWD_THREADS * 16:
        return make_backward_config(n, dtype, sums, *dense)
    return make_backward_config(n, dtype, sums, *lean)


def resident_backward_config(n: int, dtype: str, sums: int, staged: bool, sms: int) -> BackwardConfig:
    """:func:`backward_config` on a device of ``sms`` SMs: a team's CTAs wait for each other's pairs, so they must all
    be resident at once (one per SM); where a team has more CTAs than that (a MIG slice of 16 or 32 SMs, against
    teams of up to 64), the register kernel (hardware clusters) instead of a team that would spin until it traps."""
    cfg = backward_config(n, dtype, sums, staged)
    if cfg.row.team and cfg.row.cluster > cfg.blocks_per_sm * sms:
        return backward_config(n, dtype, sums, False)
    return cfg


def backward_groups(cfg: BackwardConfig, rows: int, sms: int, active: int | None = None) -> int:
    """The persistent grid's CTA groups (CTAs, or clusters): as many as fit at once, each taking an equal share of
    the rows. Clusters of 4 or 8 CTAs cannot fill every SM (a cluster lives in one GPC): launching ``blocks_per_sm
    * SMs / cluster`` of them left a second wave (measured on the H200: 7/8 of that count ran 1.2-1.5x faster
    than the full count, 3/4 slower again). ``active``: the clusters the driver says fit at once
    (:func:`max_active_clusters`), used instead of 7/8 when known."""
    rc = cfg.row
    fit = cfg.blocks_per_sm * sms // rc.cluster
    if rc.cluster_shape is not None:  # a team needs no GPC of its own: every SM
        fit = active if active else fit * 7 // 8
    return max(1, min(-(-rows // rc.rows_per_cta), fit))


def make_backward_config(
    n: int, dtype: str, sums: int, chunks: int, registers: int, cta_threads: int = _BWD_THREADS
) -> BackwardConfig:
    """A backward config holding ``chunks`` 16-byte chunks per thread per tensor in registers, in CTAs of
    ``cta_threads`` (several rows each for short rows, clusters of up to 8 for longer ones, then CTAs of up to 1024,
    then two passes per row), as many CTAs per SM as ``registers`` per thread and the column sums' shared memory
    allow."""
    vec = 16 // element_bytes(dtype)
    layout = row_config(n, dtype, held=32 // (chunks * vec), warp_block=_BWD_THREADS, cta_threads=cta_threads)
    if layout.cluster == 1 and layout.block < _BWD_THREADS:
        layout = dataclasses.replace(layout, rows_per_cta=_BWD_THREADS // layout.threads_per_row)
    if layout.chunks > chunks:  # two passes, over whole segments (a dynamic loop)
        layout = dataclasses.replace(layout, chunks=-(-layout.chunks // chunks) * chunks)
    blocks = max(1, 65536 // (registers * layout.block))
    sum_bytes = sums * layout.block * layout.chunks * layout.vec * 4
    while blocks > 1 and blocks * sum_bytes > _SMEM_BYTES:
        blocks -= 1
    return BackwardConfig(layout, min(chunks, layout.chunks), sums, sum_bytes <= _SMEM_BYTES, blocks)
