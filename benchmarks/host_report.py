"""The ops table's vocabulary, summary and printed table, for benchmarks/host_overhead.py (which documents the
method). Not a script."""

from __future__ import annotations

import cold_start
from host_timing import paired_ratio

PATHS = ("functional", "op", "direct", "torch")
MODES = ("fwd", "fwd_bwd")
HALVES = ("fwd_rec", "bwd_kept")  # --halves: fwd_bwd's recording forward and its backward over a kept graph


def summarize(ops, rows: list[dict], cold: dict | None) -> dict:
    """``ratios``: per op and mode, the user-facing path's host time over torch's, the median of the per-repeat
    ratios of the interleaved batches (None where either failed);
    ``max_ratio_vs_torch`` the largest of those measured; ``missing`` the ratios that could not be computed;
    ``halves`` (where measured) fwd_bwd's halves' ratios, outside the bar."""
    found = {(r["op"], r["mode"], r["path"]): r for r in rows}

    def ratio(op, mode):
        return paired_ratio(found.get((op.name, mode, op.user()[0])), found.get((op.name, mode, "torch")))

    ratios = {f"{op.name}.{mode}": ratio(op, mode) for op in ops for mode in op.modes}
    measured = [r for r in ratios.values() if r is not None]
    halves = {
        f"{op.name}.{mode}": ratio(op, mode) for op in ops for mode in HALVES if (op.name, mode, "torch") in found
    }
    return {
        "max_ratio_vs_torch": max(measured) if measured else None,
        "ratios": ratios,
        **({"halves": halves} if halves else {}),
        "missing": [key for key, r in ratios.items() if r is None],
        "cold_start_ms": None if cold is None else cold_start.summary(cold),
    }


def table(ops, rows: list[dict], summary: dict) -> str:
    """The readable table: op, mode, each path's us per call, the ratio against torch; failures listed under it."""
    times = {(r["op"], r["mode"], r["path"]): r for r in rows}
    lines = [f"{'op':<20} {'mode':<8}" + "".join(f"{p:>12}" for p in PATHS) + f"{'vs torch':>10}"]
    failures = []
    for op in ops:
        for mode in [*op.modes, *(m for m in HALVES if (op.name, m, "torch") in times)]:
            cells = []
            for path in PATHS:
                row = times.get((op.name, mode, path)) or times.get((op.name, mode, "all"))
                if row is None:
                    cells.append("-")
                elif "error" in row:
                    cells.append("failed")
                    failures.append(f"{op.name} {mode} {row['path']}: {row['error']}")
                else:
                    cells.append(f"{row['host_us']:.1f}" + ("" if row["gpu_busy_after"] else "*"))
            ratio = {**summary["ratios"], **summary.get("halves", {})}[f"{op.name}.{mode}"]
            shown = f"{ratio:>10.2f}" if ratio is not None else f"{'-':>10}"
            lines.append(f"{op.name:<20} {mode:<8}" + "".join(f"{c:>12}" for c in cells) + shown)
    lines.append("us per call (host); *: the GPU went idle in a batch; gemm's user-facing path is the op")
    return "\n".join(lines + list(dict.fromkeys(failures)))
