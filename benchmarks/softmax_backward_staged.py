"""Softmax backward on the H200: the staged kernel (dy and y through the shared-memory ring, see
flydsl.kernels.softmax.kernels.softmax_backward_staged_kernel) in the router's shape
(``flydsl.kernels.rows.router.SOFTMAX_BACKWARD``) and in other shapes, against the register kernel and copy, per
(dtype, N), on M x N = 2^28 elements; each result checked against float64 on the first rows.

    python benchmarks/softmax_backward_staged.py --commit C \
        --out benchmarks/results/softmax_backward_staged/DATE_WHAT.json
    python benchmarks/softmax_backward_staged.py --commit C --out x.json --dtypes bf16 --sizes 8192 \
        --shapes 1024:1:0:3,512:2:0:4     # [team:]THREADS:CHUNKS:LAG:STAGES, besides the routed shape

TB/s = bytes read + written / time (dy, y, dx: 3 * M * N * e; copy: 2 * M * N * e). GPU time: the median of
CUDA-event times of calls queued behind a sleep kernel (``median_ms(queued=True)``: the host's launch latency
hidden), after warm-up; all in one process.
"""

from __future__ import annotations

import argparse
import sys
import time

from flydsl.kernels.bench import median_ms

TOTAL = 1 << 28
SIZES = (8192, 16384, 32768, 65536, 131072, 262144)


def _shape(text: str):
    """A ``--shapes`` item, ``[team:]THREADS:CHUNKS:LAG:STAGES``, as a StagedForwardShape (nothing held)."""
    from flydsl.kernels.rows.configs import StagedForwardShape

    team = text.startswith("team:")
    threads, chunks, lag, stages = (int(v) for v in text.removeprefix("team:").split(":"))
    return StagedForwardShape(threads=threads, chunks=chunks, lag=lag, stages=stages, hold=0, team=team)


def staged_config(n: int, dtype: str, shape=None):
    """The staged kernel's config for softmax's backward in ``shape`` (default: the router's,
    :func:`~flydsl.kernels.rows.router.softmax_backward_shape`), or None (two sources in the ring: dy and y)."""
    from flydsl.kernels.rows.configs import staged_forward_config
    from flydsl.kernels.rows.router import softmax_backward_shape

    shape = shape or softmax_backward_shape(n, dtype)
    return staged_forward_config(n, dtype, shape, residual=True) if shape is not None else None


def _label(cfg) -> str:
    rc = cfg.row
    kind = "team" if rc.team else "cluster"
    return f"{kind} {rc.cluster} x {rc.block}t x {rc.chunks}c, lag {cfg.lag}, {cfg.stages} rows"


def _case(torch, name, n, shapes, reps) -> dict:
    import importlib

    from flydsl.kernels.rows.router import Route, RowKernel, RowOp
    from flydsl.kernels.softmax.api import SoftmaxTensors
    from flydsl.kernels.validation import from_torch

    kernels = importlib.import_module("flydsl.kernels.softmax.kernels")  # (flydsl.kernels.softmax is the function)

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]
    m = TOTAL // n
    y = torch.softmax(torch.randn(m, n, device="cuda"), -1).to(dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    dx = torch.full_like(y, float("nan"))
    e = y.element_size()
    tensors = SoftmaxTensors(x=from_torch(y), out=from_torch(dx), dy=from_torch(dy))

    def staged(cfg):
        chosen = Route(RowOp.SOFTMAX_BACKWARD, RowKernel.STAGED, cfg)
        return lambda: kernels.backward(tensors, chosen)

    rows = 64
    reference = y[:rows].double() * (dy[:rows].double() - (dy[:rows].double() * y[:rows].double()).sum(-1, True))

    def error() -> float:
        torch.cuda.synchronize()
        got = dx[:rows].double()
        return ((got - reference).norm() / reference.norm()).item() if torch.isfinite(got).all() else float("nan")

    src, dst = torch.empty(m * n, device="cuda", dtype=dtype).uniform_(), torch.empty(m * n, device="cuda", dtype=dtype)
    result = {"dtype": name, "M": m, "N": n, "runs": []}
    result["copy_gpu_tbps"] = 2 * m * n * e / median_ms(lambda: dst.copy_(src), reps, queued=True) / 1e9
    register = kernels.backward_route(tensors, staged=False)
    runs = [("register", lambda: kernels.backward(tensors, register))]
    routed = staged_config(n, result["dtype"])
    if routed is not None:
        runs.append((f"routed: {_label(routed)}", staged(routed)))
    for shape in shapes:
        cfg = staged_config(n, result["dtype"], shape)
        if cfg is None or cfg == routed:
            continue
        runs.append((_label(cfg), staged(cfg)))
    for name, run in runs:
        dx.fill_(float("nan"))
        run()
        err = error()
        tbps = 3 * m * n * e / median_ms(run, reps, queued=True) / 1e9
        result["runs"].append({"kernel": name, "gpu_tbps": tbps, "rel_error_vs_fp64": err})
        print(f"{result['dtype']:>5} {n:>7}  {tbps:5.2f} TB/s  err {err:.1e}  {name}", flush=True)
    print(f"{result['dtype']:>5} {n:>7}  {result['copy_gpu_tbps']:5.2f} TB/s  copy", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default=None, help="the commit measured (the GPU machine has no git)")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--shapes", default="", help="more staged shapes, [team:]THREADS:CHUNKS:LAG:STAGES,...")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", required=True, help="JSON record")
    args = parser.parse_args()
    shapes = [_shape(s) for s in args.shapes.split(",") if s]

    import torch
    from record import new_record, save

    started = time.time()
    method = (
        "median_ms(queued=True): CUDA events around each call queued behind a sleep kernel; TB/s = 3 * M * N * e"
        " / time (copy: 2 * M * N * e); M x N = 2^28; error: relative Frobenius vs float64, 64 rows"
    )
    record = new_record("softmax_backward_staged", None, [], commit=args.commit, method=method)
    for dtype in args.dtypes.split(","):
        for n in (int(v) for v in args.sizes.split(",")):
            record["results"].append(_case(torch, dtype, n, shapes, args.reps))
            record["wall_s"] = time.time() - started
            save(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
