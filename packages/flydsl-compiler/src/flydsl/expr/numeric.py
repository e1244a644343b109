"""Numeric values of kernels: Python objects around MLIR values, with Python operators.

``Int32(x)``, ``Float32(x)``... wrap an ``mlir.ir.Value`` (or build a constant from a Python number). Operators emit
``arith`` ops at the current insertion point; Python numbers on either side become constants of the other side's
type. Types mix only explicitly (``x.to(Float32)``), except that narrower integers of one signedness widen, and any
integer meets ``Index`` as ``Index``. ``//`` and ``%`` truncate toward zero (C, CUDA and Triton semantics; the same as
Python on non-negative values).

Integer values are also *dynamic leaves* of ``flydsl.layout`` (its integer-like protocol): ``divisibility`` is what
the value is known to be a multiple of, and ``fly_max`` / ``fly_min`` replace the builtins.
"""

from __future__ import annotations

import contextlib
import contextvars
import math as _pymath

from flydsl.compiler.lazy import lazy_import

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")


__all__ = [
    "Numeric",
    "Integer",
    "Float",
    "Boolean",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Uint8",
    "Uint16",
    "Uint32",
    "Uint64",
    "Index",
    "Float16",
    "BFloat16",
    "Float32",
    "Float64",
    "Float8E4M3FN",
    "Float8E5M2",
    "as_numeric",
    "fp_contract",
    "fastmath",
    "value_of",
    "as_integer",
]


class DynamicBoolError(TypeError):
    """A dynamic value was used where Python needs a bool at trace time."""


class Numeric:
    """Base class: ``value`` is the ``mlir.ir.Value``; subclasses fix the MLIR type."""

    width: int = 0
    mlir_name: str = ""

    __slots__ = ("value", "divisibility")

    def __init__(self, value, divisibility: int = 1):
        if isinstance(value, Numeric):
            value = value.to(type(self)).value
        elif not isinstance(value, ir.Value):
            _reject_placeholder(value)
            value = self._constant(value)
        self.value = value
        self.divisibility = divisibility

    # --- construction -------------------------------------------------------------------------------------------
    @classmethod
    def mlir_type(cls) -> ir.Type:
        return ir.Type.parse(cls.mlir_name)

    @classmethod
    def _constant(cls, number) -> ir.Value:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value})"

    @property
    def type(self) -> ir.Type:
        return self.value.type

    def constant_value(self):
        """The Python number when this value is an ``arith.constant``, else None."""
        owner = self.value.owner
        if isinstance(owner, ir.OpView) and owner.operation.name == "arith.constant":
            attr = owner.attributes["value"]
            if isinstance(attr, ir.IntegerAttr):
                return attr.value
            if isinstance(attr, ir.FloatAttr):
                return attr.value
        return None

    def __bool__(self):
        raise DynamicBoolError(
            f"a dynamic {type(self).__name__} cannot be used as a Python bool. Conditions of `if`/`while` in a"
            " kernel become scf.if/scf.while, but not inside `and`/`or`/`not`, nor in a branch that holds"
            " an exit that cannot be folded, nor in properties or operators (only the kernel and the functions,"
            " methods and constructors it calls are traced so: move the `if` into a method called by name); use `&`,"
            " `|`, `~` on Boolean values, or fx.const_expr(...) for a trace-time condition"
        )

    def __index__(self):
        raise TypeError(
            f"a dynamic {type(self).__name__} is not a Python int: it is known only when the kernel runs (a loop"
            " index of `range` is dynamic; use range_constexpr(...) to loop at trace time over Python data)"
        )

    __int__ = __index__

    def __hash__(self):
        return id(self)

    # --- conversions ---------------------------------------------------------------------------------------------
    def to(self, target: type[Numeric]) -> Numeric:
        """Converts to another numeric type (extend, truncate, int<->float, index casts)."""
        if target is type(self):
            return self
        return _convert(self, target)


class Integer(Numeric):
    signed = True

    @classmethod
    def _constant(cls, number) -> ir.Value:
        if isinstance(number, bool):
            number = int(number)
        if not isinstance(number, int):
            raise TypeError(f"{cls.__name__}: expected an int, got {number!r}")
        lo, hi = cls.bounds()
        if not lo <= number <= hi:
            raise OverflowError(f"{cls.__name__}: {number} does not fit in [{lo}, {hi}]")
        if number > (1 << (cls.width - 1)) - 1:  # unsigned constants are stored as their two's complement bits
            number -= 1 << cls.width
        return _arith.ConstantOp(cls.mlir_type(), number).result

    @classmethod
    def bounds(cls) -> tuple[int, int]:
        if cls.signed:
            return -(1 << (cls.width - 1)), (1 << (cls.width - 1)) - 1
        return 0, (1 << cls.width) - 1

    # --- arithmetic ----------------------------------------------------------------------------------------------
    def _binary(self, other, op, reverse=False, result_divisibility=1):
        a, b = _unify(self, other)
        if reverse:
            a, b = b, a
        return type(a)(op(a.value, b.value), divisibility=result_divisibility)

    def __add__(self, other):
        return self._binary(other, _arith.addi, result_divisibility=_gcd(self, other))

    def __radd__(self, other):
        return self._binary(other, _arith.addi, reverse=True, result_divisibility=_gcd(self, other))

    def __sub__(self, other):
        return self._binary(other, _arith.subi, result_divisibility=_gcd(self, other))

    def __rsub__(self, other):
        return self._binary(other, _arith.subi, reverse=True, result_divisibility=_gcd(self, other))

    def __mul__(self, other):
        return self._binary(other, _arith.muli, result_divisibility=_product_divisibility(self, other))

    def __rmul__(self, other):
        return self._binary(other, _arith.muli, reverse=True, result_divisibility=_product_divisibility(self, other))

    def __floordiv__(self, other):
        return self._binary(other, _arith.divsi if self.signed else _arith.divui)

    def __rfloordiv__(self, other):
        return self._binary(other, _arith.divsi if self.signed else _arith.divui, reverse=True)

    def __mod__(self, other):
        return self._binary(other, _arith.remsi if self.signed else _arith.remui)

    def __rmod__(self, other):
        return self._binary(other, _arith.remsi if self.signed else _arith.remui, reverse=True)

    def __and__(self, other):
        return self._binary(other, _arith.andi)

    def __rand__(self, other):
        return self._binary(other, _arith.andi, reverse=True)

    def __or__(self, other):
        return self._binary(other, _arith.ori)

    def __ror__(self, other):
        return self._binary(other, _arith.ori, reverse=True)

    def __xor__(self, other):
        return self._binary(other, _arith.xori)

    def __rxor__(self, other):
        return self._binary(other, _arith.xori, reverse=True)

    def __lshift__(self, other):
        return self._binary(other, _arith.shli)

    def __rshift__(self, other):
        return self._binary(other, _arith.shrsi if self.signed else _arith.shrui)

    def __neg__(self):
        return type(self)(0) - self

    def __invert__(self):
        return self ^ type(self)(-1 if self.signed else (1 << self.width) - 1)

    # --- comparisons (Boolean results) ---------------------------------------------------------------------------
    def _compare(self, other, signed_predicate: str, unsigned_predicate: str):
        a, b = _unify(self, other)
        predicate = signed_predicate if a.signed else unsigned_predicate
        return Boolean(_arith.cmpi(getattr(_arith.CmpIPredicate, predicate), a.value, b.value))

    def __eq__(self, other):
        return self._compare(other, "eq", "eq")

    def __ne__(self, other):
        return self._compare(other, "ne", "ne")

    def __lt__(self, other):
        return self._compare(other, "slt", "ult")

    def __le__(self, other):
        return self._compare(other, "sle", "ule")

    def __gt__(self, other):
        return self._compare(other, "sgt", "ugt")

    def __ge__(self, other):
        return self._compare(other, "sge", "uge")

    # --- flydsl.layout leaf protocol ------------------------------------------------------------------------------
    def fly_max(self, other):
        return self._binary(other, _arith.maxsi if self.signed else _arith.maxui)

    def fly_min(self, other):
        return self._binary(other, _arith.minsi if self.signed else _arith.minui)


_FP_CONTRACT = contextvars.ContextVar("fp_contract", default=True)  # per thread; kernel traces start from True


@contextlib.contextmanager
def fp_contract(enabled: bool = True):
    """Traced inside ``with fx.fp_contract(False):``, float ``+``, ``-`` and ``*`` (scalars and vectors) are each
    rounded on their own; elsewhere (the default, as nvcc's ``--fmad=true`` and Triton's) the backend may fuse a
    product and a sum into one ``fma`` (faster, and rounded once instead of twice). Regions nest. A region only
    affects code traced inside it: the tracer enters ``fp_contract(True)`` around each kernel body,
    whatever the host code around the launch does, so that a cached kernel does not depend on its first caller."""
    token = _FP_CONTRACT.set(bool(enabled))
    try:
        yield
    finally:
        _FP_CONTRACT.reset(token)


def float_flags():
    """The ``arith.fastmath`` attribute that float ``+``, ``-`` and ``*`` carry where they are traced (``contract``
    unless inside ``fp_contract(False)``), or None."""
    return ir.Attribute.parse("#arith.fastmath<contract>") if _FP_CONTRACT.get() else None


_FASTMATH = contextvars.ContextVar("fastmath", default=None)  # per thread; kernel traces start from None


@contextlib.contextmanager
def fastmath(flags: str | None = "afn"):
    """Traced inside ``with fx.fastmath():``, float division and the ``fx.math`` functions called without their own
    ``fastmath=`` take the ``arith.fastmath`` flags ``flags``: ``"afn"`` (approximate functions, the default) gives
    what CUDA's ``-use_fast_math`` gives them (``div.approx.f32``, ``sqrt.approx.f32``, ``exp`` as ``ex2.approx``,
    ``log`` as ``lg2.approx``); ``"fast"`` or other flag names joined by ``,`` say more. Elsewhere (and under
    ``fastmath(None)``) they keep CUDA's default accuracy (see :mod:`flydsl.expr.math`). Regions nest; like
    :func:`fp_contract`, a region only affects code traced inside it (kernel traces start outside any)."""
    token = _FASTMATH.set(flags or None)
    try:
        yield
    finally:
        _FASTMATH.reset(token)


def fastmath_flags(flags: str | None = None):
    """The ``arith.fastmath`` attribute of ``flags``, else of the enclosing :func:`fastmath` region, or None."""
    flags = flags or _FASTMATH.get()
    return ir.Attribute.parse(f"#arith.fastmath<{flags}>") if flags else None


def float_op_flags(op):
    """The ``arith.fastmath`` attribute a float op traced here carries: ``+ - *`` contract (see :func:`fp_contract`),
    division follows the :func:`fastmath` region."""
    if op is _arith.addf or op is _arith.subf or op is _arith.mulf:
        return float_flags()
    return fastmath_flags() if op is _arith.divf else None


class Float(Numeric):
    @classmethod
    def _constant(cls, number) -> ir.Value:
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            raise TypeError(f"{cls.__name__}: expected a number, got {number!r}")
        if cls.width == 8:
            raise TypeError(f"{cls.__name__} is a storage type: build a Float32 and convert with .to()")
        return _arith.ConstantOp(cls.mlir_type(), float(number)).result

    def _binary(self, other, op, reverse=False):
        a, b = _unify(self, other)
        if a.width == 8:
            raise TypeError(f"{type(a).__name__} is a storage type: convert to Float32 with .to() for arithmetic")
        if reverse:
            a, b = b, a
        return type(a)(op(a.value, b.value, fastmath=float_op_flags(op)))

    def __add__(self, other):
        return self._binary(other, _arith.addf)

    def __radd__(self, other):
        return self._binary(other, _arith.addf, reverse=True)

    def __sub__(self, other):
        return self._binary(other, _arith.subf)

    def __rsub__(self, other):
        return self._binary(other, _arith.subf, reverse=True)

    def __mul__(self, other):
        return self._binary(other, _arith.mulf)

    def __rmul__(self, other):
        return self._binary(other, _arith.mulf, reverse=True)

    def __truediv__(self, other):
        return self._binary(other, _arith.divf)

    def __rtruediv__(self, other):
        return self._binary(other, _arith.divf, reverse=True)

    def __neg__(self):
        return type(self)(_arith.negf(self.value))

    def _compare(self, other, predicate: str):
        a, b = _unify(self, other)
        return Boolean(_arith.cmpf(getattr(_arith.CmpFPredicate, predicate), a.value, b.value))

    def __eq__(self, other):
        return self._compare(other, "OEQ")

    def __ne__(self, other):
        return self._compare(other, "UNE")

    def __lt__(self, other):
        return self._compare(other, "OLT")

    def __le__(self, other):
        return self._compare(other, "OLE")

    def __gt__(self, other):
        return self._compare(other, "OGT")

    def __ge__(self, other):
        return self._compare(other, "OGE")


class Boolean(Integer):
    """An ``i1``: comparisons give it; ``&``, ``|``, ``^``, ``~`` combine it (``and``/``or``/``not`` cannot)."""

    width = 1
    signed = False
    mlir_name = "i1"

    @classmethod
    def _constant(cls, number) -> ir.Value:
        return _arith.ConstantOp(cls.mlir_type(), 1 if number else 0).result

    def __invert__(self):
        return self ^ Boolean(True)


def _int_type(name: str, width: int, signed: bool, mlir_name: str):
    return type(name, (Integer,), {"width": width, "signed": signed, "mlir_name": mlir_name, "__slots__": ()})


def _float_type(name: str, width: int, mlir_name: str):
    return type(name, (Float,), {"width": width, "mlir_name": mlir_name, "__slots__": ()})


Int8 = _int_type("Int8", 8, True, "i8")
Int16 = _int_type("Int16", 16, True, "i16")
Int32 = _int_type("Int32", 32, True, "i32")
Int64 = _int_type("Int64", 64, True, "i64")
Uint8 = _int_type("Uint8", 8, False, "i8")
Uint16 = _int_type("Uint16", 16, False, "i16")
Uint32 = _int_type("Uint32", 32, False, "i32")
Uint64 = _int_type("Uint64", 64, False, "i64")
Index = _int_type("Index", 64, True, "index")
Float16 = _float_type("Float16", 16, "f16")
BFloat16 = _float_type("BFloat16", 16, "bf16")
Float32 = _float_type("Float32", 32, "f32")
Float64 = _float_type("Float64", 64, "f64")
Float8E4M3FN = _float_type("Float8E4M3FN", 8, "f8E4M3FN")
Float8E5M2 = _float_type("Float8E5M2", 8, "f8E5M2")

_BY_MLIR_NAME = {
    "i1": Boolean,
    "i8": Int8,
    "i16": Int16,
    "i32": Int32,
    "i64": Int64,
    "index": Index,
    "f16": Float16,
    "bf16": BFloat16,
    "f32": Float32,
    "f64": Float64,
    "f8E4M3FN": Float8E4M3FN,
    "f8E5M2": Float8E5M2,
}


def _reject_placeholder(value) -> None:
    """Objects that stand for a missing value (a name bound only inside traced control flow) raise their error."""
    fail = getattr(type(value), "__fly_fail__", None)
    if fail is not None:
        fail(value)


def as_numeric(value, like: type[Numeric] | None = None) -> Numeric:
    """A Numeric for ``value``: Numerics pass through, ``ir.Value``s get the class of their type (signless integers
    read as signed), Python numbers become constants of ``like`` (Int32 / Float32 by default)."""
    if isinstance(value, Numeric):
        return value
    if isinstance(value, ir.Value):
        cls = _BY_MLIR_NAME.get(str(value.type))
        if cls is None:
            raise TypeError(f"no FlyDSL numeric type for an MLIR value of type {value.type}")
        return cls(value)
    _reject_placeholder(value)
    if like is None:
        like = Boolean if isinstance(value, bool) else Int32 if isinstance(value, int) else Float32
    return like(value)


def as_integer(value, cls: type[Integer], what: str) -> Integer:
    """``value`` (a Python int or any kernel integer) as a ``cls``, converted if needed; a TypeError naming ``what``
    for anything else (floats included)."""
    number = as_numeric(value, cls)
    if not isinstance(number, Integer):
        raise TypeError(f"{what}: expected an integer, got {type(number).__name__}")
    return number if type(number) is cls else number.to(cls)


def value_of(value, like: type[Numeric] | None = None) -> ir.Value:
    """The ``ir.Value`` of a Numeric, a raw value, or a Python number (a constant of ``like``)."""
    if isinstance(value, ir.Value):
        return value
    return as_numeric(value, like).value


def _unify(a: Numeric, b) -> tuple[Numeric, Numeric]:
    """Both operands in one type: Python numbers take the Numeric's type; integers widen within a signedness and
    meet Index as Index; anything else must be converted explicitly."""
    if not isinstance(b, Numeric):
        if isinstance(b, ir.Value):
            b = as_numeric(b)
        else:
            return a, type(a)(b)
    ta, tb = type(a), type(b)
    if ta is tb:
        return a, b
    if issubclass(ta, Integer) and issubclass(tb, Integer) and ta is not Boolean and tb is not Boolean:
        if ta is Index or tb is Index:
            return a.to(Index), b.to(Index)
        if ta.signed == tb.signed:
            wide = ta if ta.width >= tb.width else tb
            return a.to(wide), b.to(wide)
    raise TypeError(
        f"cannot combine {ta.__name__} and {tb.__name__} implicitly: convert one with .to({ta.__name__}) or"
        f" .to({tb.__name__})"
    )


def _convert(x: Numeric, target: type[Numeric]) -> Numeric:
    source = type(x)
    t = target.mlir_type()
    if issubclass(source, Integer) and issubclass(target, Integer):
        if source is Index or target is Index:
            cast = _arith.index_cast if source.signed else _arith.index_castui
            return target(cast(t, x.value), divisibility=x.divisibility)
        if target.width > source.width:
            extend = _arith.extsi if source.signed and source is not Boolean else _arith.extui
            return target(extend(t, x.value), divisibility=x.divisibility)
        if target.width < source.width:
            return target(_arith.trunci(t, x.value))
        return target(x.value, divisibility=x.divisibility)  # same bits, other signedness
    if issubclass(source, Integer) and issubclass(target, Float):
        value = x.value if source is not Index else _arith.index_cast(ir.IntegerType.get_signless(64), x.value)
        to_float = _arith.sitofp if source.signed else _arith.uitofp
        return target(to_float(t, value))
    if issubclass(source, Float) and issubclass(target, Integer):
        if target is Index:
            return _convert(_convert(x, Int64), Index)
        to_int = _arith.fptosi if target.signed else _arith.fptoui
        return target(to_int(t, x.value))
    if issubclass(source, Float) and issubclass(target, Float):
        if target.width > source.width:
            return target(_arith.extf(t, x.value))
        return target(_arith.truncf(t, x.value))
    raise TypeError(f"cannot convert {source.__name__} to {target.__name__}")


def _divisibility(x) -> int:
    if isinstance(x, Numeric):
        return x.divisibility
    if isinstance(x, int):
        return abs(x) or 1 << 62
    return 1


def _gcd(a, b) -> int:
    return _pymath.gcd(_divisibility(a), _divisibility(b))


def _product_divisibility(a, b) -> int:
    return min(_divisibility(a) * _divisibility(b), 1 << 62)
