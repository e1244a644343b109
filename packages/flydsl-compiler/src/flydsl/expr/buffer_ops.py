"""Range-checked loads and stores through a buffer resource: the seed's AMD buffer ops, on NVIDIA GPUs.

    rsrc = buffer_ops.create_buffer_resource(x)                  # x's memory: cosize(layout) * element bytes
    v = buffer_ops.buffer_load(rsrc, i, vec_width=4, dtype=T.f32)   # Float32x4; zeros where out of range
    buffer_ops.buffer_store(v, out_rsrc, i)                      # dropped where out of range

A resource is a base pointer (the tensor's first element) and a size in bytes. Offsets count elements of the
access's ``dtype`` from the base and are computed in 64 bits. As on AMD, the check is per element: an element is in
range when ``0 <= offset + k`` and ``(offset + k + 1) * sizeof(dtype) <= num_bytes``; out-of-range elements load as
zero and are not stored, the others are (so a vector straddling the end still moves its in-range part). The common
case, a vector wholly in range, is one access; the per-element path runs only at the edge. ``max_size=True`` means
what it means on AMD: no range check at all.

NVIDIA has no buffer resources: the check is an ``scf.if`` around an ordinary access built from Fly ops
(``fly.recast_ptr`` to ``dtype``, ``fly.add_offset``, then ``fly.load``/``fly.store`` for one element or ``fly.copy``
through a register buffer for a vector). A vector access is as wide as the tensor's alignment and the offset's known
divisibility prove (``tid * 4`` is known to be a multiple of 4: a 16-byte ``f32x4`` access); otherwise it is split
into narrower ones, still correct. Vectors are :class:`flydsl.expr.vector.Vector` values.
"""

from __future__ import annotations

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import vector as _vector
from flydsl.expr.layout import as_index
from flydsl.expr.numeric import Boolean, Int64, Integer, Numeric, as_numeric
from flydsl.expr.tensor import Tensor
from flydsl.expr.tensor import fly_ops as _fly
from flydsl.expr.vector import Vector, _element_class, load, store, vector_class

ir = lazy_import("mlir.ir")
_scf = lazy_import("mlir.dialects.scf")

__all__ = ["BufferResource", "create_buffer_resource", "buffer_load", "buffer_store"]


class BufferResource:
    """A base pointer (``!fly.ptr`` of the tensor's element type), its alignment in bytes, its memory space, and the
    range in bytes (an ``Int64``; ``None``: unchecked)."""

    __slots__ = ("pointer", "dtype", "alignment", "space", "num_bytes")

    def __init__(self, pointer: ir.Value, dtype: type[Numeric], alignment: int, space: str, num_bytes):
        self.pointer = pointer
        self.dtype = dtype
        self.alignment = alignment
        self.space = space
        self.num_bytes = num_bytes

    def __repr__(self):
        checked = "unchecked" if self.num_bytes is None else f"{self.num_bytes} bytes"
        return f"BufferResource<{self.dtype.__name__}, {self.space}, align {self.alignment}>({checked})"

    def view(self, dtype: type[Numeric], offset, count: int) -> Tensor:
        """``count`` elements of ``dtype`` from element ``offset`` of the resource, as a Tensor (no range check)."""
        pointer = self.pointer
        if dtype is not self.dtype:
            if self.alignment < dtype.width // 8:
                raise TypeError(
                    f"buffer access: {dtype.__name__} elements from a {self.dtype.__name__} tensor aligned to only"
                    f" {self.alignment} bytes"
                )
            target = ir.Type.parse(f"!fly.ptr<{dtype.mlir_name}, {self.space}, {self.alignment}>")
            pointer = _fly.RecastPtrOp(target, pointer).result
        return Tensor(pointer, _fl.Layout(count, 1), dtype, space=self.space, alignment=self.alignment, offset=offset)


def _byte_count(value) -> Int64:
    number = as_numeric(value, Int64)
    if not isinstance(number, Integer) or number.width < 32:
        raise TypeError(f"num_bytes: expected an integer, got {type(number).__name__}")
    return number.to(Int64)


def create_buffer_resource(tensor: Tensor, max_size: bool = False, num_bytes=None) -> BufferResource:
    """A resource over ``tensor``'s memory, from its first element: ``num_bytes`` bytes when given (an int or a
    kernel integer), else the tensor's extent ``cosize(layout) * sizeof(element)``. ``max_size=True``: no range
    check (AMD's maximal ``num_records``)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"create_buffer_resource: expected a fx.Tensor, got {type(tensor).__name__}")
    if isinstance(tensor.layout, _fl.ComposedLayout):
        raise TypeError("create_buffer_resource: a swizzled tensor has no linear extent; take its unswizzled memory")
    pointer = tensor.pointer
    if not (isinstance(tensor.offset, int) and tensor.offset == 0):
        moved = ir.Type.parse(f"!fly.ptr<{tensor.dtype.mlir_name}, {tensor.space}, {tensor.alignment}>")
        pointer = _fly.AddOffsetOp(moved, pointer, as_index(tensor.offset).value).result
    if max_size:
        size = None
    elif num_bytes is not None:
        size = _byte_count(num_bytes)
    else:
        extent = _fl.cosize(tensor.layout)  # an int for static layouts, else an Index computed in the kernel
        size = _byte_count(extent * tensor.element_bytes if isinstance(extent, int) else extent)
        if not isinstance(extent, int):
            size = size * tensor.element_bytes
    return BufferResource(pointer, tensor.dtype, tensor.alignment, tensor.space, size)


def _dtype_class(dtype) -> type[Numeric]:
    if isinstance(dtype, ir.VectorType):
        raise TypeError(f"dtype: give the element type ({dtype.element_type}) and vec_width")
    return _element_class(dtype)


def _offset(offset) -> Integer | int:
    """The offset as given: a Python int stays one (its alignment is known), kernel integers stay as they are."""
    if isinstance(offset, int) and not isinstance(offset, bool):
        return offset
    number = as_numeric(offset, Int64)
    if not isinstance(number, Integer) or number.width < 8:
        raise TypeError(f"buffer offset: expected an integer, got {type(number).__name__}")
    return number


def _in_range(rsrc: BufferResource, offset: Integer | int, count: int, dtype: type[Numeric]) -> Boolean | None:
    """``0 <= offset`` and ``(offset + count) * sizeof(dtype) <= num_bytes``, in 64 bits; None when unchecked."""
    if rsrc.num_bytes is None:
        return None
    first = Int64(offset) if isinstance(offset, int) else offset.to(Int64)
    end_bytes = (first + count) * (dtype.width // 8)
    return (first >= 0) & (end_bytes <= rsrc.num_bytes)


def buffer_load(rsrc: BufferResource, offset, vec_width: int = 1, dtype=None) -> Numeric | Vector:
    """``vec_width`` elements of ``dtype`` (default ``T.f32``; an MLIR type or a numeric class) from element
    ``offset``: a numeric for ``vec_width == 1``, else a ``Vector``. Elements out of range read as zero."""
    dtype = _dtype_class(dtype if dtype is not None else ir.F32Type.get())
    if not isinstance(vec_width, int) or vec_width < 1:
        raise ValueError(f"vec_width: expected a positive int, got {vec_width!r}")
    offset = _offset(offset)
    result_class = dtype if vec_width == 1 else vector_class(dtype, vec_width)

    def access():
        view = rsrc.view(dtype, offset, vec_width)
        return view[0] if vec_width == 1 else load(view)

    in_range = _in_range(rsrc, offset, vec_width, dtype)
    if in_range is None:
        return access()
    branch = _scf.IfOp(in_range.value, [result_class.mlir_type()], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        _scf.YieldOp([access().value])
    with ir.InsertionPoint(branch.else_block):
        if vec_width == 1:
            _scf.YieldOp([result_class(0).value])
        else:  # at the edge: element by element
            elements = [buffer_load(rsrc, offset + k, 1, dtype).value for k in range(vec_width)]
            _scf.YieldOp([_vector.from_elements(result_class.mlir_type(), elements).value])
    return result_class(branch.results[0])


def buffer_store(value, rsrc: BufferResource, offset) -> None:
    """Writes ``value`` (a numeric: one element; a ``Vector``: ``len(value)`` elements) at element ``offset`` (in
    units of the value's element type); elements out of range are not written. A Python number is stored as an
    element of the tensor's type."""
    if isinstance(value, ir.Value) and isinstance(value.type, ir.VectorType):
        value = Vector(value)
    if not isinstance(value, Vector):
        value = as_numeric(value, rsrc.dtype)
    dtype, count = (value.element, value.length) if isinstance(value, Vector) else (type(value), 1)
    offset = _offset(offset)

    def access():
        view = rsrc.view(dtype, offset, count)
        if count == 1 and not isinstance(value, Vector):
            view[0] = value
        else:
            store(value, view)

    in_range = _in_range(rsrc, offset, count, dtype)
    if in_range is None:
        access()
        return
    branch = _scf.IfOp(in_range.value, [], has_else=count > 1)
    with ir.InsertionPoint(branch.then_block):
        access()
        _scf.YieldOp([])
    if count > 1:
        with ir.InsertionPoint(branch.else_block):  # at the edge: element by element
            for k in range(count):
                buffer_store(value[k], rsrc, offset + k)
            _scf.YieldOp([])
