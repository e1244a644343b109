"""Host-side checks and allocation shared by the row kernels: every argument is validated (dtype, rank, device,
unit stride on the last dim, matching N) before anything is launched, and errors name the argument.

Tensors are read through their own attributes when they are torch tensors (the cheap path: a few C getters, no
string formatting unless an error is raised), else through ``flydsl.compiler.args.describe_tensor``
(``__cuda_array_interface__`` / DLPack). Outputs that the caller does not give are allocated with the input's
framework when it is torch or cupy; other frameworks must pass their outputs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = [
    "RowTensor",
    "row_tensor",
    "vector_tensor",
    "stats_tensor",
    "from_torch",
    "empty_like",
    "empty_rows",
    "allocated",
    "ROW_DTYPES",
    "sm_count",
    "max_active_clusters",
    "claim_counter",
    "stream_key",
]

ROW_DTYPES = ("f32", "f16", "bf16")  # element types of inputs and outputs
_TORCH_NAMES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
_TORCH_TYPES: set = set()  # torch.Tensor (and subclasses) seen: later checks are one set lookup
_DTYPE_NAMES: dict = {}  # torch dtype -> our name, filled on first sight (no torch import at module import)


class RowTensor(NamedTuple):
    """What the kernels need to know about a tensor argument (a tuple: built on every call, so built cheaply).
    ``device`` is the CUDA device ordinal."""

    obj: object
    shape: tuple
    strides: tuple
    dtype: str
    device: int
    pointer: int

    @property
    def is_torch(self) -> bool:
        return _is_torch(self.obj)


_new_row_tensor = tuple.__new__  # RowTensor(*values) without NamedTuple's Python-level __new__


def _is_torch(obj) -> bool:
    kind = type(obj)
    if kind in _TORCH_TYPES:
        return True
    if kind.__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        _TORCH_TYPES.add(kind)
        return True
    return False


def _is_cupy(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "cupy"


def _torch_dtype(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        text = str(dtype)
        name = _DTYPE_NAMES[dtype] = _TORCH_NAMES.get(text, text.removeprefix("torch."))
    return name


def _describe(obj, name: str) -> RowTensor:
    if type(obj) in _TORCH_TYPES or _is_torch(obj):
        if not obj.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got one on {obj.device}")
        values = (obj, obj.shape, obj.stride(), _torch_dtype(obj.dtype), obj.get_device(), obj.data_ptr())
        return _new_row_tensor(RowTensor, values)
    from flydsl.compiler.args import describe_tensor

    try:
        described = describe_tensor(obj, name)
    except (TypeError, ValueError) as error:
        raise type(error)(str(error).replace(f"argument '{name}'", name)) from None
    return RowTensor(obj, described.shape, described.strides, described.dtype, described.device, described.pointer)


def from_torch(t) -> RowTensor | None:
    """The RowTensor of a torch CUDA tensor that the caller has validated already (``None`` stays ``None``): no
    checks. For layers that check every argument themselves (``flydsl.torch``'s ops: dtype, shape, strides, device)
    and call the launchers of :mod:`flydsl.kernels.normalization` / :mod:`flydsl.kernels.softmax` directly."""
    if t is None:
        return None
    dtype = t.dtype
    name = _DTYPE_NAMES.get(dtype) or _torch_dtype(dtype)
    return _new_row_tensor(RowTensor, (t, t.shape, t.stride(), name, t.get_device(), t.data_ptr()))


def row_tensor(obj, name: str, *, rows: int | None = None, n: int | None = None, dtypes=ROW_DTYPES) -> RowTensor:
    """A 2-D (rows, N) tensor with unit stride on its last dim (any row stride); checks shape against ``rows``/``n``
    when given."""
    if obj is None:
        raise TypeError(f"{name}: expected a tensor, got None")
    t = _describe(obj, name)
    shape, strides = t.shape, t.strides
    if len(shape) != 2:
        raise ValueError(f"{name}: expected a 2-D tensor (rows, N), got shape {tuple(shape)} (reshape to 2-D first)")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_names(dtypes)}, got {t.dtype}")
    if shape[1] > 1 and strides[1] != 1:
        raise ValueError(
            f"{name}: expected unit stride on the last dim, got strides {tuple(strides)} (call .contiguous())"
        )
    if shape[0] > 1 and strides[0] < shape[1]:
        raise ValueError(f"{name}: rows overlap (row stride {strides[0]} < N = {shape[1]})")
    if rows is not None and shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} rows, got shape {tuple(shape)}")
    if n is not None and shape[1] != n:
        raise ValueError(f"{name}: expected N = {n} (the input's last dim), got shape {tuple(shape)}")
    return t


def vector_tensor(obj, name: str, n: int, *, dtypes: tuple, allow_none: bool = True) -> RowTensor | None:
    """A 1-D tensor of ``n`` contiguous elements (weights, bias, their gradients)."""
    if obj is None:
        if allow_none:
            return None
        raise TypeError(f"{name}: expected a tensor, got None")
    t = _describe(obj, name)
    if len(t.shape) != 1 or t.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) (N, the input's last dim), got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_names(dtypes)}, got {t.dtype}")
    if n > 1 and t.strides[0] != 1:
        raise ValueError(f"{name}: expected a contiguous vector, got stride {t.strides[0]}")
    return t


def stats_tensor(obj, name: str, rows: int) -> RowTensor:
    """A float32 (rows,) tensor for per-row statistics (mean, rstd); any stride."""
    t = _describe(obj, name)
    if len(t.shape) != 1 or t.shape[0] != rows:
        raise ValueError(f"{name}: expected shape ({rows},) (one value per row), got {tuple(t.shape)}")
    if t.dtype != "f32":
        raise TypeError(f"{name}: expected dtype float32, got {t.dtype}")
    return t


def same_device(reference: RowTensor, *others: tuple[str, RowTensor | None]) -> None:
    device = reference.device
    for name, other in others:
        if other is not None and other.device != device:
            raise ValueError(f"{name}: expected a tensor on cuda:{device} (the input's), got cuda:{other.device}")


def _names(dtypes) -> str:
    names = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
    return " or ".join(names.get(d, d) for d in dtypes)


_TORCH = []  # [torch module, {our dtype name: torch dtype}] once an output was allocated


def _torch_of(like: RowTensor, what: str):
    if not _is_torch(like.obj):
        raise TypeError(f"{what}: expected a torch tensor to allocate like, got {type(like.obj).__name__}")
    if not _TORCH:
        import torch

        _TORCH.extend((torch, {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}))
    return _TORCH


def _allocate(like: RowTensor, shape: tuple, dtype: str, what: str, scratch: bool = False):
    """A contiguous array of ``shape`` and ``dtype`` from ``like``'s framework, on its device: torch or cupy (any
    other framework must pass its outputs; ``scratch``: the kernel's own memory, which no caller can pass)."""
    obj = like.obj
    if _is_torch(obj):
        torch, dtypes = _torch_of(like, what)
        return torch.empty(shape, dtype=dtypes[dtype], device=obj.device)
    if _is_cupy(obj):
        import cupy

        if dtype == "bf16":
            raise TypeError(f"{what}: cupy has no bfloat16 arrays to allocate: pass the output explicitly")
        with obj.device:
            return cupy.empty(shape, dtype={"f32": cupy.float32, "f16": cupy.float16}[dtype])
    kind = f"{type(obj).__module__}.{type(obj).__name__}"
    if scratch:
        raise TypeError(
            f"{what}: this kernel's scratch memory is allocated with the input's framework (torch or cupy); the"
            f" input is a {kind}: pass torch or cupy arrays"
        )
    raise TypeError(
        f"{what}: outputs are allocated with the input's framework (torch or cupy); the input is a {kind}: pass the"
        " output explicitly"
    )


def can_allocate(like: RowTensor) -> bool:
    """Whether :func:`empty_rows` / :func:`empty_like` can allocate in ``like``'s framework (torch or cupy)."""
    return _is_torch(like.obj) or _is_cupy(like.obj)


def empty_like(like: RowTensor, what: str, dtype: str | None = None):
    """A contiguous tensor of ``like``'s shape (and dtype unless given) on its device, from its framework."""
    obj = like.obj
    if dtype is None and _is_torch(obj):  # empty_like parses no dtype/device arguments: half of torch.empty's time
        torch, _ = _torch_of(like, what)
        if obj.is_contiguous():
            return torch.empty_like(obj)
        return torch.empty_like(obj, memory_format=torch.contiguous_format)
    return _allocate(like, tuple(like.shape), like.dtype if dtype is None else dtype, what)


def empty_rows(like: RowTensor, shape: tuple, what: str, dtype: str = "f32", scratch: bool = False):
    """A contiguous ``shape`` tensor of ``dtype`` (float32 by default) from ``like``'s framework, on its device
    (``scratch``: the kernel's own memory, not an output; see :func:`_allocate`)."""
    return _allocate(like, shape, dtype, what, scratch)


_CLAIM_COUNTERS: dict[tuple, object] = {}  # stream_key -> torch int32 pair, kept zero between launches


def stream_key(tensor) -> tuple:
    """``(device index, raw handle of its current torch stream)`` for a torch CUDA tensor: the key of scratch memory
    that the kernels of one stream share (they run one after another). Read as the launcher reads the stream
    (``torch._C._cuda_getCurrentRawStream``; ``current_stream().cuda_stream`` builds a Python object per call:
    10-19 us of a staged norm call's host time on the H200 machine, session 29)."""
    import torch

    device = tensor.get_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return device, raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def claim_counter(like: RowTensor):
    """Two int32 words of global memory, zero, for a kernel that hands out its rows through them and zeroes them
    before it ends (``StagedForwardConfig.claim_rows``); None where ``like``'s framework allocates nothing (see
    :func:`can_allocate`). torch: one pair per device and stream, kept (the kernels of a stream run one after
    another, so they share it, as the GEMM's split-K counters); cupy: a new pair per launch."""
    obj = like.obj
    if _is_torch(obj):
        key = stream_key(obj)
        counter = _CLAIM_COUNTERS.get(key)
        if counter is None:
            torch, _ = _torch_of(like, "row counter")
            counter = _CLAIM_COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=obj.device)
        return counter
    if _is_cupy(obj):
        import cupy

        with obj.device:
            return cupy.zeros(2, dtype=cupy.int32)
    return None


def allocated(obj) -> RowTensor:
    """The RowTensor of an array :func:`empty_like` / :func:`empty_rows` just made (torch: read without checks)."""
    if _is_torch(obj):
        return from_torch(obj)
    return _describe(obj, "output")


def element_bytes(dtype: str) -> int:
    return _ELEMENT_BYTES[dtype]


_SM_COUNT: dict[int, int] = {}


def sm_count(device: int) -> int:
    """The SM count of CUDA device ``device`` (read once)."""
    count = _SM_COUNT.get(device)
    if count is None:
        from flydsl.compiler import runtime

        count = _SM_COUNT[device] = runtime.device_attribute(16, device)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return count


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
