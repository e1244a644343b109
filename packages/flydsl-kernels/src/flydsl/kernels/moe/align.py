"""The kernels of :func:`flydsl.kernels.moe.align_tokens`: a stable counting sort of the flattened ``(token * k +
slot)`` indices of ``topk_ids`` by expert, each expert's run padded to a multiple of ``block_m`` for the grouped GEMM.

The ids are cut in chunks, one per CTA, and each chunk in one contiguous range per warp. A warp walks its range 32
ids at a time (``unroll`` such steps' loads issued first): ``match.any.sync`` gives each lane the lanes holding the
same expert, its rank among them is the population count of those below it, and the lowest of them (the leader)
adds the group's size to the warp's counter of that expert in shared memory (a ``warps x E`` table; one leader per
expert and step, ``bar.warp.sync`` between steps). No atomics: the counts, and the order of the scatter below, are
the same on every run. An id outside ``[0, E)`` is dropped: neither counted nor placed.

* ``count_kernel`` (one CTA per chunk): the chunk's count of each expert, ``counts[chunk, e]``.
* ``scan_kernel`` (one CTA of 1024 threads): each expert's total over the chunks (the chunks split among up to 16 slices
  of E threads, each totalling a contiguous range with 8 loads in flight), its padded size (rounded up to ``block_m``),
  the experts' start offsets (an exclusive scan over the block), each chunk's first position for each expert (written
  over ``counts``), the padding of each expert's run (the sentinel T * k), ``starts`` (E + 1 offsets, the last the
  padded total) and ``padded_count``.
* ``scatter_kernel`` (one CTA per chunk): counts its chunk again, per warp, turns the warps' counts into each warp's
  first position per expert (the chunk's from ``counts`` plus the warps before it), and walks again: each id goes to
  its warp's next position for its expert plus its rank in the step. Then, spread over the grid, the positions past
  the padded total get the sentinel and each block of ``block_m`` positions its expert (a binary search of the
  starts; -1 past the padded total).
* ``align_small_kernel``: all of it in one CTA for up to :data:`SMALL_IDS` ids (decode batches): one launch.

Indices within an expert come out in increasing order (chunks, warps and steps are walked in index order, and lanes
by their rank), whatever the GPU's scheduling: the result is deterministic. Positions are ``Int32`` (the entry point
keeps every size below 2^30).
"""

from __future__ import annotations

from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import arith, gpu
from flydsl.kernels.moe.api import MAX_BLOCK_M, MAX_EXPERTS

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = [
    "SMALL_IDS",
    "SCAN_THREADS",
    "AlignConfig",
    "align_plan",
    "count_kernel",
    "scan_kernel",
    "scatter_kernel",
    "align_small_kernel",
]

SCAN_THREADS = 1024
SMALL_IDS = 8192  # up to this many ids, one CTA does everything
_MIN_CHUNK = 2048  # ids per CTA at least (the large path): one iteration per warp
_SCAN_UNROLL = 8  # loads in flight per scan thread
_CHUNKS_PER_SCAN_THREAD = 64  # chunks a scan thread totals at most: the chunk count's cap


@dataclass(frozen=True, kw_only=True)
class AlignConfig:
    """The sort's compile-time choices, checked when built: ``experts`` E (1..512), ``block_m`` (the GEMM's rows per
    block, 1..1024), ``threads`` per CTA of the counting and scattering kernels (a multiple of 32, at least E) and
    ``unroll`` (32-id steps whose loads a warp issues together)."""

    experts: int
    block_m: int
    threads: int = 512
    unroll: int = 4

    def __post_init__(self):
        if not 1 <= self.experts <= MAX_EXPERTS or not 1 <= self.block_m <= MAX_BLOCK_M:
            raise ValueError(f"AlignConfig: experts must be 1..{MAX_EXPERTS} and block_m 1..{MAX_BLOCK_M}, got {self}")
        if self.threads % 32 or not self.experts <= self.threads <= 1024 or not 1 <= self.unroll <= 8:
            raise ValueError(f"AlignConfig: threads must be a multiple of 32 from E to 1024, unroll 1..8, got {self}")

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def step(self) -> int:
        """Ids a warp takes per iteration of its walk."""
        return 32 * self.unroll

    @property
    def padded_experts(self) -> int:
        """E rounded up to a warp: the scan's slice of threads."""
        return -(-self.experts // 32) * 32

    @property
    def slices(self) -> int:
        """Slices of the scan's threads, each totalling a contiguous range of chunks (at most 16)."""
        return min(16, SCAN_THREADS // self.padded_experts)


def align_plan(cfg: AlignConfig, ids: int) -> tuple[int, int]:
    """``(per_warp, chunks)`` for ``ids`` flattened ids: the ids per warp (a multiple of ``cfg.step``) and the CTAs
    (chunks) of the counting and scattering kernels; one chunk (the one-CTA kernel) up to :data:`SMALL_IDS`. Chunks
    hold at least 4096 ids, and there are at most 32 per scan thread (``32 * cfg.slices``)."""
    if ids <= SMALL_IDS:
        per_warp = max(1, -(-max(ids, 1) // cfg.warps))
        return -(-per_warp // cfg.step) * cfg.step, 1
    most = _CHUNKS_PER_SCAN_THREAD * cfg.slices
    chunk = max(_MIN_CHUNK, -(-ids // most))
    per_warp = -(-chunk // (cfg.warps * cfg.step)) * cfg.step
    return per_warp, -(-ids // (per_warp * cfg.warps))


# --- warp-level primitives ------------------------------------------------------------------------------------------


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _match_any(value):
    """``match.any.sync.b32``: the lanes of the warp holding the same 32-bit value (every lane takes part)."""
    return fx.Int32(_nvvm.match_sync(_i32(), fx.Int32(-1).value, value.value, _nvvm.MatchSyncKind.any))


def _popc(value):
    return fx.Int32(_llvm.call_intrinsic(_i32(), "llvm.ctpop.i32", [value.value], [], []))


def _lowest_lane(mask):
    """The lowest set bit's position of a non-zero lane mask."""
    return fx.Int32(_llvm.call_intrinsic(_i32(), "llvm.cttz.i32", [mask.value, fx.Boolean(True).value], [], []))


def _lanes_below():
    return fx.Int32(_nvvm.read_ptx_sreg_lanemask_lt(_i32()))


def _sync_warp():
    """``bar.warp.sync``: the warp's shared-memory writes so far are seen by all its lanes after it."""
    _nvvm.bar_warp_sync(fx.Int32(-1).value)


# --- the walk -------------------------------------------------------------------------------------------------------


def _length(t):
    """A 1-D tensor's extent as an Int32 (< 2^30: checked by align_tokens)."""
    shape = t.shape
    return (shape[0] if isinstance(shape, (tuple, list)) else shape).to(fx.Int32)


def _expert_of(ids, p, stop, experts: int):
    """The expert of flattened index ``p``: ``ids[p]`` if ``p < stop`` and it is in ``[0, E)``, else -1."""
    inside = p < stop
    value = ids[arith.select(inside, p, stop - 1)]  # (stop > 0 wherever a walk has a step)
    ok = inside & (value >= 0) & (value < experts)
    return arith.select(ok, value.to(fx.Int32), fx.Int32(-1))


def _walk(cfg: AlignConfig, ids, hist, start, stop, scatter: bool, sorted_ids=None):
    """This warp's ids ``[start, stop)`` in steps of 32, in order. Counting: each expert's counter of this warp
    (``hist[warp * E + e]``) grows by its ids. Scattering: the counter holds the expert's next position; the step's
    ids of expert e go to it plus their rank, and it grows by their count."""
    lane, warp = gpu.lane_id(), gpu.warp_idx()
    below = _lanes_below()
    row = warp * cfg.experts
    iterations = ((stop - start).fly_max(0) + (cfg.step - 1)) // cfg.step
    for it in range(iterations):
        first = start + it * cfg.step + lane
        experts = [_expert_of(ids, first + 32 * u, stop, cfg.experts) for u in range(cfg.unroll)]  # loads first
        for u in fx.range_constexpr(cfg.unroll):
            expert = experts[u]
            peers = _match_any(expert)
            rank = _popc(peers & below)
            ok = expert >= 0
            slot = row + expert.fly_max(0)
            if fx.const_expr(scatter):
                base = fx.Int32(0)
                if ok & (rank == 0):
                    base = hist[slot]
                    hist[slot] = base + _popc(peers)
                base = gpu.shuffle_idx(base, _lowest_lane(peers))
                if ok:
                    sorted_ids[base + rank] = first + 32 * u
            else:
                if ok & (rank == 0):
                    hist[slot] = hist[slot] + _popc(peers)
            _sync_warp()


def _zero(table, size: int, threads: int):
    """``table[:size]`` (shared) = 0, by the CTA's ``threads`` threads."""
    tid = gpu.thread_idx.x
    for i in fx.range_constexpr(-(-size // threads)):
        index = tid + i * threads
        if fx.const_expr((i + 1) * threads <= size):
            table[index] = fx.Int32(0)
        else:
            if index < size:
                table[index] = fx.Int32(0)


def _warp_range(cfg: AlignConfig, chunk, per_warp, n):
    """This warp's ids ``[start, stop)`` of chunk ``chunk``."""
    start = chunk * (cfg.warps * per_warp) + gpu.warp_idx() * per_warp
    return start, (start + per_warp).fly_min(n)


def _warp_totals(cfg: AlignConfig, hist, expert):
    """Expert ``expert``'s count over the warps of the chunk."""
    total = fx.Int32(0)
    for w in fx.range_constexpr(cfg.warps):
        total = total + hist[w * cfg.experts + expert]
    return total


def _warp_starts(cfg: AlignConfig, hist, expert, first):
    """The warps' counts of ``expert`` replaced by each warp's first position (``first`` plus the warps before)."""
    running = first
    for w in fx.range_constexpr(cfg.warps):
        count = hist[w * cfg.experts + expert]
        hist[w * cfg.experts + expert] = running
        running = running + count


def _warp_inclusive_scan(value):
    """The sum of ``value`` over this lane and the lanes below it (shuffles)."""
    lane = gpu.lane_id()
    inclusive = value
    for d in fx.range_constexpr(5):
        other = gpu.shuffle_idx(inclusive, lane - (1 << d))
        inclusive = inclusive + arith.select(lane >= (1 << d), other, fx.Int32(0))
    return inclusive


def _exclusive_scan(value, totals, warps: int):
    """``(sum of value over the threads before this one, sum over the block)``: a scan within each warp, the warps'
    sums scanned by the first warp through ``totals`` (shared, ``warps + 1`` elements)."""
    lane, warp = gpu.lane_id(), gpu.warp_idx()
    inclusive = _warp_inclusive_scan(value)
    if lane == 31:
        totals[warp] = inclusive
    gpu.barrier()
    if warp == 0:
        mine = fx.Int32(0)
        if lane < warps:  # (only lane i reads totals[i], which it rewrites below: no hazard between lanes)
            mine = totals[lane]
        running = _warp_inclusive_scan(mine)
        if lane < warps:
            totals[lane] = running - mine
        if lane == warps - 1:
            totals[warps] = running
    gpu.barrier()
    return totals[warp] + inclusive - value, totals[warps]


def _padded(cfg: AlignConfig, total):
    return (total + (cfg.block_m - 1)) // cfg.block_m * cfg.block_m


def _pad_run(sorted_ids, start, total, padded, sentinel):
    """The padding of one expert's run: positions ``[start + total, start + padded)`` get the sentinel."""
    for q in range(start + total, start + padded):
        sorted_ids[q] = sentinel


def _fill(cfg: AlignConfig, sorted_ids, expert_of_block, starts, sentinel, thread, stride):
    """Spread over ``stride`` threads (this one ``thread``): the sentinel at the positions past the padded total, and
    each block's expert: the last expert whose start is at or before the block's first position (a binary search of
    ``starts``, E + 1 offsets; the experts without ids share their start with the next one), -1 past the total."""
    padded = starts[cfg.experts]
    capacity = _length(sorted_ids)
    for q in range(padded + thread, capacity, stride):
        sorted_ids[q] = sentinel
    blocks = _length(expert_of_block)
    top = 1 << max(0, cfg.experts - 1).bit_length()
    for j in range(thread, blocks, stride):
        position = j * cfg.block_m
        expert = fx.Int32(0)
        bit = top // 2
        while bit >= 1:  # a trace-time loop: log2(E) probes
            candidate = expert + bit
            probe = starts[candidate.fly_min(cfg.experts - 1)]
            expert = arith.select((candidate < cfg.experts) & (probe <= position), candidate, expert)
            bit //= 2
        expert_of_block[j] = arith.select(position < padded, expert, fx.Int32(-1))


# --- the kernels ----------------------------------------------------------------------------------------------------


@flyc.kernel
def count_kernel(ids: fx.Tensor, counts: fx.Tensor, per_warp: fx.Int32, cfg: fx.Constexpr[AlignConfig]):
    """``counts[chunk * E + e]``: the ids of expert e in chunk ``block_idx.x`` (``warps * per_warp`` ids) of the
    flattened ``ids`` (int32 or int64)."""
    flyc.set_kernel_attributes(threads=cfg.threads)
    hist = fx.SmemAllocator().allocate(fx.Int32, cfg.warps * cfg.experts)
    n = _length(ids)
    tid = gpu.thread_idx.x
    chunk = gpu.block_idx.x
    _zero(hist, cfg.warps * cfg.experts, cfg.threads)
    gpu.barrier()
    start, stop = _warp_range(cfg, chunk, per_warp, n)
    _walk(cfg, ids, hist, start, stop, False)
    gpu.barrier()
    if tid < cfg.experts:
        counts[chunk * cfg.experts + tid] = _warp_totals(cfg, hist, tid)


@flyc.kernel
def scan_kernel(
    counts: fx.Tensor,
    starts: fx.Tensor,
    sorted_ids: fx.Tensor,
    padded_count: fx.Tensor,
    sentinel: fx.Int32,
    cfg: fx.Constexpr[AlignConfig],
):
    """Over ``counts`` (chunks x E, int32): each chunk's first position per expert written in its place, the experts'
    padding filled with ``sentinel`` in ``sorted_ids``, ``starts`` (E + 1) and ``padded_count`` (1,)."""
    flyc.set_kernel_attributes(threads=SCAN_THREADS)
    experts, width, slices = cfg.experts, cfg.padded_experts, cfg.slices
    smem = fx.SmemAllocator()
    partial = smem.allocate(fx.Int32, slices * width)
    first_of = smem.allocate(fx.Int32, width)
    totals = smem.allocate(fx.Int32, SCAN_THREADS // 32 + 1)
    tid = gpu.thread_idx.x
    part, expert = tid // width, tid % width
    active = (part < slices) & (expert < experts)
    column = expert.fly_min(experts - 1)
    chunks = _length(counts) // experts
    per_slice = (chunks + (slices - 1)) // slices
    low = (part * per_slice).fly_min(chunks)
    high = arith.select(active, (low + per_slice).fly_min(chunks), low)
    # the slice's total of this expert, _SCAN_UNROLL loads in flight
    total = fx.Int32(0)
    for c in range(low, high, _SCAN_UNROLL):
        loaded = [counts[(c + u).fly_min(high - 1) * experts + column] for u in range(_SCAN_UNROLL)]
        for u in fx.range_constexpr(_SCAN_UNROLL):
            total = total + arith.select(c + u < high, loaded[u], fx.Int32(0))
    if part < slices:
        partial[part * width + expert] = total
    gpu.barrier()
    before, whole = fx.Int32(0), fx.Int32(0)
    for s in range(slices):
        value = partial[s * width + expert.fly_min(width - 1)]
        before = before + arith.select(part > s, value, fx.Int32(0))
        whole = whole + value
    leader = (part == 0) & (expert < experts)  # slice 0's threads stand for their experts
    padded = arith.select(leader, _padded(cfg, whole), fx.Int32(0))
    start, grand = _exclusive_scan(padded, totals, SCAN_THREADS // 32)  # slice 0 first: thread e holds expert e
    if leader:
        first_of[expert] = start
        starts[expert] = start
        _pad_run(sorted_ids, start, whole, padded, sentinel)
    if tid == 0:
        starts[experts] = grand
        padded_count[0] = grand
    gpu.barrier()
    running = first_of[column] + before
    for c in range(low, high, _SCAN_UNROLL):
        loaded = [counts[(c + u).fly_min(high - 1) * experts + column] for u in range(_SCAN_UNROLL)]
        for u in fx.range_constexpr(_SCAN_UNROLL):
            if c + u < high:
                counts[(c + u) * experts + column] = running
                running = running + loaded[u]


@flyc.kernel
def scatter_kernel(
    ids: fx.Tensor,
    counts: fx.Tensor,
    starts: fx.Tensor,
    sorted_ids: fx.Tensor,
    expert_of_block: fx.Tensor,
    per_warp: fx.Int32,
    cfg: fx.Constexpr[AlignConfig],
):
    """Chunk ``block_idx.x``'s ids into ``sorted_ids`` from the chunk's first positions (``counts``, as
    ``scan_kernel`` left them); the tail of ``sorted_ids`` and ``expert_of_block`` spread over the grid."""
    flyc.set_kernel_attributes(threads=cfg.threads)
    smem = fx.SmemAllocator()
    hist = smem.allocate(fx.Int32, cfg.warps * cfg.experts)
    bounds = smem.allocate(fx.Int32, cfg.experts + 1)
    n = _length(ids)
    tid = gpu.thread_idx.x
    chunk = gpu.block_idx.x
    _zero(hist, cfg.warps * cfg.experts, cfg.threads)
    if tid <= cfg.experts:
        bounds[tid] = starts[tid]
    if fx.const_expr(cfg.experts == cfg.threads):
        if tid == 0:
            bounds[cfg.experts] = starts[cfg.experts]
    gpu.barrier()
    start, stop = _warp_range(cfg, chunk, per_warp, n)
    _walk(cfg, ids, hist, start, stop, False)
    gpu.barrier()
    if tid < cfg.experts:
        _warp_starts(cfg, hist, tid, counts[chunk * cfg.experts + tid])
    gpu.barrier()
    _walk(cfg, ids, hist, start, stop, True, sorted_ids)
    _fill(cfg, sorted_ids, expert_of_block, bounds, n, chunk * cfg.threads + tid, gpu.grid_dim.x * cfg.threads)


@flyc.kernel
def align_small_kernel(
    ids: fx.Tensor,
    sorted_ids: fx.Tensor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    per_warp: fx.Int32,
    cfg: fx.Constexpr[AlignConfig],
):
    """The whole sort in one CTA (``warps * per_warp`` ids at least): counts, starts, padding, scatter, tail and
    blocks."""
    flyc.set_kernel_attributes(threads=cfg.threads)
    smem = fx.SmemAllocator()
    hist = smem.allocate(fx.Int32, cfg.warps * cfg.experts)
    bounds = smem.allocate(fx.Int32, cfg.experts + 1)
    totals = smem.allocate(fx.Int32, cfg.warps + 1)
    n = _length(ids)
    tid = gpu.thread_idx.x
    _zero(hist, cfg.warps * cfg.experts, cfg.threads)
    gpu.barrier()
    start, stop = _warp_range(cfg, fx.Int32(0), per_warp, n)
    _walk(cfg, ids, hist, start, stop, False)
    gpu.barrier()
    expert = tid.fly_min(cfg.experts - 1)
    whole = _warp_totals(cfg, hist, expert)
    padded = arith.select(tid < cfg.experts, _padded(cfg, whole), fx.Int32(0))
    first, grand = _exclusive_scan(padded, totals, cfg.warps)
    if tid < cfg.experts:
        _warp_starts(cfg, hist, tid, first)
        bounds[tid] = first
        _pad_run(sorted_ids, first, whole, padded, n)
    if tid == 0:
        bounds[cfg.experts] = grand
        padded_count[0] = grand
    gpu.barrier()
    _walk(cfg, ids, hist, start, stop, True, sorted_ids)
    _fill(cfg, sorted_ids, expert_of_block, bounds, n, tid, cfg.threads)
