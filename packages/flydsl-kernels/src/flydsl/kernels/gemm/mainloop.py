"""The wgmma mainloop: a consumer warpgroup multiplies the K steps of a work unit out of an mbarrier pipeline's slots.

Each step waits for its slot to be full, issues the step's ``wgmma`` MMAs (accumulating after the first step),
commits them and waits until the previous step's MMAs are done, which keeps one step in flight and lets that
previous slot be released to the producer. :func:`drain` then waits for the last step's MMAs and releases its slot.

    consumer = Consumer(pipe, mma, a_tiles, b_tiles, warpgroup=consumer_index, lane=tid % 32, peers=peers)
    state, released, accs = mma_steps(consumer, state, work.k_begin, work.k_end)
    accs = drain(consumer, released, accs, work.k_begin, work.k_end, maybe_empty=False)

Block-scaled fp8 (:func:`promoted_steps`): each K step is one 128-wide block of K, multiplied into fresh
accumulators, then added into the float32 sums times its block's scales (DeepSeek-V3's promotion: the tensor cores'
fp8 accumulation never spans more than one block).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.expr import arith, vector, wgmma
from flydsl.kernels.gemm.operands import OperandTiles

__all__ = ["BLOCK", "BlockScales", "Consumer", "drain", "mma_steps", "promoted_steps"]

BLOCK = 128  # the block-scaled GEMM's scale blocks: 1 x 128 of A (per row), 128 x 128 of B


class Consumer(NamedTuple):
    """A consumer warpgroup's view of the pipeline: the ``fx.TmaPipeline``, its ``wgmma.TiledMma`` (``mma``), the
    operands' slots, its index among the consumers (``warpgroup``: which rows of a cooperative tile it multiplies),
    this thread's ``lane`` in its warp (lane 0 releases the warp's slots) and the cluster's CTA ranks a release
    arrives at (``peers``: None without a cluster)."""

    pipe: object
    mma: object
    a: OperandTiles
    b: OperandTiles
    warpgroup: object
    lane: object
    peers: list | None = None


def mma_steps(consumer: Consumer, state, k_begin, k_end):
    """The MMAs of K steps ``[k_begin, k_end)`` from pipeline ``state`` on, one step in flight: each slot is released
    once the next step's MMAs are issued and its own are done. Returns (the state past the steps, the last slot's
    state, not yet released, the fp32 accumulators)."""
    pipe, mma, lane, peers = consumer.pipe, consumer.mma, consumer.lane, consumer.peers
    a_tiles, b_tiles = consumer.a.tiles, consumer.b.tiles
    accs = mma.make_accumulators(0.0)
    released = state
    for kt in range(k_begin, k_end):
        pipe.consumer_wait(state)
        accs = wgmma.fence(accs)
        accs = mma.mma(
            a_tiles[None, None, state.index],  # (tile_m, tile_k)
            b_tiles[None, None, state.index],  # (tile_n, tile_k)
            accs,
            accumulate=kt > k_begin,
            warpgroup=consumer.warpgroup,
        )
        wgmma.commit_group()
        accs = wgmma.wait_group(1, accs)  # the previous step's MMAs are done: its slot may be refilled
        if kt > k_begin:
            if lane == 0:  # the warp's MMAs of that step are done (wait_group is warpgroup-wide)
                pipe.consumer_release(released, peers)
            released = released.advance()
        state = state.advance()
    return state, released, accs


def drain(consumer: Consumer, released, accs, k_begin, k_end, maybe_empty: bool):
    """Waits for the unit's last MMAs and releases their slot (``maybe_empty``: a split of K may have no steps, and
    then no slot). The wait is unconditional: with nothing pending it returns at once, and where a path could skip it
    ptxas serializes every wgmma of the kernel (C7514)."""
    pipe, lane, peers = consumer.pipe, consumer.lane, consumer.peers
    accs = wgmma.wait_group(0, accs)
    if fx.const_expr(maybe_empty):
        if k_end > k_begin:
            if lane == 0:
                pipe.consumer_release(released, peers)
    else:
        if lane == 0:
            pipe.consumer_release(released, peers)
    return accs


class BlockScales(NamedTuple):
    """A block-scaled GEMM's float32 scales as the kernel reads them: ``a`` (M, ceil(K / 128)), one per row of A and
    128-wide block of K, any strides (row-major as users hold them, or M-major as :func:`quantize_fp8` writes them);
    ``b`` (ceil(N / 128), ceil(K / 128)), one per 128 x 128 block of B; and where this consumer's tile begins:
    ``row0`` (its first row of C) and ``column_block`` (the tile's block of 128 columns: tiles are at most 128 wide
    and divide 128)."""

    a: object
    b: object
    row0: object
    column_block: object


def _step_scales(scales: BlockScales, rows: list, kb) -> list:
    """This thread's factors of K block ``kb`` (clamped into the scales: an empty split part reads a valid one): one
    per row of ``rows`` (clamped into A), ``a[row, kb] * b[column_block, kb]``."""
    kb = arith.minimum(kb, scales.a.shape[1].to(fx.Int32) - 1)
    b_scale = scales.b[scales.column_block, kb].to(fx.Float32)
    return [scales.a[row, kb].to(fx.Float32) * b_scale for row in rows]


def _promote(sums: list, parts: list, factors: list) -> list:
    """``sums + parts * factor`` per accumulator element, each element with its row's factor (wgmma's layout:
    element ``2p + e`` of 64-row block ``mi`` lies in row ``8 (p % 2)`` of the thread's pair of rows ``2 mi``,
    ``2 mi + 1``)."""
    promoted = []
    for mi, (total, part) in enumerate(zip(sums, parts, strict=True)):
        values = [part[j] * factors[2 * mi + (j // 2) % 2] + total[j] for j in range(part.length)]
        promoted.append(vector.from_elements(type(total), values))
    return promoted


def promoted_steps(consumer: Consumer, state, k_begin, k_end, scales: BlockScales, warp):
    """The block-scaled mainloop over K steps ``[k_begin, k_end)`` (each one 128-wide block of K): each step's MMAs
    into fresh accumulators, added into the float32 sums with the step's scales once they are done and their slot is
    released. Steps go in pairs, each into its own set of accumulators, and each promotion (its FMAs) runs while
    MMAs do: a pair's first step is issued, then the previous pair's second step promoted, the second step issued,
    the first promoted once done; the second is waited for, to be promoted under the next pair's first MMAs.
    Nothing is in flight across the loop's back edge: ptxas serializes every wgmma (C7514) where accumulators are
    read while a wgmma issued in an earlier iteration may still run. An odd count's first step runs alone, before
    the pairs. Scales are loaded a pair ahead (their latency, an L2 round trip for M-major scales, hides behind two
    steps' MMAs). Both 64-row blocks' rows of this thread are read from ``scales.row0``; ``warp``: this thread's
    warp in its warpgroup. Returns (the state past the steps, the sums). Nothing stays pending: no :func:`drain`."""
    pipe, mma, lane, peers = consumer.pipe, consumer.mma, consumer.lane, consumer.peers
    a_tiles, b_tiles = consumer.a.tiles, consumer.b.tiles
    last_row = scales.a.shape[0].to(fx.Int32) - 1
    first = scales.row0 + 16 * warp + lane // 4
    blocks = mma.repeats[0]
    rows = [arith.minimum(first + 64 * (r // 2) + 8 * (r % 2), last_row) for r in range(2 * blocks)]

    def factors(kb):  # clamped into the range (an empty one: k_begin): loads ahead of the last steps read valid ones
        return _step_scales(scales, rows, arith.maximum(arith.minimum(kb, k_end - 1), k_begin))

    def issue(step_state, parts):
        pipe.consumer_wait(step_state)
        parts = wgmma.fence(parts)
        parts = mma.mma(
            a_tiles[None, None, step_state.index],
            b_tiles[None, None, step_state.index],
            parts,
            accumulate=False,
            warpgroup=consumer.warpgroup,
        )
        wgmma.commit_group()
        return parts

    def finish(step_state, parts, pending):  # waits for a step's MMAs (``pending``: later ones left) and frees its slot
        parts = wgmma.wait_group(pending, parts)
        if lane == 0:
            pipe.consumer_release(step_state, peers)
        return parts

    sums = mma.make_accumulators(0.0)
    odd = (k_end - k_begin) % 2
    if odd == 1:
        sums = _promote(sums, finish(state, issue(state, mma.make_accumulators(0.0)), 0), factors(k_begin))
        state = state.advance()
    k0 = k_begin + odd
    first_parts, second_parts = mma.make_accumulators(0.0), mma.make_accumulators(0.0)
    second_factors = [fx.Float32(0.0)] * len(rows)  # no second step before the first pair: adds zeros
    first_ahead, second_ahead = factors(k0), factors(k0 + 1)
    for kt in range(k0, k_end, 2):  # steps kt and kt + 1
        first_factors, first_ahead = first_ahead, factors(kt + 2)
        first_state = state
        first_parts = issue(first_state, first_parts)
        sums = _promote(sums, second_parts, second_factors)  # the previous pair's second step
        second_factors, second_ahead = second_ahead, factors(kt + 3)
        state = state.advance()
        second_parts = issue(state, second_parts)
        sums = _promote(sums, finish(first_state, first_parts, 1), first_factors)
        second_parts = finish(state, second_parts, 0)
        state = state.advance()
    sums = _promote(sums, second_parts, second_factors)
    return state, sums
