"""``torch.nn.functional``-style entry points over ``torch.ops.flydsl.*``: same arguments as torch's, gradients
through the backward kernels, traceable by ``torch.compile(fullgraph=True)``.

Without gradients to compute (inference, ``torch.no_grad()``), the norms write nothing but the output (no
statistics). On plain CUDA tensors in eager mode such a call runs the ``*_out`` op's work directly, without torch's
dispatcher (:func:`flydsl.torch._registry.eager`), and from the second call of a signature on, as one native replay of
its launches with nothing checked again (:mod:`flydsl.kernels.plans`: the signature holds every fact the checks
read); when tracing, under a dispatch mode or with wrapped tensors it calls the ``*_out`` op. With gradients they call
the functional op through ``FlyOp.call`` (again without the dispatcher where it would land in our kernels). The ops
are called by overload (``.default``) with every argument positional: the cheapest path through the dispatcher.

The inference ops (``fp8_gemm``, ``blockscale_gemm``, ``quantize_fp8``, ``paged_decode``, ``write_kv``,
``topk_route``, ``fused_moe``) take the ops' own arguments and have no gradients; each is its op's ``call``.
"""

from __future__ import annotations

from collections.abc import Sequence

import flydsl.torch.autograd  # noqa: F401 - registers the gradients of the ops
import torch
from flydsl.kernels.memory import torch_empty_like, torch_new_empty
from flydsl.kernels.plans import Plans, ScratchPlan, signature
from flydsl.torch import attention as _attention
from flydsl.torch import moe as _moe
from flydsl.torch import ops
from flydsl.torch._registry import eager
from torch import Tensor

__all__ = [
    "softmax",
    "layer_norm",
    "rms_norm",
    "fused_add_rms_norm",
    "linear",
    "fp8_gemm",
    "blockscale_gemm",
    "quantize_fp8",
    "paged_decode",
    "write_kv",
    "topk_route",
    "fused_moe",
]


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


# The eager inference calls' work by the functional's own signature, as plans of the tensors made on the first call
# (whose checks passed) and replayed natively where they only launch (flydsl.kernels.plans); a plan makes its outputs
# (fresh, contiguous, of the input's dtype: a replay through torch's C API, no Python), whose facts follow from the
# input's (and a replay falls back to the plan where an address is aligned otherwise). A call returns the outputs.
_SOFTMAX = Plans("flydsl.torch.functional.softmax", replay=True)
_LAYER_NORM = Plans("flydsl.torch.functional.layer_norm", replay=True)
_RMS_NORM = Plans("flydsl.torch.functional.rms_norm", replay=True)
_FUSED_ADD_RMS_NORM = Plans("flydsl.torch.functional.fused_add_rms_norm", replay=True)
_LINEAR = Plans("flydsl.torch.functional.linear", replay=True)


_GRAD = object()  # _kept's answer for a call that records gradients


def _kept(plans: Plans, tensors: tuple, *args):
    """The eager inference plan kept for a call's arguments, or None: always while ``torch.compile`` traces the call
    or under a dispatch mode; :data:`_GRAD` where one of ``tensors`` needs a gradient (the caller may then take the
    op's :meth:`~flydsl.torch._registry.FlyOp.call_with_grad`). The rest of :func:`eager` holds by the signature: the
    plan was made for a first call that passed it, and the signature names the same tensor types, devices and layouts
    (wrapper subclasses have none, and functorch's wrappers no data pointer). Past the tracing check, one native call
    answers (``_runtime.kept_plan``: the same checks and lookup, ~0.7 us less per call); its Nones (a dispatch mode,
    nothing kept in memory) are answered here."""
    if torch.compiler.is_compiling():
        return None
    native = _NATIVE_KEPT[0] if _NATIVE_KEPT else _bind_native_kept()
    if native is not None and (plan := native(plans.by_signature, args, tensors, _GRAD)) is not None:
        return plan
    if torch._C._len_torch_dispatch_stack():
        return None
    if torch.is_grad_enabled():
        for t in tensors:
            if getattr(t, "requires_grad", False):
                return _GRAD
    return plans.get(signature(*args))


_NATIVE_KEPT: list = []  # [_runtime.kept_plan or None], bound on the first call


def _bind_native_kept():
    """``_runtime.kept_plan`` with torch's checks registered (None where this flydsl-compiler has none)."""
    from flydsl.compiler._native import launcher
    from flydsl.kernels.plans import key_function

    native = getattr(launcher, "kept_plan", None)
    if native is not None:
        key_function()  # plan_key's type learner registered, as signature() does
        launcher._register_kept_checks(torch._C._len_torch_dispatch_stack, torch.is_grad_enabled)
    _NATIVE_KEPT.append(native)
    return native


def _first(plans: Plans, key, work, args: tuple, outputs: int = 1, shape: tuple | None = None) -> tuple:
    """A signature's first eager inference call, kept as the signature's plan: ``outputs`` fresh tensors like
    ``args[0]`` (its shape, or ``shape``; its dtype), then ``work(*args, *outputs)``; returns the outputs."""
    if shape is None:

        def make(like, *_) -> tuple:
            return tuple([torch_empty_like(like) for _ in range(outputs)])

    else:

        def make(like, *_) -> tuple:
            return tuple([torch_new_empty(like, shape) for _ in range(outputs)])

    return plans.add(key, ScratchPlan(make, work, ((0, shape, None),) * outputs))(*args)


def _empty(x: Tensor) -> Tensor:
    """A contiguous tensor like ``x`` through torch's own functions, which ``torch.compile`` traces (the kept plans'
    calls, eager only, take ``memory.torch_empty_like``)."""
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def softmax(input: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax(input, dim)``; a ``dim`` other than the last is moved last (a copy) and back."""
    plan = _kept(_SOFTMAX, (input,), input, dim)
    if plan is _GRAD:
        if dim == -1 and (out := ops.softmax.call_kept_with_grad(input)) is not None:
            return out
    elif plan is not None:
        return plan(input)[0]
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

        def work(input, out):
            ops.softmax.eager_out((input,), {"out": out})

        return _first(_SOFTMAX, signature(input, given_dim), work, (input,))[0]
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
    plan = _kept(_LAYER_NORM, (input, weight, bias), input, normalized_shape, weight, bias, eps)
    if plan is _GRAD:
        if (outs := ops.layer_norm.call_kept_with_grad(input, _shape(normalized_shape), weight, bias, eps)) is not None:
            return outs[0]
    elif plan is not None:
        return plan(input, weight, bias)[0]
    _tensor("layer_norm", "input", input)
    _tensor("layer_norm", "weight", weight, optional=True)
    _tensor("layer_norm", "bias", bias, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight, bias):
        return ops.layer_norm.call(input, shape, weight, bias, eps)[0]
    if eager(input, weight, bias):

        def work(input, weight, bias, out):
            ops.layer_norm.eager_out((input, shape, weight, bias, eps), {"out": out, "mean": None, "rstd": None})

        key = signature(input, normalized_shape, weight, bias, eps)
        return _first(_LAYER_NORM, key, work, (input, weight, bias))[0]
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
    plan = _kept(_RMS_NORM, (input, weight), input, normalized_shape, weight, eps)
    if plan is _GRAD:
        if (outs := ops.rms_norm.call_kept_with_grad(input, _shape(normalized_shape), weight, eps)) is not None:
            return outs[0]
    elif plan is not None:
        return plan(input, weight)[0]
    _tensor("rms_norm", "input", input)
    _tensor("rms_norm", "weight", weight, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, weight):
        return ops.rms_norm.call(input, shape, weight, eps)[0]
    if eager(input, weight):

        def work(input, weight, out):
            ops.rms_norm.eager_out((input, shape, weight, eps), {"out": out, "rstd": None})

        return _first(_RMS_NORM, signature(input, normalized_shape, weight, eps), work, (input, weight))[0]
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
    plan = _kept(_FUSED_ADD_RMS_NORM, (input, residual, weight), input, residual, normalized_shape, weight, eps)
    if plan is _GRAD:
        shape = _shape(normalized_shape)
        if (outs := ops.fused_add_rms_norm.call_kept_with_grad(input, residual, shape, weight, eps)) is not None:
            return outs[0], outs[1]
    elif plan is not None:
        return plan(input, residual, weight)
    _tensor("fused_add_rms_norm", "input", input)
    _tensor("fused_add_rms_norm", "residual", residual)
    _tensor("fused_add_rms_norm", "weight", weight, optional=True)
    shape = _shape(normalized_shape)
    if _needs_grad(input, residual, weight):
        out, residual_out, _rstd = ops.fused_add_rms_norm.call(input, residual, shape, weight, eps)
        return out, residual_out
    if eager(input, residual, weight):

        def work(input, residual, weight, out, residual_out):
            given = {"out": out, "residual_out": residual_out, "rstd": None}
            ops.fused_add_rms_norm.eager_out((input, residual, shape, weight, eps), given)

        key = signature(input, residual, normalized_shape, weight, eps)
        return _first(_FUSED_ADD_RMS_NORM, key, work, (input, residual, weight), outputs=2)
    out, residual_out = _empty(input), _empty(input)
    torch.ops.flydsl.fused_add_rms_norm_out.default(input, residual, shape, weight, eps, out, residual_out, None)
    return out, residual_out


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.linear``: ``input @ weight.t() + bias`` by the flydsl GEMM (``torch.ops.flydsl.gemm``);
    ``input`` (..., K) bf16 or fp16, ``weight`` (N, K) as an ``nn.Linear`` holds it (read in place, K-major), ``bias``
    (N,) in input's dtype or float32. Gradients for all three."""
    plan = _kept(_LINEAR, (input, weight, bias), input, weight, bias)
    if plan is _GRAD:
        if input.dim() == 2 and (out := ops.gemm.call_kept_with_grad(input, weight.t(), bias, None)) is not None:
            return out
    elif plan is not None:
        rows = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
        (out,) = plan(rows, weight, bias)
        return out if input.dim() == 2 else out.view(*input.shape[:-1], weight.shape[0])
    _tensor("linear", "input", input)
    _tensor("linear", "weight", weight)
    _tensor("linear", "bias", bias, optional=True)
    if input.dim() == 0:
        raise ValueError("flydsl.linear: input: expected at least one dim, got a 0-dim tensor")
    rows = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
    if _needs_grad(input, weight, bias):
        out = ops.gemm.call(rows, weight.t(), bias, None)
    elif eager(input, weight, bias):

        def work(rows, weight, bias, out):
            ops.gemm.eager_out((rows, weight.t(), bias, None), {"out": out})

        shape = (rows.shape[0], weight.shape[0])
        (out,) = _first(_LINEAR, signature(input, weight, bias), work, (rows, weight, bias), shape=shape)
    else:
        out = torch.ops.flydsl.gemm.default(rows, weight.t(), bias, None)
    return out if input.dim() == 2 else out.view(*input.shape[:-1], weight.shape[0])


# --- inference ops ---------------------------------------------------------------------------------------------------
# The torch.ops.flydsl ops without gradients, by the same arguments: on plain CUDA tensors in eager mode each runs its
# work without torch's dispatcher (FlyOp.call: checked once per signature, then the signature's kept run: a native
# replay where the kernel's launches read only the call's tensors; where the kernel allocates scratch per call, as
# paged_decode's split partials, a Python plan around the kernel entry), otherwise (torch.compile, fake tensors,
# dispatch modes) through the op, which traces as before.


def fp8_gemm(
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``activation((scale_a * a) @ (b * scale_b) + bias)``: ``torch.ops.flydsl.fp8_gemm`` (fp8 ``a`` (M, K), ``b``
    (K, N), e.g. an ``nn.Linear`` weight's ``W.t()``; float32 scales per tensor, row or column)."""
    return ops.fp8_gemm.call(a, b, scale_a, scale_b, bias, activation, out_dtype)


def blockscale_gemm(
    a: Tensor,
    b: Tensor,
    a_scales: Tensor,
    b_scales: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """The block-scaled fp8 GEMM, ``torch.ops.flydsl.blockscale_gemm``: ``a_scales`` per 1 x 128 of ``a``,
    ``b_scales`` per 128 x 128 block of ``b``."""
    return ops.blockscale_gemm.call(a, b, a_scales, b_scales, bias, activation, out_dtype)


def quantize_fp8(x: Tensor, granularity: str = "token", dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """``(x_fp8, scales)`` with ``x ~ x_fp8 * scales``, ``torch.ops.flydsl.quantize_fp8``; ``granularity`` "token",
    "channel", "tensor", "group" (1 x 128) or "block" (128 x 128)."""
    return ops.quantize_fp8.call(x, granularity, dtype)


def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    max_context: int | None = None,
) -> Tensor:
    """Attention of a decode step over a paged KV cache, ``torch.ops.flydsl.paged_decode`` (its docstring has the
    shapes; fp8 caches take ``k_scale`` / ``v_scale`` as float32 tensors)."""
    return _attention.paged_decode.call(
        q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, max_context
    )


def write_kv(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    """The new tokens' keys and values into the paged caches at ``slot_mapping``, in place:
    ``torch.ops.flydsl.write_kv``."""
    _attention.write_kv.call(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def topk_route(
    router_logits: Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = True,
    bias: Tensor | None = None,
    num_groups: int | None = None,
    top_groups: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Each token's ``top_k`` experts and their weights, ``(topk_weights, topk_ids)``:
    ``torch.ops.flydsl.topk_route``."""
    return _moe.topk_route.call(router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups)


def fused_moe(
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    activation: str = "silu",
    quant: str | None = None,
    granularity: str | None = None,
    w1_scale: Tensor | None = None,
    w2_scale: Tensor | None = None,
) -> Tensor:
    """A mixture-of-experts layer's experts, combined: ``torch.ops.flydsl.fused_moe``."""
    return _moe.fused_moe.call(x, w1, w2, topk_weights, topk_ids, activation, quant, granularity, w1_scale, w2_scale)
