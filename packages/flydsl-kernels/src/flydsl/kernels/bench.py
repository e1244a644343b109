"""Times a flydsl kernel next to torch on the local GPU.

    python -m flydsl.kernels.bench softmax --dtype bf16
    python -m flydsl.kernels.bench rms_norm --dtype f32 --n 4096,32768 --elements 67108864
    python -m flydsl.kernels.bench gemm --m 16,4096 --n 4096 --k 4096      # B as nn.Linear weights (N, K)

Prints, per shape, the median time of each (CUDA events, after warm-up) and the effective bandwidth (bytes read +
written / time), or for ``gemm`` the TFLOP/s next to torch.matmul (cuBLAS). The full sweeps with JSON output are
``benchmarks/norms_bench.py`` and ``benchmarks/gemm_bench.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

KERNELS = ("softmax", "layer_norm", "rms_norm", "fused_add_rms_norm", "gemm")


_FLUSH_BYTES = 256 << 20  # over four times the H200's 60 MB L2


def median_ms(
    fn, reps: int, warmup: int = 3, queued: bool = False, sleep_cycles: int = 200_000, flush: bool = False
) -> float:
    """The median of ``reps`` CUDA-event timings of ``fn()`` (ms), after ``warmup`` calls: each call timed alone, so
    a kernel's time, not the launch rate (the benchmarks under benchmarks/ use it too). ``queued``: each timed call
    waits behind a sleep kernel (``torch.cuda._sleep(sleep_cycles)``: ~100 us at 1980 MHz), so that the host's launch
    latency (Python checks, allocations, several launches) is hidden as in a training step's queue: the op's GPU
    time (as long as the host enqueues the op within the sleep). ``flush``: 256 MB are written before each timed call
    (outside its events), so that it reads its inputs from memory, not from L2 (as a layer's weights are in a model
    step, the other layers having run in between)."""
    import torch

    scratch = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush else None

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if queued:
            torch.cuda._sleep(sleep_cycles)
        if flush:
            scratch.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_once(runs) -> None:
    """Each of ``runs`` (callables) once to compile and warm up, then once more each between the CUDA profiler's
    start and stop: what ``ncu --profile-from-start off`` sees (the benchmarks' ``*_profile.py`` diagnostics)."""
    import torch

    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _pair(torch, kernel: str, x):
    """(ours, torch's, bytes moved) for one input."""
    import flydsl.kernels as zoo

    n, size = x.shape[1], x.element_size()
    out = torch.empty_like(x)
    w = torch.randn(n, device=x.device, dtype=x.dtype)
    b = torch.randn(n, device=x.device, dtype=x.dtype)
    moved = 2 * x.numel() * size
    if kernel == "softmax":
        return (lambda: zoo.softmax(x, out)), (lambda: torch.softmax(x, -1)), moved
    if kernel == "layer_norm":
        ref = torch.nn.functional.layer_norm
        return (lambda: zoo.layer_norm(x, w, b, 1e-5, out)), (lambda: ref(x, (n,), w, b, 1e-5)), moved + 2 * n * size
    if kernel == "rms_norm":
        ref = getattr(torch.nn.functional, "rms_norm", None)
        if ref is None:
            raise SystemExit("this torch has no torch.nn.functional.rms_norm to compare with")
        return (lambda: zoo.rms_norm(x, w, 1e-6, out)), (lambda: ref(x, (n,), w, 1e-6)), moved + n * size
    residual = torch.randn_like(x)

    def torch_fused():
        s = x + residual
        return torch.nn.functional.rms_norm(s, (n,), w, 1e-6), s

    ours = lambda: zoo.fused_add_rms_norm(x, residual, w, 1e-6, out, residual_out=residual)  # noqa: E731
    return ours, torch_fused, 2 * moved + n * size


def _time_gemm(torch, gemm, m: int, n: int, k: int, dtype, reps: int) -> tuple[float, float]:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    out, ref = torch.empty(m, n, device="cuda", dtype=dtype), torch.empty(m, n, device="cuda", dtype=dtype)
    return median_ms(lambda: gemm(a, b, out), reps), median_ms(lambda: torch.matmul(a, b, out=ref), reps)


def _gemm(torch, dtype, args) -> int:
    """flydsl.kernels.gemm.gemm next to torch.matmul for every (M, N, K) given; B as nn.Linear weights."""
    from flydsl.kernels.gemm import gemm

    if dtype == torch.float32:
        print("gemm takes bf16 or f16 inputs", file=sys.stderr)
        return 1
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    print(f"gemm {args.dtype} on {torch.cuda.get_device_name()}: median of {args.reps} runs, B = w.t()")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'flydsl us':>10} {'cuBLAS us':>10} {'flydsl TF/s':>12} {'cuBLAS TF/s':>12}")
    for m in ints(args.m):
        for n in ints(args.n or "4096"):
            for k in ints(args.k):
                ours_ms, theirs_ms = _time_gemm(torch, gemm, m, n, k, dtype, args.reps)
                flops = 2.0 * m * n * k
                print(
                    f"{m:>6} {n:>6} {k:>6} {ours_ms * 1e3:>10.1f} {theirs_ms * 1e3:>10.1f}"
                    f" {flops / ours_ms / 1e9:>12.1f} {flops / theirs_ms / 1e9:>12.1f}"
                )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flydsl.kernels.bench", description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=KERNELS)
    parser.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    parser.add_argument(
        "--n", default=None, help="row lengths, comma-separated (gemm: N, output columns; default 4096)"
    )
    parser.add_argument("--m", default="16,128,4096", help="gemm: rows of A, comma-separated")
    parser.add_argument("--k", default="4096", help="gemm: the inner dimension, comma-separated")
    parser.add_argument("--elements", type=int, default=1 << 26, help="elements per input (rows = elements // N)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("flydsl.kernels.bench needs torch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("flydsl.kernels.bench needs a CUDA GPU", file=sys.stderr)
        return 1
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    if args.kernel == "gemm":
        return _gemm(torch, dtype, args)
    args.n = args.n or "1024,4096,16384,65536,262144"
    print(f"{args.kernel} {args.dtype} on {torch.cuda.get_device_name()}: median of {args.reps} runs")
    print(f"{'N':>8} {'rows':>8} {'flydsl us':>10} {'torch us':>10} {'flydsl TB/s':>12} {'torch TB/s':>11}")
    for n in map(int, args.n.split(",")):
        rows = max(1, args.elements // n)
        x = torch.randn(rows, n, device="cuda", dtype=dtype)
        ours, theirs, moved = _pair(torch, args.kernel, x)
        ours_ms, theirs_ms = median_ms(ours, args.reps), median_ms(theirs, args.reps)
        print(
            f"{n:>8} {rows:>8} {ours_ms * 1e3:>10.1f} {theirs_ms * 1e3:>10.1f}"
            f" {moved / ours_ms / 1e9:>12.2f} {moved / theirs_ms / 1e9:>11.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
