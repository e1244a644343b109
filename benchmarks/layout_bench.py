"""Time the layout algebra on typical GEMM tile layouts (median of repeats, microseconds).

Each case is timed cold (the memo of static results emptied before every call: the algebra's own cost, paid
the first time a kernel specialization needs it) and cached (the same static arguments again: a memo hit).

    python benchmarks/layout_bench.py [--repeats N] [--cpu] [--json PATH]

``--cpu`` times the process's CPU time instead of the wall clock: steadier on a machine shared with other work.

Writes a JSON record (times, git commit, CPU, Python, command) only when ``--json`` is given.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from record import write_record  # this folder's sibling module

import flydsl.layout as fl


def _cases():
    # A (128,64) bf16 shared-memory tile: 128-byte rows swizzled by Sw<3,3,3> (CuTe's SW128 atom for 16-bit types).
    sw128 = fl.tile_to_shape(fl.make_composed_layout(fl.Swizzle(3, 3, 3), 0, fl.Layout((8, 64), (64, 1))), (128, 64))
    big = fl.Layout((8192, 8192), (8192, 1))
    thr, val = fl.Layout((32, 4), (4, 1)), fl.Layout((4, 1))
    _, tv = fl.make_layout_tv(thr, val)  # 128 threads, 4 values each, over a (128, 4) tile
    return {
        "composition(sw128 (128,64) bf16, (64,32) tiler)": lambda: fl.composition(sw128, (64, 32)),
        "composition(tv 128 thr, ((4,32),4):((1,4),128))": lambda: fl.composition(
            tv, fl.Layout(((4, 32), 4), ((1, 4), 128))
        ),
        "logical_divide((8192,8192):(8192,1), (128,64))": lambda: fl.logical_divide(big, (128, 64)),
        "zipped_divide((8192,8192):(8192,1), (128,64))": lambda: fl.zipped_divide(big, (128, 64)),
        "zipped_divide(sw128, (16,16))": lambda: fl.zipped_divide(sw128, (16, 16)),
        "make_layout_tv((32,4):(4,1), (4,1))": lambda: fl.make_layout_tv(thr, val),
    }


def _median_us(fn, repeats: int, inner: int = 50, cold: bool = False, clock=time.perf_counter) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` calls; ``cold`` empties the algebra's memo before
    each call (and times only the call), so the algebra itself is measured rather than a cache hit."""
    times = []
    for _ in range(repeats):
        total = 0.0
        if cold:
            for _ in range(inner):
                fl.clear_caches()
                start = clock()
                fn()
                total += clock() - start
        else:
            start = clock()
            for _ in range(inner):
                fn()
            total = clock() - start
        times.append(total / inner * 1e6)
    return statistics.median(times)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--cpu", action="store_true", help="time the process's CPU time, not the wall clock")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    clock = time.process_time if args.cpu else time.perf_counter
    results, cached = {}, {}
    print(f"{'cold':>10}    {'cached':>10}")
    for name, fn in _cases().items():
        fn()  # warm up
        results[name] = round(_median_us(fn, args.repeats, cold=True, clock=clock), 2)
        cached[name] = round(_median_us(fn, args.repeats, clock=clock), 2)
        print(f"{results[name]:10.2f} us {cached[name]:10.2f} us  {name}")
    if args.json:
        write_record(
            args.json,
            "layout_bench",
            argv,
            results,
            method=f"median over {args.repeats} repeats of the mean of 50 calls "
            f"({'process_time' if args.cpu else 'perf_counter'}), microseconds",
            cpu=_cpu(),
            unit="microseconds, median of repeats",
            note="results: each call with the memo of static results emptied first (the algebra itself); "
            "results_cached: repeated calls with the same static arguments (memo hits)",
            results_cached=cached,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
