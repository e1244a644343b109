"""The JSON record every benchmark writes under benchmarks/results/: what was measured (benchmark, command, method,
results, summary) and on what (git commit, GPU, driver, torch and triton versions, date).

    from record import write_record          # benchmarks/ is the script's directory, so it is importable
    write_record(args.json, "gemm_bench", argv, results, commit=args.commit, method="...", summary=summary)

    record = new_record("norms_bench", None, [], commit=args.commit, method="...", reps=args.reps)
    record["results"].append(row)            # a long run: written again after each row
    save(args.out, record)

The GPU machine has no git: pass the commit measured (``--commit``, or ``FLYDSL_GIT_COMMIT``); elsewhere it is read
with ``git rev-parse``.

A record lives in its benchmark's folder, ``benchmarks/results/<folder(benchmark)>/<date>_<what>.json``
(:func:`result_path`); :func:`validate` checks the fields every record has (tests/kernels/test_results_records.py runs
it over every committed record).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
REQUIRED = {"benchmark": str, "command": str, "date": str, "git_commit": str, "method": (str, type(None))}
OPTIONAL = {"python": str, "torch": str, "gpu": str, "cuda": (str, type(None)), "driver": str, "triton": str}
# Scripts another one replaced: their records stay as history (they name the old commands). Name -> successor.
RETIRED = {
    name: "host_overhead"
    for name in ("torch_ops_overhead", "norms_host_time", "gemm_host_overhead", "launch_overhead", "dsl_dispatch")
}


def folder(benchmark: str) -> str:
    """The folder of ``benchmark``'s records under benchmarks/results/: the script's name without ``_bench``
    (``norms_bench`` -> ``norms``, ``norms_forward_staged`` -> ``norms_forward_staged``)."""
    return benchmark.removesuffix("_bench")


def result_path(benchmark: str, what: str, date: str | None = None) -> Path:
    """Where a record of ``benchmark`` belongs: ``benchmarks/results/<folder>/<date>_<what>.json`` (today's date
    unless given); ``what`` names the run in a few words, or the commit measured."""
    return RESULTS / folder(benchmark) / f"{date or time.strftime('%Y-%m-%d')}_{what}.json"


def validate(record) -> dict:
    """Checks that ``record`` has the fields every record has: ``benchmark`` (a script's name, benchmarks/NAME.py, or
    a retired script's, :data:`RETIRED`),
    ``command``, ``date`` (YYYY-MM-DD), ``git_commit`` and ``method`` (text or None), ``summary`` (any value, None
    included) and ``results`` (a list or an object); where present, the environment fields are text. Raises
    ValueError naming every problem; returns the record."""
    if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, not {type(record).__name__}")
    problems = []
    for key, types in REQUIRED.items():
        if key not in record:
            problems.append(f"no {key!r}")
        elif not isinstance(record[key], types):
            problems.append(f"{key!r} is {type(record[key]).__name__}")
    for key, types in OPTIONAL.items():
        if key in record and not isinstance(record[key], types):
            problems.append(f"{key!r} is {type(record[key]).__name__}")
    if "summary" not in record:
        problems.append("no 'summary' (None where there is none)")
    if not isinstance(record.get("results"), (list, dict)):
        problems.append("'results' is missing or not a list or an object")
    if isinstance(record.get("date"), str) and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]):
        problems.append(f"'date' {record['date']!r} is not YYYY-MM-DD")
    benchmark = record.get("benchmark")
    if isinstance(benchmark, str) and benchmark not in RETIRED and not (BENCHMARKS / f"{benchmark}.py").is_file():
        problems.append(f"'benchmark' {benchmark!r} names no script benchmarks/{benchmark}.py")
    if problems:
        raise ValueError("not a benchmark record: " + "; ".join(problems))
    return record


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


def new_record(benchmark: str, argv, results, *, commit=None, method=None, summary=None, **extra) -> dict:
    """The record of one run: ``benchmark``, the command (the script and ``argv``, its arguments; None:
    ``sys.argv[1:]``), :func:`environment`, ``method``, ``summary``, any ``extra`` fields and ``results`` (fields set
    later, such as a run's wall time, go after them)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return {
        "benchmark": benchmark,
        "command": " ".join(["python", f"benchmarks/{benchmark}.py", *arguments]),
        **environment(commit),
        "method": method,
        "summary": summary,
        **extra,
        "results": results,
    }


def save(path, record: dict) -> dict:
    """Writes ``record`` to ``path`` (JSON, indent 1), then checks it (:func:`validate`: a record that fails is
    written all the same, so that no measurement is lost, and the error names what is wrong)."""
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return validate(record)


def write_record(path, benchmark: str, argv, results, *, commit=None, method=None, summary=None, **extra) -> dict:
    """Writes (and returns) the record of one run to ``path``: :func:`new_record`, then :func:`save`."""
    return save(path, new_record(benchmark, argv, results, commit=commit, method=method, summary=summary, **extra))


def merge(paths, output, summarize) -> dict:
    """Joins the records at ``paths`` (one benchmark's sweep split over device calls: the same commit and GPU) into
    one record at ``output``, its summary recomputed by ``summarize(results)``; prints and returns the summary."""
    records = [json.loads(Path(path).read_text()) for path in paths]
    first = records[0]

    def identity(record):
        return record.get("benchmark"), record.get("git_commit"), record.get("gpu")

    for other in records[1:]:
        if identity(other) != identity(first):
            raise SystemExit(f"{first['benchmark']} --merge: records of different benchmarks, commits or GPUs: {paths}")
    joined = dict(first, results=[r for record in records for r in record["results"]])
    joined["command"] = " && ".join(record["command"] for record in records)
    joined["summary"] = summarize(joined["results"])
    save(output, joined)
    print(json.dumps(joined["summary"]))
    return joined["summary"]


def error_text(error: BaseException) -> str:
    """An exception as a record keeps it: its type and the first line of its message (300 characters at most)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def cold_timer(flush: str):
    """Milliseconds of one call: ``cold_l2.bench_cold`` (do_bench's loop, warmup 10 ms, rep 40 ms) with the given L2
    flush, each call queued behind a sleep so that the GPU's time is measured, not the host's."""
    from cold_l2 import bench_cold

    return lambda fn: bench_cold(fn, flush=flush, warmup=10, rep=40, queued=True)


class Sweep:
    """A benchmark's rows as they come: :meth:`add` prints each (``format_row``) and, with a JSON ``path``, saves the
    record again with the summary of the rows so far (a run cut short keeps what it measured); :meth:`finish` prints
    and saves the final summary."""

    def __init__(self, record: dict, path, format_row, summarize):
        self.record, self.path, self.format_row, self.summarize = record, path, format_row, summarize
        self.results = record["results"]

    def add(self, row: dict) -> None:
        self.results.append(row)
        print(self.format_row(row), flush=True)
        if self.path:
            self.record["summary"] = self.summarize(self.results)
            save(self.path, self.record)

    def finish(self) -> dict:
        summary = self.summarize(self.results)
        print(json.dumps(summary))
        if self.path:
            self.record["summary"] = summary
            save(self.path, self.record)
        return summary


def csv_list(text: str, convert, choices=None) -> list:
    """A comma-separated command-line value as a list of ``convert``-ed items, each one of ``choices`` if given
    (``argparse``'s ``type=lambda t: csv_list(t, int)``)."""
    import argparse

    values = [convert(v) for v in text.split(",") if v.strip()]
    if choices is not None:
        unknown = sorted(set(values) - set(choices))
        if unknown:
            raise argparse.ArgumentTypeError(f"expected some of {', '.join(map(str, choices))}, got {unknown}")
    return values


def geomean(values):
    """The geometric mean of ``values`` (any iterable of positive numbers), or None for none: the summaries' ratio
    over a sweep."""
    import math

    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def cell(row: dict, key: str, fmt: str, width: int) -> str:
    """``row[key]`` formatted for a table column (``-`` where the row has no value)."""
    value = row.get(key)
    return f"{value:>{width}{fmt}}" if value is not None else f"{'-':>{width}}"


def failure_note(row: dict) -> str:
    """The table's note after a row that failed its check (empty for a correct one)."""
    if row.get("correct"):
        return ""
    why = row.get("error") or row.get("check_error") or f"unwritten {row.get('unwritten')}"
    return f"  FAILED ({why})"


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
