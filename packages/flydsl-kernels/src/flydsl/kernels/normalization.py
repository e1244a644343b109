"""LayerNorm and RMSNorm (with the fused residual add), forward and backward, on the shared row-reduction base.

One forward kernel serves the three forwards: which inputs and outputs exist is a compile-time :class:`NormFlags`
(tensors that do not exist are passed as a placeholder that the kernel never touches). LayerNorm reduces twice from
registers (the mean, then the sum of squared deviations: no cancellation); RMSNorm once.

Backward, for ``xhat = (x - mean) * rstd`` (RMSNorm: ``x * rstd``) and ``g = dy * weight``:
``dx = rstd * (g - xhat * mean(g * xhat) - mean(g))`` (RMSNorm without the last term). A persistent grid walks
the rows; the two row means are reduced together (one barrier, and one cluster barrier for long rows, per row) while
the next row's loads are in flight. ``dweight = sum_rows(dy * xhat)`` and ``dbias = sum_rows(dy)`` are reduced in
two steps, deterministically: each CTA (or cluster) keeps float32 column sums of its columns in shared memory (in
its partial row in global memory when they do not fit: LayerNorm past 131072), written once as a partial row;
a second small kernel sums the partial rows in a fixed order. (Atomics would save that kernel but make the result
depend on timing, and contend on the same addresses at small N.) Rows longer than the registers hold are read
twice, segment by segment, the second time from L2. See :func:`backward_config` for the layouts.

Long rows (16-bit N >= 16384, float32 N >= 16384; N a multiple of 16 bytes, rows 16-byte aligned) take the staged
kernel instead: each thread copies its chunks of dy and x rows ahead into a shared-memory ring (``cp.async``), so
that enough bytes are in flight without registers, and keeps its column sums in registers. A row split over CTAs
no longer waits at a cluster barrier per row: the CTAs push their partial sums to each other (a cluster: ``st.async``
into the peers' shared memory + mbarriers; past 8 CTAs, a team of up to 64 CTAs: global memory + release/acquire
counters) and write dx ``lag`` rows later. See :func:`_rows_staged`, :func:`_rows_pushed`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from types import SimpleNamespace

from mlir.dialects import llvm as _llvm

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import cluster, gpu, math, vector
from flydsl.kernels.host import empty_rows, sm_count
from flydsl.kernels.reduction import (
    RowConfig,
    chunk_index,
    load_row,
    load_row_raw,
    load_vector_chunk,
    masked,
    row_config,
    row_done,
    row_masks,
    row_position,
    row_reduce,
    row_smem,
    store_row,
    thread_reduce,
    widen,
)

__all__ = [
    "NormFlags",
    "BackwardConfig",
    "backward_config",
    "make_backward_config",
    "backward_groups",
    "max_active_clusters",
    "staged_backward_config",
    "staged_config",
    "team_backward_config",
    "exchange_columns",
    "forward",
    "backward",
    "norm_forward_kernel",
    "norm_backward_kernel",
    "column_sum_kernel",
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


def _round(values, dtype):
    """Values rounded to ``dtype`` and back (what a tensor of that dtype holds)."""
    if fx.const_expr(dtype is fx.Float32):
        return values
    return [v.to(dtype).to(fx.Float32) for v in values]


@flyc.kernel
def norm_forward_kernel(
    x: fx.Tensor,
    residual: fx.Tensor,
    weight: fx.Tensor,
    bias: fx.Tensor,
    out: fx.Tensor,
    residual_out: fx.Tensor,
    mean_out: fx.Tensor,
    rstd_out: fx.Tensor,
    eps: fx.Float32,
    cfg: fx.Constexpr[RowConfig],
    flags: fx.Constexpr[NormFlags],
):
    rows, n = x.shape
    pos = row_position(cfg)
    smem = row_smem(cfg, phases=1 if flags.rms else 2)
    inv_n = 1.0 / n.to(fx.Float32)
    xs, masks = load_row(cfg, x, pos, n, rows)
    if fx.const_expr(flags.residual):
        rs, _ = load_row(cfg, residual, pos, n, rows)
        xs = _round([a + b for a, b in zip(xs, rs, strict=True)], x.dtype)
        store_row(cfg, residual_out, pos, n, rows, xs)
    if fx.const_expr(flags.rms):
        mean = fx.Float32(0.0)
        centered = xs
        squares = row_reduce(cfg, pos, smem, 0, thread_reduce([v * v for v in xs]), last=True)
    else:
        mean = row_reduce(cfg, pos, smem, 0, thread_reduce(xs)) * inv_n
        centered = masked([v - mean for v in xs], masks)  # the padding is 0, not -mean
        squares = row_reduce(cfg, pos, smem, 1, thread_reduce([d * d for d in centered]), last=True)
    rstd = math.rsqrt(squares * inv_n + eps)

    def normalized(j):  # chunk j of the output: weight and bias loaded next to its store
        ys = [d * rstd for d in centered[j * cfg.vec : (j + 1) * cfg.vec]]
        if fx.const_expr(flags.weight):
            ys = [y * w for y, w in zip(ys, load_vector_chunk(cfg, weight, pos, n, j), strict=True)]
        if fx.const_expr(flags.bias):
            ys = [y + b for y, b in zip(ys, load_vector_chunk(cfg, bias, pos, n, j), strict=True)]
        return ys

    store_row(cfg, out, pos, n, rows, normalized)
    if fx.const_expr(flags.mean or flags.rstd):
        if pos.leader & (pos.row < rows):
            if fx.const_expr(flags.mean):
                mean_out[pos.row] = mean
            if fx.const_expr(flags.rstd):
                rstd_out[pos.row] = rstd
    row_done(cfg)


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


_STAGED_THREADS = 1024  # the staged kernel's CTA: one per SM (its ring takes most of the shared memory)
_RING_BYTES = 200 * 1024  # shared memory the ring may take
_MAX_STAGES = 4  # ring depth by default (the team kernel's: 6)


def _staged_shapes(dtype: str, sums: int) -> list:
    """(threads, chunks, lag, most CTAs per row) the staged kernel uses, in order of preference: measured on the
    H200 (benchmarks/results/norms_backward_2026-11-30_staged.json, kernel alone) against each other and the
    register kernel, among the shapes that ptxas -v assembles without spills (the column sums take ``sums * chunks
    * vec`` registers; checked by the CPU tests). 16-bit rows with one sum: one 1024-thread CTA per row (16384: 3.95
    TB/s against 3.31), else 512 threads x 4 chunks (32768-131072: 3.15, 3.04, 2.99 against 3.12, 2.50, 2.22);
    LayerNorm's two sums: 512 x 2, lag 2 (16384-65536: 3.19, 2.92, 2.86 against 3.07, 2.87, 1.64). Float32:
    LayerNorm 1024 x 2 up to 4 CTAs, then 512 x 4 (16384-65536: 3.64, 3.42, 3.25 against 3.37, 3.25, 3.01); one
    sum: 1024 x 2 in up to 2 CTAs (16384: 3.71 against 3.62), the register kernel beyond (3.67, 3.53 against 3.49,
    3.27)."""
    if dtype == "f32":
        if sums == 2:
            return [(1024, 2, 1, 4), (512, 4, 1, 8)]
        return [(1024, 2, 1, 2)]
    if sums == 2:
        return [(512, 2, 2, 8)]
    return [(1024, 2, 1, 1), (512, 4, 1, 8)]


def staged_config(n: int, dtype: str, sums: int) -> BackwardConfig | None:
    """The first of :func:`_staged_shapes` that holds a row in its most CTAs, or None."""
    for threads, chunks, lag, most in _staged_shapes(dtype, sums):
        cfg = staged_backward_config(n, dtype, sums, chunks, threads=threads, lag=lag)
        if cfg is not None and cfg.row.cluster <= most:
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
) -> BackwardConfig | None:
    """The staged backward config (see :func:`_rows_staged`) for rows of ``n`` elements: CTAs of ``threads``
    threads holding ``chunks`` 16-byte chunks of a row each, as few CTAs per row (a cluster) as hold it, a ring of
    ``stages`` rows (default: as many as :data:`_RING_BYTES` hold, at most :data:`_MAX_STAGES`). None when a row
    needs more than 8 CTAs or the ring would hold fewer than 2 rows, or when N is not a multiple of 16 bytes (the
    ring is filled by 16-byte copies)."""
    vec = 16 // {"f32": 4, "f16": 2, "bf16": 2}[dtype]
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
    layout = RowConfig(dtype, vec, chunks, threads, 1, cluster, True)
    return BackwardConfig(layout, chunks, sums, False, 1, stages, lag)


_MAX_TEAM = 64  # CTAs per row of a team: at least two teams on 132 SMs


@functools.lru_cache(maxsize=1024)
def team_backward_config(
    n: int, dtype: str, sums: int, chunks: int = 2, stages: int = 6, threads: int = 512, lag: int = 2
) -> BackwardConfig | None:
    """The staged kernel for rows longer than 8 CTAs hold (see :func:`_rows_pushed`): a team of as many CTAs as
    hold the row (any count, 9 to :data:`_MAX_TEAM`), consecutive in the grid, exchanging their partial sums through
    global memory. None when N is not a multiple of 16 bytes or the row needs fewer than 9 or more than
    :data:`_MAX_TEAM` CTAs."""
    vec = 16 // {"f32": 4, "f16": 2, "bf16": 2}[dtype]
    team = -(-n // (vec * threads * chunks))
    if n % vec or not 8 < team <= _MAX_TEAM or stages * 2 * threads * chunks * 16 > _RING_BYTES:
        return None
    layout = RowConfig(dtype, vec, chunks, threads, 1, team, True, team=True)
    return BackwardConfig(layout, chunks, sums, False, 1, stages, lag)


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
        if ring is None and sums == 2:  # LayerNorm past 8 CTAs per row: a team (through norms_bench, bf16 131072
            # and 262144: 1.53, 0.83 -> 2.16, 2.11 TB/s; f32: 2.40, 1.33 -> 2.53, 2.10). RMSNorm's register kernel
            # stays: the team measured 2.20, 2.50, 2.11 against 2.23, 2.77, 2.62 (bf16 262144, f32 131072, 262144).
            ring = team_backward_config(n, dtype, sums)
        if ring is not None:
            return ring
    if not wide and n <= 8 * _BWD_THREADS * 16:
        return make_backward_config(n, dtype, sums, *dense)
    return make_backward_config(n, dtype, sums, *lean)


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


_PROBE_PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry fly_cluster_probe() .reqntid {threads}, 1, 1
{{
ret;
}}
"""


@functools.lru_cache(maxsize=64)
def max_active_clusters(cluster: int, threads: int, blocks_per_sm: int, device: int) -> int | None:
    """``cuOccupancyMaxActiveClusters`` for clusters of ``cluster`` CTAs of ``threads`` threads of which at most
    ``blocks_per_sm`` fit on an SM, on the current context's device (``device``: the cache key), or None when the
    driver cannot say. Asked of an empty probe kernel given the shared memory that lets exactly ``blocks_per_sm``
    CTAs share an SM (228 KB per SM, 1 KB of it reserved per CTA): the count for a kernel whose registers or shared
    memory allow that many."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None

    class Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]

    class Config(ctypes.Structure):  # CUlaunchConfig
        _fields_ = [("dims", ctypes.c_uint * 6), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p)]
        _fields_ += [("attrs", ctypes.POINTER(Attribute)), ("count", ctypes.c_uint)]

    shared = (228 // blocks_per_sm - 1) * 1024
    module, function, found = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int(0)
    ptx = _PROBE_PTX.format(threads=threads).encode() + b"\0"
    if cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(ptx)) != 0:
        return None
    try:
        if cuda.cuModuleGetFunction(ctypes.byref(function), module, b"fly_cluster_probe") != 0:
            return None
        if cuda.cuFuncSetAttribute(function, 8, ctypes.c_int(shared)) != 0:  # MAX_DYNAMIC_SHARED_SIZE_BYTES
            return None
        attribute = Attribute(id=4)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value[0], attribute.value[1], attribute.value[2] = cluster, 1, 1
        config = Config(shared=shared, attrs=ctypes.pointer(attribute), count=1)
        config.dims[:] = [cluster, 1, 1, threads, 1, 1]
        if cuda.cuOccupancyMaxActiveClusters(ctypes.byref(found), function, ctypes.byref(config)) != 0:
            return None
    finally:
        cuda.cuModuleUnload(module)
    return found.value or None


def make_backward_config(
    n: int, dtype: str, sums: int, chunks: int, registers: int, cta_threads: int = _BWD_THREADS
) -> BackwardConfig:
    """A backward config holding ``chunks`` 16-byte chunks per thread per tensor in registers, in CTAs of
    ``cta_threads`` (several rows each for short rows, clusters of up to 8 for longer ones, then CTAs of up to 1024,
    then two passes per row), as many CTAs per SM as ``registers`` per thread and the column sums' shared memory
    allow."""
    vec = 16 // {"f32": 4, "f16": 2, "bf16": 2}[dtype]
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


def _sum_index(cfg: BackwardConfig, pos, s: int, slot, j: int, q: int):
    """Float4 index in shared memory of column sum ``s``, row slot ``slot``, chunk ``j``, quarter ``q`` of this
    thread: lanes contiguous (16-byte accesses without bank conflicts)."""
    rc = cfg.row
    return (((s * rc.rows_per_cta + slot) * rc.chunks + j) * (rc.vec // 4) + q) * rc.threads_per_row + pos.lane


def _load4(view, ok=None):
    cls = vector.vector_class(fx.Float32, 4)
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(cls(0.0).value, raw, alignment=buffer.base_alignment)
    fx.copy(view, buffer, predicate=ok)
    loaded = cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))
    return [loaded[e] for e in range(4)]


def _store4(view, values, ok=None):
    cls = vector.vector_class(fx.Float32, len(values))
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(vector.from_elements(cls.mlir_type(), values).value, raw, alignment=buffer.base_alignment)
    fx.copy(buffer, view, predicate=ok)


class _PartialRow:
    """This thread's columns of the CTA's row of the ``(groups, sums * N)`` float32 partial tensor: 16-byte
    accesses when N is a multiple of 4 (every chunk is then whole or absent), else one element at a time."""

    def __init__(self, cfg: BackwardConfig, partial, group, pos, n):
        self.cfg, self.partial, self.group, self.pos, self.n = cfg, partial, group, pos, n
        self.wide = cfg.row.even

    def _columns(self, s: int, j: int, q: int):
        col = chunk_index(self.cfg.row, self.pos, j) * self.cfg.row.vec + 4 * q
        return col, s * self.n + col

    def load(self, s: int, j: int, q: int):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            return _load4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], col < self.n)
        return [_masked_load(self.partial, self.group, at + e, col + e < self.n) for e in range(4)]

    def store(self, s: int, j: int, q: int, values):
        col, at = self._columns(s, j, q)
        if fx.const_expr(self.wide):
            _store4(fx.local_tile(self.partial, (1, 4), (self.group, at // 4))[0, None], values, col < self.n)
        else:
            for e in fx.range_constexpr(4):
                view = fx.local_tile(self.partial, (1, 1), (self.group, at + e))[0, None]
                _store4(view, [values[e]], col + e < self.n)


def _column_sums_add(cfg: BackwardConfig, sums_smem, partial_row, pos, chunks, terms):
    """Adds ``terms[s]`` (this thread's values of ``chunks``) to column sum ``s``."""
    for s in fx.range_constexpr(cfg.sums):
        for k, j in enumerate(chunks):
            for q in fx.range_constexpr(cfg.row.vec // 4):
                add = terms[s][(k * cfg.row.vec + 4 * q) : (k * cfg.row.vec + 4 * q + 4)]
                if fx.const_expr(cfg.smem_sums):
                    view = fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, pos.row_in_cta, j, q),))
                    old = _load4(view)
                    _store4(view, [a + b for a, b in zip(old, add, strict=True)])
                else:
                    old = partial_row.load(s, j, q)
                    partial_row.store(s, j, q, [a + b for a, b in zip(old, add, strict=True)])


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=81))  # PTX ISA 8.1: st.async (the staged kernel's pushes)
def norm_backward_kernel(
    dy: fx.Tensor,
    x: fx.Tensor,
    weight: fx.Tensor,
    mean_in: fx.Tensor,
    rstd_in: fx.Tensor,
    dx: fx.Tensor,
    partial: fx.Tensor,
    exchange: fx.Tensor,
    cfg: fx.Constexpr[BackwardConfig],
    flags: fx.Constexpr[NormFlags],
):
    """A persistent grid: CTA group ``g`` (a CTA, or a cluster for long rows) takes row groups ``g, g + groups,
    ...``. Per row: one pass loads dy and x, adds to the column sums and reduces ``sum(g * xhat)`` and ``sum(g)``
    together (one barrier per row; two slots alternate); a second writes dx (from registers, or re-reading the row
    from L2 when it does not fit). The column sums go to row ``g`` of ``partial``: ``(groups, sums * N)``
    float32, dweight in the first N columns, dbias in the next N. ``exchange``: a team's row sums and counters
    (``(rows, exchange_columns(cfg))`` float32, zeroed; see :func:`_exchange_setup`), else any tensor (unused)."""
    rc = cfg.row
    rows, n = x.shape
    groups = gpu.grid_dim.x // rc.cluster
    pos = row_position(rc)
    flyc.set_kernel_attributes(min_blocks_per_sm=cfg.blocks_per_sm)
    group = gpu.block_idx.x // rc.cluster
    smem = row_smem(rc, phases=2, values=1 if flags.rms else 2)
    sums_smem = None
    if fx.const_expr(cfg.sums > 0 and cfg.smem_sums):
        sums_smem = fx.SmemAllocator().allocate(fx.Float32, cfg.sums * rc.block * rc.chunks * rc.vec, alignment=16)
    partial_row = _PartialRow(cfg, partial, group, pos, n)
    zeros = [fx.Float32(0.0)] * 4
    for s in fx.range_constexpr(0 if cfg.staged else cfg.sums):  # the staged kernel writes its sums once, at the end
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                if fx.const_expr(cfg.smem_sums):
                    _store4(fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, pos.row_in_cta, j, q),)), zeros)
                else:
                    partial_row.store(s, j, q, zeros)
    row_groups = (rows + (rc.rows_per_cta - 1)) // rc.rows_per_cta
    tensors = (dy, x, weight, mean_in, rstd_in, dx)
    if fx.const_expr(cfg.staged):
        _rows_staged(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange)
    elif fx.const_expr(cfg.two_pass):
        _rows_two_pass(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups)
    else:
        _rows_prefetched(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups)
    if fx.const_expr(cfg.sums > 0 and cfg.smem_sums):
        # The CTA's row slots summed (in a fixed order) into its partial row.
        if fx.const_expr(rc.rows_per_cta > 1):
            gpu.barrier()
        if pos.row_in_cta == 0:
            _write_partial(cfg, sums_smem, partial_row, pos)
    if fx.const_expr(rc.cluster_shape is not None):
        cluster.sync()  # peers may still read this CTA's reduction slots


def _row_at(pos, row):
    """``pos`` at another row (same thread, same place in the row)."""
    return SimpleNamespace(**{**vars(pos), "row": row})


def _prefetch(rc: RowConfig, flags: NormFlags, tensors, pos, n, rows):
    """Row ``pos.row``'s dy and x chunks in their dtype (nothing read past the last row), its rstd and mean."""
    dy, x, _, mean_in, rstd_in, _ = tensors
    safe_row = fx.arith.select(pos.row < rows, pos.row, type(pos.row)(0))
    mu = fx.Float32(0.0)
    if fx.const_expr(not flags.rms):
        mu = mean_in[safe_row]
    return [load_row_raw(rc, dy, pos, n, rows), load_row_raw(rc, x, pos, n, rows), rstd_in[safe_row], mu]


def _row_constants(rc: RowConfig, flags: NormFlags, pos, smem, parity, dots, inv_n, overlap=None):
    """``c1 = mean(g * xhat)`` and ``c2 = mean(g)`` (0 for RMSNorm) of the row, from the threads' partial sums (and
    what ``overlap`` returned, when given: see :func:`row_reduce`)."""
    reduced = row_reduce(rc, pos, smem, parity, dots, overlap=overlap)
    sums, extra = reduced if overlap is not None else (reduced, None)
    means = [v * inv_n for v in sums]
    c2 = fx.Float32(0.0)
    if fx.const_expr(not flags.rms):
        c2 = means[1]
    return means[0], c2, extra


def _rows_prefetched(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups):
    """Rows held in registers: while a row is reduced and written, the next row's loads are in flight (in the row's
    dtype: 4 registers per chunk). In a CTA they are issued first; in a cluster after the barrier's arrive, whose
    release would otherwise wait for them (see :func:`row_reduce`)."""
    rc = cfg.row
    dx = tensors[5]
    inv_n = 1.0 / n.to(fx.Float32)
    whole = tuple(range(rc.chunks))
    parity = fx.Int32(0)
    ahead = _prefetch(rc, flags, tensors, pos, n, rows)  # pos.row: the first row of this CTA
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA (and cluster)
        here = _row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        after = _row_at(pos, (grp + groups) * rc.rows_per_cta + pos.row_in_cta)
        current = ahead
        if fx.const_expr(rc.cluster == 1):
            ahead = _prefetch(rc, flags, tensors, after, n, rows)
        rstd, mu = current[2], current[3]
        dys, xs = widen(current[0]), widen(current[1])
        g, xhat, dys = _terms(rc, flags, tensors[2], here, n, rows, rstd, mu, whole, dys, xs)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        dots = _first_pass(cfg, flags, sums_smem, partial_row, here, whole, g, xhat, dys, dots)
        if fx.const_expr(rc.cluster == 1):
            c1, c2, _ = _row_constants(rc, flags, here, smem, parity, dots, inv_n)
        else:
            c1, c2, ahead = _row_constants(
                rc,
                flags,
                here,
                smem,
                parity,
                dots,
                inv_n,
                functools.partial(_prefetch, rc, flags, tensors, after, n, rows),
            )
        store_row(rc, dx, here, n, rows, _dx(rstd, g, xhat, c1, c2))
        parity = 1 - parity


def _load_vector(view, count: int):
    """``count`` contiguous elements of a view (shared memory) as one vector of its dtype."""
    cls = vector.vector_class(view.dtype, count)
    raw, buffer = vector.register_buffer(cls)
    fx.copy(view, buffer)
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


class _Ring:
    """The staged kernel's ring: ``stages`` rows of this thread's 16-byte chunks of dy and x in shared memory, filled
    by ``cp.async`` (zeros past N and past the last row), read back by the thread that copied them."""

    def __init__(self, cfg: BackwardConfig, flags: NormFlags, tensors, pos, n, rows):
        self.cfg, self.rc, self.flags, self.tensors, self.pos, self.n, self.rows = (
            cfg,
            cfg.row,
            flags,
            tensors,
            pos,
            n,
            rows,
        )
        rc = cfg.row
        size = cfg.stages * 2 * rc.chunks * rc.block * rc.vec
        self.buffer = fx.SmemAllocator().allocate(tensors[1].dtype, size, alignment=16)
        self.cols = [chunk_index(rc, pos, j) * rc.vec for j in range(rc.chunks)]

    def _index(self, slot, t: int, j: int):
        return ((slot * 2 + t) * self.rc.chunks + j) * self.rc.block + self.pos.tid

    def issue(self, row, slot) -> None:
        """Copies this thread's chunks of ``row`` into ring slot ``slot``: one commit group."""
        rc, rows = self.rc, self.rows
        row_ok = row < rows
        safe_row = fx.arith.select(row_ok, row, type(row)(0))
        for t in fx.range_constexpr(2):
            for j in fx.range_constexpr(rc.chunks):
                col = self.cols[j]
                inside = row_ok & (col < self.n)
                fx.nvvm.cp_async(
                    self.buffer,
                    self.tensors[t],
                    16,
                    dst_coord=self._index(slot, t, j) * rc.vec,
                    src_coord=(safe_row, fx.arith.select(inside, col, type(col)(0))),
                    src_bytes=fx.arith.select(inside, fx.Int32(16), fx.Int32(0)),
                )
        fx.nvvm.cp_async_commit_group()

    def stats(self, row):
        """rstd and mean of ``row`` (row 0's past the last row: finite, and multiplied by zeros)."""
        safe_row = fx.arith.select(row < self.rows, row, type(row)(0))
        mu = fx.Float32(0.0)
        if fx.const_expr(not self.flags.rms):
            mu = self.tensors[3][safe_row]
        return self.tensors[4][safe_row], mu

    def terms(self, slot, j: int, rstd, mu):
        """``(g = dy * weight, xhat, dy)`` of chunk ``j`` of the row in ``slot``."""
        rc = self.rc
        loaded = []
        for t in fx.range_constexpr(2):
            view = fx.local_tile(self.buffer, (rc.vec,), (self._index(slot, t, j),))
            wide = _load_vector(view, rc.vec).to(fx.Float32)
            loaded.append([wide[e] for e in range(rc.vec)])
        dys, xs = loaded
        xhat = [v * rstd for v in xs] if self.flags.rms else [(v - mu) * rstd for v in xs]
        g = dys
        if fx.const_expr(self.flags.weight):
            g = [a * w for a, w in zip(dys, load_vector_chunk(rc, self.tensors[2], self.pos, self.n, j), strict=True)]
        return g, xhat, dys

    def first_pass(self, slot, rstd, mu, sums):
        """This thread's ``sum(g * xhat)`` (and ``sum(g)``) of the row in ``slot``, and ``sums`` plus its column
        terms (dweight's ``dy * xhat``, then dbias's ``dy``), chunk by chunk (each chunk's values die before the
        next is read)."""
        rc = self.rc
        dots = [fx.Float32(0.0)] * (1 if self.flags.rms else 2)
        added = list(sums)
        for j in fx.range_constexpr(rc.chunks):
            g, xhat, dys = self.terms(slot, j, rstd, mu)
            dots[0] = dots[0] + thread_reduce([a * h for a, h in zip(g, xhat, strict=True)])
            if fx.const_expr(not self.flags.rms):
                dots[1] = dots[1] + thread_reduce(g)
            for e in fx.range_constexpr(rc.vec if self.cfg.sums > 0 else 0):
                added[j * rc.vec + e] = added[j * rc.vec + e] + dys[e] * xhat[e]
            for e in fx.range_constexpr(rc.vec if self.cfg.sums > 1 else 0):
                at = (rc.chunks + j) * rc.vec + e
                added[at] = added[at] + dys[e]
        return dots, added

    def store_dx(self, row, slot, rstd, mu, c1, c2) -> None:
        def chunk(j):
            g, xhat, _ = self.terms(slot, j, rstd, mu)
            return _dx(rstd, g, xhat, c1, c2)

        store_row(self.rc, self.tensors[5], _row_at(self.pos, row), self.n, self.rows, chunk)

    def write_sums(self, partial_row, sums) -> None:
        fx.nvvm.cp_async_wait_group(0)  # nothing lands in shared memory after the CTA is gone
        rc = self.rc
        for s in fx.range_constexpr(self.cfg.sums):
            for j in fx.range_constexpr(rc.chunks):
                for q in fx.range_constexpr(rc.vec // 4):
                    at = (s * rc.chunks + j) * rc.vec + 4 * q
                    partial_row.store(s, j, q, sums[at : at + 4])


def _rows_staged(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange):
    """Rows staged through shared memory: each thread copies its chunks of dy and x (``cp.async``, 16 bytes each)
    rows ahead into its own slots of a ring (:class:`_Ring`), so that the bytes in flight cost no registers
    (Little's law: ~32 KB per SM for HBM's bandwidth). A thread reads only what it copied: ``cp.async.wait_group``
    orders it, no barrier. The column sums stay in registers, written once at the end to the CTA's partial row; the
    zero-filled padding adds nothing to them or to the row means. One CTA per row: one block reduction per row, then
    dx from the ring. A cluster per row: see :func:`_rows_pushed`."""
    if fx.const_expr(cfg.row.cluster > 1):
        _rows_pushed(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange)
        return
    rc = cfg.row
    stages = cfg.stages
    inv_n = 1.0 / n.to(fx.Float32)
    ring = _Ring(cfg, flags, tensors, pos, n, rows)
    for k in fx.range_constexpr(stages - 1):
        ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    slot = fx.Int32(0)
    parity = fx.Int32(0)
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA
        ahead = slot + (stages - 1)
        ring.issue(grp + (stages - 1) * groups, fx.arith.select(ahead >= stages, ahead - stages, ahead))
        next_rstd, next_mu = ring.stats(grp + groups)  # in flight during this row
        fx.nvvm.cp_async_wait_group(stages - 1)  # this row's chunks (this thread's) have landed
        dots, sums = ring.first_pass(slot, rstd, mu, sums)
        c1, c2, _ = _row_constants(rc, flags, _row_at(pos, grp), smem, parity, dots, inv_n)
        ring.store_dx(grp, slot, rstd, mu, c1, c2)
        rstd, mu = next_rstd, next_mu
        slot = fx.arith.select(slot + 1 >= stages, slot + 1 - stages, slot + 1)
        parity = 1 - parity
    ring.write_sums(partial_row, sums)


def _push_pair(a, b, remote, barrier) -> None:
    """``st.async``: two Float32 into a peer's shared memory (``remote``, an ``!llvm.ptr<7>`` from
    ``cluster.map_shared``), completing 8 bytes of the transaction count of its mbarrier ``barrier`` (likewise).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st-async
    """
    i64 = fx.Int64.mlir_type()  # mapa's 64-bit shared::cluster addresses, as they are
    where = _llvm.ptrtoint(i64, remote)
    bar = _llvm.ptrtoint(i64, barrier)
    text = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [$0], {$1, $2}, [$3];"
    _llvm.inline_asm(None, [where, a.value, b.value, bar], text, "l,f,f,l", has_side_effects=True)


_SPIN_LIMIT = 1 << 22  # polls of a team's pair before the kernel traps (a lost peer: fail rather than hang)
_TAG = 1  # marks a team's pair as written (the exchange tensor is zeroed before each launch)


def exchange_columns(cfg: BackwardConfig) -> int:
    """Float32 columns per row of a team's ``exchange`` tensor: per CTA of the row, its pair, each half next to a
    tag: ``(sum(g * xhat), tag, sum(g), tag)``."""
    return 4 * cfg.row.cluster


def _store_tagged(pointer, value) -> None:
    """``st.relaxed.gpu.global.b64``: ``value`` (Float32) and :data:`_TAG` as one 64-bit store (single-copy atomic:
    a reader sees both or neither), no fence: nothing this thread wrote before has to be waited for."""
    text = "{ .reg .b32 lo; .reg .b64 t; mov.b32 lo, $1; mov.b64 t, {lo, $2}; st.relaxed.gpu.global.b64 [$0], t; }"
    _llvm.inline_asm(None, [pointer, value.value, fx.Int32(_TAG).value], text, "l,f,r", has_side_effects=True)


def _load_tagged(pointer):
    """``ld.relaxed.gpu.global.b64`` of a :func:`_store_tagged` pair: (Float32 value, Int32 tag); coherent at the
    GPU's scope (L2), not a stale L1 line."""
    i32 = fx.Int32.mlir_type()
    struct = _llvm.StructType.get_literal([i32, i32])
    text = "{ .reg .b64 t; ld.relaxed.gpu.global.b64 t, [$2]; mov.b64 {$0, $1}, t; }"
    both = _llvm.inline_asm(struct, [pointer], text, "=r,=r,l", has_side_effects=True)
    bits = fx.Int32(_llvm.extractvalue(i32, both, [0]))
    return fx.Float32(fx.arith.bitcast(fx.Float32.mlir_type(), bits.value)), fx.Int32(
        _llvm.extractvalue(i32, both, [1])
    )


def _exchange_setup(cfg: BackwardConfig, pos, exchange, slots: int):
    """How the CTAs of a row share their partial pairs (``sum(g * xhat)``, ``sum(g)``) in :func:`_rows_pushed`.

    Cluster: each CTA pushes its pair into every peer's inbox slot for the row (``st.async``, completing bytes on
    the peer's mbarrier of the slot); a CTA waits on its own mbarrier. Team (CTAs that are not a cluster): each
    writes its pair into the row's line of ``exchange`` in global memory, each half tagged in one 64-bit store (no
    fence, so no wait for this thread's loads and stores in flight); a CTA's first warp polls the pairs until every
    tag is set, sums them and hands the sums to the CTA through shared memory. Either way the sum runs over the
    ranks in a fixed order: every CTA of the row computes the same means, and the result does not depend on
    timing."""
    share = SimpleNamespace(rc=cfg.row, pos=pos, exchange=exchange, slots=slots)
    if fx.const_expr(cfg.row.team):
        share.means = fx.SmemAllocator().allocate(fx.Float32, 4, alignment=16)  # two rows' sums
    else:
        share.inbox = fx.SmemAllocator().allocate(fx.Float32, slots * cfg.row.cluster * 2, alignment=16)
        share.bars = fx.mbarrier.allocate(fx.SmemAllocator(), slots)
        if pos.tid == 0:
            for i in fx.range_constexpr(slots):
                share.bars[i].init(1)
            fx.mbarrier.fence_init()
        cluster.sync()  # every peer's barriers are initialized before the first push
    return share


def _exchange_push(share, k, row, pair) -> None:
    """This CTA's ``pair`` of row ``row`` (its ``k``-th), to every CTA of the row (itself included)."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid == 0:
            for v in fx.range_constexpr(2):
                _store_tagged(fx.nvvm.address(share.exchange, (row, 4 * pos.rank + 2 * v)), pair[v])
    else:
        box = k % share.slots
        if pos.tid < size:
            remote = cluster.map_shared(share.inbox, pos.tid, coord=(box * size + pos.rank) * 2)
            _push_pair(pair[0], pair[1], remote, cluster.map_shared(share.bars.tensor, pos.tid, coord=box))
        if pos.tid == 0:
            share.bars[box].arrive_expect_tx(size * 8)


def _exchange_sums(share, k, row, parity):
    """The two sums of row ``row`` (this CTA's ``k``-th) over the row's CTAs, once all have pushed."""
    size, pos = share.rc.cluster, share.pos
    if fx.const_expr(share.rc.team):
        if pos.tid < 32:
            _team_sums(share, row, parity, size, pos.tid % 32)
        gpu.barrier()
        return [share.means[parity * 2], share.means[parity * 2 + 1]]
    old = k % share.slots
    share.bars[old].wait((k // share.slots) % 2)
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for r in fx.range_constexpr(size):
        total = [total[i] + share.inbox[(old * size + r) * 2 + i] for i in range(2)]
    return total


def _team_sums(share, row, parity, size: int, lane) -> None:
    """The first warp: lane ``l`` reads the pairs of ranks ``l, l + 32, ...`` of ``row``, polling each half until
    its tag says it was written (traps after :data:`_SPIN_LIMIT` polls rather than hang), sums them, then the
    warp's fixed shuffle tree; the sums go to shared memory slot ``parity``."""
    total = [fx.Float32(0.0), fx.Float32(0.0)]
    for i in fx.range_constexpr(-(-size // 32)):
        rank = lane + 32 * i
        ok = rank < size
        safe = fx.arith.select(ok, rank, type(rank)(0))
        for v in fx.range_constexpr(2):
            where = fx.nvvm.address(share.exchange, (row, 4 * safe + 2 * v))
            got, tag = _load_tagged(where)
            tries = fx.Int32(0)
            while ok & (tag != _TAG) & (tries < _SPIN_LIMIT):
                got, tag = _load_tagged(where)
                tries = tries + 1
            if tries >= _SPIN_LIMIT:
                _llvm.inline_asm(None, [], "trap;", "", has_side_effects=True)
            total[v] = total[v] + fx.arith.select(ok, got, fx.Float32(0.0))
    total = [gpu.warp_reduce(v, "add", width=32) for v in total]
    if lane == 0:
        share.means[parity * 2] = total[0]
        share.means[parity * 2 + 1] = total[1]


def _rows_pushed(cfg, flags, tensors, smem, partial_row, pos, n, rows, group, groups, row_groups, exchange):
    """The staged kernel with a row split over CTAs (a cluster, or a team: see :func:`_exchange_setup`), without a
    barrier of all of them per row: each CTA reduces its part of row ``k`` and pushes its pair, then writes dx of
    row ``k - lag``, whose pairs arrived meanwhile. The row's CTAs run up to ``lag`` rows apart: none stalls on the
    slowest at every row. A cluster's inbox slots (``2 * lag + 2``) are reused safely: a peer pushing row ``k +
    slots`` has waited for this CTA's push of row ``k + slots - 1 - lag``, made after this CTA consumed row ``k``.
    The ring holds rows ``k - lag .. k + ahead``."""
    rc = cfg.row
    stages, lag = cfg.stages, cfg.lag
    ahead = stages - 1 - lag
    values = 1 if flags.rms else 2
    inv_n = 1.0 / n.to(fx.Float32)
    ring = _Ring(cfg, flags, tensors, pos, n, rows)
    share = _exchange_setup(cfg, pos, exchange, 2 * lag + 2)
    block = dataclasses.replace(rc, cluster=1, team=False)  # the CTA's part of the reduction
    for k in fx.range_constexpr(ahead + 1):
        ring.issue(group + k * groups, fx.Int32(k))
    sums = [fx.Float32(0.0)] * max(1, cfg.sums * rc.chunks * rc.vec)  # one unused value without sums: carried
    rstd, mu = ring.stats(group)
    queue = [fx.Float32(0.0)] * (2 * lag)  # (rstd, mean) of rows k - lag .. k - 1
    k = fx.Int32(0)
    parity = fx.Int32(0)
    for grp in range(group, row_groups + lag * groups, groups):  # lag more steps: the last rows' dx
        slot = k % stages
        next_rstd, next_mu = ring.stats(grp + groups)
        fx.nvvm.cp_async_wait_group(ahead)  # row k's chunks (this thread's) have landed
        dots, sums = ring.first_pass(slot, rstd, mu, sums)
        part = row_reduce(block, pos, smem, parity, dots)
        if fx.const_expr(values == 1):
            part = part + [fx.Float32(0.0)]
        if grp < row_groups:
            _exchange_push(share, k, grp, part)
        done = k - lag
        if done >= 0:  # dx of row k - lag, from its pairs
            total = _exchange_sums(share, done, grp - lag * groups, parity)
            c2 = fx.Float32(0.0)
            if fx.const_expr(not flags.rms):
                c2 = total[1] * inv_n
            ring.store_dx(grp - lag * groups, done % stages, queue[0], queue[1], total[0] * inv_n, c2)
        # the slot of row k - lag is free (its dx is written): row k + ahead + 1 goes there
        ring.issue(grp + (ahead + 1) * groups, (k + ahead + 1) % stages)
        queue = queue[2:] + [rstd, mu]
        rstd, mu = next_rstd, next_mu
        k = k + 1
        parity = 1 - parity
    ring.write_sums(partial_row, sums)


def _rows_two_pass(cfg, flags, tensors, smem, sums_smem, partial_row, pos, n, rows, group, groups, row_groups):
    """Rows longer than the registers hold: each is read twice, segment by segment (the second time from L2)."""
    rc = cfg.row
    inv_n = 1.0 / n.to(fx.Float32)
    parity = fx.Int32(0)
    for grp in range(group, row_groups, groups):  # the same trip count for the whole CTA (and cluster)
        here = _row_at(pos, grp * rc.rows_per_cta + pos.row_in_cta)
        safe_row = fx.arith.select(here.row < rows, here.row, type(here.row)(0))
        rstd = tensors[4][safe_row]
        mu = fx.Float32(0.0)
        if fx.const_expr(not flags.rms):
            mu = tensors[3][safe_row]
        terms = (rc, flags, tensors, here, n, rows, rstd, mu)
        dots = [fx.Float32(0.0)] * (1 if flags.rms else 2)
        dots = _first_pass_segments(cfg, terms, sums_smem, partial_row, dots)
        c1, c2, _ = _row_constants(rc, flags, here, smem, parity, dots, inv_n)
        _second_pass_segments(cfg, terms, tensors[5], c1, c2)
        parity = 1 - parity


def _first_pass(cfg: BackwardConfig, flags: NormFlags, sums_smem, partial_row, pos, chunks, g, xhat, dys, dots):
    """Adds the chunks' terms to the column sums; returns ``dots`` plus their ``sum(g * xhat)`` (and ``sum(g)``)."""
    if fx.const_expr(cfg.sums > 0):
        terms = [[a * h for a, h in zip(dys, xhat, strict=True)], dys]
        _column_sums_add(cfg, sums_smem, partial_row, pos, chunks, terms[: cfg.sums])
    part = [thread_reduce([a * h for a, h in zip(g, xhat, strict=True)])]
    if fx.const_expr(not flags.rms):
        part.append(thread_reduce(g))
    return [a + b for a, b in zip(dots, part, strict=True)]


def _segment(cfg: BackwardConfig, seg):
    return tuple(seg * cfg.segment + k for k in range(cfg.segment))


def _first_pass_segments(cfg: BackwardConfig, terms, sums_smem, partial_row, dots):
    """The first pass over a row too long for registers: a dynamic loop over segments, so that the compiler does
    not hoist every segment's loads (and their registers)."""
    flags, pos = terms[1], terms[3]
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, dys = _load_terms(*terms, chunks)
        dots = _first_pass(cfg, flags, sums_smem, partial_row, pos, chunks, g, xhat, dys, dots)
    return dots


def _second_pass_segments(cfg: BackwardConfig, terms, dx, c1, c2):
    """dx of a row too long for registers: it is read again, segment by segment (from L2, just read)."""
    rc, pos, n, rows, rstd = terms[0], terms[3], terms[4], terms[5], terms[6]
    for seg in range(0, cfg.row.chunks // cfg.segment):
        chunks = _segment(cfg, seg)
        g, xhat, _ = _load_terms(*terms, chunks)
        store_row(rc, dx, pos, n, rows, _dx(rstd, g, xhat, c1, c2), chunks=chunks)


def _dx(rstd, g, xhat, c1, c2):
    return [rstd * (a - h * c1 - c2) for a, h in zip(g, xhat, strict=True)]


def _load_terms(rc: RowConfig, flags: NormFlags, tensors, pos, n, rows, rstd, mu, chunks):
    """``(dy * weight, xhat, dy)`` of this thread's ``chunks`` of row ``pos.row``."""
    dys, _ = load_row(rc, tensors[0], pos, n, rows, chunks=chunks)
    xs, _ = load_row(rc, tensors[1], pos, n, rows, chunks=chunks)
    return _terms(rc, flags, tensors[2], pos, n, rows, rstd, mu, chunks, dys, xs)


def _terms(rc: RowConfig, flags: NormFlags, weight, pos, n, rows, rstd, mu, chunks, dys, xs):
    """``(dy * weight, xhat, dy)`` from the loaded ``dys`` and ``xs`` of ``chunks``."""
    if fx.const_expr(flags.rms):
        xhat = [v * rstd for v in xs]
    else:  # the padding is 0, not -mean * rstd
        xhat = masked([(v - mu) * rstd for v in xs], row_masks(rc, pos, n, rows, chunks))
    g = dys
    if fx.const_expr(flags.weight):
        ws = []
        for j in chunks:
            ws += load_vector_chunk(rc, weight, pos, n, j)
        g = [a * w for a, w in zip(dys, ws, strict=True)]
    return g, xhat, dys


def _write_partial(cfg: BackwardConfig, sums_smem, partial_row, pos):
    rc = cfg.row
    for s in fx.range_constexpr(cfg.sums):
        for j in fx.range_constexpr(rc.chunks):
            for q in fx.range_constexpr(rc.vec // 4):
                total = [fx.Float32(0.0)] * 4
                for slot in fx.range_constexpr(rc.rows_per_cta):
                    view = fx.local_tile(sums_smem, (4,), (_sum_index(cfg, pos, s, slot, j, q),))
                    total = [a + b for a, b in zip(total, _load4(view), strict=True)]
                partial_row.store(s, j, q, total)


_COL_LANES, _COL_SLICES, _COL_UNROLL = 32, 16, 8  # column sums: 32 columns x 16 slices of partial rows per block


def _masked_load(t, row, col, ok):
    """``t[row, col]`` where ``ok``, else 0 (and no access out of bounds: row and column clamped to 0)."""
    safe_row = fx.arith.select(ok, row, type(row)(0))
    return fx.arith.select(ok, t[safe_row, fx.arith.select(ok, col, type(col)(0))], fx.Float32(0.0))


@flyc.kernel
def column_sum_kernel(partial: fx.Tensor, dweight: fx.Tensor, dbias: fx.Tensor, sums: fx.Constexpr[int]):
    """``dweight[c] = sum_p partial[p, c]`` and ``dbias[c] = sum_p partial[p, N + c]`` in float32, converted to
    their dtype. A block covers 32 columns: slice ``s`` of its 16 adds partial rows ``s*8 .. s*8+7, s*8+128 ...``
    (8 independent loads in flight per thread), then the slices are added through shared memory, always in the
    same order: deterministic."""
    flyc.set_kernel_attributes(threads=_COL_LANES * _COL_SLICES)
    parts = partial.shape[0]
    n = fx.size(dweight.layout).to(fx.Int32)  # a 1-D layout's shape is a scalar
    lane = gpu.thread_idx.x % _COL_LANES
    part = gpu.thread_idx.x // _COL_LANES
    col = gpu.block_idx.x * _COL_LANES + lane
    ok = col < sums * n
    acc = fx.Float32(0.0)
    step = _COL_SLICES * _COL_UNROLL
    for p0 in range(part * _COL_UNROLL, parts, step):
        loaded = [_masked_load(partial, p0 + u, col, ok & (p0 + u < parts)) for u in range(_COL_UNROLL)]
        acc = acc + thread_reduce(loaded)
    slices = fx.SmemAllocator().allocate(fx.Float32, fl.Layout((_COL_SLICES, _COL_LANES)))
    slices[part, lane] = acc
    gpu.barrier()
    if part == 0:
        total = fx.Float32(0.0)
        for s in fx.range_constexpr(_COL_SLICES):
            total = total + slices[s, lane]
        if col < n:
            dweight[col] = total.to(dweight.dtype)
        if fx.const_expr(sums > 1):
            if (col >= n) & ok:
                dbias[col - n] = total.to(dbias.dtype)


def _launch(kernel, cfg: RowConfig, grid: int, *args) -> None:
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    kernel(*args, cfg).launch(grid=grid, block=cfg.block, cluster=cluster_shape)


@functools.cache
def _flags(*flags: bool) -> NormFlags:
    """One NormFlags object per variant: the native dispatcher then matches it by identity, without hashing."""
    return NormFlags(*flags)


def forward(x, residual, weight, bias, out, residual_out, mean, rstd, eps: float, rms: bool) -> None:
    """Launches the forward on validated :class:`~flydsl.kernels.host.RowTensor` arguments (None where absent)."""
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = _flags(rms, residual is not None, weight is not None, bias is not None, mean is not None, rstd is not None)
    cfg = row_config(n, x.dtype, held=2 if residual is not None else 1)
    placeholder = x.obj
    args = [t.obj if t is not None else placeholder for t in (x, residual, weight, bias, out, residual_out, mean, rstd)]
    cluster_shape = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
    norm_forward_kernel(*args, eps, cfg, flags).launch(grid=cfg.grid(rows), block=cfg.block, cluster=cluster_shape)


def _aligned16(*tensors) -> bool:
    """Every tensor's rows start at 16-byte boundaries (pointer and row stride)."""
    for t in tensors:
        size = 4 if t.dtype == "f32" else 2
        if t.pointer % 16 or (t.shape[0] > 1 and (t.strides[0] * size) % 16):
            return False
    return True


def backward(dy, x, weight, mean, rstd, dx, dweight, dbias, rms: bool) -> None:
    rows, n = x.shape
    if rows == 0 or n == 0:
        return
    flags = _flags(rms, False, weight is not None, dbias is not None, False, False)
    sums = 0 if weight is None else (2 if dbias is not None else 1)
    # The staged kernel copies 16-byte chunks: rows (and pointers) must be 16-byte aligned.
    cfg = backward_config(n, x.dtype, sums, _aligned16(dy, x, dx))
    rc = cfg.row
    active = None
    if rc.cluster_shape is not None:
        active = max_active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, x.device)
    groups = backward_groups(cfg, rows, sm_count(x.device), active)
    partial = empty_rows(x, (groups, sums * n), "dweight/dbias partial sums") if sums else x.obj
    placeholder = x.obj
    exchange = placeholder
    if rc.team:  # the team's tagged row sums, zeroed (one small memset)
        exchange = empty_rows(x, (rows, exchange_columns(cfg)), "backward row sums")
        exchange.zero_() if hasattr(exchange, "zero_") else exchange.fill(0)
    mean_obj = mean.obj if mean is not None else rstd.obj
    w_obj = weight.obj if weight is not None else placeholder
    norm_backward_kernel(dy.obj, x.obj, w_obj, mean_obj, rstd.obj, dx.obj, partial, exchange, cfg, flags).launch(
        grid=groups * rc.cluster, block=rc.block, cluster=rc.cluster_shape
    )
    if sums:
        db_obj = dbias.obj if dbias is not None else dweight.obj
        column_sum_kernel(partial, dweight.obj, db_obj, sums).launch(
            grid=-(-sums * n // _COL_LANES), block=_COL_LANES * _COL_SLICES
        )
