"""Effective bandwidth of flydsl.kernels' softmax / layer_norm / rms_norm / fused_add_rms_norm (forward and backward)
next to torch eager, torch.compile and the device copy, on M x N inputs of 2^28 elements, in one process.

    python benchmarks/norms_bench.py --commit $(git rev-parse --short HEAD) --kernels softmax,layer_norm \
        --out benchmarks/results/norms/$(date +%F)_WHAT.json     # WHAT: the run in a word or two, or the commit

Effective bandwidth = bytes read + written by the op (inputs, outputs, parameters, statistics) / time. Time: CUDA
events around each launch, after warm-up, median of ``--reps`` runs (>= 5) on random inputs (one draw per shape,
the output poisoned with NaN before the runs); peers run in the same process, interleaved; the SM clock and power
(nvidia-smi, sampled every ``--clocks-ms`` while each row is timed) are recorded with each row (``clocks``): the
kernels are clock-sensitive and machines differ; so are the routed staged kernels' shapes and persistent grids
(``grids``: how many clusters the driver lets run at once, per machine). Copy bandwidth: ``out.copy_(x)`` of one
input-sized tensor (2 x its bytes moved).
Every number also comes as GPU time (``*_gpu_tbps``, with ``bar_gpu_tbps`` / ``meets_bar_gpu`` from them): each call
queued behind a sleep kernel (:data:`SLEEP`), which hides the host's launch latency, as in a training step's queue
(each call timed alone on an idle GPU includes it: ours ~20 us of Python checks and launch, the backward's 60-100 us,
torch's ~5-10 us); the backward's bar in GPU time is 0.85 x copy's GPU time (``backward_bar_gpu_tbps``).
Liger-Kernel's forwards (``liger_kernel.transformers.functional``) are a peer where the package imports (carry its
wheel: ``DEVRT_PIP="... liger-kernel"``) and where a kernel runs (its Triton kernels refuse rows past their block
limit: the error is recorded per cell as ``liger_error``); the JSON's ``liger`` says which version ran, or why none
did. Backward: ours against copy only (the bar is 0.85 x copy); torch's eager backward is recorded for reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from importlib import metadata

from record import ClockMonitor, new_record, save  # this folder's sibling module

from flydsl.kernels.bench import median_ms
from flydsl.kernels.device import max_active_clusters

SIZES = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
# GPU time's sleep (cycles, ~500 us at 1980 MHz): longer than any call's host time (the backward's reach 60-100 us,
# which outlasted the default ~100 us sleep: benchmarks/results/norms_backward_staged/2026-12-01_api_probe.json).
SLEEP = 1_000_000
TOTAL = 1 << 28


def _ops(torch, F):
    """name -> (ours(x, aux), torch eager(x, aux), bytes(M, N, element bytes), aux builder)."""
    import flydsl.kernels as norms  # the public functions

    def aux_w(m, n, dtype):
        return {"w": torch.randn(n, device="cuda", dtype=dtype), "b": torch.randn(n, device="cuda", dtype=dtype)}

    def aux_res(m, n, dtype):
        return {"w": torch.randn(n, device="cuda", dtype=dtype), "r": torch.randn(m, n, device="cuda", dtype=dtype)}

    def rms_eager(x, a):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * a["w"].float()).to(x.dtype)

    def fused_eager(x, a):
        s = x + a["r"]
        return rms_eager(s, a), s

    return {
        "softmax": (
            lambda x, a: norms.softmax(x, a["out"]),
            lambda x, a: torch.softmax(x, dim=-1),
            lambda m, n, e: 2 * m * n * e,
            lambda m, n, d: {},
        ),
        "layer_norm": (
            lambda x, a: norms.layer_norm(x, a["w"], a["b"], 1e-5, a["out"]),
            lambda x, a: F.layer_norm(x, (x.shape[1],), a["w"], a["b"], 1e-5),
            lambda m, n, e: 2 * m * n * e + 2 * n * e,
            aux_w,
        ),
        "rms_norm": (
            lambda x, a: norms.rms_norm(x, a["w"], 1e-6, a["out"]),
            rms_eager,
            lambda m, n, e: 2 * m * n * e + n * e,
            aux_w,
        ),
        "fused_add_rms_norm": (
            lambda x, a: norms.fused_add_rms_norm(x, a["r"], a["w"], 1e-6, a["out"], residual_out=a["r"]),
            fused_eager,
            lambda m, n, e: 4 * m * n * e + n * e,
            aux_res,
        ),
    }


def liger_ops() -> tuple[dict, str]:
    """Liger-Kernel's forwards as ``name -> fn(x, aux)`` (the arguments of :func:`_ops`' functions) and a status: its
    version, or why it is not measured ({} then)."""
    try:
        from liger_kernel.transformers import functional as liger
    except Exception as error:  # not installed, or its import fails on this machine: recorded, not fatal
        return {}, f"not measured: liger_kernel does not import here ({type(error).__name__}: {error})"
    ops = {
        "softmax": lambda x, a: liger.liger_softmax(x),
        "layer_norm": lambda x, a: liger.liger_layer_norm(x, a["w"], a["b"], 1e-5),
        "rms_norm": lambda x, a: liger.liger_rms_norm(x, a["w"], 1e-6, in_place=False),
        "fused_add_rms_norm": lambda x, a: liger.liger_fused_add_rms_norm(x, a["r"], a["w"], 1e-6, in_place=False),
    }
    try:  # (the package has no __version__)
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:  # importable from a path but not installed
        version = "(version unknown)"
    return ops, f"liger-kernel {version}"


def _backward(torch, name, x, a, m, n, e, reps):
    """(ours ms, bytes, torch eager ms or None, ours ms with the GPU kept busy)."""
    import flydsl.kernels as norms  # the public functions

    dy = torch.randn_like(x)
    dx = torch.empty_like(x)
    if name == "softmax":
        y = torch.softmax(x, dim=-1)
        ours = partial(norms.softmax_backward, dy, y, dx)
        ref = median_ms(lambda: torch._softmax_backward_data(dy, y, -1, x.dtype), reps)
        return median_ms(ours, reps), 3 * m * n * e, ref, median_ms(ours, reps, queued=True, sleep_cycles=SLEEP)
    if name == "layer_norm":
        _, mean, rstd = norms.layer_norm(x, a["w"], a["b"], 1e-5, a["out"], return_stats=True)
        ours = partial(norms.layer_norm_backward, dy, x, a["w"], mean, rstd, dx)
        return (
            median_ms(ours, reps),
            3 * m * n * e + 8 * m + 3 * n * e,
            None,
            median_ms(ours, reps, queued=True, sleep_cycles=SLEEP),
        )
    if name == "rms_norm":
        _, rstd = norms.rms_norm(x, a["w"], 1e-6, a["out"], return_stats=True)
        ours = partial(norms.rms_norm_backward, dy, x, a["w"], rstd, dx)
        return (
            median_ms(ours, reps),
            3 * m * n * e + 4 * m + 2 * n * e,
            None,
            median_ms(ours, reps, queued=True, sleep_cycles=SLEEP),
        )
    return None, None, None, None


# LayerNorm backward configs tried against the default per (dtype, N): (chunks per thread, registers, CTA threads).
SWEEP = {
    ("bf16", 8192): [(2, 80, 512), (1, 64, 1024), (1, 64, 256)],
    ("bf16", 16384): [(2, 80, 512), (1, 64, 1024), (1, 64, 256)],
    ("bf16", 32768): [(2, 80, 512), (1, 64, 512), (1, 64, 1024)],
    ("bf16", 65536): [(1, 64, 512), (2, 80, 512)],
    ("f32", 8192): [(2, 64, 1024), (2, 64, 512), (1, 64, 256)],
    ("f32", 32768): [(2, 64, 256), (2, 64, 1024), (1, 64, 512)],
}


def backward_kernel_launcher(torch, tensors, cfg, groups: int, rms: bool = False, static_n: bool = False):
    """A callable launching the norm backward kernel alone (LayerNorm, or RMSNorm with ``rms``) with ``cfg`` on
    ``groups`` CTA groups (a team's exchange zeroed before each launch, as ``backward()`` does); ``static_n``: the
    staged kernel's row length compiled in (``flyc.mark_static``; ``backward()`` leaves it a launch argument)."""
    import flydsl.compiler as flyc
    from flydsl.kernels.norms.backward import norm_backward_kernel
    from flydsl.kernels.rows.configs import NormFlags
    from flydsl.kernels.rows.exchange import exchange_columns
    from flydsl.kernels.rows.launch import launch_rows

    dy, x, w, mean, rstd, dx = tensors
    rc = cfg.row
    partials = torch.empty(groups, max(1, cfg.sums) * x.shape[1], device="cuda")
    exchange = torch.zeros(x.shape[0], exchange_columns(cfg), device="cuda") if rc.team else dx
    flags = NormFlags(rms=rms, weight=True, bias=not rms)

    def run():
        if rc.team:
            exchange.zero_()
        rows = flyc.mark_static(x, dims=(1,)) if static_n and cfg.staged else x
        tensors = (dy, rows, w, mean, rstd, dx, partials, partials, partials, exchange)  # (dweight, dbias: unused)
        launch_rows(norm_backward_kernel, (*tensors, cfg, flags), cfg, groups)

    return run


def backward_kernel_tbps(
    torch, tensors, cfg, groups: int, reps: int, rms: bool = False, static_n: bool = False
) -> float:
    """:func:`backward_kernel_launcher` timed: TB/s = 3 * M * N * e / time."""
    x = tensors[1]
    run = backward_kernel_launcher(torch, tensors, cfg, groups, rms, static_n)
    return 3 * x.numel() * x.element_size() / median_ms(run, reps) / 1e9


def _config_sweep(torch, reps: int) -> list:
    """LayerNorm backward kernel alone (no column-sum kernel, no host code) with the routed config at several
    persistent-grid sizes, and with the configs of SWEEP: one line per (dtype, N)."""
    from flydsl.kernels.rows.configs import make_backward_config
    from flydsl.kernels.rows.router import RowOp, route

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines = []
    for (name, n), variants in SWEEP.items():
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        m = TOTAL // n
        x, dy = torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(m, n, device="cuda", dtype=dtype)
        mean, rstd = x.float().mean(-1), torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        tensors = (dy, x, torch.randn(n, device="cuda", dtype=dtype), mean, rstd, torch.empty_like(x))
        dst = torch.empty_like(x)
        copy = 2 * x.numel() * x.element_size() / median_ms(partial(dst.copy_, x), reps) / 1e9
        cfg = route(RowOp.LAYER_NORM_BACKWARD, n, name, sums=2, sms=sms).config
        rc = cfg.row
        full = min(-(-m // rc.rows_per_cta), cfg.blocks_per_sm * sms // rc.cluster)
        line = f"{name} N={n} copy {copy:.2f} bar {0.85 * copy:.2f} | default {rc.cluster}x{rc.block} c{rc.chunks}"
        line += f" b{cfg.blocks_per_sm}:"
        for groups in sorted({full, full * 7 // 8, full * 3 // 4, full // 2}, reverse=True):
            line += f" g{groups} {backward_kernel_tbps(torch, tensors, cfg, groups, reps):.2f}"
        for chunks, regs, cta in variants:
            v = make_backward_config(n, name, 2, chunks, regs, cta)
            groups = min(-(-m // v.row.rows_per_cta), v.blocks_per_sm * sms // v.row.cluster)
            line += f" | c{chunks} r{regs} cta{cta} ({v.row.cluster}x{v.row.block} b{v.blocks_per_sm} g{groups})"
            line += f" {backward_kernel_tbps(torch, tensors, v, groups, reps):.2f}"
        print(line, flush=True)
        lines.append(line)
        del tensors, dst
        torch.cuda.empty_cache()
    return lines


def staged_grid(cfg, rows: int, sms: int, device: int = 0, active_clusters=max_active_clusters) -> dict | None:
    """A staged config's shape and its persistent grid on ``device`` (``groups``: the CTA groups that run at once,
    from the driver's count of co-resident clusters (``active_clusters(cluster, threads, blocks_per_sm, device)``,
    :func:`~flydsl.kernels.device.max_active_clusters`), which can differ between machines: recorded with each cell
    so that runs can be compared); None for another kernel."""
    from flydsl.kernels.rows.launch import persistent_groups

    if cfg is None or not cfg.staged:
        return None
    rc = cfg.row
    active = active_clusters(rc.cluster, rc.block, cfg.blocks_per_sm, device) if rc.cluster_shape else None
    shape = {"cluster": rc.cluster, "team": rc.team, "threads": rc.block, "chunks": rc.chunks, "stages": cfg.stages}
    shape.update(lag=cfg.lag, blocks_per_sm=cfg.blocks_per_sm, active_clusters=active)
    shape["groups"] = persistent_groups(cfg, rows, sms, active)
    return shape


def routed_grids(name: str, dtype: str, n: int, rows: int, sms: int, active_clusters=max_active_clusters) -> dict:
    """The staged kernels' shapes and grids a cell routes to (:func:`staged_grid`; the router's answer for 16-byte
    aligned torch tensors on ``sms`` SMs): ``forward`` (None where the looped or the register kernel runs) and, for
    LayerNorm and RMSNorm with their weight (and LayerNorm's bias), ``backward``."""
    from flydsl.kernels.rows.router import RowKernel, RowOp, route

    forward = route(RowOp(name), n, dtype, sms=sms)
    staged = forward.config if forward.kernel is RowKernel.STAGED else None
    grids = {"forward": staged_grid(staged, rows, sms, 0, active_clusters)}
    if name in ("layer_norm", "rms_norm"):
        op, sums = (RowOp.LAYER_NORM_BACKWARD, 2) if name == "layer_norm" else (RowOp.RMS_NORM_BACKWARD, 1)
        grids["backward"] = staged_grid(route(op, n, dtype, sms=sms, sums=sums).config, rows, sms, 0, active_clusters)
    return grids


# The tuning flags' edits of the router's tables and the layout's constants (each followed by router.clear_cache():
# the routes found are cached). In place, so that every module that imported a table sees the edit.


def set_cta_threads(threads: int) -> None:
    """--cta-threads: rows.layout.CTA_THREADS (threads per CTA before row_config splits a row over a cluster: softmax's
    register backward, the register forwards' cluster rows) and FORWARD_CTA_THREADS (the register forwards' one-CTA
    rows). (The norms' register backward passes its CTA threads explicitly: untouched, as before.)"""
    from flydsl.kernels.rows import layout, router

    layout.CTA_THREADS = layout.FORWARD_CTA_THREADS = threads
    router.clear_cache()


def set_warp_block(threads: int) -> None:
    """--warp-block: rows.layout.FORWARD_WARP_BLOCK (the register forwards' CTAs of one-warp rows)."""
    from flydsl.kernels.rows import layout, router

    layout.FORWARD_WARP_BLOCK = threads
    router.clear_cache()


def set_forward_values(values: int) -> None:
    """--forward-values: rows.layout.FORWARD_BLOCK_VALUES of every dtype."""
    from flydsl.kernels.rows import layout, router

    layout.FORWARD_BLOCK_VALUES.update(dict.fromkeys(layout.FORWARD_BLOCK_VALUES, values))
    router.clear_cache()


def use_hints(text: str) -> None:
    """--forward-hints: rows.layout.FORWARD_CACHE_HINTS of every dtype (:meth:`CacheHints.parse` of ``text``)."""
    from flydsl.kernels.rows import layout, router

    layout.FORWARD_CACHE_HINTS.update(dict.fromkeys(layout.FORWARD_CACHE_HINTS, layout.CacheHints.parse(text)))
    router.clear_cache()


def use_store_group(text: str) -> None:
    """--forward-store-group: rows.router.FORWARD_STORE_GROUP of every dtype."""
    from flydsl.kernels.rows import router

    router.FORWARD_STORE_GROUP.update(dict.fromkeys(router.FORWARD_STORE_GROUP, int(text)))
    router.clear_cache()


def check_variants(args) -> str | None:
    """What is wrong with the tuning variants of ``args`` (--forward-hints, --forward-looped, --forward-store-group),
    or None: checked before anything is allocated on the GPU."""
    from flydsl.kernels.rows.layout import CacheHints

    checks = [(CacheHints.parse, "--forward-hints", args.forward_hints)]
    checks.append((lambda t: t in ("none", "routed") or looped_shape(t), "--forward-looped", args.forward_looped))
    checks.append((int, "--forward-store-group", args.forward_store_group))
    for parse, flag, given in checks:
        for text in given.split(";") if given else []:
            try:
                parse(text)
            except (TypeError, ValueError) as error:
                return f"{flag}: {text!r}: {error}"
    return None


LOOPED_KINDS = ("layer", "rms", "fused")  # the norms' forward kinds (softmax has no looped kernel)
LOOPED_DTYPES = ("bf16", "f16", "f32")


def looped_shape(text: str):
    """A --forward-looped variant, ``T:C[:BLOCKS[:GROUP]][/FIRST/REREAD]``, as a rows.configs.LoopedShape (the
    reads' hints as --forward-hints; plain where left out)."""
    from flydsl.kernels.rows.configs import LoopedShape
    from flydsl.kernels.rows.layout import PLAIN_HINTS, CacheHints

    shape, *hints = text.split("/")
    threads, chunks, *blocks = map(int, shape.split(":"))
    first, reread = (*map(CacheHints.parse, hints), PLAIN_HINTS, PLAIN_HINTS)[:2]
    return LoopedShape(threads, chunks, first, reread, *blocks)


def use_looped(text: str, routed: dict) -> None:
    """--forward-looped: rows.router.LOOPED_FORWARD replaced by one shape for every N, norm kind and dtype
    (:func:`looped_shape`), emptied (``"none"``) or set back to ``routed`` (``"routed"``: a copy of the table)."""
    from flydsl.kernels.rows import router

    router.LOOPED_FORWARD.clear()
    if text == "routed":
        router.LOOPED_FORWARD.update(routed)
    elif text != "none":
        rows = [(1, 1 << 40, looped_shape(text))]
        router.LOOPED_FORWARD.update({(kind, d): rows for kind in LOOPED_KINDS for d in LOOPED_DTYPES})
    router.clear_cache()


def _write(path: str, result: dict, started: float) -> None:
    result["wall_s"] = round(time.time() - started, 1)
    save(path, result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="git rev-parse HEAD of the measured tree")
    parser.add_argument("--kernels", default="softmax,layer_norm,rms_norm,fused_add_rms_norm")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--backward", action="store_true", help="also time the backward kernels")
    parser.add_argument("--backward-only", action="store_true", help="time copy and the backward kernels only")
    parser.add_argument(
        "--config-sweep", action="store_true", help="then time LayerNorm backward configs and grid sizes (SWEEP)"
    )
    parser.add_argument(
        "--cta-threads",
        type=int,
        default=None,
        help="override rows.layout.CTA_THREADS and FORWARD_CTA_THREADS (tuning)",
    )
    parser.add_argument(
        "--warp-block",
        type=int,
        choices=(32, 64, 128, 256),
        default=None,
        help="override rows.layout.FORWARD_WARP_BLOCK (tuning)",
    )
    parser.add_argument(
        "--forward-values",
        type=int,
        choices=(8, 16, 32),
        default=None,
        help="override rows.layout.FORWARD_BLOCK_VALUES for every dtype (tuning)",
    )
    parser.add_argument(
        "--forward-hints",
        default=None,
        help="cache hints of the register forwards (rows.layout.FORWARD_CACHE_HINTS, every dtype), e.g."
        " 'rows=evict_first,out=stream,vectors=evict_last'; several separated by ';' are each timed (ours only,"
        " 'variants' in the JSON), the first one in the main columns (tuning)",
    )
    parser.add_argument(
        "--forward-looped",
        default=None,
        help="looped forwards of the norms (rows.router.LOOPED_FORWARD for every N, kind and dtype): 'T:C' (threads,"
        " chunks per thread per segment[:CTAs per SM ptxas must fit[:store group]]), optionally '/FIRST/REREAD' (the"
        " two reads' CacheHints, as --forward-hints), 'none' (no looped forward: the register or staged kernels) or"
        " 'routed' (the table as it is); several separated by ';' are each timed as --forward-hints' are (tuning)",
    )
    parser.add_argument(
        "--forward-store-group",
        default=None,
        help="chunks the register norm forwards compute before their stores (rows.router.FORWARD_STORE_GROUP, every"
        " dtype), e.g. '1;2;4': each timed as --forward-hints' are (tuning)",
    )
    parser.add_argument(
        "--clocks-ms",
        type=int,
        default=500,
        help="nvidia-smi's sampling period for the SM clock and power recorded per row (0: not sampled)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.backward = args.backward or args.backward_only

    import torch
    import torch.nn.functional as F

    torch._dynamo.config.cache_size_limit = 1024
    from flydsl.kernels.rows import router

    if args.cta_threads:
        set_cta_threads(args.cta_threads)
    if args.warp_block:
        set_warp_block(args.warp_block)
    if args.forward_values:
        set_forward_values(args.forward_values)
    routed_looped = dict(router.LOOPED_FORWARD)

    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}
    if sum(map(bool, (args.forward_hints, args.forward_looped, args.forward_store_group))) > 1:
        parser.error("--forward-hints, --forward-looped, --forward-store-group: one kind of variant per run")
    variant_error = check_variants(args)
    if variant_error:
        parser.error(variant_error)
    variants = []  # (label, function applying it): ours is timed under each
    if args.forward_hints:
        variants = [(f"hints {text or 'none'}", partial(use_hints, text)) for text in args.forward_hints.split(";")]
    if args.forward_looped:
        variants = [
            (f"looped {text}", partial(use_looped, text, routed_looped)) for text in args.forward_looped.split(";")
        ]
    if args.forward_store_group:
        groups = args.forward_store_group.split(";")
        variants = [(f"store group {text}", partial(use_store_group, text)) for text in groups]
    if variants:
        variants[0][1]()
    monitor = ClockMonitor(args.clocks_ms) if args.clocks_ms > 0 else None
    ops = _ops(torch, F)
    liger, liger_status = liger_ops() if not args.backward_only else ({}, "not measured: --backward-only")
    props = torch.cuda.get_device_properties(0)
    result = new_record(
        "norms_bench",
        None,
        [],
        commit=args.commit,
        method="median of CUDA-event times",
        elements_per_input=TOTAL,
        reps=args.reps,
        liger=liger_status,
        units="TB/s (bytes read + written / time)",
        complete=False,
    )
    started = time.time()
    for name in args.kernels.split(","):
        ours_fn, eager_fn, nbytes, make_aux = ops[name]
        compiled_fn = None if args.no_compile or args.backward_only else torch.compile(eager_fn, dynamic=False)
        for dname in args.dtypes.split(","):
            dtype = dtypes[dname]
            e = torch.empty((), dtype=dtype).element_size()
            for n in map(int, args.sizes.split(",")):
                m = TOTAL // n
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                aux = make_aux(m, n, dtype)
                aux["out"] = torch.full_like(x, float("nan"))
                copy_dst = torch.empty_like(x)
                total = nbytes(m, n, e)
                row = {"kernel": name, "dtype": dname, "M": m, "N": n, "bytes": total}
                row["copy_tbps"] = 2 * x.numel() * e / median_ms(partial(copy_dst.copy_, x), args.reps) / 1e9
                busy_copy = median_ms(partial(copy_dst.copy_, x), args.reps, queued=True, sleep_cycles=SLEEP)
                row["copy_gpu_tbps"] = 2 * x.numel() * e / busy_copy / 1e9
                if not args.backward_only:
                    timed = {"ours": partial(ours_fn, x, aux), "torch": partial(eager_fn, x, aux)}
                    if name in liger:
                        try:  # once: its kernels refuse some N
                            liger[name](x, aux)
                            timed["liger"] = partial(liger[name], x, aux)
                        except Exception as error:
                            row["liger_error"] = f"{type(error).__name__}: {str(error)[:200]}"
                    if compiled_fn is not None:
                        t0 = time.time()
                        compiled_fn(x, aux)
                        row["compile_s"] = round(time.time() - t0, 1)
                        timed["torch_compile"] = partial(compiled_fn, x, aux)
                    for who, fn in timed.items():
                        row[f"{who}_tbps"] = total / median_ms(fn, args.reps) / 1e9
                        row[f"{who}_gpu_tbps"] = total / median_ms(fn, args.reps, queued=True, sleep_cycles=SLEEP) / 1e9
                    if len(variants) > 1:
                        row["variants"] = {}
                        for label, apply in variants:  # ours again under each
                            apply()
                            row["variants"][label] = {
                                "tbps": total / median_ms(timed["ours"], args.reps) / 1e9,
                                "gpu_tbps": total
                                / median_ms(timed["ours"], args.reps, queued=True, sleep_cycles=SLEEP)
                                / 1e9,
                            }
                        variants[0][1]()
                    for suffix, copy in (("", row["copy_tbps"]), ("_gpu", row["copy_gpu_tbps"])):
                        peers = ("torch", "torch_compile", "liger")
                        best_peer = max(row.get(f"{who}{suffix}_tbps", 0) for who in peers)
                        row[f"bar{suffix}_tbps"] = max(0.91 * copy, 0.98 * best_peer)
                        row[f"meets_bar{suffix}"] = row[f"ours{suffix}_tbps"] >= row[f"bar{suffix}_tbps"]
                if args.backward:
                    ms, bwd_bytes, ref_ms, busy_ms = _backward(torch, name, x, aux, m, n, e, args.reps)
                    if ms is not None:
                        row["backward_tbps"] = bwd_bytes / ms / 1e9
                        row["backward_bar_tbps"] = 0.85 * row["copy_tbps"]
                        row["backward_meets_bar"] = row["backward_tbps"] >= row["backward_bar_tbps"]
                        # The same with the host's launch latency hidden (GPU time), next to copy timed so too.
                        row["backward_gpu_tbps"] = bwd_bytes / busy_ms / 1e9
                        row["backward_bar_gpu_tbps"] = 0.85 * row["copy_gpu_tbps"]
                        row["backward_meets_bar_gpu"] = row["backward_gpu_tbps"] >= row["backward_bar_gpu_tbps"]
                        if ref_ms is not None:
                            row["backward_torch_tbps"] = bwd_bytes / ref_ms / 1e9
                row["clocks"] = monitor.window() if monitor else None  # nvidia-smi's samples while this row was timed
                row["grids"] = routed_grids(name, dname, n, m, props.multi_processor_count)
                result["results"].append(row)
                line = f"{name:>18} {dname:>4} N={n:>6}: copy {row['copy_tbps']:.2f}"
                if not args.backward_only:
                    line += (
                        f"  ours {row['ours_tbps']:.2f}  torch {row['torch_tbps']:.2f}"
                        f"  compile {row.get('torch_compile_tbps', float('nan')):.2f}"
                        f"  liger {row.get('liger_tbps', float('nan')):.2f}"
                        f"  bar {row['bar_tbps']:.2f} {'ok' if row['meets_bar'] else 'MISS'}"
                        f"  | GPU time: ours {row['ours_gpu_tbps']:.2f}  torch {row['torch_gpu_tbps']:.2f}"
                        f"  compile {row.get('torch_compile_gpu_tbps', float('nan')):.2f}"
                        f"  liger {row.get('liger_gpu_tbps', float('nan')):.2f}"
                        f"  bar {row['bar_gpu_tbps']:.2f} {'ok' if row['meets_bar_gpu'] else 'MISS'}"
                    )
                if "backward_tbps" in row:
                    line += (
                        f"  bwd {row['backward_tbps']:.2f} / bar {row['backward_bar_tbps']:.2f}"
                        f" {'ok' if row['backward_meets_bar'] else 'MISS'}"
                        f"  (GPU time: bwd {row['backward_gpu_tbps']:.2f}, copy {row['copy_gpu_tbps']:.2f})"
                    )
                for label, v in row.get("variants", {}).items():
                    line += f"\n{'':>30} {label}: {v['tbps']:.2f}, GPU time {v['gpu_tbps']:.2f}"
                if row["clocks"]:
                    line += f"  [SM {row['clocks']['sm_mhz_median']:.0f} MHz, {row['clocks']['power_w_median']:.0f} W]"
                print(line, flush=True)
                del x, aux, copy_dst
                torch.cuda.empty_cache()
                _write(args.out, result, started)  # after every row: a cut-short run keeps what it measured
    if args.config_sweep:
        result["config_experiments"] = _config_sweep(torch, args.reps)
    if monitor:
        monitor.close()
    result["complete"] = True
    _write(args.out, result, started)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
