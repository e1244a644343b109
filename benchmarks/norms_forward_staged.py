"""LayerNorm / RMSNorm / fused add + RMSNorm / softmax forward on the H200: the staged kernel in the router's shape
(rows through a shared-memory ring, a row's CTAs pushing their partial sums to each other;
``flydsl.kernels.rows.router.STAGED_FORWARD``) against the register kernel and the device copy, per (kernel, dtype,
N), on M x N = 2^28 elements; then (``--sweep``) the staged kernel's other shapes (threads, chunks per thread, lag,
ring rows) launched directly.

    python benchmarks/norms_forward_staged.py --commit C --sweep \
        --out benchmarks/results/norms_forward_staged/DATE_WHAT.json

The ops and bytes are norms_bench.py's forwards (no statistics written; the fused add in place): TB/s = bytes read
+ written / time. Both kernels run through the public API (``flydsl.kernels.layer_norm`` ...), its route forced
(:func:`forced_route`: the register kernel, then the staged kernel in the router's shape, even where the router
takes the looped kernel; ``routed`` records which kernel the router takes): the same host path. Time: median of
``--reps`` CUDA-event timings after warm-up, each call alone (``*_tbps``) and queued behind a sleep kernel
(``*_gpu_tbps``: launch latency hidden); copy (``dst.copy_(x)``) in the same process. Each case also records the
largest difference between the two kernels' outputs (``max_diff``, in the output's dtype: a check, the GPU tests
hold the tolerances) and the bar of issue 7 (0.91 x copy). The JSON is rewritten after every case: a run stopped by
``--budget-s`` or a timeout keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time

from record import write_record

from flydsl.kernels.bench import median_ms

TOTAL = 1 << 28
SIZES = [32768, 65536, 131072, 262144]
# Staged shapes tried beside the default (--sweep): (threads, chunks per thread, lag, ring rows or None = most, and
# optionally hold: the count of chunks whose values stay in registers from the first pass to the output, lag 0; and
# keep: 1 to keep the weight and bias chunks in registers for all of a CTA's rows, StagedForwardConfig.keep_weights).
SHAPES = [
    (1024, 2, 1, None),
    (1024, 2, 2, None),
    (512, 4, 1, None),
    (512, 8, 1, None),
    (1024, 4, 0, None),  # clusters: each row's output right after its pairs arrive (no lag: 2 rows in flight)
    (1024, 4, 1, 2),  # one CTA per row: a 2-row ring
    (1024, 2, 0, None),  # the fused add at lag 0 (3 rows of 2 x 32 KB)
    (512, 8, 0, None),
    (1024, 8, 0, 1),  # a single-row ring of 128 KB per CTA (1 MB rows over 8 CTAs)
    (512, 16, 0, 1),
    (512, 8, 0, 1),  # the fused add's single-row ring at 512 threads
    (1024, 4, 0, None, 4),
    (512, 8, 0, None, 8),
]
KINDS = {"layer_norm": "layer", "rms_norm": "rms", "fused_add_rms_norm": "fused", "softmax": "softmax"}
DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}


@contextlib.contextmanager
def forced_route(chosen=None):
    """While the block runs, the public forwards (``flydsl.kernels.softmax``, ``layer_norm``, ``rms_norm``,
    ``fused_add_rms_norm``) launch along ``chosen`` (a :class:`~flydsl.kernels.rows.router.Route` of their op), or
    along the register kernel's route where ``chosen`` is None: their launch functions' route lookup
    (``forward_route`` of :mod:`flydsl.kernels.norms.forward` and :mod:`flydsl.kernels.softmax.kernels`) is replaced;
    the API's checks and allocations stay."""
    norm_forward = importlib.import_module("flydsl.kernels.norms.forward")
    softmax_kernels = importlib.import_module("flydsl.kernels.softmax.kernels")
    saved = norm_forward.forward_route, softmax_kernels.forward_route
    if chosen is None:
        norm_forward.forward_route = lambda t, rms, staged=True: saved[0](t, rms, staged=False)
        softmax_kernels.forward_route = lambda t, staged=True: saved[1](t, staged=False)
    else:
        norm_forward.forward_route = lambda t, rms, staged=True: chosen
        softmax_kernels.forward_route = lambda t, staged=True: chosen
    try:
        yield
    finally:
        norm_forward.forward_route, softmax_kernels.forward_route = saved


def routed_staged_config(kernel: str, n: int, dtype: str):
    """The staged forward's config in the router's shape for ``kernel`` rows (``STAGED_FORWARD``), or None where the
    router has none (the register or the looped kernel runs there)."""
    from flydsl.kernels.rows.configs import staged_forward_config
    from flydsl.kernels.rows.router import staged_forward_shape

    shape = staged_forward_shape(KINDS[kernel], n, dtype)
    if shape is None:
        return None
    return staged_forward_config(n, dtype, shape, residual=kernel == "fused_add_rms_norm")


def _ops(kernel: str, x, w, b, out, residual):
    """(the public call, bytes moved)."""
    import flydsl.kernels as fk

    m, n = x.shape
    e = x.element_size()
    if kernel == "softmax":
        return (lambda: fk.softmax(x, out)), 2 * m * n * e
    if kernel == "layer_norm":
        return (lambda: fk.layer_norm(x, w, b, 1e-5, out)), 2 * m * n * e + 2 * n * e
    if kernel == "rms_norm":
        return (lambda: fk.rms_norm(x, w, 1e-6, out)), 2 * m * n * e + n * e
    return (lambda: fk.fused_add_rms_norm(x, residual, w, 1e-6, out, residual_out=residual)), 4 * m * n * e + n * e


def _case(torch, kernel: str, dtype, n: int, reps: int) -> dict:
    from flydsl.kernels.rows.launch import device_groups
    from flydsl.kernels.rows.router import Route, RowKernel, RowOp, route

    m = TOTAL // n
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    out = torch.full_like(x, float("nan"))
    e = x.element_size()
    residual = torch.randn_like(x) if kernel == "fused_add_rms_norm" else None
    run, moved = _ops(kernel, x, w, b, out, residual)
    name = DTYPE_NAMES[str(dtype)]
    cfg = routed_staged_config(kernel, n, name)
    dst = torch.empty_like(x)
    copy_ms = median_ms(lambda: dst.copy_(x), reps)
    row = {"kernel": kernel, "dtype": name, "n": n, "rows": m, "bytes": moved}
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    row["routed"] = route(RowOp(kernel), n, name, sms=sms).kernel.value  # what the API runs by default
    row["copy_tbps"] = 2 * m * n * e / copy_ms / 1e9
    row["copy_gpu_tbps"] = 2 * m * n * e / median_ms(lambda: dst.copy_(x), reps, queued=True) / 1e9
    row["bar_tbps"] = 0.91 * row["copy_tbps"]
    saved = residual.clone() if residual is not None else None
    with forced_route():  # the register kernel
        run()
        reference = out.clone()
        row["current_tbps"] = moved / median_ms(run, reps) / 1e9
        row["current_gpu_tbps"] = moved / median_ms(run, reps, queued=True) / 1e9
    if cfg is None:
        row["staged"] = None  # no staged shape here: the register kernel either way
        return row
    rc = cfg.row
    row["staged"] = {"cluster": rc.cluster, "threads": rc.block, "chunks": rc.chunks, "stages": cfg.stages}
    row["staged"].update(lag=cfg.lag, hold=cfg.hold, blocks_per_sm=cfg.blocks_per_sm, claim_rows=cfg.claim_rows)
    row["staged"]["groups"] = device_groups(cfg, m, x.device.index)
    if saved is not None:  # the same inputs as the reference's call
        residual.copy_(saved)
    out.fill_(float("nan"))
    with forced_route(Route(RowOp(kernel), RowKernel.STAGED, cfg)):
        run()
        row["max_diff"] = (out.float() - reference.float()).abs().max().item()
        row["staged_tbps"] = moved / median_ms(run, reps) / 1e9
        row["staged_gpu_tbps"] = moved / median_ms(run, reps, queued=True) / 1e9
    return row


def staged_inputs(torch, kernel: str, m: int, n: int, dtype) -> dict:
    """Fresh inputs of one staged launch: x, weight, bias, out, and the fused add's residual (x otherwise)."""
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    residual = torch.randn_like(x) if kernel == "fused_add_rms_norm" else x
    return dict(x=x, w=w, b=b, out=torch.empty_like(x), residual=residual)


def staged_launch(kernel: str, cfg, t: dict):
    """A call that launches the staged kernel with ``cfg`` directly on ``t`` (:func:`staged_inputs`): the launch
    function along ``Route(op, RowKernel.STAGED, cfg)`` (grid, scratch and kernel), no API checks (eps 1e-6; the
    fused add writes residual_out into its residual)."""
    from flydsl.kernels.rows.router import Route, RowKernel, RowOp
    from flydsl.kernels.validation import from_torch

    chosen = Route(RowOp(kernel), RowKernel.STAGED, cfg)
    x, out = from_torch(t["x"]), from_torch(t["out"])
    if kernel == "softmax":
        from flydsl.kernels.softmax.api import SoftmaxTensors

        launch = importlib.import_module("flydsl.kernels.softmax.kernels").forward
        tensors = SoftmaxTensors(x=x, out=out)
        return lambda: launch(tensors, chosen)
    from flydsl.kernels.norms.api import NormTensors
    from flydsl.kernels.norms.forward import forward

    rms, fused = kernel != "layer_norm", kernel == "fused_add_rms_norm"
    r = from_torch(t["residual"]) if fused else None
    w, b = from_torch(t["w"]), None if rms else from_torch(t["b"])
    tensors = NormTensors(x=x, out=out, residual=r, weight=w, bias=b, residual_out=r)
    return lambda: forward(tensors, 1e-6, rms, chosen)


def staged_shape(spec, team: bool = False):
    """A :data:`SHAPES` or :func:`parse_shapes` entry, ``(threads, chunks, lag, stages[, hold[, keep[, blocks[,
    claim]]]])``, as a :class:`~flydsl.kernels.rows.configs.StagedForwardShape` (``team``: rows over several CTAs
    as teams)."""
    from flydsl.kernels.rows.configs import StagedForwardShape

    threads, chunks, lag, stages, *rest = spec
    hold, keep, blocks, claim = (list(rest) + [0, False, 1, False][len(rest) :])[:4]
    return StagedForwardShape(
        threads=threads,
        chunks=chunks,
        lag=lag,
        stages=stages,
        hold=hold,
        keep_weights=bool(keep),
        team=team,
        blocks_per_sm=blocks,
        claim_rows=bool(claim),
    )


SHAPE_FORMAT = "THREADS:CHUNKS:LAG[:STAGES[:HOLD[:KEEP[:BLOCKS[:CLAIM]]]]]"


def parse_shapes(text: str, error) -> list:
    """``--shapes`` (:data:`SHAPE_FORMAT`, comma-separated) as SHAPES entries (BLOCKS: CTAs per SM, default 1;
    CLAIM: 1 for rows claimed from a counter, ``StagedForwardConfig.claim_rows``); ``error(message)`` reports a bad
    one."""
    shapes = []
    for item in text.split(","):
        fields = item.split(":")
        if not 3 <= len(fields) <= 8 or not all(f.isdigit() for f in fields):
            error(f"--shapes: expected {SHAPE_FORMAT} (integers), got {item!r}")
            continue
        threads, chunks, lag, stages, hold, keep, blocks, claim = ([int(f) for f in fields] + [0] * 8)[:8]
        blocks = blocks if len(fields) >= 7 else 1
        if threads < 32 or chunks < 1 or hold > chunks or keep > 1 or blocks < 1 or claim > 1:
            error(
                f"--shapes: {item!r}: THREADS >= 32, CHUNKS >= 1, HOLD <= CHUNKS, KEEP 0 or 1, BLOCKS >= 1 and CLAIM"
                " 0 or 1"
            )
            continue
        shapes.append((threads, chunks, lag, stages or None, hold, bool(keep), blocks, bool(claim)))
    return shapes


def _sweep(torch, row: dict, dtype, reps: int, shapes=SHAPES, team: bool = False) -> list:
    """The staged kernel's other shapes for this case, launched directly (kernel and grid alone, no API checks);
    ``team``: rows over several CTAs as teams exchanging through global memory
    (``StagedForwardShape.team``)."""
    from flydsl.kernels.rows.configs import staged_forward_config

    n, m, kernel = row["n"], row["rows"], row["kernel"]
    t = staged_inputs(torch, kernel, m, n, dtype)
    found = []
    for spec in shapes:
        given = staged_shape(spec, team)
        cfg = staged_forward_config(n, row["dtype"], given, residual=kernel == "fused_add_rms_norm")
        shape = {"threads": given.threads, "chunks": given.chunks, "lag": given.lag, "stages": given.stages}
        shape.update(hold=given.hold, keep=given.keep_weights)
        shape.update(blocks_per_sm=given.blocks_per_sm, claim_rows=given.claim_rows)
        if cfg is None:
            found.append({**shape, "tbps": None})
            continue
        run = staged_launch(kernel, cfg, t)
        reference = _reference(torch, kernel, t["x"], t["w"], t["b"], t["residual"])  # before the residual changes
        t["out"].fill_(float("nan"))
        run()
        diff = (t["out"].float() - reference).abs().max().item()
        shape.update(cluster=cfg.row.cluster, team=cfg.row.team, stages=cfg.stages, hold=cfg.hold)
        shape.update(tbps=row["bytes"] / median_ms(run, reps) / 1e9)
        shape.update(gpu_tbps=row["bytes"] / median_ms(run, reps, queued=True) / 1e9, max_diff=diff)
        found.append(shape)
    return found


def _reference(torch, kernel: str, x, w, b, residual):
    """The sweep's float32 reference of one launch (eps 1e-6, as the sweep's launches; the fused add's output only)."""
    # the fused add normalizes x + residual rounded to the dtype (what residual_out holds)
    xf = (x.float() + residual.float()).to(x.dtype).float() if kernel == "fused_add_rms_norm" else x.float()
    if kernel == "softmax":
        return torch.softmax(xf, dim=-1)
    if kernel == "layer_norm":
        return torch.nn.functional.layer_norm(xf, xf.shape[-1:], w.float(), b.float(), 1e-6)
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * w.float()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default=None, help="the commit measured (the GPU machine has no git)")
    parser.add_argument("--kernels", default="layer_norm,rms_norm,fused_add_rms_norm,softmax")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--sweep", action="store_true", help="also time the staged kernel's other shapes")
    parser.add_argument(
        "--shapes",
        help=f"--sweep: only these shapes, {SHAPE_FORMAT} separated by commas"
        " (STAGES 0: most; HOLD: chunks whose values stay in registers, 0..CHUNKS; KEEP 1: weight and bias kept in"
        " registers; BLOCKS: CTAs per SM, default 1; CLAIM 1: rows claimed from a counter, one CTA per row), e.g."
        " 1024:4:0:0:4,1024:4:0:2:0:1,512:8:0:1:0:0:2:1",
    )
    parser.add_argument(
        "--team", action="store_true", help="--sweep: rows over several CTAs as teams (global-memory exchange)"
    )
    parser.add_argument("--budget-s", type=float, default=270.0, help="no new case after this many seconds")
    parser.add_argument("--out", required=True, help="JSON record (rewritten after every case)")
    args = parser.parse_args()
    if args.team and not args.sweep:
        parser.error("--team applies to the --sweep's shapes: add --sweep")

    import torch

    shapes = SHAPES
    if args.shapes:
        if not args.sweep:
            parser.error("--shapes selects the shapes of --sweep: add --sweep")
        shapes = parse_shapes(args.shapes, parser.error)
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    started = time.time()
    results, skipped = [], []
    method = (
        "median of --reps CUDA-event timings after 3 warm-up calls, each call alone (*_tbps) and queued behind a "
        "sleep kernel (*_gpu_tbps); copy in the same process; M x N = 2^28; sweep shapes launched directly"
    )
    for kernel in args.kernels.split(","):
        for name in args.dtypes.split(","):
            for n in map(int, args.sizes.split(",")):
                if time.time() - started > args.budget_s:
                    skipped.append(f"{kernel} {name} {n}")
                    continue
                row = _case(torch, kernel, dtypes[name], n, args.reps)
                if args.sweep:  # where no config is routed too: the shapes that might serve there
                    row["sweep"] = _sweep(torch, row, dtypes[name], args.reps, shapes, args.team)
                results.append(row)
                best = max([s["gpu_tbps"] for s in row.get("sweep", []) if s["tbps"]] or [0.0])
                print(
                    f"{kernel:20s} {name:4s} {n:7d}  copy {row['copy_tbps']:.2f}  bar {row['bar_tbps']:.2f}  "
                    f"current {row['current_tbps']:.2f}  staged {row.get('staged_tbps', float('nan')):.2f}  "
                    f"(gpu {row['current_gpu_tbps']:.2f} / {row.get('staged_gpu_tbps', float('nan')):.2f})  "
                    f"sweep best (gpu) {best:.2f}  diff {row.get('max_diff', float('nan')):.3g}  routed {row['routed']}"
                    f"  {row['staged']}",
                    flush=True,
                )
                summary = {"skipped (budget)": skipped, "seconds": round(time.time() - started, 1)}
                write_record(
                    args.out, "norms_forward_staged", None, results, commit=args.commit, method=method, summary=summary
                )
    if skipped:
        summary = {"skipped (budget)": skipped, "seconds": round(time.time() - started, 1)}
        write_record(
            args.out, "norms_forward_staged", None, results, commit=args.commit, method=method, summary=summary
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
