"""Where a GEMM's time goes on the local GPU, ours next to cuBLAS on one shape (diagnostics, not a benchmark):

    python benchmarks/gemm_profile.py --clocks 2048 4096 4096      # SM clock, power and throttle reasons while each
                                                                    # runs back to back for --seconds (nvidia-smi)
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        python benchmarks/gemm_profile.py 2048 4096 4096            # one launch of each between profiler start/stop

B is nn.Linear-shaped (N, K) as in gemm_bench.py; bf16 in and out.
"""

from __future__ import annotations

import argparse
import sys
import time

from gemm_bench import _config, _config_fields  # this folder's sibling script
from record import ClockMonitor


def _sample_clocks(run, seconds: float) -> dict | None:
    """Runs ``run`` back to back for ``seconds`` while nvidia-smi samples every 50 ms (:class:`record.ClockMonitor`);
    the summary of the samples taken in the second half (after the clocks settled), with the launch count."""
    import torch

    monitor = ClockMonitor(50)
    start = time.perf_counter()
    launches, settled = 0, False
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            run()
        launches += 20
        torch.cuda.synchronize()
        if not settled and time.perf_counter() - start >= seconds / 2:
            monitor.window()  # the first half's samples, dropped
            settled = True
    summary = monitor.window()
    monitor.close()
    return None if summary is None else {"launches": launches, **summary}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("m", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("--clocks", action="store_true", help="sample clocks and power instead of one launch each")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--config",
        type=_config_fields,
        action="append",
        help="KEY=VALUE,... GemmConfig fields (as gemm_bench.py's --config); repeated: each profiled after the"
        " default",
    )
    args = parser.parse_args(argv)

    import torch

    from flydsl.kernels.bench import profile_once
    from flydsl.kernels.gemm import gemm

    a = torch.randn(args.m, args.k, device="cuda").bfloat16()
    w = torch.randn(args.n, args.k, device="cuda").bfloat16()
    out = torch.empty(args.m, args.n, device="cuda", dtype=torch.bfloat16)
    runs = {"flydsl": lambda: gemm(a, w.t(), out)}
    for i, fields in enumerate(args.config or ()):
        config = _config(fields)
        runs[f"{i}: {config!r}"] = lambda config=config: gemm(a, w.t(), out, config)
    runs["cublas"] = lambda: torch.matmul(a, w.t(), out=out)
    if args.clocks:
        for run in runs.values():  # compile, pick cuBLAS's algorithm, warm up
            run()
        torch.cuda.synchronize()
        for name, run in runs.items():
            print(name, _sample_clocks(run, args.seconds), flush=True)
        return 0
    profile_once(list(runs.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
