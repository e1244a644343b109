"""GPU indices, synchronization, shuffles and reductions.

``thread_idx.x``, ``block_idx.y``, ``block_dim.z``, ``grid_dim.x`` are ``Int32``; ``lane_id()`` and ``warp_idx()``
too. Reductions combine with a Python function (``lambda a, b: a + b``) or a name (``"add"``, ``"max"``, ``"min"``).
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Float, Int32, Numeric, as_numeric

ir = lazy_import("mlir.ir")
_gpu = lazy_import("mlir.dialects.gpu")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = [
    "thread_idx",
    "block_idx",
    "block_dim",
    "grid_dim",
    "lane_id",
    "warp_idx",
    "barrier",
    "shuffle_xor",
    "shuffle_down",
    "shuffle_idx",
    "warp_reduce",
    "block_reduce",
    "WARP_SIZE",
]

WARP_SIZE = 32


class _Dim3:
    """The x/y/z components of a special register triple (``%tid``, ``%clusterid``...), as ``Int32``."""

    def __init__(self, registers: str, name: str, module: str = "gpu"):
        self._registers, self._name = registers, f"{module}.{name}"

    def __repr__(self):
        return f"{self._name} (its components are .x, .y and .z)"

    def _read(self, axis: str) -> Int32:
        return Int32(getattr(_nvvm, f"read_ptx_sreg_{self._registers}_{axis}")(ir.IntegerType.get_signless(32)))

    @property
    def x(self) -> Int32:
        return self._read("x")

    @property
    def y(self) -> Int32:
        return self._read("y")

    @property
    def z(self) -> Int32:
        return self._read("z")


thread_idx = _Dim3("tid", "thread_idx")
block_idx = _Dim3("ctaid", "block_idx")
block_dim = _Dim3("ntid", "block_dim")
grid_dim = _Dim3("nctaid", "grid_dim")


def lane_id() -> Int32:
    return Int32(_nvvm.read_ptx_sreg_laneid(ir.IntegerType.get_signless(32)))


def warp_idx() -> Int32:
    """The warp's index in its block (``thread_idx.x // 32`` for 1-D blocks)."""
    return thread_idx.x // WARP_SIZE


def barrier() -> None:
    """``__syncthreads()``: every thread of the block waits here."""
    _gpu.barrier()


_FULL_MASK = -1


def _shuffle(kind: str, value, offset, width: int = WARP_SIZE):
    value = as_numeric(value)
    if value.width != 32:
        raise TypeError(f"shuffles move 32-bit values, got {type(value).__name__} (convert with .to())")
    i32 = ir.IntegerType.get_signless(32)
    # clamp: 0x1f for xor/idx/down within the whole warp (PTX's c operand: ((32 - width) << 8) | 0x1f).
    clamp = Int32(((WARP_SIZE - width) << 8) | (0 if kind == "up" else 0x1F)).value
    bits = value.value if not isinstance(value, Float) else _bitcast(value.value, i32)
    shuffled = _nvvm.shfl_sync(
        i32, Int32(_FULL_MASK).value, bits, as_numeric(offset, Int32).value, clamp, getattr(_nvvm.ShflKind, kind)
    )
    if isinstance(value, Float):
        shuffled = _bitcast(shuffled, value.type)
    return type(value)(shuffled)


def _bitcast(value: ir.Value, to: ir.Type) -> ir.Value:
    from mlir.dialects import arith

    return arith.bitcast(to, value)


def shuffle_xor(value, mask: int, width: int = WARP_SIZE):
    """The value of lane ``lane ^ mask`` (``__shfl_xor_sync``)."""
    return _shuffle("bfly", value, mask, width)


def shuffle_down(value, delta: int, width: int = WARP_SIZE):
    """The value of lane ``lane + delta`` (``__shfl_down_sync``); lanes past the end keep their own."""
    return _shuffle("down", value, delta, width)


def shuffle_idx(value, lane, width: int = WARP_SIZE):
    """The value of lane ``lane`` (``__shfl_sync``)."""
    return _shuffle("idx", value, lane, width)


_COMBINERS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "max": lambda a, b: a.fly_max(b) if not isinstance(a, Float) else _fmax(a, b),
    "min": lambda a, b: a.fly_min(b) if not isinstance(a, Float) else _fmin(a, b),
}


def _fmax(a, b):
    from mlir.dialects import arith

    return type(a)(arith.maximumf(a.value, b.value))


def _fmin(a, b):
    from mlir.dialects import arith

    return type(a)(arith.minimumf(a.value, b.value))


def _combiner(op):
    if callable(op):
        return op
    try:
        return _COMBINERS[op]
    except KeyError:
        raise ValueError(f"op: expected a function or one of {sorted(_COMBINERS)}, got {op!r}") from None


def warp_reduce(value, op="add", width: int = WARP_SIZE):
    """Butterfly reduction over ``width`` lanes (a power of two); every lane gets the result. ``value`` may be a
    tuple of values reduced as one element: ``op`` is then a function of two such tuples returning their combination
    (e.g. ``(count, mean, M2)`` merged by Chan's update, or softmax's ``(max, sum)``), and a tuple is returned."""
    if width & (width - 1) or not 1 <= width <= WARP_SIZE:
        raise ValueError(f"width: expected a power of two in 1..32, got {width}")
    combine = _combiner(op)
    joint = isinstance(value, (tuple, list))
    if joint and not callable(op):
        raise TypeError(f"warp_reduce of a tuple: expected a combine function of two tuples as op, got {op!r}")
    value = tuple(as_numeric(v) for v in value) if joint else as_numeric(value)
    offset = width // 2
    while offset >= 1:
        other = tuple(shuffle_xor(v, offset, width) for v in value) if joint else shuffle_xor(value, offset, width)
        value = tuple(combine(value, other)) if joint else combine(value, other)
        offset //= 2
    return value


def _check_scratch(scratch, num_warps: int) -> None:
    """``block_reduce``'s scratch: a shared-memory tensor with a slot per warp (fewer would lose partials)."""
    from flydsl.expr.tensor import Tensor
    from flydsl.layout import size

    if not isinstance(scratch, Tensor) or scratch.space != "shared":
        raise TypeError(f"scratch: expected a shared-memory Tensor (fx.SmemAllocator().allocate), got {scratch!r}")
    slots = size(scratch.layout)
    if isinstance(slots, int) and slots < num_warps:
        raise ValueError(f"scratch: {num_warps} warps need {num_warps} elements of scratch, got {slots} ({scratch})")


def block_reduce(value, op="add", *, scratch, num_warps: int) -> Numeric:
    """Reduction over the block (1-D, ``num_warps`` warps): warps reduce, lane 0 of each writes ``scratch`` (a
    shared-memory Tensor of at least ``num_warps`` elements), then every warp reduces those partials. Every thread
    gets the result."""
    if num_warps & (num_warps - 1) or not 1 <= num_warps <= WARP_SIZE:
        raise ValueError(f"num_warps: expected a power of two in 1..32, got {num_warps}")
    _check_scratch(scratch, num_warps)
    combine = _combiner(op)
    partial = warp_reduce(value, combine)
    lane, warp = lane_id(), warp_idx()
    from flydsl.compiler import control_flow

    def write():
        scratch[warp] = partial
        return ()

    control_flow.if_else(lane == 0, write, lambda: (), (), ())
    barrier()
    lane_index = lane.fly_min(num_warps - 1)
    mine = scratch[lane_index]
    total = warp_reduce(mine, combine, width=num_warps)
    barrier()  # scratch can be reused after this
    return total
