"""Draws a gemm_bench (or skinny_gemm_bench) JSON: speed relative to cuBLAS per (N, K) shape, one line per M,
the issue's bars (1.0x, 0.85x) dashed. Runs on any machine; without matplotlib it prints the table instead.

    python benchmarks/plot_gemm.py benchmarks/results/gemm_sweep_2026-11-30.json --out gemm.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _rows(data) -> list[dict]:
    """The default-configuration results (explore runs time many configs per shape: keep the fastest)."""
    best: dict[tuple, dict] = {}
    for row in data["results"]:
        if row.get("config", "default") != "default" and "explore" not in data.get("command", ""):
            continue
        key = (row["m"], row["n"], row["k"])
        if key not in best or row["flydsl_ms"] < best[key]["flydsl_ms"]:
            best[key] = row
    return list(best.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--out", default="gemm_vs_cublas.png")
    args = parser.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    rows = _rows(data)
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
    for m in ms:
        points = [(i, ratio[(m, n, k)]) for i, (n, k) in enumerate(shapes) if (m, n, k) in ratio]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"M={m}")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=1)
    ax.axhline(0.85, color="r", linestyle=":", linewidth=1)
    ax.set_xticks(list(positions), [f"{n}x{k}" for n, k in shapes], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("(N, K)")
    ax.set_ylabel("speed vs cuBLAS (x)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"flydsl gemm vs cuBLAS, {data.get('gpu', '?')}, commit {str(data.get('git_commit', '?'))[:10]}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
