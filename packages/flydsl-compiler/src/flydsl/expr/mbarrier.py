"""mbarriers: 8-byte barrier objects in shared memory that count thread arrivals and asynchronous bytes (TMA) and
flip a phase bit when both are complete. Waiting is on a phase parity, so a barrier is reused round after round.

    bars = fx.mbarrier.allocate(smem, 4)           # four barriers
    if tid == 0:
        for s in fx.range_constexpr(4):
            bars[s].init(1)                        # one arrival completes a phase
        fx.mbarrier.fence_init()
    gpu.barrier()
    ...
    bars[s].arrive_expect_tx(desc.box_bytes)      # the producer: one arrival + the bytes TMA will bring
    bars[s].wait(phase)                           # the consumers: until phase `phase` (0/1) has completed

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-mbarrier
"""

from __future__ import annotations

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Int32, Int64, as_integer
from flydsl.expr.nvvm import address
from flydsl.expr.tensor import Tensor

ir = lazy_import("mlir.ir")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = ["Mbarrier", "MbarrierArray", "allocate", "fence_init"]

# How long one try_wait may suspend before it re-checks (ns): the value CUTLASS uses; the op loops until done.
_SUSPEND_HINT_NS = 0x989680


def _i32(value, what: str) -> ir.Value:
    return as_integer(value, Int32, what).value


class Mbarrier:
    """One mbarrier, by its shared-memory address (``!llvm.ptr<3>``)."""

    __slots__ = ("address",)

    def __init__(self, address: ir.Value):
        if str(address.type) != "!llvm.ptr<3>":
            raise TypeError(f"Mbarrier: expected a shared-memory address (!llvm.ptr<3>), got {address.type}")
        self.address = address

    def init(self, arrivals) -> None:
        """Sets the number of arrivals that complete a phase (one thread does this, before ``fence_init()``)."""
        _nvvm.MBarrierInitOp(self.address, _i32(arrivals, "Mbarrier.init arrivals"))

    def arrive(self) -> None:
        """This thread's arrival (release semantics: its earlier writes are visible to whoever waits)."""
        _nvvm.MBarrierArriveOp(Int64.mlir_type(), self.address)

    def arrive_expect_tx(self, byte_count) -> None:
        """This thread's arrival, after raising the bytes the current phase waits for by ``byte_count`` (what the
        asynchronous copies completing on this barrier will bring)."""
        _nvvm.MBarrierArriveExpectTxOp(None, self.address, _i32(byte_count, "Mbarrier.arrive_expect_tx bytes"))

    def expect_tx(self, byte_count) -> None:
        """Raises the bytes the current phase waits for, without arriving."""
        _nvvm.MBarrierExpectTxOp(self.address, _i32(byte_count, "Mbarrier.expect_tx bytes"))

    def wait(self, phase) -> None:
        """Blocks until the phase with parity ``phase`` (0 or 1) has completed (acquire semantics)."""
        _nvvm.MBarrierTryWaitParityOp(self.address, _i32(phase, "Mbarrier.wait phase"), Int32(_SUSPEND_HINT_NS).value)

    def arrive_on_cp_async(self) -> None:
        """An arrival, counted among the ``init`` arrivals, made once every ``cp_async`` this thread issued before has
        landed (``cp.async.mbarrier.arrive.noinc``): threads that fill part of a slot with ``cp_async`` complete its
        barrier this way, and whoever waits on it then reads what they copied."""
        _nvvm.CpAsyncMBarrierArriveOp(self.address, noinc=True)

    def arrive_cluster(self, cta_rank) -> None:
        """An arrival on the barrier at this one's offset in the shared memory of CTA ``cta_rank`` of the cluster
        (``mapa`` + ``mbarrier.arrive.shared::cluster``): how consumers free a multicast slot in every CTA."""
        remote = _nvvm.MapaOp(ir.Type.parse("!llvm.ptr<7>"), self.address, _i32(cta_rank, "cta_rank")).result
        _nvvm.MBarrierArriveOp(None, remote)


class MbarrierArray:
    """``count`` mbarriers in shared memory; ``bars[i]`` is an :class:`Mbarrier` (``i`` static or dynamic)."""

    __slots__ = ("tensor", "count")

    def __init__(self, tensor: Tensor):
        if tensor.space != "shared" or tensor.dtype is not Int64:
            raise TypeError(f"MbarrierArray: expected a shared-memory tensor of Int64, got {tensor!r}")
        self.tensor = tensor
        self.count = _fl.size(tensor.layout)

    def __getitem__(self, index) -> Mbarrier:
        return Mbarrier(address(self.tensor, index))

    def __len__(self) -> int:
        return self.count


def allocate(smem, count: int = 1) -> MbarrierArray:
    """``count`` mbarriers from an ``fx.SmemAllocator`` (8-byte aligned; uninitialized: ``init`` them)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"mbarrier.allocate count: expected a positive int, got {count!r}")
    return MbarrierArray(smem.allocate(Int64, count, alignment=8))


def fence_init() -> None:
    """Makes ``init`` of barriers visible to the async proxy and to the other CTAs of the cluster
    (``fence.mbarrier_init.release.cluster``); then synchronize the threads (or the cluster) before use."""
    _nvvm.FenceMbarrierInitOp()
