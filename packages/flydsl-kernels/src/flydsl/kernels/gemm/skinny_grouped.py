"""The grouped skinny GEMM: a mixture of experts' decode stages, built from :mod:`~flydsl.kernels.gemm.skinny`'s
weight loads, MMAs and K-warp sum (see its docstring for the fragment layout).

Rows come in the aligned order of :func:`flydsl.kernels.moe.align_tokens` (blocks of 16 rows of one expert); a CTA
streams a slice of its block's expert's weight rows. On fp8 weights (:func:`skinny_gemm_grouped_fp8_kernel`:
weight-only, 16-bit activations) each 16-byte weight load holds 16 values of K (lane t: ``16t .. 16t + 15`` of a
chunk of 64), converted exactly to 16-bit in registers and paired with two 16-byte loads of each activation row (the
same 16 values), fed to the 16-bit m16n8k16 MMAs.

For one decode token, :class:`GroupedMode`'s ``direct`` takes the routed pairs as the blocks (no alignment kernel
before the stage); :mod:`~flydsl.kernels.gemm.skinny_one_token` takes one token's stage 2 and combine from there
(docs/tuning/moe.md#decode).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, gpu, nvvm
from flydsl.kernels.gemm.epilogue import Epilogue, EpilogueTensors, apply_epilogue
from flydsl.kernels.gemm.skinny import (
    _ACC,
    SkinnyConfig,
    _kernel_start,
    _loads,
    _mmas,
    _mmas_wide,
    _warp_partials,
    _warp_total,
    _WarpStreams,
    _wide,
)

__all__ = [
    "GROUPED_BLOCK",
    "GroupedMode",
    "Routing",
    "choose_grouped_skinny_config",
    "grouped_stage",
    "grouped_tile",
    "skinny_gemm_grouped_fp8_kernel",
    "skinny_gemm_grouped_kernel",
    "skinny_gemm_grouped_scaled_kernel",
]

GROUPED_BLOCK = 16  # the aligned order's row block: one m16n8k16 MMA's rows


class GroupedMode(NamedTuple):
    """How a grouped kernel takes its rows (a Constexpr of the kernels; the default: the aligned order).

    ``direct``: no alignment. Block y is routed pair y: ``expert_of_block`` is the flat ``topk_ids`` (T * k,), the
    block's row 0 its token (row ``y // top_k`` of x) and rows 1..15 pads reading row 0, ``sorted_ids`` and
    ``padded_count`` unread; blocks whose id is outside ``[0, E)`` are skipped (their rows never written, as the
    combine expects). For one token, whose top-k experts are distinct: the same weights read as with alignment, and
    no alignment kernel before stage 1. Stage 2 takes the same mode (rows are the positions ``16 y ..``)."""

    direct: bool = False


class Routing(NamedTuple):
    """The rows a grouped skinny GEMM takes, from ``flydsl.kernels.moe.align_tokens`` in blocks of 16: ``sorted_ids``,
    ``expert_of_block`` and ``padded_count`` (kernel tensors) and ``top_k`` (an Int32: rows of A by index,
    ``sorted_ids[p] // top_k``; 0: A's rows are the aligned positions themselves)."""

    sorted_ids: object
    expert_of_block: object
    padded_count: object
    top_k: object


@flyc.kernel(dependent_launch=True)
def skinny_gemm_grouped_kernel(
    a: fx.Tensor,
    w: fx.Tensor,
    c: fx.Tensor,
    sorted_ids: fx.Tensor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    positions: fx.Tensor,
    top_k: fx.Int32,
    cfg: fx.Constexpr,
    variant: fx.Constexpr,
    mode: fx.Constexpr,
):
    """A mixture of experts' GEMM at decode sizes, streaming each routed expert's weights once per block of 16 rows:
    CTA (x, y) takes block y of the aligned order (:class:`Routing`; none past ``padded_count[0]``: the CTA returns)
    and output columns ``[x * cols, (x + 1) * cols)``. ``a``: x (T, K) with rows by index (``top_k`` > 0; the
    sentinel reads row 0, its results land in pad rows) or (capacity, K) in the aligned order (``top_k`` 0; pad
    rows read their block's first row: lines a routed row's lanes load anyway); ``w``
    the stacked experts' (E * N, K) weights, K contiguous; ``c`` (capacity, N_out). ``variant.epilogue``: none, or a
    ``gate``: the CTA's first half of weight rows are gate rows, the second half the up rows I = N_out further, and
    C gets ``gate(x @ gate.T) * (x @ up.T)`` (cols = rows / 2). 16-bit operands (fp8 weights:
    :func:`skinny_gemm_grouped_fp8_kernel`), 16-byte loads, no split K. Rows by index also note where each (token,
    slot) pair went, as the gather does: ``positions[sorted_ids[p]] = p`` (int32 (T * k,): its extent is the
    pad rows' sentinel; unwritten where ``top_k`` is 0). ``mode``: a :class:`GroupedMode`."""
    if variant.epilogue.scales:
        raise ValueError(f"skinny_gemm_grouped_kernel: expected no scales: {variant}")
    routing = Routing(sorted_ids, expert_of_block, padded_count, top_k)
    _grouped_skinny_gemm(a, w, c, routing, positions, None, cfg, variant, mode)


@flyc.kernel(dependent_launch=True)
def skinny_gemm_grouped_fp8_kernel(
    a: fx.Tensor,
    w: fx.Tensor,
    c: fx.Tensor,
    sorted_ids: fx.Tensor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    positions: fx.Tensor,
    w_scale: fx.Tensor,
    top_k: fx.Int32,
    cfg: fx.Constexpr,
    variant: fx.Constexpr,
    mode: fx.Constexpr,
):
    """:func:`skinny_gemm_grouped_kernel` on fp8 weights (weight-only: ``w`` e4m3, ``a`` and ``c`` bf16 or fp16, K a
    multiple of 16). Each 16-byte load of ``w`` holds 16 e4m3 values, converted exactly to ``a``'s type in registers
    and fed to the 16-bit m16n8k16 MMAs beside two loads of ``a``'s row (the same 16 values of K), so that a load of
    weights carries twice the K of a 16-bit one. ``w_scale`` float32: (E * N,) one per row of the stacked weights
    (loaded before the mainloop, applied in the epilogue: the gate and the up rows each their own, before the gate; a
    per-tensor scale is expanded to rows by the caller), or (E * N / 128, ceil(K / 128)) one per 128 x 128 block of
    the stacked weights (N a multiple of 128: each expert's blocks its own), each K block's sums multiplied by its
    scale in the mainloop (one fp32 multiply-add per accumulator and block). ``variant.epilogue``: none or a gate,
    no scales (the kernel's own)."""
    if variant.epilogue.scales:
        raise ValueError(f"skinny_gemm_grouped_fp8_kernel: expected no epilogue scales (w_scale's own): {variant}")
    routing = Routing(sorted_ids, expert_of_block, padded_count, top_k)
    _grouped_skinny_gemm(a, w, c, routing, positions, w_scale, cfg, variant, mode)


@flyc.kernel(dependent_launch=True, target=flyc.Target("sm_90a", ptx_version=84))  # PTX ISA 8.4: mma.sync on fp8
def skinny_gemm_grouped_scaled_kernel(
    a: fx.Tensor,
    w: fx.Tensor,
    c: fx.Tensor,
    sorted_ids: fx.Tensor,
    expert_of_block: fx.Tensor,
    padded_count: fx.Tensor,
    positions: fx.Tensor,
    w_scale: fx.Tensor,
    a_scale: fx.Tensor,
    top_k: fx.Int32,
    cfg: fx.Constexpr,
    variant: fx.Constexpr,
    mode: fx.Constexpr,
):
    """:func:`skinny_gemm_grouped_kernel` on fp8 activations and weights (W8A8: ``a`` and ``w`` e4m3, K a multiple of
    16; ``c`` 16-bit): each 16-byte load of either holds 16 values of K, the fragments of m16n8k32 MMAs as the dense
    :func:`~flydsl.kernels.gemm.skinny.skinny_gemm_scaled_kernel` takes them, so a step moves half the activation
    bytes of the weight-only kernel and converts nothing. Float32 scales per row of each, applied in the epilogue
    (gated: to the gate and up sums before the gate): ``w_scale`` (E * N,) one per row of the stacked weights,
    ``a_scale`` one per row of ``a`` (its token's, as ``quantize_fp8(x, "token")`` gives them, viewed 1-D)."""
    if variant.epilogue.scales:
        raise ValueError(f"skinny_gemm_grouped_scaled_kernel: expected no epilogue scales (its own): {variant}")
    routing = Routing(sorted_ids, expert_of_block, padded_count, top_k)
    _grouped_skinny_gemm(a, w, c, routing, positions, w_scale, cfg, variant, mode, a_scale)


def _grouped_skinny_gemm(
    a, w, c, routing: Routing, positions, w_scale, cfg: SkinnyConfig, variant, mode: GroupedMode, a_scale=None
) -> None:
    """The grouped kernels' body (:func:`skinny_gemm_grouped_kernel`): CTA (x, y) is tile x of block y."""
    if not isinstance(mode, GroupedMode):
        raise TypeError(f"grouped skinny kernel: mode must be a GroupedMode, got {mode!r}")
    thread = _kernel_start(cfg, trigger=not mode.direct)
    # The routing and (stage 2) A are the previous kernels' outputs: nothing is read before the wait, and every
    # load's row depends on its zero (loads through inline PTX could move above it otherwise).
    after_wait = nvvm.griddepcontrol_wait()
    if fx.const_expr(mode.direct):  # the next launch (the combined kernel) reads the routing before its own wait
        nvvm.griddepcontrol_launch_dependents()
    stage = grouped_stage(a, w, c, routing, positions, w_scale, cfg, variant, mode, thread, a_scale)
    grouped_tile(stage, gpu.block_idx.y.to(fx.Int32) + after_wait, gpu.block_idx.x.to(fx.Int32))


def grouped_stage(
    a, w, c, routing: Routing, positions, w_scale, cfg: SkinnyConfig, variant, mode: GroupedMode, thread, a_scale=None
):
    """What the tiles of a grouped stage share (a :class:`_Stage`), its arguments checked. The weights' format:
    16-bit (``w_scale`` None), or fp8 with ``w_scale`` per row (1-D) or per 128 x 128 block (2-D)
    (:func:`skinny_gemm_grouped_fp8_kernel`); with ``a_scale`` (per row of ``a``), fp8 activations too
    (:func:`skinny_gemm_grouped_scaled_kernel`). ``thread``: :func:`~flydsl.kernels.gemm.skinny._kernel_start`'s."""
    epilogue, gate = variant.epilogue, variant.epilogue.gate
    if epilogue.bias or epilogue.activation or cfg.splits != 1 or not variant.vector_loads:
        raise ValueError(f"grouped skinny kernel: expected no bias, activation or split K, 16-byte loads: {variant}")
    fp8 = w_scale is not None
    if a_scale is not None:
        if a.dtype != w.dtype or w.dtype.width != 8 or c.dtype.width != 16:
            raise ValueError(f"grouped scaled kernel: expected fp8 a and w of one dtype, 16-bit c: {variant}")
        if fx.rank(w_scale.shape) != 1 or fx.rank(a_scale.shape) != 1:
            raise ValueError("grouped scaled kernel: expected 1-D scales, one per row of w and of a")
    elif fp8 and (not _wide(a, w) or a.dtype != c.dtype or fx.rank(w_scale.shape) not in (1, 2)):
        raise ValueError(f"grouped fp8 kernel: expected fp8 weights, 16-bit a and c, 1-D or 2-D scales: {variant}")
    gated = gate is not None
    n_out = c.shape[1].to(fx.Int32)
    return _Stage(
        a, w, c, routing, positions, w_scale, a_scale, cfg, mode, gate, thread, n_out,
        n_out * 2 if gated else n_out,  # the expert's rows of w
        cfg.rows // 2 if gated else cfg.rows,  # output columns per tile
        positions.shape.to(fx.Int32),  # T * k, the sentinel of pad rows (a 1-D shape: its extent)
    )  # fmt: skip


def grouped_tile(stage, block, x) -> None:
    """Tile ``x`` (output columns ``x * cols ..``) of block ``block`` of a grouped stage (:func:`grouped_stage`):
    nothing where the block holds no routed row (past ``padded_count``; direct: a pair this call does not serve)."""
    routing, cfg, w = stage.routing, stage.cfg, stage.w
    if fx.const_expr(stage.mode.direct):  # block y: routed pair y, whose expert may be one this call does not hold
        expert = routing.expert_of_block[arith.minimum(block, stage.pairs - 1)].to(fx.Int32)
        routed = (block < stage.pairs) & (expert >= 0) & (expert < w.shape[0].to(fx.Int32) // stage.per_expert)
    else:
        routed = block * GROUPED_BLOCK < routing.padded_count[0]
    if routed:
        if fx.const_expr(not stage.mode.direct):
            expert = routing.expert_of_block[block].to(fx.Int32)
        streams = _tile_streams(stage, block, x, expert)
        scales = _row_scales(stage, block, x, expert)  # (before the mainloop: their round trip beside the weights')
        step = cfg.k_step(w.dtype.width // 8)
        accs = _mainloop(streams, step, stage.thread[2] * (step // cfg.warps_k), stage.block_scaled)
        _store_tile(stage, accs, block, x, scales)


class _Stage(NamedTuple):
    """What every tile of a grouped kernel's launch shares: its tensors (``a_scale``: fp8 activations' per-row
    scales, or None), configuration and mode, the gate (or None),
    the thread's coordinates (:func:`~flydsl.kernels.gemm.skinny._kernel_start`), N_out, the expert's rows of w,
    output columns per tile and T * k (the pad rows' sentinel)."""

    a: object
    w: object
    c: object
    routing: Routing
    positions: object
    w_scale: object
    a_scale: object
    cfg: SkinnyConfig
    mode: GroupedMode
    gate: object
    thread: tuple
    n_out: object
    per_expert: object
    cols: int
    pairs: object

    @property
    def row_scales(self) -> bool:
        return self.w_scale is not None and fx.rank(self.w_scale.shape) == 1

    @property
    def block_scaled(self) -> bool:
        return self.w_scale is not None and fx.rank(self.w_scale.shape) == 2


def _tile_streams(stage: _Stage, block, x, expert) -> _WarpStreams:
    """The warp's loads of the tile (block ``block`` of the aligned order, output columns ``x * cols ..``) of expert
    ``expert``: its weight rows (gated: the first half of the tile's rows gate rows, the second half the up rows
    N_out further, each clamped into the expert's) and the block's activation rows."""
    cfg, n_out, cols = stage.cfg, stage.n_out, stage.cols
    _tid, warp_n, _warp_kk, _lane, lane_t, lane_q = stage.thread
    n0 = x * cols
    base = expert * stage.per_expert
    rows_w = []
    for g in fx.range_constexpr(cfg.groups):
        col = (warp_n * cfg.groups + g) * 8 + lane_q  # this lane's weight row among the tile's
        if fx.const_expr(stage.gate is not None):  # the first half gate rows n0.., the second the up rows n0 + I..
            up = col >= cols
            within = arith.minimum(n0 + arith.select(up, col - cols, col), n_out - 1)
            rows_w.append(base + arith.select(up, within + n_out, within))
        else:
            rows_w.append(base + arith.minimum(n0 + col, n_out - 1))
    first = block * GROUPED_BLOCK
    rows_a = [_grouped_row(stage.routing, stage.mode, first + lane_q + 8 * h, stage.pairs) for h in range(2)]
    block_scales = stage.w_scale if stage.block_scaled else None
    k_extent = stage.a.shape[1].to(fx.Int32)
    return _WarpStreams(stage.a, stage.w, rows_w, *rows_a, k_extent, cfg, lane_t, True, True, False, block_scales)


def _tile_elements(stage: _Stage):
    """The (16 x cols) output elements of a tile that each thread stores, in turns of the CTA's threads: per turn
    ``(index, row, col)``, the index clamped into the tile (the store checks ``index`` itself)."""
    cfg, cols, tid = stage.cfg, stage.cols, stage.thread[0]
    for rep in range(-(-GROUPED_BLOCK * cols // cfg.threads)):
        index = tid + rep * cfg.threads
        clamped = arith.minimum(index, GROUPED_BLOCK * cols - 1)
        yield index, clamped // cols, clamped % cols


def _row_scales(stage: _Stage, block, x, expert) -> list:
    """fp8 per-row weight scales of the thread's output elements (:func:`_tile_elements`): per turn the plain (or
    gate) row's scale, gated the up row's (else None), clamped as the loads' rows are, and with fp8 activations the
    scale of the element's row of ``a`` (else None); [] otherwise. Loaded before the mainloop, so that a CTA's last
    round trip to memory is not the scales' (a decode tile lives a few microseconds)."""
    if fx.const_expr(not stage.row_scales):
        return []
    base, n_out, gated = expert * stage.per_expert, stage.n_out, stage.gate is not None
    first, quantized = block * GROUPED_BLOCK, stage.a_scale is not None
    scales = []
    for _index, row, col in _tile_elements(stage):
        b_row = base + arith.minimum(x * stage.cols + col, n_out - 1)
        up = stage.w_scale[b_row + n_out] if gated else None
        a_row = _grouped_row(stage.routing, stage.mode, first + row, stage.pairs) if quantized else None
        scales.append((stage.w_scale[b_row], up, stage.a_scale[a_row] if quantized else None))
    return scales


def _store_tile(stage: _Stage, accs, block, x, scales) -> None:
    """The tile's sums over its K-warps (through shared memory), its epilogue (fp8 row ``scales`` from
    :func:`_row_scales`, the gate) and its stores; stage 1's tiles of the first columns also note where each routed
    pair went (``positions``)."""
    c, cfg, routing, n_out, cols = stage.c, stage.cfg, stage.routing, stage.n_out, stage.cols
    tid, warp_n, warp_kk, lane, _lane_t, _lane_q = stage.thread
    first, n0 = block * GROUPED_BLOCK, x * cols
    if (routing.top_k > 0) & (x == 0) & (tid < GROUPED_BLOCK):
        flat = _sorted_id(routing, stage.mode, first + tid, stage.pairs)
        if flat < stage.pairs:
            stage.positions[flat] = first + tid
    partial = _warp_partials(accs, cfg, warp_kk, warp_n, lane)
    gated = stage.gate is not None
    activation = Epilogue(activation=stage.gate) if gated else None
    for turn, (index, row, col) in enumerate(_tile_elements(stage)):
        out_col = n0 + col
        total = _warp_total(partial, cfg, row, col)
        w_scale, w_up_scale, a_scale = scales[turn] if scales else (None, None, None)
        if fx.const_expr(bool(scales)):
            total = total * w_scale if a_scale is None else total * w_scale * a_scale
        if fx.const_expr(gated):
            total = apply_epilogue(total, activation, EpilogueTensors(), row, col)
            up = _warp_total(partial, cfg, row, col + cols)
            if fx.const_expr(bool(scales)):
                up = up * w_up_scale if a_scale is None else up * w_up_scale * a_scale
            total = total * up
        if (index < GROUPED_BLOCK * cols) & (out_col < n_out):
            c[(first + row).to(fx.Int64), out_col] = total.to(c.dtype)


def _mmas_of(streams: _WarpStreams, words, accs, kbase, masked: bool, block_scaled: bool):
    """One step's MMAs on its loaded ``words``: 16-bit weights' (:func:`~flydsl.kernels.gemm.skinny._mmas`), or fp8
    weights' with the activations loaded as they go (:func:`~flydsl.kernels.gemm.skinny._mmas_wide`;
    ``block_scaled``: each K block's sums times its scale)."""
    if fx.const_expr(_wide(streams.a, streams.w)):
        return _mmas_wide(words, accs, streams, kbase, masked, streams.a.dtype, block_scaled)
    return _mmas(words, accs, streams.cfg, streams.a.dtype)


def _mainloop(streams: _WarpStreams, step: int, warp_k, block_scaled: bool, first=None) -> list:
    """A warp's sums over K: steps of ``step`` K values (the CTA's; this warp's from ``warp_k`` within each), the
    next step's loads issued before this step's MMAs, then the step with the K tail, masked. fp8 weights (16-bit
    activations) go through :func:`~flydsl.kernels.gemm.skinny._mmas_wide` (``block_scaled``: each K block's sums
    times its scale). ``first``: the first step's weight loads (masked), issued by the caller (unused where K is
    shorter than a step)."""
    cfg, k_extent = streams.cfg, streams.k_extent
    full = k_extent // step
    accs = [_ACC(0.0)] * cfg.groups

    def mmas(words, accs, kbase, masked):  # (fp8: the activations loaded as the MMAs take them)
        return _mmas_of(streams, words, accs, kbase, masked, block_scaled)

    if full > 0:
        words = _loads(streams, warp_k, False) if first is None else first
        for it in range(1, full):
            upcoming = _loads(streams, it * step + warp_k, False)
            accs = mmas(words, accs, (it - 1) * step + warp_k, False)
            words = upcoming
        accs = mmas(words, accs, (full - 1) * step + warp_k, False)
    if full * step < k_extent:  # the step with the K tail
        accs = mmas(_loads(streams, full * step + warp_k, True), accs, full * step + warp_k, True)
    return accs


def _sorted_id(routing: Routing, mode: GroupedMode, position, pairs):
    """The routed pair at aligned position ``position``: ``sorted_ids[position]``, or (``mode.direct``) the block's
    pair at its row 0 and the sentinel ``pairs`` (T * k) at its pad rows."""
    if fx.const_expr(mode.direct):
        return arith.select(position % GROUPED_BLOCK == 0, position // GROUPED_BLOCK, pairs)
    return routing.sorted_ids[position].to(fx.Int32)


def _grouped_row(routing: Routing, mode: GroupedMode, position, pairs):
    """The row of ``a`` that aligned position ``position`` multiplies: ``sorted_ids[position] // top_k`` (a pad's
    sentinel, ``pairs`` = T * k or more: row 0), or, where ``top_k`` is 0, the position itself, a pad's the block's
    first (a routed pair's: pad lanes then load the lines that lane already loads, not rows of their own)."""
    flat = _sorted_id(routing, mode, position, pairs)
    routed = flat < pairs
    by_index = arith.select(routed, flat // arith.maximum(routing.top_k, 1), fx.Int32(0))
    in_order = arith.select(routed, position, position - position % GROUPED_BLOCK)
    return arith.select(routing.top_k > 0, by_index, in_order)


def choose_grouped_skinny_config(
    k: int,
    gated: bool,
    element_bytes: int = 2,
    direct: bool = False,
    block: bool = False,
    quantized: bool = False,
    n_out: int = 0,
) -> SkinnyConfig:
    """Short K (at most 1024: a stage 2's intermediate size) in steps of 128 over two columns of 2 warps, 32 weight
    rows each; longer K (and every gated stage 1: one gate and one up n8 tile per warp) as the skinny kernel's default
    (docs/tuning/moe.md#decode).

    fp8 weights (``element_bytes`` 1: :func:`skinny_gemm_grouped_fp8_kernel`, ``k`` in values): a stage 1 of more than
    one token as 4 n8 tiles x 4 loads over 4 warps (steps of 1024 values of K), no register cap: against 2 x 2 over 8
    warps, Qwen3 at T 16 and 64 103 / 151 us against 121 / 184, DeepSeek-V3 TP8 153 / 303 against 151 / 314 (H100,
    ``moe_decode_sweep/2026-12-06_c0e0ade_h100.json``); block-scaled ones (``block``: 4 tiles' accumulators besides the
    K block's spill at 4 loads) as 4 n8 tiles x 2 loads over 4 warps (162 registers): Qwen3 at T 16 / 64 103.4 / 154.4
    us against 126.5 / 192.1 for 2 x 2 over 8 warps, DeepSeek-V3 TP8 159.5 / 321.5 against 161.9 / 340.9 (H100,
    ``moe_decode_sweep/2026-12-06_a65ec9f_block_h100.json``; the H200's per-row sweep at 2757e01 put 2 x 2 over 8 warps
    39% behind 4 x 4); one token's (``direct``): below. A long-K stage 2 (Mixtral's I = 14336) as 2 columns of 4 warps
    at 2 CTAs per SM: 50.9 us against 60.5 over one column (the same record). Short K takes its 8 loads as 2 n8 tiles x
    4 loads over 4 warps side by side along N (steps of 256: one for I = 256) at 4 CTAs per SM rather than 4 x 2 over 2
    x 2 warps: with block scales, 4 tiles' accumulators and those of the K block in progress do not fit in 128
    registers; where K is one such step (at most 256: DeepSeek-V3 TP8's I) as 4 n8 tiles x 4 loads (32 KB of weights per
    CTA, 156-168 registers, 3 CTAs per SM): 91.7 / 188.3 us at T 16 / 64 against 96.7 / 204.2, block-scaled 100.5
    against 105.0 (H100, ``moe_decode_sweep/2026-12-06_9e02a6f_stage2_h100.json``). A warp also converts the weights and
    holds twice the activation words per load (16 values of K per row; loaded as the MMAs take them). No spills
    (tests/kernels/test_skinny_grouped_fp8.py).

    ``direct`` (one token's stages, :class:`GroupedMode`): long-K fp8 steps wait until their activations have landed
    (``landed``: ptxas then issues a step's activation loads together, one L2 round trip a step rather than one a chunk;
    122-126 registers, still 2 CTAs per SM; short K would spill at its 4 CTAs per SM): stage 1 1-4% faster (H100,
    ``moe_decode_sweep/2026-12-05_ac82efb_one_token_landed_h100.json``). That is DeepSeek-V3 TP8's (``n_out``, the
    output columns per expert, I = 256: 256 CTAs, one wave); more tiles take more rows or bytes per CTA (H200,
    ``moe_decode_sweep/2026-12-06_57ddf7e_one_token.json``; H100 ``..._9e02a6f_one_token_h100.json``): from I = 512
    (Qwen3's 768: 768 CTAs, three waves) 4 n8 tiles x 2 loads over 4 warps, one wave, 15.0 us against 16.6, block 15.7
    against 17.5 (H100 17.5 / 17.4 against 17.9 / 19.4); from I = 4096 (Mixtral's 14336: 13 waves, a stream) 2 tiles x 4
    loads over 4 warps unlanded, twice the bytes in flight, 74.0 against 83.0 for 8 warps, block 75.3 (H100: within 2%
    of the best; 96.0 / 93.7 against 96.4 / 99.7 for 2 loads over 8 warps).

    ``quantized`` (fp8 activations too, :func:`skinny_gemm_grouped_scaled_kernel`; ``k`` in values): a gated stage 1
    as the weight-only one of several tokens, 4 n8 tiles x 4 loads over 4 warps: the best of 12 shapes on the H100
    at every case, 99.1 / 146.7 us at Qwen3's T 16 / 64 against 147.1 / 216.3 for 16-bit's default (2 x 4 over 8
    warps, 170 registers: one CTA per SM) and 102.2 / 152.2 weight-only (``moe_decode_sweep/
    2026-12-06_b1e6388_quantized_h100.json``; 254 registers and an 8-byte spill slot: both operands' next step held;
    the spill-free 2 x 2 over 8 warps ran up to 18% slower); otherwise 16-bit's shapes, whose loads per step are the
    same (a 16-byte load of each operand per row and chunk), steps twice as long in K."""
    if element_bytes not in (1, 2):
        raise ValueError(f"choose_grouped_skinny_config: element_bytes must be 1 (fp8) or 2, got {element_bytes}")
    if quantized and (element_bytes != 1 or block):
        raise ValueError("choose_grouped_skinny_config: fp8 activations take fp8 weights with per-row scales")
    short = k <= 1024 and not gated
    if quantized and gated:
        return SkinnyConfig(groups=4, warps=4, unroll=4)
    if element_bytes == 2 or quantized:
        return SkinnyConfig(groups=4, warps=4, warps_n=2, unroll=2) if short else SkinnyConfig()
    if short and k <= 256:  # one step: twice the weights per CTA, no register cap
        return SkinnyConfig(groups=4, warps=4, warps_n=4, unroll=4)
    if short:
        return SkinnyConfig(groups=2, warps=4, warps_n=4, unroll=4, min_blocks=4)  # (landed: spills)
    if not gated:
        return SkinnyConfig(unroll=2, warps_n=2, min_blocks=2, landed=direct)
    if direct and n_out >= 4096:  # streaming: twice the bytes in flight
        return SkinnyConfig(warps=4, unroll=4)
    if direct and n_out >= 512:  # one wave of 32-row tiles
        return SkinnyConfig(groups=4, warps=4, unroll=2)
    if direct:
        return SkinnyConfig(unroll=2, landed=True)
    return SkinnyConfig(groups=4, warps=4, unroll=2) if block else SkinnyConfig(groups=4, warps=4, unroll=4)
