"""One profiled call of each block-scaled GEMM of interest at one shape, for Nsight Compute on the GPU machine:

    source tools/gpu-env.sh && source tools/deepgemm-env.sh --env   # DeepGEMM where it was built (optional)
    ncu --profile-from-start off --clock-control none --set full -o $OUT/blockscale -f \\
        python3 tools/ncu_blockscale_probe.py [--shape 4096x7168x16384] [flydsl flydsl-128 rowwise deepgemm]
    ncu --import $OUT/blockscale.ncu-rep --page raw --csv > $OUT/blockscale_raw.csv

Each case runs three times unprofiled (compiles and JIT outside the profile), then once between
``cudaProfilerStart`` and ``Stop``: ``flydsl`` (``blockscale_gemm`` with M-major a scales, its chosen tile),
``flydsl-128`` (the same with 128 x 128 tiles in 2-CTA clusters: the paired mainloop), ``rowwise`` (``fp8_gemm``
with per-token and per-channel scales: no promotion) and ``deepgemm`` (DeepGEMM's ``fp8_gemm_nt``, the named peer;
skipped where it does not import). Then prints the template arguments of each DeepGEMM kernel its JIT cache holds
(``DG_JIT_CACHE_DIR``): the tile it chose. Run from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re

import torch
from ncu_decode_probe import profiled  # three calls, then one between cudaProfilerStart and Stop

from flydsl.kernels.gemm import blockscale_gemm, fp8_gemm
from flydsl.kernels.gemm.config import choose_blockscale_config

CASES = ("flydsl", "flydsl-128", "rowwise", "deepgemm")


def operands(m, n, k):
    """e4m3 a (M, K) and nn.Linear weights w (N, K); float32 scales per 1 x 128 of a (M-major, as quantize_fp8 writes
    them) and per 128 x 128 block of w; per-token and per-channel scales for the rowwise GEMM."""
    a = (torch.randn(m, k, device="cuda") * 16).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 16).clamp(-448, 448).to(torch.float8_e4m3fn)
    blocks = -(-k // 128)
    a_scales = (torch.rand(blocks, m, device="cuda") / 64 + 1e-3).t()  # M-major (M, K / 128)
    w_scales = torch.rand(-(-n // 128), blocks, device="cuda") / 64 + 1e-3
    return a, w, a_scales, w_scales


def deepgemm_kernels() -> None:
    """The template arguments of the DeepGEMM kernels in its JIT cache (their tiles, stages, clusters)."""
    cache = os.environ.get("DG_JIT_CACHE_DIR", os.path.expanduser("~/.deep_gemm"))
    for path in sorted(glob.glob(os.path.join(cache, "cache", "*", "kernel.cu"))):
        text = open(path).read()
        found = re.search(r"&(\w+)<([^>]*)>", text, re.S)
        name = os.path.basename(os.path.dirname(path)).split(".")[1]
        print(f"deepgemm kernel {name}: " + (" ".join(found.group(2).split()) if found else "?"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", choices=CASES, default=list(CASES))
    parser.add_argument("--shape", default="4096x7168x16384", help="MxNxK")
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    a, w, a_scales, w_scales = operands(m, n, k)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen = choose_blockscale_config(m, n, k, sms)
    print(f"shape {m}x{n}x{k}: flydsl's tile {chosen}", flush=True)
    for case in args.cases:
        if case == "flydsl":
            profiled(lambda: blockscale_gemm(a, w.t(), a_scales, w_scales, out))
        elif case == "flydsl-128":
            cfg = dataclasses.replace(chosen, tile_n=128, stages=6)
            print(f"flydsl-128: {cfg}", flush=True)
            profiled(lambda cfg=cfg: blockscale_gemm(a, w.t(), a_scales, w_scales, out, config=cfg))
        elif case == "rowwise":
            scale_a = torch.rand(m, device="cuda") / 64 + 1e-3
            scale_w = torch.rand(n, device="cuda") / 64 + 1e-3
            profiled(lambda sa=scale_a, sw=scale_w: fp8_gemm(a, w.t(), sa, sw, out=out))
        else:
            try:
                import deep_gemm
            except ImportError as error:
                print(f"deepgemm: not run ({error})", flush=True)
                continue
            sfa = deep_gemm.get_mn_major_tma_aligned_tensor(a_scales.contiguous())
            profiled(lambda sfa=sfa: deep_gemm.fp8_gemm_nt((a, sfa), (w, w_scales), out))
            deepgemm_kernels()


if __name__ == "__main__":
    main()
