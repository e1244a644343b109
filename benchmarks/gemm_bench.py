"""bf16 GEMM on the local GPU: flydsl.kernels.gemm against torch.matmul (cuBLAS) in the same process.

    python benchmarks/gemm_bench.py                      # 8192^3 and 4096^3
    python benchmarks/gemm_bench.py --sweep --json benchmarks/results/gemm/DATE_WHAT.json --commit $(git rev-parse HEAD)

Each case: fresh random inputs, our result checked against torch's (relative Frobenius error), then both timed
with triton.testing.do_bench (CUDA events, median of repeated runs after warm-up), interleaved: ours, cuBLAS,
ours, cuBLAS, ... ``--repeats`` times; the reported numbers are medians over the repeats. The sweep is issue 8's:
M in {1, 16, 64, 128, 512, 2048, 8192} x (N, K) from Llama/DeepSeek layers, B given as nn.Linear weights (N, K).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

from record import write_record

SQUARE = [(8192, 8192, 8192), (4096, 4096, 4096)]
SWEEP_NK = [
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (8192, 8192),
    (28672, 8192),
    (8192, 28672),
    (18432, 7168),
    (7168, 18432),
    (1536, 7168),
    (7168, 16384),
]
SWEEP_M = [1, 16, 64, 128, 512, 2048, 8192]


def _bench(fn, do_bench) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_case(torch, do_bench, m, n, k, repeats, weights_nk, config=None):
    from flydsl.kernels.gemm import gemm

    a = torch.randn(m, k, device="cuda").bfloat16()
    # nn.Linear weights (N, K) row-major, used as b = w.t() (K-major B); else b (K, N) row-major.
    b = torch.randn(n, k, device="cuda").bfloat16().t() if weights_nk else torch.randn(k, n, device="cuda").bfloat16()
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, ours, config)
    reference = torch.matmul(a, b)
    torch.cuda.synchronize()
    error = ((ours.float() - reference.float()).norm() / reference.float().norm()).item()
    cublas_out = torch.empty_like(ours)
    ours_ms, cublas_ms = [], []
    for _ in range(repeats):
        ours_ms.append(_bench(lambda: gemm(a, b, ours, config), do_bench))
        cublas_ms.append(_bench(lambda: torch.matmul(a, b, out=cublas_out), do_bench))
    flops = 2.0 * m * n * k
    ours_t, cublas_t = statistics.median(ours_ms), statistics.median(cublas_ms)
    return {
        "m": m,
        "n": n,
        "k": k,
        "b": "weights (N, K)" if weights_nk else "(K, N) row-major",
        "config": repr(config) if config is not None else "default",
        "chosen_config": str(config or _chosen(torch, m, n, k, weights_nk)),
        "rel_error_vs_cublas": error,
        "flydsl_ms": ours_t,
        "cublas_ms": cublas_t,
        "flydsl_tflops": flops / ours_t / 1e9,
        "cublas_tflops": flops / cublas_t / 1e9,
        "ratio": cublas_t / ours_t,
        "flydsl_weight_tbps": n * k * 2 / ours_t / 1e9,
        "flydsl_runs_ms": ours_ms,
        "cublas_runs_ms": cublas_ms,
    }


def _chosen(torch, m, n, k, weights_nk):
    """What gemm() runs for a default case: the skinny kernel for decode-sized M with nn.Linear weights, else
    choose_config's pick."""
    from flydsl.kernels.gemm import choose_config

    if m <= 16 and weights_nk:
        return "skinny_gemm"
    return choose_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)


def _config_fields(text: str) -> dict:
    """``KEY=VALUE,...`` -> a dict of GemmConfig fields (ints, booleans as true/false, or strings)."""
    fields = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--config: expected KEY=VALUE,..., got {text!r}")
        lowered = value.lower()
        fields[key.strip()] = (
            int(value)
            if value.lstrip("-").isdigit()
            else (lowered == "true") if lowered in ("true", "false") else value
        )
    return fields


def _config(fields: dict):
    """The GemmConfig of ``fields``, with the deepest pipeline that fits where ``stages`` is not given."""
    from flydsl.kernels.gemm import GemmConfig, max_stages

    fields = dict(fields)
    if "stages" not in fields:
        defaults = GemmConfig()
        tile_m, tile_n = fields.get("tile_m", defaults.tile_m), fields.get("tile_n", defaults.tile_n)
        boxes = fields.get("store_boxes", defaults.store_boxes)
        fields["stages"] = max_stages(tile_m, tile_n, fields.get("tile_k", defaults.tile_k), store_boxes=boxes)
    return GemmConfig(**fields)


def _describe(config) -> str:
    return (
        f"tile={config.tile_m}x{config.tile_n} stages={config.stages} cluster_m={config.cluster_m}"
        f"{f' cluster_n={config.cluster_n}' if config.cluster_n > 1 else ''}"
        f" split_k={config.split_k}{' (tail)' if config.split_tail else ''}"
        f"{' pingpong' if config.schedule == 'pingpong' else ''}"
        f"{' stream_k' if config.stream_k else ''}"
        f"{f' store_boxes={config.store_boxes}' if config.store_boxes != 2 else ''}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="issue 8's 70 shapes after the square ones")
    parser.add_argument("--m", type=int, nargs="*", help="restrict the sweep's M values")
    parser.add_argument("--nk", nargs="*", help="restrict the sweep's (N, K) pairs, written NxK (e.g. 1536x7168)")
    parser.add_argument("--no-square", action="store_true", help="leave out the square shapes (8192^3, 4096^3)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--config",
        action="append",
        type=_config_fields,
        help="also time the square shapes (with --sweep, the sweep's too) with this GemmConfig, written as its"
        " fields KEY=VALUE,... (e.g. tile_m=256,tile_n=128,cluster_m=1,cluster_n=2; stages default to the deepest"
        " that fits); repeatable",
    )
    parser.add_argument(
        "--split-k", type=int, nargs="*", help="also time the sweep's shapes with M <= 512 with these split_k values"
    )
    parser.add_argument(
        "--explore",
        action="store_true",
        help="time every flydsl.kernels.gemm.candidate_configs entry of the sweep's shapes (to tune choose_config),"
        " after each shape's default choice",
    )
    parser.add_argument(
        "--variant",
        choices=("cooperative", "pingpong", "stream_k"),
        help="--explore: only the candidates of this kind (cooperative: neither pingpong nor stream-K)",
    )
    parser.add_argument("--tile-m", type=int, help="--explore: only the candidates with this tile_m")
    parser.add_argument("--cluster-n", type=int, help="--explore: only the candidates with this cluster_n")
    parser.add_argument(
        "--compare-tail",
        action="store_true",
        help="also time the sweep's shapes whose chosen config splits the last wave (split_tail) without that split",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    if args.no_square and not (args.sweep or args.explore):
        parser.error("--no-square leaves nothing to time without --sweep or --explore")
    sweep_nk = [tuple(map(int, pair.split("x"))) for pair in args.nk] if args.nk else SWEEP_NK

    import torch
    from triton.testing import do_bench

    from flydsl.kernels.gemm import GemmConfig, candidate_configs, choose_config

    configs = [_config(fields) for fields in args.config or ()]
    cases = [] if args.no_square else [(m, n, k, False, config) for m, n, k in SQUARE for config in [None, *configs]]
    if args.sweep:
        cases += [(m, n, k, True, None) for m in (args.m or SWEEP_M) for n, k in sweep_nk]
        cases += [(m, n, k, True, config) for m in (args.m or SWEEP_M) for n, k in sweep_nk for config in configs]
        for split_k in args.split_k or ():
            cases += [
                (m, n, k, True, GemmConfig(split_k=split_k))
                for m in (args.m or SWEEP_M)
                if m <= 512
                for n, k in sweep_nk
            ]
    if args.compare_tail:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for m, n, k, weights, config in list(cases):
            chosen = config or choose_config(m, n, k, sms)
            if chosen.split_tail:
                cases.append((m, n, k, weights, dataclasses.replace(chosen, split_k=1, split_tail=False)))
    if args.explore:
        cases = []
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for m in args.m or SWEEP_M:
            for n, k in sweep_nk:
                configs = candidate_configs(m, n, k, sms)
                kinds = {c: "stream_k" if c.stream_k else c.schedule for c in configs}
                cases.append((m, n, k, True, None))  # what gemm() chooses, in the same run
                cases += [
                    (m, n, k, True, c)
                    for c in configs
                    if args.variant in (None, kinds[c])
                    and args.tile_m in (None, c.tile_m)
                    and args.cluster_n in (None, c.cluster_n)
                ]
    results = []
    print(f"{'M':>6} {'N':>6} {'K':>6}  {'flydsl TF/s':>11} {'cuBLAS TF/s':>11} {'ratio':>6}  {'err':>8}  config")
    for m, n, k, weights, config in cases:
        try:
            r = run_case(torch, do_bench, m, n, k, args.repeats, weights, config)
        except ValueError as error:  # a --config that does not apply to these operands (B's layout), nothing else
            if config is None or "MN-major" not in str(error):
                raise
            print(f"{m:>6} {n:>6} {k:>6}  skipped {_describe(config)}: {error}", flush=True)
            continue
        results.append(r)
        print(
            f"{m:>6} {n:>6} {k:>6}  {r['flydsl_tflops']:>11.1f} {r['cublas_tflops']:>11.1f} {r['ratio']:>6.3f}"
            f"  {r['rel_error_vs_cublas']:>8.1e}  {'' if config is None else _describe(config)}",
            flush=True,
        )
    default = [r for r in results if r["config"] == "default"] or results
    ratios = [r["ratio"] for r in default]
    big = [r["ratio"] for r in default if r["m"] >= 2048]
    summary = {
        "geomean_ratio_all": statistics.geometric_mean(ratios),
        "geomean_ratio_m_ge_2048": statistics.geometric_mean(big) if big else None,
        "min_ratio": min(ratios),
    }
    print(json.dumps(summary))
    if args.json:
        method = (
            "triton.testing.do_bench median (warmup 25 ms, rep 100 ms), ours and cuBLAS interleaved, median over"
            " repeats; bf16 inputs and output, fp32 accumulation"
        )
        write_record(args.json, "gemm_bench", argv, results, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
