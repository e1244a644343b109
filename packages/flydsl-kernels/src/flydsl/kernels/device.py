"""What the zoo asks of the GPU it launches on: its SM count and how many clusters of a shape fit at once (the
persistent grids are sized by them). Read through the driver, once per device and shape."""

from __future__ import annotations

import functools

__all__ = ["sm_count", "l2_bytes", "max_active_clusters"]

_SM_COUNT: dict[int, int] = {}


def sm_count(device: int) -> int:
    """The SM count of CUDA device ``device`` (read once)."""
    count = _SM_COUNT.get(device)
    if count is None:
        from flydsl.compiler import runtime

        count = _SM_COUNT[device] = runtime.device_attribute(16, device)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return count


@functools.cache
def l2_bytes(device: int) -> int:
    """The L2 cache size in bytes of CUDA device ``device`` (read once)."""
    from flydsl.compiler import runtime

    return runtime.device_attribute(38, device)  # CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE


_PROBE_PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry fly_cluster_probe() .reqntid {threads}, 1, 1
{{
ret;
}}
"""


@functools.lru_cache(maxsize=64)
def max_active_clusters(cluster: int, threads: int, blocks_per_sm: int, device: int) -> int | None:
    """``cuOccupancyMaxActiveClusters`` for clusters of ``cluster`` CTAs of ``threads`` threads of which at most
    ``blocks_per_sm`` fit on an SM, on the current context's device (``device``: the cache key), or None when the
    driver cannot say. Asked of an empty probe kernel given the shared memory that lets exactly ``blocks_per_sm``
    CTAs share an SM (228 KB per SM, 1 KB of it reserved per CTA): the count for a kernel whose registers or shared
    memory allow that many."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None

    class Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]

    class Config(ctypes.Structure):  # CUlaunchConfig
        _fields_ = [("dims", ctypes.c_uint * 6), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p)]
        _fields_ += [("attrs", ctypes.POINTER(Attribute)), ("count", ctypes.c_uint)]

    shared = (228 // blocks_per_sm - 1) * 1024
    module, function, found = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int(0)
    ptx = _PROBE_PTX.format(threads=threads).encode() + b"\0"
    if cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(ptx)) != 0:
        return None
    try:
        if cuda.cuModuleGetFunction(ctypes.byref(function), module, b"fly_cluster_probe") != 0:
            return None
        if cuda.cuFuncSetAttribute(function, 8, ctypes.c_int(shared)) != 0:  # MAX_DYNAMIC_SHARED_SIZE_BYTES
            return None
        attribute = Attribute(id=4)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value[0], attribute.value[1], attribute.value[2] = cluster, 1, 1
        config = Config(shared=shared, attrs=ctypes.pointer(attribute), count=1)
        config.dims[:] = [cluster, 1, 1, threads, 1, 1]
        if cuda.cuOccupancyMaxActiveClusters(ctypes.byref(found), function, ctypes.byref(config)) != 0:
            return None
    finally:
        cuda.cuModuleUnload(module)
    return found.value or None
