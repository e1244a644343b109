"""One profiled call of each decode-sized kernel of interest, for Nsight Compute on the GPU machine:

    source tools/gpu-env.sh
    ncu --profile-from-start off --clock-control none --set full -o $OUT/probe -f \\
        python3 tools/ncu_decode_probe.py [qwen3 dsv3-tp8 gemm copy read]
    ncu --import $OUT/probe.ncu-rep --page raw --csv > $OUT/probe_raw.csv

(``gpu__time_duration.sum``: the kernel's time without its launch; ``dram__bytes_read.sum``.) Each case runs three
times unprofiled, then once between ``cudaProfilerStart`` and ``Stop``: fused_moe at one token (Qwen3-30B-A3B,
DeepSeek-V3 TP8; fp8 per channel), fp8_gemm at 16x1536x7168, 1x1536x7168 and 16x7168x2048, copies (cudaMemcpy: not
kernels, which ncu does not see) and torch's read-only reduction over 11 and 25 MB (the rate any kernel reads a cold
buffer at). ncu flushes L2 before each profiled kernel by default. The record of 2026-12-05:
``benchmarks/results/moe_decode_sweep/2026-12-05_ac82efb_ncu_h100.json``. Run from the repository root.
"""

from __future__ import annotations

import functools
import sys

import torch

sys.path.insert(0, "benchmarks")
from moe_torch import format_weights  # noqa: E402

from flydsl.kernels.gemm import fp8_gemm  # noqa: E402
from flydsl.kernels.moe import fused_moe, topk_route  # noqa: E402

MODELS = {"qwen3": (128, 8, 2048, 768), "dsv3-tp8": (256, 8, 7168, 256)}  # E, top_k, H, I
GEMMS = ((16, 1536, 7168), (1, 1536, 7168), (16, 7168, 2048))


def profiled(fn) -> None:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def moe_case(experts: int, top_k: int, hidden: int, inter: int) -> None:
    torch.manual_seed(0)
    w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16).mul_(hidden**-0.5)
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16).mul_(inter**-0.5)
    weights = format_weights(w1, w2, "fp8")
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    topk_weights, ids = topk_route(torch.randn(1, experts, device="cuda"), top_k)
    options = dict(quant="fp8", granularity="channel", w1_scale=weights.w1_scale, w2_scale=weights.w2_scale)
    profiled(functools.partial(fused_moe, x, weights.w1, weights.w2, topk_weights, ids, **options))


def gemm_case(m: int, n: int, k: int) -> None:
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
    profiled(functools.partial(fp8_gemm, a, w.t(), scale_a, scale_b, out_dtype=torch.bfloat16))


def copy_case(nbytes: int) -> None:
    source = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    profiled(functools.partial(torch.empty_like(source).copy_, source))


def read_case(nbytes: int) -> None:
    profiled(torch.ones(nbytes // 4, dtype=torch.float32, device="cuda").sum)


def main(which) -> None:
    for name in which or ["qwen3", "dsv3-tp8", "gemm", "copy", "read"]:
        if name in MODELS:
            moe_case(*MODELS[name])
        elif name == "gemm":
            for shape in GEMMS:
                gemm_case(*shape)
        elif name == "copy":
            for nbytes in (25 << 20, 11 << 20, 22 << 20, 38 << 20):
                copy_case(nbytes)
        elif name == "read":
            for nbytes in (11 << 20, 25 << 20):
                read_case(nbytes)
        else:
            raise SystemExit(f"ncu_decode_probe: unknown case {name!r} (qwen3, dsv3-tp8, gemm, copy, read)")


if __name__ == "__main__":
    main(sys.argv[1:])
