"""The thread layout of a row kernel: :class:`RowConfig` (how a row's 16-byte chunks map onto threads, CTAs and
clusters) and the configurations the register kernels take per N and dtype (:func:`row_config`,
:func:`forward_row_config`).

A row of N elements is cut into 16-byte chunks (``vec`` elements: 8 of a 16-bit type, 4 of float32).
``threads_per_row`` threads of a CTA, times ``cluster`` CTAs, share a row; each thread holds ``chunks`` chunks.
Chunk ``j`` of thread ``t`` in CTA ``r`` of the cluster is chunk ``(j * cluster + r) * threads_per_row + t`` of the
row: at every step consecutive threads read consecutive 16 bytes (coalesced), and a short row spreads evenly over
the CTAs. The regimes that follow from N:

* ``warp``: a row fits one warp or less (``threads_per_row <= 32``): several rows per CTA, shuffles only;
* ``block``: 64..1024 threads per row, one row per CTA (two at 64): shuffles, then shared memory;
* ``cluster``: a row split over 2, 4 or 8 CTAs of a cluster that reduce through distributed shared memory;
* ``team`` (``RowConfig.team``): a row over more CTAs than a cluster holds: consecutive CTAs of the grid that
  share their partials through global memory.

Tails are predicated: chunks past N are neither read nor written; when N is not a multiple of ``vec`` the
accesses are per element. A :class:`RowConfig` is hashable and passed as a ``Constexpr``: one binary per (dtype,
config), whatever the number of rows or the exact N within the config's range.
"""

from __future__ import annotations

import functools
import math as _pymath
from dataclasses import dataclass, replace

from flydsl.compiler import cache

__all__ = [
    "RowConfig",
    "CacheHints",
    "PLAIN_HINTS",
    "HINTS",
    "row_config",
    "forward_row_config",
    "MAX_CLUSTER",
    "MAX_TEAM",
    "ROW_BYTES",
]

MAX_CLUSTER = 8  # portable cluster size limit (16 needs cudaFuncAttributeNonPortableClusterSizeAllowed)
MAX_TEAM = 1024  # CTAs of a team (a row split over CTAs that are not a cluster)
MAX_THREADS = 1024
VALUES_PER_THREAD = 32  # float32 registers of row data per thread per tensor held (64 per thread at 1024 threads)
ROW_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
# A hint's cache qualifiers (fx.nvvm.ld_global / st_global): "stream" the .cs operator (evict first from L1 and L2),
# "evict_first" / "evict_last" the L1 priority and an L2 policy of that priority, "no_allocate" past L1.
HINTS = {
    "stream": {"cop": "cs"},
    "evict_first": {"l1": "evict_first", "policy": "evict_first"},
    "evict_last": {"l1": "evict_last", "policy": "evict_last"},
    "no_allocate": {"l1": "no_allocate"},
}


@dataclass(frozen=True, kw_only=True)
class CacheHints:
    """Cache hints on a row kernel's 16-byte global accesses (rows whose N is a multiple of 16 bytes; per-element
    tails stay plain): each None (a plain access) or one of ``"stream"``, ``"evict_first"``, ``"evict_last"``,
    ``"no_allocate"`` (see ``HINTS``). ``rows``: the row loads (:func:`load_row`), ``out``: the row stores
    (:func:`store_row`), ``vectors``: the weight and bias loads (:func:`load_vector_chunk`)."""

    rows: str | None = None
    out: str | None = None
    vectors: str | None = None

    def __post_init__(self):
        for name in ("rows", "out", "vectors"):
            hint = getattr(self, name)
            if hint is not None and hint not in HINTS:
                raise ValueError(f"CacheHints.{name}: expected one of {tuple(HINTS)} or None, got {hint!r}")
        if self.out == "evict_last" or self.out == "no_allocate":
            raise ValueError(f"CacheHints.out: stores take 'stream' or 'evict_first', got {self.out!r}")

    @classmethod
    def parse(cls, text: str) -> CacheHints:
        """``"rows=evict_first,out=stream"`` (the benchmarks' flag) as CacheHints; ``""`` or ``"none"``: none."""
        if text in ("", "none"):
            return PLAIN_HINTS
        fields = {}
        for item in text.split(","):
            name, _, hint = item.partition("=")
            if name not in ("rows", "out", "vectors") or not hint:
                raise ValueError(f"CacheHints.parse: expected rows=, out= or vectors= HINT items, got {item!r}")
            fields[name] = None if hint == "none" else hint
        return cls(**fields)


PLAIN_HINTS = CacheHints()  # every access plain: RowConfig's default (compared by identity on the launch path)


@dataclass(frozen=True, kw_only=True)
class RowConfig:
    """How a row kernel maps rows onto threads (see the module docstring). Validated when built."""

    dtype: str  # "f32", "f16" or "bf16": the row tensors' element type
    vec: int  # elements per 16-byte chunk
    chunks: int  # chunks per thread (kept in registers)
    threads_per_row: int  # threads of one CTA on a row (a power of two)
    rows_per_cta: int
    cluster: int  # CTAs per row (1, 2, 4 or 8; any count up to MAX_TEAM for a team)
    even: bool  # N % vec == 0: whole-chunk predicates, 16-byte accesses
    team: bool = False  # the row's CTAs are consecutive CTAs of the grid, not a cluster (they share through global)
    hints: CacheHints = PLAIN_HINTS  # cache hints of load_row / store_row / load_vector_chunk (plain by default)
    store_group: int = 1  # store_row: chunks computed (their loads issued) before their stores (see store_row)

    def __post_init__(self):
        if self.dtype not in ROW_BYTES or self.vec * ROW_BYTES[self.dtype] != 16:
            raise ValueError(f"RowConfig: vec={self.vec} is not 16 bytes of {self.dtype}")
        for name in ("threads_per_row",) if self.team else ("threads_per_row", "cluster"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"RowConfig: {name} must be a power of two, got {value}")
        limit = MAX_TEAM if self.team else MAX_CLUSTER
        if self.block > MAX_THREADS or not 1 <= self.cluster <= limit or self.chunks < 1:
            raise ValueError(f"RowConfig: {self} exceeds {MAX_THREADS} threads or {limit} CTAs per row")
        if self.cluster > 1 and self.rows_per_cta != 1:
            raise ValueError("RowConfig: a row split over a cluster must be the CTA's only row")
        if self.store_group < 1:
            raise ValueError(f"RowConfig: store_group must be >= 1, got {self.store_group}")

    @property
    def cluster_shape(self):
        """The launch's ``cluster=`` (None without a hardware cluster: one CTA per row, or a team)."""
        return (self.cluster, 1, 1) if self.cluster > 1 and not self.team else None

    @property
    def block(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // 32)

    @property
    def capacity(self) -> int:
        """The longest row this config handles."""
        return self.vec * self.chunks * self.threads_per_row * self.cluster

    @property
    def regime(self) -> str:
        if self.cluster > 1:
            return "team" if self.team else "cluster"
        return "warp" if self.threads_per_row <= 32 else "block"

    def grid(self, rows: int) -> int:
        return -(-rows // self.rows_per_cta) * self.cluster


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, _pymath.ceil(_pymath.log2(max(1, x))))


# Threads per CTA before a row is split over a cluster, and of each CTA of a cluster
# (docs/tuning/norms.md#register-forward-layouts).
CTA_THREADS = 512
# The register forwards: rows of one warp in one-warp CTAs, a row in one CTA of up to 1024 threads rather than a
# cluster (docs/tuning/norms.md#register-forward-layouts).
FORWARD_WARP_BLOCK = 32
FORWARD_CTA_THREADS = 1024
# Values per thread of the register forwards' rows of one tensor in one CTA over a warp wide: float32 8 (2 chunks),
# 16-bit 32 (docs/tuning/norms.md#register-forward-layouts).
FORWARD_BLOCK_VALUES = {"f32": 8, "f16": VALUES_PER_THREAD, "bf16": VALUES_PER_THREAD}
# Set at run time by benchmarks/norms_bench.py's tuning flags: keyed where they differ from these
# (flydsl.compiler.cache.package_key).
cache.declare_tunables(__name__, "CTA_THREADS", "FORWARD_WARP_BLOCK", "FORWARD_CTA_THREADS", "FORWARD_BLOCK_VALUES")
# Cache hints of the register forwards per dtype: plain, measured no faster (docs/tuning/norms.md#cache-hints).
FORWARD_CACHE_HINTS = {"f32": PLAIN_HINTS, "f16": PLAIN_HINTS, "bf16": PLAIN_HINTS}


@functools.lru_cache(maxsize=4096)
def row_config(n: int, dtype: str, held: int = 1, warp_block: int = 128, cta_threads: int | None = None) -> RowConfig:
    """The config for rows of ``n`` elements of ``dtype``, for a kernel that keeps ``held`` row tensors in registers
    (softmax and the norms forward: 1; backward: 4, it also keeps column sums). Picks the fewest threads that keep
    at most ``32 / held`` values per thread; beyond ``cta_threads`` (default :data:`CTA_THREADS`) threads the row is
    split over a cluster of up to 8 CTAs, growing the CTAs up to 1024 threads once 8 are not enough. Rows longer
    than that holds get more chunks per thread (correct, with register spills: slower)."""
    if n < 1:
        raise ValueError(f"row_config: N must be >= 1, got {n}")
    cta_threads = cta_threads or CTA_THREADS
    vec = 16 // ROW_BYTES[dtype]
    total_chunks = -(-n // vec)
    per_thread = max(1, VALUES_PER_THREAD // held // vec)
    threads = _pow2_at_least(-(-total_chunks // per_thread))
    even = n % vec == 0
    if threads <= 32:
        tpr = threads
        return RowConfig(
            dtype=dtype,
            vec=vec,
            chunks=-(-total_chunks // tpr),
            threads_per_row=tpr,
            rows_per_cta=max(1, warp_block // tpr),
            cluster=1,
            even=even,
        )
    if threads <= cta_threads:
        return RowConfig(
            dtype=dtype,
            vec=vec,
            chunks=-(-total_chunks // threads),
            threads_per_row=threads,
            rows_per_cta=1 if threads > 64 else 2,
            cluster=1,
            even=even,
        )
    tpr = min(MAX_THREADS, max(cta_threads, threads // MAX_CLUSTER))
    size = min(MAX_CLUSTER, threads // tpr)
    chunks = -(-total_chunks // (tpr * size))
    return RowConfig(dtype=dtype, vec=vec, chunks=chunks, threads_per_row=tpr, rows_per_cta=1, cluster=size, even=even)


def forward_row_config(n: int, dtype: str, held: int = 1, store_group: int = 1) -> RowConfig:
    """The register forwards' config: :func:`row_config`, but rows of one warp in CTAs of
    :data:`FORWARD_WARP_BLOCK` threads and a row in one CTA of up to :data:`FORWARD_CTA_THREADS` threads; a row that
    needs a cluster anyway is split as :func:`row_config` does (the constants are read at each call: the benchmarks'
    tuning flags override them). ``store_group``: :attr:`RowConfig.store_group` (at most the thread's chunks; rows
    in one CTA: clusters keep 1, not measured otherwise)."""
    cfg = _forward_row_config(
        n, dtype, held, store_group, FORWARD_WARP_BLOCK, FORWARD_CTA_THREADS, CTA_THREADS, FORWARD_BLOCK_VALUES[dtype]
    )
    hints = FORWARD_CACHE_HINTS[dtype]
    return cfg if hints is cfg.hints else _with_hints(cfg, hints)  # identity: no dataclass compare per launch


@functools.lru_cache(maxsize=4096)
def _with_hints(cfg: RowConfig, hints: CacheHints) -> RowConfig:
    return replace(cfg, hints=hints)


@functools.lru_cache(maxsize=4096)
def _forward_row_config(
    n: int,
    dtype: str,
    held: int,
    store_group: int,
    warp_block: int,
    single_cta: int,
    cta_threads: int,
    block_values: int,
):
    cfg = _forward_layout(n, dtype, held, warp_block, single_cta, cta_threads, block_values)
    group = min(store_group, cfg.chunks) if cfg.cluster == 1 else 1
    return cfg if group == cfg.store_group else replace(cfg, store_group=group)


def _forward_layout(
    n: int, dtype: str, held: int, warp_block: int, single_cta: int, cta_threads: int, block_values: int
):
    cfg = row_config(n, dtype, held, cta_threads=single_cta)
    if cfg.cluster > 1:
        return row_config(n, dtype, held, cta_threads=cta_threads)
    if cfg.threads_per_row == 32:
        return row_config(n, dtype, held, warp_block=warp_block, cta_threads=single_cta)
    if cfg.threads_per_row > 32 and block_values < VALUES_PER_THREAD and held == 1:  # the fused add: mixed, +-1.5%
        spread = row_config(n, dtype, VALUES_PER_THREAD // block_values, cta_threads=single_cta)
        if spread.cluster == 1:  # (else the register layout: float32 16384 in 1024 x 4 chunks measured slower)
            return spread
    return cfg
