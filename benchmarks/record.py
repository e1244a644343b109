"""The JSON record every benchmark writes under benchmarks/results/: what was measured (benchmark, command, method,
results, summary) and on what (git commit, GPU, driver, torch and triton versions, date).

    from record import write_record          # benchmarks/ is the script's directory, so it is importable
    write_record(args.json, "gemm_bench", argv, results, commit=args.commit, method="...", summary=summary)

The GPU machine has no git: pass the commit measured (``--commit``, or ``FLYDSL_GIT_COMMIT``); elsewhere it is read
with ``git rev-parse``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def git_commit(given: str | None = None) -> str:
    """The commit measured: ``given`` (a ``--commit`` argument), else ``FLYDSL_GIT_COMMIT``, else ``git rev-parse
    HEAD`` of the working directory, else "unknown"."""
    if given and given != "unknown":
        return given
    if os.environ.get("FLYDSL_GIT_COMMIT"):
        return os.environ["FLYDSL_GIT_COMMIT"]
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return run.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(commit: str | None = None) -> dict:
    """The machine and software a result was measured on (GPU fields only where torch sees a GPU)."""
    info = {"date": time.strftime("%Y-%m-%d"), "git_commit": git_commit(commit), "python": sys.version.split()[0]}
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        info["driver"] = subprocess.run(query, capture_output=True, text=True, check=True).stdout.split("\n")[0]
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def write_record(path, benchmark: str, argv, results, *, commit=None, method=None, summary=None, **extra) -> dict:
    """Writes (and returns) the record of one run to ``path``: ``benchmark``, the command (the script and
    ``argv``, its arguments; None: ``sys.argv[1:]``), :func:`environment`, ``method``, ``summary``, ``results`` and
    any ``extra`` fields."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    record = {
        "benchmark": benchmark,
        "command": " ".join(["python", f"benchmarks/{benchmark}.py", *arguments]),
        **environment(commit),
        "method": method,
        "summary": summary,
        **extra,
        "results": results,
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record
