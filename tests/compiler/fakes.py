"""Test doubles shared by the compiler tests."""


class FakeGpuTensor:
    """Stands for a GPU tensor on a machine without one: only ``__cuda_array_interface__`` (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", pointer=1 << 20, strides=None):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (pointer, False),
            "strides": strides,
            "version": 3,
        }
