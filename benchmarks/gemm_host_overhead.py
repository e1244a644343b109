"""Host time of one GEMM call (what a small, launch-bound GEMM costs the CPU), next to torch.matmul (cuBLAS).

    python benchmarks/gemm_host_overhead.py [--json benchmarks/results/gemm_host_overhead/DATE_WHAT.json --commit C]

Per case: ``calls`` back-to-back calls timed on the host clock with the GPU kept busy by a long kernel queued first
(so the host never waits for the device), median of ``repeats``; also the same through the kernel's launch alone
(``gemm_ws(...).launch`` with prebuilt TmaTiles) to separate the wrapper's cost from the launch path's, and whether
the launch took the native dispatcher.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from record import write_record


def _host_us(fn, torch, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        torch.cuda._sleep(50_000_000)  # keep the GPU busy: launches queue, the host never waits
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def _measure(torch, m: int, n: int, k: int, calls: int, repeats: int) -> dict:
    import flydsl.expr as fx
    from flydsl.kernels.gemm import Epilogue, choose_config, gemm, gemm_ws

    a = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()  # nn.Linear weights: b = w.t() is K-major
    b = w.t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out)
    torch.cuda.synchronize()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = choose_config(m, n, k, sms)
    a_tile = fx.TmaTile(a, (cfg.tile_m, 64))
    call = gemm_ws(  # register stores, no epilogue, no stream-K: a_tile and out stand in for what is unused
        a_tile,
        fx.TmaTile(w, (cfg.tile_n // cfg.cluster_m, 64)),
        out,
        a_tile,
        out,
        out,
        out,
        cfg,
        ("K", "K"),
        Epilogue(),
    )
    grid = cfg.cluster_m * (sms // cfg.cluster_m)
    native = gemm_ws._dispatch(call.values, grid, cfg.threads, None, None, None)
    torch.cuda.synchronize()
    return {
        "m": m,
        "n": n,
        "k": k,
        "native_dispatch": bool(native),
        "flydsl_gemm_us": _host_us(lambda: gemm(a, b, out), torch, calls, repeats),
        "flydsl_launch_us": _host_us(lambda: call.launch(grid=grid, block=cfg.threads), torch, calls, repeats),
        "torch_matmul_us": _host_us(lambda: torch.matmul(a, b, out=out), torch, calls, repeats),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args(argv)

    import torch

    results = []
    for m, n, k in [(16, 4096, 4096), (128, 8192, 8192)]:
        row = _measure(torch, m, n, k, args.calls, args.repeats)
        results.append(row)
        print(
            f"{m}x{n}x{k}: gemm() {row['flydsl_gemm_us']:.1f} us, its launch {row['flydsl_launch_us']:.1f} us"
            f" (native {row['native_dispatch']}), torch.matmul {row['torch_matmul_us']:.1f} us (host time per call)"
        )
    if args.json:
        method = (
            "host perf_counter over back-to-back calls while a 50M-cycle sleep kernel keeps the GPU busy; median of"
            " repeats"
        )
        write_record(args.json, "gemm_host_overhead", argv, results, commit=args.commit, method=method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
