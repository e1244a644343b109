"""Skinny GEMM (M <= 16) on the local GPU: flydsl.kernels.skinny_gemm against torch.matmul (cuBLAS) and
flydsl.kernels.gemm.gemm (the wgmma kernel), interleaved in the same process.

    python benchmarks/skinny_gemm_bench.py                                  # M in {1, 16} x issue 8's (N, K)
    python benchmarks/skinny_gemm_bench.py --json out.json --commit $(git rev-parse --short HEAD)
    python benchmarks/skinny_gemm_bench.py --explore --m 16                 # time candidate configurations

Each case: fresh random inputs, B as nn.Linear weights (``b = w.t()``, w (N, K) row-major), our result checked
against a float64 reference (max error relative to the reference's largest entry), then the three timed with
triton.testing.do_bench (CUDA events, L2 flushed before each call, median; warmup 25 ms, rep 100 ms) in turn,
``--repeats`` times; reported: medians over the repeats, weight bandwidth N * K * 2 bytes / time, ratio cuBLAS
time / ours (> 1: we are faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from gemm_bench import SWEEP_NK as SHAPES_NK  # issue 8's (N, K) layers
from record import write_record

EXPLORE_NK = [(4096, 4096), (28672, 8192), (7168, 18432), (8192, 28672), (4096, 14336)]


def _bench(fn, do_bench) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def _candidates(m: int, n: int, k: int):
    """The default and variants around it (N-side-by-side warps sharing activation loads, register caps)."""
    from flydsl.kernels.skinny_gemm import SkinnyConfig, choose_skinny_config

    chosen = choose_skinny_config(m, n, k, 132)
    base = {"pipelined": True, "prefetch": 256}
    variants = [
        SkinnyConfig(groups=2, unroll=4, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=4, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=8, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=2, unroll=4, warps=16, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=4, warps=8, min_blocks=3, **base),
        SkinnyConfig(groups=2, unroll=4, warps=8, min_blocks=3, **base),
    ]
    return [chosen] + [cfg for cfg in variants if cfg != chosen]


def run_case(torch, do_bench, m, n, k, repeats, config=None, peers=True):
    from flydsl.kernels.gemm import gemm
    from flydsl.kernels.skinny_gemm import skinny_gemm

    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()  # nn.Linear weights (N, K) as b = w.t()
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    skinny_gemm(a, b, ours, config)
    reference = a.double() @ b.double()
    torch.cuda.synchronize()
    error = ((ours.double() - reference).abs().max() / reference.abs().max()).item()
    cublas_out, gemm_out = torch.empty_like(ours), torch.empty_like(ours)
    ours_ms, cublas_ms, gemm_ms = [], [], []
    for _ in range(repeats):
        ours_ms.append(_bench(lambda: skinny_gemm(a, b, ours, config), do_bench))
        if peers:
            cublas_ms.append(_bench(lambda: torch.matmul(a, b, out=cublas_out), do_bench))
            gemm_ms.append(_bench(lambda: gemm(a, b, gemm_out), do_bench))
    weight_bytes = n * k * 2
    ours_t = statistics.median(ours_ms)
    record = {
        "m": m,
        "n": n,
        "k": k,
        "config": repr(config) if config is not None else "default",
        "max_rel_error_vs_fp64": error,
        "skinny_ms": ours_t,
        "skinny_weight_tbps": weight_bytes / ours_t / 1e9,
        "skinny_runs_ms": ours_ms,
    }
    if peers:
        cublas_t, gemm_t = statistics.median(cublas_ms), statistics.median(gemm_ms)
        record.update(
            {
                "cublas_ms": cublas_t,
                "gemm_ms": gemm_t,
                "cublas_weight_tbps": weight_bytes / cublas_t / 1e9,
                "gemm_weight_tbps": weight_bytes / gemm_t / 1e9,
                "ratio_vs_cublas": cublas_t / ours_t,
                "gemm_ratio_vs_cublas": cublas_t / gemm_t,
                "cublas_runs_ms": cublas_ms,
                "gemm_runs_ms": gemm_ms,
            }
        )
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--explore", action="store_true", help="time candidate configurations on a few shapes")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from flydsl.kernels.skinny_gemm import choose_skinny_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    if args.explore:
        print(f"{'M':>3} {'N':>6} {'K':>6}  {'us':>7} {'TB/s':>5}  config", flush=True)
        for m in args.m:
            for n, k in EXPLORE_NK:
                for cfg in _candidates(m, n, k):
                    r = run_case(torch, do_bench, m, n, k, 1, cfg, peers=False)
                    results.append(r)
                    print(f"{m:>3} {n:>6} {k:>6}  {r['skinny_ms'] * 1e3:>7.1f} {r['skinny_weight_tbps']:>5.2f}  {cfg}")
    else:
        print(
            f"{'M':>3} {'N':>6} {'K':>6}  {'skinny us':>9} {'TB/s':>5}  {'cuBLAS us':>9} {'TB/s':>5}  {'gemm us':>8}"
            f" {'TB/s':>5}  {'ratio':>5}  {'err':>7}  config",
            flush=True,
        )
        for m in args.m:
            for n, k in SHAPES_NK:
                r = run_case(torch, do_bench, m, n, k, args.repeats)
                results.append(r)
                print(
                    f"{m:>3} {n:>6} {k:>6}  {r['skinny_ms'] * 1e3:>9.1f} {r['skinny_weight_tbps']:>5.2f}"
                    f"  {r['cublas_ms'] * 1e3:>9.1f} {r['cublas_weight_tbps']:>5.2f}  {r['gemm_ms'] * 1e3:>8.1f}"
                    f" {r['gemm_weight_tbps']:>5.2f}  {r['ratio_vs_cublas']:>5.2f}  {r['max_rel_error_vs_fp64']:>7.1e}"
                    f"  {choose_skinny_config(m, n, k, sms)}",
                    flush=True,
                )
    summary = {}
    if not args.explore:
        ratios = [r["ratio_vs_cublas"] for r in results]
        summary = {
            "geomean_ratio_vs_cublas": statistics.geometric_mean(ratios),
            "min_ratio_vs_cublas": min(ratios),
            "min_weight_tbps": min(r["skinny_weight_tbps"] for r in results),
            "cases_at_3_8_tbps": sum(r["skinny_weight_tbps"] >= 3.8 for r in results),
        }
        print(json.dumps(summary))
    if args.json:
        method = (
            "triton.testing.do_bench median (warmup 25 ms, rep 100 ms, L2 flushed), skinny_gemm, cuBLAS (torch.matmul)"
            " and flydsl gemm in turn, median over repeats; bf16 inputs and output, fp32 accumulation; weight TB/s ="
            " N * K * 2 bytes / time"
        )
        write_record(args.json, "skinny_gemm_bench", argv, results, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
