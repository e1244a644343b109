"""Tensors read through DLPack (jax and others): a capsule built here with ctypes stands for a framework's."""

from __future__ import annotations

import ctypes

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import dlpack
from flydsl.compiler.args import describe_tensor

from .test_dsl_kernel import vadd

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeDLPack:
    """An object with ``__dlpack__`` whose DLTensor lives in ctypes memory owned by the object."""

    def __init__(self, shape, strides=None, code=2, bits=32, device_type=2, pointer=1 << 20, byte_offset=0):
        rank = len(shape)
        self._shape = (ctypes.c_int64 * rank)(*shape)
        self._strides = (ctypes.c_int64 * rank)(*strides) if strides else None
        self._tensor = dlpack._DLTensor(
            data=pointer,
            device=dlpack._Device(device_type, 0),
            ndim=rank,
            dtype=dlpack._DataType(code, bits, 1),
            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides else None,
            byte_offset=byte_offset,
        )

    def __dlpack__(self, stream=None):
        return _new_capsule(ctypes.addressof(self._tensor), b"dltensor", None)


def test_metadata_is_read_from_the_capsule():
    arg = describe_tensor(FakeDLPack((4, 8), strides=(16, 1), byte_offset=64), "x")
    assert (arg.pointer, arg.shape, arg.strides, arg.dtype) == ((1 << 20) + 64, (4, 8), (16, 1), "f32")
    compact = describe_tensor(FakeDLPack((4, 8), code=4, bits=16), "x")
    assert compact.strides == (8, 1) and compact.dtype == "bf16"


def test_dlpack_tensors_specialize_like_other_tensors():
    vectors = [FakeDLPack((1000,), pointer=(1 << 20) + k * 4096) for k in range(3)]
    key = vadd.specialize([*vectors, 1000]).key
    assert key == vadd.specialize([flyc.TensorSpec((1000,), "f32")] * 3 + [1000]).key


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"device_type": 1}, ValueError, "argument 'x': expected a CUDA tensor"),
        ({"code": 5, "bits": 64}, TypeError, "argument 'x': unsupported DLPack element type"),
    ],
)
def test_bad_dlpack_tensors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        describe_tensor(FakeDLPack((4,), **kwargs), "x")


@pytest.mark.parametrize(
    "shape, pointer, message",
    [
        ((4, -1), 1 << 20, r"argument 'x': expected non-negative extents, got shape \(4, -1\)"),
        ((4,), 0, r"argument 'x': null data pointer for a tensor of shape \(4,\)"),
    ],
)
def test_implausible_dlpack_memory_names_the_argument(shape, pointer, message):
    with pytest.raises(ValueError, match=message):
        describe_tensor(FakeDLPack(shape, pointer=pointer), "x")


def test_an_empty_dlpack_tensor_may_have_a_null_pointer():
    assert describe_tensor(FakeDLPack((0, 4), pointer=0), "x").pointer == 0
