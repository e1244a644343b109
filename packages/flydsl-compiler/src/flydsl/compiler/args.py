"""Host-side kernel arguments: what a tensor from any framework looks like to the launcher, and how it specializes
the kernel.

A tensor argument is read through the cheapest route its object offers: torch's attributes, else
``__cuda_array_interface__`` (cupy, numba, jax's GPU arrays...). By default its shape is dynamic and its strides
are specialized on contiguity (a stride of 1 is static) and on 16-byte divisibility (known to the compiler, so that
copies can be vectorized), as is the alignment of its data pointer: one binary serves every size.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass

__all__ = [
    "TensorArg",
    "TensorSpec",
    "StaticDims",
    "mark_static",
    "describe_tensor",
    "torch_dtype_name",
    "stride_plan",
    "reaches_2_31",
    "DTYPES",
    "holds_negative_zero",
]

# numpy typestr / torch dtype name -> FlyDSL element type name (MLIR)
DTYPES = {
    "f2": "f16",
    "f4": "f32",
    "f8": "f64",
    "i1": "i8",
    "i2": "i16",
    "i4": "i32",
    "i8": "i64",
    "u1": "i8",
    "u2": "i16",
    "u4": "i32",
    "u8": "i64",
    "b1": "i8",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "i8",
    "uint16": "i16",
    "uint32": "i32",
    "uint64": "i64",
    "bool": "i8",
    "float8_e4m3fn": "f8E4M3FN",
    "float8_e5m2": "f8E5M2",
}

_ELEMENT_BYTES = {
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "f8E4M3FN": 1,
    "f8E5M2": 1,
}


@dataclass(slots=True)  # built on every launch: no frozen-dataclass setattr cost
class TensorArg:
    """A GPU tensor as the launcher sees it (strides in elements)."""

    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int
    source: object

    @property
    def element_bytes(self) -> int:
        return _ELEMENT_BYTES[self.dtype]

    def specialization(self) -> tuple:
        """What the kernel is compiled for: element type, rank, which strides are 1, which are multiples of 16
        bytes, and whether the data pointer is 16-byte aligned."""
        per_16_bytes = max(1, 16 // self.element_bytes)
        strides = tuple(1 if stride == 1 else (16 if stride % per_16_bytes == 0 else 0) for stride in self.strides)
        return (self.dtype, len(self.shape), strides, self.pointer % 16 == 0)


# torch dtype objects -> element type names, filled on first sight (str(dtype) is slow on the launch path).
_TORCH_DTYPES: dict = {}
_STRIDE_PLANS: dict = {}
_WIDE: dict = {}  # (shape, strides) -> reaches_2_31


def register_array_interface_dtypes() -> None:
    """Tells the native dispatcher the ``__cuda_array_interface__`` typestrs :func:`describe_tensor` accepts
    (without their byte-order mark) and their element types."""
    from flydsl.compiler._native import launcher

    for code, dtype in DTYPES.items():
        launcher._register_typestr(code, dtype, _ELEMENT_BYTES[dtype])


def torch_dtype_name(torch_dtype, name: str) -> str:
    dtype = _TORCH_DTYPES.get(torch_dtype)
    if dtype is None:
        dtype = DTYPES.get(str(torch_dtype).removeprefix("torch."))
        if dtype is None:
            raise TypeError(f"argument '{name}': unsupported element type {torch_dtype}")
        _TORCH_DTYPES[torch_dtype] = dtype
        from flydsl.compiler._native import launcher

        launcher._register_dtype(torch_dtype, dtype, _ELEMENT_BYTES[dtype])  # for the native dispatcher
    return dtype


def stride_plan(strides: tuple, dtype: str) -> tuple[tuple, tuple]:
    """(what each stride is specialized to: 1 (static), 16 (a multiple of 16 bytes) or 0; the positions of the
    strides passed at launch). Cached: the launch path sees few distinct stride patterns."""
    plan = _STRIDE_PLANS.get((strides, dtype))
    if plan is None:
        per_16_bytes = max(1, 16 // _ELEMENT_BYTES[dtype])
        kinds = tuple(1 if s == 1 else (16 if s % per_16_bytes == 0 else 0) for s in strides)
        plan = (kinds, tuple(i for i, kind in enumerate(kinds) if kind != 1))
        if len(_STRIDE_PLANS) > 4096:
            _STRIDE_PLANS.clear()
        _STRIDE_PLANS[(strides, dtype)] = plan
    return plan


class TensorSpec:
    """A tensor's shape, element type and strides without memory: what ``kernel.lower(...)`` needs to compile a
    specialization where there is no GPU. ``dtype``: an MLIR name (``"f16"``), a torch or numpy name
    (``"bfloat16"``), a torch dtype (``torch.bfloat16``) or a FlyDSL type (``fx.BFloat16``); ``strides`` in elements
    (default: row-major); ``aligned``: whether the data pointer is taken as 16-byte aligned (as allocators give it).

        module = my_kernel.lower(flyc.TensorSpec((1024, 1024), torch.float16), flyc.TensorSpec((1024,), "f32"), 1024)
    """

    def __init__(self, shape, dtype="f32", strides=None, aligned: bool = True):
        self.shape = tuple(int(extent) for extent in shape)
        self.dtype = _element_type_name(dtype)
        if self.dtype not in _ELEMENT_BYTES:
            raise ValueError(
                f"dtype: expected one of {sorted(_ELEMENT_BYTES)}, a torch or numpy dtype or its name, or a FlyDSL"
                f" numeric type, got {dtype!r}"
            )
        if strides is None:
            strides, step = [], 1
            for extent in reversed(self.shape):
                strides.append(step)
                step *= extent
            strides = reversed(strides)
        self.strides = tuple(strides)
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides: expected {len(self.shape)} strides for shape {self.shape}, got {self.strides}")
        # Never dereferenced: only its alignment matters to the specialization.
        self.pointer = 1 << 20 if aligned else (1 << 20) + _ELEMENT_BYTES[self.dtype]

    def __repr__(self):
        return f"TensorSpec({self.shape}, {self.dtype!r}, strides={self.strides})"


def _element_type_name(dtype) -> str | None:
    """The MLIR element type name of ``dtype`` as :class:`TensorSpec` takes it (None where there is none)."""
    if isinstance(dtype, str):
        # MLIR names ("f16", "i64") first: numpy typestr codes in DTYPES count bytes ("i8" is int64 there).
        return dtype if dtype in _ELEMENT_BYTES else DTYPES.get(dtype.removeprefix("torch."))
    mlir_name = getattr(dtype, "mlir_name", None)  # fx.Float32 and the other numeric classes
    if isinstance(mlir_name, str):
        return mlir_name
    return DTYPES.get(str(dtype).removeprefix("torch."))  # torch.bfloat16, numpy.dtype("float32")


class StaticDims:
    """A tensor argument whose extents in ``dims`` are compiled in (``flyc.mark_static``): CuTe's
    ``mark_layout_dynamic`` the other way round. Each distinct value of those extents is its own binary."""

    __slots__ = ("tensor", "dims")

    def __init__(self, tensor, dims):
        self.tensor = tensor
        self.dims = dims


def mark_static(tensor, dims=None) -> StaticDims:
    """Marks ``tensor``'s extents as static for the launch it is passed to: all of them, or those in ``dims``
    (ints, negative from the end). ``my_kernel(flyc.mark_static(x, dims=(1,)), ...)``: the row length is compiled
    in, so loops over it unroll and divisions by it fold."""
    return StaticDims(tensor, "all" if dims is None else tuple(dims))


def reaches_2_31(shape, strides) -> bool:
    """Whether an element offset of a tensor (``sum((extent - 1) * |stride|)`` at its last element) can reach 2^31:
    such a tensor is specialized apart, its offsets computed in 64 bits; the others keep 32-bit offset math. Cached
    per (shape, strides): this runs on the Python launch path."""
    wide = _WIDE.get((shape, strides))
    if wide is None:
        wide = all(shape) and sum((e - 1) * abs(s) for e, s in zip(shape, strides, strict=True)) >= 1 << 31
        if len(_WIDE) > 4096:
            _WIDE.clear()
        _WIDE[(shape, strides)] = wide
    return wide


def describe_tensor(obj, name: str) -> TensorArg:
    """Reads a tensor argument; a ValueError or TypeError names ``name`` and what was expected."""
    if type(obj).__module__.startswith("torch"):
        if not obj.is_cuda:
            raise ValueError(f"argument '{name}': expected a CUDA tensor, got one on {obj.device}")
        dtype = torch_dtype_name(obj.dtype, name)
        return TensorArg(obj.data_ptr(), tuple(obj.shape), obj.stride(), dtype, obj.get_device(), obj)
    if isinstance(obj, TensorSpec):
        return TensorArg(obj.pointer, obj.shape, obj.strides, obj.dtype, 0, obj)
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        if hasattr(obj, "__dlpack__"):
            from flydsl.compiler.dlpack import read_dlpack

            pointer, shape, strides, dtype, device = read_dlpack(obj, name)
            _check_memory(pointer, shape, name)
            return TensorArg(pointer, shape, strides, dtype, device, obj)
        raise TypeError(
            f"argument '{name}': expected a GPU tensor (torch, cupy, jax, or an object with __cuda_array_interface__"
            f" or __dlpack__), got {type(obj).__name__}"
        )
    return _array_interface_tensor(obj, interface, name)


def _ints(values) -> tuple | None:
    """A tuple or list of integers (ints or ``__index__`` objects such as numpy's, not bools) as a tuple of ints,
    else None."""
    if type(values) is tuple and all(type(v) is int for v in values):  # the common case, first
        return values
    if not isinstance(values, (tuple, list)) or any(isinstance(v, bool) for v in values):
        return None
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        return None


def _array_interface_tensor(obj, interface, name: str) -> TensorArg:
    """``obj``'s ``__cuda_array_interface__`` (typestr, shape, data, byte strides or None) as a TensorArg. The common
    case (tuples of ints, a plausible pointer) is read here; anything else by :func:`_checked_array_interface`."""
    try:
        dtype = DTYPES.get(interface["typestr"][1:])
        shape, (pointer, _) = interface["shape"], interface["data"]
        byte_strides = interface.get("strides")
    except Exception:  # noqa: BLE001 - whatever is malformed, the checked reader says what
        dtype = None
    if dtype is None or type(shape) is not tuple or type(pointer) is not int or not 0 < pointer < 1 << 64:
        return _checked_array_interface(obj, interface, name)
    for extent in shape:  # (a loop: cheaper than all() on the launch path)
        if type(extent) is not int or extent < 0:
            return _checked_array_interface(obj, interface, name)
    if byte_strides is None:
        return TensorArg(pointer, shape, _row_major(shape), dtype, 0, obj)
    element_bytes = _ELEMENT_BYTES[dtype]
    if type(byte_strides) is not tuple or len(byte_strides) != len(shape):
        return _checked_array_interface(obj, interface, name)
    for stride in byte_strides:
        if type(stride) is not int or stride % element_bytes:
            return _checked_array_interface(obj, interface, name)
    return TensorArg(pointer, shape, tuple(s // element_bytes for s in byte_strides), dtype, 0, obj)


def _checked_array_interface(obj, interface, name: str) -> TensorArg:
    """:func:`_array_interface_tensor` checking every entry: a malformed one is a TypeError or ValueError that names
    the argument and what was expected; lists and ``__index__`` objects (numpy integers) are read as ints."""
    if not isinstance(interface, dict):
        raise TypeError(f"argument '{name}': __cuda_array_interface__ must be a dict, got {type(interface).__name__}")
    typestr = interface.get("typestr")
    if not isinstance(typestr, str):
        raise TypeError(
            f"argument '{name}': __cuda_array_interface__ needs a 'typestr' (a str such as '<f4'), got {typestr!r}"
        )
    dtype = DTYPES.get(typestr[1:])
    if dtype is None:
        raise TypeError(f"argument '{name}': unsupported element type {typestr!r}")
    shape = _ints(interface.get("shape"))
    if shape is None:
        raise TypeError(
            f"argument '{name}': __cuda_array_interface__ needs a 'shape' (a tuple of ints),"
            f" got {interface.get('shape')!r}"
        )
    data = interface.get("data")
    pointer = _ints(data[:1]) if isinstance(data, (tuple, list)) and len(data) == 2 else None
    if pointer is None:
        raise TypeError(
            f"argument '{name}': __cuda_array_interface__ needs 'data' as (pointer: int, read_only: bool), got {data!r}"
        )
    element_bytes = _ELEMENT_BYTES[dtype]
    if interface.get("strides") is None:
        strides = _row_major(shape)
    else:
        byte_strides = _ints(interface["strides"])
        if byte_strides is None:
            raise TypeError(
                f"argument '{name}': __cuda_array_interface__ 'strides' must be None or a tuple of ints (bytes),"
                f" got {interface['strides']!r}"
            )
        if len(byte_strides) != len(shape):
            raise ValueError(
                f"argument '{name}': __cuda_array_interface__ has {len(byte_strides)} strides {byte_strides} for the"
                f" {len(shape)} extents of shape {shape}"
            )
        if any(s % element_bytes for s in byte_strides):
            raise ValueError(f"argument '{name}': strides {byte_strides} are not multiples of the element size")
        strides = tuple(s // element_bytes for s in byte_strides)
    _check_memory(pointer[0], shape, name)
    return TensorArg(pointer[0], shape, strides, dtype, 0, obj)


def _row_major(shape: tuple) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _check_memory(pointer: int, shape: tuple, name: str) -> None:
    """A ValueError naming ``name`` unless ``shape``'s extents are non-negative and ``pointer`` is a 64-bit device
    address, null only for a tensor without elements (what a kernel given it could not survive)."""
    if shape and min(shape) < 0:
        raise ValueError(f"argument '{name}': expected non-negative extents, got shape {shape}")
    if not 0 <= pointer < 1 << 64:
        raise ValueError(f"argument '{name}': data pointer {pointer:#x} is not a 64-bit address")
    if pointer == 0 and all(shape):
        raise ValueError(f"argument '{name}': null data pointer for a tensor of shape {shape} (it has elements)")


def holds_negative_zero(value) -> bool:
    """Whether a Constexpr value is or holds a float -0.0: itself, in a tuple or frozenset, or in a dataclass's
    fields (recursively). Such a value equals its 0.0 twin (and hashes the same) but compiles to other constants:
    kernel.py keys it apart, and the native dispatcher asks this of values other than numbers, strings and tuples."""
    kind = type(value)
    if kind is float:
        return value == 0.0 and math.copysign(1.0, value) < 0
    if kind in (int, bool, str) or value is None:
        return False
    if isinstance(value, (tuple, frozenset)):  # named tuples too
        return any(holds_negative_zero(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(holds_negative_zero(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False
