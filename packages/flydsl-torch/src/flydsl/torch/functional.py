"""``torch.nn.functional``-style entry points over ``torch.ops.flydsl.*``: same arguments as torch's, gradients
through the backward kernels, traceable by ``torch.compile(fullgraph=True)``.

Without gradients to compute (inference, ``torch.no_grad()``), the norms write nothing but the output (no
statistics). On plain CUDA tensors in eager mode such a call runs the ``*_out`` op's work directly, without torch's
dispatcher (see :func:`_eager`); when tracing, under a dispatch mode or with wrapped tensors it calls the ``*_out``
op, and with gradients the functional op. The ops are called by overload (``.default``) with every argument
positional: the cheapest path through the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import flydsl.torch.autograd  # noqa: F401 - registers the gradients of the ops
import torch
from flydsl.torch import ops
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


_PLAIN_TYPES = (Tensor, torch.nn.Parameter)
_plain_keysets: set = set()  # the raw dispatch key sets of plain CUDA tensors seen (by device type), see _eager


def _plain_keyset(raw: int) -> bool:
    """Whether ``raw`` (a tensor's dispatch key set) is that of a plain CUDA tensor, with or without autograd keys
    (inference tensors have none): learnt from a tensor made here, once per kind."""
    if not _plain_keysets:
        keys = torch._C.DispatchKey
        cuda = torch._C.DispatchKeySet(keys.CUDA)
        with_autograd = cuda.add(keys.ADInplaceOrView).add(keys.AutogradCUDA).add(keys.AutocastCUDA)
        _plain_keysets.update((cuda.raw_repr(), cuda.add(keys.AutocastCUDA).raw_repr(), with_autograd.raw_repr()))
    return raw in _plain_keysets


def _eager(*tensors: Tensor | None) -> bool:
    """Whether a call can run the op's work directly, without torch's dispatcher: nothing is tracing it
    (``torch.compile``, ``torch.export``), no dispatch mode is active (fake tensors, FLOP counters), and every tensor
    is a plain CUDA tensor (no subclass, no functorch or functionalization wrapper) that needs no gradient. Then the
    dispatcher would land in the op's CUDA kernel anyway, through layers that cost more host time than the kernel
    launch (measured: benchmarks/host_overhead.py); everything else takes the op."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    grad = torch.is_grad_enabled()
    keys = torch._C._dispatch_keys
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN_TYPES or (grad and t.requires_grad) or not _plain_keyset(keys(t).raw_repr()):
            return False
    return True


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
    if _eager(input):
        out = _empty(input)
        ops.softmax.eager_out((input,), {"out": out})
        return out
    if _needs_grad(input):
        return torch.ops.flydsl.softmax.default(input)
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
    if _eager(input, weight, bias):
        out = _empty(input)
        ops.layer_norm.eager_out((input, shape, weight, bias, eps), {"out": out, "mean": None, "rstd": None})
        return out
    if _needs_grad(input, weight, bias):
        return torch.ops.flydsl.layer_norm.default(input, shape, weight, bias, eps)[0]
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
    if _eager(input, weight):
        out = _empty(input)
        ops.rms_norm.eager_out((input, shape, weight, eps), {"out": out, "rstd": None})
        return out
    if _needs_grad(input, weight):
        return torch.ops.flydsl.rms_norm.default(input, shape, weight, eps)[0]
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
    if _eager(input, residual, weight):
        out, residual_out = _empty(input), _empty(input)
        given = {"out": out, "residual_out": residual_out, "rstd": None}
        ops.fused_add_rms_norm.eager_out((input, residual, shape, weight, eps), given)
        return out, residual_out
    if _needs_grad(input, residual, weight):
        out, residual_out, _rstd = torch.ops.flydsl.fused_add_rms_norm.default(input, residual, shape, weight, eps)
        return out, residual_out
    out, residual_out = _empty(input), _empty(input)
    torch.ops.flydsl.fused_add_rms_norm_out.default(input, residual, shape, weight, eps, out, residual_out, None)
    return out, residual_out
