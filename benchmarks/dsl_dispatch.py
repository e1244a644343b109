"""The DSL's host costs: dispatch per launch, compile time of the examples, and a first call from the disk cache.

    python benchmarks/dsl_dispatch.py [--calls 10000] [--repeats 5] [--json PATH --commit C]

1. Dispatch: a trivial ``@flyc.kernel`` with six ``fx.Tensor`` parameters launched from Python with torch tensors
   (argument checks, specialization lookup, torch's current stream, the native launch), 10,000 times back to back,
   host time per call, median of the repeats; next to the launcher alone and the peers (torch ``add_``, a Triton
   kernel, cuda-bindings) from ``launch_overhead.py``, measured in the same process. ``launch`` takes the native
   path (``runtime.Dispatcher``); the Python path it falls back to (first launches, other tensor types) is timed
   too, as are the pieces of a launch (``pieces_us``: torch's attribute reads, the current stream, the call).
2. Cold compile of each example kernel (trace, lower, PTX, ptxas), disk cache bypassed.
3. First call in a new process whose disk cache holds the kernel: the time of the first ``launch`` after import and
   CUDA context creation (so: cache lookup, module load, launch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import launch_overhead  # the peers and the timing loop, from the same folder
from record import write_record  # this folder's sibling module

import flydsl.compiler as flyc
import flydsl.expr as fx

ROOT = Path(__file__).resolve().parents[1]


@flyc.kernel
def noop6(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, d: fx.Tensor, e: fx.Tensor, f: fx.Tensor):
    if fx.gpu.thread_idx.x + fx.gpu.block_idx.x == 0:
        a[0] = fx.Float32(1.0)


def _dispatch_cases(torch, tensors):
    a, b, c, d, e, f = tensors
    compiled = flyc.compile(noop6, a, b, c, d, e, f)

    def kernel_call(n):
        for _ in range(n):
            noop6(a, b, c, d, e, f).launch(1, 32)

    def compiled_call(n):
        for _ in range(n):
            compiled(a, b, c, d, e, f, grid=1, block=32)

    def python_path(n):  # what launch falls back to: specialize, dict lookup, Function.launch
        for _ in range(n):
            noop6(a, b, c, d, e, f)._launch(1, 32, None, None, None)

    def dispatcher_alone(n):
        dispatch, values = noop6._dispatch, (a, b, c, d, e, f)
        for _ in range(n):
            dispatch(values, 1, 32, None, None, None)

    return {
        "flydsl @kernel(...).launch": kernel_call,
        "flydsl compile(...) callable": compiled_call,
        "flydsl @kernel Python path (KernelCall._launch)": python_path,
        "flydsl Dispatcher.launch alone": dispatcher_alone,
    }


def _pieces_us(torch, tensors, calls: int) -> dict:
    """Host time of the pieces of a launch, without launching (timeit, best of 5)."""
    import timeit

    a, b, c, d, e, f = tensors
    getter = torch._C._cuda_getCurrentRawStream
    statements = {
        "torch reads x6 (is_cuda, dtype, data_ptr(), shape, stride())": (
            "for t in ts: t.is_cuda; t.dtype; t.data_ptr(); t.shape; t.stride()"
        ),
        "torch stride() x6": "for t in ts: t.stride()",
        "torch data_ptr() x6": "for t in ts: t.data_ptr()",
        "current stream (get_device + _cuda_getCurrentRawStream)": "getter(a.get_device())",
        "KernelCall: noop6(a, b, c, d, e, f)": "noop6(a, b, c, d, e, f)",
        "specialize (Python)": "noop6.specialize(ts)",
        "Dispatcher.describe (native, builds the key tuple)": "noop6._dispatcher.describe(ts)",
        "empty loop": "for t in ts: pass",
    }
    prepared = noop6.new_dispatcher()  # a kernel registered without a Function: launch does everything but launch
    spec = noop6.specialize(list(tensors))
    prepared.add(spec.key, None, noop6.loaded(spec).signature, 0)
    statements["Dispatcher.launch without the launch (reads, key, stream, packing)"] = "prepared.launch(ts, 1, 32)"
    statements["torch is_cuda x6"] = "for t in ts: t.is_cuda"
    statements["torch dtype x6"] = "for t in ts: t.dtype"
    statements["torch shape x6"] = "for t in ts: t.shape"
    names = {
        "ts": tuple(tensors),
        "a": a,
        "getter": getter,
        "noop6": noop6,
        "prepared": prepared,
        "b": b,
        "c": c,
        "d": d,
        "e": e,
        "f": f,
    }
    return {
        label: min(timeit.repeat(statement, globals=names, number=calls, repeat=5)) / calls * 1e6
        for label, statement in statements.items()
    }


FIRST_CALL = textwrap.dedent("""
    import time, torch
    import flydsl.compiler as flyc, flydsl.expr as fx

    @flyc.kernel
    def scale(x: fx.Tensor, y: fx.Tensor, n: fx.Int32):
        i = fx.gpu.block_idx.x * fx.gpu.block_dim.x + fx.gpu.thread_idx.x
        if i < n:
            y[i] = x[i] * 2.0

    x = torch.randn(1 << 20, device="cuda"); y = torch.empty_like(x); torch.cuda.synchronize()
    start = time.perf_counter()
    scale(x, y, x.numel()).launch((x.numel() + 255) // 256, 256)
    torch.cuda.synchronize()
    print((time.perf_counter() - start) * 1e3)
    assert torch.equal(y, x * 2)
    """)


def _first_call_ms() -> dict:
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**os.environ, "FLYDSL_CACHE_DIR": cache_dir}
        script = Path(cache_dir) / "first_call.py"  # kernels need a source file (the tracer reads it)
        script.write_text(FIRST_CALL)
        run = [sys.executable, str(script)]
        cold = float(subprocess.run(run, env=env, check=True, capture_output=True, text=True).stdout.strip())
        warm = [
            float(subprocess.run(run, env=env, check=True, capture_output=True, text=True).stdout.strip())
            for _ in range(5)
        ]
    return {"cold_ms": cold, "disk_hit_ms": statistics.median(warm), "disk_hit_runs_ms": warm}


def _compile_times() -> dict:
    """Cold compile (disk cache bypassed) of each example kernel, median of 3."""
    sys.path.insert(0, str(ROOT / "examples"))
    import tiled_copy

    cases = {
        "tiled_copy": (tiled_copy.tiled_copy, (flyc.TensorSpec((1024, 1024), "f16"),) * 2 + (True,)),
        "noop6": (noop6, (flyc.TensorSpec((64,), "f32"),) * 6),
    }
    os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"] = "0"
    try:
        times = {}
        for name, (kernel, args) in cases.items():
            runs = []
            for _ in range(3):
                fresh = flyc.KernelFunction(kernel.fn)
                start = time.perf_counter()
                fresh.lower(*args)
                runs.append((time.perf_counter() - start) * 1e3)
            times[name] = statistics.median(runs)
        return times
    finally:
        del os.environ["FLYDSL_RUNTIME_ENABLE_CACHE"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--commit", help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("dsl_dispatch: needs a CUDA GPU", file=sys.stderr)
        return 1
    tensors = [torch.zeros(64, device="cuda") for _ in range(launch_overhead.NUM_ARGS)]
    stream = torch.cuda.current_stream().cuda_stream
    cases = _dispatch_cases(torch, tensors)
    _, launcher = launch_overhead._flydsl_cases(torch, tensors, stream)
    cases["flydsl native launcher (LoadedModule.launch)"] = launcher["flydsl LoadedModule.launch"]
    cases.update(launch_overhead._torch_case(torch))
    errors = {}
    try:
        cases.update(launch_overhead._triton_case(tensors))
    except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported
        errors["triton"] = f"{type(error).__name__}: {error}"
    # Repeats interleaved (each round times every case once), so that drift of the machine (clocks, neighbours)
    # weighs on every case alike: timed one case after the other, the first cases once read 1.5-2x slow.
    rounds = [
        {name: launch_overhead._time_case(loop, args.calls, 1, torch.cuda.synchronize) for name, loop in cases.items()}
        for _ in range(args.repeats)
    ]
    results = {}
    for name in cases:
        host = [r[name]["us_per_launch"] for r in rounds]
        synced = [r[name]["us_per_launch_with_sync"] for r in rounds]
        results[name] = {
            "us_per_launch": statistics.median(host),
            "us_per_launch_with_sync": statistics.median(synced),
            "repeats_us": host,
        }
    ours = results["flydsl @kernel(...).launch"]["us_per_launch"]
    width = max(map(len, results))
    print(f"\n{'case':<{width}}  {'us/launch':>9}  {'x ours':>6}")
    for name, r in results.items():
        print(f"{name:<{width}}  {r['us_per_launch']:9.2f}  {r['us_per_launch'] / ours:6.2f}")
    pieces = _pieces_us(torch, tensors, args.calls)
    print("\npieces of a launch (no launch), us:")
    for name, us in pieces.items():
        print(f"  {us:6.3f}  {name}")
    compile_ms = _compile_times()
    print("\ncold compile (trace + lower + PTX + ptxas), ms:", {k: round(v, 1) for k, v in compile_ms.items()})
    first = _first_call_ms()
    print(
        f"first launch in a new process: {first['cold_ms']:.1f} ms compiling, {first['disk_hit_ms']:.2f} ms from the"
        " disk cache (after import and CUDA context creation)"
    )
    if args.json:
        measured = {
            "dispatch_us": {name: r["us_per_launch"] for name, r in results.items()},
            "dispatch_repeats_us": {name: r["repeats_us"] for name, r in results.items()},
            "pieces_us": pieces,
            "cold_compile_ms": compile_ms,
            "first_call": first,
        }
        versions = {name: launch_overhead._version(name) for name in ("torch", "triton")}
        write_record(args.json, "dsl_dispatch", argv, measured, commit=args.commit, versions=versions, errors=errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
