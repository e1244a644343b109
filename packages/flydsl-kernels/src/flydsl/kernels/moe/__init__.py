"""Mixture-of-experts routing (the first stages of a fused MoE layer): :func:`topk_route` (each token's experts and
weights from the router's logits: softmax or sigmoid scores, DeepSeek-V3's correction bias and grouped top-k) and
:func:`align_tokens` (the (token, slot) pairs sorted by expert and padded to the grouped GEMM's blocks).
:mod:`.reference` holds the float32 torch references the tests compare with; the kernels are in :mod:`.topk` and
:mod:`.align`."""

from flydsl.kernels.moe.api import align_capacity, align_tokens, topk_route

__all__ = ["topk_route", "align_tokens", "align_capacity"]
