"""``arith`` for kernels: the seed's helpers, taking and returning FlyDSL numerics (raw ``ir.Value``s work too).

Most code needs none of this: numerics have Python operators. These exist for explicit casts and selects, and for
code written against the seed's API.
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Boolean, Index, Numeric, as_numeric, value_of

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")

__all__ = ["constant", "select", "index_cast", "trunci", "extsi", "extui", "bitcast", "maximum", "minimum"]


def constant(value, type: ir.Type | None = None) -> Numeric:  # noqa: A002 - the seed's keyword
    """A constant: ``constant(1.0, T.f32)``; ``constant(3)`` is an Int32, ``constant(3, T.index)`` an Index."""
    if type is None:
        return as_numeric(value)
    attr_value = float(value) if isinstance(type, (ir.F16Type, ir.F32Type, ir.F64Type, ir.BF16Type)) else int(value)
    return as_numeric(_arith.ConstantOp(type, attr_value).result)


def select(condition, true_value, false_value) -> Numeric:
    """``condition ? true_value : false_value`` (one type for both values)."""
    a = as_numeric(true_value)
    b = as_numeric(false_value, type(a))
    if type(a) is not type(b):
        raise TypeError(f"select: both values need one type, got {type(a).__name__} and {type(b).__name__}")
    return type(a)(_arith.select(value_of(condition, Boolean), a.value, b.value))


def index_cast(type_or_value, value=None) -> Numeric:
    """``index_cast(T.index, x)`` or ``index_cast(x)`` (to Index)."""
    if value is None:
        return as_numeric(type_or_value).to(Index)
    return as_numeric(_arith.index_cast(type_or_value, value_of(value)))


def trunci(type_: ir.Type, value) -> Numeric:
    return as_numeric(_arith.trunci(type_, value_of(value)))


def extsi(type_: ir.Type, value) -> Numeric:
    return as_numeric(_arith.extsi(type_, value_of(value)))


def extui(type_: ir.Type, value) -> Numeric:
    return as_numeric(_arith.extui(type_, value_of(value)))


def bitcast(type_: ir.Type, value) -> Numeric:
    """Reinterprets the bits (same width): ``bitcast(T.i32, x_f32)``."""
    return as_numeric(_arith.bitcast(type_, value_of(value)))


def maximum(a, b) -> Numeric:
    a = as_numeric(a)
    return a.fly_max(b) if hasattr(a, "fly_max") else type(a)(_arith.maximumf(a.value, value_of(b, type(a))))


def minimum(a, b) -> Numeric:
    a = as_numeric(a)
    return a.fly_min(b) if hasattr(a, "fly_min") else type(a)(_arith.minimumf(a.value, value_of(b, type(a))))
