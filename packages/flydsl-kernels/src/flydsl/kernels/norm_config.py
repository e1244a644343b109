"""The norm kernels' variants (:class:`NormFlags`, :class:`SoftmaxFlags`, :class:`SoftmaxBackwardFlags`) and the
forward's configurations: the staged forward (:func:`staged_forward_config`; where the forward takes it:
:func:`forward_shape`), the looped forward (:func:`looped_forward_config`, routed by :data:`LOOPED_FORWARD`) and the
staged softmax backward (:func:`softmax_backward_staged_config`). The backward's configurations are in
:mod:`flydsl.kernels.norm_backward_config`; :mod:`flydsl.kernels.normalization` has the kernels and re-exports both.
Chosen per (N, dtype, kind) from the H200 timings cited in each docstring."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from flydsl.kernels.host import element_bytes
from flydsl.kernels.reduction import PLAIN_HINTS, CacheHints, RowConfig

__all__ = [
    "NormFlags",
    "SoftmaxFlags",
    "SoftmaxBackwardFlags",
    "StagedForwardConfig",
    "LoopedForwardConfig",
    "looped_forward_config",
    "looped_forward_shape",
    "LOOPED_FORWARD",
    "staged_forward_config",
    "routed_staged_forward_config",
    "softmax_backward_shape",
    "softmax_backward_staged_config",
    "forward_shape",
    "ForwardShape",
    "FORWARD_KINDS",
    "MAX_FORWARD_TEAM",
]


@dataclass(frozen=True)
class NormFlags:
    """Which variant a norm kernel is compiled for."""

    rms: bool
    residual: bool = False  # fused add: x + residual, written to residual_out, then normalized
    weight: bool = False
    bias: bool = False
    mean: bool = False  # write the mean (LayerNorm)
    rstd: bool = False  # write rstd


@dataclass(frozen=True)
class _NoVectors:
    """The :class:`NormFlags` fields the staged forward reads, all off: no residual, weight, bias nor statistics."""

    residual: bool = False
    weight: bool = False
    bias: bool = False
    mean: bool = False
    rstd: bool = False


@dataclass(frozen=True)
class SoftmaxFlags(_NoVectors):
    """The staged forward's softmax variant (:func:`flydsl.kernels.norm_staged_forward._rows_staged_forward` takes
    it where it takes :class:`NormFlags`)."""


@dataclass(frozen=True)
class SoftmaxBackwardFlags(_NoVectors):
    """The staged forward kernel run as softmax's backward (``dx = y * (dy - sum(dy * y))``): its ring holds dy and
    y (two sources, as the fused add's x and residual), its row statistic is ``sum(dy * y)``, summed over the row's
    CTAs as RMSNorm's sum of squares."""


_STAGED_THREADS = 1024  # the staged kernel's CTA: one per SM (its ring takes most of the shared memory)
_RING_BYTES = 200 * 1024  # shared memory the ring may take
_MAX_STAGES = 4  # ring depth by default (the backward team's: norm_backward_config._team_shape)


@dataclass(frozen=True)
class StagedForwardConfig:
    """The staged forward (:func:`flydsl.kernels.norm_staged_forward._rows_staged_forward`): ``row`` (the thread layout:
    as many CTAs per row as hold it, a cluster of up to 8, or a team: ``staged_forward_config(team=True)``), ``stages``
    (rows of the shared-memory ring), ``sources`` (row tensors in the ring: x, and the residual of the fused add),
    ``lag`` (clusters: rows between a row's push and its output), ``hold`` (lag 0: each thread keeps its first ``hold``
    chunks of the row in registers from the first pass to the output, as float32, instead of reading and converting them
    from the ring in every pass; softmax keeps their exps, and writes each of those outputs with one multiply; 0: none),
    ``keep_weights`` (each thread loads its chunks of the weight and bias once, before its first row, and keeps them in
    registers in their dtype for every row, instead of reloading them from L1/L2 per row: a CTA's slice is the same
    columns for all its rows; not with float32 weights on 16-bit rows, whose registers would spill; routed at 5-8 CTAs
    per row and in teams, see :func:`forward_shape`). One CTA per SM (the ring takes most of the shared memory), a
    persistent grid. ``claim_rows`` (one CTA per row, or a cluster at lag 0): each CTA group claims its next rows one
    by one from a counter in global memory (``exchange`` holds it:
    :func:`flydsl.kernels.normalization.forward_exchange`) instead of taking every ``groups``-th row, so that groups
    on SMs that move bytes faster take more rows and all finish together. ``equal_shares`` (a cluster, set by
    :func:`staged_forward_config` where N is a multiple of ``cluster x threads x vec``): every CTA of a row holds N /
    cluster elements, so LayerNorm combines its CTAs' pairs with one count instead of one register per rank (eight
    in a cluster of 8: the claim loop spilled without them); the kernel traps on an N that is not such a multiple
    (a config built for another N)."""

    row: RowConfig
    stages: int
    sources: int = 1
    lag: int = 1
    blocks_per_sm: int = 1
    hold: int = 0
    keep_weights: bool = False
    claim_rows: bool = False
    equal_shares: bool = False

    def __post_init__(self):
        if not isinstance(self.hold, int) or isinstance(self.hold, bool) or not 0 <= self.hold <= self.row.chunks:
            raise ValueError(f"{self}: hold is the count of chunks held in registers, 0..{self.row.chunks}")
        if self.hold and self.lag and self.row.cluster > 1:
            raise ValueError(f"{self}: hold keeps a row in registers until its output: lag 0 only")
        if self.claim_rows and (self.row.team or (self.row.cluster > 1 and self.lag)):
            raise ValueError(f"{self}: claim_rows needs one CTA per row or a cluster at lag 0 (not a team)")
        if self.equal_shares and (self.row.team or self.row.cluster == 1):
            raise ValueError(f"{self}: equal_shares is about a cluster's CTAs (not one CTA per row, not a team)")

    @property
    def staged(self) -> bool:
        return True

    @property
    def ring_bytes(self) -> int:
        return self.stages * self.sources * self.row.block * self.row.chunks * 16


# CTAs of a staged forward team: one rank per lane of the warp that combines the row's pairs (and all of a team must
# be resident at once, one CTA per SM: see normalization.staged_forward_groups)
MAX_FORWARD_TEAM = 32
_FORWARD_STAGE_BYTES = 64 * 1024  # a ring row of one source per CTA by default: 1024 threads x 4 chunks (3 stages)


@functools.lru_cache(maxsize=1024)
def staged_forward_config(
    n: int,
    dtype: str,
    residual: bool = False,
    chunks: int | None = None,
    stages: int | None = None,
    threads: int = _STAGED_THREADS,
    lag: int = 1,
    hold: int | bool = 0,
    keep_weights: bool = False,
    team: bool = False,
    blocks_per_sm: int = 1,
    claim_rows: bool = False,
) -> StagedForwardConfig | None:
    """The staged forward config for rows of ``n`` elements of ``dtype`` (``residual``: the fused add, whose ring
    holds x and the residual): CTAs of ``threads`` threads holding ``chunks`` 16-byte chunks of each source per row
    (default: a ring row of :data:`_FORWARD_STAGE_BYTES` per CTA: 4 chunks, 2 with the residual), as few CTAs per
    row as hold it, a ring of ``stages`` rows (default: as many as :data:`_RING_BYTES` hold, at most
    :data:`_MAX_STAGES`). The ring holds rows ``k - lag .. k + ahead`` (``ahead = stages - 1 - lag``): at least one
    row ahead, except in a ring of a single row (lag 0), whose next row is copied in once this row's output is
    written (rows of 128 KB per CTA: two would not fit). :func:`routed_staged_forward_config` picks the shape the
    forward takes. None when N is not a multiple of 16 bytes, a row needs more than 8 CTAs, or the ring does not fit
    :data:`_RING_BYTES` or is too small for the pipeline (``lag + 2`` rows, or one). ``hold``: the chunks held in
    registers, see :class:`StagedForwardConfig` (lag 0 only; True: all of them, False: none); ``keep_weights``: see
    :class:`StagedForwardConfig`; ``team``: rows over several CTAs (up to :data:`MAX_FORWARD_TEAM`) run as a team
    of consecutive CTAs exchanging their pairs through global memory (``RowConfig.team``; routed past a cluster, see
    :func:`forward_shape`) instead of a cluster (up to 8 CTAs) or None (more). A team needs no GPC of its own: every
    SM takes a CTA, where clusters of 4 or 8 1024-thread CTAs fill only 120 of the H200's 132. ``blocks_per_sm``:
    CTAs per SM (their rings share :data:`_RING_BYTES`; ptxas fits their registers), so that one CTA's barriers
    and output leave the other CTAs' copies and math running; None when their threads exceed an SM's 2048.
    ``claim_rows``: see :class:`StagedForwardConfig` (None in a team and in a cluster at lag > 0)."""
    if not isinstance(blocks_per_sm, int) or isinstance(blocks_per_sm, bool) or blocks_per_sm < 1:
        raise ValueError(
            f"staged_forward_config blocks_per_sm: expected a positive int (CTAs per SM), got {blocks_per_sm!r}"
        )
    vec = 16 // element_bytes(dtype)
    sources = 2 if residual else 1
    if chunks is None:
        chunks = max(1, _FORWARD_STAGE_BYTES // (sources * threads * 16))
    if n % vec or chunks < 1:
        return None
    total = n // vec
    count = -(-total // (threads * chunks))
    cluster = 1 << max(0, (count - 1).bit_length())
    in_team = cluster > 8 or (team and count > 1)
    if in_team:
        if not team or count > MAX_FORWARD_TEAM:
            return None
        cluster = count  # a team: exactly the CTAs the row needs
    lag = lag if cluster > 1 else 0  # one CTA per row: its statistics are at hand, no pairs to wait for
    stage_bytes = sources * threads * chunks * 16
    stages = stages or min(_MAX_STAGES, _RING_BYTES // (blocks_per_sm * stage_bytes))
    single = stages == 1 and lag == 0
    ring_bytes = blocks_per_sm * stages * stage_bytes  # every CTA on the SM
    if stages < 1 or ring_bytes > _RING_BYTES or not (single or stages >= lag + 2) or blocks_per_sm * threads > 2048:
        return None
    layout = RowConfig(dtype, vec, chunks, threads, 1, cluster, True, team=in_team)
    held = (chunks if hold else 0) if isinstance(hold, bool) else hold
    if not isinstance(held, int) or not 0 <= held <= chunks:
        raise ValueError(f"staged_forward_config hold: expected 0..{chunks} chunks (or True: all), got {hold!r}")
    if ((held or claim_rows) and lag and cluster > 1) or (claim_rows and in_team):
        return None
    equal = cluster > 1 and not in_team and shares_equal(n, dtype, threads, cluster)
    return StagedForwardConfig(
        layout, stages, sources, lag, blocks_per_sm, held, bool(keep_weights), bool(claim_rows), equal
    )


def shares_equal(n: int, dtype: str, threads: int, cluster: int) -> bool:
    """Whether every CTA of a cluster of ``cluster`` CTAs of ``threads`` threads holds N / cluster elements of a row
    of ``n`` (its 16-byte chunks go round the ranks ``threads`` at a time: N a multiple of ``cluster x threads x
    vec``)."""
    return n % (cluster * threads * (16 // element_bytes(dtype))) == 0


# The staged forward is the default from these N on (the register kernel's cluster regime, under the bar; shorter
# rows keep the register kernel, at the bar there). float32 32768: LayerNorm and RMSNorm only (see forward_shape).
STAGED_FORWARD_MIN_N = {"bf16": 32768, "f16": 32768, "f32": 32768}
FORWARD_KINDS = ("layer", "rms", "fused", "softmax")


class ForwardShape(NamedTuple):
    """A staged forward shape (see :func:`staged_forward_config` for each field's meaning)."""

    threads: int
    chunks: int  # per source
    lag: int
    stages: int
    hold: int
    keep_weights: bool = False
    team: bool = False
    blocks_per_sm: int = 1
    claim_rows: bool = False


def forward_shape(n: int, dtype: str, kind: str) -> ForwardShape | None:
    """The shape (:class:`ForwardShape`) of the staged forward that
    :func:`routed_staged_forward_config` takes for ``kind`` (:data:`FORWARD_KINDS`: LayerNorm, RMSNorm, the fused
    add + RMSNorm, softmax), or None where the register kernel stays. The rule, from two H200 sweeps
    (benchmarks/results/norms_forward_staged_2026-11-30.json and ..._2026-11-30_sweep.json, 2^28 elements, each
    shape launched alone; TB/s, first sweep then second):

    - A ring row of 64 KB per CTA (1024 threads; 4 chunks, 2 per source with the residual): 64 KB in flight per SM
      is twice what HBM needs (Little's law), and larger CTA shares beat more CTAs per row (1024 x 2 chunks: a
      cluster twice as wide, 0.2-0.6 TB/s slower).
    - One CTA per row (bf16 32768): LayerNorm and softmax (two block reductions per row) in a 2-row ring (3.72 and
      3.72, 3.66 and 3.58 against 3.53 and 3.67, 3.54 and 3.64 with 3 rows), RMSNorm in 3 rows (3.67 and 3.79
      against 3.50 and 3.63).
    - A cluster: lag 0, each row's output as soon as its pairs arrive, 3 rows in the ring (2 ahead): faster than
      lag 1 everywhere (LayerNorm bf16 65536-262144: 3.28, 3.12, 2.99 against 3.10, 2.88, 2.75). The fused add's
      two sources leave no room for lag 0 with 2 rows ahead at 64 KB: lag 1 (3.71, 3.74, 3.68 at 32768-131072; lag
      0 in a single-row ring of 128 KB measured the same, 3.85, 3.88, 3.78).
    - Rows of 1 MB in the ring (the fused add's bf16 262144 and f32 131072; softmax f32 262144 before teams): 8 CTAs
      of 128 KB,
      which fit one ring row only (227 KB of shared memory per SM): a single-row ring, the next row copied in once
      the output is written; the other SMs' copies fill the gap (3.43, 3.75, 3.95 against the register kernel's
      2.96, 3.30, 3.25). LayerNorm and RMSNorm f32 262144 measured 2.54, 3.22 there against the register kernel's
      2.82, 3.30 (their weight and bias re-read from L2 beside each 1 MB row): teams since, below.
    - float32 32768: LayerNorm and RMSNorm (3.80, 3.88 against 2.62, 3.71); the register kernel's softmax and fused
      add are at the bar there (3.82, 3.91).
    - ``hold`` (the row's values in registers from the first pass to the output) for softmax and RMSNorm at 1024
      threads x 4 chunks (benchmarks/results/norms_forward_hold_2026-11-30.json, GPU time, TB/s): softmax bf16
      65536-262144 3.76, 3.43, 3.34 -> 3.79, 3.84, 3.72 (its exps kept: one ex2 per element instead of two, 24.8
      -> 17.3 SASS instructions per element); float32 65536 at 512 threads x 8 chunks, 3.83 -> 3.96. RMSNorm
      +0-1%. Softmax in one CTA (bf16 32768, a 2-row ring) measured 3.74 held against 3.83-3.86 (the full
      norms_bench run at 54aa53c): not held. LayerNorm keeps the ring: held, its 32 values spill at 1024 threads
      (3.70, 3.51, 3.34 -> 3.63, 3.45, 2.90), and 512 threads are slower. Not in a single-row ring (8 chunks: 32
      float32 values at 1024 threads).
    - 16-bit LayerNorm in clusters: a 2-row ring (one row ahead) with 3 of its 4 chunks held
      (benchmarks/results/norms_forward_hold_2026-11-30_layer_norm.json, GPU time): 65536 3.71 -> 3.86, 131072
      3.52 -> 3.70; at 262144 (8 CTAs per row; 3 held spill) the 2-row ring alone, 3.35 -> 3.52; one CTA per row
      (32768) 3.84 -> 3.89. Not measured for float32 LayerNorm, RMSNorm or softmax (they keep 3 rows).
    - 8 CTAs per row (LayerNorm and RMSNorm bf16 262144, f32 131072): ``keep_weights``, no chunks held
      (benchmarks/results/norms_forward_staged_2026-11-30_keep_team.json, GPU time): LayerNorm 3.64 -> 3.97 and
      3.71 -> 3.95, RMSNorm 3.77 -> 3.95 and 3.89 -> 4.00. At 4 CTAs per row and fewer, kept weights measured the
      same or up to 3% slower than the shapes above.
    - float32 LayerNorm takes the 16-bit rule, a 2-row ring with 3 of 4 chunks held up to 4 CTAs per row
      (..._2026-11-30_confirm.json): 32768 3.88 -> 3.98, 65536 3.81 -> 3.91 and 3.78 -> 3.89 in two runs.
    - Rows over more CTAs than a cluster holds at 64 KB each (9-32: float32 262144, the fused add's 2 MB rows;
      softmax from 9, its 1 MB rows no longer in a single-row ring; timed at 16): a team (lag 1, 3 rows), whose
      CTAs exchange their pairs through global memory. f32 262144:
      LayerNorm 2.87 -> 3.78, RMSNorm 3.42 -> 3.93, the fused add (32 CTAs of 2 chunks per source) 3.14 -> 4.05,
      softmax 3.52 (8 CTAs, a single-row ring) -> 3.93. With the weights kept (..._confirm.json): LayerNorm f32
      262144 3.72 -> 3.91, f32 524288 3.49 -> 3.96; RMSNorm f32 524288 3.64 -> 3.94, bf16 524288 3.87 -> 3.92; not
      16-bit LayerNorm (24 bytes spill: 3.57 -> 3.14). Longer rows: the register kernel.
    - 16-bit LayerNorm at 3-4 ring rows of 64 KB (bf16 131072): two 512-thread CTAs per SM (``blocks_per_sm``),
      clusters of 8 x 4 chunks, a 2-row ring, weights kept (norms_forward_staged_2026-12-01_session26_*.json, three
      runs: 3.81, 3.85, 3.80 against the 1024-thread cluster of 4 with 3 chunks held, 3.75, 3.77, 3.76): one CTA's
      block barriers and output no longer stall its SM. The same shape for float32 65536 measured level (3.92, 3.88
      against 3.90, 3.91), softmax bf16 32768 and 65536 level or slower (3.61-3.80 against 3.75-3.81): not taken.
    - One CTA per row, rows claimed (``claim_rows``: each CTA takes its next row from a counter, so CTAs that move
      their bytes faster take more rows; benchmarks/results/norms_forward_staged_2026-12-01_session27_claims.json,
      GPU time, 5 interleaved rounds): 16-bit softmax and LayerNorm at 32768 in two 512-thread CTAs per SM, each a
      single-row ring of 64 KB (softmax 3.96 against the strided 2-row ring's 3.76, strided in the same shape 3.74;
      LayerNorm 3.95 against 3.89); RMSNorm bf16 32768 keeps its 3-row ring, now claimed (4.06 against 3.94);
      16-bit softmax at 2 ring rows (65536) in one 1024-thread CTA per row, a single-row ring of 128 KB, claimed
      (3.90 against the cluster of 2's 3.72). Claims lost in 2-row rings (softmax 3.63 against 3.77, LayerNorm 3.80
      against 3.91), and for LayerNorm bf16 65536 and float32 32768 in one 128 KB CTA (3.69 and 3.90 against the
      clusters' 3.90 and 3.95). Clusters at lag 0 claim too (rank 0 claims and pushes the row with its pairs;
      ..._session27_claims_clusters.json): RMSNorm bf16 65536/131072/262144 4.06/3.94/4.01 against 3.93/3.83/3.77,
      f32 65536/131072 3.94/4.07 against 3.91/3.83; softmax bf16 131072 4.04 against 3.90, f32 65536/131072
      4.10/4.13 against 3.92/3.79. The claim loop takes a few registers more: LayerNorm's 2-row rings with 3 chunks
      held spill (16-40 bytes at 64 registers) and lost (bf16 65536 3.51 against 3.88, f32 65536 3.71 against
      3.89), so its clusters of 2-4 claim in spill-free shapes (..._session27_claims_layer_norm.json): weights kept,
      bf16 65536 3.99 against 3.92, f32 65536 4.08 against 3.91; float32 at 2 CTAs with 2 chunks held, f32 32768
      4.14 against 3.97. LayerNorm's clusters of 8, keeping weights, gained even while spilling 16 bytes (bf16
      131072/262144 3.99/4.00 against 3.85/3.69, f32 131072 4.09 against 3.78); one register per rank's count was
      the excess: where every CTA holds N / 8 elements (``equal_shares``, N a multiple of 8 x threads x vec) one
      count serves all and they claim without spills (session 29), elsewhere their rows stay strided. Not claimed:
      16-bit softmax at 8 CTAs (24 bytes spill: 2.71 against 3.90). The persistent
      grid's size alone moved softmax bf16 32768 between 3.40 and 3.87 (96-132 CTAs, not monotonic:
      ..._session27_grid.json): CTAs given equal shares of the rows wait for the slowest.
    """
    if kind not in FORWARD_KINDS:
        raise ValueError(f"kind: expected one of {FORWARD_KINDS}, got {kind!r}")
    if n < STAGED_FORWARD_MIN_N[dtype] or (dtype == "f32" and n < 65536 and kind in ("fused", "softmax")):
        return None
    sources = 2 if kind == "fused" else 1
    share = _FORWARD_STAGE_BYTES // (sources * _STAGED_THREADS * 16)  # chunks per source of a 64 KB ring row
    row_bytes = sources * n * (4 if dtype == "f32" else 2)
    ctas = -(-row_bytes // _FORWARD_STAGE_BYTES)
    hold = share if kind in ("rms", "softmax") else 0  # every chunk
    # from 8 CTAs per row, the weights kept instead of chunks held (not in 16-bit LayerNorm teams: 24 bytes spill)
    keep = kind in ("layer", "rms") and ctas > 4 and not (kind == "layer" and dtype != "f32" and ctas > 8)
    if ctas == 1 and kind in ("layer", "softmax"):  # two 512-thread CTAs per SM in single-row rings, rows claimed
        return ForwardShape(_STAGED_THREADS // 2, 2 * share, 0, 1, 0, blocks_per_sm=2, claim_rows=True)
    if ctas == 2 and kind == "softmax":  # one CTA per row, a single-row ring of 128 KB, rows claimed
        return ForwardShape(_STAGED_THREADS, 2 * share, 0, 1, 0, claim_rows=True)
    if kind == "layer" and dtype != "f32" and 2 < ctas <= 4:  # clusters of 8 x 512 threads, 2 per SM, weights kept
        claim = shares_equal(n, dtype, _STAGED_THREADS // 2, 8)  # rows claimed where one count fits all (no spill)
        return ForwardShape(_STAGED_THREADS // 2, share, 0, 2, 0, True, blocks_per_sm=2, claim_rows=claim)
    if kind == "layer" and ctas <= 4:  # clusters claiming rows in 2-row rings, weights kept (f32 at 2: 2 chunks held)
        two = dtype == "f32" and ctas == 2
        return ForwardShape(_STAGED_THREADS, share, 0, 2, 2 if two else 0, not two, claim_rows=True)
    if kind == "layer" and ctas <= 8:  # clusters of 8 in a 2-row ring, weights kept, rows claimed as above
        claim = shares_equal(n, dtype, _STAGED_THREADS, 8)
        return ForwardShape(_STAGED_THREADS, share, 0, 2, 0, keep, claim_rows=claim)
    if ctas == 1:  # RMSNorm: a 3-row ring, every chunk held, rows claimed
        return ForwardShape(_STAGED_THREADS, share, 0, 3, hold, claim_rows=True)
    if kind == "softmax" and dtype == "f32" and n == 65536:
        return ForwardShape(_STAGED_THREADS // 2, 2 * share, 0, 3, 2 * share, claim_rows=True)
    if ctas <= 8:
        if sources == 2:
            return ForwardShape(_STAGED_THREADS, share, 1, 3, 0)
        # RMSNorm and softmax clusters claim their rows (not 16-bit softmax past 4 CTAs: 24 bytes spill, 2.7 TB/s)
        claim = kind == "rms" or dtype == "f32" or ctas <= 4
        return ForwardShape(_STAGED_THREADS, share, 0, 3, 0 if keep else hold, keep, claim_rows=claim)
    if ctas <= 16 and kind == "fused":  # 1 MB rows: 8 CTAs of 128 KB, a single-row ring
        return ForwardShape(_STAGED_THREADS, 2 * share, 0, 1, 0)
    if ctas <= MAX_FORWARD_TEAM:
        return ForwardShape(_STAGED_THREADS, share, 1, 3, 0, keep, team=True)
    return None


@functools.lru_cache(maxsize=1024)
def routed_staged_forward_config(n: int, dtype: str, kind: str) -> StagedForwardConfig | None:
    """The staged forward's config for ``kind`` (see :func:`forward_shape`) where it is taken by default, else None
    (the register kernel). Cached: it runs on every call of the forwards (~3 us of host time each otherwise)."""
    shape = forward_shape(n, dtype, kind)
    if shape is None:
        return None
    return staged_forward_config(n, dtype, kind == "fused", **shape._asdict())


@dataclass(frozen=True)
class LoopedForwardConfig:
    """The looped forward (:func:`flydsl.kernels.normalization.norm_forward_looped_kernel`): one CTA per row walks
    it in segments of ``row.chunks`` chunks per thread (a dynamic loop: one segment's registers, whatever N, so the
    SMs hold as many CTAs as threads allow) and reads it twice, once for the statistics and once for the output, the
    second time from L1 or L2 (torch.compile's looped reductions). ``row.hints``: the first read's cache hints,
    ``reread`` the second's; ``blocks_per_sm``: CTAs per SM that ptxas must fit (it caps the registers; 0: its
    choice); ``static_n``: the row length compiled into the kernel (0: read from the tensor at run time), as
    torch.compile's reductions are specialized: the segment loop, the column masks and 1/N fold into constants, the
    registers of the loop's pointers and bounds are freed (float32 8192 at 512 x 4: RMSNorm 34 registers instead of
    45, LayerNorm 44 instead of 62), so that more CTAs fit per SM; one kernel per N, launched only on rows of it."""

    row: RowConfig
    reread: CacheHints = PLAIN_HINTS
    blocks_per_sm: int = 0
    static_n: int = 0

    def __post_init__(self):
        if self.row.cluster != 1 or self.row.rows_per_cta != 1:
            raise ValueError(f"LoopedForwardConfig: one CTA per row, one row per CTA; got {self.row}")
        if self.static_n < 0:
            raise ValueError(f"LoopedForwardConfig: static_n must be >= 0 (0: N read at run time), got {self.static_n}")
        if not 0 <= self.blocks_per_sm * self.row.block <= 2048:
            raise ValueError(f"LoopedForwardConfig: {self.blocks_per_sm} CTAs of {self.row.block} exceed an SM")


@functools.lru_cache(maxsize=1024)
def looped_forward_config(
    n: int,
    dtype: str,
    threads: int,
    chunks: int,
    first: CacheHints = PLAIN_HINTS,
    reread: CacheHints = PLAIN_HINTS,
    blocks_per_sm: int = 0,
    store_group: int = 0,
    static_n: bool = False,
) -> LoopedForwardConfig:
    """The looped forward's config for rows of ``n`` elements of ``dtype``: CTAs of ``threads`` threads (a power of
    two, at least a warp), ``chunks`` 16-byte chunks per thread per segment; ``first`` / ``reread``: the cache
    hints of the two reads (and of the output's stores: ``first.out``); ``blocks_per_sm``: see
    :class:`LoopedForwardConfig`; ``store_group``: output chunks whose loads (x again, weights) are issued before
    their stores (:func:`flydsl.kernels.reduction.store_row`; 0: ``min(chunks, 4)``: all 8 chunks' at once spilled
    108 bytes at 1024 threads x 8 float32 chunks); ``static_n``: compile ``n`` into the kernel
    (:attr:`LoopedForwardConfig.static_n`)."""
    vec = 16 // element_bytes(dtype)
    if threads < 32:
        raise ValueError(f"looped_forward_config: threads must be a power of two >= 32, got {threads}")
    group = store_group or min(chunks, 4)
    row = RowConfig(dtype, vec, chunks, threads, 1, 1, n % vec == 0, hints=first, store_group=group)
    return LoopedForwardConfig(row, reread, blocks_per_sm, n if static_n else 0)


# The register norm forwards' RowConfig.store_group per dtype: output chunks whose weight (and bias) loads are issued
# before their stores (one at a time, each chunk's loads wait for the previous chunk's store: no compiler moves a
# load past a store that may alias it). H200, GPU time, two runs (benchmarks/results/norms_forward_store_group_*.json):
# 16-bit LayerNorm 16384 (512 x 4 chunks) 4.08-4.09 TB/s at 2 against 4.03-4.04 at 1, 4096 and 8192 +0.2-0.7%,
# RMSNorm and the fused add within 0.5%; 4 spent registers (LayerNorm bf16 16384: 74, 2.70). float32 16384 fell from
# 4.13-4.14 to 3.83-3.85 at 2: 1. (norms_bench.py --forward-store-group tries others.)
FORWARD_STORE_GROUP = {"f32": 1, "f16": 2, "bf16": 2}
# The looped forward's reads as torch.compile's looped reductions hint them: the first keeps x (and the weight) in
# L1/L2 for the second, which evicts it first.
_LOOPED_HINTS = (CacheHints(rows="evict_last", vectors="evict_last"), CacheHints(rows="evict_first"))
# The rows that take the looped forward, per (kind, dtype): (min N, max N, threads, chunks per segment[, first
# read's hints, second read's hints]) ranges, the first that holds N wins; elsewhere the staged or the register
# kernel. H200, GPU time, two runs of norms_bench.py --forward-looped at f514969
# (benchmarks/results/norms_forward_looped_2026-12-01*.json): one or two segments of at least 32 bytes per thread
# (the fused add's two sources count twice) ran 2-6% over the register and staged kernels there, at
# torch.compile's 4.2-4.3 TB/s: fused add f32 2048 4.27 (register 4.16), 4096-16384 4.20-4.26 (4.07-4.10), bf16
# 4096-16384 4.18-4.26 (4.08-4.10), 32768 4.21 (staged 3.98); RMSNorm f32 4096 4.30 (4.15), 16384 4.25 (4.12),
# bf16 8192 4.21 (4.07), 32768 4.13 (staged 3.96); a third run (_layer_norm.json at 4405306): RMSNorm f32 2048
# and bf16 4096 in 256 x 2, 4.28/4.27 (4.14/4.11). Elsewhere it measured slower or level: rows over 2 segments
# (float32 32768: 3.5 against 4.0; 1024 x 4, 45 registers: 3.98 against 4.00), 16 bytes per thread (RMSNorm f32
# 2048 at 512 x 1: 3.28), segments longer than the row (idle threads), and LayerNorm (per-thread merged moments:
# 2.6-4.1 against 4.1-4.2; three passes: within 1% at f32 4096/8192, 10-40% slower elsewhere; since session 24 one
# reduction of Chan-merged (count, sum, M2) and two reads, as torch.compile's LayerNorm: timed below).
# Rows of 64-128 KB in one segment of 8 chunks (2026-12-01, ..._2026-12-01_session24_looped32k.json, GPU time): the
# output's loads grouped 4 chunks at a time before their stores (RowConfig.store_group; before, each chunk's weight
# load waited for the previous chunk's store), 50 registers at 1024 x 8 float32, one CTA per SM, so 132 rows of
# 128 KB in flight re-read from L2 as torch.compile's 32-warp kernel (54 registers) does: RMSNorm f32 32768 4.26
# (staged 3.99; torch.compile 4.26), the fused add f32 32768 4.24 (4.00), 16384 in 1024 x 4 4.28 (1024 x 1: 4.21),
# RMSNorm bf16 32768 in 512 x 8 4.22 (1024 x 2: 4.05). Two CTAs per SM there (30-34 registers) ran 3.5-3.6. The
# fused add f32 1024 in 256 threads, two runs (..._session24_chunkwise.json, ..._fused1024.json): 4.30-4.31 against
# the register kernel's 4.09-4.10 (torch.compile 4.21-4.22); from 769 (3/4 of the threads busy), not timed below.
# float32 LayerNorm (session 25; one reduction of Chan-merged (count, sum, M2) and two reads, as torch.compile's;
# ..._layer_norm_looped_2026-12-01_session25.json, ..._layer_norm_f32_looped_2026-12-01_session25.json, GPU time):
# 3072 in 128 x 4 4.26 against the register kernel's 4.13, 4096 in 256 x 2 4.25 and 4.23 against 4.16 and 4.15
# in two runs (torch.compile 4.30), 6144 4.04 against 3.86; without the hints 3.55-3.98. 16-bit LayerNorm and
# float32 2048, 8192, 16384 stayed in the register kernel (looped 0.5-4.05 against 4.09-4.21) until session 28.
# Session 28 (..._looped_static_n_2026-12-01_session28.json, GPU time, torch.compile and Liger-Kernel in the same
# run): the N compiled in (static_n, the last field; torch.compile's kernels are specialized so: ncu showed its
# RMSNorm f32 8192 in 512 threads, 40 registers, 3 CTAs per SM, x read twice) frees the registers of the segment
# loop: RMSNorm f32 8192 in 512 x 4 4.29 (register kernel 4.24, torch.compile 4.30, Liger 4.21; dynamic N 4.20),
# LayerNorm f32 8192 in 512 x 4 at 3 CTAs per SM 4.29 (4.21, 4.27, 4.21; dynamic N 1.96, spilling); LayerNorm f32
# 2048 in 128 x 4 4.30 (4.12, Liger 4.23). Elsewhere level (RMSNorm f32 2048/4096/16384) or slower (LayerNorm f32
# 4096 in 256 x 2: 4.18 static, 4.27 dynamic). Routed from the N timed down to 7/8 of its segment (RMSNorm f32
# 7169-8192, LayerNorm f32 1793-2048), except LayerNorm f32 with N compiled in: 8192 only, its masked rows spill at
# 3 CTAs per SM (7176: 36 bytes).
LOOPED_FORWARD: dict = {
    ("fused", "f32"): [(769, 1024, 256, 1, *_LOOPED_HINTS), (1025, 2048, 512, 1, *_LOOPED_HINTS)]
    + [(2049, 8192, 1024, 1, *_LOOPED_HINTS)]
    + [(8193, 16384, 1024, 4, *_LOOPED_HINTS), (16385, 32768, 1024, 8, *_LOOPED_HINTS)],
    ("fused", "bf16"): [(2049, 4096, 512, 1, *_LOOPED_HINTS), (4097, 16384, 512, 2, *_LOOPED_HINTS)]
    + [(16385, 32768, 1024, 2, *_LOOPED_HINTS)],
    ("rms", "f32"): [(1025, 2048, 256, 2, *_LOOPED_HINTS), (2049, 4096, 512, 2, *_LOOPED_HINTS)]
    + [(7169, 8192, 512, 4, *_LOOPED_HINTS, 0, 0, True)]
    + [(8193, 16384, 1024, 2, *_LOOPED_HINTS), (16385, 32768, 1024, 8, *_LOOPED_HINTS)],
    ("rms", "bf16"): [(2049, 4096, 256, 2, *_LOOPED_HINTS), (4097, 8192, 512, 2, *_LOOPED_HINTS)]
    + [(16385, 32768, 512, 8, *_LOOPED_HINTS)],
    ("layer", "f32"): [(1793, 3072, 128, 4, *_LOOPED_HINTS), (3073, 6144, 256, 2, *_LOOPED_HINTS)]
    + [(8192, 8192, 512, 4, *_LOOPED_HINTS, 3, 0, True)],
}
LOOPED_FORWARD.update({(kind, "f16"): LOOPED_FORWARD[kind, "bf16"] for kind in ("fused", "rms")})  # (not timed)


def looped_forward_shape(n: int, dtype: str, kind: str) -> tuple | None:
    """``(threads, chunks[, first, reread[, blocks_per_sm[, store_group[, static_n]]]])``
    (:func:`looped_forward_config`'s arguments after
    ``dtype``) of the looped forward for ``kind`` rows of ``n`` ``dtype`` elements where :data:`LOOPED_FORWARD`
    routes them, else None."""
    if n % (16 // element_bytes(dtype)):  # (measured on whole 16-byte chunks, whose accesses take the hints)
        return None
    for low, high, *shape in LOOPED_FORWARD.get((kind, dtype), ()):
        if low <= n <= high:
            return tuple(shape)
    return None


# Softmax's backward through the staged kernel from these N on: the register kernel is at copy speed below (float32
# 8192-65536: 4.19-4.38 TB/s against the staged kernel's 4.08-4.22), under the bar from here.
SOFTMAX_BACKWARD_STAGED_MIN_N = {"bf16": 8192, "f16": 8192, "f32": 131072}


def softmax_backward_shape(n: int, dtype: str) -> ForwardShape | None:
    """The shape of the staged kernel that softmax's backward takes (its ring holds dy and y: two sources, as the
    fused add's), or None where the register kernel stays. 1024-thread CTAs with a 64 KB ring row (2 chunks per
    source): one CTA per row in a 2-row ring, lag 0 (bf16 8192 too, half its chunks past N: 4.16-4.20 TB/s against
    3.81-3.92 for one chunk per thread or 3 rows); 4 CTAs' worth (bf16 65536): 8 CTAs of one chunk per source,
    lag 0, 4 rows (4.23 against 4.02-4.08, three runs); other clusters of 2-8: lag 1 in 3 rows (no room for lag 0
    with two rows ahead); longer rows a team (lag 1, 3 rows; 1 MB rows 4.22-4.28 as a team of 16 against 4.02-4.09
    in a single-row ring of 8 CTAs). H200, GPU time, copy 4.2
    (benchmarks/results/softmax_backward_staged_2026-12-01*.json): bf16 8192-262144 3.49-3.57, 3.55, 3.33, 3.35,
    2.95, 3.33 TB/s (register kernel) -> 4.16, 4.06, 4.04, 4.23, 4.15, 4.22; float32 131072, 262144 3.46, 3.40 ->
    4.28, 4.29."""
    if n < SOFTMAX_BACKWARD_STAGED_MIN_N[dtype]:
        return None
    share = _FORWARD_STAGE_BYTES // (2 * _STAGED_THREADS * 16)
    ctas = -(-2 * n * (4 if dtype == "f32" else 2) // _FORWARD_STAGE_BYTES)
    if ctas == 1:
        return ForwardShape(_STAGED_THREADS, share, 0, 2, 0)
    if ctas == 4:
        return ForwardShape(_STAGED_THREADS, share // 2, 0, 4, 0)
    if ctas <= 8:
        return ForwardShape(_STAGED_THREADS, share, 1, 3, 0)
    if ctas <= MAX_FORWARD_TEAM:
        return ForwardShape(_STAGED_THREADS, share, 1, 3, 0, team=True)
    return None


def softmax_backward_staged_config(n: int, dtype: str, shape: ForwardShape | None = None) -> StagedForwardConfig | None:
    """The staged config of softmax's backward for ``shape`` (default :func:`softmax_backward_shape`), or None.
    ``residual=True``: two sources in the ring (dy and y)."""
    shape = shape or softmax_backward_shape(n, dtype)
    if shape is None:
        return None
    return staged_forward_config(n, dtype, True, **shape._asdict())
