"""Types of kernels: the numeric classes, and ``T``, shorthands for MLIR types (``T.f32``, ``T.bf16x8``, ``T.i32``).

``T`` needs an active MLIR context (it is used while a kernel is traced). ``T.<scalar>x<N>`` is a vector type.
"""

from __future__ import annotations

import re

from flydsl.compiler.lazy import lazy_import
from flydsl.expr import numeric as _numeric
from flydsl.expr.numeric import *  # noqa: F403 - the seed imports the numeric types from here (Int32, Float32...)

ir = lazy_import("mlir.ir")

__all__ = ["T", *_numeric.__all__]

_SCALARS = {
    "i1": "i1",
    "i8": "i8",
    "i16": "i16",
    "i32": "i32",
    "i64": "i64",
    "index": "index",
    "f16": "f16",
    "bf16": "bf16",
    "f32": "f32",
    "f64": "f64",
    "f8e4m3fn": "f8E4M3FN",
    "f8e5m2": "f8E5M2",
}


class _TypeShorthands:
    """``T.f32`` -> ``f32``; ``T.bf16x8`` -> ``vector<8xbf16>``."""

    def __getattr__(self, name: str) -> ir.Type:
        match = re.fullmatch(r"([a-z0-9]+?)(?:x(\d+))?", name.lower())
        scalar = _SCALARS.get(match.group(1)) if match else None
        if scalar is None:
            raise AttributeError(f"T.{name}: expected a scalar ({', '.join(_SCALARS)}) optionally followed by xN")
        element = ir.Type.parse(scalar)
        if match.group(2):
            return ir.VectorType.get([int(match.group(2))], element)
        return element

    def vector(self, length: int, element: ir.Type) -> ir.Type:
        return ir.VectorType.get([length], element)


T = _TypeShorthands()
