"""Helpers shared by the ``flydsl.expr.nvvm`` modules: operand checks, inline PTX and addresses."""

from __future__ import annotations

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import (
    Float,
    Float32,
    Int32,
    Numeric,
    as_numeric,
)
from flydsl.expr.tensor import Tensor, _static_coord, fly_ops

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")

_FULL_MASK = -1  # 0xffffffff as an i32
_SPACE_NUMBERS = {"generic": 0, "global": 1, "shared": 3, "register": 5}


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _float32(x) -> Float32:
    x = as_numeric(x, Float32)
    if type(x) is not Float32:
        raise TypeError(f"expected a Float32, got {type(x).__name__} (convert with .to(fx.Float32))")
    return x


def _int32(x, what: str) -> Int32:
    x = as_numeric(x, Int32)
    if not isinstance(x, Numeric) or x.width != 32 or isinstance(x, Float):
        raise TypeError(f"{what}: expected a 32-bit integer, got {type(x).__name__}")
    return Int32(x.value, divisibility=x.divisibility)


def _asm(result_type, operands, text: str, constraints: str, side_effects: bool = False):
    return _llvm.inline_asm(
        result_type, [v for v in operands], text, constraints, has_side_effects=side_effects or None
    )


# --- addresses -------------------------------------------------------------------------------------------------


def address(tensor: Tensor, coord=None) -> ir.Value:
    """The ``!llvm.ptr<space>`` of ``tensor``'s element at ``coord`` (default: its first element): a
    ``fly.element_address``, lowered with the tensor's accesses, so it works for any Fly tensor, including
    ``fx.SmemAllocator`` buffers (placed by the compiler) and swizzled layouts. ``coord``: a linear index or one index
    per mode of the shape, as for ``tensor[coord]``."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"address: expected a fx.Tensor, got {type(tensor).__name__}")
    coordinates = tensor._coordinates(_static_coord(0 if coord is None else coord))
    result = ir.Type.parse(f"!llvm.ptr<{_SPACE_NUMBERS[tensor.space]}>")
    return fly_ops.ElementAddressOp(result, tensor.materialize(), coordinates).result


def byte_offset(pointer: ir.Value, nbytes) -> ir.Value:
    """``pointer`` (an ``!llvm.ptr``, e.g. from :func:`address`) advanced by ``nbytes``: a Python int or a kernel
    integer (``llvm.getelementptr`` over bytes; a 32-bit offset is sign-extended). For accesses around one address
    computed once: their offsets stay 32-bit adds instead of each access's own 64-bit ``layout(coord)``, and constant
    ones fold into the instructions' immediates."""
    if not isinstance(pointer, ir.Value) or not str(pointer.type).startswith("!llvm.ptr"):
        raise TypeError(f"byte_offset pointer: expected an !llvm.ptr value, got {pointer!r}")
    byte = ir.IntegerType.get_signless(8)
    if isinstance(nbytes, int):
        return _llvm.getelementptr(pointer.type, pointer, [], [nbytes], byte, 0)
    if not isinstance(nbytes, Numeric) or isinstance(nbytes, Float) or nbytes.width not in (32, 64):
        raise TypeError(f"byte_offset nbytes: expected an int or a 32/64-bit kernel integer, got {nbytes!r}")
    return _llvm.getelementptr(pointer.type, pointer, [nbytes.value], [_DYNAMIC_INDEX], byte, 0)


_DYNAMIC_INDEX = -(2**31)  # llvm.getelementptr's marker of an index given as an operand


def _pointer(where, coord, space: str) -> ir.Value:
    if not isinstance(where, Tensor) and coord is not None:  # e.g. a size passed positionally after a pointer
        raise TypeError(f"a coordinate ({coord!r}) indexes a Tensor, not a pointer: offset the pointer instead")
    value = address(where, coord) if isinstance(where, Tensor) else where
    if not isinstance(value, ir.Value) or not str(value.type).startswith("!llvm.ptr"):
        raise TypeError(f"expected a Tensor or an !llvm.ptr value, got {where!r}")
    expected = f"!llvm.ptr<{_SPACE_NUMBERS[space]}>"
    if str(value.type) != expected:
        raise TypeError(f"expected a {space} pointer ({expected}), got {value.type}")
    return value


def _struct_fields(value: ir.Value, count: int, element: ir.Type) -> list[ir.Value]:
    if count == 1 and not str(value.type).startswith("!llvm.struct"):
        return [value]
    return [_llvm.extractvalue(element, value, [k]) for k in range(count)]
