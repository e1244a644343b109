"""The decode-sized stages of :func:`~flydsl.kernels.moe.fused_moe` (:func:`decodes`: T <= 64, experts averaging at
most 8 rows): align in blocks of 16 rows, then the grouped skinny GEMMs of
:mod:`~flydsl.kernels.gemm.skinny_grouped`, each routed block's expert's weights streamed once, spread over the SMs,
in 16-byte loads; stage 1 reads x's rows by index (no gather) and notes the positions the combine reads. fp8 weights
(``skinny_gemm_grouped_fp8_kernel``): converted to x's dtype in registers, x and h not quantized; opt-in
(:func:`decode_modes`'s ``quantize`` and ``quantize_h``), with per-row scales from two tokens on, x and h quantized
per token and the stages on fp8 MMAs (``skinny_gemm_grouped_scaled_kernel``). One token: no alignment, stage 2 and
the combine in one launch (opt-in, ``single``: stage 1 in it too). Why they are shaped so: docs/tuning/moe.md#decode.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from flydsl.compiler import settings
from flydsl.kernels import memory as zoo_memory
from flydsl.kernels.gemm.epilogue import Epilogue
from flydsl.kernels.gemm.skinny import SkinnyVariant
from flydsl.kernels.gemm.skinny_grouped import (
    GROUPED_BLOCK,
    GroupedMode,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_fp8_kernel,
    skinny_gemm_grouped_kernel,
    skinny_gemm_grouped_scaled_kernel,
)
from flydsl.kernels.gemm.skinny_one_token import (
    choose_combined_config,
    choose_one_launch_configs,
    skinny_gemm_combined_kernel,
    skinny_gemm_one_launch_kernel,
)
from flydsl.kernels.moe.api import BLOCK, align_capacity, align_tokens

__all__ = ["COMBINE_MAX_INTER", "DECODE_TOKENS", "DecodeModes", "decode_modes", "decode_stages", "decodes", "per_row"]

DECODE_TOKENS = 64  # at most: the weight-streaming stages (decodes)
_DECODE_WORDS = frozenset({"direct", "combine", "single", "quantize", "quantize_h"})  # FLYDSL_MOE_DECODE's
_DECODE_DEFAULT = frozenset({"direct", "combine"})  # (single: slower; quantize, quantize_h: no faster)
COMBINE_MAX_INTER = 1024  # at most: the combined kernel's warp per routed pair streams all of I (decode_modes)


def decodes(tokens: int, ids: int, experts: int) -> bool:
    """Decode-sized calls (at most 64 tokens, experts averaging at most 8 rows) take the weight-streaming stages:
    each routed expert's weights read once per 16 rows, by every SM."""
    return tokens <= DECODE_TOKENS and ids <= 8 * experts


class DecodeModes(NamedTuple):
    """How a decode-sized call runs (:func:`decode_modes`): each stage's
    :class:`~flydsl.kernels.gemm.skinny_grouped.GroupedMode`, and ``combined``: stage 2 and the combine in one
    launch (``skinny_gemm_combined_kernel``, after a direct stage 1)."""

    stage1: GroupedMode = GroupedMode()
    stage2: GroupedMode = GroupedMode()
    combined: bool = False
    quantized: bool = False  # fp8 weights per row: x quantized per token, stage 1 on fp8 MMAs (W8A8; opt-in)
    quantized_h: bool = False  # and h per row, stage 2 on fp8 MMAs (opt-in)
    single: bool = False  # combined, and stage 1 in the same launch (skinny_gemm_one_launch_kernel; opt-in)


def decode_modes(tokens, top_k, inter, enabled=None) -> DecodeModes:
    """The decode stages' modes: ``direct`` (no alignment: each routed pair its own block) for one token, and with
    it ``combine`` (stage 2 and the combine in one launch) where I is at most :data:`COMBINE_MAX_INTER` and top_k at
    most 16. Measured on the H100 (``moe_decode_sweep/2026-12-05_fc404ae_h100.json``, one token): direct 4-9%
    faster than the aligned path; with combine DeepSeek-V3 TP8 (I 256) and Qwen3 (I 768) 10-13% faster again, Mixtral
    (I 14336) 10% slower (docs/tuning/moe.md#decode). ``quantize`` (opt-in) from two tokens on: fp8 weights with
    per-row scales take x quantized per token and stage 1 on fp8 MMAs (half the activation bytes a step, no
    conversion in registers; stage 2 stays weight-only: its h would need a quantizing launch over every padded row):
    stage 1 2-4% faster on the H100 and 1-3% on the H200, the call within 1% on both (a quantizing launch of ~2
    us), for one fp8 rounding of x (``moe_decode_sweep/2026-12-06_b1e6388_quantized_h100.json``,
    ``moe_decode_sweep/2026-12-06_2757e01_quantized.json``). ``quantize_h`` (opt-in, with ``quantize``): h too, per
    row (a quantizing launch over stage 1's rows, pad rows too), stage 2 on fp8 MMAs: 3-9% slower on the H200.
    ``single`` (opt-in, with combine): one token's stage 1 in the combined kernel's launch, its stage-2 CTAs waiting
    on a count of finished stage-1 CTAs rather than a kernel boundary (``skinny_gemm_one_launch_kernel``): 1-24%
    slower than the two launches on an H100 (``moe_decode_sweep/2026-12-06_9e02a6f_single_h100.json``).
    ``enabled``: the modes allowed, a subset of "direct", "combine", "single", "quantize" and "quantize_h"
    (default: ``FLYDSL_MOE_DECODE``'s comma-separated words where it is set; else direct and combine)."""
    if enabled is None:
        enabled = settings.current().moe_decode
        enabled = _DECODE_DEFAULT if enabled is None else enabled
    if not set(enabled) <= _DECODE_WORDS:
        raise ValueError(f"FLYDSL_MOE_DECODE: expected words from {sorted(_DECODE_WORDS)}, got {sorted(enabled)}")
    direct = "direct" in enabled and tokens == 1
    combined = direct and "combine" in enabled and top_k <= 16 and inter <= COMBINE_MAX_INTER
    mode = GroupedMode(direct=direct)
    quantized = "quantize" in enabled and tokens > 1
    single = combined and "single" in enabled
    return DecodeModes(mode, mode, combined, quantized, quantized and "quantize_h" in enabled, single)


def per_row(scale, rows: int):
    """fp8 weights' scales, one per row of the stacked (E * rows, K) weights: a per-channel (E, rows) tensor as it
    is, a per-tensor (E,) one repeated (a small copy, per call)."""
    return scale.view(-1) if scale.dim() == 2 else scale[:, None].expand(-1, rows).reshape(-1)


def decode_stages(x, tokens, hidden, experts, inter, top_k, activation, fp8=None, modes=None):
    """align in blocks of 16 (``modes``' ``direct``: no alignment, each routed pair its own block), then the two
    grouped skinny GEMMs (stage 1 reads x's rows by index and notes the positions): ``(buffers, steps, shapes)``,
    ``buffers(x, w1_scale, w2_scale)`` the memory of one call (the alignment, h and y, kept per stream; per-tensor
    weight scales repeated per row), ``steps`` a function of the call's tensors and those buffers returning y, and
    ``shapes`` the kept buffers' (name, shape, dtype) in order. ``fp8`` (weights
    e4m3, weight-only: x and h stay in x's dtype): "row" (per-channel scales, or per-tensor ones repeated per row)
    or "block" (128 x 128 block scales, the stacked view ``w_scale.view(-1, K blocks)``), through
    :func:`~flydsl.kernels.gemm.skinny_grouped.skinny_gemm_grouped_fp8_kernel`; "row" with ``modes.quantized``: x
    quantized per token into held buffers first, stage 1 through ``skinny_gemm_grouped_scaled_kernel`` (and with
    ``modes.quantized_h`` h per row, stage 2 through it too). ``modes``: a :class:`DecodeModes` (:func:`decode_modes`;
    default: the aligned order, weight-only, two stages and a combine); ``single``: one launch of
    ``skinny_gemm_one_launch_kernel`` on a held pair of counters."""
    mode1, mode2, combined, quantized, quantized_h, single = modes or DecodeModes()
    quantized = quantized and fp8 == "row"  # (x quantized per token: stage 1 on fp8 MMAs)
    quantized_h = quantized and quantized_h and not combined  # (h per row: stage 2 on fp8 MMAs)
    ids = tokens * top_k
    capacity = ids * GROUPED_BLOCK if mode1.direct else align_capacity(ids, experts, GROUPED_BLOCK)
    blocks = min(capacity // GROUPED_BLOCK, ids)  # each block below padded_count holds an id
    routed = blocks * GROUPED_BLOCK  # rows below padded_count, at most: the rows stage 1 writes, stage 2 reads
    element_bytes = 1 if fp8 else 2
    cfg1 = choose_grouped_skinny_config(hidden, True, element_bytes, mode1.direct, fp8 == "block", quantized, inter)
    cfg2 = choose_grouped_skinny_config(inter, False, element_bytes, mode2.direct, fp8 == "block", quantized_h)
    variant1 = SkinnyVariant(True, Epilogue(gate=activation), True)
    variant2 = SkinnyVariant(True, Epilogue(), True)
    grid1 = (-(-inter // (cfg1.rows // 2)), blocks)
    grid2 = (-(-hidden // cfg2.rows), blocks)
    cfgc = choose_combined_config(top_k, element_bytes, inter)
    gridc = (-(-hidden // cfgc.rows), tokens)
    if single:  # one launch: the direct stage 1's tiles, then the combined kernel's (one CTA size)
        cfg1, cfgc = choose_one_launch_configs(hidden, top_k, element_bytes)
        grid1 = (-(-inter // (cfg1.rows // 2)) * top_k + -(-hidden // cfgc.rows),)

    import torch

    from flydsl.kernels.quantize import quantize_fp8

    # The alignment, h and y, held per stream (memory.held, shared with the replays that make them): a call reads
    # only what it wrote in them itself (rows below its padded_count), and the calls of one stream run one after
    # another (no allocations per call). By (name, shape, dtype), as a replay makes them (the plan's made): h's
    # blocks past padded_count are never written nor read; combined, y is unused (the output is written directly).
    i32 = torch.int32
    alignment = (("sorted_ids", (capacity,), i32), ("expert_of_block", (capacity // GROUPED_BLOCK,), i32))
    alignment = () if mode1.direct else (*alignment, ("padded_count", (1,), i32))
    shapes = (*alignment, ("h", (routed, inter), x.dtype), ("y", (0 if combined else capacity, hidden), x.dtype))
    if quantized:  # x per token in fp8 and its scales
        shapes += (("x8", (tokens, hidden), torch.float8_e4m3fn), ("x_scales", (tokens, 1), torch.float32))
    if quantized_h:  # h per row
        shapes += (("h8", (routed, inter), torch.float8_e4m3fn), ("h_scales", (routed, 1), torch.float32))
    if single:  # finished stage-1 CTAs, finished stage-2 CTAs (zero between launches)
        shapes += (("one_launch_counters", (2,), i32),)
    viewed: dict = {}  # stream_key -> (the held buffers, their views of `shapes`)

    def views(x) -> tuple:
        key = zoo_memory.stream_key(x)
        bases = tuple(zoo_memory.held(x, f"fused_moe.{n}", math.prod(shape), dtype, key) for n, shape, dtype in shapes)
        kept = viewed.get(key)
        if kept is None or any(a is not b for a, b in zip(kept[0], bases, strict=True)):  # made or grown since
            sizes = (shape for _, shape, _ in shapes)
            shaped = tuple(base[: math.prod(shape)].view(shape) for base, shape in zip(bases, sizes, strict=True))
            kept = viewed[key] = (bases, shaped)
        return kept[1]

    def buffers(x, w1_scale, w2_scale) -> tuple:
        kept = views(x)
        if fp8 != "row" or (w1_scale.dim() == 2 and w2_scale.dim() == 2):
            return kept
        # per-tensor (E,) weight scales repeated per row, a copy per call; per channel (E, rows): None, viewed at launch
        repeated = tuple(
            None if scale.dim() == 2 else per_row(scale, count)
            for scale, count in ((w1_scale, 2 * inter), (w2_scale, hidden))
        )
        return (*kept, *repeated)

    def steps(x, w1, w2, topk_weights, topk_ids, positions, out, w1_scale, w2_scale, *held):
        if mode1.direct:  # the flat ids stand for the (unread) order and count too
            pairs = topk_ids.reshape(-1)
            (h, y, *rows), routing = held, (pairs, pairs, pairs, positions)
        else:
            sorted_ids, expert_of_block, padded_count, h, y, *rows = held
            aligned = dict(sorted_ids=sorted_ids, expert_of_block=expert_of_block, padded_count=padded_count)
            align_tokens(topk_ids, experts, GROUPED_BLOCK, **aligned)
            routing = (sorted_ids, expert_of_block, padded_count, positions)
        x8, x_scales, *rows = rows if quantized else (None, None, *rows)
        h8, h_scales, *rows = rows if quantized_h else (None, None, *rows)
        counters, *rows = rows if single else (None, *rows)
        rows1, rows2 = rows or (None, None)
        w1_rows, w2_rows = w1.view(experts * 2 * inter, hidden), w2.view(experts * hidden, inter)
        if fp8 is None:
            scales1 = scales2 = topk_weights  # (16-bit weights: no scales; any tensor, unread)
        elif fp8 == "row":
            scales1 = w1_scale.view(-1) if rows1 is None else rows1
            scales2 = w2_scale.view(-1) if rows2 is None else rows2
        else:
            scales1, scales2 = w1_scale.view(-1, -(-hidden // BLOCK)), w2_scale.view(-1, -(-inter // BLOCK))
        if single:  # the output written directly, in one launch
            skinny_gemm_one_launch_kernel(
                x, w1_rows, h, w2_rows, out, routing[0], topk_ids, topk_weights, positions, scales1, scales2, counters,
                cfg1, cfgc, top_k, variant1,
            ).launch(grid=grid1, block=cfg1.threads)  # fmt: skip
            return None
        if fp8 is None:
            skinny_gemm_grouped_kernel(x, w1_rows, h, *routing, top_k, cfg1, variant1, mode1).launch(
                grid=grid1, block=cfg1.threads
            )
        else:
            if quantized:
                quantize_fp8(x, "token", out=x8, scales=x_scales)
                stage1 = skinny_gemm_grouped_scaled_kernel(
                    x8, w1_rows, h, *routing, scales1, x_scales.view(-1), top_k, cfg1, variant1, mode1
                )
            else:
                stage1 = skinny_gemm_grouped_fp8_kernel(x, w1_rows, h, *routing, scales1, top_k, cfg1, variant1, mode1)
            stage1.launch(grid=grid1, block=cfg1.threads)
        if combined:  # stage 2 and the combine: the output written directly
            skinny_gemm_combined_kernel(h, w2_rows, out, topk_ids, topk_weights, scales2, cfgc, top_k).launch(
                grid=gridc, block=cfgc.threads
            )
            return None
        if fp8 is None:
            skinny_gemm_grouped_kernel(h, w2_rows, y, *routing, 0, cfg2, variant2, mode2).launch(
                grid=grid2, block=cfg2.threads
            )
        elif quantized_h:  # (every row stage 1 may write: rows past padded_count are read by no one)
            quantize_fp8(h, "token", out=h8, scales=h_scales)
            skinny_gemm_grouped_scaled_kernel(
                h8, w2_rows, y, *routing, scales2, h_scales.view(-1), 0, cfg2, variant2, mode2
            ).launch(grid=grid2, block=cfg2.threads)
        else:
            skinny_gemm_grouped_fp8_kernel(h, w2_rows, y, *routing, scales2, 0, cfg2, variant2, mode2).launch(
                grid=grid2, block=cfg2.threads
            )
        return y

    return buffers, steps, shapes
