"""fp8 GEMM on the local GPU: flydsl.kernels.gemm.fp8_gemm against torch._scaled_mm (cuBLAS) in the same process.

    python benchmarks/fp8_gemm_bench.py                  # 8192^3 and 4096^3
    python benchmarks/fp8_gemm_bench.py --sweep --json benchmarks/results/fp8_gemm/DATE_COMMIT.json --commit C

Each case: fresh random e4m3 inputs (rows of magnitudes 2^-6..2^6), B as nn.Linear weights (N, K) passed as ``w.t()``,
float32 scales per token (M, 1) and per output channel (1, N), bf16 output. Ours is checked against a float32
reference of the dequantized inputs and against ``_scaled_mm`` (relative Frobenius errors), then timed with
triton.testing.do_bench (CUDA events, L2 flushed before each call, median of the calls) interleaved with the peers:
``_scaled_mm`` rowwise (the same scales: the bar), ``_scaled_mm`` tensorwise (one scale each), the bf16 ``gemm`` of
the same shape, ours with the weights prepared once (``prepare_weight``: checked bit for bit against plain ones), and
for M <= 16 a same-bytes copy (``copy_`` of N * K / 2 bytes into as many: what streaming the weights once costs)
and a copy of all N * K bytes (``fraction_of_read_copy``: it reads what the GEMM reads; below L2's size the half
copy's writes stay in L2, so it reads half the bytes: docs/tuning/gemm.md#skinny), and a kernel that only reads
them (``fraction_of_read``, ``read_roofline.py``),
``--repeats`` times; the numbers are medians over the repeats. M <= 16 is also timed streamed: calls back to back
over copies of the weights that together exceed L2 (as the layers of a decode step run), one event pair around each
pass (captured in a CUDA graph: no host time between kernels), against copies of as many distinct buffers timed the
same way (``*_streamed_ms``, per call). The sweep is issue 32's: M in {1, 16, 64, 128, 512, 2048, 8192} x ten
(N, K) of Llama/DeepSeek layers.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys

from read_roofline import reader
from record import merge, write_record

SQUARE = [(8192, 8192, 8192), (4096, 4096, 4096)]
SWEEP_NK = [
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (8192, 8192),
    (28672, 8192),
    (18432, 7168),
    (7168, 18432),
    (1536, 7168),
    (24576, 1536),
    (7168, 2048),
]
SWEEP_M = [1, 16, 64, 128, 512, 2048, 8192]


def _bench(fn, do_bench) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def _fp8(torch, rows, cols):
    magnitude = 2.0 ** torch.randint(-6, 7, (rows, 1), device="cuda").float()
    return (torch.randn(rows, cols, device="cuda") * magnitude).clamp(-448, 448).to(torch.float8_e4m3fn)


def _error(torch, x, ref) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


_STREAMED_BYTES = 256 << 20  # weights per streamed pass: over four L2s of the H200 (60 MB)


def _streamed_ms(torch, calls, repeats: int = 7) -> float:
    """The per-call time of ``calls`` run back to back: captured once in a CUDA graph (no host time between the
    kernels, as a decode step's graph runs them), the replay timed by CUDA events, median over ``repeats``."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return statistics.median(times)


def streamed(torch, m, n, k, a, scale_a, scale_b, prepare_weight, fp8_gemm) -> dict:
    """M <= 16 streamed over distinct weights (plain and prepared) and the same-bytes copy of as many buffers."""
    count = max(2, -(-_STREAMED_BYTES // (n * k)))
    weights = [_fp8(torch, n, k).t() for _ in range(count)]
    prepared = [prepare_weight(b) for b in weights]
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    sources = [torch.empty(n * k // 2, dtype=torch.uint8, device="cuda") for _ in range(count)]
    targets = [torch.empty_like(x) for x in sources]
    result = {
        "flydsl_streamed_ms": _streamed_ms(torch, [lambda b=b: fp8_gemm(a, b, scale_a, scale_b, out) for b in weights]),
        "flydsl_prepared_streamed_ms": _streamed_ms(
            torch, [lambda b=b: fp8_gemm(a, b, scale_a, scale_b, out) for b in prepared]
        ),
        "copy_streamed_ms": _streamed_ms(
            torch, [lambda s=s, t=t: t.copy_(s) for s, t in zip(sources, targets, strict=True)]
        ),
        "streamed_weights": count,
    }
    result["fraction_of_copy_streamed"] = result["copy_streamed_ms"] / result["flydsl_streamed_ms"]
    result["prepared_fraction_of_copy_streamed"] = result["copy_streamed_ms"] / result["flydsl_prepared_streamed_ms"]
    return result


def run_case(torch, do_bench, m, n, k, repeats, with_bf16: bool):
    from flydsl.kernels.gemm import fp8_gemm, gemm, prepare_weight

    a, w = _fp8(torch, m, k), _fp8(torch, n, k)
    b = w.t()
    scale_a = torch.rand(m, 1, device="cuda") / 64 + 1e-3
    scale_b = torch.rand(1, n, device="cuda") / 64 + 1e-3
    one_a, one_b = scale_a.mean().reshape(()), scale_b.mean().reshape(())
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_gemm(a, b, scale_a, scale_b, ours)
    reference = (a.float() * scale_a) @ (b.float() * scale_b)
    rowwise = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    errors = {"rel_error_vs_f32": _error(torch, ours, reference), "scaled_mm_rel_error_vs_f32": None}
    errors["scaled_mm_rel_error_vs_f32"] = _error(torch, rowwise, reference)
    del reference
    prepared = prepare_weight(b)
    ours_prepared = torch.full_like(ours, float("nan"))
    fp8_gemm(a, prepared, scale_a, scale_b, ours_prepared)
    torch.cuda.synchronize()
    errors["prepared_equals_plain"] = bool(torch.equal(ours_prepared, ours))
    a16, b16 = a.bfloat16(), b.bfloat16()
    out16 = torch.empty_like(ours)
    copy_src = torch.empty(n * k // 2 if m <= 16 else 0, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    read_src = torch.empty(n * k if m <= 16 else 0, dtype=torch.uint8, device="cuda")  # all the weights' bytes
    read_dst = torch.empty_like(read_src)
    runs = {name: [] for name in ("flydsl", "flydsl_prepared", "scaled_mm_rowwise", "scaled_mm_tensorwise")}
    runs.update(bf16_gemm=[], copy=[], copy_read=[], read=[])
    timed = {
        "flydsl": lambda: fp8_gemm(a, b, scale_a, scale_b, ours),
        "flydsl_prepared": lambda: fp8_gemm(a, prepared, scale_a, scale_b, ours_prepared),
        "scaled_mm_rowwise": lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16),
        "scaled_mm_tensorwise": lambda: torch._scaled_mm(a, b, scale_a=one_a, scale_b=one_b, out_dtype=torch.bfloat16),
    }
    if with_bf16:
        timed["bf16_gemm"] = lambda: gemm(a16, b16, out16)
    if m <= 16:
        timed["copy"] = lambda: copy_dst.copy_(copy_src)
        timed["copy_read"] = lambda: read_dst.copy_(read_src)
        timed["read"] = reader(n * k)
    for _ in range(repeats):
        for name, fn in timed.items():
            runs[name].append(_bench(fn, do_bench))
    flops = 2.0 * m * n * k
    ms = {name: statistics.median(values) for name, values in runs.items() if values}
    result = {"m": m, "n": n, "k": k, "b": "weights (N, K) as w.t()", **errors}
    result["chosen_config"] = _route(m, n, k)
    for name, t in ms.items():
        result[f"{name}_ms"] = t
        if name not in ("copy", "copy_read", "read"):
            result[f"{name}_tflops"] = flops / t / 1e9
    result["ratio_vs_rowwise"] = ms["scaled_mm_rowwise"] / ms["flydsl"]
    result["ratio_vs_tensorwise"] = ms["scaled_mm_tensorwise"] / ms["flydsl"]
    result["prepared_ratio_vs_rowwise"] = ms["scaled_mm_rowwise"] / ms["flydsl_prepared"]
    result["prepared_speedup_vs_plain"] = ms["flydsl"] / ms["flydsl_prepared"]
    if "copy" in ms:
        result["fraction_of_copy"] = ms["copy"] / ms["flydsl"]  # same-bytes copy time / ours
        result["prepared_fraction_of_copy"] = ms["copy"] / ms["flydsl_prepared"]
        result["fraction_of_read_copy"] = ms["copy_read"] / ms["flydsl"]  # a copy_ reading all the weights' bytes
        result["fraction_of_read"] = ms["read"] / ms["flydsl"]  # a kernel that only reads them
        result.update(streamed(torch, m, n, k, a, scale_a, scale_b, prepare_weight, fp8_gemm))
    result["runs_ms"] = runs
    return result


def _route(m, n, k):
    """The route and configuration fp8_gemm plans for a row-major a, an nn.Linear weight's w.t() and per-token x
    per-channel scales (the skinny kernel's config at M <= 16, not the dense kernel's)."""
    import torch

    from flydsl.kernels.gemm.epilogue import Scale
    from flydsl.kernels.gemm.operands import MatrixSpec
    from flydsl.kernels.gemm.plan import plan_gemm

    f8 = "f8E4M3FN"
    scales = ((Scale(rows=1), MatrixSpec.dense((m,), "f32")), (Scale(columns=1), MatrixSpec.dense((n,), "f32")))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a, b = MatrixSpec.dense((m, k), f8), MatrixSpec.dense((n, k), f8).transposed()
    plan = plan_gemm(a, b, MatrixSpec.dense((m, n), "bf16"), sms=sms, scales=scales)
    return f"{plan.route}: {plan.config}"


def _dense_config(m, n, k):
    """The dense (warp-specialized) kernel's configuration fp8_gemm chooses for this shape."""
    import torch

    from flydsl.kernels.gemm import choose_fp8_config

    return choose_fp8_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)


def explore(torch, do_bench, cases, repeats) -> int:
    """Each case's candidate configurations timed (medians over ``repeats``), fastest first, the chosen one marked."""
    from flydsl.kernels.gemm import candidate_configs, fp8_config, fp8_gemm

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k in cases:
        a, b = _fp8(torch, m, k), _fp8(torch, n, k).t()
        scale_a, scale_b = torch.rand(m, 1, device="cuda") / 64, torch.rand(1, n, device="cuda") / 64
        out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        chosen = _dense_config(m, n, k)
        timed = []
        for cfg in {fp8_config(c) for c in candidate_configs(m, n, -(-k // 2), sms)} | {chosen}:
            try:
                fp8_gemm(a, b, scale_a, scale_b, out, cfg)
            except ValueError as error:  # e.g. MN-major parts, stages that do not fit
                print(f"  skipped {cfg}: {error}")
                continue
            call = functools.partial(fp8_gemm, a, b, scale_a, scale_b, out, cfg)
            ms = statistics.median(_bench(call, do_bench) for _ in range(repeats))
            timed.append((ms, cfg))
        peer = functools.partial(torch._scaled_mm, a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        row = _bench(peer, do_bench)
        print(f"{m}x{n}x{k}: _scaled_mm rowwise {row * 1e3:.1f} us")
        for ms, cfg in sorted(timed, key=lambda item: item[0]):
            mark = "  <- chosen" if cfg == chosen else ""
            print(f"  {ms * 1e3:7.1f} us  {row / ms:5.3f}x  {cfg}{mark}", flush=True)
    return 0


def skinny_candidates(m, n, k, sms):
    """The skinny kernel's configurations worth timing for an fp8 M <= 16 shape (no split K: the scaled kernel does
    not split), the chosen one first."""
    from flydsl.kernels.gemm import SkinnyConfig, choose_skinny_config

    chosen = choose_skinny_config(m, n, k // 2, sms, 1)
    configs = [chosen]
    for groups, unroll, warps, warps_n in itertools.product((1, 2, 4), (1, 2, 4), (4, 8), (1, 2, 4)):
        if warps_n > warps // 2 or (groups == 4 and unroll == 4):
            continue
        cfg = SkinnyConfig(groups=groups, unroll=unroll, warps=warps, warps_n=warps_n)
        if cfg.k_step(1) <= 2 * k and cfg not in configs:
            configs.append(cfg)
    return configs


def explore_skinny(torch, do_bench, cases, repeats) -> list:
    """M <= 16: every skinny configuration of :func:`skinny_candidates` timed (plain weights), fastest first, next to
    the same-bytes half copy; returns the record's rows (per shape: the peer, the copy, each configuration's time)."""
    from flydsl.kernels.gemm import Scale, launch_plan
    from flydsl.kernels.gemm.operands import MatrixSpec
    from flydsl.kernels.gemm.plan import plan_skinny

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in [case for case in cases if case[0] <= 16]:
        a, b = _fp8(torch, m, k), _fp8(torch, n, k).t()
        scale_a, scale_b = torch.rand(m, device="cuda") / 64, torch.rand(n, device="cuda") / 64
        out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        scales = ((Scale(rows=1), MatrixSpec.of(scale_a)), (Scale(columns=1), MatrixSpec.of(scale_b)))
        specs = MatrixSpec.of(a), MatrixSpec.of(b), MatrixSpec.of(out)
        peer = functools.partial(torch._scaled_mm, a, b, scale_a=scale_a[:, None], scale_b=scale_b[None, :])
        row = _bench(functools.partial(peer, out_dtype=torch.bfloat16), do_bench)
        source = torch.empty(n * k // 2, dtype=torch.uint8, device="cuda")
        target = torch.empty_like(source)
        copy_call = functools.partial(target.copy_, source)
        copy = statistics.median(_bench(copy_call, do_bench) for _ in range(repeats))
        timed, candidates = [], skinny_candidates(m, n, k, sms)
        for cfg in candidates:
            try:
                plan = plan_skinny(*specs, sms=sms, scales=scales, config=cfg)
                call = functools.partial(launch_plan, plan, a, b, out, None, (scale_a, scale_b))
                call()
            except Exception as error:  # a configuration this shape refuses: named, the others still timed
                print(f"  {cfg}: {type(error).__name__}: {error}", flush=True)
                continue
            timed.append((statistics.median(_bench(call, do_bench) for _ in range(repeats)), cfg))
        print(
            f"{m}x{n}x{k}: _scaled_mm rowwise {row * 1e3:.1f} us; copy {copy * 1e3:.1f} us;"
            f" {len(timed)} configurations timed"
        )
        for ms, cfg in sorted(timed, key=lambda item: item[0]):
            print(f"  {ms * 1e3:7.1f} us  {row / ms:5.3f}x  {copy / ms:5.3f} of copy  {cfg}", flush=True)
        rows.append(
            dict(
                m=m, n=n, k=k, scaled_mm_rowwise_us=row * 1e3, copy_us=copy * 1e3,
                chosen=repr(candidates[0]),
                configs=[dict(config=repr(cfg), us=ms * 1e3, fraction_of_copy=copy / ms) for ms, cfg in timed],
            )
        )  # fmt: skip
    return rows


def summarize(results) -> dict:
    """The record's summary: issue 32's bars over ``results``."""
    ratios = [r["ratio_vs_rowwise"] for r in results]
    big = [r["ratio_vs_rowwise"] for r in results if r["m"] >= 2048]
    small = [r for r in results if r["m"] <= 16]
    summary = {
        "geomean_ratio_m_ge_2048": statistics.geometric_mean(big) if big else None,
        "geomean_ratio_all": statistics.geometric_mean(ratios),
        "min_ratio": min(ratios),
        "m_le_16_min_fraction_of_copy": min(r["fraction_of_copy"] for r in small) if small else None,
        "m_le_16_min_fraction_of_read": min(
            (r["fraction_of_read"] for r in small if "fraction_of_read" in r), default=None
        ),
        "m_le_16_min_fraction_of_read_copy": min(
            (r["fraction_of_read_copy"] for r in small if "fraction_of_read_copy" in r), default=None
        ),
        "m_le_16_geomean_ratio": statistics.geometric_mean([r["ratio_vs_rowwise"] for r in small]) if small else None,
        "geomean_ratio_vs_tensorwise": statistics.geometric_mean([r["ratio_vs_tensorwise"] for r in results]),
        "m_le_16_min_fraction_of_copy_streamed": (
            min(r["fraction_of_copy_streamed"] for r in small) if small else None
        ),
        "m_le_16_prepared_min_fraction_of_copy_streamed": (
            min(r["prepared_fraction_of_copy_streamed"] for r in small) if small else None
        ),
        "prepared_min_speedup_vs_plain": min(r["prepared_speedup_vs_plain"] for r in results),
        "prepared_geomean_speedup_vs_plain": statistics.geometric_mean(
            [r["prepared_speedup_vs_plain"] for r in results]
        ),
        "prepared_geomean_ratio_all": statistics.geometric_mean([r["prepared_ratio_vs_rowwise"] for r in results]),
        "prepared_equals_plain_everywhere": all(r["prepared_equals_plain"] for r in results),
    }
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="issue 32's 70 shapes after the square ones")
    parser.add_argument("--m", type=int, nargs="*", help="restrict the sweep's M values")
    parser.add_argument("--nk", nargs="*", help="restrict the sweep's (N, K) pairs, written NxK (e.g. 1536x7168)")
    parser.add_argument("--no-square", action="store_true", help="leave out the square shapes")
    parser.add_argument("--no-bf16", action="store_true", help="leave out the bf16 gemm of each shape")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--explore",
        action="store_true",
        help="instead: time every candidate configuration of each case (the bf16 candidates of K / 2 in K steps of"
        " 128: what choose_fp8_config ranks) next to the chosen one, to tune the choice",
    )
    parser.add_argument(
        "--explore-skinny", action="store_true", help="instead: time the skinny kernel's configurations (M <= 16)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="instead: join these records of one commit (a sweep split over calls) into --json, summary recomputed",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    sweep_nk = [tuple(map(int, pair.split("x"))) for pair in args.nk] if args.nk else SWEEP_NK

    if args.merge:
        merge(args.merge, args.json, summarize)
        return 0

    import torch
    from triton.testing import do_bench

    cases = [] if args.no_square else list(SQUARE)
    if args.sweep:
        cases += [(m, n, k) for m in (args.m or SWEEP_M) for n, k in sweep_nk]
    if args.explore:
        return explore(torch, do_bench, cases, args.repeats)
    if args.explore_skinny:
        rows = explore_skinny(torch, do_bench, cases, args.repeats)
        if args.json:
            method = (
                "every skinny_candidates configuration of each M <= 16 case through plan_skinny (plain weights),"
                " do_bench medians (warmup 10 ms, rep 40 ms, L2 flushed) over --repeats; copy: copy_ of N * K / 2"
                " bytes into as many; the chosen configuration first in configs"
            )
            # per shape: the best configuration's time over the chosen one's (below 1: a better one exists)
            summary = {
                f"{r['m']}x{r['n']}x{r['k']}": min(c["us"] for c in r["configs"]) / r["configs"][0]["us"]
                for r in rows
                if r["configs"] and r["configs"][0]["config"] == r["chosen"]
            }
            write_record(args.json, "fp8_gemm_bench", argv, rows, commit=args.commit, method=method, summary=summary)
        return 0
    results = []
    print(
        f"{'M':>5} {'N':>6} {'K':>6}  {'ours TF/s':>9} {'row TF/s':>8} {'tensor':>8} {'bf16':>7}"
        f"  {'ratio':>5} {'prep':>5} {'copy':>5} {'strm':>5}  {'err':>7}  config"
    )
    for m, n, k in cases:
        r = run_case(torch, do_bench, m, n, k, args.repeats, not args.no_bf16)
        results.append(r)
        copy = f"{r['fraction_of_copy']:>5.2f}" if "fraction_of_copy" in r else f"{'':>5}"
        stream = f"{r['fraction_of_copy_streamed']:>5.2f}" if "fraction_of_copy_streamed" in r else f"{'':>5}"
        print(
            f"{m:>5} {n:>6} {k:>6}  {r['flydsl_tflops']:>9.1f} {r['scaled_mm_rowwise_tflops']:>8.1f}"
            f" {r['scaled_mm_tensorwise_tflops']:>8.1f} {r.get('bf16_gemm_tflops', float('nan')):>7.1f}"
            f"  {r['ratio_vs_rowwise']:>5.3f} {r['prepared_speedup_vs_plain']:>5.3f} {copy} {stream}"
            f"  {r['rel_error_vs_f32']:>7.1e}  {r['chosen_config']}",
            flush=True,
        )
    summary = summarize(results)
    print(json.dumps(summary))
    if args.json:
        method = (
            "triton.testing.do_bench median (warmup 10 ms, rep 40 ms, L2 flushed before each call), ours and the peers"
            " interleaved, median over repeats; e4m3 inputs, float32 per-token and per-channel scales, bf16 output;"
            " ratio = _scaled_mm rowwise time / ours; fraction_of_copy = same-bytes copy_ time / ours; *_streamed: per"
            " call, back to back over distinct weights (>= 256 MB a pass) and distinct copy buffers in one CUDA graph,"
            " median of 7 replays; prepared = fp8_gemm on prepare_weight(b)"
        )
        write_record(args.json, "fp8_gemm_bench", argv, results, commit=args.commit, method=method, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
