"""Where a norm forward call's time goes on the local GPU: the host time of the Python call (with the GPU busy and
with it idle), the call timed alone on an idle GPU (CUDA events: host latency included), the call queued behind a
sleep kernel (GPU time) and the profiler's kernel time; for the routed forward (``staged``: the staged kernel at
these N) and the register forward (the route forced: ``norms_forward_staged.forced_route``), bf16, 2^28 elements.

    python benchmarks/norms_host_time.py --json benchmarks/results/norms_host_time/DATE_WHAT.json --commit C
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

from norms_forward_staged import forced_route  # this folder's sibling script
from record import write_record

CASES = [("layer_norm", 65536), ("softmax", 65536), ("rms_norm", 65536), ("layer_norm", 32768), ("layer_norm", 8192)]


def _host_us(torch, run, idle: bool, calls: int = 30) -> float:
    times = []
    for _ in range(calls):
        if idle:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def measure(torch, norms, kernel: str, n: int) -> list:
    from flydsl.kernels.bench import median_ms

    m = (1 << 28) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    run = {
        "layer_norm": lambda: norms.layer_norm(x, w, b, 1e-5, out),
        "rms_norm": lambda: norms.rms_norm(x, w, 1e-6, out),
        "softmax": lambda: norms.softmax(x, out),
    }[kernel]
    rows = []
    for staged in (False, True):
        with forced_route() if not staged else contextlib.nullcontext():  # staged: the route as the API takes it
            for _ in range(5):
                run()
            torch.cuda.synchronize()
            row = {"kernel": kernel, "n": n, "staged": staged}
            # host times first: after a profiler session, torch calls cost more on the host for a while
            row["host_busy_us"] = _host_us(torch, run, idle=False)
            row["host_idle_us"] = _host_us(torch, run, idle=True)
            row["per_call_us"] = median_ms(run, 20) * 1e3
            row["queued_us"] = median_ms(run, 20, queued=True) * 1e3
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
                for _ in range(10):
                    run()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            row["kernels"] = sorted({e.name for e in kernels})
            row["profiler_kernel_us"] = statistics.median(e.device_time for e in kernels)
            rows.append(row)
            print(
                f"{kernel:>10} N={n:>6} {'staged' if staged else 'register':>8}: host {row['host_busy_us']:.1f} us"
                f" (idle GPU {row['host_idle_us']:.1f}), per call {row['per_call_us']:.1f}, queued"
                f" {row['queued_us']:.1f}, kernel {row['profiler_kernel_us']:.1f}",
                flush=True,
            )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--commit", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    import torch

    import flydsl.kernels as norms  # the public functions

    results = [row for kernel, n in CASES for row in measure(torch, norms, kernel, n)]
    if args.json:
        method = (
            "host: time.perf_counter around the call, median of 30 (GPU busy: calls queue behind each other; idle:"
            " synchronized before each); per call: CUDA events around one call on an idle GPU; queued: the same"
            " behind a sleep kernel; kernel: torch.profiler device time; medians"
        )
        write_record(args.json, "norms_host_time", argv, results, commit=args.commit, method=method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
