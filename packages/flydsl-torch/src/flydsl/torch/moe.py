"""``torch.ops.flydsl.topk_route``, ``align_tokens`` and ``fused_moe`` (each functional and ``_out``):
:mod:`flydsl.kernels.moe` as torch custom ops, registered on ``import flydsl.torch`` like :mod:`flydsl.torch.ops`'
(whose helpers these use). The ops write into the outputs the registry allocates (or the ``_out`` op is given): the
kernels take them by keyword, so neither form copies.

The metadata checks are the kernels' own (:func:`flydsl.kernels.moe.api.check_route_shapes`, ``check_align_shapes`` and
``check_experts_shapes``: no compiler). The fake implementations run them, so that eager calls, fake tensors and
compiled graphs give the same errors; strides, the grouped top-k's lane layout (the kernel module's: it loads the
compiler) and the routing's 2^30 positions are checked by the kernels when the op runs.
"""

from __future__ import annotations

import torch
from flydsl.kernels.moe import api as _moe
from flydsl.torch._registry import register_op
from flydsl.torch.ops import _dtype, _like, _rows
from torch import Tensor

__all__ = ["topk_route", "align_tokens", "fused_moe"]


class _Meta:
    """A tensor's shape and dtype (our name), as the kernels' metadata checks read it."""

    __slots__ = ("shape", "dtype")

    def __init__(self, t: Tensor):
        self.shape, self.dtype = tuple(t.shape), _dtype(t)


def _meta(t: Tensor | None) -> _Meta | None:
    return None if t is None else _Meta(t)


def _concrete(value):
    """A symbolic int (``torch.compile(dynamic=True)``) as the int it stands for: the kernels specialize on these
    counts (top_k, E, block_m), so the graph may too."""
    return int(value) if isinstance(value, torch.SymInt) else value


# --- topk_route ------------------------------------------------------------------------------------------------------


def _check_topk_route(router_logits, top_k, scoring, renormalize, bias, num_groups, top_groups) -> None:
    _moe.check_route_shapes(
        "flydsl.topk_route", _meta(router_logits), _concrete(top_k), scoring, renormalize, _meta(bias),
        _concrete(num_groups), _concrete(top_groups),
    )  # fmt: skip


def _route_outputs(router_logits, top_k, *options):
    shape = (router_logits.shape[0], top_k)
    return (shape, torch.float32), (shape, torch.int32)


@register_op("topk_route", outputs=_route_outputs, check=_check_topk_route)
def topk_route(
    router_logits: Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = True,
    bias: Tensor | None = None,
    num_groups: int | None = None,
    top_groups: int | None = None,
    *,
    topk_weights: Tensor,
    topk_ids: Tensor,
) -> None:
    """Each token's ``top_k`` experts, best first, and their weights (flydsl.kernels.moe.topk_route, one launch):
    ``router_logits`` (T, E) float32/float16/bfloat16 (E up to 512, ``top_k`` up to 16) -> ``topk_weights`` float32
    and ``topk_ids`` int32, both (T, top_k). ``scoring`` "softmax" or "sigmoid" (in float32); ``bias`` a float32
    (E,) correction added to choose the experts only (DeepSeek-V3); ``num_groups`` / ``top_groups``: grouped top-k;
    ``renormalize``: the weights divided by their sum."""
    from flydsl.kernels.moe import topk_route as kernel

    kernel(
        _rows(router_logits, router_logits.shape[1]), top_k, scoring=scoring, renormalize=renormalize,
        bias=None if bias is None else bias.contiguous(), num_groups=num_groups, top_groups=top_groups,
        topk_weights=topk_weights, topk_ids=topk_ids,
    )  # fmt: skip


# --- align_tokens ----------------------------------------------------------------------------------------------------


def _check_align_tokens(topk_ids, num_experts, block_m) -> None:
    _moe.check_align_shapes("flydsl.align_tokens", _meta(topk_ids), _concrete(num_experts), _concrete(block_m))


def _align_outputs(topk_ids, num_experts, block_m):
    capacity = _moe.align_capacity(topk_ids.shape[0] * topk_ids.shape[1], num_experts, block_m)
    return ((capacity,), torch.int32), ((capacity // block_m,), torch.int32), ((1,), torch.int32)


@register_op("align_tokens", outputs=_align_outputs, check=_check_align_tokens)
def align_tokens(
    topk_ids: Tensor,
    num_experts: int,
    block_m: int,
    *,
    sorted_ids: Tensor,
    expert_of_block: Tensor,
    padded_count: Tensor,
) -> None:
    """The (token, slot) pairs of ``topk_ids`` (T, k) int32/int64 sorted by expert and padded to blocks of
    ``block_m`` rows (flydsl.kernels.moe.align_tokens): ``sorted_ids`` int32 (capacity,) (capacity:
    ``flydsl.kernels.moe.align_capacity(T * k, num_experts, block_m)``), ``expert_of_block`` int32
    (capacity // block_m,) and ``padded_count`` int32 (1,). Ids outside ``[0, num_experts)`` are dropped. Sizes follow
    from the shapes alone (CUDA-graph capturable)."""
    from flydsl.kernels.moe import align_tokens as kernel

    kernel(
        topk_ids.contiguous(), num_experts, block_m, sorted_ids=sorted_ids, expert_of_block=expert_of_block,
        padded_count=padded_count,
    )  # fmt: skip


# --- fused_moe -------------------------------------------------------------------------------------------------------


def _check_fused_moe(
    x, w1, w2, topk_weights, topk_ids, activation, quant=None, granularity=None, w1_scale=None, w2_scale=None
) -> None:
    metas = [_meta(t) for t in (x, w1, w2, topk_weights, topk_ids)]
    scales = (_meta(w1_scale), _meta(w2_scale))
    _moe.check_experts_shapes("flydsl.fused_moe", *metas, activation, quant, granularity, *scales)


@register_op("fused_moe", outputs=lambda x, *rest: (_like(x),), check=_check_fused_moe)
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
    *,
    out: Tensor,
) -> None:
    """A mixture-of-experts layer's experts (flydsl.kernels.moe.fused_moe): ``out[t] = sum over s of
    topk_weights[t, s] * (w2[e] @ (silu(w1[e][:I] @ x[t]) * (w1[e][I:] @ x[t])))``, ``e = topk_ids[t, s]``; slots
    whose id is outside ``[0, E)`` are dropped. ``x`` (T, H) bf16/fp16; ``w1`` (E, 2I, H): each expert's gate rows
    then its up rows; ``w2`` (E, H, I); both contiguous, in x's dtype; ``topk_weights`` (T, k) float32/bf16/fp16,
    ``topk_ids`` (T, k) int32/int64 (e.g. ``topk_route``'s); H and I multiples of 8. ``quant="fp8"``: float8_e4m3fn
    weights with float32 ``w1_scale`` / ``w2_scale``, ``granularity`` "channel" ((E, 2I), (E, H)), "tensor" ((E,)
    each) or "block" ((E, 2I / 128, H / 128), (E, H / 128, ceil(I / 128)): one per 128 x 128 block, DeepSeek-V3's).
    ``out``: x's shape and dtype. Nothing is read back to the host (CUDA-graph capturable)."""
    from flydsl.kernels.moe import fused_moe as kernel

    # The activations are made contiguous (the kernel's layout); the weights are not copied: the kernel refuses them.
    kernel(
        x.contiguous(), w1, w2, topk_weights.contiguous(), topk_ids.contiguous(), activation=activation, quant=quant,
        granularity=granularity, w1_scale=w1_scale, w2_scale=w2_scale, out=out,
    )  # fmt: skip
