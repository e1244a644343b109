"""Mixture-of-experts (issue 34, in progress): routing, the first stages of a fused MoE layer: :func:`topk_route`
(each token's experts and weights from the router's logits: softmax or sigmoid scores, DeepSeek-V3's correction bias
and grouped top-k) and :func:`align_tokens` (the (token, slot) pairs sorted by expert and padded to the grouped GEMM's
blocks); :func:`prepare_w13` (w1's gate and up rows interleaved for the gated epilogue, once per weight).
:mod:`.reference` holds the float32 torch references (routing, the dense MoE and the staged one the kernels will
follow); the kernels are in :mod:`.topk` and :mod:`.align`."""

from flydsl.kernels.moe.api import align_capacity, align_tokens, topk_route
from flydsl.kernels.moe.weights import prepare_w13, unprepare_w13

__all__ = ["topk_route", "align_tokens", "align_capacity", "prepare_w13", "unprepare_w13"]
