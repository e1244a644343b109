"""What every row kernel (softmax, norms) shares: the thread layout per N and dtype, the 16-byte tiled copy of a row
into registers, and the warp -> block -> cluster reduction.

**Layout.** A row of N elements is cut into 16-byte chunks (``vec`` elements: 8 for 16-bit types, 4 for float32).
``threads_per_row`` threads of a CTA, times ``cluster`` CTAs, share a row; each thread holds ``chunks`` chunks in
registers (as float32), so a row is read from memory exactly once. Chunk ``j`` of thread ``t`` in CTA ``r`` of the
cluster is chunk ``(j * cluster + r) * threads_per_row + t`` of the row: at every step consecutive threads read
consecutive 16 bytes (coalesced), and a short row spreads evenly over the CTAs. Three regimes follow from N:

* ``warp``: a row fits one warp or less (``threads_per_row <= 32``): several rows per CTA (the forwards: a row of
  a whole warp alone in its CTA, :func:`forward_row_config`), shuffles only;
* ``block``: 64..1024 threads per row, one row per CTA (two at 64): shuffles, then one value per warp through
  shared memory;
* ``cluster``: rows longer than one CTA's registers hold (~32K elements) are split over 2, 4 or 8 CTAs of a
  cluster; each CTA reduces its part, then reads its peers' partials through distributed shared memory (DSMEM);
* ``team`` (``RowConfig.team``, the norm backward's longest rows): a row over more CTAs than a cluster holds,
  consecutive CTAs of the grid that share their partials through global memory (the kernel does that exchange).

Tails are predicated: chunks past N are not read (their registers hold a neutral ``fill``) nor written. When N is
not a multiple of ``vec`` the accesses are per element (correct for any N; 16-byte accesses need N and the row
strides to be multiples of 16 bytes).

**One specialization per config.** A :class:`RowConfig` is hashable and passed as a ``Constexpr``: one binary per
(dtype, config), whatever the number of rows or the exact N within the config's range (N and the strides are kernel
arguments). :func:`row_config` is cached, so the host dispatch does one dict lookup.
"""

from __future__ import annotations

import functools
import math as _pymath
from dataclasses import dataclass, replace
from types import SimpleNamespace

from mlir.dialects import llvm as _llvm

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, cluster, gpu, nvvm, vector

__all__ = [
    "RowConfig",
    "CacheHints",
    "row_config",
    "forward_row_config",
    "moments_merge",
    "row_position",
    "chunk_index",
    "row_smem",
    "load_row",
    "load_row_raw",
    "widen",
    "row_masks",
    "load_vector_row",
    "load_vector_chunk",
    "load_vector_chunk_raw",
    "load_vector_chunks_raw",
    "vector_chunk",
    "store_row",
    "thread_reduce",
    "row_reduce",
    "row_done",
    "segment_chunks",
    "segment_count",
    "MAX_CLUSTER",
    "masked",
    "masked_sum",
]

MAX_CLUSTER = 8  # portable cluster size limit (16 needs cudaFuncAttributeNonPortableClusterSizeAllowed)
MAX_TEAM = 1024  # CTAs of a team (a row split over CTAs that are not a cluster)
MAX_THREADS = 1024
_VALUES_PER_THREAD = 32  # float32 registers of row data per thread per tensor held (64 per thread at 1024 threads)
_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
# A hint's cache qualifiers (fx.nvvm.ld_global / st_global): "stream" the .cs operator (evict first from L1 and L2),
# "evict_first" / "evict_last" the L1 priority and an L2 policy of that priority, "no_allocate" past L1.
_HINTS = {
    "stream": {"cop": "cs"},
    "evict_first": {"l1": "evict_first", "policy": "evict_first"},
    "evict_last": {"l1": "evict_last", "policy": "evict_last"},
    "no_allocate": {"l1": "no_allocate"},
}


@dataclass(frozen=True)
class CacheHints:
    """Cache hints on a row kernel's 16-byte global accesses (rows whose N is a multiple of 16 bytes; per-element
    tails stay plain): each None (a plain access) or one of ``"stream"``, ``"evict_first"``, ``"evict_last"``,
    ``"no_allocate"`` (see ``_HINTS``). ``rows``: the row loads (:func:`load_row`), ``out``: the row stores
    (:func:`store_row`), ``vectors``: the weight and bias loads (:func:`load_vector_chunk`)."""

    rows: str | None = None
    out: str | None = None
    vectors: str | None = None

    def __post_init__(self):
        for name in ("rows", "out", "vectors"):
            hint = getattr(self, name)
            if hint is not None and hint not in _HINTS:
                raise ValueError(f"CacheHints.{name}: expected one of {tuple(_HINTS)} or None, got {hint!r}")
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


def _hint_qualifiers(hint: str | None) -> dict:
    """The keyword arguments of fx.nvvm.ld_global / st_global for a CacheHints value (policies created here: the
    compiler merges the identical ``createpolicy``)."""
    if hint is None:
        return {}
    qualifiers = dict(_HINTS[hint])
    if "policy" in qualifiers:
        qualifiers["policy"] = nvvm.create_policy(qualifiers["policy"])
    return qualifiers


@dataclass(frozen=True)
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
        if self.dtype not in _BYTES or self.vec * _BYTES[self.dtype] != 16:
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


# Threads per CTA before a row is split over a cluster, and of each CTA of a cluster (measured when the register
# kernels held every row: 512 beat 256 and 1024 at 16K-32K; the forwards now take one CTA of up to 1024 threads
# where that avoids a cluster, FORWARD_CTA_THREADS below).
CTA_THREADS = 512
# The register forwards (softmax, norms; see forward_row_config), H200: rows of one warp in one-warp CTAs (softmax
# bf16 1024: 4.21 vs 4.12 TB/s with 128 threads: a CTA's slot frees as soon as its warp is done; shorter rows, several
# per warp, keep 128-thread CTAs: not measured, and with fewer registers they may use more warps), and a row
# in one CTA of up to 1024 threads rather than a cluster (fused add + RMSNorm bf16 16384: 4.11 vs 3.81 in 2 CTAs of
# 512; softmax f32 32768: 4.18 vs 4.03). Rows that need a cluster anyway keep CTAs of CTA_THREADS (fused add f32
# 32768: 4.03 in 4 x 512, 3.66 in 2 x 1024).
FORWARD_WARP_BLOCK = 32
FORWARD_CTA_THREADS = 1024
# Values per thread of the register forwards' rows of one tensor (softmax, the norms but the fused add) in one CTA
# over a warp wide, where one CTA holds the row that way (else 32): float32 8, 2 chunks per thread (H200, GPU time,
# benchmarks/results/norms_forward_values_2026-11-30.json: N = 8192 in 1024 threads 4.20-4.22 TB/s against 4.10-4.13
# in 256 for softmax, LayerNorm and RMSNorm, 4096 +0-1.5%, 2048 the same; torch.compile's RMSNorm 4096 runs 512
# threads at 28 registers, full occupancy, 89.8% of DRAM bandwidth against our 128 threads' 86%). 16-bit rows keep
# 32: 1 chunk per thread measured 3-30% slower, and 1024-thread LayerNorm CTAs 2.75 against 4.05 at bf16 16384.
FORWARD_BLOCK_VALUES = {"f32": 8, "f16": _VALUES_PER_THREAD, "bf16": _VALUES_PER_THREAD}
# Cache hints of the register forwards' accesses per dtype (CacheHints; norms_bench.py --forward-hints tries others).
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
    vec = 16 // _BYTES[dtype]
    total_chunks = -(-n // vec)
    per_thread = max(1, _VALUES_PER_THREAD // held // vec)
    threads = _pow2_at_least(-(-total_chunks // per_thread))
    even = n % vec == 0
    if threads <= 32:
        tpr = threads
        return RowConfig(dtype, vec, -(-total_chunks // tpr), tpr, max(1, warp_block // tpr), 1, even)
    if threads <= cta_threads:
        return RowConfig(dtype, vec, -(-total_chunks // threads), threads, 1 if threads > 64 else 2, 1, even)
    tpr = min(MAX_THREADS, max(cta_threads, threads // MAX_CLUSTER))
    size = min(MAX_CLUSTER, threads // tpr)
    chunks = -(-total_chunks // (tpr * size))
    return RowConfig(dtype, vec, chunks, tpr, 1, size, even)


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
    if cfg.threads_per_row > 32 and block_values < _VALUES_PER_THREAD and held == 1:  # the fused add: mixed, +-1.5%
        spread = row_config(n, dtype, _VALUES_PER_THREAD // block_values, cta_threads=single_cta)
        if spread.cluster == 1:  # (in between, float32 16384 in 1024 threads x 4 chunks: 3.89 against 4.14)
            return spread
    return cfg


# --- device side ------------------------------------------------------------------------------------------------


def row_position(cfg: RowConfig):
    """This thread's row and place in it: ``row`` (Int32), ``lane`` (thread index within the row's threads of this
    CTA), ``rank`` (CTA rank in the cluster; 0 without one), ``row_in_cta``, ``leader`` (the one thread that writes
    per-row results)."""
    # The block size as .reqntid: ptxas keeps registers within what cfg.block threads can have (64 each at 1024)
    # instead of the kernel failing at launch.
    flyc.set_kernel_attributes(threads=cfg.block)
    tid = gpu.thread_idx.x
    lane = tid % cfg.threads_per_row
    row_in_cta = tid // cfg.threads_per_row
    if fx.const_expr(cfg.team):  # consecutive CTAs of the grid
        rank = gpu.block_idx.x % cfg.cluster
        group = gpu.block_idx.x // cfg.cluster
        leader = (lane == 0) & (rank == 0)
    elif fx.const_expr(cfg.cluster > 1):
        rank = cluster.block_rank()
        group = gpu.block_idx.x // cfg.cluster
        leader = (lane == 0) & (rank == 0)
    else:
        rank = 0
        group = gpu.block_idx.x
        leader = lane == 0
    row = group * cfg.rows_per_cta + row_in_cta
    return SimpleNamespace(tid=tid, lane=lane, row_in_cta=row_in_cta, rank=rank, row=row, leader=leader)


def row_smem(cfg: RowConfig, phases: int, values: int = 1):
    """Shared memory for ``phases`` row reductions (each its own slots: no barrier needed to reuse them) of
    ``values`` values each (:func:`row_reduce` of a list reduces them together, through one barrier)."""
    smem = fx.SmemAllocator()
    scratch = None
    if cfg.warps_per_row > 1:
        scratch = smem.allocate(fx.Float32, phases * cfg.rows_per_cta * values * cfg.warps_per_row)
    partials = smem.allocate(fx.Float32, phases * values) if cfg.cluster > 1 else None
    return SimpleNamespace(scratch=scratch, partials=partials, values=values)


def chunk_index(cfg: RowConfig, pos, j: int):
    """The row chunk (``vec`` elements from column ``vec *`` it) that is this thread's ``j``-th."""
    return (j * cfg.cluster + pos.rank) * cfg.threads_per_row + pos.lane


def _fill_buffer(cls, fill):
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(cls(fill).value, raw, alignment=buffer.base_alignment)
    return raw, buffer


def _read_buffer(cls, raw, buffer):
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


def _chunk_list(cfg: RowConfig, chunks) -> tuple:
    return tuple(chunks) if chunks is not None else tuple(range(cfg.chunks))  # a Python tuple: unrolled at trace


def _chunk_masks(cfg: RowConfig, col, n, row_ok):
    """In-range Booleans of a chunk's elements (one per chunk when ``cfg.even``, repeated ``vec`` times)."""
    if fx.const_expr(cfg.even):
        return [row_ok & (col < n)] * cfg.vec
    return [row_ok & (col + e < n) for e in range(cfg.vec)]


def _load_chunk_raw(cfg: RowConfig, view, col, n, row_ok, fill, hint=None):
    """The ``vec`` elements of a chunk view as one vector of its dtype, ``fill`` where out of range; ``hint``: a
    :class:`CacheHints` value for the 16-byte load (its address must be 16-byte aligned: the caller checks)."""
    cls = vector.vector_class(view.dtype, cfg.vec)
    # (hinted: 16-byte chunks only; float32 weights of 16-bit rows take 32 bytes a chunk)
    if fx.const_expr(cfg.even and hint is not None and view.dtype.width * cfg.vec == 128):
        fill_words = cls(fill).bitcast(fx.Int32)
        words = nvvm.ld_global(view, predicate=row_ok & (col < n), fill=fill_words, **_hint_qualifiers(hint))
        return words.bitcast(view.dtype)
    raw, buffer = _fill_buffer(cls, fill)
    if fx.const_expr(cfg.even):
        fx.copy(view, buffer, predicate=row_ok & (col < n))
    else:
        for e in fx.range_constexpr(cfg.vec):
            ok = row_ok & (col + e < n)
            fx.copy(fx.local_tile(view, (1,), (e,)), fx.local_tile(buffer, (1,), (e,)), predicate=ok)
    return _read_buffer(cls, raw, buffer)


def segment_count(cfg: RowConfig, n):
    """Segments of a row of ``n`` elements (a kernel integer) walked ``cfg.chunks`` chunks per thread at a time: a
    looped kernel's trip count."""
    step = cfg.vec * cfg.chunks * cfg.threads_per_row * cfg.cluster
    return (n + (step - 1)) // step


def segment_chunks(cfg: RowConfig, s) -> list:
    """This thread's chunks of segment ``s`` (a kernel integer: a dynamic loop's index), as the ``chunks`` argument
    of :func:`load_row` / :func:`store_row`: a segment is ``cfg.chunks * threads_per_row`` consecutive chunks, so that
    a looped kernel keeps one segment in registers and its accesses stay coalesced."""
    return [s * cfg.chunks + j for j in range(cfg.chunks)]


def load_row_raw(cfg: RowConfig, t, pos, n, rows, fill=0.0, chunks=None):
    """As :func:`load_row`, but one vector of ``t``'s dtype per chunk (16 bytes: 4 registers whatever the dtype),
    for a kernel that loads the next row while it works on this one; :func:`widen` converts them."""
    row_ok = pos.row < rows
    loaded = []
    for j in _chunk_list(cfg, chunks):
        c = chunk_index(cfg, pos, j)
        view = fx.local_tile(t, (1, cfg.vec), (pos.row, c))[0, None]  # (vec,): 16 contiguous bytes
        loaded.append(_load_chunk_raw(cfg, view, c * cfg.vec, n, row_ok, fill, cfg.hints.rows))
    return loaded


def widen(loaded):
    """Chunks from :func:`load_row_raw` as Float32 scalars."""
    values = []
    for v in loaded:
        wide = v.to(fx.Float32)
        values += [wide[e] for e in range(len(v))]
    return values


def row_masks(cfg: RowConfig, pos, n, rows, chunks=None):
    """The masks :func:`load_row` returns (Booleans: in range) for row ``pos.row``."""
    row_ok = pos.row < rows
    masks = []
    for j in _chunk_list(cfg, chunks):
        masks += _chunk_masks(cfg, chunk_index(cfg, pos, j) * cfg.vec, n, row_ok)
    return masks


def load_row(cfg: RowConfig, t, pos, n, rows, fill=0.0, chunks=None):
    """This thread's elements of row ``pos.row`` of the 2-D tensor ``t`` (``chunks * vec`` Float32 scalars, ``fill``
    where past N or past the last row) and their masks (Booleans: in range). ``chunks``: which of the thread's
    chunks (a range; default all), for kernels that walk a row in segments."""
    return widen(load_row_raw(cfg, t, pos, n, rows, fill, chunks)), row_masks(cfg, pos, n, rows, chunks)


def load_vector_chunk_raw(cfg: RowConfig, w, pos, n, j: int, fill=0.0):
    """As :func:`load_vector_chunk`, but one vector of ``w``'s dtype (:func:`widen` converts it): a kernel that
    loads a chunk early holds it in half the registers (16-bit types)."""
    c = chunk_index(cfg, pos, j)
    view = fx.local_tile(w, (cfg.vec,), (c,))
    return _load_chunk_raw(cfg, view, c * cfg.vec, n, pos.lane >= 0, fill, cfg.hints.vectors)


def load_vector_chunk(cfg: RowConfig, w, pos, n, j: int, fill=0.0):
    """This thread's chunk ``j`` of a 1-D (N,) tensor (weights, bias), laid out like the rows: ``vec`` Float32."""
    return widen([load_vector_chunk_raw(cfg, w, pos, n, j, fill)])


def load_vector_chunks_raw(cfg: RowConfig, w, pos, n):
    """All of this thread's chunks of a 1-D (N,) tensor as :func:`load_vector_chunk_raw` gives them, for a kernel that
    keeps them in registers in their dtype and widens each where it is used (:func:`vector_chunk`)."""
    return [load_vector_chunk_raw(cfg, w, pos, n, j) for j in range(cfg.chunks)]


def vector_chunk(cfg: RowConfig, w, pos, n, j: int, kept=None):
    """Chunk ``j`` of a 1-D (N,) tensor as Float32: widened from ``kept`` (:func:`load_vector_chunks_raw`), or loaded
    now when ``kept`` is None. The kept chunk is pinned (:func:`flydsl.expr.vector.pin`) where it is widened: kept
    across a loop, its widening would otherwise be hoisted out of it, and the wide values spill."""
    if kept is None:
        return load_vector_chunk(cfg, w, pos, n, j)
    return widen([vector.pin(kept[j])])


def load_vector_row(cfg: RowConfig, w, pos, n, fill=0.0):
    """This thread's elements of a 1-D (N,) tensor, all chunks."""
    values = []
    for j in fx.range_constexpr(cfg.chunks):
        values += load_vector_chunk(cfg, w, pos, n, j, fill)
    return values


def store_row(cfg: RowConfig, t, pos, n, rows, values, chunks=None) -> None:
    """Writes this thread's ``values`` (Float32 scalars, as from :func:`load_row`) into row ``pos.row`` of ``t``,
    converted to its dtype; nothing past N or past the last row. ``values`` may be a function of the chunk index
    giving that chunk's ``vec`` values: computed just before the chunk's store, which keeps what it loads (weights)
    out of the registers of the other chunks; ``cfg.store_group`` chunks at a time, all computed before their
    stores (the compilers do not move a load past a store to a pointer that may alias it: one chunk at a time, a
    thread waits for each chunk's loads in turn). ``chunks``: which of the thread's chunks (as in
    :func:`load_row`; ``values`` then holds those chunks' values, in order)."""
    row_ok = pos.row < rows
    wide = vector.vector_class(fx.Float32, cfg.vec)
    listed = list(enumerate(_chunk_list(cfg, chunks)))
    for first in fx.range_constexpr(0, len(listed), cfg.store_group):
        group = listed[first : first + cfg.store_group]
        cols = [chunk_index(cfg, pos, j) for _, j in group]
        views = [fx.local_tile(t, (1, cfg.vec), (pos.row, c))[0, None] for c in cols]
        parts = [values(j) if callable(values) else values[k * cfg.vec : (k + 1) * cfg.vec] for k, j in group]
        for c, view, part in zip(cols, views, parts, strict=True):
            chunk = vector.from_elements(wide.mlir_type(), part)
            _store_chunk(cfg, view, chunk.to(t.dtype), c * cfg.vec, n, row_ok)


def _store_chunk(cfg: RowConfig, view, chunk, col, n, row_ok) -> None:
    """A chunk (a vector of the view's dtype) into its view, nothing out of range; hinted as ``cfg.hints.out``."""
    if fx.const_expr(cfg.even and cfg.hints.out is not None):
        words = chunk.bitcast(fx.Int32)
        nvvm.st_global(view, words, predicate=row_ok & (col < n), **_hint_qualifiers(cfg.hints.out))
    else:
        raw, buffer = vector.register_buffer(type(chunk))
        _llvm.store(chunk.value, raw, alignment=buffer.base_alignment)
        if fx.const_expr(cfg.even):
            fx.copy(buffer, view, predicate=row_ok & (col < n))
        else:
            for e in fx.range_constexpr(cfg.vec):
                ok = row_ok & (col + e < n)
                fx.copy(fx.local_tile(buffer, (1,), (e,)), fx.local_tile(view, (1,), (e,)), predicate=ok)


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
