"""Host time per call of the ``torch.ops.flydsl.*`` ops at small sizes (launch-bound calls), next to the same
kernels called directly through ``flydsl.kernels`` and to torch's own ops.

    python benchmarks/torch_ops_overhead.py [--json benchmarks/results/torch_ops_overhead/DATE_WHAT.json --commit C]
        [--profile FILE]

Per op and per mode -- ``fwd`` (inference: no input requires grad) and ``fwd_bwd`` (forward, then
``torch.autograd.grad`` of its output) -- three paths: ``op`` (``torch.ops.flydsl.<op>``; fwd_bwd through autograd),
``direct`` (the ``flydsl.kernels`` functions; fwd_bwd calls the forward with statistics, then the backward
function) and ``torch`` (torch's op; fwd_bwd through autograd). Also ``functional`` (``flydsl.torch.functional``,
which takes the ``*_out`` ops in inference), ``bwd_op``/``bwd_direct`` (the backward op or function alone) and, for
the layer norm, ``launch`` (the forward kernel's bare ``.launch`` with prebuilt arguments) and a breakdown of
fwd_bwd: ``fwd_only_op`` (the op's forward on inputs that require grad), ``bwd_only_op``/``bwd_only_torch`` (the
backward alone through autograd, on a retained graph), ``op_one_thread``/``torch_one_thread`` (fwd_bwd with the
autograd engine on the calling thread instead of its CUDA device thread).

Method: ``calls`` back-to-back calls timed on the host clock while a long sleep kernel queued first keeps the GPU
busy (the host never waits for the device), median of ``repeats``; ``gpu_busy_after`` says whether the stream was
still busy at the end of every timed batch (else a call synchronized, or the sleep was too short). ``compiles``
counts kernel specializations loaded during the timed calls (0: no recompilation). ``--profile FILE`` writes a
cProfile of each case (the host path; the autograd engine's backward thread is not profiled) to ``FILE``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

from record import write_record  # this folder's sibling module

ROWS, N = 8, 1024  # the small inference call of the issue: 8 x 1024 bf16
GEMM_MNK = (16, 4096, 4096)
_CLOCK_HZ = 1.98e9  # H200 boost clock: sleep cycles per second


# The modules whose kernels the benchmark's paths launch.
KERNEL_MODULES = (
    "flydsl.kernels.norms.forward",
    "flydsl.kernels.norms.backward",
    "flydsl.kernels.norms.column_sum",
    "flydsl.kernels.softmax.kernels",
    "flydsl.kernels.gemm",
)


def _loaded_count() -> int:
    """Kernel specializations loaded so far (those the benchmark's paths launch)."""
    import importlib

    modules = [importlib.import_module(name) for name in KERNEL_MODULES]
    kernels = [getattr(module, name) for module in modules for name in dir(module)]
    return sum(len(k._loaded) for k in kernels if hasattr(k, "_loaded") and hasattr(k, "_dispatch"))


def _host_us(fn, torch, calls: int, repeats: int) -> tuple[float, bool, list]:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    estimate = time.perf_counter() - start  # a batch with the GPU idle: sizes the sleep below
    cycles = int(min(max(4 * estimate * _CLOCK_HZ, 2e7), 4e9))
    samples, busy = [], True
    stream = torch.cuda.current_stream()
    for _ in range(repeats):
        torch.cuda._sleep(cycles)  # keep the GPU busy: launches queue, the host never waits
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        busy = busy and not stream.query()
        torch.cuda.synchronize()
    return statistics.median(samples), busy, samples


def _cases(torch):
    """{op: {mode: {path: callable}}} at the small sizes."""
    import flydsl.kernels as norms  # the public functions
    import flydsl.torch as ft
    from flydsl.kernels.gemm import gemm as kernel_gemm

    f = torch.nn.functional
    grad = torch.autograd.grad
    dev, bf16 = "cuda", torch.bfloat16

    def new(*shape, requires_grad=False, dtype=bf16):
        return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(requires_grad)

    x, r, dy = new(ROWS, N), new(ROWS, N), new(ROWS, N)
    w, b = new(N), new(N)
    xg, rg, wg, bg = (
        new(ROWS, N, requires_grad=True),
        new(ROWS, N, requires_grad=True),
        new(N, requires_grad=True),
        new(N, requires_grad=True),
    )
    ops = torch.ops.flydsl
    ln = ops.layer_norm(x, [N], w, b, 1e-5)
    rms = ops.rms_norm(x, [N], w, None)
    y_soft = ops.softmax(x)
    ln_graph = ops.layer_norm(xg, [N], wg, bg, 1e-5)  # kept: its backward alone, again and again
    torch_graph = f.layer_norm(xg, (N,), wg, bg, 1e-5)

    def direct_ln_fwd_bwd():
        out, mean, rstd = norms.layer_norm(x, w, b, 1e-5, return_stats=True)
        return norms.layer_norm_backward(dy, x, w, mean, rstd)

    def direct_rms_fwd_bwd():
        out, rstd = norms.rms_norm(x, w, 1e-6, return_stats=True)
        return norms.rms_norm_backward(dy, x, w, rstd)

    def direct_fused_fwd_bwd():
        out, summed, rstd = norms.fused_add_rms_norm(x, r, w, 1e-6, return_stats=True)
        dsum, dw = norms.rms_norm_backward(dy, summed, w, rstd)
        return dsum, dw

    def direct_softmax_fwd_bwd():
        return norms.softmax_backward(dy, norms.softmax(x))

    m, n, k = GEMM_MNK
    a, weight = new(m, k), new(n, k)
    bt = weight.t()  # nn.Linear's weight: b = w.t(), K-major
    ag, weightg = new(m, k, requires_grad=True), new(n, k, requires_grad=True)
    dc = new(m, n)

    def direct_gemm_fwd_bwd():
        kernel_gemm(a, bt)
        return kernel_gemm(dc, weight), kernel_gemm(a.t(), dc)

    cases = {
        "layer_norm": {
            "fwd": {
                "op": lambda: ops.layer_norm(x, [N], w, b, 1e-5),
                "functional": lambda: ft.layer_norm(x, N, w, b, 1e-5),
                "direct": lambda: norms.layer_norm(x, w, b, 1e-5),
                "torch": lambda: f.layer_norm(x, (N,), w, b, 1e-5),
            },
            "fwd_bwd": {
                "op": lambda: grad(ops.layer_norm(xg, [N], wg, bg, 1e-5)[0], (xg, wg, bg), dy),
                "functional": lambda: grad(ft.layer_norm(xg, N, wg, bg, 1e-5), (xg, wg, bg), dy),
                "direct": direct_ln_fwd_bwd,
                "torch": lambda: grad(f.layer_norm(xg, (N,), wg, bg, 1e-5), (xg, wg, bg), dy),
                "bwd_op": lambda: ops.layer_norm_backward(dy, x, [N], w, ln[1], ln[2]),
                "bwd_direct": lambda: norms.layer_norm_backward(dy, x, w, ln[1], ln[2]),
                "fwd_only_op": lambda: ops.layer_norm(xg, [N], wg, bg, 1e-5),
                "bwd_only_op": lambda: grad(ln_graph[0], (xg, wg, bg), dy, retain_graph=True),
                "bwd_only_torch": lambda: grad(torch_graph, (xg, wg, bg), dy, retain_graph=True),
                "op_one_thread": lambda: _one_thread(
                    torch, lambda: grad(ops.layer_norm(xg, [N], wg, bg, 1e-5)[0], (xg, wg, bg), dy)
                ),
                "torch_one_thread": lambda: _one_thread(
                    torch, lambda: grad(f.layer_norm(xg, (N,), wg, bg, 1e-5), (xg, wg, bg), dy)
                ),
            },
        },
        "rms_norm": {
            "fwd": {
                "op": lambda: ops.rms_norm(x, [N], w, None),
                "functional": lambda: ft.rms_norm(x, N, w),
                "direct": lambda: norms.rms_norm(x, w, 1e-6),
                "torch": lambda: f.rms_norm(x, (N,), w),
            },
            "fwd_bwd": {
                "op": lambda: grad(ops.rms_norm(xg, [N], wg, None)[0], (xg, wg), dy),
                "functional": lambda: grad(ft.rms_norm(xg, N, wg), (xg, wg), dy),
                "direct": direct_rms_fwd_bwd,
                "torch": lambda: grad(f.rms_norm(xg, (N,), wg), (xg, wg), dy),
                "bwd_op": lambda: ops.rms_norm_backward(dy, x, [N], w, rms[1]),
                "bwd_direct": lambda: norms.rms_norm_backward(dy, x, w, rms[1]),
            },
        },
        "fused_add_rms_norm": {
            "fwd": {
                "op": lambda: ops.fused_add_rms_norm(x, r, [N], w, None),
                "functional": lambda: ft.fused_add_rms_norm(x, r, N, w),
                "direct": lambda: norms.fused_add_rms_norm(x, r, w, 1e-6),
                "torch": lambda: f.rms_norm(x + r, (N,), w),
            },
            "fwd_bwd": {
                "op": lambda: grad(ops.fused_add_rms_norm(xg, rg, [N], wg, None)[0], (xg, rg, wg), dy),
                "functional": lambda: grad(ft.fused_add_rms_norm(xg, rg, N, wg)[0], (xg, rg, wg), dy),
                "direct": direct_fused_fwd_bwd,
                "torch": lambda: grad(f.rms_norm(xg + rg, (N,), wg), (xg, rg, wg), dy),
            },
        },
        "softmax": {
            "fwd": {
                "op": lambda: ops.softmax(x),
                "functional": lambda: ft.softmax(x),
                "direct": lambda: norms.softmax(x),
                "torch": lambda: torch.softmax(x, -1),
            },
            "fwd_bwd": {
                "op": lambda: grad(ops.softmax(xg), xg, dy),
                "functional": lambda: grad(ft.softmax(xg), xg, dy),
                "direct": direct_softmax_fwd_bwd,
                "torch": lambda: grad(torch.softmax(xg, -1), xg, dy),
                "bwd_op": lambda: ops.softmax_backward(dy, y_soft),
                "bwd_direct": lambda: norms.softmax_backward(dy, y_soft),
            },
        },
        "gemm": {
            "fwd": {
                "op": lambda: ops.gemm(a, bt, None, None),
                "direct": lambda: kernel_gemm(a, bt),
                "torch": lambda: torch.matmul(a, bt),
            },
            "fwd_bwd": {
                "op": lambda: grad(ops.gemm(ag, weightg.t(), None, None), (ag, weightg), dc),
                "direct": direct_gemm_fwd_bwd,
                "torch": lambda: grad(torch.matmul(ag, weightg.t()), (ag, weightg), dc),
            },
        },
    }
    launch = _layer_norm_launch(torch, x, w, b)
    if launch is not None:
        cases["layer_norm"]["fwd"]["launch"] = launch
    return cases


def _one_thread(torch, fn):
    """``fn`` with the autograd engine running the backward on the calling thread (no hand-off to the device
    thread): the difference to the plain case is what the hand-off costs."""
    with torch.autograd.set_multithreading_enabled(False):
        return fn()


def _layer_norm_launch(torch, x, w, b):
    """The layer norm forward kernel's bare launch (prebuilt arguments, the routed register kernel's config): what no
    host path can go below. Built from the kernel modules' internals; None where they changed."""
    try:
        from flydsl.kernels.norms.forward import norm_forward_kernel
        from flydsl.kernels.rows.configs import NormFlags
        from flydsl.kernels.rows.router import RowKernel, RowOp, route

        out = torch.empty_like(x)
        routed = route(RowOp.LAYER_NORM, N, "bf16")
        if routed.kernel is not RowKernel.REGISTER:
            raise ValueError(f"layer_norm N={N} routes to the {routed.kernel.value} kernel, not the register kernel")
        cfg = routed.config
        flags = NormFlags(rms=False, weight=True, bias=True)
        call = norm_forward_kernel(x, x, w, b, out, x, x, x, 1e-5, cfg, flags)
        cluster = (cfg.cluster, 1, 1) if cfg.cluster > 1 else None
        grid, block = cfg.grid(ROWS), cfg.block

        def launch():
            call.launch(grid=grid, block=block, cluster=cluster)

        launch()
        return launch
    except Exception as error:  # noqa: BLE001 - a benchmark of internals: report, do not fail
        print(f"(no bare-launch case: {type(error).__name__}: {error})")
        return None


def _check(torch, cases) -> dict:
    """Largest differences of the forward outputs against torch's (a sanity check of what is timed)."""
    errors = {}
    for op, modes in cases.items():
        fwd = modes["fwd"]
        reference = fwd["torch"]()
        for path in ("op", "functional", "direct"):
            if path not in fwd:
                continue
            try:
                got = fwd[path]()
            except Exception as error:  # noqa: BLE001 - reported with the timings
                errors[f"{op}.{path}"] = f"{type(error).__name__}: {error}"
                continue
            got = got[0] if isinstance(got, (tuple, list)) else got
            errors[f"{op}.{path}"] = float((got.float() - reference.float()).abs().max())
    torch.cuda.synchronize()
    return errors


def _profile(fn, calls: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    return text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--profile", help="a text file that gets a cProfile of each case")
    parser.add_argument("--profile-ops", nargs="*", help="profile only these ops (default: all)")
    args = parser.parse_args(argv)

    import torch

    cases = _cases(torch)
    errors = _check(torch, cases)
    results = {}
    for op, modes in cases.items():
        for mode, paths in modes.items():
            row = results.setdefault(op, {}).setdefault(mode, {})
            for path, fn in paths.items():
                calls = args.calls if mode == "fwd" else max(20, args.calls // 4)
                before = _loaded_count()
                try:
                    us, busy, samples = _host_us(fn, torch, calls, args.repeats)
                except Exception as error:  # noqa: BLE001 - a failing path is reported, the others still run
                    row[path] = {"error": f"{type(error).__name__}: {error}"}
                    continue
                row[path] = {
                    "host_us": round(us, 2),
                    "samples_us": [round(s, 2) for s in samples],
                    "calls": calls,
                    "gpu_busy_after": busy,
                    "compiles": _loaded_count() - before,
                }
                if args.profile and (not args.profile_ops or op in args.profile_ops):
                    with open(args.profile, "a") as out:
                        out.write(f"\n===== {op} {mode} {path}\n{_profile(fn, calls)}")
            summary = ", ".join(
                f"{path} {v['host_us']:.1f}" if "host_us" in v else f"{path} ({v['error']})" for path, v in row.items()
            )
            flags = "" if all(v.get("gpu_busy_after", True) for v in row.values()) else " (GPU went idle in a batch)"
            print(f"{op} {mode}: {summary} us per call{flags}")
    print("max |difference| of the forward outputs against torch:", errors)
    if args.json:
        write_record(
            args.json,
            "torch_ops_overhead",
            argv,
            results,
            commit=args.commit,
            method="host perf_counter over back-to-back calls while a sleep kernel (4x an idle batch) keeps the GPU"
            " busy; median of repeats; fwd_bwd through torch.autograd.grad",
            sizes={"norms": [ROWS, N, "bfloat16"], "gemm_mnk": list(GEMM_MNK)},
            max_abs_difference_vs_torch=errors,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
