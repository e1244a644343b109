"""Cold compile time of each example kernel (and of host_overhead.py's six-tensor noop6): trace, Fly lowering,
NVVM/LLVM, PTX, ptxas (disk cache bypassed).

    python benchmarks/compile_times.py [--json PATH]

Runs without a GPU (kernels are compiled for `flyc.TensorSpec` arguments). Median of 3 compiles per kernel, each
through a fresh KernelFunction (no in-memory cache) with FLYDSL_RUNTIME_ENABLE_CACHE=0.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from record import write_record  # noqa: E402

import flydsl.compiler as flyc  # noqa: E402


def _cases():
    import gemm_2_mma_sync
    import tiled_copy
    import vector_add
    from host_overhead import noop6_kernel  # this folder's sibling script

    f16, bf16 = flyc.TensorSpec((1024, 1024), "f16"), flyc.TensorSpec((512, 512), "bf16")
    vec = flyc.TensorSpec((1 << 20,), "f32")
    return {
        "vector_add": (vector_add.vector_add, (vec, vec, vec, 1 << 20)),
        "tiled_copy": (tiled_copy.tiled_copy, (f16, f16, True)),
        "gemm_2_mma_sync": (gemm_2_mma_sync.gemm_mma_sync, (bf16, bf16, flyc.TensorSpec((512, 512), "f32"))),
        "noop6": (noop6_kernel(), (flyc.TensorSpec((64,), "f32"),) * 6),  # host_overhead.py's six-tensor launch
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"] = "0"
    results = {}
    for name, (kernel, kernel_args) in _cases().items():
        runs = []
        for _ in range(3):
            fresh = flyc.KernelFunction(kernel.fn)
            start = time.perf_counter()
            fresh.lower(*kernel_args)
            runs.append((time.perf_counter() - start) * 1e3)
        results[name] = {"median_ms": statistics.median(runs), "runs_ms": runs}
        print(f"{name:<12} {statistics.median(runs):7.1f} ms cold compile (trace + lower + PTX + ptxas)")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        method = "median of 3 cold compiles: lower() of a fresh KernelFunction (trace, lowering, PTX, ptxas)"
        cpu = platform.processor() or platform.machine()
        write_record(args.json, "compile_times", argv, results, commit=commit.stdout.strip(), method=method, cpu=cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
