"""The row kernels' configurations: which variant a kernel is compiled for (:class:`NormFlags`,
:class:`SoftmaxFlags`, :class:`SoftmaxBackwardFlags`), and the configurations of the looped forward
(:class:`LoopedForwardConfig`), the staged forward (:class:`StagedForwardConfig`) and the norms' backward
(:class:`BackwardConfig`), each built from a small shape (:class:`LoopedShape`, :class:`StagedForwardShape`,
:class:`StagedBackwardShape`, :class:`TeamShape`) by a builder that says None where the shape does not fit N. Which
shape runs for an input is the router's business (:mod:`flydsl.kernels.rows.router`); why each shape, the tuning
note's (docs/tuning/norms.md).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

from flydsl.kernels.rows.layout import PLAIN_HINTS, CacheHints, RowConfig, row_config
from flydsl.kernels.validation import element_bytes

__all__ = [
    "NormFlags",
    "SoftmaxFlags",
    "SoftmaxBackwardFlags",
    "LoopedShape",
    "LoopedForwardConfig",
    "looped_forward_config",
    "StagedForwardShape",
    "StagedForwardConfig",
    "staged_forward_config",
    "shares_equal",
    "BackwardConfig",
    "StagedBackwardShape",
    "TeamShape",
    "staged_backward_config",
    "team_backward_config",
    "make_backward_config",
    "STAGED_THREADS",
    "FORWARD_STAGE_BYTES",
    "MAX_FORWARD_TEAM",
    "MAX_BACKWARD_TEAM",
]


# --- variants -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NormFlags:
    """Which variant a norm kernel is compiled for (tensors that do not exist are passed as a placeholder that the
    kernel never touches)."""

    rms: bool
    residual: bool = False  # fused add: x + residual, written to residual_out, then normalized
    weight: bool = False
    bias: bool = False
    mean: bool = False  # write the mean (LayerNorm)
    rstd: bool = False  # write rstd


@dataclass(frozen=True, kw_only=True)
class _NoVectors:
    """The :class:`NormFlags` fields the staged forward reads, all off: no residual, weight, bias nor statistics."""

    residual: bool = False
    weight: bool = False
    bias: bool = False
    mean: bool = False
    rstd: bool = False


@dataclass(frozen=True, kw_only=True)
class SoftmaxFlags(_NoVectors):
    """The staged forward's softmax variant."""


@dataclass(frozen=True, kw_only=True)
class SoftmaxBackwardFlags(_NoVectors):
    """The staged forward kernel run as softmax's backward (``dx = y * (dy - sum(dy * y))``): its ring holds dy and
    y (two sources, as the fused add's x and residual), its row statistic is ``sum(dy * y)``, summed over the row's
    CTAs as RMSNorm's sum of squares."""


# --- the looped forward ---------------------------------------------------------------------------------------------


class LoopedShape(NamedTuple):
    """A looped forward's shape (see :func:`looped_forward_config`)."""

    threads: int
    chunks: int  # per thread and segment
    first: CacheHints = PLAIN_HINTS  # the first read's hints (and the output's stores': first.out)
    reread: CacheHints = PLAIN_HINTS  # the second read's
    blocks_per_sm: int = 0
    store_group: int = 0  # 0: min(chunks, 4)
    static_n: bool = False


@dataclass(frozen=True, kw_only=True)
class LoopedForwardConfig:
    """The looped forward: one CTA per row walks it in segments of ``row.chunks`` chunks per thread (a dynamic loop:
    one segment's registers whatever N) and reads it twice, for the statistics and for the output, the second time
    from L1 or L2. ``row.hints``: the first read's cache hints, ``reread`` the second's; ``blocks_per_sm``: CTAs per
    SM that ptxas must fit (0: its choice); ``static_n``: the row length compiled in (0: read at run time), which
    folds the segment loop, masks and 1/N into constants; one kernel per N, launched only on rows of it."""

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
def looped_forward_config(n: int, dtype: str, shape: LoopedShape) -> LoopedForwardConfig:
    """The looped forward's config for rows of ``n`` elements of ``dtype``: CTAs of ``shape.threads`` threads (a
    power of two, at least a warp), ``shape.chunks`` 16-byte chunks per thread per segment; ``store_group``: output
    chunks whose loads (x again, weights) are issued before their stores (0: ``min(chunks, 4)``: all 8 chunks' at
    once spilled); ``static_n``: compile ``n`` into the kernel."""
    vec = 16 // element_bytes(dtype)
    if shape.threads < 32:
        raise ValueError(f"looped_forward_config: threads must be a power of two >= 32, got {shape.threads}")
    group = shape.store_group or min(shape.chunks, 4)
    row = RowConfig(
        dtype=dtype,
        vec=vec,
        chunks=shape.chunks,
        threads_per_row=shape.threads,
        rows_per_cta=1,
        cluster=1,
        even=n % vec == 0,
        hints=shape.first,
        store_group=group,
    )
    return LoopedForwardConfig(
        row=row, reread=shape.reread, blocks_per_sm=shape.blocks_per_sm, static_n=n if shape.static_n else 0
    )


# --- the staged forward ---------------------------------------------------------------------------------------------

STAGED_THREADS = 1024  # the staged kernels' CTA by default: one per SM (the ring takes most of the shared memory)
RING_BYTES = 200 * 1024  # shared memory a ring may take (every CTA on the SM)
MAX_STAGES = 4  # ring depth by default
FORWARD_STAGE_BYTES = 64 * 1024  # a ring row of one source per CTA by default: 1024 threads x 4 chunks
MAX_FORWARD_TEAM = 32  # one rank per lane of the warp that combines a team's pairs


class StagedForwardShape(NamedTuple):
    """A staged forward's shape (see :func:`staged_forward_config` and :class:`StagedForwardConfig`)."""

    threads: int = STAGED_THREADS
    chunks: int | None = None  # per source; None: a ring row of FORWARD_STAGE_BYTES per CTA
    lag: int = 1
    stages: int | None = None  # None: as many as RING_BYTES hold, at most MAX_STAGES
    hold: int | bool = 0  # chunks held in registers (True: all)
    keep_weights: bool = False
    team: bool = False
    blocks_per_sm: int = 1
    claim_rows: bool = False


DEFAULT_FORWARD_SHAPE = StagedForwardShape()


@dataclass(frozen=True, kw_only=True)
class StagedForwardConfig:
    """The staged forward: a persistent grid whose CTA groups (a CTA, a cluster of up to 8, or a team of consecutive
    CTAs) walk rows through a shared-memory ring of ``stages`` rows of ``sources`` row tensors (x, and the fused
    add's residual), the output written ``lag`` rows after a row's pairs are pushed (clusters). ``hold`` (lag 0):
    each thread keeps its first ``hold`` chunks of a row in registers as float32 from the first pass to the output
    (softmax keeps their exps). ``keep_weights``: the weight and bias chunks loaded once, before the first row, kept
    in their dtype. ``claim_rows`` (one CTA per row, or a cluster at lag 0): each group claims its next rows from a
    counter in global memory, so that groups on faster SMs take more rows. ``equal_shares`` (a cluster whose CTAs
    each hold N / cluster elements: N a multiple of ``cluster x threads x vec``): LayerNorm combines its pairs with
    one count; the kernel traps on an N that is not such a multiple."""

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


@functools.lru_cache(maxsize=1024)
def staged_forward_config(
    n: int, dtype: str, shape: StagedForwardShape = DEFAULT_FORWARD_SHAPE, *, residual: bool = False
) -> StagedForwardConfig | None:
    """The staged forward config of ``shape`` for rows of ``n`` elements of ``dtype`` (``residual``: the fused add,
    or softmax's backward: two sources in the ring): as few CTAs per row as hold it (a cluster of up to 8; a team of
    up to :data:`MAX_FORWARD_TEAM` with ``shape.team``, a team past 8 CTAs only then). The ring holds rows ``k - lag
    .. k + ahead`` (``ahead = stages - 1 - lag``), at least one row ahead, except a ring of a single row (lag 0),
    whose next row is copied in once this row's output is written. None when N is not a multiple of 16 bytes, the
    row needs more CTAs than the shape allows, the ring does not fit :data:`RING_BYTES` or is too small for the
    pipeline, ``blocks_per_sm`` CTAs exceed an SM's 2048 threads, or ``hold`` / ``claim_rows`` meet a lag or a
    team."""
    threads, chunks, lag, stages, hold, keep_weights, team, blocks_per_sm, claim_rows = shape
    if not isinstance(blocks_per_sm, int) or isinstance(blocks_per_sm, bool) or blocks_per_sm < 1:
        raise ValueError(
            f"staged_forward_config blocks_per_sm: expected a positive int (CTAs per SM), got {blocks_per_sm!r}"
        )
    vec = 16 // element_bytes(dtype)
    sources = 2 if residual else 1
    if chunks is None:
        chunks = max(1, FORWARD_STAGE_BYTES // (sources * threads * 16))
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
    stages = stages or min(MAX_STAGES, RING_BYTES // (blocks_per_sm * stage_bytes))
    single = stages == 1 and lag == 0
    ring_bytes = blocks_per_sm * stages * stage_bytes  # every CTA on the SM
    if stages < 1 or ring_bytes > RING_BYTES or not (single or stages >= lag + 2) or blocks_per_sm * threads > 2048:
        return None
    layout = RowConfig(
        dtype=dtype,
        vec=vec,
        chunks=chunks,
        threads_per_row=threads,
        rows_per_cta=1,
        cluster=cluster,
        even=True,
        team=in_team,
    )
    held = (chunks if hold else 0) if isinstance(hold, bool) else hold
    if not isinstance(held, int) or not 0 <= held <= chunks:
        raise ValueError(f"staged_forward_config hold: expected 0..{chunks} chunks (or True: all), got {hold!r}")
    if ((held or claim_rows) and lag and cluster > 1) or (claim_rows and in_team):
        return None
    return StagedForwardConfig(
        row=layout,
        stages=stages,
        sources=sources,
        lag=lag,
        blocks_per_sm=blocks_per_sm,
        hold=held,
        keep_weights=bool(keep_weights),
        claim_rows=bool(claim_rows),
        equal_shares=cluster > 1 and not in_team and shares_equal(n, dtype, threads, cluster),
    )


def shares_equal(n: int, dtype: str, threads: int, cluster: int) -> bool:
    """Whether every CTA of a cluster of ``cluster`` CTAs of ``threads`` threads holds N / cluster elements of a row
    of ``n`` (its 16-byte chunks go round the ranks ``threads`` at a time: N a multiple of ``cluster x threads x
    vec``)."""
    return n % (cluster * threads * (16 // element_bytes(dtype))) == 0


# --- the backward ---------------------------------------------------------------------------------------------------

BACKWARD_THREADS = 256  # the register backward's CTA: short rows share one, longer ones span clusters of them
_SMEM_BYTES = 200 * 1024  # shared memory per SM the register backward's column sums may take (of 227 KB)
MAX_BACKWARD_TEAM = 64  # CTAs per row of a backward team: at least two teams on 132 SMs


@dataclass(frozen=True, kw_only=True)
class BackwardConfig:
    """How the norms' backward maps rows onto threads: ``row`` (the thread layout), ``segment`` (chunks held in
    registers at once: with more per thread, the row is walked twice, the second time from L2), ``sums`` (column
    sums kept: 0, 1 = dweight, 2 = dweight and dbias), ``smem_sums`` (they live in shared memory; else in the CTA's
    partial row in global memory), ``blocks_per_sm`` (the persistent grid's CTAs per SM). ``stages`` > 0: the
    staged kernel, rows through a shared-memory ring of that many rows. ``direct``: one CTA walks every row and
    writes dweight/dbias itself (no partial sums, no column-sum kernel: the plan's choice for a few rows)."""

    row: RowConfig
    segment: int
    sums: int
    smem_sums: bool
    blocks_per_sm: int
    stages: int = 0  # > 0: rows staged through a shared-memory ring of this many rows
    lag: int = 1  # clusters: rows between a row's push and its dx
    hold: bool = False  # staged, lag 0: g and x (- mean) held in registers from the first pass to dx
    keep_weights: bool = False  # staged: the weight's chunks loaded once, kept in registers in their dtype
    prefetch_pairs: bool = False  # a team at a lag: its row's pairs read a step early
    fma_dx: bool = False  # staged LayerNorm: xhat and dx from x by fmas, the mean folded in
    bulk: bool = False  # staged, a row over CTAs: one thread per CTA fills the ring by bulk copies
    direct: bool = False  # one CTA, dweight/dbias written by it: the register kernel's sums in shared memory only

    def __post_init__(self):
        if self.direct and not self.can_be_direct:
            raise ValueError(f"{self}: direct sums are one CTA's of the register kernel, kept in shared memory")
        if self.hold and (not self.staged or (self.lag and self.row.cluster > 1)):
            raise ValueError(f"{self}: hold keeps a row in registers until its dx: the staged kernel at lag 0 only")
        if (self.keep_weights or self.fma_dx) and not self.staged:
            raise ValueError(f"{self}: keep_weights and fma_dx are the staged kernel's")
        if self.bulk and (not self.staged or self.hold or self.row.cluster == 1 or self.row.block <= 32):
            raise ValueError(f"{self}: bulk fills the ring of a row over CTAs (a block barrier per row), not held")

    @property
    def can_be_direct(self) -> bool:
        """Whether ``direct`` may be set: the register kernel, one CTA per row group, column sums in shared memory."""
        return not self.staged and self.smem_sums and self.sums > 0 and self.row.cluster == 1

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


class StagedBackwardShape(NamedTuple):
    """A staged backward's shape for rows over at most a cluster (see :func:`staged_backward_config`)."""

    threads: int = STAGED_THREADS
    chunks: int = 2  # per source (dy, x)
    lag: int = 1
    stages: int | None = None  # None: as many as RING_BYTES hold, at most MAX_STAGES
    hold: bool = False
    keep_weights: bool = False
    fma_dx: bool = False


@functools.lru_cache(maxsize=1024)
def staged_backward_config(n: int, dtype: str, sums: int, shape: StagedBackwardShape) -> BackwardConfig | None:
    """The staged backward config of ``shape`` for rows of ``n`` elements: CTAs of ``shape.threads`` threads
    holding ``shape.chunks`` 16-byte chunks of a row each, as few CTAs per row (a cluster) as hold it. None when a row
    needs more than 8 CTAs, the ring would hold fewer than 2 rows (or too few for the lag), N is not a multiple of 16
    bytes, or ``hold`` meets a lag in a cluster."""
    threads, chunks, lag, stages, hold, keep_weights, fma_dx = shape
    vec = 16 // element_bytes(dtype)
    if n % vec:
        return None
    total = -(-n // vec)
    cluster = 1 << max(0, (-(-total // (threads * chunks)) - 1).bit_length())
    if cluster > 8:
        return None
    stage_bytes = 2 * threads * chunks * 16
    stages = stages or min(MAX_STAGES, RING_BYTES // stage_bytes)
    if stages < 2 or stages * stage_bytes > RING_BYTES or (cluster > 1 and stages < lag + 2):
        return None
    if hold and lag and cluster > 1:
        return None
    layout = RowConfig(
        dtype=dtype, vec=vec, chunks=chunks, threads_per_row=threads, rows_per_cta=1, cluster=cluster, even=True
    )
    return BackwardConfig(
        row=layout,
        segment=chunks,
        sums=sums,
        smem_sums=False,
        blocks_per_sm=1,
        stages=stages,
        lag=lag,
        hold=hold,
        keep_weights=keep_weights,
        fma_dx=fma_dx,
    )


class TeamShape(NamedTuple):
    """A backward team's shape (see :func:`team_backward_config`)."""

    threads: int
    chunks: int
    stages: int
    lag: int
    prefetch_pairs: bool
    fma_dx: bool
    bulk: bool
    hold: bool = False
    keep_weights: bool = True


@functools.lru_cache(maxsize=1024)
def team_backward_config(n: int, dtype: str, sums: int, shape: TeamShape, smallest: int = 9) -> BackwardConfig | None:
    """The staged backward for rows longer than a cluster holds: a team of as many CTAs as hold the row (``smallest``
    to :data:`MAX_BACKWARD_TEAM`), consecutive in the grid, exchanging their partial sums through global memory.
    None when N is not a multiple of 16 bytes, the row needs fewer than ``smallest`` (>= 2) or more than
    :data:`MAX_BACKWARD_TEAM` CTAs, the ring is too small for the lag or does not fit, or ``hold`` meets a lag;
    a ValueError for ``bulk`` with ``hold`` (:class:`BackwardConfig`)."""
    threads, chunks, stages, lag, prefetch_pairs, fma_dx, bulk, hold, keep_weights = shape
    vec = 16 // element_bytes(dtype)
    team = -(-n // (vec * threads * chunks))
    fits = max(2, smallest) <= team <= MAX_BACKWARD_TEAM and lag + 2 <= stages  # the ring holds rows k - lag .. k + 1
    if n % vec or not fits or stages * 2 * threads * chunks * 16 > RING_BYTES or (hold and lag):
        return None
    layout = RowConfig(
        dtype=dtype, vec=vec, chunks=chunks, threads_per_row=threads, rows_per_cta=1, cluster=team, even=True, team=True
    )
    return BackwardConfig(
        row=layout,
        segment=chunks,
        sums=sums,
        smem_sums=False,
        blocks_per_sm=1,
        stages=stages,
        lag=lag,
        hold=hold,
        keep_weights=keep_weights,
        prefetch_pairs=prefetch_pairs and lag > 0,
        fma_dx=fma_dx,
        bulk=bulk,
    )


def make_backward_config(
    n: int, dtype: str, sums: int, chunks: int, registers: int, cta_threads: int = BACKWARD_THREADS
) -> BackwardConfig:
    """A register backward config holding ``chunks`` 16-byte chunks per thread per tensor, in CTAs of
    ``cta_threads`` (several rows each for short rows, clusters of up to 8 for longer ones, then CTAs of up to 1024,
    then two passes per row), as many CTAs per SM as ``registers`` per thread and the column sums' shared memory
    allow."""
    vec = 16 // element_bytes(dtype)
    layout = row_config(n, dtype, held=32 // (chunks * vec), warp_block=BACKWARD_THREADS, cta_threads=cta_threads)
    if layout.cluster == 1 and layout.block < BACKWARD_THREADS:
        layout = dataclasses.replace(layout, rows_per_cta=BACKWARD_THREADS // layout.threads_per_row)
    if layout.chunks > chunks:  # two passes, over whole segments (a dynamic loop)
        layout = dataclasses.replace(layout, chunks=-(-layout.chunks // chunks) * chunks)
    blocks = max(1, 65536 // (registers * layout.block))
    sum_bytes = sums * layout.block * layout.chunks * layout.vec * 4
    while blocks > 1 and blocks * sum_bytes > _SMEM_BYTES:
        blocks -= 1
    return BackwardConfig(
        row=layout,
        segment=min(chunks, layout.chunks),
        sums=sums,
        smem_sums=sum_bytes <= _SMEM_BYTES,
        blocks_per_sm=blocks,
    )
