"""Which cuBLAS kernel ``torch.matmul`` runs for GEMM shapes (B given as nn.Linear weights, as gemm_bench's sweep),
and its median time under the torch profiler. cuBLAS's kernel names spell out its choice, e.g.
``nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT``: tile 192 x 128 in cuBLAS's column-major view (our N x M), K
steps of 64, 5 stages, a 1 x 2 cluster. (Times run back to back without an L2 flush: compare them with each other,
not with gemm_bench's.)

    python benchmarks/cublas_kernels.py --json benchmarks/results/cublas_kernels/DATE_WHAT.json --commit C
    python benchmarks/cublas_kernels.py --shapes 2048x1536x7168 512x1536x7168
"""

from __future__ import annotations

import argparse
import statistics
import sys

from record import write_record

DEFAULT_SHAPES = [
    (2048, 1536, 7168),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (512, 1536, 7168),
    (128, 18432, 7168),
    (2048, 4096, 4096),
    (128, 1536, 7168),
    (512, 4096, 4096),
    (2048, 7168, 16384),
    (8192, 4096, 4096),
]


def _shape(text: str) -> tuple:
    m, n, k = (int(v) for v in text.lower().split("x"))
    return m, n, k


def kernels_of(torch, m: int, n: int, k: int, runs: int = 5) -> dict:
    """The CUDA kernels one ``a @ w.t()`` launches (sorted names) and the median time of the longest one."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ w.t()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(runs):
            a @ w.t()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = sorted({e.name for e in events})
    main = max(names, key=lambda name: sum(e.device_time for e in events if e.name == name))
    us = statistics.median(e.device_time for e in events if e.name == main)
    return {
        "m": m,
        "n": n,
        "k": k,
        "kernels": names,
        "main_kernel": main,
        "median_us": us,
        "tflops": 2 * m * n * k / us / 1e6,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", type=_shape, help="MxNxK (default: the sweep's slowest shapes)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    import torch

    results = []
    for m, n, k in args.shapes or DEFAULT_SHAPES:
        row = kernels_of(torch, m, n, k)
        results.append(row)
        print(f"{m:>6} {n:>6} {k:>6}  {row['tflops']:7.1f} TF/s  {row['main_kernel']}", flush=True)
    if args.json:
        method = "torch.profiler CUDA events of 5 back-to-back a @ w.t() after 3 warm-up calls (no L2 flush)"
        write_record(args.json, "cublas_kernels", argv, results, commit=args.commit, method=method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
