"""Short vectors in registers: ``Vector`` values over the MLIR ``vector`` dialect, and the seed's vector helpers.

A ``Vector`` is a 1-D ``vector<N x E>`` value. Its class fixes element and length (``Vector.of(Float32, 4)`` is the
class of ``vector<4xf32>``, cached), so a vector is a FlyDSL numeric like ``Float32``: it can be carried through
dynamic ``for``/``if``/``while`` and through ``range(..., init=[...])``. Elements are read with ``v[i]`` (a static or
dynamic index), written with ``v.insert(x, i)`` (a new vector: MLIR values are immutable); ``+ - * /`` (floats) and
``+ - * // % & | ^ << >>`` (integers) act element-wise, with a scalar on either side broadcast.

    v = vector.from_elements(T.f32x4, [a, b, c, d])     # or Vector.of(fx.Float32, 4)(0.0): a splat constant
    w = v * 2.0 + v
    s = w[0] + w[3]
    h = w.to(fx.BFloat16)                                # element-wise conversion: vector<4xbf16>
    bits = vector.bitcast(T.i32x2, h)                    # same bits, other element type

Memory: ``load(t)`` reads every element of a tensor view (``size(t)`` of them, in linear-coordinate order) into a
vector, and ``store(v, t)`` writes it back. Both go through ``fx.copy`` into a small register buffer, so accesses are
exactly as wide as the layouts, pointer alignment and known divisors prove (a 16-byte-aligned ``(1, 8)`` bf16 tile is
one 16-byte access); LLVM keeps the buffer in registers. ``load_op`` / ``store`` with indices are the seed's
forms: ``N`` consecutive elements starting at a coordinate.

Memory accesses need element types LLVM knows (integers, ``f16``, ``bf16``, ``f32``, ``f64``); keep fp8 data in
memory as ``Uint8``.
"""

from __future__ import annotations

import functools

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.layout import static_leaf
from flydsl.expr.numeric import (
    _BY_MLIR_NAME,
    BFloat16,
    Float,
    Float32,
    Int32,
    Integer,
    Numeric,
    as_numeric,
    float_op_flags,
)
from flydsl.expr.tensor import Tensor, copy

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")
_vector = lazy_import("mlir.dialects.vector")

__all__ = [
    "Vector",
    "vector_class",
    "extract",
    "insert",
    "broadcast",
    "from_elements",
    "bitcast",
    "load",
    "load_op",
    "store",
    "register_buffer",
    "pin",
]


def _element_class(element) -> type[Numeric]:
    """The numeric class of an element given as a class or an MLIR type."""
    if isinstance(element, type) and issubclass(element, Numeric) and not issubclass(element, Vector):
        return element
    if isinstance(element, ir.Type):
        found = _BY_MLIR_NAME.get(str(element))
        if found is not None:
            return found
    raise TypeError(f"expected a scalar element type (fx.Float32, T.f32...), got {element!r}")


@functools.cache
def _vector_class(element: type[Numeric], length: int) -> type[Vector]:
    name = f"{element.__name__}x{length}"
    attributes = {
        "element": element,
        "length": length,
        "width": element.width * length,
        "mlir_name": f"vector<{length}x{element.mlir_name}>",
        "__slots__": (),
    }
    return type(name, (Vector,), attributes)


def vector_class(element_or_type, length: int | None = None) -> type[Vector]:
    """The class of ``vector<length x element>``: ``vector_class(fx.Float32, 4)`` or ``vector_class(T.f32x4)``."""
    # a class never needs MLIR (zoo modules build their vector classes on import)
    if not isinstance(element_or_type, type) and isinstance(element_or_type, ir.VectorType):
        if element_or_type.rank != 1:
            raise TypeError(f"only 1-D vectors are supported, got {element_or_type}")
        return _vector_class(_element_class(element_or_type.element_type), element_or_type.shape[0])
    if isinstance(element_or_type, type) and issubclass(element_or_type, Vector) and element_or_type.element:
        return element_or_type
    if length is None or length < 1:
        raise ValueError(f"vector length: expected a positive int, got {length!r}")
    return _vector_class(_element_class(element_or_type), int(length))


class Vector(Numeric):
    """A ``vector<N x E>`` value. ``Vector(value)`` wraps an ``ir.Value`` of a 1-D vector type in the class of its
    type; ``Vector.of(E, N)(x)`` also takes a Python number (a splat) or a list of numbers (a constant)."""

    element: type[Numeric] | None = None
    length: int = 0
    __slots__ = ()

    def __new__(cls, value=None, divisibility: int = 1):
        if cls.element is None:
            if not isinstance(value, ir.Value):
                raise TypeError("Vector(x) wraps an MLIR vector value; use Vector.of(element, length)(x) for constants")
            cls = vector_class(value.type)
        return object.__new__(cls)

    def __init__(self, value, divisibility: int = 1):
        if isinstance(value, ir.Value) and str(value.type) != self.mlir_name:
            raise TypeError(f"{type(self).__name__}: expected a value of type {self.mlir_name}, got {value.type}")
        super().__init__(value, divisibility)

    of = staticmethod(vector_class)

    @classmethod
    def _constant(cls, number) -> ir.Value:
        values = list(number) if isinstance(number, (list, tuple)) else [number] * cls.length
        if len(values) != cls.length:
            raise ValueError(f"{cls.__name__}: expected {cls.length} values, got {len(values)}")
        scalar = cls.element.mlir_type()
        if issubclass(cls.element, Float):
            attrs = [ir.FloatAttr.get(scalar, float(v)) for v in values]
        else:
            attrs = [ir.IntegerAttr.get(scalar, int(v)) for v in values]
        dense = ir.DenseElementsAttr.get(attrs, type=cls.mlir_type()) if len(set(values)) > 1 else None
        if dense is None:
            dense = ir.DenseElementsAttr.get_splat(cls.mlir_type(), attrs[0])
        return _arith.ConstantOp(cls.mlir_type(), dense).result

    def __repr__(self):
        return f"{type(self).__name__}({self.value})"

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return (self[i] for i in range(self.length))

    # --- elements -------------------------------------------------------------------------------------------------
    def __getitem__(self, index):
        """``v[i]``: an element (static or dynamic ``i``); ``v[a:b]``: a shorter vector (static bounds, step 1)."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            if step != 1 or stop <= start:
                raise IndexError(f"vector slices need step 1 and a non-empty range, got {index}")
            # A shuffle, not vector.extract_strided_slice: the pipeline lowers shuffles to LLVM, not strided slices.
            result = vector_class(self.element, stop - start)
            return result(_vector.shuffle(self.value, self.value, list(range(start, stop))))
        return self.element(_extract(self.value, index, self.length))

    def insert(self, value, index) -> Vector:
        """A copy of this vector with element ``index`` replaced by ``value``."""
        scalar = as_numeric(value, self.element)
        if type(scalar) is not self.element:
            raise TypeError(f"insert: a {type(scalar).__name__} into a vector of {self.element.__name__}: convert it")
        static, dynamic = _position(index, self.length)
        return type(self)(_vector.insert(scalar.value, self.value, dynamic, static))

    # --- element-wise arithmetic ----------------------------------------------------------------------------------
    def _operand(self, other) -> ir.Value:
        if isinstance(other, Vector):
            if type(other) is not type(self):
                raise TypeError(f"cannot combine {type(self).__name__} and {type(other).__name__}: convert one")
            return other.value
        scalar = as_numeric(other, self.element)
        if type(scalar) is not self.element:
            raise TypeError(f"cannot combine {type(self).__name__} and {type(scalar).__name__}: convert one")
        return _vector.broadcast(self.mlir_type(), scalar.value)

    def _binary(self, other, float_op, int_op, unsigned_op=None, reverse=False):
        op = float_op if issubclass(self.element, Float) else int_op
        if issubclass(self.element, Integer) and not self.element.signed and unsigned_op is not None:
            op = unsigned_op
        if op is None:
            raise TypeError(f"this operator is not defined on {type(self).__name__}")
        a, b = self.value, self._operand(other)
        if reverse:
            a, b = b, a
        if issubclass(self.element, Float):
            return type(self)(op(a, b, fastmath=float_op_flags(op)))
        return type(self)(op(a, b))

    def __add__(self, other):
        return self._binary(other, _arith.addf, _arith.addi)

    def __radd__(self, other):
        return self._binary(other, _arith.addf, _arith.addi, reverse=True)

    def __sub__(self, other):
        return self._binary(other, _arith.subf, _arith.subi)

    def __rsub__(self, other):
        return self._binary(other, _arith.subf, _arith.subi, reverse=True)

    def __mul__(self, other):
        return self._binary(other, _arith.mulf, _arith.muli)

    def __rmul__(self, other):
        return self._binary(other, _arith.mulf, _arith.muli, reverse=True)

    def __truediv__(self, other):
        return self._binary(other, _arith.divf, None)

    def __rtruediv__(self, other):
        return self._binary(other, _arith.divf, None, reverse=True)

    def __floordiv__(self, other):
        return self._binary(other, None, _arith.divsi, _arith.divui)

    def __mod__(self, other):
        return self._binary(other, None, _arith.remsi, _arith.remui)

    def __and__(self, other):
        return self._binary(other, None, _arith.andi)

    def __or__(self, other):
        return self._binary(other, None, _arith.ori)

    def __xor__(self, other):
        return self._binary(other, None, _arith.xori)

    def __lshift__(self, other):
        return self._binary(other, None, _arith.shli)

    def __rshift__(self, other):
        return self._binary(other, None, _arith.shrsi, _arith.shrui)

    def __neg__(self):
        if issubclass(self.element, Float):
            return type(self)(_arith.negf(self.value))
        return type(self)(0) - self

    # --- conversions ----------------------------------------------------------------------------------------------
    def to(self, target) -> Vector:
        """Element-wise conversion: ``v.to(fx.BFloat16)`` (or to a vector class of the same length)."""
        if isinstance(target, type) and issubclass(target, Vector):
            if target.length != self.length:
                raise TypeError(f"{type(self).__name__}.to({target.__name__}): lengths differ")
            target = target.element
        target = _element_class(target)
        result = vector_class(target, self.length)
        if target is self.element:
            return self
        source, t = self.element, result.mlir_type()
        if source is BFloat16 and target is Float32 and self.length % 2 == 0:
            return self._bf16_pairs_to_f32(result)
        if issubclass(source, Float) and issubclass(target, Float):
            op = _arith.extf if target.width > source.width else _arith.truncf
        elif issubclass(source, Integer) and issubclass(target, Float):
            op = _arith.sitofp if source.signed else _arith.uitofp
        elif issubclass(source, Float) and issubclass(target, Integer):
            op = _arith.fptosi if target.signed else _arith.fptoui
        elif target.width == source.width:
            return result(self.value)  # same bits, other signedness
        elif target.width > source.width:
            op = _arith.extsi if source.signed else _arith.extui
        else:
            op = _arith.trunci
        return result(op(t, self.value))

    def _bf16_pairs_to_f32(self, result: type[Vector]) -> Vector:
        """bf16 -> f32 is exact: the bf16 bits are the float's upper half. Per 32-bit word of two bf16: the low one
        shifted up, the high one masked in place, one instruction each (``arith.extf`` costs the high one two: LLVM
        moves it down to convert it, ``PRMT`` + ``SHF``)."""
        words = self.bitcast(Int32)
        low = (words << 16).bitcast(Float32)
        high = (words & -65536).bitcast(Float32)
        half = self.length // 2
        order = [k // 2 + (half if k % 2 else 0) for k in range(self.length)]  # low0, high0, low1, high1, ...
        return result(_vector.shuffle(low.value, high.value, order))

    def bitcast(self, element) -> Vector:
        """The same bits as a vector of ``element`` (``v_bf16x8.bitcast(fx.Int32)`` is an ``Int32x4``)."""
        element = _element_class(element)
        if self.width % element.width:
            raise TypeError(f"{type(self).__name__} ({self.width} bits) is not a whole number of {element.__name__}")
        result = vector_class(element, self.width // element.width)
        return result(_vector.bitcast(result.mlir_type(), self.value))

    def reduce(self, kind: str = "add") -> Numeric:
        """All elements combined: ``"add"``, ``"mul"``, ``"max"``, ``"min"`` (floats: NaN-propagating)."""
        is_float = issubclass(self.element, Float)
        names = {
            "add": "add",
            "mul": "mul",
            "max": "maximumf" if is_float else ("maxsi" if self.element.signed else "maxui"),
            "min": "minimumf" if is_float else ("minsi" if self.element.signed else "minui"),
        }
        if kind not in names:
            raise ValueError(f"reduce: expected one of {sorted(names)}, got {kind!r}")
        kind_attr = getattr(_vector.CombiningKind, names[kind].upper())
        return self.element(_vector.reduction(self.element.mlir_type(), kind_attr, self.value))


def _position(index, length: int):
    """(static positions, dynamic positions) of ``vector.extract``/``insert`` for one index."""
    index = static_leaf(index) if not isinstance(index, int) else index
    if isinstance(index, int):
        if not -length <= index < length:
            raise IndexError(f"vector index {index} out of range for length {length}")
        return [index % length], []
    dynamic = ir.ShapedType.get_dynamic_size()
    return [dynamic], [index.to(_index_class()).value]


def _index_class():
    from flydsl.expr.numeric import Index

    return Index


def _extract(vector_value: ir.Value, index, length: int) -> ir.Value:
    static, dynamic = _position(index, length)
    return _vector.extract(vector_value, dynamic, static)


def _as_vector(value) -> Vector:
    if isinstance(value, Vector):
        return value
    if isinstance(value, ir.Value) and isinstance(value.type, ir.VectorType):
        return Vector(value)
    raise TypeError(f"expected a Vector, got {type(value).__name__}")


# --- the seed's functions ---------------------------------------------------------------------------------------


def extract(vector, static_position=None, dynamic_position=None) -> Numeric:
    """An element: ``extract(v, 2)``, or the seed's ``extract(v, static_position=[2])`` /
    ``extract(v, dynamic_position=[i])``."""
    v = _as_vector(vector)
    if dynamic_position:
        return v[dynamic_position[0]]
    if static_position is None:
        raise TypeError("extract needs a position")
    position = static_position[0] if isinstance(static_position, (list, tuple)) else static_position
    return v[position]


def insert(value, vector, static_position=None, dynamic_position=None) -> Vector:
    """A copy of ``vector`` with one element replaced: ``insert(x, v, static_position=[1])`` (or ``insert(x, v,
    1)``)."""
    v = _as_vector(vector)
    if dynamic_position:
        return v.insert(value, dynamic_position[0])
    if static_position is None:
        raise TypeError("insert needs a position")
    position = static_position[0] if isinstance(static_position, (list, tuple)) else static_position
    return v.insert(value, position)


def broadcast(vector_type, value) -> Vector:
    """Every element ``value``: ``broadcast(T.f32x4, x)``."""
    cls = vector_class(vector_type)
    scalar = as_numeric(value, cls.element)
    if type(scalar) is not cls.element:
        raise TypeError(f"broadcast: a {type(scalar).__name__} into {cls.__name__}: convert it")
    return cls(_vector.broadcast(cls.mlir_type(), scalar.value))


def from_elements(vector_type, elements) -> Vector:
    """A vector of these elements: ``from_elements(T.f32x4, [a, b, c, d])`` (Python numbers become constants)."""
    cls = vector_class(vector_type)
    elements = list(elements)
    if len(elements) != cls.length:
        raise ValueError(f"from_elements: {cls.__name__} needs {cls.length} elements, got {len(elements)}")
    values = []
    for e in elements:
        scalar = as_numeric(e, cls.element)
        if type(scalar) is not cls.element:
            raise TypeError(f"from_elements: a {type(scalar).__name__} in {cls.__name__}: convert it")
        values.append(scalar.value)
    return cls(_vector.from_elements(cls.mlir_type(), values))


def bitcast(vector_type, vector) -> Vector:
    """The same bits as another vector type: ``bitcast(T.i32x4, v_bf16x8)``."""
    cls = vector_class(vector_type)
    v = _as_vector(vector)
    if cls.width != v.width:
        raise TypeError(f"bitcast: {type(v).__name__} has {v.width} bits, {cls.__name__} {cls.width}")
    return cls(_vector.bitcast(cls.mlir_type(), v.value))


# --- memory ------------------------------------------------------------------------------------------------------


def pin(values):
    """The same values, pinned at this point of the program: an empty ``asm volatile`` that reads and writes their
    registers. The compiler computes them before it and moves nothing that uses the result above it: e.g. it cannot
    hoist the conversion of a loop-invariant packed vector out of a loop (which would keep the wide values live
    across the loop), nor move an accumulator read across wgmma's fence (``wgmma.fence_operands`` is this). Costs no
    instruction. Takes and returns a Vector of whole 32-bit registers (Float32, Int32, packed 16-bit pairs, ...) or
    a list of them."""
    if isinstance(values, (list, tuple)):
        return [pin(v) for v in values]
    if not isinstance(values, Vector) or values.width % 32:
        raise TypeError(f"pin: expected a Vector of whole 32-bit registers, got {type(values).__name__}")
    if values.element not in (Float32, Int32):  # packed 16-bit pairs, bytes
        return pin(values.bitcast(Int32)).bitcast(values.element)
    count = values.length
    fields = [_vector.extract(values.value, [], [i]) for i in range(count)]
    kind = "f" if values.element is Float32 else "r"
    constraints = ",".join([f"={kind}"] * count + [str(i) for i in range(count)])
    result = _llvm.inline_asm(asm_result_type(count, values.element), fields, "", constraints, has_side_effects=True)
    return vector_from_asm(type(values), result, count)


def asm_result_type(count: int, element=Float32) -> ir.Type:
    """An inline asm's result type for ``count`` values of ``element``: the value's type, or a struct of them."""
    field = element.mlir_type()
    return field if count == 1 else ir.Type.parse(f"!llvm.struct<({', '.join([str(field)] * count)})>")


def vector_from_asm(cls: type[Vector], result, count: int) -> Vector:
    """The Vector ``cls`` of an inline asm's ``count`` results (:func:`asm_result_type`)."""
    field = cls.element.mlir_type()
    fields = [result] if count == 1 else [_llvm.extractvalue(field, result, [i]) for i in range(count)]
    return cls(_vector.from_elements(cls.mlir_type(), fields))


def _function_entry_block() -> ir.Block:
    operation = ir.InsertionPoint.current.block.owner
    while operation is not None and operation.operation.name not in ("gpu.func", "llvm.func", "func.func"):
        operation = operation.operation.parent
    if operation is None:
        raise RuntimeError("register buffers are built inside a kernel being traced")
    return operation.operation.regions[0].blocks[0]


def _alignment(nbytes: int) -> int:
    return min(16, nbytes & -nbytes)


def register_buffer(cls: type[Vector]) -> tuple[ir.Value, Tensor]:
    """A private buffer for one ``cls`` vector: (its ``!llvm.ptr``, a Tensor of ``cls.length`` elements over it).

    It is an ``llvm.alloca`` at the start of the kernel, where LLVM's SROA turns it into registers once every access
    is static. ``load``/``store`` use it to move vectors through ``fx.copy``."""
    from flydsl.compiler.dialects import fly

    element_bytes = cls.element.width // 8
    if cls.element.width % 8 or cls.element.mlir_name.startswith("f8"):
        raise TypeError(f"{cls.__name__}: memory holds whole-byte integers, f16, bf16, f32 or f64 (fp8 as Uint8)")
    alignment = _alignment(element_bytes * cls.length)
    entry = _function_entry_block()
    first = entry.operations[0] if len(entry.operations) else None
    with ir.InsertionPoint(first) if first is not None else ir.InsertionPoint(entry):
        one = _arith.ConstantOp(ir.IntegerType.get_signless(32), 1).result
        raw = _llvm.alloca(ir.Type.parse("!llvm.ptr"), one, cls.mlir_type(), alignment=alignment)
        pointer_type = ir.Type.parse(f"!fly.ptr<{cls.element.mlir_name}, generic, {alignment}>")
        pointer = fly.MakePtrOp(pointer_type, raw).result
    return raw, Tensor(pointer, _fl.Layout(cls.length, 1), cls.element, space="generic", alignment=alignment)


def load(tensor: Tensor) -> Vector:
    """Every element of a tensor view, in linear-coordinate order, as one vector (``size`` must be static)."""
    count = _fl.size(tensor.layout)
    if not isinstance(count, int):
        raise ValueError(f"vector.load: the view needs a static size, got {tensor.layout}")
    cls = vector_class(tensor.dtype, count)
    raw, buffer = register_buffer(cls)
    copy(tensor, buffer)
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


def _store_whole(value: Vector, tensor: Tensor) -> None:
    count = _fl.size(tensor.layout)
    if count != value.length or value.element is not tensor.dtype:
        raise TypeError(f"vector.store: a {type(value).__name__} into {count} elements of {tensor.dtype.__name__}")
    raw, buffer = register_buffer(type(value))
    _llvm.store(value.value, raw, alignment=buffer.base_alignment)
    copy(buffer, tensor)


def _contiguous_at(tensor: Tensor, indices, count: int) -> Tensor:
    """``count`` consecutive elements of ``tensor``'s memory from the element at ``indices``."""
    coord = tuple(indices) if isinstance(indices, (list, tuple)) else indices
    if isinstance(coord, tuple) and len(coord) == 1:
        coord = coord[0]
    coord = tuple(static_leaf(c) for c in coord) if isinstance(coord, tuple) else static_leaf(coord)
    if isinstance(tensor.layout, _fl.ComposedLayout):
        raise TypeError("vector.load_op/store on a swizzled layout: take a view of the chunk and use load/store")
    return tensor.moved(_fl.Layout(count, 1), tensor.offset_of(coord))


def load_op(result_type, tensor: Tensor, indices) -> Vector:
    """The seed's ``vector.load``: ``N`` consecutive elements of memory from the element at ``indices`` (``N`` and
    the element type from ``result_type``, e.g. ``T.bf16x8``)."""
    cls = vector_class(result_type)
    if cls.element is not tensor.dtype:
        raise TypeError(f"load_op: {cls.__name__} from a tensor of {tensor.dtype.__name__}")
    return load(_contiguous_at(tensor, indices, cls.length))


def store(value, tensor: Tensor, indices=None) -> None:
    """Writes a vector: ``store(v, t)`` over the whole view ``t`` (linear-coordinate order), or the seed's
    ``store(v, t, indices)``: ``N`` consecutive elements of memory from the element at ``indices``."""
    value = _as_vector(value)
    if indices is None:
        _store_whole(value, tensor)
    else:
        _store_whole(value, _contiguous_at(tensor, indices, value.length))
