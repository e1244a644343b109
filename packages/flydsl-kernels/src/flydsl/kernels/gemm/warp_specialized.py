"""The warp-specialized persistent Hopper GEMM: ``C = epilogue(A @ B^T)`` of bf16/fp16 (MN, K) operand views, fp32
accumulation.

One CTA per SM walks the work units of a tile scheduler (:mod:`~flydsl.kernels.gemm.schedulers`: grouped tiles,
split K or stream-K). In each CTA, warpgroup 0 is the producer: one thread streams the A and B tiles of every K step
through an ``fx.TmaPipeline`` of ``stages`` shared-memory slots (:func:`~flydsl.kernels.gemm.operands.produce`). The
other warpgroups are consumers: each multiplies its rows of the tile with ``wgmma``
(:func:`~flydsl.kernels.gemm.mainloop.mma_steps`), sums split or streamed parts through fp32 partial tiles
(:mod:`~flydsl.kernels.gemm.partials`) and stores C through the epilogue
(:func:`~flydsl.kernels.gemm.epilogue.store_accumulators`). The producer gives most of its registers to the consumers
(``setmaxnreg``).

:func:`warp_specialized_gemm` is the kernel's body; :func:`gemm_ws` and :func:`gemm_ws_scaled` (the epilogue's
float32 scales as two more tensors) are the kernels that call it. The host side that plans their launches is
:mod:`~flydsl.kernels.gemm.plan`.
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm, wgmma
from flydsl.kernels.gemm.block_scales import (
    BLOCK,
    SCALE_PRODUCERS,
    a_scales_bytes,
    allocate_scales,
    tile_takes_blocks,
)
from flydsl.kernels.gemm.epilogue import (
    EpilogueTensors,
    TileStore,
    finish_stores,
    store_accumulators,
    tma_store_staging,
)
from flydsl.kernels.gemm.mainloop import Consumer, drain, mma_steps, promoted_steps
from flydsl.kernels.gemm.operands import Producer, allocate_operand, produce
from flydsl.kernels.gemm.partials import PartialTiles, add_stream_k_partials, split_k_last, store_stream_k_partials
from flydsl.kernels.gemm.schedulers import dense_scheduler, expert_scheduler

__all__ = [
    "GemmTensors",
    "gemm_ws",
    "gemm_ws_blockscaled",
    "gemm_ws_grouped",
    "gemm_ws_grouped_blockscaled",
    "gemm_ws_scaled",
    "warp_specialized_gemm",
]

_PRODUCER_REGISTERS, _CONSUMER_REGISTERS = 40, 232


class GemmTensors(NamedTuple):
    """The tensors of one warp-specialized GEMM, as the kernel sees them: ``a``, ``b`` (TMA descriptors of the
    (MN, K) views), ``c``, ``c_store`` (C's descriptor in (64, 64) boxes for the TMA-store epilogue; unused without
    it), the epilogue's tensors (:class:`~flydsl.kernels.gemm.epilogue.EpilogueTensors`), the partial tiles'
    fp32 ``workspace`` and int32 ``flags`` (split K and stream-K; unread otherwise) and, for a block-scaled GEMM,
    ``block_scales``: (A's (M, K / 128) scales, B's (N / 128, K / 128)), applied per K step in the mainloop
    (:func:`~flydsl.kernels.gemm.mainloop.promoted_steps`); for a grouped GEMM (a mixture of experts' stages),
    ``groups``: (``expert_of_block``, ``padded_count``) of ``flydsl.kernels.moe.align_tokens``, B the experts'
    (N, K) weights stacked ((E * N, K), K-major) and A's rows in the aligned order
    (:class:`~flydsl.kernels.gemm.schedulers.ExpertTiles`)."""

    a: object
    b: object
    c: object
    c_store: object
    epilogue: EpilogueTensors
    workspace: object
    flags: object
    block_scales: tuple | None = None
    groups: tuple | None = None


def warp_specialized_gemm(tensors: GemmTensors, cfg, majors, epilogue) -> None:
    """The kernel body: ``cfg`` a :class:`~flydsl.kernels.gemm.config.GemmConfig`, ``majors`` ``(a_major, b_major)``
    ("K" or "MN"), ``epilogue`` an :class:`~flydsl.kernels.gemm.epilogue.Epilogue` whose scales ``tensors.epilogue``
    holds. Call it from a ``@flyc.kernel`` (it sets the block size, register cap and cluster)."""
    blockscaled = tensors.block_scales is not None
    gated = epilogue.gate is not None  # B tiles of gate rows, then the up rows C's width further (ExpertTiles)
    if blockscaled and (
        cfg.schedule != "cooperative"
        or cfg.tile_k != BLOCK
        or not tile_takes_blocks(cfg.tile_n, 1 + gated, tensors.groups is not None, cfg.consumer_rows)
    ):
        raise ValueError(
            f"gemm_ws_blockscaled: {cfg}: expected the cooperative schedule, K steps of {BLOCK} (one scale block"
            f" each) and a tile_n of at most {BLOCK} whose blocks of B rows (gated: two) divide {BLOCK} (one B scale"
            f" per block and step), or of {BLOCK + BLOCK // 2} (two blocks) in a dense GEMM with 64 rows per"
            " consumer (the sums of 128 rows beside a block's parts fill a consumer's registers at 128 columns)"
        )
    # The register cap setmaxnreg needs (threads + one CTA per SM) and the cluster, from the configuration.
    flyc.set_kernel_attributes(threads=cfg.threads, min_blocks_per_sm=1, cluster=cfg.cluster)
    a, b, c = tensors.a, tensors.b, tensors.c
    a_major, b_major = majors
    smem = fx.SmemAllocator()
    # B's tiles from two row blocks (gated: the gate rows and the up rows, C's width apart), or prepared panels of
    # C's width in rows each.
    sources = (2 if gated else 1, c.shape[1].to(fx.Int32)) if gated or b_major == "prepared" else (1, 0)
    a_tiles = allocate_operand(smem, "a", a, cfg.tile_m, cfg.tile_k, cfg.stages, a_major, cfg.cluster_n)
    b_tiles = allocate_operand(smem, "b", b, cfg.tile_n, cfg.tile_k, cfg.stages, b_major, cfg.cluster_m, sources)
    tma = tma_store_staging(smem, c, tensors.c_store, cfg) if epilogue.store == "tma" else None
    scales = allocate_scales(smem, *tensors.block_scales, cfg.tile_m, cfg.stages) if blockscaled else None
    # A slot is freed by one arrival per warp of the consumers that read it (pingpong: one; cooperative: all) in
    # every CTA of the cluster (the multicast parts land in all of them).
    pingpong = cfg.schedule == "pingpong"
    draining = 1 if pingpong else cfg.consumers
    # A slot is full once its TMA bytes (block-scaled: the A scales' too) have landed and, block-scaled, the
    # producer's cp.async copies of the B scales.
    producers = 1 + (SCALE_PRODUCERS if blockscaled else 0)
    tx_bytes = cfg.stage_bytes(a.element_bytes) + (a_scales_bytes(cfg.tile_m) if blockscaled else 0)
    pipe = fx.TmaPipeline(smem, cfg.stages, tx_bytes, consumers=4 * draining * cfg.cluster, producers=producers)
    if fx.const_expr(pingpong):
        # Pingpong consumers take turns at their units' K steps (CUTLASS's math order barrier): order[c] completes
        # when the other consumer has waited for every K step of its unit. Without it, a consumer a whole unit of
        # K steps ahead waits on a full barrier whose parity reads as done two phases early (e.g. at once on a
        # fresh barrier when k_tiles // stages is odd).
        order = fx.mbarrier.allocate(smem, 2)
        if gpu.thread_idx.x == 0:
            for turn_of in fx.range_constexpr(2):
                order[turn_of].init(128)  # every thread of the consumer warpgroup that finished its K steps
    arrivals = smem.allocate(fx.Int32, cfg.consumers) if cfg.split_k > 1 else None  # see split_k_last
    pipe.init(sync=cfg.cluster == 1)  # its fence and block/cluster sync cover the order barriers' init too
    rank = 0
    peers = None
    if fx.const_expr(cfg.cluster > 1):
        fx.cluster.sync()  # every CTA's barriers are initialized before any multicast or remote arrival
        rank = fx.cluster.block_rank()
        peers = list(range(cfg.cluster))

    m_extent = c.shape[0].to(fx.Int32)
    n_extent = c.shape[1].to(fx.Int32)
    k_extent = a.shape[1] if a_major == "K" else a.shape[0]
    k_tiles = ((k_extent + (cfg.tile_k - 1)) // cfg.tile_k).to(fx.Int32)
    if fx.const_expr(tensors.groups is not None):
        expert_of_block, padded_count = tensors.groups
        blocks = padded_count[0].to(fx.Int32) // (cfg.tile_m * cfg.cluster_m)
        columns = n_extent * 2 if gated else n_extent  # accumulator columns: each expert's rows of B
        schedule = expert_scheduler(blocks, columns, k_tiles, cfg, rank, expert_of_block, columns)
    else:
        schedule = dense_scheduler(m_extent, n_extent, k_tiles, cfg, rank)
    store = TileStore(c, epilogue, tensors.epilogue, cfg, tma)

    tid = gpu.thread_idx.x
    warpgroup = tid // 128
    if warpgroup == 0:
        nvvm.setmaxnreg(_PRODUCER_REGISTERS, increase=False)
        if tid == 0:  # one thread produces
            a.prefetch()
            b.prefetch()
            if fx.const_expr(blockscaled):
                scales.a.prefetch()
            producer = Producer(pipe, a_tiles, b_tiles, rank)
            state = pipe.producer_start()
            for unit in range(schedule.worker, schedule.count, schedule.stride):
                state = produce(producer, state, schedule.work(unit), scales)
            if fx.const_expr(cfg.stream_k):
                for segment in range(schedule.segments):
                    state = produce(producer, state, schedule.segment(segment)[1], scales)
    else:
        nvvm.setmaxnreg(_CONSUMER_REGISTERS, increase=True)
        consumer = warpgroup - 1
        mma = wgmma.TiledMma(
            wgmma.MmaAtom(a.dtype, cfg.tile_n, b_dtype=b.dtype),
            tile_m=cfg.tile_m,
            tile_n=cfg.tile_n,
            warpgroups_m=cfg.tile_m // cfg.consumer_rows,
        )
        lane = tid % 32
        warp = (tid // 32) % 4
        mainloop = Consumer(pipe, mma, a_tiles, b_tiles, consumer, lane, peers)
        state = pipe.consumer_start()
        first, stride = schedule.worker, schedule.stride
        turn = 0  # pingpong: the parity of this consumer's next wait on order[consumer]
        if fx.const_expr(pingpong):  # consumer c takes the CTA's units c, c + 2, ...: past the other's K steps
            state = state.advance_by(consumer * k_tiles)
            first, stride = first + consumer * stride, 2 * stride
            turn = 1 - consumer  # consumer 0's first wait passes at once (parity 1 on a fresh barrier)
        for unit in range(first, schedule.count, stride):
            work = schedule.work(unit)
            if fx.const_expr(pingpong):  # the other consumer has waited for all K steps of the unit before
                order[consumer].wait(turn)
                turn = turn ^ 1
            if fx.const_expr(blockscaled):
                offset = None  # the consumers' one start apart (two consumers, whole tiles: each unit has steps)
                if fx.const_expr(cfg.consumers == 2 and cfg.split_k == 1 and not pingpong):
                    offset = unit == first
                state, accs = promoted_steps(
                    mainloop, state, work.k_begin, work.k_end, scales, warp, work.tile_n, offset
                )
            else:
                state, released, accs = mma_steps(mainloop, state, work.k_begin, work.k_end)
                if fx.const_expr(pingpong):  # its turn: this unit's K steps were all waited for (MMAs may run)
                    order[1 - consumer].arrive()
                accs = drain(mainloop, released, accs, work.k_begin, work.k_end, cfg.split_k > 1)
            if fx.const_expr(cfg.split_k == 1):
                store_accumulators(store, accs, work.tile_m, work.tile_n, consumer, lane, warp, work.b_row0)
            else:  # a whole tile stores C; of a split tile, the part that finishes last sums them all and stores C
                last, sums = fx.Boolean(True), accs
                if unit >= schedule.split_from:
                    part = unit - schedule.split_from
                    partials = PartialTiles(tensors.workspace, tensors.flags, cfg, rank, consumer, tid % 128, arrivals)
                    last, sums = split_k_last(accs, part, partials)
                if last:
                    store_accumulators(store, sums, work.tile_m, work.tile_n, consumer, lane, warp)
            if fx.const_expr(pingpong):
                state = state.advance_by(k_tiles)  # the other consumer's unit's K steps
        if fx.const_expr(cfg.stream_k):
            partials = PartialTiles(tensors.workspace, tensors.flags, cfg, rank, consumer, tid % 128)
            slot = gpu.block_idx.x.to(fx.Int32) * cfg.consumers + consumer
            for segment in range(schedule.segments):  # (names apart from the loop above: each loop has its own)
                tile, sk_work = schedule.segment(segment)
                if fx.const_expr(blockscaled):
                    state, sk_accs = promoted_steps(
                        mainloop, state, sk_work.k_begin, sk_work.k_end, scales, warp, sk_work.tile_n
                    )
                else:
                    state, sk_released, sk_accs = mma_steps(mainloop, state, sk_work.k_begin, sk_work.k_end)
                    sk_accs = drain(mainloop, sk_released, sk_accs, sk_work.k_begin, sk_work.k_end, False)
                if sk_work.k_begin > 0:  # a later part of the tile: the finisher adds it
                    store_stream_k_partials(sk_accs, partials, slot)
                else:
                    if sk_work.k_end < k_tiles:
                        sk_accs = add_stream_k_partials(sk_accs, partials, schedule, tile)
                    store_accumulators(store, sk_accs, sk_work.tile_m, sk_work.tile_n, consumer, lane, warp)
        finish_stores(store, tid)
    if fx.const_expr(cfg.cluster > 1):
        fx.cluster.sync()  # no CTA leaves while a peer may still multicast into it or arrive on its barriers


# Kernel parameters: each tensor is one (they are not nested), hence the long signatures.
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
    """C = epilogue(A @ B^T) of the (MN, K) views ``a``, ``b`` (``majors``: ``(a_major, b_major)``), ``epilogue`` an
    :class:`~flydsl.kernels.gemm.epilogue.Epilogue` without scales: ``bias`` is a (N,) tensor added to every row (any
    tensor, unread, without a bias); with ``store="tma"``, tiles are stored through shared memory by ``c_store``,
    C's descriptor in boxes of (64, 64) (16-bit C; any descriptor, unused, otherwise). Partial tiles go through
    ``workspace`` (fp32, ``consumer_rows * tile_n`` elements per slot) and ``flags`` (int32 zeros): with
    ``cfg.stream_k`` one slot and flag per consumer warpgroup of the grid; with ``cfg.split_k > 1`` one slot per
    consumer warpgroup of each CTA of each work unit and one counter per tile's (any tensors, unread, otherwise)."""
    if epilogue.scales:
        raise ValueError(f"gemm_ws: an epilogue with scales takes gemm_ws_scaled, got {epilogue}")
    bias_or_none = bias if epilogue.bias else None
    tensors = GemmTensors(a, b, c, c_store, EpilogueTensors(bias_or_none), workspace, flags)
    warp_specialized_gemm(tensors, cfg, majors, epilogue)


@flyc.kernel
def gemm_ws_scaled(
    a: fx.TmaDescriptor,
    b: fx.TmaDescriptor,
    c: fx.Tensor,
    c_store: fx.TmaDescriptor,
    bias: fx.Tensor,
    scale_0: fx.Tensor,
    scale_1: fx.Tensor,
    workspace: fx.Tensor,
    flags: fx.Tensor,
    cfg: fx.Constexpr,
    majors: fx.Constexpr,
    epilogue: fx.Constexpr,
):
    """:func:`gemm_ws` with one or two float32 scales in the epilogue: ``scale_0`` (and ``scale_1``) as
    ``epilogue.scales`` describes them (e.g. ``Scale(rows=1)``: one per row of C, ``Scale(columns=1)``: one per
    column), multiplied into the accumulators before the bias (``scale_1`` any tensor, unread, with one scale)."""
    if not 1 <= len(epilogue.scales) <= 2:
        raise ValueError(f"gemm_ws_scaled: expected an epilogue with one or two scales, got {epilogue}")
    scales = (scale_0, scale_1)[: len(epilogue.scales)]
    bias_or_none = bias if epilogue.bias else None
    tensors = GemmTensors(a, b, c, c_store, EpilogueTensors(bias_or_none, scales), workspace, flags)
    warp_specialized_gemm(tensors, cfg, majors, epilogue)


@flyc.kernel
def gemm_ws_blockscaled(
    a: fx.TmaDescriptor,
    b: fx.TmaDescriptor,
    c: fx.Tensor,
    c_store: fx.TmaDescriptor,
    bias: fx.Tensor,
    a_scales: fx.TmaDescriptor,
    b_scales: fx.Tensor,
    workspace: fx.Tensor,
    flags: fx.Tensor,
    cfg: fx.Constexpr,
    majors: fx.Constexpr,
    epilogue: fx.Constexpr,
):
    """:func:`gemm_ws` of fp8 operands with block scales: ``C[m, n] = sum over K blocks kb of (A[m, kb] . B[n, kb]) *
    a_scales[m, kb] * b_scales[n // 128, kb]`` (blocks of 128 along K), each block's MMAs promoted into the float32
    sums with its scales, then ``epilogue``'s bias and activation (it takes no scales). ``a_scales``: the TMA
    descriptor of the (M, ceil(K / 128)) float32 scales, M-major (``block_scales_plan.a_scales_view``); ``b_scales``
    (ceil(N / 128), ceil(K / 128)) float32, any strides."""
    if epilogue.scales:
        raise ValueError(f"gemm_ws_blockscaled: the block scales replace the epilogue's, got {epilogue}")
    bias_or_none = bias if epilogue.bias else None
    tensors = GemmTensors(
        a, b, c, c_store, EpilogueTensors(bias_or_none), workspace, flags, block_scales=(a_scales, b_scales)
    )
    warp_specialized_gemm(tensors, cfg, majors, epilogue)


@flyc.kernel
def gemm_ws_grouped(
    a: fx.TmaDescriptor,
    b: fx.TmaDescriptor,
    c: fx.Tensor,
    c_store: fx.TmaDescriptor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    scale_0: fx.Tensor,
    scale_1: fx.Tensor,
    cfg: fx.Constexpr,
    epilogue: fx.Constexpr,
):
    """A mixture of experts' grouped GEMM: row block ``i`` (``cfg.tile_m`` rows of A and C) times expert
    ``expert_of_block[i]``'s weights, for the blocks below ``padded_count[0]`` (``flydsl.kernels.moe.align_tokens``'
    outputs, read on the GPU). ``a`` (capacity, K) and ``b`` the stacked (E * N, K) weights, both K-major; C
    (capacity, N), or with ``epilogue.gate`` (C's N = I) ``gate(x @ w[:I].T) * (x @ w[I:].T)`` of each expert's
    (2I, K) weights ``w`` (gate rows, then up rows: ``nn.Linear``'s order); rows of C past ``padded_count`` are not
    written. ``c_store``: as :func:`gemm_ws`'s (C in (64, 64) boxes for ``epilogue.store == "tma"``). fp8 operands
    take ``epilogue.scales`` (up to two: ``scale_0``, ``scale_1``; unread beyond), e.g. ``Scale(rows=1)`` per row of
    A and ``Scale(columns=1, experts=True)`` per row of the stacked weights, applied before the gate."""
    if epilogue.bias or len(epilogue.scales) > 2:
        raise ValueError(f"gemm_ws_grouped: expected an epilogue without bias, at most two scales: {epilogue}")
    scales = EpilogueTensors(None, (scale_0, scale_1)[: len(epilogue.scales)])
    tensors = GemmTensors(a, b, c, c_store, scales, None, None, groups=(expert_of_block, padded_count))
    warp_specialized_gemm(tensors, cfg, ("K", "K"), epilogue)


@flyc.kernel
def gemm_ws_grouped_blockscaled(
    a: fx.TmaDescriptor,
    b: fx.TmaDescriptor,
    c: fx.Tensor,
    c_store: fx.TmaDescriptor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    a_scales: fx.TmaDescriptor,
    b_scales: fx.Tensor,
    cfg: fx.Constexpr,
    epilogue: fx.Constexpr,
):
    """:func:`gemm_ws_grouped` of fp8 operands with block scales (:func:`gemm_ws_blockscaled`'s promotion):
    ``a_scales`` the TMA descriptor of the (capacity, ceil(K / 128)) scales, one per row of A and 128-wide block of
    K, M-major (``block_scales_plan.a_scales_view``), ``b_scales`` (E * N / 128, ceil(K / 128)), one per 128 x 128 block
    of the stacked weights (each expert's N rows whole blocks). With ``epilogue.gate``, a tile's gate rows and up
    rows each take their own block's scale. The epilogue takes no scales."""
    if epilogue.bias or epilogue.scales:
        raise ValueError(f"gemm_ws_grouped_blockscaled: expected an epilogue without bias or scales: {epilogue}")
    tensors = GemmTensors(
        a,
        b,
        c,
        c_store,
        EpilogueTensors(),
        None,
        None,
        block_scales=(a_scales, b_scales),
        groups=(expert_of_block, padded_count),
    )
    warp_specialized_gemm(tensors, cfg, ("K", "K"), epilogue)
