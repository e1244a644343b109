"""Host time per call of the zoo's ops against torch eager's, the launch levels beneath them, and the cold start: the
one host-overhead benchmark.

    python benchmarks/host_overhead.py [--json benchmarks/results/host_overhead/DATE_WHAT.json --commit C]
        [--parts ops levels breakdown cold] [--calls 200] [--repeats 7] [--cold-runs 3] [--profile FILE]
        [--cold-profile DIR] [--halves]

``ops``: each op of ``OPS`` (one line per op) at small, launch-bound sizes (8 x 1024 bf16 rows; gemm, fp8_gemm and
blockscale_gemm 16x4096x4096 with an nn.Linear weight's ``w.t()``; paged_decode and write_kv at a decode step of 8
sequences of 512 tokens, Llama-3-8B's heads; topk_route and fused_moe at 8 tokens of Qwen3-30B-A3B's experts), per mode
-- ``fwd`` (no input requires grad) and ``fwd_bwd`` (the forward, then ``torch.autograd.grad`` of its output) -- through
four paths: ``functional`` (``flydsl.torch.functional``, what a user swaps in: the user-facing path; an op without
one would take ``torch.ops.flydsl``'s), ``op`` (``torch.ops.flydsl.*``), ``direct`` (``flydsl.kernels``; fwd_bwd: the
forward with statistics, then the backward function) and ``torch`` (torch eager). The summary's ratio is
the user-facing path's time over torch's. A new op is one ``Op(...)`` entry of ``OPS`` (its paths as callables of the
prepared inputs; new inputs go in ``inputs()``).

``levels``: the launches beneath the ops: a trivial kernel with six pointers written in MLIR through the native
launcher (``LoadedModule.launch``), the same kernel as ``@flyc.kernel`` launched with six torch tensors (argument
checks, specialization lookup, current stream, native dispatch), torch's ``x.add_(1)``, a Triton kernel and
cuda-bindings' ``cuLaunchKernel`` (a peer that does not import is skipped, with the reason recorded); and the floor
of fwd_bwd: ``torch.autograd.grad`` through torch.softmax and through a Python ``autograd.Function`` that launches
nothing (what any Python Function costs on this machine, against which ``fwd_bwd``'s functional rows compare).

``breakdown`` (``host_breakdown.py``): one call taken apart: ``flydsl.torch.functional.softmax``'s plan lookup,
signature, output allocation and native replay next to ``torch.softmax``, and ``autograd.grad`` through Python
Functions launching noop6 or a torch op in the forward, the backward or both, against their floor.

``cycle`` (``host_cycle.py``): softmax's, layer_norm's and rms_norm's forward + backward against its halves (the
recording forward, the backward over a kept graph), with ``retain_graph``, with the GC off and in the other order, ours
against torch's, call by call: what the cycle adds beyond its halves.

``cold`` (``cold_start.py``): in fresh subprocesses (the disk cache warmed by a first one), ``import flydsl.torch`` and
the first call of each op's user-facing path, after a torch op has created the CUDA context (its time is recorded
apart); medians; ``import_loads_compiler`` says whether the import loaded ``flydsl.compiler`` (it should not: the
adapter is lazy), ``first_calls_load_mlir`` whether the first calls loaded MLIR (they should not: the disk cache holds
their kernels).

Method: ``calls`` back-to-back calls timed on the host clock while a sleep kernel queued first keeps the GPU busy
(the host never waits for the device), median of ``repeats``; an op's paths are interleaved (each repeat times every
path in turn) and its ratio against torch is the median of the per-repeat ratios, so that the host's drift between
repeats cancels. Since 2026-12-07 the ops' paths are interleaved call by call instead, each call timed alone and a
repeat's sample the median of its calls (``host_timing.host_us_rounds``): ``fwd_bwd`` goes through autograd's device
thread, whose wake-ups swung a batch by +-20 us, and a forward's 7-10 us calls moved 5-15% between batches; a call
delayed by a wake-up, the GC or the allocator falls out of the median (levels and breakdown keep batches);
``gpu_busy_after`` says whether the
stream was still busy at the end of every timed batch (else a call synchronized, or the sleep was too short);
``compiles`` counts the kernel specializations loaded during the timed calls (0: no recompilation). Every path that
fails is reported in the table and the record; the others still run. ``--profile FILE`` appends a cProfile of each
op path to FILE. Compile times are benchmarks/compile_times.py's.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import cold_start
import torch
from host_breakdown import breakdown_table, measure_breakdown  # this folder's sibling modules
from host_cycle import cycle_extra, cycle_table, measure_cycle
from host_report import MODES, PATHS, summarize, table
from host_timing import host_us_interleaved, host_us_rounds, paired_ratio  # noqa: F401 (paired_ratio: tests)
from launch_levels import level_table, measure_levels
from moe_torch import grouped_mm_moe
from record import error_text, write_record

ROWS, N = 8, 1024  # the small inference call: 8 x 1024 bf16
GEMM_MNK = (16, 4096, 4096)
DEVICE = "cuda"
PARTS = ("ops", "levels", "breakdown", "cold", "cycle")
F = torch.nn.functional

# flydsl's modules, bound by _import_adapter() / _import_flydsl(): the cold start times the adapter's import, so this
# module imports nothing of flydsl at its top.
ft = K = kernel_gemm = kernel_fp8_gemm = kernel_blockscale_gemm = attention = moe = flyc = None


def _import_adapter() -> None:
    """``import flydsl.torch`` (registers ``torch.ops.flydsl.*``; the compiler is imported on first use)."""
    global ft
    import flydsl.torch.functional as ft


def _import_flydsl() -> None:
    """The adapter, ``flydsl.kernels`` (the direct paths) and the compiler (the levels)."""
    global K, kernel_gemm, kernel_fp8_gemm, kernel_blockscale_gemm, attention, moe, flyc
    _import_adapter()
    import flydsl.compiler as flyc
    import flydsl.kernels as K
    import flydsl.kernels.attention as attention
    import flydsl.kernels.moe as moe
    from flydsl.kernels.gemm import blockscale_gemm as kernel_blockscale_gemm
    from flydsl.kernels.gemm import fp8_gemm as kernel_fp8_gemm
    from flydsl.kernels.gemm import gemm as kernel_gemm


@dataclass(frozen=True)
class Op:
    """One op's paths, each a callable of the prepared inputs ``t`` (:func:`inputs`). ``functional`` None: the op form
    is the user-facing one. ``direct_fwd_bwd``: the ``flydsl.kernels`` forward and backward (it has no autograd).
    ``grads``: the inputs differentiated in fwd_bwd; ``dout``: the output's gradient among the inputs."""

    name: str
    op: Callable
    direct: Callable
    torch: Callable
    functional: Callable | None = None
    direct_fwd_bwd: Callable | None = None
    grads: tuple[str, ...] = ("x",)
    dout: str = "dy"
    modes: tuple[str, ...] = MODES

    def user(self) -> tuple[str, Callable]:
        """The name of the path a user calls, and the path."""
        return ("functional", self.functional) if self.functional is not None else ("op", self.op)


def _ln_fwd_bwd(t):
    _, mean, rstd = K.layer_norm(t.x, t.w, t.b, 1e-5, return_stats=True)
    return K.layer_norm_backward(t.dy, t.x, t.w, mean, rstd)


def _fused_fwd_bwd(t):
    _, summed, rstd = K.fused_add_rms_norm(t.x, t.r, t.w, 1e-6, return_stats=True)
    return K.rms_norm_backward(t.dy, summed, t.w, rstd)


def _gemm_fwd_bwd(t):
    kernel_gemm(t.a, t.weight.t())
    return kernel_gemm(t.dc, t.weight), kernel_gemm(t.a.t(), t.dc)


OPS = (
    Op(
        "softmax",
        functional=lambda t: ft.softmax(t.x),
        op=lambda t: torch.ops.flydsl.softmax(t.x),
        direct=lambda t: K.softmax(t.x),
        direct_fwd_bwd=lambda t: K.softmax_backward(t.dy, K.softmax(t.x)),
        torch=lambda t: torch.softmax(t.x, -1),
    ),
    Op(
        "layer_norm",
        functional=lambda t: ft.layer_norm(t.x, N, t.w, t.b, 1e-5),
        op=lambda t: torch.ops.flydsl.layer_norm(t.x, [N], t.w, t.b, 1e-5),
        direct=lambda t: K.layer_norm(t.x, t.w, t.b, 1e-5),
        direct_fwd_bwd=_ln_fwd_bwd,
        torch=lambda t: F.layer_norm(t.x, (N,), t.w, t.b, 1e-5),
        grads=("x", "w", "b"),
    ),
    Op(
        "rms_norm",
        functional=lambda t: ft.rms_norm(t.x, N, t.w),
        op=lambda t: torch.ops.flydsl.rms_norm(t.x, [N], t.w, None),
        direct=lambda t: K.rms_norm(t.x, t.w, 1e-6),
        direct_fwd_bwd=lambda t: K.rms_norm_backward(t.dy, t.x, t.w, K.rms_norm(t.x, t.w, return_stats=True)[1]),
        torch=lambda t: F.rms_norm(t.x, (N,), t.w),
        grads=("x", "w"),
    ),
    Op(
        "fused_add_rms_norm",
        functional=lambda t: ft.fused_add_rms_norm(t.x, t.r, N, t.w),
        op=lambda t: torch.ops.flydsl.fused_add_rms_norm(t.x, t.r, [N], t.w, None),
        direct=lambda t: K.fused_add_rms_norm(t.x, t.r, t.w, 1e-6),
        direct_fwd_bwd=_fused_fwd_bwd,
        torch=lambda t: F.rms_norm(t.x + t.r, (N,), t.w),
        grads=("x", "r", "w"),
    ),
    Op(
        "gemm",  # the user-facing form: flydsl.torch.functional.linear, against torch's F.linear
        functional=lambda t: ft.linear(t.a, t.weight),
        op=lambda t: torch.ops.flydsl.gemm(t.a, t.weight.t(), None, None),
        direct=lambda t: kernel_gemm(t.a, t.weight.t()),
        direct_fwd_bwd=_gemm_fwd_bwd,
        torch=lambda t: F.linear(t.a, t.weight),
        grads=("a", "weight"),
        dout="dc",
    ),
    Op(
        "fp8_gemm",  # inference: no gradients; the peer is cuBLAS's rowwise-scaled fp8 GEMM
        functional=lambda t: ft.fp8_gemm(t.a8, t.w8.t(), t.scale_a, t.scale_w),
        op=lambda t: torch.ops.flydsl.fp8_gemm(t.a8, t.w8.t(), t.scale_a, t.scale_w),
        direct=lambda t: kernel_fp8_gemm(t.a8, t.w8.t(), t.scale_a, t.scale_w),
        torch=lambda t: torch._scaled_mm(
            t.a8, t.w8.t(), scale_a=t.scale_a, scale_b=t.scale_w, out_dtype=torch.bfloat16
        ),
        modes=("fwd",),
    ),
    Op(
        "blockscale_gemm",  # inference; the peer is cuBLAS's blockwise-scaled (1 x 128 / 128 x 128) fp8 GEMM
        functional=lambda t: ft.blockscale_gemm(t.a8, t.w8.t(), t.group_scale_a, t.block_scale_w),
        op=lambda t: torch.ops.flydsl.blockscale_gemm(
            t.a8, t.w8.t(), t.group_scale_a, t.block_scale_w, None, None, None
        ),
        direct=lambda t: kernel_blockscale_gemm(t.a8, t.w8.t(), t.group_scale_a, t.block_scale_w),
        torch=lambda t: torch._scaled_mm(
            t.a8, t.w8.t(), scale_a=t.group_scale_a, scale_b=t.block_scale_w.t(), out_dtype=torch.bfloat16
        ),
        modes=("fwd",),
    ),
    Op(
        "paged_decode",  # inference; the peer is SDPA on the same keys and values held contiguous
        functional=lambda t: ft.paged_decode(t.q, t.k_cache, t.v_cache, t.block_tables, t.context_lens),
        op=lambda t: torch.ops.flydsl.paged_decode(t.q, t.k_cache, t.v_cache, t.block_tables, t.context_lens),
        direct=lambda t: attention.paged_decode(t.q, t.k_cache, t.v_cache, t.block_tables, t.context_lens),
        torch=lambda t: F.scaled_dot_product_attention(t.q[:, :, None], t.keys, t.values, enable_gqa=True),
        modes=("fwd",),
    ),
    Op(
        "write_kv",  # a decode step's new keys and values into the paged cache; the peer is torch's index_copy_
        functional=lambda t: ft.write_kv(t.k_new, t.v_new, t.k_cache, t.v_cache, t.slots),
        op=lambda t: torch.ops.flydsl.write_kv(t.k_new, t.v_new, t.k_cache, t.v_cache, t.slots),
        direct=lambda t: attention.write_kv(t.k_new, t.v_new, t.k_cache, t.v_cache, t.slots),
        torch=lambda t: (
            t.k_cache.view(-1, *t.k_new.shape[1:]).index_copy_(0, t.slots, t.k_new),
            t.v_cache.view(-1, *t.v_new.shape[1:]).index_copy_(0, t.slots, t.v_new),
        ),
        modes=("fwd",),
    ),
    Op(
        "topk_route",  # a decode step's routing (softmax, top 8 of 128, renormalized); the peer is torch's
        functional=lambda t: ft.topk_route(t.router_logits, MOE_TOP_K),
        op=lambda t: torch.ops.flydsl.topk_route(t.router_logits, MOE_TOP_K),
        direct=lambda t: moe.topk_route(t.router_logits, MOE_TOP_K),
        torch=lambda t: _torch_route(t.router_logits),
        modes=("fwd",),
    ),
    Op(
        "fused_moe",  # a decode step's experts; the peer is torch's _grouped_mm pipeline on the same routing
        functional=lambda t: ft.fused_moe(t.moe_x, t.moe_w1, t.moe_w2, t.moe_weights, t.moe_ids),
        op=lambda t: torch.ops.flydsl.fused_moe(t.moe_x, t.moe_w1, t.moe_w2, t.moe_weights, t.moe_ids),
        direct=lambda t: moe.fused_moe(t.moe_x, t.moe_w1, t.moe_w2, t.moe_weights, t.moe_ids),
        torch=lambda t: grouped_mm_moe(t.moe_x, t.moe_w1, t.moe_w2, t.moe_weights, t.moe_ids, drops=False),
        modes=("fwd",),
    ),
)

# MoE at a decode step's size: Qwen3-30B-A3B's experts (E 128, top 8, H 2048, I 768), 8 tokens
MOE_TOKENS, MOE_EXPERTS, MOE_TOP_K, MOE_HIDDEN, MOE_INTER = 8, 128, 8, 2048, 768


def _torch_route(logits):
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), MOE_TOP_K, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids.to(torch.int32)


def _moe_inputs() -> dict:
    """Router logits, x, the experts' weights and one routing (MOE_TOKENS tokens)."""
    logits = torch.randn(MOE_TOKENS, MOE_EXPERTS, device=DEVICE)
    weights, ids = _torch_route(logits)
    scale = MOE_HIDDEN**-0.5
    return {
        "router_logits": logits,
        "moe_x": torch.randn(MOE_TOKENS, MOE_HIDDEN, device=DEVICE, dtype=torch.bfloat16),
        "moe_w1": torch.randn(MOE_EXPERTS, 2 * MOE_INTER, MOE_HIDDEN, device=DEVICE, dtype=torch.bfloat16) * scale,
        "moe_w2": torch.randn(MOE_EXPERTS, MOE_HIDDEN, MOE_INTER, device=DEVICE, dtype=torch.bfloat16) * scale,
        "moe_weights": weights,
        "moe_ids": ids,
    }


# paged decode at a decode step's size: B sequences of CONTEXT tokens in blocks of 16, Llama-3-8B's heads
DECODE_B, DECODE_HQ, DECODE_HKV, DECODE_D, CONTEXT = 8, 32, 8, 128, 512


def _decode_inputs() -> dict:
    """``q`` (B, Hq, D), the paged caches and tables (every sequence CONTEXT tokens), the same keys/values contiguous
    for SDPA (``keys``, ``values``: (B, Hkv, CONTEXT, D)), and one new token per sequence for write_kv."""
    blocks_per = CONTEXT // 16
    shape = (DECODE_B * blocks_per, 16, DECODE_HKV, DECODE_D)
    k_cache = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
    tables = torch.arange(DECODE_B * blocks_per, device=DEVICE, dtype=torch.int32).view(DECODE_B, blocks_per)

    def contiguous(cache):
        return cache.view(DECODE_B, CONTEXT, DECODE_HKV, DECODE_D).transpose(1, 2).contiguous()

    new = torch.randn(DECODE_B, DECODE_HKV, DECODE_D, device=DEVICE, dtype=torch.bfloat16)
    return {
        "q": torch.randn(DECODE_B, DECODE_HQ, DECODE_D, device=DEVICE, dtype=torch.bfloat16),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": tables,
        "context_lens": torch.full((DECODE_B,), CONTEXT, device=DEVICE, dtype=torch.int32),
        "keys": contiguous(k_cache),
        "values": contiguous(v_cache),
        "k_new": new,
        "v_new": new.clone(),
        "slots": torch.arange(DECODE_B, device=DEVICE, dtype=torch.int64) * CONTEXT + CONTEXT - 1,
    }


def inputs(requires_grad: bool) -> SimpleNamespace:
    """The prepared inputs: rows ``x``, ``r`` (ROWS x N), ``w``, ``b`` (N), gemm operands ``a`` (M x K) and ``weight``
    (N x K, nn.Linear's); the output gradients ``dy``, ``dc`` never require grad."""
    m, n, k = GEMM_MNK

    def new(*shape, grad=requires_grad):
        return torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16).requires_grad_(grad)

    rows, gemm = {"x": new(ROWS, N), "r": new(ROWS, N), "w": new(N), "b": new(N)}, {"a": new(m, k), "weight": new(n, k)}
    e4m3 = torch.float8_e4m3fn
    fp8 = {"a8": new(m, k, grad=False).to(e4m3), "w8": new(n, k, grad=False).to(e4m3)}
    fp8.update(scale_a=torch.ones(m, 1, device=DEVICE), scale_w=torch.ones(1, n, device=DEVICE))
    # block-scaled: per 1 x 128 group of a (M-major, as cuBLAS takes them) and 128 x 128 block of w
    fp8.update(
        group_scale_a=torch.ones(k // 128, m, device=DEVICE).t(),
        block_scale_w=torch.ones(n // 128, k // 128, device=DEVICE),
    )
    return SimpleNamespace(
        **rows,
        **gemm,
        **fp8,
        **_decode_inputs(),
        **_moe_inputs(),
        dy=new(ROWS, N, grad=False),
        dc=new(m, n, grad=False),
    )


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def op_cases(op: Op, plain, graded, halves: bool = False) -> dict:
    """{mode: {path: callable of no arguments}} for ``op``; fwd_bwd differentiates through autograd, but for
    ``direct``. A path the op lacks is left out. ``halves``: fwd_bwd's two halves too, ``fwd_rec`` (the forward
    recording gradients) and ``bwd_kept`` (``torch.autograd.grad`` over one graph kept with ``retain_graph``)."""
    cases = {}
    if "fwd" in op.modes:
        paths = {path: getattr(op, path) for path in PATHS}
        cases["fwd"] = {path: (lambda f=f: f(plain)) for path, f in paths.items() if f is not None}
    if "fwd_bwd" in op.modes:
        wrt, dout = tuple(getattr(graded, name) for name in op.grads), getattr(graded, op.dout)

        def through_autograd(f):
            return lambda: torch.autograd.grad(_first(f(graded)), wrt, dout)

        paths = {path: getattr(op, path) for path in ("functional", "op", "torch")}
        cases["fwd_bwd"] = {path: through_autograd(f) for path, f in paths.items() if f is not None}
        if op.direct_fwd_bwd is not None:
            cases["fwd_bwd"]["direct"] = lambda: op.direct_fwd_bwd(plain)
        cases["fwd_bwd"] = {path: cases["fwd_bwd"][path] for path in PATHS if path in cases["fwd_bwd"]}
        if halves:  # which half of fwd_bwd a gap is in: the recording forward, the backward over a kept graph
            cases["fwd_rec"] = {path: (lambda f=f: f(graded)) for path, f in paths.items() if f is not None}
            kept = {path: _first(f(graded)) for path, f in paths.items() if f is not None}
            cases["bwd_kept"] = {
                path: (lambda y=y: torch.autograd.grad(y, wrt, dout, retain_graph=True)) for path, y in kept.items()
            }
    return cases


# --- timing ----------------------------------------------------------------------------------------------------------


def _loaded_count() -> int:
    """Kernel specializations loaded so far by flydsl.kernels' kernels (0 where flydsl is not imported)."""
    if flyc is None:
        return 0
    kernels = {
        id(obj): obj
        for name, module in list(sys.modules.items())
        if name.startswith("flydsl.kernels") and module is not None
        for obj in vars(module).values()
        if isinstance(obj, flyc.KernelFunction)
    }
    return sum(len(k._loaded) for k in kernels.values())


def _timed(fn, calls: int, repeats: int) -> dict:
    """``fn`` timed by :func:`host_timing.host_us_interleaved` alone, kernels loaded meanwhile counted."""
    return host_us_interleaved({"": fn}, calls, repeats, _loaded_count)[""]


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


def _max_difference(got, reference) -> float | None:
    """The largest difference of two outputs of one op, compared element by element where their shapes differ only
    by unit dims (SDPA's (B, Hq, 1, D) against paged_decode's (B, Hq, D)); None for an op that writes in place
    (write_kv: its output is the cache it was given)."""
    got, reference = _first(got), _first(reference)
    if got is None:
        return None
    if got.shape != reference.shape and got.numel() == reference.numel():
        got, reference = got.reshape(-1), reference.reshape(-1)
    return float((got.float() - reference.float()).abs().max())


def measure_ops(ops, calls: int, repeats: int, profile: str | None = None, halves: bool = False) -> list[dict]:
    """One row per (op, mode, path): its timing (or its error) and, in fwd, the largest difference of its output
    against torch's (a sanity check of what is timed)."""
    rows = []
    try:
        plain, graded = inputs(False), inputs(True)
    except Exception as error:  # noqa: BLE001
        failed = error_text(error)
        return [{"op": op.name, "mode": mode, "path": "all", "error": failed} for op in ops for mode in op.modes]
    for op in ops:
        try:
            cases = op_cases(op, plain, graded, halves)
        except Exception as error:  # noqa: BLE001
            rows += [{"op": op.name, "mode": mode, "path": "all", "error": error_text(error)} for mode in op.modes]
            continue
        for mode, paths in cases.items():
            n = max(20, calls // 4)  # rounds per repeat: each queues a launch or more per path behind the sleep
            reference = None
            timed = host_us_rounds(paths, n, repeats, _loaded_count)
            for path, fn in paths.items():
                row = {"op": op.name, "mode": mode, "path": path, **timed[path]}
                if mode == "fwd" and "error" not in row:
                    try:
                        reference = reference if reference is not None else paths["torch"]()
                        difference = _max_difference(fn(), reference)
                        if difference is not None:
                            row["max_abs_difference_vs_torch"] = difference
                    except Exception as error:  # noqa: BLE001
                        row["check_error"] = error_text(error)
                if profile and "error" not in row:
                    with open(profile, "a") as out:
                        out.write(f"\n===== {op.name} {mode} {path}\n{_profile(fn, n)}")
                rows.append(row)
            _print_progress(rows[-len(paths) :])
    return rows


def _print_progress(rows) -> None:
    parts = [f"{r['path']} {r['host_us']:.1f}" if "host_us" in r else f"{r['path']} (failed)" for r in rows]
    print(f"{rows[0]['op']} {rows[0]['mode']}: {', '.join(parts)} us per call", flush=True)


# --- how gradients are recorded -------------------------------------------------------------------------------------


def _autograd_path() -> str:
    """How flydsl.torch's eager calls record gradients here: the C++ node, or the Python Function (and why)."""
    import warnings

    try:
        from flydsl.torch import _nodes
    except ImportError:  # flydsl-kernels alone (tox's kernels env)
        return "none (flydsl.torch is not installed)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        node = _nodes.module()
    if node is not None:
        return "C++ node (flydsl.torch._nodes)"
    return "Python autograd.Function" + "".join(f" ({warning.message})" for warning in caught)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure (default all)")
    parser.add_argument(
        "--calls", type=int, default=200, help="calls per batch (levels, breakdown); ops: a quarter as many rounds"
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per path (the median is reported)")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes per op for the cold start")
    parser.add_argument("--json", help="write the record here (benchmarks/results/host_overhead/)")
    parser.add_argument("--commit", default="unknown", help="the commit measured (the GPU machine has no git)")
    parser.add_argument("--profile", help="a text file that gets a cProfile of each op path")
    parser.add_argument("--halves", action="store_true", help="ops: fwd_bwd's halves too (fwd_rec, bwd_kept)")
    parser.add_argument(
        "--cold-profile", metavar="DIR", help="also profile one more fresh first call per op: DIR/cold_<op>.txt"
    )
    parser.add_argument("--cold-child", help=argparse.SUPPRESS)  # comma-separated ops: one fresh cold-start process
    args = parser.parse_args(argv)

    if args.cold_child:
        ops = {op.name: op for op in OPS}
        print(
            json.dumps(
                cold_start.first_calls(
                    args.cold_child.split(","), ops, lambda: inputs(False), _import_adapter, args.cold_profile
                )
            )
        )
        return 0
    if not torch.cuda.is_available():
        print("host_overhead: needs a CUDA GPU", file=sys.stderr)
        return 1
    started = time.perf_counter()
    _import_flydsl()
    autograd = _autograd_path()  # built (once per torch) before anything is timed
    print(f"fwd_bwd's gradients: {autograd}")
    rows = measure_ops(OPS, args.calls, args.repeats, args.profile, args.halves) if "ops" in args.parts else []
    levels = measure_levels(max(50, args.calls), args.repeats, _timed) if "levels" in args.parts else []
    breakdown = measure_breakdown(max(50, args.calls), args.repeats, _timed) if "breakdown" in args.parts else []
    cycle = (
        measure_cycle({op.name: op for op in OPS}, inputs(True), _first, max(20, args.calls // 4), args.repeats)
        if "cycle" in args.parts
        else []
    )
    if "cold" in args.parts:
        cold = cold_start.measure(
            [op.name for op in OPS], args.cold_runs, lambda names: cold_start.run_child(__file__, names)
        )
        if args.cold_profile:  # after the timed runs, so that the profiler's overhead stays out of them
            os.makedirs(args.cold_profile, exist_ok=True)
            for op in OPS:
                cold_start.run_child(__file__, [op.name], args.cold_profile)
    else:
        cold = None
    summary = {**summarize(OPS, rows, cold), "autograd": autograd}
    if cycle:
        summary["cycle_extra_us"] = cycle_extra(cycle)
    if rows:
        print("\n" + table(OPS, rows, summary))
    if levels:
        print("\n" + level_table(levels))
    if breakdown:
        print("\none call taken apart (host time per call):\n" + breakdown_table(breakdown))
    if cycle:
        print("\nforward + backward against its halves:\n" + cycle_table(cycle))
    if cold is not None:
        print(f"\ncold start (median of {args.cold_runs} fresh processes), ms:", json.dumps(summary["cold_start_ms"]))
        for name, error in cold["errors"].items():
            print(f"  cold start {name}: {error}")
    if cycle:
        print(f"\ncycle beyond its halves, us (ours, torch): {json.dumps(summary['cycle_extra_us'])}")
    print(f"\nmax ratio vs torch {summary['max_ratio_vs_torch']} (missing: {summary['missing'] or 'none'})")
    if args.json:
        write_record(
            args.json,
            "host_overhead",
            argv,
            {"ops": rows, "levels": levels, "breakdown": breakdown, "cycle": cycle, "cold_start": cold},
            commit=args.commit,
            method="host perf_counter over back-to-back calls while a sleep kernel (4x an idle batch) keeps the GPU"
            " busy; median of repeats, an op's paths interleaved, ratios the median of per-repeat ratios; fwd_bwd"
            " through torch.autograd.grad; cold start: fresh processes after one"
            " that fills the disk cache, medians",
            summary=summary,
            sizes={"rows": [ROWS, N, "bfloat16"], "gemm_mnk": list(GEMM_MNK)},
            wall_s=round(time.perf_counter() - started, 1),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
