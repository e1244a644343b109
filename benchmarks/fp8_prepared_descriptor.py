"""Why prepared fp8 weights ran 2-5% slower than plain ones at M >= 2048 (docs/kernels-zoo.md#prepared-weights): the
dense fp8 GEMM on the same weights three ways, in one process, each checked bit for bit against the first:

- ``plain``: nn.Linear weights as ``w.t()`` (a 2-D TMA descriptor over (N, K), boxes of (rows, 128));
- ``panels``: ``prepare_weight``'s contiguous (K / 128, N, 128) panels (the prepared path's descriptor);
- ``strided3d``: the plain weights seen as panels, strides (128, K, 1), through the prepared path (its check for
  contiguous panels bypassed here): the plain layout's very boxes through the prepared path's 3-D descriptor. Where
  the prepared path takes a 2-D descriptor, this variant is refused and left out.

    python benchmarks/fp8_prepared_descriptor.py --json OUT --commit C

Medians of ``--repeats`` triton do_bench medians (L2 flushed), e4m3 operands, per-token and per-channel scales.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from record import error_text, write_record

SHAPES = [
    (8192, 4096, 14336),
    (8192, 8192, 8192),
    (8192, 4096, 4096),
    (2048, 18432, 7168),
    (8192, 7168, 2048),
    (8192, 18432, 7168),
]


def run_shape(torch, do_bench, m, n, k, repeats) -> dict:
    from flydsl.kernels.gemm import PreparedWeight, fp8_gemm, prepare_weight

    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda")
    weights = {
        "plain": w.t(),
        "panels": prepare_weight(w.t()),
        "strided3d": PreparedWeight(torch.as_strided(w, (k // 128, n, 128), (128, k, 1)), k, n),
    }
    outs = {name: torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for name in weights}
    calls = {name: (lambda b=b, out=outs[name]: fp8_gemm(a, b, scale_a, scale_b, out)) for name, b in weights.items()}
    row = {"m": m, "n": n, "k": k}
    for name, call in list(calls.items()):
        try:
            call()
            torch.cuda.synchronize()
            row[f"{name}_same_bits"] = torch.equal(outs[name], outs["plain"])
        except Exception as error:  # noqa: BLE001 (recorded)
            row[f"{name}_refused"] = error_text(error)
            del calls[name]
    runs = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            runs[name].append(do_bench(call, warmup=10, rep=40, return_mode="median"))
    for name, values in runs.items():
        row[f"{name}_ms"] = statistics.median(values)
        row[f"{name}_tflops"] = 2.0 * m * n * k / row[f"{name}_ms"] / 1e9
        row[f"{name}_speed_vs_plain"] = statistics.median(runs["plain"]) / row[f"{name}_ms"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--commit", default="unknown", help="the git commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)
    import torch
    from triton.testing import do_bench

    from flydsl.kernels.gemm import launch

    # the strided variant is not prepare_weight's: let it through the prepared path's shape check
    launch.check_prepared = lambda who, b, out=None: torch.empty((b.k, b.n), dtype=b.data.dtype, device="meta")
    rows = []
    for m, n, k in SHAPES:
        row = run_shape(torch, do_bench, m, n, k, args.repeats)
        rows.append(row)
        speeds = "  ".join(f"{v} {row[f'{v}_speed_vs_plain']:.3f}" for v in ("panels", "strided3d") if f"{v}_ms" in row)
        print(f"{m}x{n}x{k}: plain {row['plain_tflops']:.0f} TFLOP/s; speed vs plain: {speeds}", flush=True)
    if args.json:
        method = (
            "one process; per shape plain, panels and strided3d interleaved, triton do_bench medians (L2 flushed),"
            " median of the repeats; each output compared bit for bit with plain's"
        )
        write_record(args.json, "fp8_prepared_descriptor", argv, rows, commit=args.commit, method=method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
