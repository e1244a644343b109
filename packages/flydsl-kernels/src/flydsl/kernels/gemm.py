"""Hopper GEMM: ``C = A @ B`` in bf16/fp16 with fp32 accumulation, a warp-specialized persistent kernel.

One CTA per SM walks output tiles in a grouped order (``fx.TileScheduler``). In each CTA, warpgroup 0 is the
producer: one thread streams the (BM, BK) tile of A and the (BN, BK) tile of B for every K step through a
``fx.TmaPipeline`` of ``stages`` shared-memory slots. The other warpgroups are consumers: each owns 64 rows of the
tile, issues ``wgmma`` for every K step (keeping one step in flight), releases each slot once its MMAs are done,
and writes its accumulators to C (converted, bounds-checked at the edges). The producer gives most of its registers
to the consumers (``setmaxnreg``).

Operands are (MN, K) views, as wgmma reads them: A is (M, K) row-major ("K"-major, the usual) or the transpose
of a (K, M) row-major tensor ("MN"-major); the same for B with (N, K) (e.g. ``nn.Linear`` weights: ``x @ w.T``)
or (K, N) row-major (``a @ b``). TMA moves 16-byte aligned rows: an operand whose rows are not (odd K, or odd M or N
of an MN-major operand, other strides) is first copied into aligned rows; tails of tiles are zero-filled by TMA and
masked in the epilogue.

    from flydsl.kernels.gemm import gemm
    c = gemm(a, b)                     # a (M, K), b (K, N): torch tensors on the GPU, bf16 or fp16
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.compiler.args import torch_dtype_name
from flydsl.expr import arith, gpu, nvvm, vector, wgmma
from flydsl.kernels.gemm_config import (
    SMEM_BYTES,
    STAGING_BOX,
    GemmConfig,
    candidate_configs,
    choose_config,
    cluster_tiles,
    estimated_seconds,
    max_stages,
    split_plan,
    staging_bytes,
)
from flydsl.kernels.gemm_epilogue import ACTIVATIONS, apply_epilogue, store_accumulators
from flydsl.kernels.host import sm_count, stream_key

__all__ = [
    "ACTIVATIONS",
    "GemmConfig",
    "candidate_configs",
    "choose_config",
    "estimated_seconds",
    "max_stages",
    "gemm",
    "gemm_ws",
    "staging_bytes",
    "split_k_reduce",
]

_SWIZZLE = 128  # bytes: the widest swizzle; a TMA box row holds 128 bytes (64 bf16) at most
_PRODUCER_REGISTERS, _CONSUMER_REGISTERS = 40, 232


def operand_layout(rows: int, tile_k: int, stages: int, major: str, element_bytes: int = 2):
    """Shared memory for one operand, as an (MN, K, stage) layout TMA fills box by box and wgmma reads:

    * K-major: boxes of (rows, 64) along K, each 128-byte rows under the 128B swizzle (the wgmma K-major atom);
    * MN-major: boxes of (tile_k, 64) of the (K, MN) tensor, one per 64 rows of MN."""
    row = _SWIZZLE // element_bytes  # elements of one swizzled row
    swizzle = fl.Swizzle(3, 4 - (element_bytes.bit_length() - 1), 3)
    box = rows * row if major == "K" else tile_k * row
    if major == "K":
        inner = fl.Layout((rows, (row, tile_k // row), stages), (row, (1, box), rows * tile_k))
    else:
        inner = fl.Layout(((row, rows // row), tile_k, stages), ((1, box), row, rows * tile_k))
    return fl.ComposedLayout(swizzle, 0, inner)


def _load_operand(desc, tiles, stage, mn0, k0, barrier, rows: int, tile_k: int, major: str, part=0, parts: int = 1):
    """The TMA loads of part ``part`` of ``parts`` (along MN) of one operand's (rows, tile_k) tile at (mn0, k0) into
    slot ``stage``; with several parts, each is multicast to the ``parts`` CTAs of the cluster (one part: the whole
    tile, ``part`` ignored)."""
    row = _SWIZZLE // desc.element_bytes
    slot = tiles[None, None, stage]
    mask = None if parts == 1 else (1 << parts) - 1
    part = part if parts > 1 else 0
    part_rows = rows // parts
    if major == "K":  # one box of (part_rows, 64) per 64 columns of K
        for kb in fx.range_constexpr(tile_k // row):
            target = fx.local_tile(slot[None, (None, kb)], (part_rows, row), (part, 0))
            desc.load(target, (mn0 + part * part_rows, k0 + kb * row), barrier, multicast_mask=mask)
    else:  # one box of (tile_k, 64) of the (K, MN) tensor per 64 rows of MN
        for mb in fx.range_constexpr(part_rows // row):
            box = part * (part_rows // row) + mb
            desc.load(slot[(None, box), None], (k0, mn0 + box * row), barrier, multicast_mask=mask)


def _cta_tile(ctm, ctn, rank, cfg):
    """This CTA's (tile row, tile column) in cluster tile (ctm, ctn): its cluster's CTAs take consecutive rows
    (``cluster_m``) or columns (``cluster_n``), in rank order."""
    tm = ctm * cfg.cluster_m + rank if cfg.cluster_m > 1 else ctm
    tn = ctn * cfg.cluster_n + rank if cfg.cluster_n > 1 else ctn
    return tm, tn


def _work(sched, unit, split_from, split: int, k_tiles):
    """(cluster tile row, cluster tile column, first K step, end K step) of work unit ``unit``: a whole tile before
    ``split_from``, from it on one of the ``split`` parts of a tile's K steps (gemm_config.split_plan)."""
    if fx.const_expr(split == 1):
        ctm, tn = sched.coords(unit)
        return ctm, tn, 0, k_tiles
    part = unit - split_from  # (negative for whole tiles: selected away)
    is_part = unit >= split_from
    ctm, tn = sched.coords(arith.select(is_part, split_from + part // split, unit))
    per_split = (k_tiles + (split - 1)) // split
    k_begin = arith.select(is_part, (part % split) * per_split, 0)
    k_end = arith.select(is_part, arith.minimum(k_begin + per_split, k_tiles), k_tiles)
    return ctm, tn, k_begin, arith.maximum(k_end, k_begin)


@flyc.kernel
def split_k_reduce(partials: fx.Tensor, out: fx.Tensor, bias: fx.Tensor, splits: fx.Constexpr, epilogue: fx.Constexpr):
    """out = epilogue(sum of the ``splits`` row blocks of fp32 ``partials``), one element per thread (64-bit
    indices: M x N may exceed 2^31)."""
    has_bias, activation = epilogue
    m_extent, n_extent = out.shape[0].to(fx.Int64), out.shape[1].to(fx.Int64)
    i = gpu.block_idx.x.to(fx.Int64) * gpu.block_dim.x.to(fx.Int64) + gpu.thread_idx.x.to(fx.Int64)
    if i < m_extent * n_extent:
        row, col = i // n_extent, i % n_extent
        total = partials[row, col]
        for s in fx.range_constexpr(1, splits):
            total = total + partials[row + s * m_extent, col]
        out[row, col] = apply_epilogue(total, bias if has_bias else None, col, activation).to(out.dtype)


def _produce(pipe, state, a, b, a_tiles, b_tiles, cfg, majors, tm, tn, k_begin, k_end, rank):
    """The producer thread's TMA loads of one work unit: K steps [k_begin, k_end) of tile (tm, tn); with a cluster,
    this CTA's part of each shared tile (B's along M, A's along N), multicast to the cluster."""
    a_major, b_major = majors
    for kt in range(k_begin, k_end):
        pipe.producer_acquire(state)
        bar = pipe.full[state.index]
        k0 = kt * cfg.tile_k
        a_at, b_at = tm * cfg.tile_m, tn * cfg.tile_n
        _load_operand(a, a_tiles, state.index, a_at, k0, bar, cfg.tile_m, cfg.tile_k, a_major, rank, cfg.cluster_n)
        _load_operand(b, b_tiles, state.index, b_at, k0, bar, cfg.tile_n, cfg.tile_k, b_major, rank, cfg.cluster_m)
        state = state.advance()
    return state


def _mainloop(pipe, state, mma, a_tiles, b_tiles, k_begin, k_end, consumer, lane, peers):
    """A consumer warpgroup's MMAs of K steps [k_begin, k_end), one step in flight: each slot is released once the
    next step's MMAs are issued and its own are done. Returns (the state past the steps, the last slot's state, not
    yet released, the accumulators)."""
    accs = mma.make_accumulators(0.0)
    released = state
    for kt in range(k_begin, k_end):
        pipe.consumer_wait(state)
        accs = wgmma.fence(accs)
        accs = mma.mma(
            a_tiles[None, None, state.index],
            b_tiles[None, None, state.index],
            accs,
            accumulate=kt > k_begin,
            warpgroup=consumer,
        )
        wgmma.commit_group()
        accs = wgmma.wait_group(1, accs)  # the previous step's MMAs are done: its slot may be refilled
        if kt > k_begin:
            if lane == 0:  # the warp's MMAs of that step are done (wait_group is warpgroup-wide)
                pipe.consumer_release(released, peers)
            released = released.advance()
        state = state.advance()
    return state, released, accs


def _drain(pipe, released, accs, lane, peers, k_begin, k_end, maybe_empty: bool):
    """Waits for the unit's last MMAs and releases their slot (``maybe_empty``: a split of K may have no steps, and
    then no slot). The wait is unconditional: with nothing pending it returns at once, and where a path could skip it
    ptxas serializes every wgmma of the kernel (C7514)."""
    accs = wgmma.wait_group(0, accs)
    if fx.const_expr(maybe_empty):
        if k_end > k_begin:
            if lane == 0:
                pipe.consumer_release(released, peers)
    else:
        if lane == 0:
            pipe.consumer_release(released, peers)
    return accs


# --- stream-K -----------------------------------------------------------------------------------------------------
# With cfg.stream_k, the tiles past the last full wave but one (all of them when there are fewer tiles than workers,
# a worker being a CTA or a cluster) are cut into their K steps, and each worker takes an equal, contiguous range of
# those steps in tile order, so that every SM has the same work. A range starts and ends inside tiles: the worker
# that has a tile's first K steps (it reaches them last, at the end of its range) finishes the tile: it adds the
# fp32 partial sums of the later workers that had the tile's other steps (each worker has at most one such segment,
# the first of its range: one workspace slot per consumer warpgroup of each CTA), then stores it through the
# epilogue. Partials are handed over by a flag per slot (release/acquire at GPU scope), reset by its reader. A
# finisher waits only for workers after it, so there is no cycle; every CTA of the grid (at most one per SM) is
# resident or becomes so.


def _stream_k_plan(units, workers, worker, k_tiles):
    """(tiles taken whole by every worker, the first stream-K tile this worker touches, how many it touches, and a
    function giving worker j's first K step of the stream-K steps: worker j has [begin(j), begin(j + 1)))."""
    whole = arith.select(units % workers == 0, units, arith.maximum(units // workers - 1, 0) * workers)
    total = ((units - whole) * k_tiles).to(fx.Int64)
    count64 = workers.to(fx.Int64)

    def begin(j):
        return (j.to(fx.Int64) * total // count64).to(fx.Int32)

    first_step, end_step = begin(worker), begin(worker + 1)
    first = first_step // k_tiles
    touched = arith.select(end_step > first_step, (end_step - 1) // k_tiles - first + 1, 0)
    return whole, first, touched, begin


def _stream_k_segment(first, segment, begin, worker, k_tiles):
    """(stream-K tile, first K step, end K step) of this worker's ``segment``-th segment."""
    tile = first + segment
    start = tile * k_tiles
    return tile, arith.maximum(begin(worker) - start, 0), arith.minimum(begin(worker + 1) - start, k_tiles)


def _partial_index(slot, mi, q, cfg, t):
    """The workspace index of 4 accumulators (``q``-th quad of block ``mi``) of thread ``t`` of a warpgroup: each
    thread's quads are 16 bytes apart from its neighbours', so every access is a coalesced 16-byte one. 64-bit:
    split K's workspace (a slot per work unit) may exceed 2^31 floats."""
    within = ((mi * (cfg.tile_n // 8) + q) * 128 + t) * 4
    return slot.to(fx.Int64) * (cfg.consumer_rows * cfg.tile_n) + within.to(fx.Int64)


def _write_partials(accs, workspace, slot, cfg, consumer, t):
    """A consumer warpgroup's fp32 partial sums into workspace ``slot``, then its barrier (every thread's stores
    issued before one thread releases them)."""
    for mi in fx.range_constexpr(len(accs)):
        for q in fx.range_constexpr(cfg.tile_n // 8):
            quad = vector.from_elements(_F32X4, [accs[mi][4 * q + i] for i in range(4)])
            vector.store(quad, workspace, (_partial_index(slot, mi, q, cfg, t),))
    nvvm.barrier(1 + consumer, 128)


def _store_partials(accs, workspace, flags, slot, cfg, consumer, t):
    """A stream-K contributor's fp32 partial sums into its workspace slot, then its flag raised."""
    _write_partials(accs, workspace, slot, cfg, consumer, t)
    if t == 0:
        nvvm.red_add_release(flags, 1, slot)


def _split_k_last(accs, workspace, counters, arrivals, unit, cfg, rank, consumer, t):
    """Split K with no waiting: every split of a tile writes its fp32 partial sums to its own slot, then counts
    itself on the tile's counter; the split that counts last, whichever finishes last, adds the other splits'
    partials to its own (acquired by its count) and resets the counter for the next launch. Returns (last, sums).
    ``unit``: the K part's index among the split units (from 0); ``arrivals``: one shared Int32 per consumer,
    through which the counting thread tells its warpgroup."""
    split = cfg.split_k
    per_unit = cfg.cluster * cfg.consumers
    slot = unit * per_unit + rank * cfg.consumers + consumer
    _write_partials(accs, workspace, slot, cfg, consumer, t)
    counter = (unit // split) * per_unit + rank * cfg.consumers + consumer
    if t == 0:
        arrivals[consumer] = nvvm.atom_add_acq_rel(counters, 1, counter)
    nvvm.barrier(1 + consumer, 128)
    last = arrivals[consumer] == split - 1
    sums = accs
    if last:
        if t == 0:
            counters[counter] = 0
        own, first = unit % split, slot - (unit % split) * per_unit
        for s in fx.range_constexpr(1, split):  # the others, in turn after this one's own
            sums = _plus_partial(sums, workspace, first + ((own + s) % split) * per_unit, cfg, t)
    return last, sums


def _await_partial(flags, slot, t):
    """Thread ``t`` == 0 waits until workspace ``slot`` holds its partial sums (acquire), then resets the flag
    for the next launch; the warpgroup's barrier must follow before its threads read the slot."""
    if t == 0:
        seen = nvvm.ld_acquire(flags, slot)
        while seen == 0:
            seen = nvvm.ld_acquire(flags, slot)
        flags[slot] = 0


def _plus_partial(accs, workspace, slot, cfg, t):
    """``accs`` plus the partial sums of workspace ``slot`` (awaited already)."""
    summed = []
    for mi in fx.range_constexpr(len(accs)):
        quads = [
            vector.load_op(_F32X4, workspace, (_partial_index(slot, mi, q, cfg, t),))
            for q in fx.range_constexpr(cfg.tile_n // 8)
        ]
        summed.append(accs[mi] + vector.from_elements(type(accs[mi]), [x for quad in quads for x in quad]))
    return summed


def _add_partials(accs, workspace, flags, cfg, worker, begin, tile, k_tiles, rank, consumer, t):
    """The stream-K finisher's sum: the partials of every later worker whose range starts inside ``tile`` (a worker
    with no steps has none)."""
    end_of_tile = (tile + 1) * k_tiles
    j = worker + 1
    while begin(j) < end_of_tile:  # begin(workers) is the last step's end: the loop stops by then
        if begin(j) < begin(j + 1):
            slot = (j * cfg.cluster + rank) * cfg.consumers + consumer
            _await_partial(flags, slot, t)
            nvvm.barrier(1 + consumer, 128)  # the warpgroup reads after the acquire
            accs = _plus_partial(accs, workspace, slot, cfg, t)
        j = j + 1
    return accs


_F32X4 = vector.vector_class(fx.Float32, 4)


@flyc.kernel
def gemm_ws(
    a: fx.TmaDescriptor,
    b: fx.TmaDescriptor,
    c: fx.Tensor,
    c_store: fx.TmaDescriptor,
    bias: fx.Tensor,
    workspace: fx.Tensor,
    flags: fx.Tensor,
    cfg: fx.Constexpr,
    majors: fx.Constexpr,
    epilogue: fx.Constexpr,
):
    """C = A @ B^T of the (MN, K) views ``a``, ``b`` (majors: ``(a_major, b_major)``), through the epilogue
    ``(has_bias, activation[, "tma"])``: ``bias`` is a (N,) tensor added to every row (any tensor, unread, when
    ``has_bias`` is False); with "tma", tiles are stored through shared memory by ``c_store``, C's descriptor in
    boxes of (64, 64) (16-bit C; any descriptor, unused, otherwise). Partial tiles go through ``workspace`` (fp32,
    ``consumer_rows * tile_n`` elements per slot) and ``flags`` (int32 zeros): with ``cfg.stream_k`` one slot and
    flag per consumer warpgroup of the grid; with ``cfg.split_k > 1`` one slot per consumer warpgroup of each CTA of
    each work unit and one counter per tile's (any tensors, unread, otherwise)."""
    # The register cap setmaxnreg needs (threads + one CTA per SM) and the cluster, from the configuration.
    flyc.set_kernel_attributes(threads=cfg.threads, min_blocks_per_sm=1, cluster=cfg.cluster)
    a_major, b_major = majors
    has_bias, activation, *store = epilogue
    bias_or_none = bias if has_bias else None
    by_tma = store == ["tma"]
    element_bytes = a.element_bytes
    row = _SWIZZLE // element_bytes
    for name, desc, rows, major, parts in (
        ("a", a, cfg.tile_m, a_major, cfg.cluster_n),
        ("b", b, cfg.tile_n, b_major, cfg.cluster_m),
    ):
        box = (rows // parts, row) if major == "K" else (cfg.tile_k, row)
        if major != "K" and (rows // parts) % row:
            raise ValueError(f"gemm_ws {name}: MN-major parts of {rows // parts} rows; expected multiples of {row}")
        if desc.box != box or desc.swizzle != _SWIZZLE:
            raise ValueError(f"gemm_ws {name}: expected TMA boxes of {box} with a 128B swizzle, got {desc.box}")
    smem = fx.SmemAllocator()
    a_tiles = smem.allocate(a.dtype, operand_layout(cfg.tile_m, cfg.tile_k, cfg.stages, a_major), alignment=1024)
    b_tiles = smem.allocate(b.dtype, operand_layout(cfg.tile_n, cfg.tile_k, cfg.stages, b_major), alignment=1024)
    tma = None
    if fx.const_expr(by_tma):
        if cfg.tile_n % STAGING_BOX[1]:
            raise ValueError(f"gemm_ws: the TMA-store epilogue takes tile_n in 64-column parts, got {cfg.tile_n}")
        if c_store.box != STAGING_BOX or c_store.dtype is not c.dtype:
            raise ValueError("gemm_ws c_store: expected C's descriptor in boxes of (64, 64)")
        tma = (c_store, c_store.allocate(smem, cfg.store_boxes * cfg.consumers))
    # A slot is freed by one arrival per warp of the consumers that read it (pingpong: one; cooperative: all) in
    # every CTA of the cluster (the multicast parts land in all of them).
    pingpong = cfg.schedule == "pingpong"
    draining = 1 if pingpong else cfg.consumers
    pipe = fx.TmaPipeline(smem, cfg.stages, cfg.stage_bytes(element_bytes), consumers=4 * draining * cfg.cluster)
    if fx.const_expr(pingpong):
        # Pingpong consumers take turns at their units' K steps (CUTLASS's math order barrier): order[c] completes
        # when the other consumer has waited for every K step of its unit. Without it, a consumer a whole unit of
        # K steps ahead waits on a full barrier whose parity reads as done two phases early (e.g. at once on a
        # fresh barrier when k_tiles // stages is odd).
        order = fx.mbarrier.allocate(smem, 2)
        if gpu.thread_idx.x == 0:
            for turn_of in fx.range_constexpr(2):
                order[turn_of].init(128)  # every thread of the consumer warpgroup that finished its K steps
    arrivals = smem.allocate(fx.Int32, cfg.consumers) if cfg.split_k > 1 else None  # see _split_k_last
    pipe.init(sync=cfg.cluster == 1)  # its fence and block/cluster sync cover the order barriers' init too
    rank = 0
    peers = None
    if fx.const_expr(cfg.cluster > 1):
        fx.cluster.sync()  # every CTA's barriers are initialized before any multicast or remote arrival
        rank = fx.cluster.block_rank()
        peers = list(range(cfg.cluster))

    split = cfg.split_k
    m_extent = c.shape[0].to(fx.Int32)
    n_extent = c.shape[1].to(fx.Int32)
    k_extent = a.shape[1] if a_major == "K" else a.shape[0]
    k_tiles = ((k_extent + (cfg.tile_k - 1)) // cfg.tile_k).to(fx.Int32)
    tiles_m = ((m_extent + (cfg.tile_m - 1)) // cfg.tile_m).to(fx.Int32)
    tiles_n = ((n_extent + (cfg.tile_n - 1)) // cfg.tile_n).to(fx.Int32)
    cluster_tiles_m = (tiles_m + (cfg.cluster_m - 1)) // cfg.cluster_m
    cluster_tiles_n = (tiles_n + (cfg.cluster_n - 1)) // cfg.cluster_n
    sched = fx.TileScheduler(cluster_tiles_m, cluster_tiles_n, group_m=cfg.group_m, cluster_size=cfg.cluster)
    split_from, units = split_plan(sched.count, sched.stride, cfg)  # work units: tiles, then (tile, K part) pairs
    worker = sched.first
    whole, sk_first, sk_segments, sk_begin = units, 0, 0, None
    if fx.const_expr(cfg.stream_k):
        whole, sk_first, sk_segments, sk_begin = _stream_k_plan(units, sched.stride, worker, k_tiles)

    tid = gpu.thread_idx.x
    warpgroup = tid // 128
    if warpgroup == 0:
        nvvm.setmaxnreg(_PRODUCER_REGISTERS, increase=False)
        if tid == 0:
            a.prefetch()
            b.prefetch()
            state = pipe.producer_start()
            for unit in range(worker, whole, sched.stride):
                ctm, ctn, k_begin, k_end = _work(sched, unit, split_from, split, k_tiles)
                tm, tn = _cta_tile(ctm, ctn, rank, cfg)
                state = _produce(pipe, state, a, b, a_tiles, b_tiles, cfg, majors, tm, tn, k_begin, k_end, rank)
            if fx.const_expr(cfg.stream_k):
                for segment in range(sk_segments):  # (names apart from the loop above: each loop has its own)
                    tile, kb, ke = _stream_k_segment(sk_first, segment, sk_begin, worker, k_tiles)
                    sk_tm, sk_tn = _cta_tile(*sched.coords(whole + tile), rank, cfg)
                    state = _produce(pipe, state, a, b, a_tiles, b_tiles, cfg, majors, sk_tm, sk_tn, kb, ke, rank)
    else:
        nvvm.setmaxnreg(_CONSUMER_REGISTERS, increase=True)
        consumer = warpgroup - 1
        mma = wgmma.TiledMma(
            wgmma.MmaAtom(a.dtype, cfg.tile_n),
            tile_m=cfg.tile_m,
            tile_n=cfg.tile_n,
            warpgroups_m=cfg.tile_m // cfg.consumer_rows,
        )
        lane = tid % 32
        warp = (tid // 32) % 4
        state = pipe.consumer_start()
        first, stride = worker, sched.stride
        turn = 0  # pingpong: the parity of this consumer's next wait on order[consumer]
        if fx.const_expr(pingpong):  # consumer c takes the CTA's units c, c + 2, ...: past the other's K steps
            state = state.advance_by(consumer * k_tiles)
            first, stride = first + consumer * stride, 2 * stride
            turn = 1 - consumer  # consumer 0's first wait passes at once (parity 1 on a fresh barrier)
        for unit in range(first, whole, stride):
            ctm, ctn, k_begin, k_end = _work(sched, unit, split_from, split, k_tiles)
            tm, tn = _cta_tile(ctm, ctn, rank, cfg)
            if fx.const_expr(pingpong):  # the other consumer has waited for all K steps of the unit before
                order[consumer].wait(turn)
                turn = turn ^ 1
            state, released, accs = _mainloop(pipe, state, mma, a_tiles, b_tiles, k_begin, k_end, consumer, lane, peers)
            if fx.const_expr(pingpong):  # its turn: this unit's K steps were all waited for (MMAs may still run)
                order[1 - consumer].arrive()
            accs = _drain(pipe, released, accs, lane, peers, k_begin, k_end, split > 1)
            if fx.const_expr(split == 1):
                store_accumulators(accs, c, bias_or_none, activation, cfg, tm, tn, consumer, lane, warp, tma=tma)
            else:  # a whole tile stores C; of a split tile, the part that finishes last sums them all and stores C
                last, sums = fx.Boolean(True), accs
                if unit >= split_from:
                    last, sums = _split_k_last(
                        accs, workspace, flags, arrivals, unit - split_from, cfg, rank, consumer, tid % 128
                    )
                if last:
                    store_accumulators(sums, c, bias_or_none, activation, cfg, tm, tn, consumer, lane, warp, tma=tma)
            if fx.const_expr(pingpong):
                state = state.advance_by(k_tiles)  # the other consumer's unit's K steps
        if fx.const_expr(cfg.stream_k):
            t = tid % 128
            slot = gpu.block_idx.x.to(fx.Int32) * cfg.consumers + consumer
            for segment in range(sk_segments):  # (names apart from the loop above: each loop has its own)
                tile, kb, ke = _stream_k_segment(sk_first, segment, sk_begin, worker, k_tiles)
                sk_tm, sk_tn = _cta_tile(*sched.coords(whole + tile), rank, cfg)
                state, sk_released, sk_accs = _mainloop(
                    pipe, state, mma, a_tiles, b_tiles, kb, ke, consumer, lane, peers
                )
                sk_accs = _drain(pipe, sk_released, sk_accs, lane, peers, kb, ke, False)
                if kb > 0:  # a later part of the tile: the finisher adds it
                    _store_partials(sk_accs, workspace, flags, slot, cfg, consumer, t)
                else:
                    if ke < k_tiles:
                        sk_accs = _add_partials(
                            sk_accs, workspace, flags, cfg, worker, sk_begin, tile, k_tiles, rank, consumer, t
                        )
                    store_accumulators(
                        sk_accs, c, bias_or_none, activation, cfg, sk_tm, sk_tn, consumer, lane, warp, tma=tma
                    )
        if fx.const_expr(by_tma):
            if tid % 128 == 0:
                fx.tma.wait_group(0)  # this consumer's last TMA stores have written C
    if fx.const_expr(cfg.cluster > 1):
        fx.cluster.sync()  # no CTA leaves while a peer may still multicast into it or arrive on its barriers


_TILES: dict[tuple, tuple] = {}  # operand geometry -> its TmaTile (addresses only: no tensor kept alive)
_TILES_LIMIT = 512


def _operand_tile(t, mn_dim: int, rows: int, tile_k: int, name: str) -> tuple[fx.TmaTile, str]:
    """The TmaTile and major of an operand whose MN extent is dimension ``mn_dim`` of the 2-D tensor ``t`` (A: 0,
    B: 1), as wgmma reads it: K-major (K contiguous) as the (MN, K) matrix in boxes of (rows, 64); MN-major as the
    (K, MN) matrix in boxes of (tile_k, 64). Cached per geometry, so a call builds no views and checks nothing twice."""
    pointer, shape, strides = t.data_ptr(), t.shape, t.stride()
    k_dim = 1 - mn_dim
    key = (pointer, shape, strides, t.dtype, mn_dim, rows, tile_k)
    cached = _TILES.get(key)
    if cached is not None:
        return cached
    dtype = torch_dtype_name(t.dtype, name)
    row = _SWIZZLE // t.element_size()
    if strides[k_dim] == 1:
        major, geometry = "K", ((shape[mn_dim], shape[k_dim]), (strides[mn_dim], 1), (rows, row))
    elif strides[mn_dim] == 1:
        major, geometry = "MN", ((shape[k_dim], shape[mn_dim]), (strides[k_dim], 1), (tile_k, row))
    else:
        raise ValueError(f"gemm {name}: expected a row- or column-major matrix, got strides {strides}")
    matrix, matrix_strides, box = geometry
    try:
        tile = fx.TmaTile.of_memory(pointer, matrix, matrix_strides, dtype, box, device=t.get_device())
    except ValueError as error:
        raise ValueError(f"gemm {name}: {error}") from None
    if len(_TILES) >= _TILES_LIMIT:
        _TILES.pop(next(iter(_TILES)))
    _TILES[key] = (tile, major)
    return tile, major


def _tma_ready(t):
    """``t`` itself when TMA can read it (one unit stride, the other a multiple of 16 bytes with no overlap of rows,
    so no broadcast stride 0; a 16-byte aligned start), else a copy that it can: rows padded to 16 bytes, the padding
    outside the view (TMA reads zeros past a view's extent, so K tails need no zero fill). Odd K, odd M/N of
    MN-major operands and arbitrary strides then work, at the cost of one copy of that operand."""
    (rows, cols), (row_stride, col_stride) = t.shape, t.stride()
    step = 16 // t.element_size()
    if t.data_ptr() % 16 == 0 and (
        (col_stride == 1 and row_stride % step == 0 and row_stride >= cols)
        or (row_stride == 1 and col_stride % step == 0 and col_stride >= rows)
    ):
        return t
    if row_stride == 1 and col_stride != 1:  # column-major: pad the columns of the transpose
        return _tma_ready(t.t()).t()
    padded = t.new_empty((rows, -(-cols // step) * step))
    padded[:, :cols] = t
    return padded[:, :cols]


def _staging_fits(cfg: GemmConfig) -> bool:
    """The TMA-store epilogue applies to ``cfg``: its tiles split into 64-column parts (the staging boxes' width),
    and the staging boxes fit in shared memory beside the pipeline."""
    return cfg.tile_n % STAGING_BOX[1] == 0 and cfg.stages * cfg.stage_bytes() + staging_bytes(cfg) <= SMEM_BYTES - 1024


def _store_tile_of(out, cfg: GemmConfig):
    """C's TmaTile in boxes of (64, 64) for the TMA-store epilogue, or None where it does not apply: C not 16-bit,
    its rows not 16-byte aligned or overlapping (a row stride under N, even in a one-row view: TMA's descriptor
    would refuse it), or no shared memory left beside the pipeline for the staging boxes. On every launch: cheap
    checks first, the tile from _operand_tile's cache."""
    if out.element_size() != 2 or not _staging_fits(cfg):
        return None
    row_stride = out.stride(0)
    if out.data_ptr() % 16 or row_stride % 8 or row_stride < out.shape[1]:  # 8 16-bit elements: 16 bytes
        return None
    return _operand_tile(out, 0, STAGING_BOX[0], STAGING_BOX[1], "out")[0]


_PARTIALS_SCRATCH: dict[tuple, tuple] = {}  # host.stream_key -> (fp32 workspace, int32 flags)


def _partials_scratch(like, ctas: int, cfg: GemmConfig):
    """The workspace of partial tiles (fp32, one slot per consumer warpgroup of ``ctas`` CTAs or work units) and its
    flags for the device and current stream of ``like`` (a torch tensor), grown as needed. Kernels of one stream run
    one after another, so they share them; every launch leaves the flags at zero (each is reset by its reader)."""
    import torch

    key, device = stream_key(like), like.device
    slots = ctas * cfg.consumers
    elements = slots * cfg.consumer_rows * cfg.tile_n
    held = _PARTIALS_SCRATCH.get(key)
    if held is None or held[0].numel() < elements or held[1].numel() < slots:
        size = max(elements, held[0].numel() if held else 0), max(slots, held[1].numel() if held else 0)
        workspace = torch.empty(size[0], dtype=torch.float32, device=device)
        held = workspace, torch.zeros(size[1], dtype=torch.int32, device=device)
        _PARTIALS_SCRATCH[key] = held
    return held


def check_arguments(who: str, a, b, out, bias, activation):
    """The checks every GEMM entry point makes before launching, naming the argument: ``a`` (M, K) and ``b``
    (K, N) 2-D CUDA tensors of one 16-bit float dtype on one device, ``out`` (M, N) row-major bf16/fp16/fp32 there
    (allocated in a's dtype when None), ``bias`` (N,) contiguous in a's dtype or float32, ``activation`` one of
    ACTIVATIONS. Returns ``(m, n, k, out)``. Devices are checked by :func:`check_devices`."""
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{who} {name}: expected a 2-D CUDA torch tensor, got {type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{who} {name}: expected bfloat16 or float16, got {t.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"{who}: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{who}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    elif (
        not isinstance(out, torch.Tensor)
        or out.shape != (m, n)
        or out.stride(-1) != 1
        or out.dtype not in (torch.bfloat16, torch.float16, torch.float32)
    ):
        raise ValueError(
            f"{who} out: expected a row-major ({m}, {n}) bf16/fp16/fp32 tensor, got"
            f" {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
            f" strides {out.stride() if isinstance(out, torch.Tensor) else ()}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"{who} activation: expected one of {ACTIVATIONS}, got {activation!r}")
    if bias is not None and (
        not isinstance(bias, torch.Tensor)
        or bias.device != a.device
        or bias.shape != (n,)
        or bias.stride(0) != 1
        or bias.dtype not in (a.dtype, torch.float32)
    ):
        raise ValueError(
            f"{who} bias: expected a contiguous ({n},) tensor of {a.dtype} or float32 on {a.device}, got"
            f" {getattr(bias, 'dtype', type(bias).__name__)} {tuple(getattr(bias, 'shape', ()))}"
        )
    return m, n, k, out


def check_devices(who: str, a, b, out) -> None:
    """The last check before launching (after :func:`check_arguments`, whose checks thus run on CPU tensors too):
    ``a``, ``b`` and ``out`` on one CUDA device."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not t.is_cuda or t.device != a.device:
            raise ValueError(f"{who} {name}: expected a CUDA tensor on {a.device}, got one on {t.device}")


def zero_product(out, bias, activation):
    """``out`` of a product with an empty dimension: nothing for M or N = 0, the epilogue of zeros for K = 0."""
    import torch

    if out.numel() == 0:
        return out
    zero = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    result = zero if bias is None else zero + bias.float()
    if activation is not None:
        result = {"relu": torch.relu, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[activation](
            result
        )
    return out.copy_(result)


def gemm(a, b, out=None, config: GemmConfig | None = None, *, bias=None, activation: str | None = None):
    """``out = activation(a @ b + bias)`` for torch tensors on one GPU: a (M, K), b (K, N), bf16 or fp16 (both the
    same), each row- or column-major; ``bias`` (N,) contiguous, in a's dtype or float32; ``activation`` None,
    "relu", "gelu" (erf) or "silu", applied in float32 before the conversion to ``out``'s dtype; ``out`` (M, N)
    row-major bf16/fp16/fp32, allocated in a's dtype when not given. ``config``: the tile configuration (default:
    :func:`choose_config`)."""

    m, n, k, out = check_arguments("gemm", a, b, out, bias, activation)
    check_devices("gemm", a, b, out)
    if m == 0 or n == 0 or k == 0:
        return zero_product(out, bias, activation)
    if config is None and m <= 16 and b.stride(0) == 1:  # decode-sized M, nn.Linear weights: stream them
        from flydsl.kernels.skinny_gemm import launch_skinny

        return launch_skinny(a, b, out, bias, activation)
    sms = sm_count(a.get_device())
    cfg = config or choose_config(m, n, k, sms)
    a, b = _tma_ready(a), _tma_ready(b)
    # Each CTA of a cluster loads its part of the shared tile (B's along M, A's along N).
    a_tile, a_major = _operand_tile(a, 0, cfg.tile_m // cfg.cluster_n, cfg.tile_k, "a")
    b_tile, b_major = _operand_tile(b, 1, cfg.tile_n // cfg.cluster_m, cfg.tile_k, "b")
    if b_major != "K" and (cfg.tile_n // cfg.cluster_m) % 64:
        raise ValueError(
            f"gemm config: {cfg} has each CTA load {cfg.tile_n // cfg.cluster_m} columns of each B tile, but b is"
            " MN-major (row-major (K, N)), read in boxes of 64 columns: use a tile_n (divided by cluster_m) that is a"
            " multiple of 64, or b K-major (e.g. an nn.Linear weight w as w.t())"
        )
    workers = sms // cfg.cluster  # CTAs, or clusters; stream-K gives every one of them work
    split_from, units = split_plan(cluster_tiles(m, n, cfg), workers, cfg)
    grid = (workers if cfg.stream_k else min(units, workers)) * cfg.cluster
    bias_arg = bias if bias is not None else out  # unread without a bias
    epilogue = (bias is not None, activation)
    c_store = _store_tile_of(out, cfg)
    if c_store is not None:
        epilogue = (*epilogue, "tma")
    # Partial tiles (stream-K: one slot per CTA; split K: one per K part of each CTA of a cluster).
    if cfg.stream_k or cfg.split_k > 1:
        slots = grid if cfg.stream_k else (units - split_from) * cfg.cluster
        workspace, flags = _partials_scratch(a, slots, cfg)
    else:
        workspace, flags = out, out  # unread
    kernel = gemm_ws(
        a_tile, b_tile, out, c_store or a_tile, bias_arg, workspace, flags, cfg, (a_major, b_major), epilogue
    )
    kernel.launch(grid=grid, block=cfg.threads)
    return out
