"""fp32 partial tiles: how the parts of one output tile's K steps, computed by different CTAs, are summed.

A workspace slot holds one consumer warpgroup's ``consumer_rows x tile_n`` partial sums, laid out so that each
thread's quads of 4 accumulators are 16 bytes apart from its neighbours' (every access a coalesced 16-byte one).

* Split K (:func:`split_k_last`): every part of a tile writes its slot, then counts itself on the tile's counter;
  the part that counts last, whichever finishes last, sums the others' partials and stores C (no waiting, no
  second kernel). Counters are reset by their last part, for the next launch.
* Stream-K (:func:`store_stream_k_partials`, :func:`add_stream_k_partials`): a worker that has a later part of a
  tile writes its slot and raises its flag (release); the worker that has the tile's first part waits for each
  later part's flag (acquire), adds it and resets the flag.
* :func:`split_k_reduce`: a kernel summing ``splits`` row blocks of partials through the epilogue (the skinny
  kernel's split K).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm, vector
from flydsl.kernels.gemm.epilogue import EpilogueTensors, apply_epilogue

__all__ = ["PartialTiles", "add_stream_k_partials", "split_k_last", "split_k_reduce", "store_stream_k_partials"]

_F32X4 = vector.vector_class(fx.Float32, 4)


class PartialTiles(NamedTuple):
    """A consumer warpgroup's access to the partial tiles: the fp32 ``workspace`` (``consumer_rows * tile_n``
    elements per slot), its int32 ``flags`` (stream-K: one per slot; split K: one counter per tile and consumer of
    each CTA of a cluster), the configuration, this CTA's ``rank`` in its cluster, the warpgroup's index among the
    consumers (``consumer``), this thread's index in it (``thread``) and, for split K, ``arrivals``: one shared
    Int32 per consumer through which the counting thread tells its warpgroup."""

    workspace: object
    flags: object
    cfg: object  # GemmConfig
    rank: object
    consumer: object
    thread: object
    arrivals: object = None


def _partial_index(slot, mi, q, cfg, t):
    """The workspace index of 4 accumulators (``q``-th quad of block ``mi``) of thread ``t`` of a warpgroup; 64-bit:
    split K's workspace (a slot per work unit) may exceed 2^31 floats."""
    within = ((mi * (cfg.tile_n // 8) + q) * 128 + t) * 4
    return slot.to(fx.Int64) * (cfg.consumer_rows * cfg.tile_n) + within.to(fx.Int64)


def _write_partials(accs, partials: PartialTiles, slot):
    """A consumer warpgroup's fp32 partial sums into workspace ``slot``, then its barrier (every thread's stores
    issued before one thread releases them)."""
    cfg, t = partials.cfg, partials.thread
    for mi in fx.range_constexpr(len(accs)):
        for q in fx.range_constexpr(cfg.tile_n // 8):
            quad = vector.from_elements(_F32X4, [accs[mi][4 * q + i] for i in range(4)])
            vector.store(quad, partials.workspace, (_partial_index(slot, mi, q, cfg, t),))
    nvvm.barrier(1 + partials.consumer, 128)


def _plus_partial(accs, partials: PartialTiles, slot):
    """``accs`` plus the partial sums of workspace ``slot`` (written, and acquired, already)."""
    cfg, t = partials.cfg, partials.thread
    summed = []
    for mi in fx.range_constexpr(len(accs)):
        quads = [
            vector.load_op(_F32X4, partials.workspace, (_partial_index(slot, mi, q, cfg, t),))
            for q in fx.range_constexpr(cfg.tile_n // 8)
        ]
        summed.append(accs[mi] + vector.from_elements(type(accs[mi]), [x for quad in quads for x in quad]))
    return summed


def split_k_last(accs, part, partials: PartialTiles):
    """Split K with no waiting: this K part of a tile (``part``: its index among the split units, from 0) writes its
    partial sums to its own slot and counts itself on the tile's counter; if it counts last, it adds the other
    parts' partials (acquired by its count) to its own and resets the counter. Returns (last, the sums)."""
    cfg, rank, consumer, t = partials.cfg, partials.rank, partials.consumer, partials.thread
    split = cfg.split_k
    per_unit = cfg.cluster * cfg.consumers
    slot = part * per_unit + rank * cfg.consumers + consumer
    _write_partials(accs, partials, slot)
    counter = (part // split) * per_unit + rank * cfg.consumers + consumer
    if t == 0:
        partials.arrivals[consumer] = nvvm.atom_add_acq_rel(partials.flags, 1, counter)
    nvvm.barrier(1 + consumer, 128)
    last = partials.arrivals[consumer] == split - 1
    sums = accs
    if last:
        if t == 0:
            partials.flags[counter] = 0
        own, first = part % split, slot - (part % split) * per_unit
        for s in fx.range_constexpr(1, split):  # the others, in turn after this one's own
            sums = _plus_partial(sums, partials, first + ((own + s) % split) * per_unit)
    return last, sums


def store_stream_k_partials(accs, partials: PartialTiles, slot):
    """A stream-K contributor's fp32 partial sums into its workspace ``slot``, then its flag raised (release)."""
    _write_partials(accs, partials, slot)
    if partials.thread == 0:
        nvvm.red_add_release(partials.flags, 1, slot)


def _await_partial(flags, slot, t):
    """Thread ``t`` == 0 waits until workspace ``slot`` holds its partial sums (acquire), then resets the flag
    for the next launch; the warpgroup's barrier must follow before its threads read the slot."""
    if t == 0:
        seen = nvvm.ld_acquire(flags, slot)
        while seen == 0:
            seen = nvvm.ld_acquire(flags, slot)
        flags[slot] = 0


def add_stream_k_partials(accs, partials: PartialTiles, schedule, tile):
    """The stream-K finisher's sum for stream-K ``tile``: the partials of every later worker whose range of
    ``schedule`` (a :class:`~flydsl.kernels.gemm.schedulers.StreamKTiles`) starts inside the tile (a worker with no
    steps has none)."""
    cfg, rank, consumer, t = partials.cfg, partials.rank, partials.consumer, partials.thread
    end_of_tile = (tile + 1) * schedule.k_tiles
    j = schedule.worker + 1
    while schedule.step_begin(j) < end_of_tile:  # the last worker's end is the last step's: the loop stops by then
        if schedule.step_begin(j) < schedule.step_begin(j + 1):
            slot = (j * cfg.cluster + rank) * cfg.consumers + consumer
            _await_partial(partials.flags, slot, t)
            nvvm.barrier(1 + consumer, 128)  # the warpgroup reads after the acquire
            accs = _plus_partial(accs, partials, slot)
        j = j + 1
    return accs


@flyc.kernel
def split_k_reduce(partials: fx.Tensor, out: fx.Tensor, bias: fx.Tensor, splits: fx.Constexpr, epilogue: fx.Constexpr):
    """out = epilogue(sum of the ``splits`` row blocks of fp32 ``partials``), one element per thread (64-bit
    indices: M x N may exceed 2^31). ``epilogue``: an :class:`~flydsl.kernels.gemm.epilogue.Epilogue` with no
    scales, stored from registers; ``bias`` a (N,) tensor (any tensor, unread, without one)."""
    if epilogue.scales or epilogue.store != "registers":
        raise ValueError(f"split_k_reduce: expected an epilogue without scales, stored from registers, got {epilogue}")
    tensors = EpilogueTensors(bias=bias if epilogue.bias else None)
    m_extent, n_extent = out.shape[0].to(fx.Int64), out.shape[1].to(fx.Int64)
    i = gpu.block_idx.x.to(fx.Int64) * gpu.block_dim.x.to(fx.Int64) + gpu.thread_idx.x.to(fx.Int64)
    if i < m_extent * n_extent:
        row, col = i // n_extent, i % n_extent
        total = partials[row, col]
        for s in fx.range_constexpr(1, splits):
            total = total + partials[row + s * m_extent, col]
        out[row, col] = apply_epilogue(total, epilogue, tensors, row, col).to(out.dtype)
