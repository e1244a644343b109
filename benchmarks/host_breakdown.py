"""Where one user-facing call's host time goes, for benchmarks/host_overhead.py's ``breakdown`` part (issue 31's
forward and forward+backward bars): ``flydsl.torch.functional.softmax`` on 8 x 1024 bf16 taken apart -- the kept
plan's lookup (``_kept``: the checks and the signature), the signature alone, the output's allocation
(``memory.torch_empty_like``, through torch's C API where it is on, and ``torch.empty_like``) and the native replay
with its launch -- next to ``torch.softmax`` and a torch launch
(``x.add_(1)``); and ``torch.autograd.grad`` through Python ``autograd.Function``s that allocate their output and
gradient and launch, in the forward, the backward or both, either noop6 through the native launcher or a torch op
(``zero_``), against the floor that launches nothing and torch.softmax's C++ nodes; and softmax's recording forward
and its backward alone, torch's and ours (the Python Function, the C++ node); and forward + backward cut at five
stamps (``host_timeline.py``). Not a script."""

from __future__ import annotations

import torch
from host_timeline import measure_timeline
from launch_levels import DEVICE, noop6_module
from record import error_text

ROWS, N = 8, 1024


def _forward_pieces() -> dict:
    from flydsl.kernels.memory import torch_empty_like
    from flydsl.kernels.plans import signature
    from flydsl.torch import functional

    x = torch.randn(ROWS, N, device=DEVICE, dtype=torch.bfloat16)
    for _ in range(3):  # the first call plans and records; later ones replay
        functional.softmax(x)
    torch.cuda.synchronize()
    plan = functional._SOFTMAX.get(signature(x, -1))
    if plan is None:
        raise RuntimeError("flydsl.torch.functional.softmax kept no plan for its signature")
    out = torch.empty_like(x)
    kept = functional._SOFTMAX
    return {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "flydsl.torch.functional.softmax": lambda: functional.softmax(x),
        "  its plan lookup (_kept: checks + signature)": lambda: functional._kept(kept, (x,), x, -1),
        "  its signature (plan_key)": lambda: signature(x, -1),
        "  its output (memory.torch_empty_like)": lambda: torch_empty_like(x),
        "  torch.empty_like": lambda: torch.empty_like(x),
        f"  its replay: output and launch ({type(plan).__name__})": lambda: plan(x),  # (the plan makes its output)
        "torch x.add_(1)": lambda: out.add_(1),
    }


def _function(forward_work, backward_work):
    """``apply`` of a Python autograd Function that allocates its output (gradient), then runs ``*_work(out, in)``."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.empty_like(x)
            forward_work(y, x)
            return y

        @staticmethod
        def backward(ctx, grad):
            dx = torch.empty_like(grad)
            backward_work(dx, grad)
            return dx

    return Function.apply


def _autograd_pieces() -> dict:
    launch = noop6_module().launch
    x = torch.randn(ROWS, N, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones_like(x)

    def none(out, inp):
        return None

    def ours(out, inp):
        launch("noop6", 1, 32, out, inp, out, inp, out, inp)

    def theirs(out, inp):
        out.zero_()

    variants = {
        "nothing (the floor)": (none, none),
        "noop6 in the forward": (ours, none),
        "noop6 in the backward": (none, ours),
        "noop6 each way": (ours, ours),
        "torch zero_ in the forward": (theirs, none),
        "torch zero_ in the backward": (none, theirs),
        "torch zero_ each way": (theirs, theirs),
    }
    cases = {"autograd.grad(torch.softmax(x))": lambda: torch.autograd.grad(torch.softmax(x, -1), (x,), ones)}
    for label, (forward_work, backward_work) in variants.items():
        apply = _function(forward_work, backward_work)
        cases[f"autograd.grad(Python Function: {label})"] = lambda apply=apply: torch.autograd.grad(
            apply(x), (x,), ones
        )
    return cases


def _gradient_pieces() -> dict:
    """softmax's forward that records gradients and its backward alone (``autograd.grad`` over a graph kept with
    ``retain_graph``), torch's and ours through the Python Function and (where it builds) the C++ node: which half
    of forward + backward the gap to torch is in."""
    from flydsl.torch import _nodes, ops
    from flydsl.torch import functional as F

    x = torch.randn(ROWS, N, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones_like(x)
    try:
        node = _nodes.build(quiet=True)
    except Exception:  # noqa: BLE001 - no compiler here: the node's rows are left out
        node = None

    def through(path):
        def call(fn):
            if _nodes._module is not path:  # the path switched (once per batch: rebinding is not what is timed)
                _nodes._module = path
                ops.softmax._node_gradients = None
            return fn()

        return call

    cases = {
        "torch.softmax(x), recording": lambda: torch.softmax(x, -1),
        "autograd.grad over torch.softmax's kept graph": _kept_backward(torch.softmax(x, -1), x, ones),
        "autograd.grad(torch.softmax(x)), retain_graph": lambda: torch.autograd.grad(
            torch.softmax(x, -1), (x,), ones, retain_graph=True
        ),
    }
    for name, path in (("Python Function", None), ("C++ node", node)):
        if name == "C++ node" and node is None:
            continue
        via = through(path)
        via(lambda: F.softmax(x))  # the first call with gradients plans
        y = via(lambda: F.softmax(x))
        cases[f"softmax through the {name}, recording"] = lambda via=via: via(lambda: F.softmax(x))
        cases[f"autograd.grad over its kept graph ({name})"] = _kept_backward(y, x, ones)
        cases[f"autograd.grad(softmax) through the {name}"] = lambda via=via: via(
            lambda: torch.autograd.grad(F.softmax(x), (x,), ones)
        )
        cases[f"autograd.grad(softmax) through the {name}, retain_graph"] = lambda via=via: via(
            lambda: torch.autograd.grad(F.softmax(x), (x,), ones, retain_graph=True)
        )
    return cases


def _kept_backward(y, x, dy):
    return lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True)


def measure_breakdown(calls: int, repeats: int, timed) -> list[dict]:
    """One row per piece: ``timed(fn, calls, repeats)`` (a dict with ``host_us``, or ``error``), or why the group
    could not be built."""
    rows = []
    for group, build in (("forward", _forward_pieces), ("autograd", _autograd_pieces), ("gradient", _gradient_pieces)):
        try:
            cases = build()
        except Exception as error:  # noqa: BLE001 - a group that cannot be built is reported, not fatal
            rows.append({"group": group, "piece": "all", "error": error_text(error)})
            continue
        for piece, fn in cases.items():
            rows.append({"group": group, "piece": piece, **timed(fn, calls, repeats)})
    try:
        rows += measure_timeline(calls)
    except Exception as error:  # noqa: BLE001
        rows.append({"group": "timeline", "piece": "all", "error": error_text(error)})
    return rows


def breakdown_table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        value = f"{row['host_us']:8.2f} us" if "host_us" in row else row.get("error", "").splitlines()[0]
        lines.append(f"  {row['group']:<9} {row['piece']:<62} {value}")
    return "\n".join(lines)
