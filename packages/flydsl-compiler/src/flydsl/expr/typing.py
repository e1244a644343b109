"""Types of kernels: the numeric classes, and ``T``, shorthands for MLIR types (``T.f32``, ``T.bf16x8``, ``T.i32``).

``T`` needs an active MLIR context (it is used while a kernel is traced). ``T.<scalar>x<N>`` is a vector type.
"""

from __future__ import annotations

import re

from mlir import ir

from flydsl.expr.numeric import (
    BFloat16,
    Boolean,
    Float8E4M3FN,
    Float8E5M2,
    Float16,
    Float32,
    Float64,
    Index,
    Int8,
    Int16,
    Int32,
    Int64,
    Numeric,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
)

__all__ = [
    "T",
    "Numeric",
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
]

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
