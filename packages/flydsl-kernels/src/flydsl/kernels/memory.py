"""Memory the zoo allocates: outputs the caller did not pass and the kernels' scratch, in the input's framework
(torch or cupy; other frameworks pass their outputs, and get an error naming what to pass), and scratch kept per
CUDA stream (kernels of one stream run one after another, so they can share it)."""

from __future__ import annotations

from flydsl.kernels.validation import TensorInfo, describe, from_torch, is_torch

__all__ = [
    "can_allocate",
    "empty_like",
    "empty_rows",
    "torch_empty_like",
    "torch_new_empty",
    "torch_statistics",
    "allocated",
    "stream_key",
    "held",
    "held_buffers",
    "release_held",
    "per_stream",
    "claim_counter",
]

_TORCH = []  # [torch module, {our dtype name: torch dtype}] once something was allocated


def _is_cupy(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "cupy"


def _torch_of(like: TensorInfo, what: str):
    if not is_torch(like.obj):
        raise TypeError(f"{what}: expected a torch tensor to allocate like, got {type(like.obj).__name__}")
    if not _TORCH:
        import torch

        _TORCH.extend((torch, {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}))
    return _TORCH


def _allocate(like: TensorInfo, shape: tuple, dtype: str, what: str, scratch: bool = False):
    """A contiguous array of ``shape`` and ``dtype`` from ``like``'s framework, on its device (``scratch``: the
    kernel's own memory, which no caller can pass)."""
    obj = like.obj
    if is_torch(obj):
        dtypes = _torch_of(like, what)[1]
        return torch_new_empty(obj, shape, dtypes[dtype])
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


def can_allocate(like: TensorInfo) -> bool:
    """Whether :func:`empty_rows` / :func:`empty_like` can allocate in ``like``'s framework (torch or cupy)."""
    return is_torch(like.obj) or _is_cupy(like.obj)


def empty_like(like: TensorInfo, what: str, dtype: str | None = None):
    """A contiguous tensor of ``like``'s shape (and dtype unless given) on its device, from its framework."""
    obj = like.obj
    if dtype is None and is_torch(obj):
        return torch_empty_like(obj)
    return _allocate(like, tuple(like.shape), like.dtype if dtype is None else dtype, what)


def torch_empty_like(obj):
    """A contiguous torch tensor of the torch tensor ``obj``'s shape and dtype, on its device: through torch's C API
    where it is on (:mod:`flydsl.compiler.torch_c_api`), else ``torch.empty_like`` (it parses no dtype/device
    arguments: half of torch.empty's host time)."""
    made = (_LAUNCHER or _launcher()).empty_like(obj)
    if made is not None:
        return made
    torch = _TORCH[0] if _TORCH else _torch_of(from_torch(obj), "output")[0]
    if obj.is_contiguous():
        return torch.empty_like(obj)
    return torch.empty_like(obj, memory_format=torch.contiguous_format)


_LAUNCHER = None  # flydsl.compiler's native launcher, bound on first use (``import flydsl.kernels`` loads no compiler)


def _launcher():
    global _LAUNCHER
    from flydsl.compiler._native import launcher

    _LAUNCHER = launcher
    return launcher


def torch_new_empty(obj, shape, dtype=None):
    """``obj.new_empty(shape, dtype=dtype)`` (contiguous, on the torch tensor ``obj``'s device; ``obj``'s dtype unless
    given), through torch's C API where it is on."""
    made = (_LAUNCHER or _launcher()).empty_like(obj, shape, dtype)
    if made is not None:
        return made
    return obj.new_empty(shape) if dtype is None else obj.new_empty(shape, dtype=dtype)


def torch_statistics(obj):
    """A float32 ``(rows,)`` torch tensor on the device of the torch tensor ``obj`` (rows, N): per-row statistics."""
    torch = _TORCH[0] if _TORCH else _torch_of(from_torch(obj), "statistics")[0]
    return torch_new_empty(obj, (obj.shape[0],), torch.float32)


def empty_rows(like: TensorInfo, shape: tuple, what: str, dtype: str = "f32", scratch: bool = False):
    """A contiguous ``shape`` tensor of ``dtype`` (float32 by default) from ``like``'s framework, on its device
    (``scratch``: the kernel's own memory, not an output)."""
    return _allocate(like, shape, dtype, what, scratch)


def allocated(obj) -> TensorInfo:
    """The TensorInfo of an array :func:`empty_like` / :func:`empty_rows` just made (torch: read without checks)."""
    if is_torch(obj):
        return from_torch(obj)
    return describe("flydsl.kernels", "output", obj)


def stream_key(tensor) -> tuple:
    """``(device index, raw handle of its current torch stream)`` for a torch CUDA tensor: the key of scratch memory
    that the kernels of one stream share. Read as the launcher reads the stream: through torch's C API where it is on
    (:mod:`flydsl.compiler.torch_c_api`), else ``torch._C._cuda_getCurrentRawStream`` (``current_stream().cuda_stream``
    builds a Python object per call, a measurable part of a call's host time)."""
    key = (_LAUNCHER or _launcher()).stream_key(tensor)
    if key is not None:
        return key
    import torch

    device = tensor.get_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return device, raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def held(like, name: str, elements: int, dtype, key: tuple | None = None):
    """The buffer ``name`` of ``dtype`` held for the device and current stream of the torch tensor ``like`` (``key``:
    their :func:`stream_key`, where the caller read it already): a 1-D tensor of at least ``elements``, zero when
    made, made again larger where a call needs more. Kernels of one stream run one after another, so they share it,
    each leaving it as it must be found (counters at zero). One registry serves these calls and the replays of launch
    plans (their ``made`` values of that name), so a buffer is held once per (name, dtype, device, stream);
    :func:`release_held` drops them all."""
    device, stream = key or stream_key(like)
    return (_LAUNCHER or _launcher()).held(like, name, elements, dtype, device, stream)


def held_buffers() -> list:
    """The buffers :func:`held` and the replays hold, as ``(name, device, stream, dtype, tensor)``."""
    return (_LAUNCHER or _launcher()).held_buffers()


def release_held() -> int:
    """Drops every held buffer (the next call that needs one makes it again, zero), e.g. to give split K's
    workspace back to torch's allocator; returns how many were held. A CUDA graph captured around calls that used
    them keeps reading their addresses: release only where no such graph is replayed again."""
    return (_LAUNCHER or _launcher()).release_held()


def per_stream(cache: dict, tensor, make, fits=None):
    """The scratch ``cache`` holds for the device and current stream of the torch tensor ``tensor``: made by
    ``make(held)`` (``held``: what was there, or None) when there is none yet or ``fits(held)`` says it is too
    small. Kernels of one stream run one after another, so they share it; each kernel leaves it as it must be found
    (counters at zero)."""
    key = stream_key(tensor)
    held = cache.get(key)
    if held is None or (fits is not None and not fits(held)):
        held = cache[key] = make(held)
    return held


CLAIM_COUNTERS = "rows.claim_counters"  # the held name of the claimed rows' counters (a replay's ``made`` too)


def claim_counter(like: TensorInfo):
    """Two int32 words of global memory, zero, for a kernel that hands out its rows through them and zeroes them
    before it ends (``StagedForwardConfig.claim_rows``); None where ``like``'s framework allocates nothing. torch: one
    pair per device and stream, held (:func:`held`); cupy: a new pair per launch."""
    obj = like.obj
    if is_torch(obj):
        torch, _ = _torch_of(like, "row counter")
        return held(obj, CLAIM_COUNTERS, 2, torch.int32)
    if _is_cupy(obj):
        import cupy

        with obj.device:
            return cupy.zeros(2, dtype=cupy.int32)
    return None
