"""Torch tensors read through torch's stable C API instead of their Python attributes.

Reading a tensor's dtype, shape, strides, address and device through its attributes costs about a microsecond per
tensor, most of a replayed zoo call's host time. torch exports a stable C API over its tensors (AOTInductor's shim)
that reads the same facts in nanoseconds; the native launcher (``native/python/TorchCApi.h``) binds it from the
libraries ``import torch`` loaded and turns it on only after checking, on probe tensors, that it reads what the
attributes say (and where the Python object holds its tensor: that layout is torch's own, checked without reading
through it). Call keys, launch replays, the current stream and ``torch_empty_like``'s outputs then go through it;
anything it cannot read (another device type or layout, a torch whose layout differs) is read as before.
``FLYDSL_TORCH_C_API=0`` keeps it off. Measurements and what was not taken: docs/tuning/host.md#c-api.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flydsl.compiler import settings
from flydsl.compiler._native import launcher

__all__ = ["enable", "register_tensor_type", "status"]

_DTYPES = ("int8", "uint8", "int32", "int64", "bool", "float16", "float8_e4m3fn", "float8_e5m2")
_STATUS: list = []  # [None]: on; [str]: why it is off (once tried)


def enable() -> str | None:
    """Turns the C API's reads on for this process, once (torch must be imported); returns None, or why not."""
    if _STATUS:
        return _STATUS[0]
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported"
    if not settings.current().torch_c_api:
        why = "FLYDSL_TORCH_C_API=0"
    else:
        base = torch.empty((3, 8))
        probes = (
            base,
            base[1:, ::2],  # a view: an offset and strides
            torch.empty((2, 3, 4), dtype=torch.bfloat16).transpose(0, 2),
            torch.empty((), dtype=torch.float64),
            # every dtype the zoo allocates, so that torch_new_empty can make it before a tensor of it was read
            *(torch.empty(0, dtype=getattr(torch, name)) for name in _DTYPES if hasattr(torch, name)),
        )
        getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        why = launcher._enable_torch_c_api(str(Path(torch.__file__).parent / "lib"), probes, getter)
    _STATUS.append(why)
    return why


def register_tensor_type(kind: type) -> None:
    """Lets the launcher read instances of ``kind`` (torch.Tensor or a subclass) as torch tensors, through the C API
    once :func:`enable` has turned it on (here, on the first type registered)."""
    launcher._register_tensor_type(kind)
    enable()


def status() -> str:
    """ "on", "not tried yet", or why it is off."""
    if not _STATUS:
        return "not tried yet"
    return "on" if _STATUS[0] is None else _STATUS[0]
