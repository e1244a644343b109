"""Where a forward + backward's host time goes beyond its two halves, for benchmarks/host_overhead.py's ``cycle`` part
(issue 31's fwd+bwd bar): per op with gradients (softmax, layer_norm, rms_norm), the user-facing path against torch
eager's, timed call by call interleaved (``host_timing.host_us_rounds``), in these variants:

- ``plain``: ``torch.autograd.grad(f(x), inputs, dy)``, as ``host_overhead``'s ``fwd_bwd``; ``torch_first``: the same
  with torch's path called first in each round (an order effect shows as a difference from ``plain``);
- ``retain``: with ``retain_graph=True`` (no ``release_variables`` on autograd's device thread: the graph goes when
  its output does, on the caller's thread);
- ``fwd_rec``: the forward alone, recording gradients; ``bwd_kept``: ``autograd.grad`` over one kept graph;
- ``gc_off``: ``plain`` with Python's cyclic garbage collector disabled.

``plain`` minus (``fwd_rec`` + ``bwd_kept``) is what the cycle adds: the graph's release, the output's and the node's
destruction, the device thread's hand-offs. Not a script."""

from __future__ import annotations

import gc

import torch
from host_timing import host_us_rounds, paired_ratio

CYCLE_OPS = ("softmax", "layer_norm", "rms_norm")


def _variants(op, graded, first) -> dict:
    """{variant: {"ours": callable, "torch": callable}} of one op (see the module docstring)."""
    wrt, dout = tuple(getattr(graded, g) for g in op.grads), getattr(graded, op.dout)
    ours, theirs = op.user()[1], op.torch

    def cycle(f, retain=False):
        return lambda: torch.autograd.grad(first(f(graded)), wrt, dout, retain_graph=retain)

    def kept(f):
        y = first(f(graded))
        return lambda: torch.autograd.grad(y, wrt, dout, retain_graph=True)

    plain = {"ours": cycle(ours), "torch": cycle(theirs)}
    return {
        "plain": plain,
        "torch_first": {"torch": cycle(theirs), "ours": cycle(ours)},
        "retain": {"ours": cycle(ours, True), "torch": cycle(theirs, True)},
        "fwd_rec": {"ours": lambda: ours(graded), "torch": lambda: theirs(graded)},
        "bwd_kept": {"ours": kept(ours), "torch": kept(theirs)},
        "gc_off": plain,
    }


def measure_cycle(ops, graded, first, rounds: int, repeats: int) -> list[dict]:
    """One row per (op, variant): our and torch's host us per call and the paired ratio. ``ops``: host_overhead's
    ``Op`` entries by name; ``graded``: its inputs requiring grad; ``first``: its ``_first`` (an op's output)."""
    rows = []
    for name in CYCLE_OPS:
        for variant, fns in _variants(ops[name], graded, first).items():
            if variant == "gc_off":
                gc.disable()
            try:
                timed = host_us_rounds(fns, rounds, repeats)
            finally:
                gc.enable()
            row = {"op": name, "variant": variant, "ratio": paired_ratio(timed["ours"], timed["torch"])}
            for who in ("ours", "torch"):
                row[f"{who}_us"] = timed[who].get("host_us")
                if "error" in timed[who]:
                    row[f"{who}_error"] = timed[who]["error"]
            rows.append(row)
    return rows


def cycle_extra(rows: list[dict]) -> dict:
    """Per op, what ``plain`` takes beyond ``fwd_rec`` + ``bwd_kept``, ours and torch's (None where one failed)."""
    found = {(r["op"], r["variant"]): r for r in rows}
    extra = {}
    for name in dict.fromkeys(r["op"] for r in rows):
        parts = [found.get((name, v)) for v in ("plain", "fwd_rec", "bwd_kept")]
        extra[name] = {
            who: (
                round(parts[0][f"{who}_us"] - parts[1][f"{who}_us"] - parts[2][f"{who}_us"], 1)
                if all(p is not None and p.get(f"{who}_us") is not None for p in parts)
                else None
            )
            for who in ("ours", "torch")
        }
    return extra


def cycle_table(rows: list[dict]) -> str:
    lines = [f"{'op':<12} {'variant':<12} {'ours':>8} {'torch':>8} {'ratio':>7}"]
    for r in rows:
        ours, theirs, ratio = r.get("ours_us"), r.get("torch_us"), r.get("ratio")
        cells = [f"{v:>8.1f}" if v is not None else f"{'failed':>8}" for v in (ours, theirs)]
        lines.append(f"{r['op']:<12} {r['variant']:<12} {''.join(cells)} {ratio if ratio is not None else '-':>7}")
    return "\n".join(lines + ["us per call (host), per call interleaved; ratio: ours over torch, paired"])
