"""Multi-stage producer/consumer pipelines over a ring of shared-memory slots, synchronized by mbarriers (CuTe's
``PipelineAsync`` / ``PipelineTmaAsync``), and the persistent tile scheduler.

Each slot ``s`` has two barriers: ``full[s]`` completes when the producer has filled the slot, ``empty[s]`` when
every consumer has released it. Producer and consumer each keep a :class:`PipelineState` (slot index and phase
parity), carried through loops like any value::

    pipe = fx.TmaPipeline(smem, stages=4, tx_bytes=a.box_bytes + b.box_bytes, consumers=256)
    pipe.init()                                          # every thread calls it (one initializes, all sync)
    if is_producer:                                      # one thread
        state = pipe.producer_start()
        for k in range(k_tiles):
            pipe.producer_acquire(state)                 # waits for an empty slot, expects its bytes
            a.load(tiles_a[None, None, state.index], (m0, k * BK), pipe.full[state.index])
            state = state.advance()
    else:                                                # consumer threads
        state = pipe.consumer_start()
        for k in range(k_tiles):
            pipe.consumer_wait(state)                    # the slot's bytes have landed
            ...                                          # use it
            pipe.consumer_release(state)                 # every consumer thread: the slot may be refilled
            state = state.advance()
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr import gpu
from flydsl.expr import mbarrier as _mbarrier
from flydsl.expr.arith import minimum
from flydsl.expr.numeric import Boolean, Int32, as_integer, as_numeric

ir = lazy_import("mlir.ir")
scf = lazy_import("mlir.dialects.scf")

__all__ = ["PipelineState", "Pipeline", "TmaPipeline", "TileScheduler"]


def _int32(value) -> Int32:
    return as_integer(value, Int32, "pipeline index")


class PipelineState:
    """A position in a ring of ``stages`` slots: ``index`` (the slot) and ``phase`` (the parity of the round);
    a value carried through loops and branches (``__fly_values__``)."""

    __slots__ = ("stages", "index", "phase")

    def __init__(self, stages: int, index, phase):
        self.stages, self.index, self.phase = stages, _int32(index), _int32(phase)

    def advance(self) -> PipelineState:
        """The next slot; past the last one, slot 0 of the next round (the phase flips)."""
        following = self.index + 1
        wrapped = (following == self.stages).to(Int32)
        return PipelineState(self.stages, following - wrapped * self.stages, self.phase ^ wrapped)

    def advance_by(self, steps) -> PipelineState:
        """``steps`` slots further (an int or a kernel integer >= 0): the phase flips once per wrap."""
        total = self.index + steps
        return PipelineState(self.stages, total % self.stages, self.phase ^ ((total // self.stages) % 2))

    def __fly_values__(self) -> list:
        return [self.index, self.phase]

    def __fly_rebuild__(self, values) -> PipelineState:
        return PipelineState(self.stages, *values)

    def __repr__(self):
        return f"PipelineState(stages={self.stages}, index={self.index}, phase={self.phase})"


def _in_one_thread(body) -> None:
    """``body()`` in thread 0 of the block only (an ``scf.if``: library code is not rewritten like kernels)."""
    condition = gpu.thread_idx.x == 0
    branch = scf.IfOp(as_numeric(condition, Boolean).value)
    with ir.InsertionPoint(branch.then_block):
        body()
        scf.YieldOp([])


class Pipeline:
    """``stages`` slots filled by ``producers`` arriving threads and drained by ``consumers`` arriving threads
    (CuTe's ``PipelineAsync``): the producer's ``producer_commit`` is an arrival on ``full``."""

    def __init__(self, smem, stages: int, producers: int, consumers: int):
        for name, value in (("stages", stages), ("producers", producers), ("consumers", consumers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__} {name}: expected a positive int, got {value!r}")
        self.stages, self.producers, self.consumers = stages, producers, consumers
        self.full = _mbarrier.allocate(smem, stages)
        self.empty = _mbarrier.allocate(smem, stages)

    def init(self, sync: bool = True) -> None:
        """Initializes the barriers (thread 0) and, with ``sync``, makes every thread of the block wait for it
        (call it from all threads; with ``sync=False`` synchronize yourself, e.g. a cluster barrier)."""

        def initialize():
            for s in range(self.stages):
                self.full[s].init(self.producers)
                self.empty[s].init(self.consumers)
            _mbarrier.fence_init()

        _in_one_thread(initialize)
        if sync:
            gpu.barrier()

    def producer_start(self) -> PipelineState:
        """The producer's first state: phase 1, so that waiting for the free slots of round 0 passes at once."""
        return PipelineState(self.stages, 0, 1)

    def consumer_start(self) -> PipelineState:
        return PipelineState(self.stages, 0, 0)

    def producer_acquire(self, state: PipelineState) -> None:
        """Waits until slot ``state.index`` has been released by every consumer."""
        self.empty[state.index].wait(state.phase)

    def producer_commit(self, state: PipelineState) -> None:
        """This producer thread's writes to the slot are done (an arrival on ``full``)."""
        self.full[state.index].arrive()

    def consumer_wait(self, state: PipelineState) -> None:
        """Waits until slot ``state.index`` is full."""
        self.full[state.index].wait(state.phase)

    def consumer_release(self, state: PipelineState, cta_ranks=None) -> None:
        """This consumer is done reading the slot: an arrival on ``empty``; with ``cta_ranks`` (CTA ranks in the
        cluster, this one's included), an arrival on the slot's ``empty`` barrier in each of those CTAs, which is
        how consumers free a slot that producers of other CTAs multicast into (count those arrivals in
        ``consumers``)."""
        if cta_ranks is None:
            self.empty[state.index].arrive()
            return
        for rank in cta_ranks:
            self.empty[state.index].arrive_cluster(rank)


class TmaPipeline(Pipeline):
    """Slots filled by TMA loads (CuTe's ``PipelineTmaAsync``): one producer thread calls ``producer_acquire``, which
    waits for a free slot and arms its ``full`` barrier with ``tx_bytes`` (the bytes of every load of the stage);
    the loads complete it. ``full[state.index]`` is the barrier to give the loads. ``producers``: the arrivals that
    complete a slot besides the bytes: the TMA producer's, plus one per thread that fills part of the slot itself
    (e.g. with ``cp_async`` and ``full[state.index].arrive_on_cp_async()``, after waiting on ``empty`` like
    ``producer_acquire`` without arming the bytes)."""

    def __init__(self, smem, stages: int, tx_bytes: int, consumers: int, producers: int = 1):
        super().__init__(smem, stages, producers=producers, consumers=consumers)
        if not isinstance(tx_bytes, int) or tx_bytes <= 0 or tx_bytes >= 1 << 20:
            raise ValueError(f"TmaPipeline tx_bytes: expected the bytes of one stage (0 < n < 2^20), got {tx_bytes!r}")
        self.tx_bytes = tx_bytes

    def producer_acquire(self, state: PipelineState) -> None:
        super().producer_acquire(state)
        self.full[state.index].arrive_expect_tx(self.tx_bytes)

    def producer_commit(self, state: PipelineState) -> None:
        """Nothing to do: the loads' bytes complete the ``full`` barrier."""


class TileScheduler:
    """Output tiles for persistent kernels: CTA ``b`` of ``g`` takes tiles ``b, b + g, b + 2g, ...`` of a
    ``tiles_m x tiles_n`` grid. Linear tile ``t`` maps to ``(m, n)`` column by column within groups of ``group_m``
    tile rows, so that tiles running at the same time share rows of A and columns of B in L2 (Triton's grouped
    order). With ``cluster_size`` > 1 (a 1-D cluster along x), the CTAs of a cluster walk the same tiles (each
    then takes its part of the tile)::

        sched = fx.TileScheduler(tiles_m, tiles_n, group_m=8)
        for t in range(sched.first, sched.count, sched.stride):
            m, n = sched.coords(t)
    """

    def __init__(self, tiles_m, tiles_n, group_m: int = 8, cluster_size: int = 1):
        if not isinstance(group_m, int) or group_m < 1:
            raise ValueError(f"TileScheduler group_m: expected a positive int, got {group_m!r}")
        if not isinstance(cluster_size, int) or cluster_size < 1:
            raise ValueError(f"TileScheduler cluster_size: expected a positive int, got {cluster_size!r}")
        self.tiles_m, self.tiles_n, self.group_m = _int32(tiles_m), _int32(tiles_n), group_m
        self.cluster_size = cluster_size

    @property
    def count(self) -> Int32:
        return self.tiles_m * self.tiles_n

    @property
    def first(self) -> Int32:
        """This CTA's first tile (with ``cluster_size`` > 1: its cluster's; the CTAs of a cluster share tiles)."""
        return gpu.block_idx.x.to(Int32) // self.cluster_size

    @property
    def stride(self) -> Int32:
        return gpu.grid_dim.x.to(Int32) // self.cluster_size

    def coords(self, tile) -> tuple[Int32, Int32]:
        """The (m, n) tile coordinates of linear tile ``tile``."""
        tile = _int32(tile)
        per_group = self.tiles_n * self.group_m
        group = tile // per_group
        first_m = group * self.group_m
        rows = minimum(self.tiles_m - first_m, Int32(self.group_m))
        within = tile - group * per_group
        return first_m + within % rows, within // rows
