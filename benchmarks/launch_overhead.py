"""Host time per kernel launch from Python: FlyDSL's native launcher next to torch, Triton and cuda-bindings.

    python benchmarks/launch_overhead.py [--calls 10000] [--repeats 5] [--json PATH --commit C]

Every case launches a trivial kernel (one store from thread 0) with six pointer arguments taken from torch tensors, on
torch's current stream, 10,000 times back to back. The clock (time.perf_counter) stops when the loop returns, before
the synchronize that follows it: the numbers are host-side time per call. Each case warms up first; the reported
figure is the median of the repeats. ``sync us`` adds the final synchronize, spread over the calls: when it is close to
the host time, the GPU (not the host) set the pace.

Writes a JSON record (git commit, GPU, driver, versions, command, all numbers) only when ``--json`` is given.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

from record import write_record  # this folder's sibling module

# The FlyDSL kernel, written in MLIR: six global pointers, thread 0 of block 0 stores 1.0 through the first.
NOOP6_MLIR = """
module attributes {gpu.container_module} {
  gpu.module @launch_bench {
    gpu.func @noop6(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %c: !llvm.ptr<1>, %d: !llvm.ptr<1>, %e: !llvm.ptr<1>,
                    %f: !llvm.ptr<1>) kernel {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %lin = arith.addi %tid, %bid : index
      %c0 = arith.constant 0 : index
      %first = arith.cmpi eq, %lin, %c0 : index
      scf.if %first {
        %one = arith.constant 1.0 : f32
        llvm.store %one, %a : f32, !llvm.ptr<1>
      }
      gpu.return
    }
  }
}
"""

NUM_ARGS = 6


def _time_case(loop, calls: int, repeats: int, sync) -> dict:
    """Runs ``loop(n)`` (n back-to-back launches) after a warm-up; medians of host and host+sync time per call."""
    loop(min(1000, calls))
    sync()
    host, synced = [], []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        loop(calls)
        end = time.perf_counter()
        sync()
        done = time.perf_counter()
        host.append((end - start) / calls * 1e6)
        synced.append((done - start) / calls * 1e6)
    return {
        "us_per_launch": statistics.median(host),
        "us_per_launch_with_sync": statistics.median(synced),
        "repeats_us": host,
    }


def _flydsl_cases(torch, tensors, stream_handle):
    import flydsl.compiler as flyc
    from flydsl.compiler import runtime

    compiled = flyc.compile_mlir(NOOP6_MLIR)
    assert compiled.kernels == {"noop6": "p" * NUM_ARGS}, compiled.kernels
    loaded = runtime.load(compiled)
    function = loaded.function("noop6")
    signature = compiled.kernels["noop6"]
    a, b, c, d, e, f = tensors
    addresses = tuple(t.data_ptr() for t in tensors)

    def loaded_launch(n):
        launch = loaded.launch
        for _ in range(n):
            launch("noop6", 1, 32, a, b, c, d, e, f, stream=stream_handle)

    def loaded_launch_current_stream(n):
        launch, current_stream = loaded.launch, torch.cuda.current_stream
        for _ in range(n):
            launch("noop6", 1, 32, a, b, c, d, e, f, stream=current_stream().cuda_stream)

    def function_launch(n):
        launch, args = function.launch, (a, b, c, d, e, f)
        for _ in range(n):
            launch(1, 32, signature, args, 0, stream_handle)

    def function_launch_ints(n):
        launch = function.launch
        for _ in range(n):
            launch(1, 32, signature, addresses, 0, stream_handle)

    return compiled, {
        "flydsl LoadedModule.launch": loaded_launch,
        "flydsl LoadedModule.launch, current_stream() per call": loaded_launch_current_stream,
        "flydsl Function.launch (no Python wrapper)": function_launch,
        "flydsl Function.launch, int pointers": function_launch_ints,
    }


def _torch_case(torch):
    x = torch.zeros(16, device="cuda")

    def add_(n):
        for _ in range(n):
            x.add_(1)

    return {"torch x.add_(1)": add_}


def _triton_case(tensors):
    import triton
    import triton.language as tl

    @triton.jit
    def noop6(a, b, c, d, e, f):
        if tl.program_id(0) == 0:
            tl.store(a, 1.0)

    a, b, c, d, e, f = tensors

    def launch(n):
        kernel = noop6[(1,)]
        for _ in range(n):
            kernel(a, b, c, d, e, f)

    return {f"triton {triton.__version__} noop6[(1,)]": launch}


def _cuda_bindings_cases(compiled, tensors, stream_handle):
    from cuda.bindings import driver as cu

    image = compiled.image if compiled.cubin is not None else compiled.ptx.encode() + b"\0"
    err, module = cu.cuModuleLoadData(image)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuModuleLoadData: {err}")
    err, kernel = cu.cuModuleGetFunction(module, b"noop6")
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuModuleGetFunction: {err}")
    stream = cu.CUstream(stream_handle)
    a, b, c, d, e, f = tensors
    types = (ctypes.c_void_p,) * NUM_ARGS
    success = cu.CUresult.CUDA_SUCCESS

    def packed_per_call(n):
        launch = cu.cuLaunchKernel
        for _ in range(n):
            params = ((a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), e.data_ptr(), f.data_ptr()), types)
            (err,) = launch(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, 0)
            if err != success:
                raise RuntimeError(f"cuLaunchKernel: {err}")

    # The floor of this API from Python: the pointer array built once, passed as an address.
    values = (ctypes.c_uint64 * NUM_ARGS)(*(t.data_ptr() for t in tensors))
    pointers = (ctypes.c_void_p * NUM_ARGS)(*(ctypes.addressof(values) + 8 * i for i in range(NUM_ARGS)))
    prepacked = ctypes.addressof(pointers)

    def prepacked_args(n):
        launch = cu.cuLaunchKernel
        for _ in range(n):
            (err,) = launch(kernel, 1, 1, 1, 32, 1, 1, 0, stream, prepacked, 0)
            if err != success:
                raise RuntimeError(f"cuLaunchKernel: {err}")

    prepacked_args.keep_alive = (values, pointers, module)
    return {
        "cuda-bindings cuLaunchKernel, args packed per call": packed_per_call,
        "cuda-bindings cuLaunchKernel, args pre-packed": prepacked_args,
    }


def _version(module_name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module_name)
    except Exception:  # noqa: BLE001 - a missing package is reported as None
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="back-to-back launches per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per case (the median is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--commit", help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)

    import torch

    from flydsl.compiler import runtime

    if not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA GPU", file=sys.stderr)
        return 1
    tensors = [torch.zeros(64, device="cuda") for _ in range(NUM_ARGS)]
    stream_handle = torch.cuda.current_stream().cuda_stream
    sync = torch.cuda.synchronize

    cases, errors = {}, {}
    compiled, flydsl_cases = _flydsl_cases(torch, tensors, stream_handle)
    cases.update(flydsl_cases)
    cases.update(_torch_case(torch))
    for name, build in (
        ("triton", lambda: _triton_case(tensors)),
        ("cuda-bindings", lambda: _cuda_bindings_cases(compiled, tensors, stream_handle)),
    ):
        try:
            cases.update(build())
        except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            errors[name] = f"{type(error).__name__}: {error}"

    results = {}
    for name, loop in cases.items():
        try:
            results[name] = _time_case(loop, args.calls, args.repeats, sync)
        except Exception as error:  # noqa: BLE001
            errors[name] = f"{type(error).__name__}: {error}"

    # The kernel really ran: thread 0 stored 1.0 through its first pointer.
    assert tensors[0][0].item() == 1.0, "the FlyDSL/Triton kernel did not write its output"

    ours_name = "flydsl LoadedModule.launch"
    ours = results[ours_name]["us_per_launch"]
    width = max(len(name) for name in results)
    print(f"\n{'case':<{width}}  {'us/launch':>9}  {'sync us':>8}  {'x ours':>6}")
    for name, r in results.items():
        print(
            f"{name:<{width}}  {r['us_per_launch']:9.2f}  {r['us_per_launch_with_sync']:8.2f}"
            f"  {r['us_per_launch'] / ours:6.2f}"
        )
    for name, error in errors.items():
        print(f"{name}: not measured ({error})")
    print(f"\nours ({ours_name}): {ours:.2f} us per launch; target < 5 us: {'met' if ours < 5 else 'NOT met'}")

    if args.json:
        write_record(
            args.json,
            "launch_overhead",
            argv,
            {
                name: {**r, "ratio_to_ours": r["us_per_launch"] / ours, "repeats_us": r["repeats_us"]}
                for name, r in results.items()
            },
            commit=args.commit,
            method=f"median over {args.repeats} timed loops of {args.calls} back-to-back launches (host perf_counter)",
            driver_version=runtime._rt.driver_version(),
            versions={name: _version(name) for name in ("torch", "triton", "cuda-bindings")},
            calls_per_loop=args.calls,
            repeats=args.repeats,
            kernel="noop6: six pointer arguments, grid 1, block 32, thread 0 stores one float",
            cubin=compiled.cubin is not None,
            ours=ours_name,
            errors=errors,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
