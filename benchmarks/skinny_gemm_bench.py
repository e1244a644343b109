"""Skinny GEMM (M <= 16) on the local GPU: flydsl.kernels.gemm.skinny_gemm against torch.matmul (cuBLAS) and
flydsl.kernels.gemm.gemm (the wgmma kernel), interleaved in the same process.

    python benchmarks/skinny_gemm_bench.py                                  # M in {1, 16} x issue 8's (N, K)
    python benchmarks/skinny_gemm_bench.py --json benchmarks/results/skinny_gemm/DATE_WHAT.json --commit C
    python benchmarks/skinny_gemm_bench.py --explore --m 16                 # time candidate configurations

Each case: fresh random inputs, B as nn.Linear weights (``b = w.t()``, w (N, K) row-major), our result checked
against a float64 reference (max error relative to the reference's largest entry), then the three timed with
``cold_l2.bench_cold`` (do_bench's loop: CUDA events, L2 flushed before each call, median; warmup 25 ms, rep
100 ms) in turn, ``--repeats`` times; reported: medians over the repeats, weight bandwidth N * K * 2 bytes / time,
ratio cuBLAS time / ours (> 1: we are faster). Each case is timed after each ``--flush``: ``dirty`` zeroes a
256 MB buffer first, as do_bench does, which leaves the L2 full of lines it must write back while the GEMM reads
its weights (up to 50 MB of extra HBM traffic: as much as a 4096 x 4096 layer's weights); ``clean`` reads that
buffer instead, as a previous layer's GEMM would leave the L2; ``rotate`` runs the calls back to back, each on its
own copy of the weights (together >= 256 MB), queued behind a sleep (``cold_l2.bench_rotating``): a decode step's
stream of GEMMs, without the ~4 us that events and dispatch add to a call timed alone. The run's HBM ceiling, a
1 GB copy, is recorded for the flushes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from cold_l2 import FLUSHES, bench_cold, bench_rotating, copy_tbps
from gemm_bench import SWEEP_NK as SHAPES_NK  # issue 8's (N, K) layers
from record import write_record

EXPLORE_NK = [(4096, 4096), (14336, 4096), (8192, 8192), (28672, 8192), (7168, 18432), (8192, 28672), (4096, 14336)]


def _candidates(m: int, n: int, k: int):
    """The default and variants around it (N-side-by-side warps sharing activation loads, register caps)."""
    from flydsl.kernels.gemm import SkinnyConfig, choose_skinny_config

    chosen = choose_skinny_config(m, n, k, 132)
    base = {"pipelined": True, "prefetch": 256}
    variants = [
        SkinnyConfig(groups=2, unroll=4, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=4, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=8, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=2, unroll=4, warps=16, warps_n=2, **base),
        SkinnyConfig(groups=1, unroll=4, warps=8, min_blocks=3, **base),
        SkinnyConfig(groups=2, unroll=4, warps=8, min_blocks=3, **base),
        SkinnyConfig(groups=2, unroll=4, warps=8, min_blocks=2, **base),
        SkinnyConfig(groups=4, unroll=2, warps=8, **base),
        SkinnyConfig(groups=4, unroll=4, warps=8, **base),
        SkinnyConfig(groups=2, unroll=2, warps=8, **base),
        SkinnyConfig(groups=2, unroll=4, warps=4, **base),
    ]
    variants += [
        # 64 weight rows per CTA: each CTA's activations (M x K, from L2) serve twice the weights of 32 rows
        SkinnyConfig(groups=4, unroll=2, warps=8, warps_n=2, **base),
        SkinnyConfig(groups=4, unroll=2, warps=16, warps_n=2, **base),
        SkinnyConfig(groups=8, unroll=1, warps=8, **base),
    ]
    return [chosen] + [cfg for cfg in variants if cfg != chosen]


ROTATING_BYTES = 256 * 1024 * 1024  # "rotate": weight sets together at least this large (the L2 holds 50 MB)
TIMINGS = FLUSHES + ("rotate",)


def _dependent_launch(on: bool) -> None:
    """Turns programmatic dependent launch of the loaded skinny kernels on or off (an A/B switch for this benchmark:
    the kernel always waits for its predecessor, so both are correct)."""
    from flydsl.kernels.gemm import skinny_gemm_kernel

    for loaded in skinny_gemm_kernel._loaded.values():
        loaded.function.dependent_launch = on


def run_case(torch, m, n, k, repeats, config=None, peers=True, flush="dirty", dependent_ab=False):
    """``flush``: "dirty" or "clean" (``bench_cold``, one call between events after each flush) or "rotate"
    (``bench_rotating``: back-to-back calls, each on its own weights, queued behind a sleep)."""
    from flydsl.kernels.gemm import gemm, skinny_gemm

    weight_bytes = n * k * 2
    sets = max(2, -(-ROTATING_BYTES // weight_bytes)) if flush == "rotate" else 1
    a = torch.randn(m, k, device="cuda").bfloat16()
    bs = [torch.randn(n, k, device="cuda").bfloat16().t() for _ in range(sets)]  # nn.Linear weights: b = w.t()
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    skinny_gemm(a, bs[0], ours, config)
    reference = a.double() @ bs[0].double()
    torch.cuda.synchronize()
    error = ((ours.double() - reference).abs().max() / reference.abs().max()).item()
    cublas_out, gemm_out = torch.empty_like(ours), torch.empty_like(ours)
    # The same bytes moved by torch's copy (half the weights' size read, half written): a streaming floor.
    copy_src = [torch.empty(n * k // 2 if peers else 0, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    copy_dst = [torch.empty_like(src) for src in copy_src]

    def timed(call):  # call(i): the call on input set i
        if flush == "rotate":
            return bench_rotating([lambda i=i: call(i) for i in range(sets)])
        return bench_cold(lambda: call(0), flush=flush)

    ours_ms, cublas_ms, gemm_ms, copy_ms, plain_ms = [], [], [], [], []
    for _ in range(repeats):
        ours_ms.append(timed(lambda i: skinny_gemm(a, bs[i], ours, config)))
        if dependent_ab:
            _dependent_launch(False)
            plain_ms.append(timed(lambda i: skinny_gemm(a, bs[i], ours, config)))
            _dependent_launch(True)
        if peers:
            cublas_ms.append(timed(lambda i: torch.matmul(a, bs[i], out=cublas_out)))
            gemm_ms.append(timed(lambda i: gemm(a, bs[i], gemm_out)))
            copy_ms.append(timed(lambda i: copy_dst[i].copy_(copy_src[i])))
    ours_t = statistics.median(ours_ms)
    record = {
        "m": m,
        "n": n,
        "k": k,
        "config": repr(config) if config is not None else "default",
        "flush": flush,
        "weight_sets": sets,
        "max_rel_error_vs_fp64": error,
        "skinny_ms": ours_t,
        "skinny_weight_tbps": weight_bytes / ours_t / 1e9,
        "skinny_runs_ms": ours_ms,
    }
    if dependent_ab:
        record["skinny_plain_launch_ms"] = statistics.median(plain_ms)
        record["skinny_plain_launch_runs_ms"] = plain_ms
    if peers:
        cublas_t, gemm_t, copy_t = statistics.median(cublas_ms), statistics.median(gemm_ms), statistics.median(copy_ms)
        record.update(
            {
                "same_bytes_copy_ms": copy_t,
                "same_bytes_copy_tbps": weight_bytes / copy_t / 1e9,
                "cublas_ms": cublas_t,
                "gemm_ms": gemm_t,
                "cublas_weight_tbps": weight_bytes / cublas_t / 1e9,
                "gemm_weight_tbps": weight_bytes / gemm_t / 1e9,
                "ratio_vs_cublas": cublas_t / ours_t,
                "gemm_ratio_vs_cublas": cublas_t / gemm_t,
                "cublas_runs_ms": cublas_ms,
                "gemm_runs_ms": gemm_ms,
                "same_bytes_copy_runs_ms": copy_ms,
            }
        )
    return record


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(v) for v in shape.split("x")) for shape in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated NxK shapes, got {text!r}") from None


def _flushes(text: str) -> list[str]:
    flushes = text.split(",")
    if not flushes or any(f not in TIMINGS for f in flushes):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(TIMINGS)}, got {text!r}")
    return flushes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--explore", action="store_true", help="time candidate configurations on a few shapes")
    parser.add_argument("--nk", type=_shapes, help="with --explore: these NxK shapes (e.g. 8192x8192,14336x4096)")
    parser.add_argument(
        "--flush",
        type=_flushes,
        default=list(TIMINGS),
        help="how each call finds the L2: dirty, clean (flushed, timed alone), rotate (back to back, rotating weights)",
    )
    parser.add_argument(
        "--dependent-ab", action="store_true", help="also time ours launched plainly (no programmatic dependent launch)"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)

    import torch

    from flydsl.kernels.gemm import choose_skinny_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    copy = {flush: copy_tbps(flush=flush) for flush in args.flush if flush in FLUSHES}
    one = torch.empty(1, device="cuda")
    empty_us = {flush: bench_cold(one.zero_, flush=flush) * 1e3 for flush in args.flush if flush in FLUSHES}
    if "rotate" in args.flush:
        empty_us["rotate"] = bench_rotating([one.zero_] * 8) * 1e3
    print("1 GB copy (read + write TB/s): " + ", ".join(f"{f} L2 {t:.2f}" for f, t in copy.items()), flush=True)
    print("one-element zero_ (us): " + ", ".join(f"{f} L2 {t:.2f}" for f, t in empty_us.items()), flush=True)
    if args.explore:
        print(f"{'M':>3} {'N':>6} {'K':>6} {'flush':>5}  {'us':>7} {'TB/s':>5}  config", flush=True)
        for m in args.m:
            for n, k in args.nk or EXPLORE_NK:
                for cfg in _candidates(m, n, k):
                    for flush in args.flush:
                        r = run_case(torch, m, n, k, 1, cfg, peers=False, flush=flush)
                        results.append(r)
                        print(
                            f"{m:>3} {n:>6} {k:>6} {flush:>5}  {r['skinny_ms'] * 1e3:>7.1f}"
                            f" {r['skinny_weight_tbps']:>5.2f}  {cfg}",
                            flush=True,
                        )
    else:
        print(
            f"{'M':>3} {'N':>6} {'K':>6} {'flush':>5}  {'skinny us':>9} {'TB/s':>5}  {'cuBLAS us':>9} {'TB/s':>5}"
            f"  {'gemm us':>8} {'TB/s':>5}  {'copy us':>7} {'TB/s':>5}  {'ratio':>5}  {'err':>7}  config",
            flush=True,
        )
        for m in args.m:
            for n, k in SHAPES_NK:
                for flush in args.flush:
                    r = run_case(torch, m, n, k, args.repeats, flush=flush, dependent_ab=args.dependent_ab)
                    results.append(r)
                    print(
                        f"{m:>3} {n:>6} {k:>6} {flush:>5}  {r['skinny_ms'] * 1e3:>9.1f} {r['skinny_weight_tbps']:>5.2f}"
                        f"  {r['cublas_ms'] * 1e3:>9.1f} {r['cublas_weight_tbps']:>5.2f}  {r['gemm_ms'] * 1e3:>8.1f}"
                        f" {r['gemm_weight_tbps']:>5.2f}  {r['same_bytes_copy_ms'] * 1e3:>7.1f}"
                        f" {r['same_bytes_copy_tbps']:>5.2f}  {r['ratio_vs_cublas']:>5.2f}"
                        f"  {r['max_rel_error_vs_fp64']:>7.1e}  {choose_skinny_config(m, n, k, sms)}",
                        flush=True,
                    )
                    if args.dependent_ab:
                        print(f"{'':>22}plain launch: {r['skinny_plain_launch_ms'] * 1e3:>9.1f} us", flush=True)
    summary = {"copy_tbps": copy, "one_element_zero_us": empty_us}
    if not args.explore:
        for flush in args.flush:
            runs = [r for r in results if r["flush"] == flush]
            ratios = [r["ratio_vs_cublas"] for r in runs]
            summary[flush] = {
                "geomean_ratio_vs_cublas": statistics.geometric_mean(ratios),
                "min_ratio_vs_cublas": min(ratios),
                "min_weight_tbps": min(r["skinny_weight_tbps"] for r in runs),
                "cublas_min_weight_tbps": min(r["cublas_weight_tbps"] for r in runs),
                "cublas_cases_at_3_8_tbps": sum(r["cublas_weight_tbps"] >= 3.8 for r in runs),
                "copy_cases_at_3_8_tbps": sum(r["same_bytes_copy_tbps"] >= 3.8 for r in runs),
                "cases_at_3_8_tbps": sum(r["skinny_weight_tbps"] >= 3.8 for r in runs),
                "cases": len(runs),
            }
            if args.dependent_ab:
                plain = [r["skinny_plain_launch_ms"] / r["skinny_ms"] for r in runs]
                summary[flush]["geomean_plain_launch_time_vs_dependent"] = statistics.geometric_mean(plain)
    print(json.dumps(summary))
    if args.json:
        method = (
            "cold_l2.bench_cold (triton.testing.do_bench's loop: median of CUDA-event times, warmup 25 ms, rep 100"
            " ms, L2 flushed before each call: 'dirty' zeroes a 256 MB buffer as do_bench does, 'clean' reads it),"
            " skinny_gemm, cuBLAS (torch.matmul) and flydsl gemm in turn, median over repeats; bf16 inputs and"
            " output, fp32 accumulation; weight TB/s = N * K * 2 bytes / time; copy_tbps: a 1 GB copy_, read +"
            " written bytes / time, after each flush"
        )
        write_record(args.json, "skinny_gemm_bench", argv, results, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
