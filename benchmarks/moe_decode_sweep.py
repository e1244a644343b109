"""fused_moe at decode sizes, taken apart (diagnostics for issue 34's decode bar): per case, a same-bytes copy and the
whole call under each set of decode modes (cold L2, as moe_bench.py times them), each kernel's own time in a profile
of 10 calls, and a sweep of the grouped skinny GEMM's configurations for both stages, each launched alone on the
call's routing.

    python benchmarks/moe_decode_sweep.py [--cases qwen3:1:fp8,dsv3-tp8:16] [--modes ,direct,direct+prefetch]
        [--stages all|direct|none] [--commit C] [--json benchmarks/results/moe_decode_sweep/F]

Cases ``model:T[:format]`` of moe_bench.py's models and formats (bf16, fp8: e4m3 weights per output channel, block: per
128 x 128 block; weight-only at decode: h stays bf16, and so does x but for "quantize"). Default: DeepSeek-V3 TP8 and
Qwen3-30B-A3B at T 1, 16, 64 and Mixtral at 1, in bf16 and fp8. Weights random (1 / sqrt(fan-in)), softmax top-k routing
of random logits. Modes (``FLYDSL_MOE_DECODE``, the plans rebuilt for each): "" (none: the aligned path), "direct" (one
token: no alignment), "combine" (with direct: stage 2 and the combine in one launch), "single" (with combine: stage 1 in
that launch too), "quantize" (two tokens on, fp8 per channel: x quantized per token, stage 1 W8A8), "quantize_h" (with
it: h per row, stage 2 W8A8) and unions (fused_moe's default: direct and combine, combine where I <= 1024; this sweep's:
none, direct, +combine, +single, +quantize, +quantize_h); each mode's output is compared with the first mode's
(``max_abs_diff_vs_first``: 0 expected but for "combine", whose y may round an ulp apart, and "quantize": x's fp8
roundings). fp8 per channel also sweeps the quantized stages alone (``stage1_quantized``, ``stage2_quantized``: each
stage's shapes, 128 registers or none). The stage sweep (modes off, aligned routing) tries 7 stage-1 and 6 stage-2
shapes of (groups, warps, warps_n, unroll), each with its format's CTAs per SM (``min_blocks``: fp8 as
``choose_grouped_skinny_config`` holds it, or none) and, for fp8, also ``min_blocks`` None and the chosen long-K
configuration with ``landed``; stage 1 is gated (weight rows half gate, half up: ``groups`` even), stage 2 streams the
(capacity, I) intermediate. One token where I <= 1024 also times the direct stage 1 alone (8 configurations) and the
combined kernel (stage 2 and the combine) under 6 shapes of (groups, unroll), CTAs per SM held or not, each chosen
configuration also without ``landed`` (fp8: a step's activations loaded beside their MMAs). Bandwidth: the routed
experts' weight bytes of the stage over its time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from dataclasses import replace

from moe_torch import format_weights
from record import cold_timer, csv_list, new_record, save

MODELS = {  # E, top_k, H, I (moe_bench.py's)
    "mixtral": (8, 2, 4096, 14336),
    "qwen3": (128, 8, 2048, 768),
    "dsv3-tp8": (256, 8, 7168, 256),
    "dsv3-ep8": (32, 8, 7168, 2048),
}
FORMATS = ("bf16", "fp8", "block")
DEFAULT_CASES = ",".join(
    f"{case}:{fmt}"
    for fmt in ("bf16", "fp8")
    for case in ("dsv3-tp8:1", "dsv3-tp8:16", "dsv3-tp8:64", "qwen3:1", "qwen3:16", "qwen3:64", "mixtral:1")
)
DEFAULT_MODES = (
    ",direct,direct+combine,direct+combine+single,direct+combine+quantize,direct+combine+quantize+quantize_h"
)
# (groups, warps, warps_n, unroll) of each stage's candidates
STAGE1 = ((4, 8, 1, 2), (2, 8, 1, 4), (4, 8, 1, 4), (2, 8, 1, 2), (4, 4, 1, 4), (2, 8, 1, 8), (4, 4, 1, 2))
STAGE2 = (
    (2, 8, 2, 2),
    (4, 8, 4, 2),
    (2, 8, 4, 1),
    (4, 4, 2, 2),
    (2, 4, 4, 2),
    (2, 8, 1, 4),
    (4, 4, 4, 4),
    (4, 4, 4, 2),
)
COMBINED = ((1, 4), (2, 2), (2, 4), (2, 8), (4, 2), (4, 4))  # (groups, unroll) of the combined kernel (warps: top_k)
# (groups, warps, unroll, min_blocks) of one token's direct stage 1, besides the chosen configuration
DIRECT1 = (
    (2, 8, 1, None), (2, 8, 4, None), (4, 8, 2, None), (2, 4, 4, None), (2, 4, 2, 4), (2, 16, 2, None), (4, 4, 4, None),
    (4, 4, 2, None),
)  # fmt: skip


def parse_case(text: str) -> tuple[str, int, str]:
    model, _, rest = text.partition(":")
    tokens, _, fmt = rest.partition(":")
    fmt = fmt or "bf16"
    if model not in MODELS or not tokens.isdigit() or int(tokens) < 1 or fmt not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"expected MODEL:T[:FORMAT] with MODEL one of {', '.join(MODELS)}, FORMAT one of {FORMATS}, got {text!r}"
        )
    return model, int(tokens), fmt


def parse_mode(text: str) -> str:
    words = [w for w in text.split("+") if w]
    if not set(words) <= {"direct", "combine", "single", "quantize", "quantize_h"}:
        raise argparse.ArgumentTypeError(f"a mode is '' or words of FLYDSL_MOE_DECODE joined by '+', got {text!r}")
    return ",".join(words)


def kernel_times(fn, calls: int = 10) -> dict:
    """Each CUDA kernel's median time (us), launches per call over ``calls`` calls of ``fn``, and where it ran in its
    call: the median start and end (us) after the call's first kernel started (a dependent launch whose CTAs start
    beside its primary's starts before the primary ends)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    per: dict = {}
    launches = len(kernels) // calls if calls else 0
    for index, event in enumerate(kernels):
        first = kernels[index - index % launches].time_range.start if launches else event.time_range.start
        times = per.setdefault(event.name[:60], {"us": [], "start": [], "end": []})
        times["us"].append(event.time_range.elapsed_us())
        times["start"].append(event.time_range.start - first)
        times["end"].append(event.time_range.end - first)
    return {
        name: {
            "us": statistics.median(t["us"]),
            "per_call": len(t["us"]) // calls,
            "start_us": statistics.median(t["start"]),
            "end_us": statistics.median(t["end"]),
        }
        for name, t in per.items()
    }


def whole_calls(row: dict, modes, call, timer) -> None:
    """The whole call under each set of modes (plans rebuilt), its kernels' times and its output's difference from
    the first mode's."""
    import torch

    from flydsl.kernels import plans

    first = None
    row["modes"] = {}
    for mode in modes:
        os.environ["FLYDSL_MOE_DECODE"] = mode
        plans.clear_all()
        out = call().clone()
        first = out if first is None else first
        us = timer(call) * 1e3
        row["modes"][mode or "none"] = dict(
            us=us,
            fraction_of_copy=row["copy_us"] / us,
            max_abs_diff_vs_first=(out.float() - first.float()).abs().max().item(),
            finite=bool(torch.isfinite(out).all()),
            kernels=kernel_times(call),
        )
    os.environ.pop("FLYDSL_MOE_DECODE", None)
    plans.clear_all()


def stage_sweep(row: dict, fmt: str, x, weights, routing, blocks: int, top_k: int, timer) -> None:
    """Each stage's configurations launched alone on the aligned routing (modes off)."""
    import torch

    from flydsl.kernels.gemm.epilogue import Epilogue
    from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
    from flydsl.kernels.gemm.skinny_grouped import (
        GroupedMode,
        choose_grouped_skinny_config,
        skinny_gemm_grouped_fp8_kernel,
        skinny_gemm_grouped_kernel,
    )

    hidden, inter = weights.w1.shape[2], weights.w2.shape[2]
    capacity = routing[0].numel()
    h = torch.empty(capacity, inter, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(capacity, hidden, device="cuda", dtype=torch.bfloat16)
    element = weights.w1.element_size()
    if fmt == "block":
        scales = (weights.w1_scale.view(-1, -(-hidden // 128)), weights.w2_scale.view(-1, -(-inter // 128)))
    elif fmt == "fp8":
        scales = (weights.w1_scale.view(-1), weights.w2_scale.view(-1))
    stages = (
        ("stage1", STAGE1, x, weights.w1.view(-1, hidden), h, top_k, Epilogue(gate="silu"), 2 * inter * hidden),
        ("stage2", STAGE2, h, weights.w2.view(-1, inter), y, 0, Epilogue(), inter * hidden),
    )
    for index, (stage, shapes, a, w, c, by_index, epilogue, expert_values) in enumerate(stages):
        variant = SkinnyVariant(True, epilogue, True)
        chosen = choose_grouped_skinny_config(a.shape[1], epilogue.gate is not None, element, block=fmt == "block")
        row[stage] = []
        candidates = [SkinnyConfig(groups=g, warps=w_, warps_n=n, unroll=u) for g, w_, n, u in shapes]
        if fmt != "bf16":  # fp8 as chosen (CTAs per SM held) and as ptxas decides
            candidates = [
                dataclasses.replace(cfg, min_blocks=m)
                for cfg in candidates
                for m in (65536 // (128 * cfg.threads), None)
            ]
        candidates.append(chosen)
        if fmt != "bf16" and not chosen.min_blocks:  # a step's activations landed before its MMAs (fits: no spills)
            candidates.append(dataclasses.replace(chosen, landed=True))
        for cfg in dict.fromkeys(candidates):
            cols = cfg.rows // 2 if epilogue.gate else cfg.rows
            grid = (-(-c.shape[1] // cols), blocks)
            if fmt == "bf16":
                call = skinny_gemm_grouped_kernel(a, w, c, *routing, by_index, cfg, variant, GroupedMode())
            else:
                call = skinny_gemm_grouped_fp8_kernel(
                    a, w, c, *routing, scales[index], by_index, cfg, variant, GroupedMode()
                )
            us = timer(lambda call=call, cfg=cfg, grid=grid: call.launch(grid=grid, block=cfg.threads)) * 1e3
            config = dataclasses.asdict(cfg) | {"chosen": cfg == chosen}
            tbps = row["touched_experts"] * expert_values * element / (us * 1e-6) / 1e12
            row[stage].append(dict(config=config, us=us, tbps=tbps))
    if fmt == "fp8":
        quantized_sweep(row, x, weights, routing, blocks, top_k, h, timer)


def quantized_sweep(row: dict, x, weights, routing, blocks: int, top_k: int, h, timer) -> None:
    """fp8 per-row weights' stages on fp8 activations (``skinny_gemm_grouped_scaled_kernel``: x quantized per token,
    h per row; FLYDSL_MOE_DECODE's quantize and quantize_h) under :data:`STAGE1`'s and :data:`STAGE2`'s shapes, each
    at as many CTAs per SM as 128 registers allow and as ptxas decides: ``stage1_quantized``, ``stage2_quantized``."""
    import torch

    from flydsl.kernels.gemm.epilogue import Epilogue
    from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
    from flydsl.kernels.gemm.skinny_grouped import (
        GroupedMode,
        choose_grouped_skinny_config,
        skinny_gemm_grouped_scaled_kernel,
    )
    from flydsl.kernels.quantize import quantize_fp8

    hidden, inter = weights.w1.shape[2], weights.w2.shape[2]
    x8, x_scales = quantize_fp8(x, "token")
    h8, h_scales = quantize_fp8(torch.randn_like(h), "token")
    y = torch.empty(h.shape[0], hidden, device="cuda", dtype=torch.bfloat16)
    stages = (
        ("stage1_quantized", STAGE1, x8, x_scales, weights.w1.view(-1, hidden), weights.w1_scale, h, top_k, "silu"),
        ("stage2_quantized", STAGE2, h8, h_scales, weights.w2.view(-1, inter), weights.w2_scale, y, 0, None),
    )
    for stage, shapes, a, a_scale, w, w_scale, c, by_index, gate in stages:
        variant = SkinnyVariant(True, Epilogue(gate=gate), True)
        chosen = choose_grouped_skinny_config(a.shape[1], gate is not None, 1, quantized=True)
        candidates = [SkinnyConfig(groups=g, warps=w_, warps_n=n, unroll=u) for g, w_, n, u in shapes]
        candidates = [replace(c, min_blocks=m) for c in candidates for m in (65536 // (128 * c.threads), None)]
        row[stage] = []
        for cfg in dict.fromkeys([*candidates, chosen]):
            call = skinny_gemm_grouped_scaled_kernel(
                a, w, c, *routing, w_scale.view(-1), a_scale.view(-1), by_index, cfg, variant, GroupedMode()
            )
            grid = (-(-c.shape[1] // (cfg.rows // 2 if gate else cfg.rows)), blocks)
            us = timer(lambda call=call, cfg=cfg, grid=grid: call.launch(grid=grid, block=cfg.threads)) * 1e3
            tbps = row["touched_experts"] * w.shape[0] // weights.w1.shape[0] * w.shape[1] / (us * 1e-6) / 1e12
            row[stage].append(dict(config=dataclasses.asdict(cfg) | {"chosen": cfg == chosen}, us=us, tbps=tbps))


def combined_sweep(row: dict, fmt: str, x, weights, topk_weights, ids, timer) -> None:
    """One token: the direct stage 1 alone under the chosen configuration and :data:`DIRECT1`'s, then, where I is at
    most the combined kernel's, the combined kernel (stage 2 and the combine) alone on its output under each
    :data:`COMBINED` shape, with the format's CTAs per SM held as chosen and as ptxas decides."""
    import torch

    from flydsl.kernels.gemm.epilogue import Epilogue
    from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
    from flydsl.kernels.gemm.skinny_grouped import (
        GROUPED_BLOCK,
        GroupedMode,
        choose_grouped_skinny_config,
        skinny_gemm_grouped_fp8_kernel,
        skinny_gemm_grouped_kernel,
    )
    from flydsl.kernels.gemm.skinny_one_token import choose_combined_config, skinny_gemm_combined_kernel
    from flydsl.kernels.moe.decode import COMBINE_MAX_INTER

    hidden, inter = weights.w1.shape[2], weights.w2.shape[2]
    top_k, element = ids.shape[1], weights.w1.element_size()
    pairs = ids.reshape(-1)
    h = torch.empty(top_k * GROUPED_BLOCK, inter, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, hidden, device="cuda", dtype=torch.bfloat16)
    positions = torch.empty(top_k, dtype=torch.int32, device="cuda")
    cfg1 = choose_grouped_skinny_config(hidden, True, element, direct=True, block=fmt == "block", n_out=inter)
    variant = SkinnyVariant(True, Epilogue(gate="silu"), True)
    routing = (pairs, pairs, pairs, positions)
    w1, w2 = weights.w1.view(-1, hidden), weights.w2.view(-1, inter)
    direct = GroupedMode(direct=True)
    if fmt == "bf16":
        scales2 = topk_weights

        def stage1(cfg):
            return skinny_gemm_grouped_kernel(x, w1, h, *routing, top_k, cfg, variant, direct)

    else:
        block = fmt == "block"
        scales1 = weights.w1_scale.view(-1, -(-hidden // 128)) if block else weights.w1_scale.view(-1)
        scales2 = weights.w2_scale.view(-1, -(-inter // 128)) if block else weights.w2_scale.view(-1)

        def stage1(cfg):
            return skinny_gemm_grouped_fp8_kernel(x, w1, h, *routing, scales1, top_k, cfg, variant, direct)

    row["direct_stage1"] = []
    candidates = [SkinnyConfig(groups=g, warps=w_, unroll=u, min_blocks=m) for g, w_, u, m in DIRECT1]
    unlanded = dataclasses.replace(cfg1, landed=False)  # (fp8: the chosen one's activations loaded as before)
    for cfg in dict.fromkeys([*candidates, unlanded, cfg1]):
        call = stage1(cfg)
        grid = (-(-inter // (cfg.rows // 2)), top_k)
        us = timer(lambda call=call, cfg=cfg, grid=grid: call.launch(grid=grid, block=cfg.threads)) * 1e3
        tbps = row["touched_experts"] * 2 * inter * hidden * element / (us * 1e-6) / 1e12
        row["direct_stage1"].append(dict(config=dataclasses.asdict(cfg) | {"chosen": cfg == cfg1}, us=us, tbps=tbps))
    if inter > COMBINE_MAX_INTER:
        return
    stage1(cfg1).launch(grid=(-(-inter // (cfg1.rows // 2)), top_k), block=cfg1.threads)  # h for stage 2
    chosen = choose_combined_config(top_k, element, inter)
    candidates = [dataclasses.replace(chosen, groups=g, unroll=u) for g, u in COMBINED]
    candidates = [dataclasses.replace(c, min_blocks=m) for c in candidates for m in (chosen.min_blocks, None)]
    row["combined"] = []
    for cfg in dict.fromkeys([*candidates, dataclasses.replace(chosen, landed=False), chosen]):
        call = skinny_gemm_combined_kernel(h, w2, out, ids, topk_weights, scales2, cfg, top_k)
        grid = (-(-hidden // cfg.rows), 1)
        us = timer(lambda call=call, cfg=cfg, grid=grid: call.launch(grid=grid, block=cfg.threads)) * 1e3
        tbps = row["touched_experts"] * inter * hidden * element / (us * 1e-6) / 1e12
        row["combined"].append(dict(config=dataclasses.asdict(cfg) | {"chosen": cfg == chosen}, us=us, tbps=tbps))


def run_case(model: str, tokens: int, fmt: str, modes, timer, stages: str) -> dict:
    import torch

    from flydsl.kernels.gemm.skinny_grouped import GROUPED_BLOCK
    from flydsl.kernels.moe import align_tokens, fused_moe, topk_route

    experts, top_k, hidden, inter = MODELS[model]
    torch.manual_seed(0)
    w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16).mul_(hidden**-0.5)
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16).mul_(inter**-0.5)
    weights = format_weights(w1, w2, fmt)
    del w1, w2
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    topk_weights, ids = topk_route(torch.randn(tokens, experts, device="cuda"), top_k)
    touched = ids.unique().numel()
    nbytes = touched * 3 * hidden * inter * weights.w1.element_size()
    source = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    row = {"model": model, "tokens": tokens, "format": fmt, "touched_experts": touched, "touched_bytes": nbytes}
    row["copy_us"] = timer(lambda: target.copy_(source)) * 1e3
    options = {}
    if fmt != "bf16":
        granularity = "channel" if fmt == "fp8" else "block"
        options = dict(quant="fp8", granularity=granularity, w1_scale=weights.w1_scale, w2_scale=weights.w2_scale)
    whole_calls(row, modes, lambda: fused_moe(x, weights.w1, weights.w2, topk_weights, ids, **options), timer)
    if stages == "all":
        sorted_ids, expert_of_block, padded_count = align_tokens(ids, experts, GROUPED_BLOCK)
        row["align_us"] = timer(lambda: align_tokens(ids, experts, GROUPED_BLOCK)) * 1e3
        blocks = min(sorted_ids.numel() // GROUPED_BLOCK, tokens * top_k)
        positions = torch.empty(tokens * top_k, dtype=torch.int32, device="cuda")
        stage_sweep(row, fmt, x, weights, (sorted_ids, expert_of_block, padded_count, positions), blocks, top_k, timer)
    if stages != "none" and tokens == 1:
        combined_sweep(row, fmt, x, weights, topk_weights, ids, timer)
    return row


def _format(row: dict) -> str:
    modes = " ".join(f"{mode} {r['us']:.1f} us ({r['fraction_of_copy']:.3f})" for mode, r in row["modes"].items())
    text = f"{row['model']:<9} T={row['tokens']:<3} {row['format']:<5} copy {row['copy_us']:7.1f} us; {modes}"
    for stage in ("stage1", "stage2", "stage1_quantized", "stage2_quantized", "direct_stage1", "combined"):
        if stage in row:
            best, chosen = min(row[stage], key=lambda r: r["us"]), [r for r in row[stage] if r["config"]["chosen"]][0]
            text += f"; {stage} chosen {chosen['us']:.1f} us, best {best['us']:.1f} us {best['config']}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=lambda t: csv_list(t, parse_case), default=csv_list(DEFAULT_CASES, parse_case))
    parser.add_argument("--modes", type=lambda t: [parse_mode(m) for m in t.split(",")], default=None)
    parser.add_argument(
        "--stages",
        choices=("all", "direct", "none"),
        default="all",
        help="the stage sweeps: all, one token's direct stage 1 and combined kernel only, or none (whole calls only)",
    )
    parser.add_argument("--json", help="write the record here (benchmarks/results/moe_decode_sweep/)")
    parser.add_argument("--commit", default=None, help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    modes = args.modes if args.modes is not None else [parse_mode(m) for m in DEFAULT_MODES.split(",")]
    timer = cold_timer("dirty")
    results = []
    record = new_record("moe_decode_sweep", argv, results, commit=args.commit, method=__doc__.split("\n\n")[0])
    for model, tokens, fmt in args.cases:
        row = run_case(model, tokens, fmt, modes, timer, args.stages)
        results.append(row)
        print(_format(row), flush=True)
        if args.json:
            save(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
