"""``torch.nn.functional``-style entry points over ``torch.ops.flydsl.*``: same arguments as torch's, gradients
through the backward kernels, traceable by ``torch.compile(fullgraph=True)``.

Without gradients to compute (inference, ``torch.no_grad()``), the norms write nothing but the output (no
statistics). On plain CUDA tensors in eager mode such a call runs the ``*_out`` op's work directly, without torch's
dispatcher (:func:`flydsl.torch._registry.eager`); when tracing, under a dispatch mode or with wrapped tensors it
calls the ``*_out`` op. With gradients they call the functional op through ``FlyOp.call`` (again without the
dispatcher where it would land in our kernels). The ops are called by overload (``.default``) with every argument
positional: the cheapest path through the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import flydsl.torch.autograd  # noqa: F401 - registers the gradients of the ops
import torch
from flydsl.torch import ops
from flydsl.torch._registry import eager
from torch import Tensor

__all__ = ["softmax", "layer_norm", "rms_norm", "fused_add_rms_norm"]


def _shape(normalized_shape: int | Sequence[int]) -> list[int]:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return list(normalized_shape)


def _tensor(who: str, name: str, t, optional: bool = False) -> None:
    """Refuses a ``t`` that is not a tensor (nor None, where ``optional``), naming it: else it fails later as an
    AttributeError."""
    if not isinstance(t, Tensor) and not (optional and t is None):
        expected = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"flydsl.{who}: {name}: expected {expected}, got {type(t).__name__}")


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _empty(x: Tensor) -> Tensor:
    """A contiguous tensor like ``x`` (empty_like parses no dtype/device arguments: about half of torch.empty's host
    time per call)."""
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax(input, dim)``; a ``dim`` other than the last is moved last (a copy) and back."""
    _tensor("softmax", "input", input)
    if input.dim() == 0:
        raise ValueError("flydsl.softmax: input: expected at least one dim, got a 0-dim tensor")
    if not -input.dim() <= dim < input.dim():
        raise IndexError(f"flydsl.softmax: dim: expected a dim of a {input.dim()}-D tensor, got {dim}")
    dim %= input.dim()
    if dim != input.dim() - 1:
        return softmax(input.movedim(dim, -1)).movedim(-1, dim)
    if _needs_grad(input):
        return ops.softmax.call(input)
    if eager(input):
        out = _empty(input)
        ops.softmax.eager_out((input,), {"out": out})
        return out
    out = _empty(input)
    torch.ops.flydsl.softmax_out.default(input, out)
    return out


def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """``torch.nn.functional.layer_norm``."""
    _tensor("layer_norm", "input", input)
    _tensor("layer_norm", "weight", weight, optional=True)
    _tensor("layer_norm", "bias", bias, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight, bias):
        return ops.layer_norm.call(input, shape, weight, bias, eps)[0]
    if eager(input, weight, bias):
        out = _empty(input)
        ops.layer_norm.eager_out((input, shape, weight, bias, eps), {"out": out, "mean": None, "rstd": None})
        return out
    out = _empty(input)
    torch.ops.flydsl.layer_norm_out.default(input, shape, weight, bias, eps, out, None, None)
    return out


def rms_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """``torch.nn.functional.rms_norm``; ``eps=None`` is float32's machine epsilon, as in torch."""
    _tensor("rms_norm", "input", input)
    _tensor("rms_norm", "weight", weight, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight):
        return ops.rms_norm.call(input, shape, weight, eps)[0]
    if eager(input, weight):
        out = _empty(input)
        ops.rms_norm.eager_out((input, shape, weight, eps), {"out": out, "rstd": None})
        return out
    out = _empty(input)
    torch.ops.flydsl.rms_norm_out.default(input, shape, weight, eps, out, None)
    return out


def fused_add_rms_norm(
    input: Tensor,
    residual: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(input + residual, ...), input + residual)`` in one pass (the sum rounded to the input dtype)."""
    _tensor("fused_add_rms_norm", "input", input)
    _tensor("fused_add_rms_norm", "residual", residual)
    _tensor("fused_add_rms_norm", "weight", weight, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, residual, weight):
        out, residual_out, _rstd = ops.fused_add_rms_norm.call(input, residual, shape, weight, eps)
        return out, residual_out
    if eager(input, residual, weight):
        out, residual_out = _empty(input), _empty(input)
        given = {"out": out, "residual_out": residual_out, "rstd": None}
        ops.fused_add_rms_norm.eager_out((input, residual, shape, weight, eps), given)
        return out, residual_out
    out, residual_out = _empty(input), _empty(input)
    torch.ops.flydsl.fused_add_rms_norm_out.default(input, residual, shape, weight, eps, out, residual_out, None)
    return out, residual_out
