"""The cold start of the zoo's ops, for benchmarks/host_overhead.py's ``cold`` part: fresh processes (the disk cache
warmed by a first one) that each time the CUDA context (a torch op), ``import flydsl.torch`` and the first call of
an op's user-facing path; medians. Not a script: the child side runs as ``host_overhead.py --cold-child OPS``."""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

from record import error_text


def first_calls(names: list[str], ops: dict, prepare, import_adapter, profile_dir=None) -> dict:
    """In a fresh process: the CUDA context, ``import_adapter()``, then the first call of each named op's user-facing
    path (``ops``: name -> host_overhead.Op; its inputs from ``prepare()``, made before the clock starts), in ms.
    ``profile_dir``: the first calls run under cProfile, each one's 40 costliest functions (cumulative) written to
    ``profile_dir/cold_<op>.txt`` (the profiler's own overhead is in the times then)."""
    import torch

    start = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    found = {"context_ms": (time.perf_counter() - start) * 1e3}
    start = time.perf_counter()
    import_adapter()
    found["import_ms"] = (time.perf_counter() - start) * 1e3
    found["import_loads_compiler"] = "flydsl.compiler" in sys.modules
    t = prepare()
    torch.cuda.synchronize()
    found["first_call_ms"] = {}
    for name in names:
        profiler = cProfile.Profile() if profile_dir else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        ops[name].user()[1](t)
        torch.cuda.synchronize()
        if profiler:
            profiler.disable()
        found["first_call_ms"][name] = (time.perf_counter() - start) * 1e3
        if profiler:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
            path = os.path.join(profile_dir, f"cold_{name}.txt")
            with open(path, "w") as f:
                f.write(f"{name}: first call {found['first_call_ms'][name]:.1f} ms under cProfile\n{text.getvalue()}")
    found["first_calls_load_mlir"] = "mlir._mlir_libs._mlir" in sys.modules  # cached kernels should not
    return found


def run_child(script: str, names: list[str], profile_dir=None) -> dict:
    """``script --cold-child names`` in a fresh process: its :func:`first_calls` result (``profile_dir``: profiled,
    see there)."""
    command = [sys.executable, os.path.abspath(script), "--cold-child", ",".join(names)]
    if profile_dir:
        command += ["--cold-profile", os.path.abspath(profile_dir)]
    # Bytecode written by the warm-up child, as an installed package has it (pip compiles it): a process start that
    # compiles every source again is not the cold start users see.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    if run.returncode != 0:
        last = " / ".join(run.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(command)} exited {run.returncode}: {last}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def median(values) -> float | None:
    return round(statistics.median(values), 2) if values else None


def measure(names: list[str], runs: int, child) -> dict:
    """The cold start of each op: ``runs`` fresh processes per op (``child(names)``: one process's
    :func:`first_calls`) after one that calls them all (it fills the disk cache); medians of the context's, the
    import's and the first call's times, and any failure."""
    found = {"runs": runs, "errors": {}, "import_loads_compiler": None, "first_calls_load_mlir": None}
    found["plan_cache"] = os.environ.get("FLYDSL_PLAN_CACHE", "")  # kept launch plans (flydsl.kernels.plan_cache)
    try:
        child(names)
    except Exception as error:  # noqa: BLE001
        found["errors"]["warm-up"] = error_text(error)
    samples = {"context_ms": [], "import_ms": []}
    first = {}
    for name in names:
        first[name] = []
        for _ in range(runs):
            try:
                one = child([name])
            except Exception as error:  # noqa: BLE001 - one op's failure is reported, the others still run
                found["errors"][name] = error_text(error)
                break
            samples["context_ms"].append(one["context_ms"])
            samples["import_ms"].append(one["import_ms"])
            found["import_loads_compiler"] = bool(found["import_loads_compiler"]) or one["import_loads_compiler"]
            found["first_calls_load_mlir"] = bool(found["first_calls_load_mlir"]) or one["first_calls_load_mlir"]
            first[name].append(one["first_call_ms"][name])
    found.update({key: median(values) for key, values in samples.items()})
    found["first_call_ms"] = {name: median(values) for name, values in first.items()}
    found["samples_ms"] = {**samples, "first_call": first}
    return found


def summary(cold: dict) -> dict:
    """The record summary's ``cold_start_ms``."""
    return {
        "context": cold["context_ms"],
        "import_flydsl_torch": cold["import_ms"],
        "first_call": cold["first_call_ms"],
    }
