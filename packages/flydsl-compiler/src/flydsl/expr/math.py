"""Transcendental functions on floats (``math`` dialect), with optional fast-math flags.

``exp``, ``exp2``, ``log``, ``log2``, ``sqrt``, ``rsqrt``, ``tanh``, ``erf``, ``sin``, ``cos``, ``fma``.
``fastmath="fast"`` (or any ``arith.fastmath`` flag names joined by ``,``) lets LLVM use approximations, e.g.
``ex2.approx`` for ``exp2``.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import math as _math

from flydsl.expr.numeric import Float, Numeric, as_numeric

__all__ = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "fma"]


def _flags(fastmath: str | None):
    if not fastmath:
        return None
    return ir.Attribute.parse(f"#arith.fastmath<{fastmath}>")


def _unary(op, x, fastmath: str | None) -> Numeric:
    x = as_numeric(x, None)
    if not isinstance(x, Float):
        raise TypeError(f"{op.__name__}: expected a float, got {type(x).__name__} (convert with .to(Float32))")
    return type(x)(op(x.value, fastmath=_flags(fastmath)))


def exp(x, fastmath=None):
    return _unary(_math.exp, x, fastmath)


def exp2(x, fastmath=None):
    return _unary(_math.exp2, x, fastmath)


def log(x, fastmath=None):
    return _unary(_math.log, x, fastmath)


def log2(x, fastmath=None):
    return _unary(_math.log2, x, fastmath)


def sqrt(x, fastmath=None):
    return _unary(_math.sqrt, x, fastmath)


def rsqrt(x, fastmath=None):
    return _unary(_math.rsqrt, x, fastmath)


def tanh(x, fastmath=None):
    return _unary(_math.tanh, x, fastmath)


def erf(x, fastmath=None):
    return _unary(_math.erf, x, fastmath)


def sin(x, fastmath=None):
    return _unary(_math.sin, x, fastmath)


def cos(x, fastmath=None):
    return _unary(_math.cos, x, fastmath)


def fma(a, b, c, fastmath=None) -> Numeric:
    """``a * b + c`` with one rounding."""
    a = as_numeric(a)
    b, c = as_numeric(b, type(a)), as_numeric(c, type(a))
    return type(a)(_math.fma(a.value, b.value, c.value, fastmath=_flags(fastmath)))
