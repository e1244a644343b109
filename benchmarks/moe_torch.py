"""The mixture-of-experts layer in torch, for the benchmarks (``moe_bench.py`` times these as fused_moe's peers,
``host_overhead.py`` as its torch equivalent): the ``_grouped_mm`` pipeline, its fp8 form through
``_scaled_grouped_mm``, a loop over experts, the row-wise e4m3 quantization they use, and the experts' weight
formats the benchmark runs (``format_weights``: bf16, fp8 per channel, fp8 per 128 x 128 block). Not a script."""

from __future__ import annotations

from typing import NamedTuple

FP8_MAX = 448.0  # the largest finite float8_e4m3fn: a row's amax maps onto it


def quantize_rows(a):
    """``(a8 float8_e4m3fn, scale float32)`` of ``a`` (..., N): one scale per row (over the last dim), its amax
    mapped onto e4m3's largest value, ``a ~ a8.float() * scale[..., None]``; a zero row gets scale 1 (and zeros)."""
    import torch

    amax = torch.linalg.vector_norm(a, float("inf"), dim=-1, dtype=torch.float32)  # max |a|: one pass
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    # |a / scale| <= 448 up to float32 rounding, which e4m3's rounding to nearest brings back to 448: no clamp
    return (a / scale[..., None]).to(torch.float8_e4m3fn), scale


def quantize_experts(w):
    """``(w8 float8_e4m3fn, scale float32)`` of expert weights ``w`` (E, N, K), one scale per output channel (E, N):
    the fp8 format fused_moe takes with ``granularity="channel"``."""
    return quantize_rows(w)


def quantize_expert_blocks(w, block: int = 128):
    """``(w8 float8_e4m3fn, scale float32)`` of expert weights ``w`` (E, N, K), one scale per expert and ``block`` x
    ``block`` block (E, ceil(N / block), ceil(K / block); partial blocks at the edges), each block's amax mapped onto
    e4m3's largest value (a zero block: scale 1): the format fused_moe takes with ``granularity="block"``."""
    import torch

    experts, n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    w8 = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty(experts, rows, cols, dtype=torch.float32, device=w.device)
    for e in range(experts):  # one expert at a time: a float32 copy of all of them would be 4x the bf16 weights
        padded = w.new_zeros(rows * block, cols * block, dtype=torch.float32)
        padded[:n, :k] = w[e]
        blocks = padded.view(rows, block, cols, block)
        amax = blocks.abs().amax(dim=(1, 3))
        scales[e] = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        w8[e] = (blocks / scales[e][:, None, :, None]).view(rows * block, cols * block)[:n, :k]
    return w8, scales


def dequantize(w8, scale):
    """float32 weights the fp8 layer computes with: ``w8 * scale[..., None]`` (per output channel), or each 128 x 128
    block times its scale (a 3-D ``scale``: ``quantize_expert_blocks``')."""
    if scale.dim() == 3:
        from flydsl.kernels.moe.reference import dequantize_experts

        return dequantize_experts(w8, scale, "block")
    return w8.float() * scale[..., None]


def _sorted_rows(topk_ids, experts: int, drops: bool):
    """``(order, offs, token)``: the flat (token, slot) indices sorted by expert (stable), kept ids only, ``offs``
    int32 (E,) the sorted rows up to each expert's last, as the grouped GEMMs take them, and each sorted row's
    token. ``drops``: ids outside ``[0, E)`` may occur; they are sorted last and the kept count read on the host (one
    synchronization); without it every id must be valid and nothing waits on the GPU."""
    import torch

    flat = topk_ids.reshape(-1)
    if drops:
        flat = torch.where((flat >= 0) & (flat < experts), flat, torch.full_like(flat, experts))
    keys, order = torch.sort(flat, stable=True)
    # searchsorted rather than bincount + cumsum: the same offsets without a host synchronization
    bounds = torch.arange(experts, device=keys.device, dtype=keys.dtype)
    offs = torch.searchsorted(keys, bounds, right=True, out_int32=True)
    if drops:
        order = order[: int(offs[-1])]
    return order, offs, order // topk_ids.shape[1]


def _combine(y, order, token, topk_weights, tokens: int, dtype):
    """``(T, H)`` in ``dtype``: each sorted row of ``y`` (flat index ``order``, token ``token``) times its weight,
    added in float32 into its token's row."""
    import torch

    out = torch.zeros(tokens, y.shape[1], dtype=torch.float32, device=y.device)
    out.index_add_(0, token, y.float() * topk_weights.reshape(-1)[order, None])
    return out.to(dtype)


def grouped_mm_moe(x, w1, w2, topk_weights, topk_ids, *, drops: bool):
    """The MoE layer through ``torch._grouped_mm`` (bf16 (T, H)): rows sorted by expert (``_sorted_rows``, which
    says what ``drops`` means), the two grouped GEMMs, a float32 ``index_add_`` combine."""
    import torch
    import torch.nn.functional as F

    tokens, inter = topk_ids.shape[0], w1.shape[1] // 2
    order, offs, token = _sorted_rows(topk_ids, w1.shape[0], drops)
    if not order.numel():
        return x.new_zeros(tokens, x.shape[1])
    gate_up = torch._grouped_mm(x.index_select(0, token), w1.transpose(1, 2), offs=offs)
    h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    y = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
    return _combine(y, order, token, topk_weights, tokens, x.dtype)


def scaled_grouped_mm_moe(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, *, drops: bool):
    """The fp8 MoE layer through ``torch._scaled_grouped_mm`` (bf16 (T, H)): ``w1`` (E, 2I, H) and ``w2`` (E, H,
    I) float8_e4m3fn with float32 scales (E, 2I) and (E, H) per output channel (``quantize_experts``); x and the
    hidden activations quantized per row (``quantize_rows``); rows sorted as ``grouped_mm_moe`` sorts them. The
    GEMMs are rowwise-scaled: ``scale_a`` one float32 per row of the 2-D operand, ``scale_b`` (E, N) per column of
    each expert; the 3-D operand column-major per expert, which ``w.transpose(1, 2)`` of a contiguous (E, N, K)
    is."""
    import torch
    import torch.nn.functional as F

    tokens, inter = topk_ids.shape[0], w1.shape[1] // 2
    order, offs, token = _sorted_rows(topk_ids, w1.shape[0], drops)
    if not order.numel():
        return x.new_zeros(tokens, x.shape[1])
    x8, x_scale = quantize_rows(x)  # per token before the gather: T rows rather than T * k, the same values
    # the gather as bytes: index_select need not support float8 dtypes
    a8 = x8.view(torch.uint8).index_select(0, token).view(torch.float8_e4m3fn)
    gate_up = torch._scaled_grouped_mm(
        a8,
        w1.transpose(1, 2),
        scale_a=x_scale.index_select(0, token),
        scale_b=w1_scale,
        offs=offs,
        out_dtype=torch.bfloat16,
    )
    h8, h_scale = quantize_rows(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
    y = torch._scaled_grouped_mm(
        h8, w2.transpose(1, 2), scale_a=h_scale, scale_b=w2_scale, offs=offs, out_dtype=torch.bfloat16
    )
    return _combine(y, order, token, topk_weights, tokens, x.dtype)


def loop_moe(x, w1, w2, topk_weights, topk_ids):
    """The MoE layer as a loop over experts (bf16 (T, H)): each expert's (token, slot) pairs by ``nonzero``, its
    two matmuls in bf16, the weighted rows added into a float32 (T, H)."""
    import torch
    import torch.nn.functional as F

    experts, inter = w1.shape[0], w1.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(experts):
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        gate_up = x.index_select(0, rows) @ w1[e].t()
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()
        out.index_add_(0, rows, y.float() * topk_weights[rows, slots, None])
    return out.to(x.dtype)


# --- the weights' formats ---------------------------------------------------------------------------------------


class Weights(NamedTuple):
    """One model's experts in one format: w1 (E, 2I, H), w2 (E, H, I); fp8: e4m3 with float32 scales per output
    channel, w1_scale (E, 2I) and w2_scale (E, H) (None in bf16); block: per 128 x 128 block, w1_scale (E, 2I / 128,
    H / 128) and w2_scale (E, H / 128, I / 128), and ``channel``: the same weights in the fp8 format, for the torch
    peer (torch has no block-scaled grouped GEMM)."""

    w1: object
    w2: object
    w1_scale: object = None
    w2_scale: object = None
    channel: object = None


def format_weights(w1, w2, quant: str) -> Weights:
    """The bf16 weights in format ``quant``: themselves, or quantized by ``quantize_experts``."""
    if quant == "bf16":
        return Weights(w1, w2)
    if quant == "fp8":
        (w1_8, w1_scale), (w2_8, w2_scale) = quantize_experts(w1), quantize_experts(w2)
        return Weights(w1_8, w2_8, w1_scale, w2_scale)
    if quant == "block":
        (w1_8, w1_scale), (w2_8, w2_scale) = quantize_expert_blocks(w1), quantize_expert_blocks(w2)
        return Weights(w1_8, w2_8, w1_scale, w2_scale, format_weights(w1, w2, "fp8"))
    raise ValueError(f"unknown weight format {quant!r}")


def exact_weights(weights) -> tuple:
    """``(w1, w2)`` for the reference: bf16 as they are, fp8 dequantized (float32, made for one check: they are
    twice the bf16 weights' size and live only while the reference runs)."""
    if weights.w1_scale is None:
        return weights.w1, weights.w2
    return dequantize(weights.w1, weights.w1_scale), dequantize(weights.w2, weights.w2_scale)


def expert_bytes(hidden: int, inter: int, quant: str) -> int:
    """The bytes of one expert's weights (w1's 2I x H and w2's H x I) in the given format; fp8 with its float32
    scales, one per output channel (2I of w1, H of w2)."""
    if quant == "bf16":
        return 3 * inter * hidden * 2
    if quant == "fp8":
        return 3 * inter * hidden + (2 * inter + hidden) * 4
    if quant == "block":
        blocks = lambda n: -(-n // 128)  # noqa: E731
        return 3 * inter * hidden + (blocks(2 * inter) * blocks(hidden) + blocks(hidden) * blocks(inter)) * 4
    raise ValueError(f"unknown weight format {quant!r}")
