"""The wgmma mainloop: a consumer warpgroup multiplies the K steps of a work unit out of an mbarrier pipeline's slots.

Each step waits for its slot to be full, issues the step's ``wgmma`` MMAs (accumulating after the first step),
commits them and waits until the previous step's MMAs are done, which keeps one step in flight and lets that
previous slot be released to the producer. :func:`drain` then waits for the last step's MMAs and releases its slot.

    consumer = Consumer(pipe, mma, a_tiles, b_tiles, warpgroup=consumer_index, lane=tid % 32, peers=peers)
    state, released, accs = mma_steps(consumer, state, work.k_begin, work.k_end)
    accs = drain(consumer, released, accs, work.k_begin, work.k_end, maybe_empty=False)

Block-scaled fp8 (:func:`promoted_steps`): each K step is one 128-wide block of K, multiplied into fresh
accumulators, then added into the float32 sums times its block's scales, which travel in the step's slot
(:mod:`~flydsl.kernels.gemm.block_scales`; DeepSeek-V3's promotion: the tensor cores' fp8 accumulation never spans
more than one block).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.compiler import cache
from flydsl.expr import nvvm, vector, wgmma
from flydsl.kernels.gemm.block_scales import BLOCK, StagedScales, step_factors
from flydsl.kernels.gemm.operands import OperandTiles

__all__ = ["PAIRED_ACCUMULATORS", "Consumer", "drain", "mma_steps", "promoted_steps"]


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


def _promote(sums: list, parts: list, factors: list, source_columns: int) -> list:
    """``sums + parts * factor`` per accumulator element, each element with its row's factor for its block of
    ``source_columns`` columns (``factors[row][block]``; wgmma's layout: element ``2p + e`` of 64-row block ``mi``
    lies in row ``8 (p % 2)`` of the thread's pair of rows ``2 mi``, ``2 mi + 1``, and in column ``8 (p // 2) + 2
    (lane % 4) + e``, inside the same 8-column block as column ``8 (p // 2)``)."""
    promoted = []
    for mi, (total, part) in enumerate(zip(sums, parts, strict=True)):
        values = [
            part[j] * factors[2 * mi + (j // 2) % 2][8 * (j // 4) // source_columns] + total[j]
            for j in range(part.length)
        ]
        promoted.append(vector.from_elements(type(total), values))
    return promoted


PAIRED_ACCUMULATORS = 64  # the most accumulators per thread per set for pairs: three sets beside the rest
OFFSET_CONSUMERS = True  # step by step: the second consumer starts once the first's first MMAs are done
OFFSET_BARRIER = 3  # the named barrier of that start (the epilogue's are 1 and 2)
WIDE_UNROLL = 4  # K steps per loop iteration of 192-wide tiles (1, 2 or 4; 4: +4% against 1 on an H100, #unrolled)
WAVES_UNROLL = 2  # K steps per loop iteration of 256-row tiles' waves (1, 2 or 4; 2: +4-7% on an H100, 4 no more)
# Set at run time by tuning scripts: keyed where they differ from these
# (flydsl.compiler.cache.package_key).
cache.declare_tunables(
    __name__, "PAIRED_ACCUMULATORS", "OFFSET_CONSUMERS", "OFFSET_BARRIER", "WIDE_UNROLL", "WAVES_UNROLL"
)


def promoted_steps(consumer: Consumer, state, k_begin, k_end, scales: StagedScales, warp, tile_n=0, offset=None):
    """The block-scaled mainloop over K steps ``[k_begin, k_end)`` (each one 128-wide block of K): each step's MMAs
    into fresh accumulators, added into the float32 sums with the step's scales (read from its slot,
    :func:`~flydsl.kernels.gemm.block_scales.step_factors`, before it is released) once they are done. ``warp``: this
    thread's warp in its warpgroup; ``tile_n``: the work unit's tile index along N (a 192-wide tile's blocks of
    scales depend on it). Returns (the state past the steps, the sums). Nothing stays pending: no :func:`drain`.

    Where three sets of accumulators fit (:data:`PAIRED_ACCUMULATORS` per thread: tiles 128 wide), steps go in pairs,
    each into its own set, and each promotion (its FMAs) runs while MMAs do: a pair's first step is issued, then the
    previous pair's second step promoted, the second step issued, the first promoted once done; the second is waited
    for, to be promoted under the next pair's first MMAs. Nothing is in flight across the loop's back edge: ptxas
    serializes every wgmma (C7514) where accumulators are read while a wgmma issued in an earlier iteration may still
    run. An odd count's first step runs alone, before the pairs. Wider tiles (192: 96 per set) go step by step, one
    set beside the sums: a step's promotion then runs under the other consumer warpgroup's MMAs."""
    pipe, mma, lane, peers = consumer.pipe, consumer.mma, consumer.lane, consumer.peers
    a_tiles, b_tiles = consumer.a.tiles, consumer.b.tiles
    sources = consumer.b.sources  # B scales per step: one per block of the tile's B rows (gate, up)
    source_columns = consumer.b.tile_rows
    straddle = None
    if fx.const_expr(sources == 1 and consumer.b.rows > BLOCK):  # 192 wide: factors per 64 columns
        straddle, source_columns = tile_n % 2 == 0, BLOCK // 2
    blocks = mma.repeats[0]
    # This thread's rows of the tile (wgmma's accumulator layout: rows r and r + 8 of each 64-row block).
    first = consumer.warpgroup * (64 * blocks) + 16 * warp + lane // 4
    rows = [first + 64 * (r // 2) + 8 * (r % 2) for r in range(2 * blocks)]

    def issue(step_state, parts):  # waits for a step's slot and issues its MMAs
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

    def release(step_state):  # the warp's MMAs of the step are done (wait_group is warpgroup-wide), its scales read
        if lane == 0:
            pipe.consumer_release(step_state, peers)

    def factors_of(step_state, of_rows=rows):
        return step_factors(scales, step_state.index, of_rows, sources, straddle)

    sums = mma.make_accumulators(0.0)
    if fx.const_expr(blocks > 1):  # 256-row tiles: each consumer's two 64-row blocks in turn, one set of parts
        waves = _Waves(
            consumer,
            blocks,
            lambda step_state, block: factors_of(step_state, rows[2 * block : 2 * block + 2]),
            release,
            source_columns,
        )
        return waves.steps(state, k_begin, k_end, sums, offset if OFFSET_CONSUMERS else None)
    if fx.const_expr(blocks * mma.tile_n // 2 > PAIRED_ACCUMULATORS):
        parts = mma.make_accumulators(0.0)
        offsetting = offset is not None and OFFSET_CONSUMERS
        if fx.const_expr(offsetting):
            if offset & (consumer.warpgroup == 1):
                nvvm.barrier(OFFSET_BARRIER, 256)

        def step(carried, first):  # first: the unit's first step (True or False where known)
            state, parts, sums = carried
            parts = issue(state, parts)
            factors = factors_of(state)  # loads in flight under the MMAs; the products wait for them
            parts = wgmma.wait_group(0, parts)
            if fx.const_expr(offsetting and first is not False):
                if _first_of(offset & (consumer.warpgroup == 0), first):
                    nvvm.barrier_arrive(OFFSET_BARRIER, 256)
            release(state)
            return state.advance(), parts, _promote(sums, parts, factors, source_columns)

        state, _, sums = _k_steps(step, (state, parts, sums), k_begin, k_end, WIDE_UNROLL)
        return state, sums
    # A pair's scales are read once its first MMAs are done, under the second's (docs/tuning/blockscale.md
    # #when-consumers-read: read earlier, the loads' latency stalls the next MMAs' issue).
    odd = (k_end - k_begin) % 2
    if odd == 1:
        parts = wgmma.wait_group(0, issue(state, mma.make_accumulators(0.0)))
        factors = factors_of(state)
        release(state)
        sums = _promote(sums, parts, factors, source_columns)
        state = state.advance()
    k0 = k_begin + odd
    first_parts, second_parts = mma.make_accumulators(0.0), mma.make_accumulators(0.0)
    per_row = sources if straddle is None else 3
    second_factors = [[fx.Float32(0.0)] * per_row] * len(rows)  # no second step before the first pair: adds zeros
    for _pair in range(k0, k_end, 2):  # steps _pair and _pair + 1
        first_state = state
        first_parts = issue(first_state, first_parts)
        sums = _promote(sums, second_parts, second_factors, source_columns)  # the previous pair's second step
        state = state.advance()
        second_parts = issue(state, second_parts)
        first_parts = wgmma.wait_group(1, first_parts)
        first_factors = factors_of(first_state)
        second_factors = factors_of(state)
        release(first_state)
        sums = _promote(sums, first_parts, first_factors, source_columns)
        second_parts = wgmma.wait_group(0, second_parts)
        release(state)
        state = state.advance()
    sums = _promote(sums, second_parts, second_factors, source_columns)
    return state, sums


class _Waves:
    """The block-scaled steps of a consumer holding several 64-row blocks (256-row tiles: two): per K step, each
    block's MMAs are issued into the one set of parts, waited for and promoted into that block's sums before the next
    block's are issued (DeepGEMM's waves of 64 rows): the sums of both blocks and one block's parts fit the
    consumers' registers (3 x 64 for 128-wide tiles) where both blocks' parts beside the sums would not. A block's
    promotion runs under the other consumer's MMAs; ``offset`` starts the second consumer once the first's first
    block is done, a wave apart. :data:`WAVES_UNROLL` steps go in each loop iteration (two: the next step's wait and
    descriptors are scheduled among the previous step's FMAs, 4-7% faster on an H100, docs/tuning/blockscale.md
    #unrolled)."""

    def __init__(self, consumer: Consumer, blocks: int, factors_of, release, source_columns: int):
        self.consumer, self.blocks, self.factors_of = consumer, blocks, factors_of
        self.release, self.source_columns = release, source_columns
        self.mma = wgmma.TiledMma(consumer.mma.atom, tile_m=64, tile_n=consumer.mma.tile_n)  # one 64-row block

    def issue(self, step_state, part, block):
        """Block ``block``'s MMAs of the step in ``step_state``'s slot (waited for by the caller) into fresh parts."""
        consumer = self.consumer
        a_slot = consumer.a.tiles[None, None, step_state.index]
        b_slot = consumer.b.tiles[None, None, step_state.index]
        rows = (64, fl.size(b_slot.layout[1]))
        a_block = fx.local_tile(a_slot, rows, (consumer.warpgroup * self.blocks + block, 0))
        part = wgmma.fence([part])
        part = self.mma.mma(a_block, b_slot, part, accumulate=False)
        wgmma.commit_group()
        return part

    def step(self, carried, first, offset):
        """One K step of ``carried`` = (state, part, sums): each block's MMAs issued, waited for and promoted in turn
        (``first``: whether it is the unit's first step, after which the first consumer lets the second start; True
        or False where known)."""
        state, part, sums = carried
        warpgroup = self.consumer.warpgroup
        self.consumer.pipe.consumer_wait(state)
        for block in fx.range_constexpr(self.blocks):
            parts = self.issue(state, part, block)
            factors = self.factors_of(state, block)  # the block's rows; loads in flight under its MMAs
            parts = wgmma.wait_group(0, parts)
            if fx.const_expr(offset is not None and block == 0 and first is not False):
                if _first_of(offset & (warpgroup == 0), first):
                    nvvm.barrier_arrive(OFFSET_BARRIER, 256)
            if fx.const_expr(block == self.blocks - 1):
                self.release(state)
            # pinned: the next block's MMAs (into the same registers) are issued after these FMAs, not among them
            promoted = wgmma.fence_operands(_promote([sums[block]], parts, factors, self.source_columns))
            sums = sums[:block] + promoted + sums[block + 1 :]  # rebound, not mutated: the loop carries names
            part = parts[0]
        return state.advance(), part, sums

    def steps(self, state, k_begin, k_end, sums, offset):
        part = self.mma.make_accumulators(0.0)[0]
        if fx.const_expr(offset is not None):
            if offset & (self.consumer.warpgroup == 1):
                nvvm.barrier(OFFSET_BARRIER, 256)
        step = lambda carried, first: self.step(carried, first, offset)  # noqa: E731
        state, _, sums = _k_steps(step, (state, part, sums), k_begin, k_end, WAVES_UNROLL)
        return state, sums


def _first_of(condition, first):
    """``condition`` on a unit's first step: ``first`` a kernel Boolean, or True where known."""
    return condition if first is True else condition & first


def _k_steps(step, carried: tuple, k_begin, k_end, unroll: int) -> tuple:
    """``carried = step(carried, first)`` for each K step of ``[k_begin, k_end)`` (``first``: whether it is the
    unit's first), ``unroll`` steps per loop iteration (1, 2 or 4; the count's remainder runs first, a step at a time):
    the next step's barrier wait and descriptors can then be scheduled among the previous step's FMAs
    (docs/tuning/blockscale.md#unrolled)."""
    if fx.const_expr(unroll not in (1, 2, 4)):
        raise ValueError(f"unroll: expected 1, 2 or 4 K steps per loop iteration, got {unroll}")
    if fx.const_expr(unroll == 1):
        for _step in range(k_begin, k_end):
            carried = step(carried, _step == k_begin)
        return carried
    rest = (k_end - k_begin) % unroll
    if fx.const_expr(unroll == 2):
        if rest == 1:
            carried = step(carried, True)
    else:
        for _step in range(k_begin, k_begin + rest):
            carried = step(carried, _step == k_begin)
    for _group in range(k_begin + rest, k_end, unroll):
        carried = step(carried, _group == k_begin)
        for _ in fx.range_constexpr(unroll - 1):
            carried = step(carried, False)
    return carried
