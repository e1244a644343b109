"""Cold compile time: trace, Fly lowering, NVVM/LLVM, PTX, ptxas (disk cache bypassed), without a GPU.

    python benchmarks/compile_times.py [--parts examples zoo] [--processes 3] [--json PATH]

``examples``: each example kernel (and host_overhead.py's six-tensor noop6), median of 3 compiles in this process,
each through a fresh KernelFunction (no in-memory cache) with FLYDSL_RUNTIME_ENABLE_CACHE=0 (the later compiles
reuse the process's rewritten functions and MLIR context).
``zoo``: the GEMM family's planned kernels (bf16 warp-specialized, fp8 per-row/per-column scaled, block-scaled fp8,
the skinny M <= 16 kernel) as a user's first call compiles them: each in a fresh process (imports before the clock)
with an empty disk cache and the default isolated compile; median over ``--processes``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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
    from launch_levels import noop6_kernel  # this folder's sibling script

    f16, bf16 = flyc.TensorSpec((1024, 1024), "f16"), flyc.TensorSpec((512, 512), "bf16")
    vec = flyc.TensorSpec((1 << 20,), "f32")
    return {
        "vector_add": (vector_add.vector_add, (vec, vec, vec, 1 << 20)),
        "tiled_copy": (tiled_copy.tiled_copy, (f16, f16, True)),
        "gemm_2_mma_sync": (gemm_2_mma_sync.gemm_mma_sync, (bf16, bf16, flyc.TensorSpec((512, 512), "f32"))),
        "noop6": (noop6_kernel(), (flyc.TensorSpec((64,), "f32"),) * 6),  # host_overhead.py's six-tensor launch
    }


def _zoo_plans() -> dict:
    from flydsl.kernels.gemm.epilogue import Scale
    from flydsl.kernels.gemm.operands import MatrixSpec
    from flydsl.kernels.gemm.plan import plan_blockscale, plan_gemm

    def dense(shape, dtype="bf16"):
        return MatrixSpec.dense(shape, dtype)

    def weight(n, k, dtype="bf16"):  # an nn.Linear weight passed as W.t()
        return dense((n, k), dtype).transposed()

    f8, m, n, k = "f8E4M3FN", 4096, 4096, 4096
    row_scales = ((Scale(rows=1), dense((m,), "f32")), (Scale(columns=1), dense((n,), "f32")))
    return {
        "gemm_bf16": lambda: plan_gemm(dense((m, k)), weight(n, k), dense((m, n)), sms=132),
        "fp8_gemm": lambda: plan_gemm(dense((m, k), f8), weight(n, k, f8), dense((m, n)), sms=132, scales=row_scales),
        "blockscale_gemm": lambda: plan_blockscale(
            dense((m, k), f8),
            weight(n, k, f8),
            dense((m, n)),
            dense((m, k // 128), "f32"),
            dense((n // 128, k // 128), "f32"),
            sms=132,
        ),
        "skinny_gemm": lambda: plan_gemm(dense((16, k)), weight(n, k), dense((16, n)), sms=132),
    }


def _zoo_child(name: str) -> None:
    """One fresh process: plan (imports and planning before the clock), then lower every launch of the plan."""
    plan = _zoo_plans()[name]()
    start = time.perf_counter()
    modules = plan.lower()
    print(f"{(time.perf_counter() - start) * 1e3:.1f} {len(modules)}")


def _zoo(processes: int) -> dict:
    results = {}
    for name in _zoo_plans():
        runs = []
        for _ in range(processes):
            with tempfile.TemporaryDirectory(prefix="flydsl-compile-times-") as cache:
                env = dict(os.environ, FLYDSL_CACHE_DIR=cache)
                env.pop("FLYDSL_RUNTIME_ENABLE_CACHE", None)
                command = [sys.executable, *(["-S"] if sys.flags.no_site else []), __file__, "--zoo-child", name]
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
                if done.returncode != 0:
                    raise RuntimeError(f"{name}: {' / '.join(done.stderr.strip().splitlines()[-3:])}")
                ms, launches = done.stdout.split()[-2:]
                runs.append(float(ms))
        results[name] = {"median_ms": statistics.median(runs), "runs_ms": runs, "kernels": int(launches)}
        print(f"{name:<16} {statistics.median(runs):7.1f} ms first compile in a fresh process ({launches} kernel)")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=("examples", "zoo"), default=["examples", "zoo"])
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per zoo kernel")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--zoo-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.zoo_child:
        _zoo_child(args.zoo_child)
        return 0
    zoo = _zoo(args.processes) if "zoo" in args.parts else {}
    os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"] = "0"
    results = {}
    for name, (kernel, kernel_args) in (_cases() if "examples" in args.parts else {}).items():
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
        method = (
            "examples: median of 3 cold compiles, lower() of a fresh KernelFunction (trace, lowering, PTX, ptxas);"
            " zoo: a GEMM plan's lower() in fresh processes with empty disk caches (median)"
        )
        cpu = platform.processor() or platform.machine()
        summary = {"zoo_first_compile_ms": {name: round(r["median_ms"], 1) for name, r in zoo.items()}}
        summary["examples_ms"] = {name: round(r["median_ms"], 1) for name, r in results.items()}
        write_record(
            args.json,
            "compile_times",
            argv,
            {"examples": results, "zoo": zoo},
            commit=commit.stdout.strip(),
            method=method,
            cpu=cpu,
            summary=summary,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
