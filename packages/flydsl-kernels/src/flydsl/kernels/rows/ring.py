"""The staged kernels' ring: ``stages`` rows of this thread's 16-byte chunks of one or two row tensors in shared
memory, copied rows ahead so that the bytes in flight take no registers (:class:`RowRing`); filled per thread by
``cp.async`` or, in bulk mode, per CTA by one thread's bulk copies on an mbarrier per slot (:func:`bulk_setup`,
:func:`issue_bulk`). The staged forward and the staged backward run on it."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import gpu, vector
from flydsl.kernels.rows.layout import RowConfig
from flydsl.kernels.rows.tiles import chunk_index, fill_buffer, load_vector

__all__ = ["RowRing", "bulk_setup", "issue_bulk"]


class RowRing:
    """A ring of ``stages`` rows of this thread's 16-byte chunks of the ``sources`` (2-D tensors of one dtype, read
    at the same row) in shared memory, filled by ``cp.async`` (zeros past N and past the last row), read back by the
    thread that copied them: a thread waits for its own copies (``cp.async.wait_group``), no barrier. Shared by the
    staged backward (dy and x) and the staged forward (x, and the residual of the fused add). Bulk mode (the staged
    backward's ``BackwardConfig.bulk``: :func:`bulk_setup`, :func:`issue_bulk`): one thread per CTA fills a slot
    by a bulk copy per source and chunk, every thread waits on the slot's mbarrier."""

    def __init__(self, rc: RowConfig, stages: int, sources, pos, n, rows):
        self.rc, self.sources, self.pos, self.n, self.rows = rc, tuple(sources), pos, n, rows
        self.width, self.stages = len(self.sources), stages
        size = stages * self.width * rc.chunks * rc.block * rc.vec
        self.buffer = fx.SmemAllocator().allocate(self.sources[-1].dtype, size, alignment=16)
        self.cols = [chunk_index(rc, pos, j) * rc.vec for j in range(rc.chunks)]
        self.bars = None  # bulk mode's mbarriers (_bulk_setup)

    def wait_bulk(self, slot, phase) -> None:
        """Waits until ring slot ``slot``'s bulk copies (:func:`issue_bulk`) of phase ``phase`` have landed."""
        self.bars[slot].wait(phase)

    def _index(self, slot, t: int, j: int):
        return ((slot * self.width + t) * self.rc.chunks + j) * self.rc.block + self.pos.tid

    def issue(self, row, slot) -> None:
        """Copies this thread's chunks of ``row`` into ring slot ``slot``: one commit group."""
        rc, rows = self.rc, self.rows
        row_ok = row < rows
        safe_row = fx.arith.select(row_ok, row, type(row)(0))
        for t in fx.range_constexpr(self.width):
            for j in fx.range_constexpr(rc.chunks):
                col = self.cols[j]
                inside = row_ok & (col < self.n)
                fx.nvvm.cp_async(
                    self.buffer,
                    self.sources[t],
                    16,
                    dst_coord=self._index(slot, t, j) * rc.vec,
                    src_coord=(safe_row, fx.arith.select(inside, col, type(col)(0))),
                    src_bytes=fx.arith.select(inside, fx.Int32(16), fx.Int32(0)),
                )
        fx.nvvm.cp_async_commit_group()

    def chunk(self, slot, t: int, j: int):
        """Chunk ``j`` of source ``t`` of the row in ``slot``: ``vec`` Float32."""
        view = fx.local_tile(self.buffer, (self.rc.vec,), (self._index(slot, t, j),))
        wide = load_vector(view, self.rc.vec).to(fx.Float32)
        return [wide[e] for e in range(self.rc.vec)]


def bulk_setup(ring) -> None:
    """A :class:`RowRing` in bulk mode (:func:`issue_bulk`): an mbarrier per slot, and the ring zeroed, so that
    the bytes no copy writes (past N, and slots of rows past the last) read as zeros; ordered before the copies'
    async-proxy writes by a proxy fence and a barrier. (Module functions, not methods: the kernel's control flow is
    traced through functions only.)"""
    rc = ring.rc
    ring.bars = fx.mbarrier.allocate(fx.SmemAllocator(), ring.stages)
    _, filled = fill_buffer(vector.vector_class(ring.buffer.dtype, rc.vec), 0)
    for slot in fx.range_constexpr(ring.stages):
        for t in fx.range_constexpr(ring.width):
            for j in fx.range_constexpr(rc.chunks):
                fx.copy(filled, fx.local_tile(ring.buffer, (rc.vec,), (ring._index(slot, t, j),)))
    if ring.pos.tid == 0:
        for i in fx.range_constexpr(ring.stages):
            ring.bars[i].init(1)
        fx.mbarrier.fence_init()
    fx.nvvm.fence_proxy_async("shared")
    gpu.barrier()


def issue_bulk(ring, row, slot) -> None:
    """``ring``'s :meth:`RowRing.issue` for the whole CTA: one thread copies the CTA's part of ``row`` (for each
    source and chunk ``j``, its threads' ``block`` consecutive 16-byte chunks: one contiguous piece) into ring slot
    ``slot`` by bulk copies completing on the slot's mbarrier (:meth:`RowRing.wait_bulk`); nothing past N or past
    the last row. The caller makes sure every thread has finished reading the slot (a block barrier since)."""
    rc, n = ring.rc, ring.n
    if ring.pos.tid == rc.block - 32:  # the last warp's first thread: the first warp polls a team's pairs
        row_ok = row < ring.rows
        safe_row = fx.arith.select(row_ok, row, type(row)(0))
        piece = rc.block * rc.vec
        size = ring.buffer.dtype.width // 8
        pieces, total = [], fx.Int32(0)
        for j in fx.range_constexpr(rc.chunks):
            first = (j * rc.cluster + ring.pos.rank) * piece  # the CTA's first column of its chunk j
            left = n - first  # columns from there to N
            count = fx.arith.select(left > piece, type(left)(piece), left)
            nbytes = fx.arith.select(row_ok & (left > 0), count, type(left)(0)).to(fx.Int32) * size
            pieces.append((fx.arith.select(first < n, first, type(first)(0)), nbytes))
            total = total + nbytes * ring.width
        ring.bars[slot].arrive_expect_tx(total)
        for t in fx.range_constexpr(ring.width):
            for j in fx.range_constexpr(rc.chunks):
                first, nbytes = pieces[j]
                start = ((slot * ring.width + t) * rc.chunks + j) * rc.block * rc.vec
                fx.nvvm.cp_async_bulk(
                    ring.buffer, ring.sources[t], nbytes, ring.bars[slot], dst_coord=start, src_coord=(safe_row, first)
                )
