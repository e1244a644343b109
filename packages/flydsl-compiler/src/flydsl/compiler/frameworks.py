"""What a launch reads of its tensor arguments' frameworks: whether an argument is a torch tensor (its type then
known to the native launcher and torch's C API), the ``__cuda_array_interface__`` types the native path reads, the
stream a launch defaults to (the tensors' framework's current one) and a given stream's handle."""

from __future__ import annotations

from flydsl.compiler import torch_c_api
from flydsl.compiler._native import launcher
from flydsl.compiler.args import register_array_interface_dtypes

__all__ = [
    "ARRAY_INTERFACE_TYPES",
    "TORCH_TENSOR_TYPES",
    "default_stream",
    "is_torch_tensor",
    "register_array_interface_type",
    "stream_handle",
]

TORCH_TENSOR_TYPES: set = set()  # torch.Tensor and subclasses seen, so later checks are one set lookup
_current_torch_stream = None


def is_torch_tensor(value) -> bool:
    if type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"):
        TORCH_TENSOR_TYPES.add(type(value))
        torch_c_api.register_tensor_type(type(value))
        return True
    return False


ARRAY_INTERFACE_TYPES: set = set()  # types read through __cuda_array_interface__ that the native path knows


def register_array_interface_type(kind) -> None:
    """Lets the native dispatcher read instances of ``kind`` (cupy arrays, ...) as flydsl.compiler.kernel does: their
    ``__cuda_array_interface__``, with the element types ``describe_tensor`` accepts."""
    if not ARRAY_INTERFACE_TYPES:
        register_array_interface_dtypes()
    ARRAY_INTERFACE_TYPES.add(kind)
    launcher._register_array_interface_type(kind)


def default_stream(tensors) -> int:
    """The current stream of the tensors' framework: torch's, or the stream a ``__cuda_array_interface__`` (v3)
    names (cupy exports its current one there); else the legacy default stream."""
    global _current_torch_stream
    for tensor in tensors:
        if type(tensor) in TORCH_TENSOR_TYPES:
            if _current_torch_stream is None:
                import torch

                # The raw handle, as Triton reads it: current_stream().cuda_stream builds an object per call.
                _current_torch_stream = torch._C._cuda_getCurrentRawStream
                launcher._register_stream_getter(_current_torch_stream)
            return _current_torch_stream(tensor.get_device())
        interface = getattr(tensor.source, "__cuda_array_interface__", None)
        if interface is not None and interface.get("stream"):
            return interface["stream"]  # an int handle; 1 and 2 are CUDA's legacy and per-thread streams
    return 0


def stream_handle(stream) -> int:
    if stream is None or isinstance(stream, int):
        return stream or 0
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stream: expected an int handle or an object with .cuda_stream, got {type(stream).__name__}")
    return handle
