"""Reading a tensor through the DLPack protocol (``__dlpack__``): jax and other frameworks without
``__cuda_array_interface__``.

Only the metadata is read (data pointer, device, shape, strides, element type); the capsule is left unconsumed, so
its deleter runs when it is collected while the original object keeps the memory alive.
"""

from __future__ import annotations

import ctypes

__all__ = ["read_dlpack"]

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
# DLDataType codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 7-...: float8 variants (DLPack 1.x)
_DTYPES = {
    (0, 8): "i8",
    (0, 16): "i16",
    (0, 32): "i32",
    (0, 64): "i64",
    (1, 8): "i8",
    (1, 16): "i16",
    (1, 32): "i32",
    (1, 64): "i64",
    (2, 16): "f16",
    (2, 32): "f32",
    (2, 64): "f64",
    (4, 16): "bf16",
    (6, 8): "i8",
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def read_dlpack(obj, name: str):
    """(pointer, shape, strides in elements, element type name, device index) of ``obj``'s DLPack tensor; a
    TypeError or ValueError names the argument."""
    capsule = obj.__dlpack__()
    # DLManagedTensor starts with its DLTensor, so the capsule's pointer is the DLTensor's.
    tensor = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
    if tensor.device.device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        raise ValueError(
            f"argument '{name}': expected a CUDA tensor, DLPack says device type {tensor.device.device_type}"
        )
    dtype = _DTYPES.get((tensor.dtype.code, tensor.dtype.bits)) if tensor.dtype.lanes == 1 else None
    if dtype is None:
        raise TypeError(
            f"argument '{name}': unsupported DLPack element type (code {tensor.dtype.code}, {tensor.dtype.bits} bits,"
            f" {tensor.dtype.lanes} lanes)"
        )
    rank = tensor.ndim
    shape = tuple(tensor.shape[k] for k in range(rank))
    if tensor.strides:
        strides = tuple(tensor.strides[k] for k in range(rank))
    else:  # compact row-major
        strides, step = [], 1
        for extent in reversed(shape):
            strides.append(step)
            step *= extent
        strides = tuple(reversed(strides))
    pointer = (tensor.data or 0) + tensor.byte_offset
    return pointer, shape, strides, dtype, tensor.device.device_id
