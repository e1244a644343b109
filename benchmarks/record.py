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
import statistics
import subprocess
import sys
import threading
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


class ClockMonitor:
    """nvidia-smi sampling the SM and memory clocks, power, throttle reasons and temperature every ``period_ms`` in
    the background, so that runs on machines that clock differently can be compared: ``window()`` summarizes the
    samples taken since the previous call (median and minimum SM MHz, medians of memory MHz and power, the throttle
    reasons seen, the highest temperature), or returns None where nvidia-smi is missing or took no sample meanwhile.

        monitor = ClockMonitor()
        ...time something...
        row["clocks"] = monitor.window()
        monitor.close()
    """

    _QUERY = "clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active,temperature.gpu"

    def __init__(self, period_ms: int = 100):
        self._samples, self._lock = [], threading.Lock()
        query = ["nvidia-smi", f"--query-gpu={self._QUERY}", "--format=csv,noheader,nounits", f"-lms={period_ms}"]
        try:
            self._smi = subprocess.Popen(query, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._smi = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self._smi.stdout:
            fields = line.strip().split(", ")
            try:
                sample = (float(fields[0]), float(fields[1]), float(fields[2]), fields[3], float(fields[4]))
            except (IndexError, ValueError):
                continue
            with self._lock:
                self._samples.append(sample)

    def window(self) -> dict | None:
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            return None
        sm, mem, power, reasons, temperature = zip(*samples, strict=True)
        return {
            "samples": len(samples),
            "sm_mhz_median": statistics.median(sm),
            "sm_mhz_min": min(sm),
            "mem_mhz_median": statistics.median(mem),
            "power_w_median": statistics.median(power),
            "throttle_reasons": sorted(set(reasons)),
            "temperature_c_max": max(temperature),
        }

    def close(self) -> None:
        if self._smi is not None:
            self._smi.terminate()
            self._smi.wait()
