"""``torch.nn.functional``-style entry points over ``torch.ops.flydsl.*``: same arguments as torch's, gradients
through the backward kernels, traceable by ``torch.compile(fullgraph=True)``.

Without gradients to compute (inference, ``torch.no_grad()``), the norms write nothing but the output (no
statistics). On plain CUDA tensors in eager mode such a call runs the ``*_out`` op's work directly, without torch's
dispatcher (:func:`flydsl.torch._registry.eager`), and from the second call of a signature on, as one native replay of
its launches with nothing checked again (:mod:`flydsl.kernels.plans`: the signature holds every fact the checks
read); when tracing, under a dispatch mode or with wrapped tensors it calls the ``*_out`` op. With gradients they call
the functional op through ``FlyOp.call`` (again without the dispatcher where it would land in our kernels). The ops
are called by overload (``.default``) with every argument positional: the cheapest path through the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import flydsl.torch.autograd  # noqa: F401 - registers the gradients of the ops
import torch
from flydsl.kernels.plans import Plans, signature
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


def _kept_applies(*tensors: Tensor | None) -> bool:
    """Whether a call whose signature has a kept eager plan (below) may run it: no dispatch mode is active and no
    tensor needs a gradient. The rest of :func:`eager` holds by the signature: it was made for a first call that passed
    it, and names the same tensor types, devices and layouts; wrappers (functorch, functionalization, fake tensors)
    have no data pointer and so no signature."""
    if torch._C._len_torch_dispatch_stack():
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return False
    return True


# The eager inference calls' plans by the functional's own signature: (the *_out op's eager plan, the arguments it is
# called with beside the tensors). Kept after a first call ran the *_out op's work (its checks passed) on outputs
# allocated by _empty, whose facts follow from the input's.
_SOFTMAX = Plans("flydsl.torch.functional.softmax")
_LAYER_NORM = Plans("flydsl.torch.functional.layer_norm")
_RMS_NORM = Plans("flydsl.torch.functional.rms_norm")
_FUSED_ADD_RMS_NORM = Plans("flydsl.torch.functional.fused_add_rms_norm")


def _kept(plans: Plans, *args):
    """The eager plan kept for a call's arguments, or None (always while ``torch.compile`` traces the call)."""
    if torch.compiler.is_compiling():
        return None
    return plans.get(signature(*args))


def _eager_out(plans: Plans, key, op, inputs: tuple, given: dict, shape: list | None = None) -> None:
    """Runs ``op.eager_out(inputs, given)`` and keeps its eager plan for the functional's ``key`` with ``shape`` (the
    normalized shape as a list, which the plan is called with)."""
    op.eager_out(inputs, given)
    plan = op._eager_out.get(signature(*inputs, *given.values()))
    if plan is not None and key is not None:
        plans.add(key, (plan, shape))


def _empty(x: Tensor) -> Tensor:
    """A contiguous tensor like ``x`` (empty_like parses no dtype/device arguments: about half of torch.empty's host
    time per call)."""
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax(input, dim)``; a ``dim`` other than the last is moved last (a copy) and back."""
    kept = _kept(_SOFTMAX, input, dim)
    if kept is not None and _kept_applies(input):
        out = _empty(input)
        kept[0](input, out)
        return out
    _tensor("softmax", "input", input)
    if input.dim() == 0:
        raise ValueError("flydsl.softmax: input: expected at least one dim, got a 0-dim tensor")
    if not -input.dim() <= dim < input.dim():
        raise IndexError(f"flydsl.softmax: dim: expected a dim of a {input.dim()}-D tensor, got {dim}")
    given_dim, dim = dim, dim % input.dim()
    if dim != input.dim() - 1:
        return softmax(input.movedim(dim, -1)).movedim(-1, dim)
    if _needs_grad(input):
        return ops.softmax.call(input)
    if eager(input):
        out = _empty(input)
        _eager_out(_SOFTMAX, signature(input, given_dim), ops.softmax, (input,), {"out": out})
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
    kept = _kept(_LAYER_NORM, input, normalized_shape, weight, bias, eps)
    if kept is not None and _kept_applies(input, weight, bias):
        plan, shape = kept
        out = _empty(input)
        plan(input, shape, weight, bias, eps, out, None, None)
        return out
    _tensor("layer_norm", "input", input)
    _tensor("layer_norm", "weight", weight, optional=True)
    _tensor("layer_norm", "bias", bias, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight, bias):
        return ops.layer_norm.call(input, shape, weight, bias, eps)[0]
    if eager(input, weight, bias):
        out = _empty(input)
        key = signature(input, normalized_shape, weight, bias, eps)
        given = {"out": out, "mean": None, "rstd": None}
        _eager_out(_LAYER_NORM, key, ops.layer_norm, (input, shape, weight, bias, eps), given, shape)
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
    kept = _kept(_RMS_NORM, input, normalized_shape, weight, eps)
    if kept is not None and _kept_applies(input, weight):
        plan, shape = kept
        out = _empty(input)
        plan(input, shape, weight, eps, out, None)
        return out
    _tensor("rms_norm", "input", input)
    _tensor("rms_norm", "weight", weight, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight):
        return ops.rms_norm.call(input, shape, weight, eps)[0]
    if eager(input, weight):
        out = _empty(input)
        key = signature(input, normalized_shape, weight, eps)
        _eager_out(_RMS_NORM, key, ops.rms_norm, (input, shape, weight, eps), {"out": out, "rstd": None}, shape)
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
    kept = _kept(_FUSED_ADD_RMS_NORM, input, residual, normalized_shape, weight, eps)
    if kept is not None and _kept_applies(input, residual, weight):
        plan, shape = kept
        out, residual_out = _empty(input), _empty(input)
        plan(input, residual, shape, weight, eps, out, residual_out, None)
        return out, residual_out
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
        key = signature(input, residual, normalized_shape, weight, eps)
        _eager_out(
            _FUSED_ADD_RMS_NORM, key, ops.fused_add_rms_norm, (input, residual, shape, weight, eps), given, shape
        )
        return out, residual_out
    out, residual_out = _empty(input), _empty(input)
    torch.ops.flydsl.fused_add_rms_norm_out.default(input, residual, shape, weight, eps, out, residual_out, None)
    return out, residual_out
