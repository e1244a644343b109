"""Host time of flydsl.torch's own layer per call, measured without a GPU: what a machine with no device can say about
the host-overhead work (benchmarks/host_overhead.py is the GPU measurement, against torch eager).

    python benchmarks/host_layer_cpu.py [--calls 2000] [--repeats 7] [--json benchmarks/results/host_overhead/F.json]

CPU tensors stand in for CUDA ones (the eager checks are told they are plain CUDA tensors, the device checks pass) and
each zoo kernel call is replaced by one launch noted through the native launcher's test hook
(``_runtime._note_launch``): a call's first run is recorded as a launch plan would record it, and a replay does all of
its work but the driver's ``cuLaunchKernel``. What is timed is flydsl.torch's checks, allocation, plans and autograd,
and the replay machinery, per call of ``flydsl.torch.functional``'s softmax, layer_norm, rms_norm and
fused_add_rms_norm (8 x 4096 float32), inference (``fwd``) and through ``torch.autograd.grad`` (``fwd_bwd``), and of the
inference ops (fp8 GEMMs, quantize_fp8, paged_decode, write_kv, topk_route, fused_moe at decode sizes) through
``flydsl.torch.functional`` against ``torch.ops.flydsl`` (the ``inference`` rows: the dispatcher's share); each
case runs in a fresh process with replays on and with ``FLYDSL_LAUNCH_REPLAY=0`` (the Python plans; their zoo calls
cost only the stand-in here, so the difference understates a replay's saving on a GPU). The peer column is torch's
own op on tiny (8 x 16) CPU tensors: its host path with almost no arithmetic, the nearest CPU-side stand-in for torch
eager's host time (neither side pays for a GPU's launch or allocation here). ``fwd_bwd`` rows also give the floor of
any Python ``autograd.Function`` (``python_function_floor_us``: one that only allocates its output and its gradient,
on the same tiny tensors), the part of a fwd+bwd call no Python-side work can remove. The replaying process also
times each call with torch's C API paused (``flydsl.compiler.torch_c_api``: its tensors read and made through their
Python attributes), batches interleaved: ``c_api_ratio`` is on over paused. Medians of ``repeats`` batches
of ``calls``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from record import write_record

OPS = ("softmax", "layer_norm", "rms_norm", "fused_add_rms_norm")
CASES = [f"{op}.{mode}" for op in OPS for mode in ("fwd", "fwd_bwd")]
INFERENCE_OPS = ("fp8_gemm", "blockscale_gemm", "quantize_fp8", "paged_decode", "write_kv", "topk_route", "fused_moe")
ROWS, N = 8, 4096


def stand_in_launches() -> None:
    """CPU tensors taken as plain CUDA ones by flydsl.torch's eager checks, and each zoo kernel call (the norms',
    softmax's and the inference ops') replaced by one launch noted through ``_runtime._note_launch`` over its tensors:
    recorded as a launch plan records it, replayed without ``cuLaunchKernel``."""
    import struct
    import types

    import torch

    from flydsl.compiler._native import launcher
    from flydsl.torch import _mutating, _registry, ops

    inference = {**_registry.registered_ops(), **_mutating.registered_mutating_ops()}
    _registry._plain_keyset = lambda raw: True
    _registry._Op._check_devices = lambda self, tensors: None
    launcher._register_stream_getter(lambda device: 0)

    def launch(*args, **kwargs):
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        pointers = [t.data_ptr() for t in tensors]
        packed = struct.pack(f"<{len(pointers)}Q", *pointers)
        launcher._note_launch("kernel", (1, 1, 1), (128, 1, 1), None, 0, 0, "p" * len(pointers), packed)

    ops.zoo = types.SimpleNamespace(**{n: launch for name in OPS for n in (name, f"{name}_backward")})
    for name in INFERENCE_OPS:  # the inference ops' kernels: one noted launch over their tensors
        inference[name].impl = launch


def _child(calls: int, repeats: int) -> dict:
    """In this process: every case timed (microseconds per call, the median of ``repeats``), and torch's own op on
    tiny CPU tensors (its host path with almost no arithmetic: the closest CPU-side peer)."""
    import torch

    from flydsl.compiler._native import launcher
    from flydsl.torch import functional as F

    stand_in_launches()
    x, r, w, b = torch.randn(ROWS, N), torch.randn(ROWS, N), torch.randn(N), torch.randn(N)
    xg, rg, wg, bg = (t.clone().requires_grad_(True) for t in (x, r, w, b))
    ones = torch.ones_like(x)
    forward = {
        "softmax": lambda x, r, w, b: F.softmax(x),
        "layer_norm": lambda x, r, w, b: F.layer_norm(x, N, w, b, 1e-5),
        "rms_norm": lambda x, r, w, b: F.rms_norm(x, N, w),
        "fused_add_rms_norm": lambda x, r, w, b: F.fused_add_rms_norm(x, r, N, w)[0],
    }
    grads = {"softmax": (xg,), "layer_norm": (xg, wg, bg), "rms_norm": (xg, wg), "fused_add_rms_norm": (xg, rg, wg)}
    stores = {op: getattr(F, f"_{op.upper()}") for op in OPS}  # the functional inference calls' kept plans
    tiny = [torch.randn(8, 16, requires_grad=grad) for grad in (False, True)]
    tiny_w, tiny_b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    nf = torch.nn.functional
    theirs = {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x: nf.layer_norm(x, (16,), tiny_w, tiny_b, 1e-5),
        "rms_norm": lambda x: nf.rms_norm(x, (16,), tiny_w),
        "fused_add_rms_norm": lambda x: nf.rms_norm(x + tiny[0], (16,), tiny_w),
    }
    tiny_grads = {"softmax": (tiny[1],), "layer_norm": (tiny[1], tiny_w, tiny_b), "rms_norm": (tiny[1], tiny_w)}
    tiny_grads["fused_add_rms_norm"] = tiny_grads["rms_norm"]
    tiny_ones = torch.ones(8, 16)

    from launch_levels import AllocatingFunction  # the floor of a Python Function: no work but two allocations

    floor = AllocatingFunction.apply
    floor_us = _timed(lambda: torch.autograd.grad(floor(tiny[1]), (tiny[1],), tiny_ones), calls, repeats)
    results, replays = {}, os.environ.get("FLYDSL_LAUNCH_REPLAY") != "0"
    for case in CASES:
        op, mode = case.split(".")
        f, g = forward[op], theirs[op]
        if mode == "fwd":
            fn = lambda f=f: f(x, r, w, b)  # noqa: E731
            peer = lambda g=g: g(tiny[0])  # noqa: E731
            with torch.no_grad():
                peer_us = _timed(peer, calls, repeats)
        else:
            fn = lambda f=f, op=op: torch.autograd.grad(f(xg, rg, wg, bg), grads[op], ones)  # noqa: E731
            peer = lambda g=g, op=op: torch.autograd.grad(g(tiny[1]), tiny_grads[op], tiny_ones)  # noqa: E731
            peer_us = _timed(peer, calls, repeats)
        kept = stores[op]._plans.values() if mode == "fwd" else ()
        results[case] = {
            "us": _timed(fn, calls, repeats),
            **(_paired_c_api(launcher, fn, calls, repeats) if replays else {}),
            "torch_tiny_us": peer_us,
            "python_function_floor_us": None if mode == "fwd" else floor_us,
            "replayed": bool(kept) and all(isinstance(plan, launcher.LaunchPlan) for plan in kept),
        }
    if replays:
        for name, (functional, op) in _inference_calls(torch, F).items():
            results[f"{name}.inference"] = {
                "functional_us": _timed(functional, calls, repeats),
                "op_us": _timed(op, calls, repeats),
                **_paired_c_api(launcher, functional, calls, repeats),
            }
    return results


def _paired_c_api(launcher, fn, calls: int, repeats: int) -> dict:
    """``fn`` with torch's C API paused (tensors read and made through their Python attributes and torch's Python
    API) against it on, batches interleaved: the paused time per call (median) and the on/paused ratio (the median of
    the per-repeat ratios)."""
    samples = {True: [], False: []}
    for _ in range(repeats):
        for paused in (True, False):
            launcher._pause_torch_c_api(paused)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[paused].append((time.perf_counter() - start) / calls * 1e6)
    launcher._pause_torch_c_api(False)
    ratio = statistics.median(on / off for on, off in zip(samples[False], samples[True], strict=True))
    return {"c_api_paused_us": round(statistics.median(samples[True]), 2), "c_api_ratio": round(ratio, 3)}


def _inference_calls(torch, F) -> dict:
    """{op: (its flydsl.torch.functional call, its torch.ops.flydsl call)} on CPU tensors of decode sizes."""
    e4m3, bf16, i32 = torch.float8_e4m3fn, torch.bfloat16, torch.int32
    a8, w8 = torch.zeros(16, 4096, dtype=e4m3), torch.zeros(4096, 4096, dtype=e4m3)
    row, col, groups, blocks = torch.ones(16, 1), torch.ones(1, 4096), torch.ones(16, 32), torch.ones(32, 32)
    x = torch.zeros(16, 4096, dtype=bf16)
    q, cache = torch.zeros(8, 32, 128, dtype=bf16), torch.zeros(256, 16, 8, 128, dtype=bf16)
    tables, lens = torch.arange(256, dtype=i32).view(8, 32), torch.full((8,), 512, dtype=i32)
    k_new, slots = torch.zeros(8, 8, 128, dtype=bf16), torch.arange(8)
    logits, h = torch.zeros(8, 128), torch.zeros(8, 2048, dtype=bf16)
    w1, w2 = torch.zeros(128, 1536, 2048, dtype=bf16), torch.zeros(128, 2048, 768, dtype=bf16)
    weights, ids = torch.full((8, 8), 0.125), torch.arange(64, dtype=i32).view(8, 8)
    op = torch.ops.flydsl
    return {
        "fp8_gemm": (lambda: F.fp8_gemm(a8, w8.t(), row, col), lambda: op.fp8_gemm(a8, w8.t(), row, col)),
        "blockscale_gemm": (
            lambda: F.blockscale_gemm(a8, w8.t(), groups, blocks),
            lambda: op.blockscale_gemm(a8, w8.t(), groups, blocks),
        ),
        "quantize_fp8": (lambda: F.quantize_fp8(x), lambda: op.quantize_fp8(x)),
        "paged_decode": (
            lambda: F.paged_decode(q, cache, cache, tables, lens),
            lambda: op.paged_decode(q, cache, cache, tables, lens),
        ),
        "write_kv": (
            lambda: F.write_kv(k_new, k_new, cache, cache, slots),
            lambda: op.write_kv(k_new, k_new, cache, cache, slots),
        ),
        "topk_route": (lambda: F.topk_route(logits, 8), lambda: op.topk_route(logits, 8)),
        "fused_moe": (lambda: F.fused_moe(h, w1, w2, weights, ids), lambda: op.fused_moe(h, w1, w2, weights, ids)),
    }


def _timed(fn, calls: int, repeats: int) -> float:
    """Microseconds per call of ``fn``: the median of ``repeats`` batches of ``calls``, after a warm-up."""
    for _ in range(50):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return round(statistics.median(samples), 2)


def _run(replay: bool, calls: int, repeats: int) -> dict:
    env = dict(os.environ, FLYDSL_LAUNCH_REPLAY="1" if replay else "0")
    command = [sys.executable, __file__, "--child", "--calls", str(calls), "--repeats", str(repeats)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"host_layer_cpu: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--commit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.calls, args.repeats)))
        return
    replayed, python = _run(True, args.calls, args.repeats), _run(False, args.calls, args.repeats)
    print(
        f"{'case':<28}{'replays (us)':>14}{'python plans (us)':>20}{'ratio':>8}{'torch tiny (us)':>17}{'vs torch':>10}"
        f"{'Fn floor (us)':>14}{'C API off (us)':>16}{'on/off':>8}"
    )
    rows = []
    for case in CASES:
        ours, theirs, peer = replayed[case]["us"], python[case]["us"], replayed[case]["torch_tiny_us"]
        row = {"case": case, "replays_us": ours, "python_plans_us": theirs, "ratio": round(ours / theirs, 3)}
        row.update(torch_tiny_us=peer, ratio_vs_torch_tiny=round(ours / peer, 3))
        floor = replayed[case]["python_function_floor_us"]
        if floor is not None:
            row.update(python_function_floor_us=floor, floor_ratio_vs_torch_tiny=round(floor / peer, 3))
        if case.endswith(".fwd"):  # whether the timed calls ran a replay (the functional's kept plan a LaunchPlan)
            row["replayed"] = replayed[case]["replayed"]
        row.update(c_api_paused_us=replayed[case]["c_api_paused_us"], c_api_ratio=replayed[case]["c_api_ratio"])
        rows.append(row)
        floor_text = f"{floor:>14.2f}" if floor is not None else f"{'-':>14}"
        print(
            f"{case:<28}{ours:>14.2f}{theirs:>20.2f}{row['ratio']:>8.3f}{peer:>17.2f}{row['ratio_vs_torch_tiny']:>10.3f}"
            f"{floor_text}{row['c_api_paused_us']:>16.2f}{row['c_api_ratio']:>8.3f}"
        )
    print(f"\n{'inference op':<28}{'functional (us)':>17}{'torch.ops (us)':>16}{'ratio':>8}{'C API on/off':>14}")
    inference = []
    for name in INFERENCE_OPS:
        timed = replayed[f"{name}.inference"]
        row = {"case": f"{name}.inference", **timed, "ratio": round(timed["functional_us"] / timed["op_us"], 3)}
        inference.append(row)
        print(
            f"{name:<28}{row['functional_us']:>17.2f}{row['op_us']:>16.2f}{row['ratio']:>8.3f}{row['c_api_ratio']:>14.3f}"
        )
    if args.json:
        summary = {
            "max_inference_functional_us": max(r["functional_us"] for r in inference),
            "geomean_inference_ratio_vs_op": round(statistics.geometric_mean(r["ratio"] for r in inference), 3),
            "max_replays_us": max(r["replays_us"] for r in rows),
            "geomean_ratio": round(statistics.geometric_mean(r["ratio"] for r in rows), 3),
            "max_ratio_vs_torch_tiny": max(r["ratio_vs_torch_tiny"] for r in rows),
            "max_floor_ratio_vs_torch_tiny": max(r.get("floor_ratio_vs_torch_tiny", 0) for r in rows),
            "geomean_c_api_ratio": round(statistics.geometric_mean(r["c_api_ratio"] for r in rows + inference), 3),
        }
        method = (
            "CPU tensors as plain CUDA ones, zoo kernels replaced by launches noted through _runtime._note_launch "
            "(replays skip only cuLaunchKernel); fresh process per setting; median of repeats; c_api_ratio: the "
            "replaying process's calls with torch's C API on over paused (_runtime._pause_torch_c_api), batches "
            "interleaved, median of per-repeat ratios"
        )
        write_record(
            args.json,
            "host_layer_cpu",
            sys.argv[1:] if argv is None else argv,
            rows + inference,
            commit=args.commit,
            method=method,
            summary=summary,
        )


if __name__ == "__main__":
    main()
