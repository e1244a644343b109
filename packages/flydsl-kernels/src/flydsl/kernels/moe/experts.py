"""The experts' half of a fused MoE layer (bf16/fp16, or fp8 weights): :func:`fused_moe`, from the routing
(``topk_weights``, ``topk_ids``) to the combined output, in five launches that never synchronize with the host::

    align_tokens        (token, slot) pairs sorted by expert, each expert's run padded to block_m rows
    gather_kernel       x's rows in that order: A (capacity, H); positions[t * k + s] = the pair's row
    stage 1             h = silu(A @ gate.T) * (A @ up.T) per row block, its expert's w1 (gemm_ws_grouped, gated)
    stage 2             y = h @ w2[e].T per row block (gemm_ws_grouped)
    combine_kernel      out[t] = sum over s = 0..k-1 of topk_weights[t, s] * y[positions[t * k + s]]

Decode-sized calls (:func:`~flydsl.kernels.moe.decode.decodes`: T <= 64, experts averaging at most 8 rows) take the
grouped skinny GEMMs of :mod:`flydsl.kernels.moe.decode` instead (weights streamed, no gather). Otherwise the two GEMMs
are the warp-specialized Hopper GEMM with the grouped scheduler (:class:`~flydsl.kernels.gemm.schedulers.ExpertTiles`):
each reads ``padded_count`` and the block's expert on the GPU and takes B from the experts' stacked weights as they are
(``nn.Linear``'s orientation, no copy). Stage 1's B tile is the gate rows of its columns and the up rows I further, so
the epilogue multiplies them in registers and writes h once. The combine sums each token's k rows in slot order in
float32 (deterministic: no atomics, the same bits for any token order); dropped ids (outside ``[0, E)``: expert
parallelism) add nothing. Pad rows are neither gathered nor combined: their GEMM rows compute garbage nobody reads. fp8
(:func:`fused_moe`'s ``quant``) on this route quantizes x before the gather and h between the stages; its block-scaled
form promotes each K block in the stages' mainloop (``gemm_ws_grouped_blockscaled``).
"""

from __future__ import annotations

from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, gpu, nvvm, vector
from flydsl.kernels import validation as check
from flydsl.kernels.gemm.block_scales import slot_bytes
from flydsl.kernels.gemm.config import GemmConfig, deepest_pipeline, fp8_config, max_stages
from flydsl.kernels.gemm.epilogue import Scale
from flydsl.kernels.gemm.launch import launch_plan
from flydsl.kernels.gemm.operands import MatrixSpec
from flydsl.kernels.gemm.plan import plan_grouped
from flydsl.kernels.moe.api import (
    BLOCK,
    align_capacity,
    align_tokens,
    check_align_tokens,
    check_experts_shapes,
    contiguous,
)
from flydsl.kernels.moe.decode import decode_modes, decode_stages, decodes, per_row
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = [
    "ExpertsConfig",
    "combine_kernel",
    "experts_config",
    "fused_moe",
    "gather_kernel",
]

CHUNK = 8  # elements of one 16-byte vector of a 16-bit row
_WARPS = 8  # the gather's and the combine's warps per CTA: one row (or token) per warp at a time
_WAVES = 8  # their CTAs per SM (grid-stride loops past that)
_FUSED = Plans("flydsl.kernels.moe.fused_moe", replay=True)


@dataclass(frozen=True)
class ExpertsConfig:
    """The two stages' GEMM configurations (``block_m``: the routing's block, a cluster tile's rows)."""

    stage1: GemmConfig
    stage2: GemmConfig

    @property
    def block_m(self) -> int:
        return self.stage1.tile_m * self.stage1.cluster_m


def experts_config(ids: int, experts: int, fp8: bool = False, block: bool = False) -> ExpertsConfig:
    """Tiles of 128 rows (two consumer warpgroups) where experts average 96 rows or more, else of 64 (one), so that
    the padding of sparsely hit experts stays small; in 2-CTA clusters along M (sharing each B tile: an expert's run
    padded to 256 rows) where they average 512 or more; tiles 256 wide (stage 1: 128 gate and 128 up columns), the
    deepest pipeline that fits beside the TMA store's staging boxes (docs/tuning/moe.md#tiles). fp8: K steps of
    128 (the same bytes per stage). ``block`` (fp8 with 128 x 128 weight blocks): tiles 128 wide (stage 1: 64 gate
    and 64 up columns), as the block-scaled GEMM's (a consumer holds two K blocks' accumulators beside the promoted
    sums), the slots holding their scales too."""
    tile_m = 128 if ids >= 96 * experts else 64
    cluster_m = 2 if ids >= 512 * experts else 1
    tile_n = 128 if block else 256
    shape = dict(tile_m=tile_m, tile_n=tile_n, consumers=tile_m // 64, cluster_m=cluster_m)
    pipeline = deepest_pipeline(tile_m, tile_n, slot_bytes(tile_m)) if block else dict(stages=max_stages(tile_m, 256))
    cfg = GemmConfig(**shape, **pipeline)
    cfg = fp8_config(cfg) if fp8 or block else cfg
    return ExpertsConfig(cfg, cfg)


# --- kernels --------------------------------------------------------------------------------------------------------


@flyc.kernel
def gather_kernel(
    x: fx.Tensor,
    sorted_ids: fx.Tensor,
    padded_count: fx.Tensor,
    rows: fx.Tensor,
    positions: fx.Tensor,
    scales: fx.Tensor,
    row_scales: fx.Tensor,
    top_k: fx.Constexpr[int],
    scaled: fx.Constexpr[bool],
):
    """``rows[p] = x[sorted_ids[p] // top_k]`` and ``positions[sorted_ids[p]] = p`` for each position ``p`` below
    ``padded_count[0]`` that holds an index (not the sentinel T * k: pad rows are left as they are); ``scaled``: also
    ``row_scales[p] = scales[sorted_ids[p] // top_k]`` (fp8 rows' per-token scales, (T,) and (capacity,); or, 2-D,
    their per-group scales (T, G) and (capacity, G), any strides; else both unread). One warp per position at a
    time, 16-byte vectors of any element type (fp8 rows pass as int32 views); rows of whole vectors."""
    flyc.set_kernel_attributes(threads=32 * _WARPS)
    lane, warp = gpu.lane_id(), gpu.warp_idx()
    ids = positions.shape.to(fx.Int32)  # (a 1-D tensor's shape is its extent)
    chunk = 128 // x.dtype.width  # elements of a 16-byte vector
    chunks = x.shape[1].to(fx.Int32) // chunk
    total = padded_count[0].to(fx.Int32)
    cls = vector.vector_class(x.dtype, chunk)
    for p in range(gpu.block_idx.x * _WARPS + warp, total, gpu.grid_dim.x * _WARPS):
        flat = sorted_ids[p].to(fx.Int32)
        if flat < ids:
            token = flat // top_k
            if lane == 0:
                positions[flat] = p
                if fx.const_expr(scaled and fx.rank(scales.shape) == 1):
                    row_scales[p] = scales[token]
            if fx.const_expr(scaled and fx.rank(scales.shape) == 2):
                for g in range(lane, scales.shape[1].to(fx.Int32), 32):
                    row_scales[p, g] = scales[token, g]
            row = p.to(fx.Int64)
            for c in range(lane, chunks, 32):
                vector.store(vector.load_op(cls, x, (token.to(fx.Int64), c * chunk)), rows, (row, c * chunk))


@flyc.kernel(dependent_launch=True)
def combine_kernel(
    y: fx.Tensor,
    positions: fx.Tensor,
    topk_weights: fx.Tensor,
    topk_ids: fx.Tensor,
    out: fx.Tensor,
    experts: fx.Int32,
    top_k: fx.Constexpr[int],
):
    """``out[t] = sum over s = 0..top_k-1 of topk_weights[t, s] * y[positions[t * top_k + s]]`` in float32, in slot
    order, over the slots whose id is in ``[0, experts)`` (a token without one gets zeros). A warp per (token, slice
    of 256 columns) at a time, a lane per 16-byte vector: a decode step's few tokens still spread over the GPU; H a
    multiple of 8. Launched as a dependent of the stage before it (its launch overlaps that stage's end)."""
    flyc.set_kernel_attributes(threads=32 * _WARPS)
    lane, warp = gpu.lane_id(), gpu.warp_idx()
    after_wait = nvvm.griddepcontrol_wait()  # y and positions are the previous kernels'
    tokens = out.shape[0].to(fx.Int32)
    chunks = out.shape[1].to(fx.Int32) // CHUNK
    slices = (chunks + 31) // 32
    cls = vector.vector_class(y.dtype, CHUNK)
    for task in range(gpu.block_idx.x * _WARPS + warp + after_wait, tokens * slices, gpu.grid_dim.x * _WARPS):
        t, c = task // slices, (task % slices) * 32 + lane
        kept, rows, weights = [], [], []
        for s in fx.range_constexpr(top_k):
            expert = topk_ids[t, s]
            ok = (expert >= 0) & (expert < experts)
            kept.append(ok)
            # (an unplaced slot's position is garbage: never used as an address)
            rows.append(arith.select(ok, positions[t * top_k + s].to(fx.Int32), fx.Int32(0)).to(fx.Int64))
            weights.append(topk_weights[t, s].to(fx.Float32))
        if c < chunks:
            sums = [fx.Float32(0.0)] * CHUNK
            for s in fx.range_constexpr(top_k):
                values = vector.load_op(cls, y, (rows[s], c * CHUNK))
                # selected, not multiplied by a zero weight: a row of garbage may hold NaNs
                sums = [
                    arith.select(kept[s], sums[i] + weights[s] * values[i].to(fx.Float32), sums[i])
                    for i in range(CHUNK)
                ]
            total = vector.from_elements(vector.vector_class(out.dtype, CHUNK), [v.to(out.dtype) for v in sums])
            vector.store(total, out, (t.to(fx.Int64), c * CHUNK))


# --- the entry point ------------------------------------------------------------------------------------------------


def fused_moe(
    x,
    w1,
    w2,
    topk_weights,
    topk_ids,
    *,
    activation: str = "silu",
    quant=None,
    granularity=None,
    w1_scale=None,
    w2_scale=None,
    out=None,
):
    """A mixture-of-experts layer's experts: ``out[t] = sum over s of topk_weights[t, s] * (w2[e] @ (silu(w1[e][:I]
    @ x[t]) * (w1[e][I:] @ x[t])))`` with ``e = topk_ids[t, s]`` (the slots whose id is outside ``[0, E)`` are
    dropped: expert parallelism). ``x`` (T, H) bf16 or fp16, contiguous; ``w1`` (E, 2I, H): each expert's gate
    rows ``[0, I)`` then up rows ``[I, 2I)`` (``nn.Linear``'s orientation); ``w2`` (E, H, I); both contiguous, in
    x's dtype; ``topk_weights`` (T, k) float32/bf16/fp16 and ``topk_ids`` (T, k) int32/int64, contiguous (e.g.
    :func:`~flydsl.kernels.moe.topk_route`'s); H and I multiples of 8. ``out`` (T, H) in x's dtype, contiguous,
    allocated when not given.

    ``quant="fp8"``: ``w1`` and ``w2`` float8_e4m3fn (H and I multiples of 16) with float32 scales, the weight
    ``w[e][n] * scale``: ``granularity`` "channel" (``w1_scale`` (E, 2I), ``w2_scale`` (E, H): one per expert and
    output row, as ``quantize_fp8(w.view(E * N, K), "token")`` gives them) or "tensor" (both (E,)). Past decode sizes
    the activations are quantized per token (x before the gather, h between the stages: ``quantize_fp8``), both
    stages run on fp8 tensor cores with the scales in their epilogue, h and the output stay in x's dtype.
    ``granularity="block"``
    (DeepSeek-V3's format): one scale per expert and 128 x 128 block of its weights, ``w1_scale`` (E, 2I / 128,
    H / 128) and ``w2_scale`` (E, H / 128, ceil(I / 128)) (H a multiple of 128, I of 64), the activations quantized
    per 1 x 128 group instead, and each 128-wide K block's products promoted into float32 sums with its two scales
    (``gemm_ws_grouped_blockscaled``). Decode-sized fp8 calls (:func:`decodes`) stream the weights like bf16's:
    the skinny kernels convert them to x's dtype in registers (exactly), the per-row scales in their epilogue, the
    block scales on each K block's sums; h stays in x's dtype (weight-only stage 2), and so does x for one token and
    for block scales (weight-only: more accurate than the prefill route's fp8 activations); ``FLYDSL_MOE_DECODE``'s
    ``quantize`` (opt-in, :func:`decode_modes`) has per-row scales from two tokens on quantize x per token as the
    prefill route does and run stage 1 on fp8 MMAs (half the activation bytes, nothing converted).

    The steps and kernels: the module's docstring; nothing is read back to the host (CUDA-graph capturable)."""
    key = signature(x, w1, w2, topk_weights, topk_ids, out, activation, quant, granularity, w1_scale, w2_scale)
    plan = _FUSED.get(key)
    if plan is None:
        options = dict(quant=quant, granularity=granularity, w1_scale=w1_scale, w2_scale=w2_scale, out=out)
        plan = _FUSED.add(key, _fused_plan(x, w1, w2, topk_weights, topk_ids, activation, **options))
    result = plan(x, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale)
    return out if out is not None else result[0]


def check_fused_moe(
    x, w1, w2, topk_weights, topk_ids, activation="silu", quant=None, out=None, granularity=None, w1_scale=None,
    w2_scale=None,
) -> tuple:  # fmt: skip
    """``fused_moe``'s arguments checked (read for their geometry only); returns (T, H, E, I, k). Errors name the
    argument and what was expected."""
    who = _FUSED.name
    infos = {name: check.describe(who, name, t) for name, t in (("x", x), ("w1", w1), ("w2", w2))}
    infos["topk_weights"] = check.describe(who, "topk_weights", topk_weights)
    ids = check.describe(who, "topk_ids", topk_ids)
    scales = {
        n: None if t is None else check.describe(who, n, t) for n, t in (("w1_scale", w1_scale), ("w2_scale", w2_scale))
    }
    shapes = check_experts_shapes(who, *infos.values(), ids, activation, quant, granularity, *scales.values())
    infos.update((name, info) for name, info in scales.items() if info is not None)
    xi = infos["x"]
    if out is not None:
        infos["out"] = outi = check.describe(who, "out", out)
        if tuple(outi.shape) != tuple(xi.shape) or outi.dtype != xi.dtype:
            raise ValueError(
                f"{who}: out: expected a {tuple(xi.shape)} {check.dtype_names((xi.dtype,))} tensor, got"
                f" {tuple(outi.shape)} {check.dtype_names((outi.dtype,))}"
            )
    for name, info in infos.items():
        if not contiguous(info):
            raise ValueError(f"{who}: {name}: expected a contiguous tensor, got strides {tuple(info.strides)}")
        if name in ("x", "w1", "w2", "out") and info.pointer % 16:  # 16-byte rows: the gather's, combine's, TMA's
            raise ValueError(f"{who}: {name}: expected a 16-byte aligned address, got {info.pointer:#x}")
    others = [(name, info) for name, info in infos.items() if name != "x"] + [("topk_ids", ids)]
    check.same_device(who, xi, *others)
    if out is not None:
        check.not_aliased(who, "out", infos["out"], *[(n, infos[n]) for n in ("x", "w1", "w2")])
    check_align_tokens(topk_ids, shapes[2], 64)  # the ids' layout
    return shapes


def _fused_plan(x, w1, w2, topk_weights, topk_ids, activation, *, quant, granularity, w1_scale, w2_scale, out):
    """The launches of a call of this signature, checked and planned: a :class:`~flydsl.kernels.plans.ScratchPlan`
    of ``(x, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale)`` whose scratch holds the output, the positions
    and, at decode sizes, every buffer the stages use (so that their launches alone are replayed natively)."""
    import torch

    from flydsl.kernels.device import sm_count

    scales = dict(granularity=granularity, w1_scale=w1_scale, w2_scale=w2_scale)
    shapes = check_fused_moe(x, w1, w2, topk_weights, topk_ids, activation, quant, out, **scales)
    tokens, hidden, experts, inter, top_k = shapes
    ids = tokens * top_k
    if ids == 0:  # no token, or no slot: nothing routed

        def zeros(x, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale):
            return (x.new_zeros((tokens, hidden)) if out is None else out.zero_(),)

        return ScratchPlan(zeros, lambda *args: None)
    tasks = tokens * -(-hidden // (32 * CHUNK))  # (token, slice of 256 columns) pairs
    combine_grid = max(1, min(-(-tasks // _WARPS), sm_count(x.get_device()) * _WAVES))

    def combine(y, positions, topk_weights, topk_ids, out):
        combine_kernel(y, positions, topk_weights, topk_ids, out, experts, top_k).launch(
            grid=combine_grid, block=32 * _WARPS
        )

    held = None  # the decode stages' buffers as a replay makes them (kept per stream), where it can
    if decodes(tokens, ids, experts):  # (fp8: e4m3 weights converted in registers, or x quantized: decode_modes)
        fp8 = None if quant is None else "block" if granularity == "block" else "row"
        modes = decode_modes(tokens, top_k, inter)
        buffers, steps, held = decode_stages(x, tokens, hidden, experts, inter, top_k, activation, fp8, modes)
        if fp8 == "row" and (w1_scale.dim() == 1 or w2_scale.dim() == 1):
            held = None  # per-tensor scales repeated per row: a torch op per call
    else:  # (the prefill stages allocate as they go: their launches are not replayed, their host time is small)
        kind = None if quant is None else "block" if granularity == "block" else "fp8"
        steps = _prefill_stages(x, tokens, hidden, experts, inter, top_k, activation, kind)
        buffers = lambda x, w1_scale, w2_scale: ()  # noqa: E731
    given = out is not None  # (a signature of its own: a given output is an argument, not scratch)

    def memory(x, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale):
        positions = torch.empty(ids, dtype=torch.int32, device=x.device)
        scratch = (positions, *buffers(x, w1_scale, w2_scale))
        return scratch if given else (x.new_empty((tokens, hidden)), *scratch)

    def launch(x, w1, w2, topk_weights, topk_ids, given_out, w1_scale, w2_scale, *memory):
        out, positions, *held = (given_out, *memory) if given else memory
        y = steps(x, w1, w2, topk_weights, topk_ids, positions, out, w1_scale, w2_scale, *held)
        if y is not None:  # (None: the stages wrote the output, combined)
            combine(y, positions, topk_weights, topk_ids, out)

    made = None
    if held is not None:  # the output and positions fresh per call, the buffers held per stream (shared by name)
        made = ((0, (ids,), torch.int32), *((0, shape, dtype, f"fused_moe.{name}") for name, shape, dtype in held))
        made = made if given else ((0, (tokens, hidden), None), *made)
    return ScratchPlan(memory, launch, made)


def _prefill_stages(x, tokens, hidden, experts, inter, top_k, activation, quant):
    """align, gather, the two warp-specialized grouped GEMMs: a function of the call's tensors returning y.
    ``quant`` None (x's dtype), "fp8" (x quantized per token before the gather, its scales gathered with the rows, h
    quantized per token between the stages, each stage's epilogue scaling by the row's and the weight row's scales)
    or "block" (x and h quantized per 1 x 128 group, the group scales gathered with the rows; both stages promote
    each 128-wide K block with its row's group scale and its weight block's scale)."""
    import torch

    from flydsl.kernels.device import sm_count
    from flydsl.kernels.quantize import quantize_fp8

    ids = tokens * top_k
    sms = sm_count(x.get_device())
    block = quant == "block"
    cfg = experts_config(ids, experts, quant is not None, block)
    capacity = align_capacity(ids, experts, cfg.block_m)
    dtype = check.torch_dtype(x.dtype)
    operand = dtype if quant is None else "f8E4M3FN"
    blocks1, blocks2 = -(-hidden // BLOCK), -(-inter // BLOCK)  # "block": the K blocks of each stage

    def stage(k, rows, n, gate, config):
        scales, block_scales = (), ()
        if quant == "fp8":  # per row of A (its token's), per row of the stacked weights
            scales = ((Scale(rows=1), MatrixSpec.dense((capacity,), "f32")),)
            scales += ((Scale(columns=1, experts=True), MatrixSpec.dense((experts * rows,), "f32")),)
        if block:  # per row of A and K block (M-major, as quantize_fp8 writes them), per block of stacked weights
            k_blocks = -(-k // BLOCK)
            block_scales = (MatrixSpec((capacity, k_blocks), (1, capacity), "f32"),)
            block_scales += (MatrixSpec.dense((experts * rows // BLOCK, k_blocks), "f32"),)
        a, weights = MatrixSpec.dense((capacity, k), operand), MatrixSpec.dense((experts, rows, k), operand)
        out = MatrixSpec.dense((capacity, n), dtype)
        return plan_grouped(
            a, weights, out, sms=sms, gate=gate, config=config, scales=scales, block_scales=block_scales
        )

    stage1 = stage(hidden, 2 * inter, inter, activation, cfg.stage1)
    stage2 = stage(inter, hidden, hidden, None, cfg.stage2)
    gather_grid = max(1, min(-(-capacity // _WARPS), sms * _WAVES))
    launch_gather = dict(grid=gather_grid, block=32 * _WARPS)

    def steps(x, w1, w2, _topk_weights, topk_ids, positions, _out, w1_scale, w2_scale):
        sorted_ids, expert_of_block, padded_count = align_tokens(topk_ids, experts, cfg.block_m)
        groups = (expert_of_block, padded_count)
        if quant is None:
            rows = x.new_empty((capacity, hidden))
            unread = positions  # (the scales' parameters: not read unscaled)
            gather_kernel(x, sorted_ids, padded_count, rows, positions, unread, unread, top_k, False).launch(
                **launch_gather
            )
            h = launch_plan(stage1, rows, w1, x.new_empty((capacity, inter)), groups=groups)
            return launch_plan(stage2, h, w2, rows, groups=groups)  # into the gathered rows: stage 1 has read them
        x8, x_scales = quantize_fp8(x, "group" if block else "token")
        rows = torch.empty((capacity, hidden), dtype=w1.dtype, device=x.device)
        if block:
            row_scales = torch.empty((blocks1, capacity), dtype=torch.float32, device=x.device).t()  # M-major
        else:
            row_scales, x_scales = torch.empty(capacity, dtype=torch.float32, device=x.device), x_scales.view(-1)
        words, row_words = x8.view(torch.int32), rows.view(torch.int32)  # (fp8 rows moved as 32-bit words)
        gather_kernel(words, sorted_ids, padded_count, row_words, positions, x_scales, row_scales, top_k, True).launch(
            **launch_gather
        )
        h = x.new_empty((capacity, inter))
        y = x.new_empty((capacity, hidden))
        if block:
            launch_plan(stage1, rows, w1, h, scales=(row_scales, w1_scale.view(-1, blocks1)), groups=groups)
            h8, h_scales = quantize_fp8(h, "group")
            return launch_plan(stage2, h8, w2, y, scales=(h_scales, w2_scale.view(-1, blocks2)), groups=groups)
        launch_plan(stage1, rows, w1, h, scales=(row_scales, per_row(w1_scale, 2 * inter)), groups=groups)
        h8, h_scales = quantize_fp8(h, "token")
        return launch_plan(stage2, h8, w2, y, scales=(h_scales.view(-1), per_row(w2_scale, hidden)), groups=groups)

    return steps
