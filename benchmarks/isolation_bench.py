"""What compiling in a forked child (flydsl.compiler.isolate, the default) adds to a compile, and to the opt CLI.

    python benchmarks/isolation_bench.py [--reps N] [--json PATH]

Runs without a GPU. For each input, in-process and isolated compiles (``assemble=False``) alternate N times and the
median of the paired differences is the overhead (pairs cancel most of the drift of a shared machine); the opt CLI
runs ``tests/native/Dialect/Fly/invalid.mlir --split`` with FLYDSL_COMPILE_ISOLATED=0 and unset, alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from record import write_record  # noqa: E402

import flydsl.compiler as flyc  # noqa: E402

INPUTS = {
    "layout_offsets": (ROOT / "examples" / "layout_offsets.mlir", None),
    "vector_add_fly": (ROOT / "tests" / "compiler" / "golden" / "vector_add.fly.mlir", "fly"),
}


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def compile_overhead(path: Path, start_after: str | None, reps: int) -> dict:
    text = path.read_text()

    def compile_(isolate: bool):
        return lambda: flyc.compile_mlir(text, start_after=start_after, assemble=False, isolate=isolate)

    compile_(True)()  # the worker starts once per process
    compile_(False)()
    here, there = [], []
    for _ in range(reps):
        here.append(_seconds(compile_(False)) * 1e3)
        there.append(_seconds(compile_(True)) * 1e3)
    return {
        "in_process_median_ms": statistics.median(here),
        "isolated_median_ms": statistics.median(there),
        "overhead_median_ms": statistics.median(b - a for a, b in zip(here, there, strict=True)),
        "reps": reps,
    }


def opt_times(reps: int) -> dict:
    command = [sys.executable, "-m", "flydsl.compiler.opt", str(ROOT / "tests/native/Dialect/Fly/invalid.mlir")]
    runs = {"0": [], "1": []}
    for _ in range(reps):
        for mode, times in runs.items():
            env = {**os.environ, "FLYDSL_COMPILE_ISOLATED": mode}
            times.append(_seconds(lambda env=env: subprocess.run([*command, "--split"], env=env, capture_output=True)))
    return {"in_process_median_s": statistics.median(runs["0"]), "isolated_median_s": statistics.median(runs["1"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--note", help="what else ran on the machine (the overhead grows with its load)")
    args = parser.parse_args(argv)
    results = {name: compile_overhead(path, start_after, args.reps) for name, (path, start_after) in INPUTS.items()}
    results["opt_invalid_mlir_split"] = opt_times(max(3, args.reps // 10))
    for name, row in results.items():
        print(name, {key: round(value, 3) for key, value in row.items()})
    if args.json:
        method = "in-process and isolated compiles alternated; overhead: median of the paired differences"
        write_record(
            args.json,
            "isolation_bench",
            argv,
            results,
            method=method,
            cpu=f"{os.cpu_count()} cores",
            load_average=os.getloadavg()[0],
            note=args.note,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
