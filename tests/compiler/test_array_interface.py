"""Malformed ``__cuda_array_interface__`` arguments and implausible memory (null, negative or 2^64 data pointers,
negative extents) are refused before launch with an error that names the kernel parameter; the native launch path
declines them, so that the Python path reports them. No GPU needed: the fakes are never dereferenced."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

from .fakes import FakeGpuTensor


@flyc.kernel
def fill(src: fx.Tensor, n: fx.Int32):
    if gpu.thread_idx.x < n:
        src[gpu.thread_idx.x] = fx.Float32(1.0)


def _interface(**changes) -> FakeGpuTensor:
    tensor = FakeGpuTensor((64,), "<f4")
    for key, value in changes.items():
        if value is KeyError:
            del tensor.__cuda_array_interface__[key]
        else:
            tensor.__cuda_array_interface__[key] = value
    return tensor


MALFORMED = {
    "strides of the wrong rank": (_interface(strides=(4, 4)), ValueError, "2 strides .* for the 1 extents"),
    "strides not a tuple": (_interface(strides=4), TypeError, "'strides' must be None or a tuple of ints"),
    "no typestr": (_interface(typestr=KeyError), TypeError, "needs a 'typestr'"),
    "typestr not a str": (_interface(typestr=4), TypeError, "needs a 'typestr'"),
    "no shape": (_interface(shape=KeyError), TypeError, "needs a 'shape'"),
    "shape not a tuple": (_interface(shape=64), TypeError, "needs a 'shape'"),
    "shape of floats": (_interface(shape=(64.0,)), TypeError, "needs a 'shape'"),
    "no data": (_interface(data=KeyError), TypeError, "needs 'data' as"),
    "data=None": (_interface(data=None), TypeError, "needs 'data' as"),
    "data of one item": (_interface(data=(1 << 20,)), TypeError, "needs 'data' as"),
    "a None data pointer": (_interface(data=(None, False)), TypeError, "needs 'data' as"),
    "negative extent": (_interface(shape=(-1,)), ValueError, "expected non-negative extents"),
    "null data pointer": (_interface(data=(0, False)), ValueError, "null data pointer for a tensor of shape"),
    "negative data pointer": (_interface(data=(-16, False)), ValueError, "is not a 64-bit address"),
    "2^64 data pointer": (_interface(data=(1 << 64, False)), ValueError, "is not a 64-bit address"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_array_interface_is_refused_naming_the_parameter(case):
    tensor, error, message = MALFORMED[case]
    with pytest.raises(error, match=f"^argument 'src': .*{message}"):
        fill.specialize([tensor, 64])


def test_an_interface_that_is_not_a_dict_is_refused_naming_the_parameter():
    tensor = FakeGpuTensor((64,))
    tensor.__cuda_array_interface__ = [("shape", (64,))]
    with pytest.raises(TypeError, match="^argument 'src': __cuda_array_interface__ must be a dict, got list"):
        fill.specialize([tensor, 64])


@pytest.mark.parametrize("case", MALFORMED)
def test_the_native_path_leaves_them_to_the_python_path(case):
    fill.specialize([FakeGpuTensor((64,)), 64])  # registers the fake's type with the dispatcher, as a launch does
    dispatcher = fill.new_dispatcher()
    assert dispatcher.describe((FakeGpuTensor((64,)), 64)) is not None
    assert dispatcher.describe((MALFORMED[case][0], 64)) is None


@pytest.mark.parametrize("shape", [(0,), (4, 0), (0, 0, 3)])
def test_a_null_pointer_is_an_empty_tensors_own(shape):
    empty = FakeGpuTensor(shape, pointer=0)
    spec = fill.specialize([empty, 64])
    assert spec.launch_args[0] == 0
    assert fill.new_dispatcher().describe((empty, 64)) == (spec.key, spec.launch_args)


def test_lists_and_index_objects_are_still_read():
    class Extent:
        def __init__(self, value):
            self.value = value

        def __index__(self):
            return self.value

    tensor = FakeGpuTensor((4, 8))
    tensor.__cuda_array_interface__.update(shape=[Extent(4), 8], strides=[32, 4], data=[1 << 20, False])
    spec = fill.specialize([tensor, 64])
    assert spec.launch_args[:3] == [1 << 20, 4, 8]
