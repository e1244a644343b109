"""Transcendental functions on floats (``math`` dialect): CUDA's accuracy by default, approximations on request.

``exp``, ``exp2``, ``log``, ``log2``, ``sqrt``, ``rsqrt``, ``tanh``, ``erf``, ``sin``, ``cos``, ``fma``.

On float32 the defaults are what CUDA gives without ``-use_fast_math`` (tests/compiler/test_math_defaults.py checks
the PTX): ``sqrt`` is IEEE-rounded ``sqrt.rn.f32`` (``sqrtf``); ``rsqrt`` is ``rsqrt.approx.f32`` (``rsqrtf``, 2 ulp);
``exp2`` is ``ex2.approx.f32`` (``exp2f``, 2 ulp); ``exp``, ``log``, ``log2``, ``tanh``, ``erf``, ``sin``, ``cos`` are
libdevice's ``__nv_expf``... (``expf``...); float ``/`` is ``div.rn.f32`` (``1.0 / x``: ``rcp.rn.f32``). Float16 and
BFloat16 ``sqrt`` round an ``sqrt.approx.f32`` as CUDA's ``hsqrt`` does; float64 is IEEE throughout.

``fastmath="afn"`` (approximate functions; ``"fast"``, or any ``arith.fastmath`` flag names joined by ``,``) gives the
fast versions, as ``-use_fast_math`` does: ``sqrt.approx.f32``, ``exp`` as ``ex2.approx`` of ``x * log2(e)``, ``log``
as ``lg2.approx``. ``with fx.fastmath():`` gives them to every call traced inside that has no ``fastmath=`` of its
own, and to float division (``div.approx.f32``).
"""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Float, Float32, Numeric, as_numeric, fastmath_flags

_llvm = lazy_import("mlir.dialects.llvm")
_math = lazy_import("mlir.dialects.math")

__all__ = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "fma"]


def _float(name: str, x) -> Float:
    x = as_numeric(x, None)
    if not isinstance(x, Float):
        raise TypeError(f"{name}: expected a float, got {type(x).__name__} (convert with .to(Float32))")
    return x


def _unary(op, x, fastmath: str | None) -> Numeric:
    x = _float(op.__name__, x)
    return type(x)(op(x.value, fastmath=fastmath_flags(fastmath)))


def exp(x, fastmath=None):
    return _unary(_math.exp, x, fastmath)


def exp2(x, fastmath=None):
    return _unary(_math.exp2, x, fastmath)


def log(x, fastmath=None):
    return _unary(_math.log, x, fastmath)


def log2(x, fastmath=None):
    return _unary(_math.log2, x, fastmath)


def _approximate(flags) -> bool:
    names = str(flags).removeprefix("#arith.fastmath<").removesuffix(">").split(",")
    return "afn" in names or "fast" in names


def sqrt(x, fastmath=None):
    """``sqrt.rn.f32`` on float32 (``math.sqrt`` would take libdevice's ``__nv_sqrtf``, which is ``sqrt.approx.f32``
    unless the module asks for precise square roots, and MLIR 22 gives no way to ask); ``sqrt.approx.f32`` under
    approximate-function flags."""
    x = _float("sqrt", x)
    flags = fastmath_flags(fastmath)
    if type(x) is not Float32:
        return type(x)(_math.sqrt(x.value, fastmath=flags))
    name = "llvm.nvvm.sqrt.approx.f" if flags is not None and _approximate(flags) else "llvm.nvvm.sqrt.rn.f"
    return Float32(_llvm.call_intrinsic(Float32.mlir_type(), name, [x.value], [], []))


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
    return type(a)(_math.fma(a.value, b.value, c.value, fastmath=fastmath_flags(fastmath)))
