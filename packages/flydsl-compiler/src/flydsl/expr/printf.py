"""``fx.printf``: formatted output from device code (CUDA's ``printf``, through ``gpu.printf`` and ``vprintf``).

    fx.printf("block %d thread %d: x=%f\\n", gpu.block_idx.x, gpu.thread_idx.x, x)

Every thread that reaches the call prints; the output appears when the host synchronizes with the GPU. Arguments are
FlyDSL numerics or Python numbers (ints become ``Int32``, floats ``Float32``); floats are passed as doubles, as C's
varargs promote them (use ``%f``/``%e``/``%g``), ``Int64``/``Index`` need ``%ld``/``%lld``, narrow integers and
Booleans are widened to 32 bits (``%d``, or ``%u`` for unsigned types). The format must be a Python string.
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Boolean, Float, Index, Int32, Int64, Numeric, Uint32, as_numeric

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_gpu = lazy_import("mlir.dialects.gpu")

__all__ = ["printf"]


def _vararg(value) -> ir.Value:
    """The value as C varargs pass it: doubles for floats, at least 32-bit integers, 64-bit for Index."""
    number = as_numeric(value)
    if not isinstance(number, Numeric) or getattr(number, "length", 0):
        raise TypeError(f"printf: arguments are scalars, got {type(number).__name__} (print its elements)")
    if isinstance(number, Float):
        if number.width == 8:
            raise TypeError(f"printf: {type(number).__name__} is a storage type: convert to Float32 first")
        return number.value if number.width == 64 else _arith.extf(ir.F64Type.get(), number.value)
    if isinstance(number, Boolean):
        return number.to(Uint32).value
    if type(number) is Index:
        return number.to(Int64).value
    if number.width < 32:
        return number.to(Int32 if number.signed else Uint32).value
    return number.value


def printf(format: str, *args) -> None:  # noqa: A002 - C's name
    """Prints from every thread that runs it (C ``printf`` conversions; see the module's notes on types)."""
    if not isinstance(format, str):
        raise TypeError(f"printf: the format must be a Python str, got {type(format).__name__}")
    _gpu.printf(format, *[_vararg(a) for a in args])
