"""What a zoo op's first call imports before it can launch: ``python -X importtime`` in fresh processes, grouped.

    python benchmarks/import_time.py [--runs 5] [--target flydsl.kernels.norms.forward] [--json PATH]

Runs without a GPU. The cold start of a zoo op (``host_overhead.py --parts cold``) is, past ``import flydsl.torch``,
mostly this import. Since 2026-12-04 a kernel's module loads neither MLIR's Python bindings nor the dialect extension
``_fly`` (MLIR is imported lazily, on the first trace; the launcher is the ``_runtime`` extension, which links
neither): both groups should read 0. Each run starts a fresh interpreter with ``torch`` imported first (its time is
not counted: a user of ``flydsl.torch`` has it), then imports ``--target``; the per-module times that
``-X importtime`` prints (microseconds, self and cumulative) are summed into groups. Medians over the runs. The
children run as this process does (``python -S`` included: a tree laid out as installed, without an editable
install's import hook), with bytecode written by an untimed first run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from record import write_record

# Where the import time goes, by module prefix (the first that matches; the rest is "other").
GROUPS = (
    ("native extension (flydsl.compiler._fly)", "flydsl.compiler._fly"),
    ("launcher extension (flydsl.compiler._runtime)", "flydsl.compiler._runtime"),
    ("MLIR Python bindings (mlir.*)", "mlir"),
    ("flydsl.expr", "flydsl.expr"),
    ("flydsl.layout", "flydsl.layout"),
    ("flydsl.compiler (Python)", "flydsl.compiler"),
    ("flydsl.kernels", "flydsl.kernels"),
)
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)")


def one_run(target: str) -> dict:
    """One fresh process: torch, then ``target`` under ``-X importtime``; self time per group (ms) and the
    target's cumulative time."""
    code = f"import torch; import {target}"
    flags = ["-S"] if sys.flags.no_site else []
    # Bytecode written (a warm-up run writes it), as an installed package has it: PYTHONDONTWRITEBYTECODE, which some
    # machines set, would time the compilation of every source instead (about twice the import here).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    command = [sys.executable, *flags, "-X", "importtime", "-c", code]
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        last = [line for line in run.stderr.splitlines() if not line.startswith("import time:")][-3:]
        raise RuntimeError(f"import {target} failed in a fresh process: {' / '.join(last)}")
    groups = {name: 0.0 for name, _ in GROUPS}
    groups["other"] = 0.0
    seen_torch, total = False, None
    for line in run.stderr.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        self_us, cumulative_us, module = int(match[1]), int(match[2]), match[3]
        if not seen_torch:  # torch and its imports come first; its own line ends them
            seen_torch = module == "torch"
            continue
        if module == target:
            total = cumulative_us / 1e3
        name = next((name for name, prefix in GROUPS if module == prefix or module.startswith(prefix + ".")), "other")
        groups[name] += self_us / 1e3
    return {"total_ms": total, "self_ms": groups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--target", default="flydsl.kernels.norms.forward", help="the module a zoo op's call imports")
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--commit")
    args = parser.parse_args()
    one_run(args.target)  # the warm-up: writes the bytecode the timed runs read
    runs = [one_run(args.target) for _ in range(args.runs)]
    names = list(runs[0]["self_ms"])
    medians = {name: round(statistics.median(r["self_ms"][name] for r in runs), 1) for name in names}
    total = round(statistics.median(r["total_ms"] for r in runs), 1)
    print(f"import {args.target} after torch: {total} ms (median of {args.runs} fresh processes)")
    for name in names:
        print(f"  {medians[name]:8.1f} ms  {name}")
    if args.json:
        summary = {"target": args.target, "total_ms": total, "self_ms": medians}
        method = "python -X importtime in fresh processes after import torch; self times summed by module prefix"
        write_record(args.json, "import_time", None, runs, commit=args.commit, method=method, summary=summary)


if __name__ == "__main__":
    main()
