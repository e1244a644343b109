"""Draws a gemm_bench or skinny_gemm_bench JSON: speed relative to cuBLAS per (N, K) shape, one line per M, the
issue's bars (1.0x, 0.85x) dashed; for skinny_gemm_bench, ``--tbps`` draws the weights' TB/s instead: ours and
cuBLAS's per M, the same bytes moved by a torch copy, and issue 8's 3.8 TB/s. Runs on any machine; without
matplotlib it prints the table instead.

    python benchmarks/plot_gemm.py benchmarks/results/gemm/2026-11-30_sweep.json --out gemm.png
    python benchmarks/plot_gemm.py benchmarks/results/skinny_gemm/2026-12-01_rotate_final.json --tbps --out s.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _normalized(row: dict) -> dict:
    """A skinny_gemm_bench row with gemm_bench's keys (``flydsl_ms``, ``ratio``)."""
    if "skinny_ms" in row:
        return {**row, "flydsl_ms": row["skinny_ms"], "ratio": row.get("ratio_vs_cublas")}
    return row


def _rows(data, flush: str | None) -> list[dict]:
    """The default-configuration results (explore runs time many configs per shape: keep the fastest), of one
    ``flush`` (skinny_gemm_bench's timings; default: the first in the file)."""
    rows = [_normalized(row) for row in data["results"]]
    flushes = list(dict.fromkeys(row.get("flush") for row in rows))
    chosen = flush if flush is not None else flushes[0]
    if chosen not in flushes:
        raise SystemExit(f"--flush: the file has {flushes}, not {chosen!r}")
    best: dict[tuple, dict] = {}
    for row in rows:
        if row.get("flush") != chosen:
            continue
        if row.get("config", "default") != "default" and "explore" not in data.get("command", ""):
            continue
        key = (row["m"], row["n"], row["k"])
        if key not in best or row["flydsl_ms"] < best[key]["flydsl_ms"]:
            best[key] = row
    return list(best.values())


def _tbps_lines(rows, shapes, ms) -> list[tuple[str, list, dict]]:
    """(label, points, line style) of the weights' TB/s: ours and cuBLAS's per M, the same-bytes copy."""
    lines = []
    for m in ms:
        by_shape = {(r["n"], r["k"]): r for r in rows if r["m"] == m}
        for key, label, style in (("skinny", "flydsl", "-"), ("cublas", "cuBLAS", "--")):
            points = [(i, by_shape[s][f"{key}_weight_tbps"]) for i, s in enumerate(shapes) if s in by_shape]
            lines.append((f"{label} M={m}", points, {"linestyle": style, "marker": "o"}))
    copy = {(r["n"], r["k"]): r["same_bytes_copy_tbps"] for r in rows}
    lines.append(("torch copy, same bytes", [(i, copy[s]) for i, s in enumerate(shapes)], {"color": "k"}))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--out", default="gemm_vs_cublas.png")
    parser.add_argument("--flush", help="skinny_gemm_bench: which timing (dirty, clean, rotate; default the first)")
    parser.add_argument("--tbps", action="store_true", help="skinny_gemm_bench: the weights' TB/s, not the ratio")
    args = parser.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    rows = _rows(data, args.flush)
    if args.tbps and not all("same_bytes_copy_tbps" in r for r in rows):
        raise SystemExit("--tbps: needs skinny_gemm_bench results with peers (not --explore)")
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    ms = sorted({r["m"] for r in rows})
    ratio = {(r["m"], r["n"], r["k"]): r["ratio"] for r in rows}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here (pip install matplotlib); the ratios (cuBLAS time / ours):")
        for m in ms:
            values = [ratio.get((m, n, k)) for n, k in shapes]
            known = [v for v in values if v is not None]
            print(f"M={m:>5} " + " ".join("   -  " if v is None else f"{v:6.3f}" for v in values), end="")
            print(f"  geomean {statistics.geometric_mean(known):.3f}" if known else "")
        return 1
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(shapes)), 4.5))
    positions = range(len(shapes))
    commit = str(data.get("git_commit") or data.get("commit") or "?")[:10]
    if args.tbps:
        for label, points, style in _tbps_lines(rows, shapes, ms):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
        ax.axhline(3.8, color="r", linestyle=":", linewidth=1)
        ax.set_ylabel("weights streamed (TB/s)")
        flush = rows[0].get("flush", "?")
        ax.set_title(f"M <= 16: weight TB/s ({flush}), {data.get('gpu', '?')}, commit {commit}")
    else:
        for m in ms:
            points = [(i, ratio[(m, n, k)]) for i, (n, k) in enumerate(shapes) if (m, n, k) in ratio]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"M={m}")
        ax.axhline(1.0, color="k", linestyle="--", linewidth=1)
        ax.axhline(0.85, color="r", linestyle=":", linewidth=1)
        ax.set_ylabel("speed vs cuBLAS (x)")
        ax.set_title(f"flydsl gemm vs cuBLAS, {data.get('gpu', '?')}, commit {commit}")
    ax.set_xticks(list(positions), [f"{n}x{k}" for n, k in shapes], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("(N, K)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
