"""softmax's forward + backward through ``torch.autograd.grad`` cut at five stamps, for benchmarks/host_overhead.py's
``breakdown`` part (issue 31's fwd+bwd bar): where a call of ours spends the time that torch's does not. Per call:
the recording forward (t1 - t0), the engine until the backward's body starts on autograd's device thread (t2 - t1),
the body (t3 - t2), the engine until ``grad`` returns on the caller's thread (t4 - t3) and the release of the graph
and the gradient (t5 - t4, the caller dropping them). Stamps are ``perf_counter_ns`` (one clock for both threads),
taken while a sleep kernel keeps the GPU busy; medians over the calls. Paths: ours through the Python Function and
the C++ node (whose backward, replayed natively once known, runs no Python to stamp: its engine, body and return are
one segment), and a Python ``autograd.Function`` whose forward and backward are torch's own softmax kernels (the
same Python layers as ours, torch's work): what a Python backward costs by itself. Not a script."""

from __future__ import annotations

import statistics
import time

import torch
from host_timing import CLOCK_HZ
from launch_levels import DEVICE

ROWS, N = 8, 1024
SEGMENTS = ("forward", "to the backward", "backward body", "back to the caller", "release")


def _torch_function(stamps: list):
    class TorchSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.softmax(x, -1)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            stamps.append(time.perf_counter_ns())
            (y,) = ctx.saved_tensors
            dx = torch._softmax_backward_data(dy, y, -1, y.dtype)
            stamps.append(time.perf_counter_ns())
            return dx

    return TorchSoftmax.apply


def _ours(stamps: list, path):
    """flydsl's softmax with its backward op's ``call`` stamped on entry and exit (``path``: the C++ node's module,
    or None for the Python Function)."""
    from flydsl.torch import _nodes, ops
    from flydsl.torch import functional as F

    backward = type(ops.softmax_backward).call

    def stamped(*inputs):
        stamps.append(time.perf_counter_ns())
        result = backward(ops.softmax_backward, *inputs)
        stamps.append(time.perf_counter_ns())
        return result

    def forward(x):
        if _nodes._module is not path:  # the path switched (once per batch: rebinding is not what is timed)
            _nodes._module = path
            ops.softmax._node_gradients = None
        ops.softmax_backward.call = stamped  # the instance's attribute, dropped after the batch
        return F.softmax(x)

    return forward


def _cut(forward, x, ones, stamps: list, calls: int, native: bool = False) -> dict:
    """Median of each segment over ``calls`` forward + backward calls behind a sleep kernel; ``native``: the backward
    runs no Python (the C++ node's native replay), so that its three middle segments are one, "backward, native"."""
    for _ in range(3):  # plans recorded, graphs warm
        torch.autograd.grad(forward(x), (x,), ones)
    torch.cuda.synchronize()
    stamps.clear()
    cuts = []
    torch.cuda._sleep(int(min(max(calls * 400e-6 * CLOCK_HZ, 2e7), 4e9)))  # ~400 us of GPU work per call queued
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        y = forward(x)
        t1 = time.perf_counter_ns()
        (dx,) = torch.autograd.grad(y, (x,), ones)
        t4 = time.perf_counter_ns()
        del y, dx
        t5 = time.perf_counter_ns()
        cuts.append((t0, t1, t4, t5))
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    if native and not stamps:
        parts = {name: [] for name in ("forward", "backward, native", "release")}
        for t0, t1, t4, t5 in cuts:
            for name, (a, b) in zip(parts, ((t0, t1), (t1, t4), (t4, t5)), strict=True):
                parts[name].append((b - a) / 1e3)
    elif len(stamps) != 2 * calls:
        raise RuntimeError(f"expected {2 * calls} backward stamps, got {len(stamps)}: the backward did not run")
    else:
        parts = {name: [] for name in SEGMENTS}
        for i, (t0, t1, t4, t5) in enumerate(cuts):
            t2, t3 = stamps[2 * i], stamps[2 * i + 1]
            for name, (a, b) in zip(SEGMENTS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)), strict=True):
                parts[name].append((b - a) / 1e3)
    row = {name: round(statistics.median(values), 2) for name, values in parts.items()}
    row["whole"] = round(statistics.median((t5 - t0) / 1e3 for t0, _, _, t5 in cuts), 2)
    row["gpu_busy_after"] = busy
    return row


def measure_timeline(calls: int) -> list[dict]:
    """One row per (path, segment) in host_breakdown's row format (group ``timeline``), or the path's error."""
    from flydsl.torch import _nodes, ops

    x = torch.randn(ROWS, N, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones_like(x)
    stamps: list = []
    try:
        node = _nodes.build(quiet=True)
    except Exception:  # noqa: BLE001 - no compiler here: the node's path is left out
        node = None
    paths = {
        "torch's kernels in a Python Function": _torch_function(stamps),
        "ours, Python Function": _ours(stamps, None),
    }
    if node is not None:
        paths["ours, C++ node"] = _ours(stamps, node)
    rows = []
    for label, forward in paths.items():
        try:
            row = _cut(forward, x, ones, stamps, calls, native=label == "ours, C++ node")
        except Exception as error:  # noqa: BLE001 - a path that fails is reported, the others run
            rows.append({"group": "timeline", "piece": label, "error": f"{type(error).__name__}: {error}"})
            continue
        finally:
            ops.softmax_backward.__dict__.pop("call", None)
        busy = row.pop("gpu_busy_after")
        for segment, value in row.items():
            rows.append({"group": "timeline", "piece": f"{label}: {segment}", "host_us": value, "gpu_busy_after": busy})
    return rows
