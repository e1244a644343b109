"""Mixture of experts (issue 34, in progress): the routing, :func:`topk_route` (each token's experts and weights from
the router's logits: softmax or sigmoid scores, DeepSeek-V3's correction bias and grouped top-k) and
:func:`align_tokens` (the (token, slot) pairs sorted by expert and padded to the grouped GEMM's blocks), then
:func:`fused_moe` (the experts, bf16/fp16: gather, the two grouped GEMMs with the gated epilogue, the deterministic
combine; :mod:`.experts`). :mod:`.reference` holds the float32 torch references (routing, the dense MoE and the
staged one the kernels follow); the routing kernels are in :mod:`.topk` and :mod:`.align`."""

from flydsl.kernels.moe.api import align_capacity, align_tokens, topk_route

__all__ = ["topk_route", "align_tokens", "align_capacity", "fused_moe"]


def __getattr__(name):
    if name == "fused_moe":  # its module imports the compiler and the GEMM: loaded on first use
        from flydsl.kernels.moe.experts import fused_moe

        return fused_moe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
