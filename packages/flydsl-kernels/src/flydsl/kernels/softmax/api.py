"""Softmax over the rows of 2-D tensors, forward and backward, with the norms' contract (:mod:`flydsl.kernels.norms`):
``(rows, N)`` tensors with unit stride on the last dim and any row stride, float32, float16 or bfloat16, computed in
float32; outputs allocated through the input's framework when not given; arguments validated before any launch (the
first call of each signature; later ones run its plan: :mod:`flydsl.kernels.plans`)."""

from __future__ import annotations

import functools
from typing import NamedTuple

from flydsl.kernels import validation as check
from flydsl.kernels.memory import torch_empty_like
from flydsl.kernels.norms.api import output
from flydsl.kernels.plans import Plans, signature
from flydsl.kernels.validation import TensorInfo

__all__ = ["SoftmaxTensors", "softmax", "softmax_backward"]


class SoftmaxTensors(NamedTuple):
    """Softmax's validated tensors (TensorInfo): forward ``x`` -> ``out``; backward ``dy``, ``y`` -> ``dx`` (``x``:
    y, ``dy`` its gradient, ``out``: dx)."""

    x: TensorInfo
    out: TensorInfo
    dy: TensorInfo | None = None


_SOFTMAX = Plans("flydsl.kernels.softmax", replay=True)
_SOFTMAX_BACKWARD = Plans("flydsl.kernels.softmax_backward", replay=True)


@functools.cache
def _kernels():
    """The kernels' module, imported on the first call (``import flydsl.kernels`` loads no compiler)."""
    from flydsl.kernels.softmax import kernels

    return kernels


def softmax(x, out=None):
    """``out = softmax(x, dim=-1)`` over each row of ``x`` (rows, N); ``out`` has ``x``'s shape and dtype.

    Computed in float32 from the row's maximum (``exp(x - max) / sum``); rows of ``-inf`` give NaN as torch does."""
    key = signature(x, out)
    plan = _SOFTMAX.get(key)
    if plan is None:  # the first call with this signature: validated and routed (flydsl.kernels.plans)
        who = "flydsl.kernels.softmax"
        x_t = check.rows(who, "x", x)
        out_t = output(who, out, "out", x_t)
        plan = _SOFTMAX.add(key, _kernels().forward_plan(SoftmaxTensors(x=x_t, out=out_t)))
        out = out_t.obj
    elif out is None:
        out = torch_empty_like(x)
    plan(x, out)
    return out


def softmax_backward(dy, y, dx=None):
    """The gradient of softmax: ``dx = y * (dy - sum(dy * y, dim=-1))`` with ``y`` the forward's output; all three
    (rows, N) of one dtype."""
    key = signature(dy, y, dx)
    plan = _SOFTMAX_BACKWARD.get(key)
    if plan is None:
        who = "flydsl.kernels.softmax_backward"
        y_t = check.rows(who, "y", y)
        dy_t = check.rows(who, "dy", dy, rows=y_t.shape[0], n=y_t.shape[1], dtypes=(y_t.dtype,))
        check.same_device(who, y_t, ("dy", dy_t))
        dx_t = output(who, dx, "dx", y_t)
        plan = _SOFTMAX_BACKWARD.add(key, _kernels().backward_plan(SoftmaxTensors(x=y_t, out=dx_t, dy=dy_t)))
        dx = dx_t.obj
    elif dx is None:
        dx = torch_empty_like(y)
    plan(dy, y, dx)
    return dx
