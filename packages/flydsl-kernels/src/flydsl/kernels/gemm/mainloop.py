"""The wgmma mainloop: a consumer warpgroup multiplies the K steps of a work unit out of an mbarrier pipeline's slots.

Each step waits for its slot to be full, issues the step's ``wgmma`` MMAs (accumulating after the first step),
commits them and waits until the previous step's MMAs are done, which keeps one step in flight and lets that
previous slot be released to the producer. :func:`drain` then waits for the last step's MMAs and releases its slot.

    consumer = Consumer(pipe, mma, a_tiles, b_tiles, warpgroup=consumer_index, lane=tid % 32, peers=peers)
    state, released, accs = mma_steps(consumer, state, work.k_begin, work.k_end)
    accs = drain(consumer, released, accs, work.k_begin, work.k_end, maybe_empty=False)
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.expr import wgmma
from flydsl.kernels.gemm.operands import OperandTiles

__all__ = ["Consumer", "drain", "mma_steps"]


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
