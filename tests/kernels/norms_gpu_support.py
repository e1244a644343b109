"""Helpers of the norms' GPU tests (test_norms_gpu.py, test_norms_staged_forward_gpu.py): the per-dtype tolerances
(see test_norms_gpu.py's docstring), float64 references, inputs and poisoned outputs."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
_NORM = importlib.import_module("flydsl.kernels.normalization")
_DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _close(out, ref, dtype=None, what="out", scale=1, magnitude=None):
    """``out`` against the float64 ``ref`` within the dtype's tolerance, relative to ``|ref|`` or to ``magnitude``
    (the same sum with every term's absolute value: where terms cancel, rounding errors scale with it); ``scale``:
    both were multiplied by it (the check at the scale of the mean element of a softmax row or gradient), so that
    float16's subnormal spacing (2^-24: values under 6e-5 hold fewer bits) is allowed ``scale`` times over."""
    dtype = dtype or out.dtype
    atol, rtol = TOL[dtype]
    got = out.double()
    assert not torch.isnan(got).any(), f"{what}: NaN (an element was not written)"
    err = (got - ref).abs()
    size = ref.abs() if magnitude is None else magnitude
    bound = atol + rtol * size + (scale * 2.0**-24 if dtype == torch.float16 else 0.0)
    worst = (err - bound).argmax()
    assert bool((err <= bound).all()), f"{what}: |err| {err.flatten()[worst]:.3g} at {worst.item()} > tolerance"


def _input(rows, n, dtype, strided=False):
    if strided:  # every other row of a wider buffer: row stride 2N + 8
        base = torch.randn(rows, 2 * n + 8, device="cuda", dtype=torch.float32).to(dtype)
        return base[:, 3 : 3 + n] if n % 8 else base[:, 8 : 8 + n]
    return torch.randn(rows, n, device="cuda", dtype=torch.float32).to(dtype)


def _poison(t):
    return torch.full_like(t, float("nan"))


def _softmax_backward_ref(dy, y):
    """``y * (dy - sum(dy * y))`` in float64, and its magnitude ``y * (|dy| + sum(|dy * y|))`` (float32's rounding of
    ``dy - dot`` scales with it where the two nearly cancel)."""
    yd, dyd = y.double(), dy.double()
    ref = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
    return ref, yd * (dyd.abs() + (dyd * yd).abs().sum(-1, keepdim=True))


def _ln_ref(x, w, b, eps):
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(var + eps)
    y = (xd - mean) * rstd
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y, mean.squeeze(-1), rstd.squeeze(-1)
