"""Block-scaled fp8 GEMM on the local GPU: flydsl.kernels.gemm.blockscale_gemm against torch._scaled_mm with blockwise
scales (cuBLAS) and DeepGEMM's fp8_gemm_nt (where ``import deep_gemm`` works) in the same process.

    python benchmarks/blockscale_gemm_bench.py                  # 4096 x 7168 x 16384 (DeepGEMM's headline shape)
    python benchmarks/blockscale_gemm_bench.py --sweep --commit C \
        --json benchmarks/results/blockscale_gemm/DATE_COMMIT.json
    python benchmarks/blockscale_gemm_bench.py --shapes 4096x7168x16384 512x7168x16384 --peers cublas_blockwise deepgemm

Each case: fresh random e4m3 a (M, K) and nn.Linear weights w (N, K) passed as ``w.t()``, float32 scales per 1 x 128
of a (M-major, as ``quantize_fp8(x, "group")`` writes them; also timed row-major) and per 128 x 128 block of w, bf16
output. Ours is checked against a float32 reference of the dequantized operands (relative Frobenius error), then
timed with triton.testing.do_bench (CUDA events, L2 flushed before each call, median of the calls) interleaved with
the peers: ``_scaled_mm`` blockwise (1 x 128 / 128 x 128: the bar; its scale layouts are found by trying the ones
torch versions have taken, each checked against the reference; where none runs, the error is recorded),
``_scaled_mm`` rowwise and our rowwise ``fp8_gemm`` (per-token x per-channel scales: what the promotion costs), the
bf16 ``gemm``, for M <= 128 a same-bytes copy (``copy_`` of N * K / 2 bytes into as many: the bytes the weights'
stream moves, as fp8_gemm_bench.py, moe_bench.py and paged_attention_bench.py take it; ``fraction_of_copy``) and a
copy of all N * K bytes (``fraction_of_read_copy``: it reads what the GEMM reads; until 2026-12-08 this record's
``fraction_of_copy``), and DeepGEMM (the
named peer: deepseek-ai/DeepGEMM's SM90 ``fp8_gemm_nt`` on the same fp8 data and scales, checked against the same
reference; benchmarks/deepgemm_peer.py says how its layouts map; where it does not import, the record says why; build
it on the GPU machine with tools/deepgemm-env.sh). ``--peers`` times a subset of the peers, ``--shapes`` given shapes.
``--repeats`` times; the numbers are medians over the repeats. ``--rested`` also times ours, cuBLAS and DeepGEMM as
DeepGEMM's published numbers were (``*_rested_ms``: an 8 GB memset before each call, the call alone between CUDA
events, the median of 30): a few idle milliseconds of the tensor cores before each call, against do_bench's calls
back to back at the card's sustained power. The sweep is issue 33's: DeepSeek-V3's projections
(N, K) x M in {64, 128, 512, 4096, 8192}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import deepgemm_peer
from record import geomean, write_record

HEADLINE = (4096, 7168, 16384)
SWEEP_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (18432, 7168)]
SWEEP_M = [64, 128, 512, 4096, 8192]
PEERS = (
    "cublas_blockwise",
    "deepgemm",
    "flydsl_row_major_scales",
    "flydsl_rowwise",
    "scaled_mm_rowwise",
    "bf16_gemm",
    "copy",
)
COPIES = {"copy": 2, "copy_read": 1}  # name: the weights' bytes over the bytes copied (copy_ reads and writes them)


def shape_arg(text: str):
    """``MxNxK`` as (M, N, K)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected MxNxK with positive integers, not {text!r}")
    return tuple(int(p) for p in parts)


def _bench(fn, do_bench) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


RESTED_CALLS = 30
RESTED_FILL_BYTES = 8 << 30  # what DeepGEMM's bench_kineto writes before each call


def _bench_rested(torch, fn) -> float:
    """``fn``'s median time in ms over :data:`RESTED_CALLS` calls, each after an 8 GB memset (untimed; CUDA events
    around the call alone): the method of DeepGEMM's published numbers (its ``bench_kineto``: the fill flushes the L2
    and lets the tensor cores idle a few ms between calls, so that they do not run at their sustained power)."""
    fill = torch.empty(RESTED_FILL_BYTES // 4, dtype=torch.int32, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(RESTED_CALLS)]
    fn()
    for start, end in events:
        fill.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _error(x, ref) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def _m_major(torch, scales):
    m, blocks = scales.shape
    buffer = torch.empty(blocks, -(-m // 4) * 4, device=scales.device)
    buffer[:, :m] = scales.t()
    return buffer[:, :m].t()


def _cublas_blockwise(torch, a, b, a_scales, w_scales, reference):
    """The first ``_scaled_mm`` call with 1 x 128 / 128 x 128 scales that runs and matches the reference, as
    (callable, description), or (None, the errors)."""
    errors = []
    for a_name, sa in (("M-major", _m_major(torch, a_scales)), ("row-major", a_scales)):
        for b_name, sb in (("(K/128, N/128) view", w_scales.t()), ("(K/128, N/128)", w_scales.t().contiguous())):
            call = lambda sa=sa, sb=sb: torch._scaled_mm(
                a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
            )  # noqa: E731
            try:
                out = call()
                torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001 (recorded)
                errors.append(f"a {a_name}, b {b_name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                continue
            err = _error(out, reference)
            if err < 2e-2:
                return call, f"a_scales {a_name}, b_scales {b_name}; rel error {err:.2e}"
            errors.append(f"a {a_name}, b {b_name}: ran, rel error {err:.2e} against the reference")
    return None, errors


def operands(torch, m, n, k):
    """Fresh random e4m3 a (M, K) and nn.Linear weights w (N, K), their float32 scales per 1 x 128 of a (row-major)
    and per 128 x 128 block of w, and a float32 reference of the dequantized product."""
    blocks = -(-k // 128)
    a = (torch.randn(m, k, device="cuda") * 16).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 16).clamp(-448, 448).to(torch.float8_e4m3fn)
    a_scales = torch.rand(m, blocks, device="cuda") / 64 + 1e-3
    w_scales = torch.rand(-(-n // 128), blocks, device="cuda") / 64 + 1e-3
    sa = a_scales.repeat_interleave(128, dim=1)[:, :k]
    sw = w_scales.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    reference = (a.float() * sa) @ (w.float() * sw).t()
    return a, w, a_scales, w_scales, reference


def run_case(torch, do_bench, m, n, k, repeats, peers=PEERS, dg=None, rested=False):
    """One shape: ours checked, then timed with ``peers`` (DeepGEMM where ``dg``, the deep_gemm module, is given);
    ``rested``: ours, cuBLAS's and DeepGEMM's also timed as DeepGEMM times itself (:func:`_bench_rested`)."""
    from flydsl.kernels.gemm import blockscale_gemm, fp8_gemm, gemm

    a, w, a_scales, w_scales, reference = operands(torch, m, n, k)
    b = w.t()
    a_scales_m = _m_major(torch, a_scales)
    ours = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    blockscale_gemm(a, b, a_scales_m, w_scales, ours)
    torch.cuda.synchronize()
    result = {"m": m, "n": n, "k": k, "b": "weights (N, K) as w.t()", "rel_error_vs_f32": _error(ours, reference)}
    cublas = None
    if "cublas_blockwise" in peers:
        cublas, how = _cublas_blockwise(torch, a, b, a_scales, w_scales, reference)
        result["cublas_blockwise"] = how if cublas is not None else None
        if cublas is None:
            result["cublas_blockwise_refused"] = how
    deepgemm = None
    if dg is not None and "deepgemm" in peers:
        deepgemm, fields = deepgemm_peer.check(torch, dg, a, w, a_scales, w_scales, reference, _error)
        result.update(fields)
    del reference
    scale_a, scale_b = torch.rand(m, 1, device="cuda") / 64, torch.rand(1, n, device="cuda") / 64
    a16, b16 = a.bfloat16(), b.bfloat16()
    outs = {name: torch.empty_like(ours) for name in ("row", "rowwise", "bf16")}
    timed = {  # ours, then the peers asked for
        "flydsl": lambda: blockscale_gemm(a, b, a_scales_m, w_scales, ours),
        "flydsl_row_major_scales": lambda: blockscale_gemm(a, b, a_scales, w_scales, outs["row"]),
        "flydsl_rowwise": lambda: fp8_gemm(a, b, scale_a, scale_b, outs["rowwise"]),
        "scaled_mm_rowwise": lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16),
        "bf16_gemm": lambda: gemm(a16, b16, outs["bf16"]),
    }
    if cublas is not None:
        timed["cublas_blockwise"] = cublas
    if deepgemm is not None:
        timed["deepgemm"] = deepgemm
    if m <= 128 and "copy" in peers:  # the bytes the weights' stream moves, and a copy reading all of them
        copies = {name: torch.empty(n * k // parts, dtype=torch.uint8, device="cuda") for name, parts in COPIES.items()}
        targets = {name: torch.empty_like(source) for name, source in copies.items()}
        for name in COPIES:
            timed[name] = lambda name=name: targets[name].copy_(copies[name])
    timed = {name: fn for name, fn in timed.items() if name == "flydsl" or name in peers or name in COPIES}
    runs = {name: [] for name in timed}
    for _ in range(repeats):
        for name, fn in timed.items():
            runs[name].append(_bench(fn, do_bench))
    flops = 2.0 * m * n * k
    ms = {name: statistics.median(values) for name, values in runs.items()}
    for name, t in ms.items():
        result[f"{name}_ms"] = t
        if name not in COPIES:
            result[f"{name}_tflops"] = flops / t / 1e9
    if "cublas_blockwise" in ms:
        result["ratio_vs_cublas"] = ms["cublas_blockwise"] / ms["flydsl"]
    if "deepgemm" in ms:
        result["ratio_vs_deepgemm"] = ms["deepgemm"] / ms["flydsl"]  # DeepGEMM's time / ours
    if "flydsl_rowwise" in ms:
        result["ratio_vs_rowwise"] = ms["flydsl_rowwise"] / ms["flydsl"]  # ours rowwise time / ours block-scaled
    if "flydsl_row_major_scales" in ms:
        result["row_major_scales_speedup"] = ms["flydsl"] / ms["flydsl_row_major_scales"]
    if "copy" in ms:
        result["fraction_of_copy"] = ms["copy"] / ms["flydsl"]
        result["fraction_of_read_copy"] = ms["copy_read"] / ms["flydsl"]
    for name in ("flydsl", "cublas_blockwise", "deepgemm") if rested else ():
        if name in timed:
            result[f"{name}_rested_ms"] = _bench_rested(torch, timed[name])
            result[f"{name}_rested_tflops"] = flops / result[f"{name}_rested_ms"] / 1e9
    result["runs_ms"] = runs
    return result


def summarize(results, deepgemm=None) -> dict:
    """The record's summary; ``deepgemm``: deepgemm_peer.load()'s description (None where it was not asked for)."""
    cublas = [r["ratio_vs_cublas"] for r in results if "ratio_vs_cublas" in r]
    dg = [r["ratio_vs_deepgemm"] for r in results if "ratio_vs_deepgemm" in r]
    headline = [r for r in results if (r["m"], r["n"], r["k"]) == HEADLINE]
    decode = [r["fraction_of_copy"] for r in results if "fraction_of_copy" in r]
    decode_read = [r["fraction_of_read_copy"] for r in results if "fraction_of_read_copy" in r]
    rowwise = [r["ratio_vs_rowwise"] for r in results if r["m"] >= 512 and "ratio_vs_rowwise" in r]
    return {
        "tflops_4096x7168x16384": headline[0]["flydsl_tflops"] if headline else None,
        "geomean_ratio_vs_cublas": geomean(cublas),
        "min_ratio_vs_cublas": min(cublas) if cublas else None,
        "cases_vs_cublas": len(cublas),
        "cases_cublas_refused": sum(1 for r in results if "cublas_blockwise_refused" in r),
        "geomean_ratio_vs_deepgemm": geomean(dg),
        "min_ratio_vs_deepgemm": min(dg) if dg else None,
        "deepgemm_tflops_4096x7168x16384": headline[0].get("deepgemm_tflops") if headline else None,
        "cases_vs_deepgemm": len(dg),
        "cases_deepgemm_refused": sum(1 for r in results if "deepgemm_refused" in r),
        "deepgemm_commit": (deepgemm or {}).get("commit"),
        "deepgemm_import_error": (deepgemm or {}).get("import_error"),
        "max_deepgemm_rel_error_vs_f32": max(
            (r["deepgemm_rel_error_vs_f32"] for r in results if "deepgemm_rel_error_vs_f32" in r), default=None
        ),
        "geomean_ratio_vs_rowwise_m_ge_512": geomean(rowwise),
        "decode_min_fraction_of_copy": min(decode) if decode else None,
        "decode_min_fraction_of_read_copy": min(decode_read) if decode_read else None,
        "tflops_4096x7168x16384_rested": headline[0].get("flydsl_rested_tflops") if headline else None,
        "deepgemm_tflops_4096x7168x16384_rested": headline[0].get("deepgemm_rested_tflops") if headline else None,
        "geomean_row_major_scales_speedup": geomean(
            [r["row_major_scales_speedup"] for r in results if "row_major_scales_speedup" in r]
        ),
        "max_rel_error_vs_f32": max(r["rel_error_vs_f32"] for r in results),
    }


def _cell(r, key, width, fmt=".1f"):
    return f"{r[key]:>{width}{fmt}}" if key in r else f"{'-':>{width}}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="issue 33's 35 shapes after the headline one")
    parser.add_argument("--m", type=int, nargs="*", help="restrict the sweep's M values")
    parser.add_argument("--shapes", type=shape_arg, nargs="+", metavar="MxNxK", help="these shapes instead")
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS), help="the peers timed (default all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--rested",
        action="store_true",
        help="also time ours, cuBLAS and DeepGEMM as DeepGEMM's published numbers are (an 8 GB fill before each call)",
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    if args.shapes and (args.sweep or args.m):
        parser.error("--shapes replaces the headline shape and the sweep: give it without --sweep and --m")

    import torch
    from triton.testing import do_bench

    dg, deepgemm = deepgemm_peer.load() if "deepgemm" in args.peers else (None, None)
    if deepgemm is not None:
        print("DeepGEMM:", deepgemm, flush=True)
    cases = args.shapes or [HEADLINE]
    if args.sweep:
        cases += [(m, n, k) for m in (args.m or SWEEP_M) for n, k in SWEEP_NK]
    results = []
    print(
        f"{'M':>5} {'N':>6} {'K':>6}  {'ours TF/s':>9} {'cuBLAS':>7} {'DeepGEMM':>8} {'rowwise':>7} {'sm_row':>7}"
        f" {'bf16':>7}  {'vs cuBLAS':>9} {'vs DG':>6} {'vs row':>6} {'rowmaj':>6} {'copy':>5}  {'err':>7}"
    )
    for m, n, k in cases:
        r = run_case(torch, do_bench, m, n, k, args.repeats, args.peers, dg, args.rested)
        results.append(r)
        print(
            f"{m:>5} {n:>6} {k:>6}  {r['flydsl_tflops']:>9.1f} {_cell(r, 'cublas_blockwise_tflops', 7)}"
            f" {_cell(r, 'deepgemm_tflops', 8)} {_cell(r, 'flydsl_rowwise_tflops', 7)}"
            f" {_cell(r, 'scaled_mm_rowwise_tflops', 7)} {_cell(r, 'bf16_gemm_tflops', 7)}"
            f"  {_cell(r, 'ratio_vs_cublas', 9, '.3f')} {_cell(r, 'ratio_vs_deepgemm', 6, '.3f')}"
            f" {_cell(r, 'ratio_vs_rowwise', 6, '.3f')} {_cell(r, 'row_major_scales_speedup', 6, '.3f')}"
            f" {_cell(r, 'fraction_of_copy', 5, '.2f')}  {r['rel_error_vs_f32']:>7.1e}",
            flush=True,
        )
    if results and results[0].get("cublas_blockwise_refused"):
        print("cuBLAS blockwise refused:", *results[0]["cublas_blockwise_refused"], sep="\n  ")
    refused = {f"{r['m']}x{r['n']}x{r['k']}": r["deepgemm_refused"] for r in results if "deepgemm_refused" in r}
    if refused:
        print("DeepGEMM refused:", *(f"{shape}: {why}" for shape, why in refused.items()), sep="\n  ")
    summary = summarize(results, deepgemm)
    print(json.dumps(summary))
    if args.json:
        method = (
            "triton.testing.do_bench median (warmup 10 ms, rep 40 ms, L2 flushed before each call), ours and the peers"
            " interleaved, median over repeats; e4m3 inputs, float32 scales per 1 x 128 of a (M-major; also"
            " row-major) and 128 x 128 of w, bf16 output; ratio_vs_cublas = _scaled_mm blockwise time / ours;"
            " ratio_vs_deepgemm = DeepGEMM fp8_gemm_nt time / ours (same a, w and scales: a's through DeepGEMM's"
            " get_mn_major_tma_aligned_tensor once, untimed; its first call, the JIT compile, untimed);"
            " ratio_vs_rowwise = our rowwise fp8_gemm time / ours; fraction_of_copy = same-bytes copy_ (N * K / 2"
            " bytes) time / ours; fraction_of_read_copy = copy_ of N * K bytes time / ours; *_rested_ms (--rested):"
            " the median of 30 calls, each alone between CUDA events after an untimed 8 GB memset (DeepGEMM's"
            " bench_kineto's fill)"
        )
        write_record(
            args.json,
            "blockscale_gemm_bench",
            argv,
            results,
            commit=args.commit,
            method=method,
            summary=summary,
            peers=args.peers,
            deepgemm=deepgemm,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
