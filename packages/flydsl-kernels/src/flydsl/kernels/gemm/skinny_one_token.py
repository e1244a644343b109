"""One decode token's mixture-of-experts stages past a direct stage 1 (:mod:`~flydsl.kernels.gemm.skinny_grouped`'s
``GroupedMode(direct=True)``: each routed pair its own block of 16 rows, row 0 the token's), docs/tuning/moe.md#decode:

- :func:`skinny_gemm_combined_kernel`: stage 2 and the combine in one launch, a dependent of the stage-1 launch;
- :func:`skinny_gemm_one_launch_kernel`: stage 1, stage 2 and the combine in one launch, the stage-2 CTAs waiting on
  a counter of finished stage-1 CTAs instead of a kernel boundary (their first step of weights in flight meanwhile);

A combined CTA writes ``cols`` output columns of its token: warp j takes the routed pairs s = j, j + warps, ...,
each h's row of the pair times its expert's ``cols`` rows of the stacked (E * H, I) ``w2`` over all of I, rounded to
the output's dtype as y would be; then the pairs are summed in slot order with their weights, ids outside
``[0, E)`` skipped: the arithmetic of ``moe.experts.combine_kernel``, so the output is the same bits as separate
launches'.
"""

from __future__ import annotations

import dataclasses

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, gpu, nvvm
from flydsl.kernels.gemm.skinny import SkinnyConfig, _kernel_start, _landed, _loads, _WarpStreams, _wide
from flydsl.kernels.gemm.skinny_grouped import (
    GROUPED_BLOCK,
    GroupedMode,
    Routing,
    _mainloop,
    choose_grouped_skinny_config,
    grouped_stage,
    grouped_tile,
)

__all__ = [
    "choose_combined_config",
    "choose_one_launch_configs",
    "skinny_gemm_combined_kernel",
    "skinny_gemm_one_launch_kernel",
]


@flyc.kernel(dependent_launch=True)
def skinny_gemm_combined_kernel(
    h: fx.Tensor,
    w: fx.Tensor,
    out: fx.Tensor,
    topk_ids: fx.Tensor,
    topk_weights: fx.Tensor,
    w_scale: fx.Tensor,
    cfg: fx.Constexpr,
    top_k: fx.Constexpr[int],
):
    """Stage 2 and the combine of decode tokens in one launch, after a direct stage 1: CTA (x, t) writes output
    columns ``[x * cols, (x + 1) * cols)`` of token t (cols = ``cfg.rows``), h's row of pair s at ``(t * top_k + s)
    * 16`` (where the direct stage 1 leaves it). ``topk_ids`` (T, top_k) ints, ``topk_weights`` (T, top_k) floats,
    ``out`` (T, H). fp8 weights (weight-only, as ``skinny_gemm_grouped_fp8_kernel``): ``w_scale`` float32 (E * H,)
    per row or (E * H / 128, ceil(I / 128)) per 128 x 128 block; 16-bit weights: ``w_scale`` unread. ``cfg``: one
    column of warps (``warps_n`` 1), no split (:func:`choose_combined_config`)."""
    _check_combined(h, w, cfg, "skinny_gemm_combined_kernel")
    # Launched by a direct stage 1 only after that stage's own wait: topk_ids, written before it, is complete here,
    # so the experts and their weights are read before this kernel's wait, during stage 1's last CTAs; only h is
    # stage 1's.
    thread = _kernel_start(cfg)
    token, x = gpu.block_idx.y.to(fx.Int32), gpu.block_idx.x.to(fx.Int32)
    wait = lambda words: nvvm.griddepcontrol_wait(after=words)  # noqa: E731
    _combined_tile(h, w, out, topk_ids, topk_weights, w_scale, cfg, top_k, thread, token, x, wait, False)


@flyc.kernel(dependent_launch=True)
def skinny_gemm_one_launch_kernel(
    x: fx.Tensor,
    w1: fx.Tensor,
    h: fx.Tensor,
    w2: fx.Tensor,
    out: fx.Tensor,
    pairs: fx.Tensor,
    topk_ids: fx.Tensor,
    topk_weights: fx.Tensor,
    positions: fx.Tensor,
    w1_scale: fx.Tensor,
    w2_scale: fx.Tensor,
    counters: fx.Tensor,
    cfg1: fx.Constexpr,
    cfg2: fx.Constexpr,
    top_k: fx.Constexpr[int],
    variant: fx.Constexpr,
):
    """One token's stages in one launch (1-D grid of ``tiles1 + tiles2`` CTAs, :func:`choose_one_launch_configs`).
    CTAs ``[0, tiles1)`` are the direct stage 1's: CTA b takes column tile ``b % (tiles1 / top_k)`` of routed pair
    ``b // (tiles1 / top_k)`` (x (1, H) times w1 (E * 2I, H) into h (top_k * 16, I); ``pairs`` the flat ids, as the
    direct stage 1 takes them; ``positions`` as it notes them), then counts itself on ``counters[0]`` (release,
    after its CTA's stores). CTAs from ``tiles1`` on are :func:`skinny_gemm_combined_kernel`'s tiles of the token:
    each issues its first step of w2, waits until the count reaches ``tiles1`` (acquire) and reads h through L2
    (written in this launch); the last to finish (``counters[1]``) zeroes both counters for the next launch (a held
    pair of int32 zeros). CTAs start in index order, so every stage-1 CTA has started before any stage-2 CTA waits:
    the wait always ends. fp8 weights (weight-only): ``w1_scale`` and ``w2_scale`` as the two kernels take them;
    16-bit: unread. ``variant``: stage 1's ``SkinnyVariant`` (a gate)."""
    if cfg1.threads != cfg2.threads or cfg1.warps_n != 1:
        raise ValueError(
            f"skinny_gemm_one_launch_kernel: expected the stages' threads alike, one column: {cfg1}, {cfg2}"
        )
    _check_combined(h, w2, cfg2, "skinny_gemm_one_launch_kernel")
    fp8 = w1.dtype.width == 8
    thread = _kernel_start(dataclasses.replace(cfg1, min_blocks=cfg2.min_blocks or cfg1.min_blocks))
    after_wait = nvvm.griddepcontrol_wait()  # (x and the routing are the previous kernels')
    tid = thread[0]
    cols1 = cfg1.rows // 2
    columns1 = (h.shape[1].to(fx.Int32) + (cols1 - 1)) // cols1
    tiles1 = columns1 * top_k
    tiles2 = (out.shape[1].to(fx.Int32) + (cfg2.rows - 1)) // cfg2.rows
    b = gpu.block_idx.x.to(fx.Int32) + after_wait
    if b < tiles1:
        routing = Routing(pairs, pairs, pairs, top_k)
        w_scale = w1_scale if fp8 else None
        stage = grouped_stage(x, w1, h, routing, positions, w_scale, cfg1, variant, GroupedMode(direct=True), thread)
        grouped_tile(stage, b // columns1, b % columns1)
        gpu.barrier()  # (the CTA's h stores before its count)
        if tid == 0:
            nvvm.red_add_release(counters, 1, 0)
    else:
        wait = lambda words: _wait_for_count(counters, tiles1, words, tid)  # noqa: E731
        token = fx.Int32(0)
        _combined_tile(h, w2, out, topk_ids, topk_weights, w2_scale, cfg2, top_k, thread, token, b - tiles1, wait, True)
        if tid == 0:
            if nvvm.atom_add_acq_rel(counters, 1, 1) == tiles2 - 1:  # the last: every other has read counters[0]
                counters[0] = 0
                counters[1] = 0


def _wait_for_count(counters, target, words, tid):
    """Thread 0 spins until ``counters[0]`` reaches ``target`` (acquire), then, after the CTA's barrier, every thread
    reads it once more (acquire: the count is complete by then) and returns a zero that depends on what it read, for
    h's rows: h's loads (inline PTX without side effects, which the compiler may otherwise move above the barrier)
    then follow the count. ``words`` (a word of each load issued before) feed the flag's address as a zero
    (:func:`~flydsl.kernels.gemm.skinny._landed`), so those loads are in flight before the first read of the flag."""
    zero = _landed(fx.Int32(0), words) if words else fx.Int32(0)
    if tid == 0:
        seen = nvvm.ld_acquire(counters, zero)
        while seen < target:
            seen = nvvm.ld_acquire(counters, zero)
    gpu.barrier()
    return _landed(zero, [nvvm.ld_acquire(counters, zero)])


def _check_combined(h, w, cfg, who: str) -> None:
    """The combined tiles' configuration (``cfg``: one column of warps, no split K) and operands, for kernel ``who``."""
    if cfg.warps_n != 1 or cfg.splits != 1:
        raise ValueError(f"{who}: expected one column of warps and no split K: {cfg}")
    if w.dtype.width == 8 and not _wide(h, w):
        raise ValueError(f"{who}: fp8 weights take 16-bit activations")


def _combined_tile(h, w, out, topk_ids, topk_weights, w_scale, cfg, top_k, thread, token, x, wait, coherent) -> None:
    """Output columns ``[x * cols, (x + 1) * cols)`` of token ``token`` (the module docstring): the pairs' experts
    and first step of fp8 weights read, then ``wait(words)`` (a word of each load issued: returns a zero that h's
    rows depend on), then the pairs' sums over I and the combine. ``coherent``: h is written in this launch."""
    fp8 = _wide(h, w)
    row_scales = fp8 and fx.rank(w_scale.shape) == 1
    tid, _warp_n, warp, _lane, lane_t, lane_q = thread  # (one column of warps: warp along K = warp)
    n_out, k_extent = out.shape[1].to(fx.Int32), h.shape[1].to(fx.Int32)
    experts = w.shape[0].to(fx.Int32) // n_out
    cols = cfg.rows
    n0 = x * cols
    rows = fx.SmemAllocator().allocate(fx.Float32, fl.Layout((top_k, cols), (cols, 1)))  # (pair, column) as y
    element_bytes = w.dtype.width // 8
    step = 4 * (16 // element_bytes) * cfg.unroll  # a warp's K per step: each warp takes all of I
    columns = [(g, e, g * 8 + 2 * lane_t + e) for g in range(cfg.groups) for e in range(2)]
    block_scales = w_scale if fp8 and not row_scales else None
    pairs = []
    for j in fx.range_constexpr(-(-top_k // cfg.warps)):
        slot = warp + j * cfg.warps
        expert = _routed_expert(topk_ids, token, arith.minimum(slot, top_k - 1))
        base = arith.minimum(arith.maximum(expert, 0), experts - 1) * n_out  # (clamped: loads of a skipped slot)
        rows_w = [base + arith.minimum(n0 + g * 8 + lane_q, n_out - 1) for g in range(cfg.groups)]
        streams = _WarpStreams(
            h, w, rows_w, None, None, k_extent, cfg, lane_t, True, True, False, block_scales, coherent
        )
        # fp8: the first step's weights (masked: any I), in flight during the wait (16-bit steps load h as well)
        first = _loads(streams, 0, True) if fp8 else None
        scales = [w_scale[base + arith.minimum(n0 + col, n_out - 1)] for _g, _e, col in columns if row_scales]
        pairs.append((slot, expert, streams, first, scales))
    after_wait = wait([words[0] for pair in pairs for words in pair[3] or ()])
    routed = _routing(topk_ids, topk_weights, token, top_k, experts)
    for slot, expert, streams, first, scales in pairs:
        if (slot < top_k) & (expert >= 0) & (expert < experts):
            row_a = (token * top_k + slot) * GROUPED_BLOCK + after_wait  # every lane: the pair's one row
            pair = streams._replace(row_a0=row_a, row_a1=row_a)
            accs = _mainloop(pair, step, 0, fp8 and not row_scales, first)
            if lane_q == 0:  # row 0 of the MMAs: lanes 0..3, elements 0 and 1 of each n8 tile
                for i, (g, e, col) in enumerate(columns):
                    total = accs[g][e] * scales[i] if row_scales else accs[g][e]
                    rows[slot, col] = total.to(out.dtype).to(fx.Float32)
    gpu.barrier()
    _combine(rows, routed, out, token, n0, n_out, cols, tid)


def _routing(topk_ids, topk_weights, token, top_k: int, experts) -> list:
    """The combine's routing of token ``token``: per slot (its id is an expert's, its weight), read by the threads
    that combine before the mainloop, so that no round trip follows it."""
    routed = []
    for slot in fx.range_constexpr(top_k):
        expert = topk_ids[token, slot].to(fx.Int32)
        routed.append(((expert >= 0) & (expert < experts), topk_weights[token, slot].to(fx.Float32)))
    return routed


def _combine(rows, routed, out, token, n0, n_out, cols: int, tid) -> None:
    """Thread c < cols writes output column n0 + c of token ``token``: the pairs' rounded rows ``rows[slot, c]``
    summed in slot order with their weights (after the CTA's barrier)."""
    if (tid < cols) & (n0 + tid < n_out):
        total = fx.Float32(0.0)
        for slot, (kept, weight) in enumerate(routed):
            # selected, not multiplied by a zero weight: an unwritten row may hold NaNs
            total = arith.select(kept, total + weight * rows[slot, tid], total)
        out[token.to(fx.Int64), n0 + tid] = total.to(out.dtype)


def _routed_expert(topk_ids, token, slot):
    """``topk_ids[token, slot]`` as an Int32 (int32 or int64 ids: the low word), read through L2 (``ld.global.cg``:
    no L1 line of an earlier routing in this buffer), for a read before the kernel's wait."""
    words = nvvm.ld_global(topk_ids, (token, slot), topk_ids.dtype.width // 8, cop="cg")  # (through its strides)
    return words[0]


def choose_combined_config(top_k: int, element_bytes: int = 2, inter: int = 0) -> SkinnyConfig:
    """:func:`skinny_gemm_combined_kernel`'s: a warp per routed pair (at most 16), 8 output columns per CTA (one n8 tile
    per warp), 4 loads per row and step, double-buffered; fp8 held to 128 registers per thread like the grouped fp8
    kernels, each step's activations landed before its MMAs (``landed``: 103-122 registers), docs/tuning/moe.md#decode.
    The best of 6 (groups, unroll) shapes for fp8 on the H100 (Qwen3 11.8 us against 12.6 with 2 tiles per warp,
    DeepSeek-V3 TP8 15.1 against 15.4), for bf16 within 1% of 2 tiles (6% of the best;
    ``moe_decode_sweep/2026-12-06_c0e0ade_h100.json``). fp8 with ``inter`` (I) at most 256 (DeepSeek-V3 TP8: a warp's I
    in one step of 4 loads, 896 CTAs of 8 columns) as 2 tiles per warp x 2 loads (half the CTAs, two steps): 12.9 us
    against 14.5 on the H200 (``moe_decode_sweep/2026-12-06_57ddf7e_one_token.json``), 14.6 against 15.1 on an H100
    (``..._9e02a6f_one_token_h100.json``); block scales 13.5 against 15.1 (H100 15.4 against 16.0)."""
    if element_bytes not in (1, 2):
        raise ValueError(f"choose_combined_config: element_bytes must be 1 (fp8) or 2, got {element_bytes}")
    warps = min(16, 1 << max(top_k - 1, 0).bit_length())
    fp8 = element_bytes == 1
    groups, unroll = (2, 2) if fp8 and 0 < inter <= 256 else (1, 4)
    return SkinnyConfig(
        groups=groups, warps=warps, unroll=unroll, min_blocks=65536 // (128 * 32 * warps) if fp8 else None, landed=fp8
    )


def choose_one_launch_configs(hidden: int, top_k: int, element_bytes: int = 2) -> tuple[SkinnyConfig, SkinnyConfig]:
    """:func:`skinny_gemm_one_launch_kernel`'s (stage 1, stage 2 and combine) configurations: the direct stage 1's
    and the combined kernel's with as many warps (the CTAs of one launch have one size; a warp takes two routed
    pairs where top_k exceeds them), at the combined kernel's registers per thread where it caps them (fp8: 128)."""
    cfg1 = choose_grouped_skinny_config(hidden, True, element_bytes, direct=True)
    cfg2 = choose_combined_config(top_k, element_bytes)
    min_blocks = 65536 // (128 * cfg1.threads) if cfg2.min_blocks else None
    return cfg1, dataclasses.replace(cfg2, warps=cfg1.warps, min_blocks=min_blocks)
