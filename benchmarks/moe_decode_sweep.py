"""fused_moe at decode sizes, taken apart (diagnostics for issue 34's decode bar): per case, the whole call and a
same-bytes copy (cold L2, as moe_bench.py times them), each kernel's own time in a profile of 10 calls, and a sweep of
the grouped skinny GEMM's configurations for both stages, each launched alone on the call's routing.

    python benchmarks/moe_decode_sweep.py [--cases dsv3-tp8:1,qwen3:64] [--json benchmarks/results/moe_decode_sweep/F]

Cases ``model:T`` of moe_bench.py's models (default: DeepSeek-V3 TP8 at T 1, 16, 64, Qwen3-30B-A3B at 1 and 64,
Mixtral at 1); bf16 weights scaled by 0.02, softmax top-k routing of random logits. Stage 1's candidates are gated
(their weight rows half gate, half up: ``groups`` even); stage 2's stream the (capacity, I) intermediate. Bandwidth:
the routed experts' weight bytes of the stage over its time.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from record import cold_timer, csv_list, new_record, save

MODELS = {  # E, top_k, H, I (moe_bench.py's)
    "mixtral": (8, 2, 4096, 14336),
    "qwen3": (128, 8, 2048, 768),
    "dsv3-tp8": (256, 8, 7168, 256),
    "dsv3-ep8": (32, 8, 7168, 2048),
}
DEFAULT_CASES = "dsv3-tp8:1,dsv3-tp8:16,dsv3-tp8:64,qwen3:1,qwen3:64,mixtral:1"
STAGE1 = ((4, 8, 1, 2), (2, 8, 1, 4), (4, 8, 1, 4), (2, 8, 1, 2), (4, 4, 1, 4))  # (groups, warps, warps_n, unroll)
STAGE2 = ((2, 8, 2, 2), (4, 8, 4, 2), (2, 8, 4, 1), (4, 4, 2, 2), (2, 4, 4, 2), (2, 8, 1, 4))


def parse_case(text: str) -> tuple[str, int]:
    model, _, tokens = text.partition(":")
    if model not in MODELS or not tokens.isdigit() or int(tokens) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL:T with MODEL one of {', '.join(MODELS)}, got {text!r}")
    return model, int(tokens)


def kernel_times(fn, calls: int = 10) -> dict:
    """Each CUDA kernel's median time (us) and launches per call over ``calls`` calls of ``fn``."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(event.name[:60], []).append(event.time_range.elapsed_us())
    return {name: {"us": statistics.median(v), "per_call": len(v) // calls} for name, v in per.items()}


def run_case(model: str, tokens: int, timer) -> dict:
    import torch

    from flydsl.kernels.gemm.epilogue import Epilogue
    from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
    from flydsl.kernels.gemm.skinny_grouped import GROUPED_BLOCK, skinny_gemm_grouped_kernel
    from flydsl.kernels.moe import align_tokens, fused_moe, topk_route

    experts, top_k, hidden, inter = MODELS[model]
    torch.manual_seed(0)
    w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    weights, ids = topk_route(torch.randn(tokens, experts, device="cuda"), top_k)
    touched = ids.unique().numel()
    nbytes = touched * 3 * hidden * inter * 2
    source = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    row = {"model": model, "tokens": tokens, "touched_experts": touched, "touched_bytes": nbytes}
    row["copy_us"] = timer(lambda: target.copy_(source)) * 1e3
    row["ours_us"] = timer(lambda: fused_moe(x, w1, w2, weights, ids)) * 1e3
    row["fraction_of_copy"] = row["copy_us"] / row["ours_us"]
    row["kernels"] = kernel_times(lambda: fused_moe(x, w1, w2, weights, ids))
    sorted_ids, expert_of_block, padded_count = align_tokens(ids, experts, GROUPED_BLOCK)
    row["align_us"] = timer(lambda: align_tokens(ids, experts, GROUPED_BLOCK)) * 1e3
    capacity = sorted_ids.numel()
    blocks = min(capacity // GROUPED_BLOCK, tokens * top_k)
    positions = torch.empty(tokens * top_k, dtype=torch.int32, device="cuda")
    h = torch.empty(capacity, inter, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(capacity, hidden, device="cuda", dtype=torch.bfloat16)
    routing = (sorted_ids, expert_of_block, padded_count, positions)
    stages = (
        ("stage1", STAGE1, x, w1.view(-1, hidden), h, top_k, Epilogue(gate="silu"), 2 * inter * hidden * 2),
        ("stage2", STAGE2, h, w2.view(-1, inter), y, 0, Epilogue(), inter * hidden * 2),
    )
    for stage, shapes, a, w, c, by_index, epilogue, expert_bytes in stages:
        variant = SkinnyVariant(True, epilogue, True)
        row[stage] = []
        for groups, warps, warps_n, unroll in shapes:
            cfg = SkinnyConfig(groups=groups, warps=warps, warps_n=warps_n, unroll=unroll)
            cols = cfg.rows // 2 if epilogue.gate else cfg.rows
            grid = (-(-c.shape[1] // cols), blocks)

            def launch(cfg=cfg, grid=grid, variant=variant, a=a, w=w, c=c, by_index=by_index):
                skinny_gemm_grouped_kernel(a, w, c, *routing, by_index, cfg, variant).launch(
                    grid=grid, block=cfg.threads
                )

            us = timer(launch) * 1e3
            config = dict(groups=groups, warps=warps, warps_n=warps_n, unroll=unroll)
            row[stage].append(dict(config=config, us=us, tbps=touched * expert_bytes / (us * 1e-6) / 1e12))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=lambda t: csv_list(t, parse_case), default=csv_list(DEFAULT_CASES, parse_case))
    parser.add_argument("--json", help="write the record here (benchmarks/results/moe_decode_sweep/)")
    parser.add_argument("--commit", default=None, help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    timer = cold_timer("dirty")
    results = []
    record = new_record("moe_decode_sweep", argv, results, commit=args.commit, method=__doc__.split("\n\n")[0])
    for model, tokens in args.cases:
        row = run_case(model, tokens, timer)
        results.append(row)
        best = {stage: min(row[stage], key=lambda r: r["us"]) for stage in ("stage1", "stage2")}
        print(
            f"{model:<9} T={tokens:<3} ours {row['ours_us']:7.1f} us copy {row['copy_us']:7.1f} us"
            f" ({row['fraction_of_copy']:.3f}); best stage 1 {best['stage1']['us']:.1f} us {best['stage1']['config']},"
            f" stage 2 {best['stage2']['us']:.1f} us {best['stage2']['config']}",
            flush=True,
        )
        if args.json:
            save(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
