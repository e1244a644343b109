"""Host-side checks and allocation shared by the row kernels: every argument is validated (dtype, rank, device,
unit stride on the last dim, matching N) before anything is launched, and errors name the argument.

Tensors are read through their own attributes when they are torch tensors (the cheap path), else through
``flydsl.compiler.args.describe_tensor`` (``__cuda_array_interface__`` / DLPack). Outputs that the caller does not
give are allocated with torch when the input is a torch tensor; other frameworks must pass their outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RowTensor", "row_tensor", "vector_tensor", "stats_tensor", "empty_like", "empty_rows", "ROW_DTYPES"]

ROW_DTYPES = ("f32", "f16", "bf16")  # element types of inputs and outputs
_TORCH_NAMES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True, slots=True)
class RowTensor:
    """What the kernels need to know about a tensor argument."""

    obj: object
    shape: tuple
    strides: tuple
    dtype: str
    device: object
    pointer: int

    @property
    def is_torch(self) -> bool:
        return type(self.obj).__module__.startswith("torch")


def _is_torch(obj) -> bool:
    return type(obj).__module__.startswith("torch")


def _describe(obj, name: str) -> RowTensor:
    if _is_torch(obj):
        if not obj.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got one on {obj.device}")
        dtype = _TORCH_NAMES.get(str(obj.dtype), str(obj.dtype).removeprefix("torch."))
        return RowTensor(obj, tuple(obj.shape), tuple(obj.stride()), dtype, obj.device, obj.data_ptr())
    from flydsl.compiler.args import describe_tensor

    try:
        described = describe_tensor(obj, name)
    except (TypeError, ValueError) as error:
        raise type(error)(str(error).replace(f"argument '{name}'", name)) from None
    return RowTensor(obj, described.shape, described.strides, described.dtype, described.device, described.pointer)


def row_tensor(obj, name: str, *, rows: int | None = None, n: int | None = None, dtypes=ROW_DTYPES) -> RowTensor:
    """A 2-D (rows, N) tensor with unit stride on its last dim (any row stride); checks shape against ``rows``/``n``
    when given."""
    if obj is None:
        raise TypeError(f"{name}: expected a tensor, got None")
    t = _describe(obj, name)
    if len(t.shape) != 2:
        raise ValueError(f"{name}: expected a 2-D tensor (rows, N), got shape {t.shape} (reshape to 2-D first)")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_names(dtypes)}, got {t.dtype}")
    if t.shape[1] > 1 and t.strides[1] != 1:
        raise ValueError(f"{name}: expected unit stride on the last dim, got strides {t.strides} (call .contiguous())")
    if t.shape[0] > 1 and t.strides[0] < t.shape[1]:
        raise ValueError(f"{name}: rows overlap (row stride {t.strides[0]} < N = {t.shape[1]})")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} rows, got shape {t.shape}")
    if n is not None and t.shape[1] != n:
        raise ValueError(f"{name}: expected N = {n} (the input's last dim), got shape {t.shape}")
    return t


def vector_tensor(obj, name: str, n: int, *, dtypes: tuple, allow_none: bool = True) -> RowTensor | None:
    """A 1-D tensor of ``n`` contiguous elements (weights, bias, their gradients)."""
    if obj is None:
        if allow_none:
            return None
        raise TypeError(f"{name}: expected a tensor, got None")
    t = _describe(obj, name)
    if len(t.shape) != 1 or t.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) (N, the input's last dim), got {t.shape}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_names(dtypes)}, got {t.dtype}")
    if n > 1 and t.strides[0] != 1:
        raise ValueError(f"{name}: expected a contiguous vector, got stride {t.strides[0]}")
    return t


def stats_tensor(obj, name: str, rows: int) -> RowTensor:
    """A float32 (rows,) tensor for per-row statistics (mean, rstd); any stride."""
    t = _describe(obj, name)
    if len(t.shape) != 1 or t.shape[0] != rows:
        raise ValueError(f"{name}: expected shape ({rows},) (one value per row), got {t.shape}")
    if t.dtype != "f32":
        raise TypeError(f"{name}: expected dtype float32, got {t.dtype}")
    return t


def same_device(reference: RowTensor, *others: tuple[str, RowTensor | None]) -> None:
    for name, other in others:
        if other is not None and other.device != reference.device:
            raise ValueError(f"{name}: expected a tensor on {reference.device} (the input's), got {other.device}")


def _names(dtypes) -> str:
    names = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
    return " or ".join(names.get(d, d) for d in dtypes)


def _torch_of(like: RowTensor, what: str):
    if not like.is_torch:
        raise TypeError(
            f"{what}: outputs are allocated with torch when the input is a torch tensor; the input is a"
            f" {type(like.obj).__module__}.{type(like.obj).__name__}: pass the output tensor explicitly"
        )
    import torch

    return torch


def empty_like(like: RowTensor, what: str, dtype: str | None = None):
    """A contiguous tensor of ``like``'s shape (and dtype unless given) on its device."""
    torch = _torch_of(like, what)
    torch_dtype = like.obj.dtype if dtype is None else _TORCH_DTYPES(torch)[dtype]
    return torch.empty(like.shape, dtype=torch_dtype, device=like.obj.device)


def empty_rows(like: RowTensor, shape: tuple, what: str, dtype: str = "f32"):
    torch = _torch_of(like, what)
    return torch.empty(shape, dtype=_TORCH_DTYPES(torch)[dtype], device=like.obj.device)


def _TORCH_DTYPES(torch) -> dict:  # noqa: N802 - a table, looked up like a constant
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def element_bytes(dtype: str) -> int:
    return _ELEMENT_BYTES[dtype]
