"""Draws effective bandwidth vs N from a norms_bench JSON: one panel per kernel, a line per implementation and
dtype, the copy bandwidth and the bar (max(0.91 x copy, 0.98 x best peer)) dashed. Runs on any machine.

    python benchmarks/plot_norms.py benchmarks/results/norms/2026-11-30_70d9b99.json --out norms.png
    python benchmarks/plot_norms.py ... --gpu-time   # the *_gpu_tbps numbers (launch latency hidden), where recorded
"""

from __future__ import annotations

import argparse
import json
import sys

SERIES = [("ours_tbps", "flydsl"), ("torch_tbps", "torch eager"), ("torch_compile_tbps", "torch.compile")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--out", default="norms_bandwidth.png")
    parser.add_argument("--gpu-time", action="store_true", help="plot the GPU-time numbers (*_gpu_tbps)")
    args = parser.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    suffix = "_gpu" if args.gpu_time else ""
    if args.gpu_time and not all("copy_gpu_tbps" in r and "ours_gpu_tbps" in r for r in data["results"]):
        print(f"{args.json}: not every row has GPU-time numbers (*_gpu_tbps): plot without --gpu-time", file=sys.stderr)
        return 1

    def key_of(name: str) -> str:  # "ours_tbps" -> "ours_gpu_tbps" with --gpu-time
        return name.replace("_tbps", f"{suffix}_tbps")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here (pip install matplotlib); the numbers:", file=sys.stderr)
        for row in data["results"]:
            print(
                f"{row['kernel']:>18} {row['dtype']:>4} N={row['N']:>6} "
                + " ".join(f"{label}={row[key_of(key)]:.2f}" for key, label in SERIES if key_of(key) in row)
                + f" copy={row[key_of('copy_tbps')]:.2f} bar={row[key_of('bar_tbps')]:.2f}"
            )
        return 1
    kernels = list(dict.fromkeys(r["kernel"] for r in data["results"]))
    dtypes = list(dict.fromkeys(r["dtype"] for r in data["results"]))
    fig, axes = plt.subplots(len(dtypes), len(kernels), figsize=(4.5 * len(kernels), 3.6 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, kernel in enumerate(kernels):
            rows = sorted(
                (r for r in data["results"] if r["kernel"] == kernel and r["dtype"] == dtype), key=lambda r: r["N"]
            )
            ax = axes[i][j]
            ns = [r["N"] for r in rows]
            for key, label in SERIES:
                if all(key_of(key) in r for r in rows):
                    ax.plot(ns, [r[key_of(key)] for r in rows], marker="o", label=label)
            ax.plot(ns, [r[key_of("copy_tbps")] for r in rows], "k--", label="copy")
            ax.plot(ns, [r[key_of("bar_tbps")] for r in rows], "r:", label="bar")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kernel} {dtype}")
            ax.set_xlabel("N")
            ax.set_ylabel("TB/s")
            ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8)
    timing = "GPU time (launch latency hidden)" if args.gpu_time else "per call"
    inputs = f"{data['elements_per_input']} elements per input"
    fig.suptitle(f"{data['gpu']}, commit {data['commit'][:10]}, {inputs}, {timing}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
