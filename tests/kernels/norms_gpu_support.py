"""Helpers of the row kernels' GPU tests (test_norms_gpu.py, test_norms_staged_forward_gpu.py,
test_norms_routes_gpu.py): the per-dtype tolerances (see test_norms_gpu.py's docstring), float64 references, inputs
and poisoned outputs, each public function checked against its reference, and launches along a chosen route."""

from __future__ import annotations

import contextlib
import importlib

import pytest

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels.norms.api import NormGradients, NormTensors  # noqa: E402
from flydsl.kernels.rows.router import Route, RowKernel, RowOp  # noqa: E402
from flydsl.kernels.softmax.api import SoftmaxTensors  # noqa: E402
from flydsl.kernels.validation import from_torch  # noqa: E402

forward_mod = importlib.import_module("flydsl.kernels.norms.forward")
backward_mod = importlib.import_module("flydsl.kernels.norms.backward")
softmax_mod = importlib.import_module("flydsl.kernels.softmax.kernels")  # (flydsl.kernels.softmax: the function)
column_sum_mod = importlib.import_module("flydsl.kernels.norms.column_sum")

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
TORCH_DTYPE = {name: dtype for dtype, name in DTYPE_NAME.items()}


def close(out, ref, dtype=None, what="out", scale=1, magnitude=None, terms=None):
    """``out`` against the float64 ``ref`` within the dtype's tolerance, relative to ``|ref|`` or to ``magnitude``
    (the same sum with every term's absolute value: where terms cancel, rounding errors scale with it); ``scale``:
    both were multiplied by it (the check at the scale of the mean element of a softmax row or gradient), so that
    float16's subnormal spacing (2^-24: values under 6e-5 hold fewer bits) is allowed ``scale`` times over.
    ``terms``: the size of the terms the kernel added in float32 on the way, of which 16 float32 ulps (2^-20) are
    allowed on top (a difference of nearly equal terms, as a norm's dx where rstd is large, keeps only their
    float32 rounding however the output is rounded)."""
    dtype = dtype or out.dtype
    atol, rtol = TOL[dtype]
    got = out.double()
    assert not torch.isnan(got).any(), f"{what}: NaN (an element was not written)"
    err = (got - ref).abs()
    size = ref.abs() if magnitude is None else magnitude
    bound = atol + rtol * size + (scale * 2.0**-24 if dtype == torch.float16 else 0.0)
    if terms is not None:
        bound = bound + 2.0**-20 * terms
    worst = (err - bound).argmax()
    assert bool((err <= bound).all()), f"{what}: |err| {err.flatten()[worst]:.3g} at {worst.item()} > tolerance"


def column_close(got, ref, rows, what):
    """Column sums (dweight, dbias) over ``rows`` rows: rtol 1e-3 and atol 1e-4 * sqrt(rows) * max|ref| on top."""
    atol = 1e-4 * rows**0.5 * ref.abs().max().item() + TOL[got.dtype][0]
    err = (got.double() - ref).abs()
    bound = atol + (1e-3 + TOL[got.dtype][1]) * ref.abs()
    assert bool((err <= bound).all()), f"{what}: max err {err.max():.3g}"


def make_input(rows, n, dtype, strided=False):
    if strided:  # every other row of a wider buffer: row stride 2N + 8
        base = torch.randn(rows, 2 * n + 8, device="cuda", dtype=torch.float32).to(dtype)
        return base[:, 3 : 3 + n] if n % 8 else base[:, 8 : 8 + n]
    return torch.randn(rows, n, device="cuda", dtype=torch.float32).to(dtype)


def poison(t):
    return torch.full_like(t, float("nan"))


def nan_stats(rows):
    return torch.full((rows,), float("nan"), device="cuda")


def softmax_backward_ref(dy, y):
    """``y * (dy - sum(dy * y))`` in float64, and its magnitude ``y * (|dy| + sum(|dy * y|))`` (float32's rounding of
    ``dy - dot`` scales with it where the two nearly cancel)."""
    yd, dyd = y.double(), dy.double()
    ref = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
    return ref, yd * (dyd.abs() + (dyd * yd).abs().sum(-1, keepdim=True))


def ln_ref(x, w, b, eps):
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


def rms_ref(x, w, eps=1e-6):
    """(out, rstd) of RMSNorm in float64."""
    xd = x.double()
    rstd = 1 / torch.sqrt((xd * xd).mean(-1) + eps)
    out = xd * rstd[:, None]
    return (out * w.double() if w is not None else out), rstd


# --- each public function against its reference ---------------------------------------------------------------------


def check_softmax(x):
    out = poison(x)
    assert zoo.softmax(x, out) is out
    ref = torch.softmax(x.double(), dim=-1)
    close(out, ref)
    n = x.shape[1]
    close(out.double() * n, ref * n, x.dtype, "out * N", n)  # at the scale of the mean element (~1), not of 1/N
    sums = out.double().sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=TOL[x.dtype][1] * max(1, n**0.5) + 1e-6)


def check_softmax_backward(dy, y):
    dx = zoo.softmax_backward(dy, y, poison(dy))
    ref, magnitude = softmax_backward_ref(dy, y)
    n = y.shape[1]
    close(dx, ref, what="dx")
    close(dx.double() * n, ref * n, y.dtype, "dx * N", n, magnitude * n)  # at the scale of the mean element


def check_layer_norm(x, w, b, eps=1e-5):
    rows = x.shape[0]
    mean, rstd = nan_stats(rows), nan_stats(rows)
    out, _, _ = zoo.layer_norm(x, w, b, eps, poison(x), mean=mean, rstd=rstd)
    ref, ref_mean, ref_rstd = ln_ref(x, w, b, eps)
    close(out, ref)
    close(mean, ref_mean, torch.float32, "mean")
    close(rstd, ref_rstd, torch.float32, "rstd")


def check_rms_norm(x, w, eps=1e-6):
    rstd = nan_stats(x.shape[0])
    out, r = zoo.rms_norm(x, w, eps, poison(x), rstd=rstd)
    assert r is rstd
    ref, ref_rstd = rms_ref(x, w, eps)
    close(out, ref)
    close(rstd, ref_rstd, torch.float32, "rstd")


def check_fused_add_in_place(x, w, residual=None):
    """fused_add_rms_norm(x, residual (random by default), w) in place against float64: residual_out exact, out and
    rstd close."""
    residual = make_input(*x.shape, x.dtype) if residual is None else residual
    summed = (x.float() + residual.float()).to(x.dtype)
    rstd = nan_stats(x.shape[0])
    out, res_out, _ = zoo.fused_add_rms_norm(x, residual, w, 1e-6, poison(x), residual_out=residual, rstd=rstd)
    assert res_out is residual and torch.equal(residual, summed), "residual_out"
    ref, ref_rstd = rms_ref(summed, w)
    close(out, ref)
    close(rstd, ref_rstd, torch.float32, "rstd")


def check_layer_norm_backward(dy, x, w, b):
    """layer_norm_backward from the forward's statistics into a poisoned dx: against float64 given those (float32)
    statistics, as the kernel is, allowing the float32 rounding of dx's terms ``rstd * (g, mean(g), xhat * mean(g *
    xhat))``; past N = 8 against float64 autograd too (a row of a few nearly equal values has a variance near 0,
    where the float32 statistics alone move dx past any tolerance: once in ~1000 rows at N = 3). With a weight,
    dweight and dbias (column sums over the rows, poisoned too)."""
    n, rows = x.shape[1], x.shape[0]
    _, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, return_stats=True)
    grads = {} if w is None else {"dweight": poison(w), "dbias": poison(b)}
    dx, dw, db = zoo.layer_norm_backward(dy, x, w, mean, rstd, dx=poison(x), **grads)
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_() if w is not None else None
    bd = b.double().requires_grad_() if b is not None else None
    torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5).backward(dy.double())
    r, g = rstd.double()[:, None], dy.double() * (w.double() if w is not None else 1.0)
    xhat = (x.double() - mean.double()[:, None]) * r
    given = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    terms = r * (g.abs() + g.abs().mean(-1, keepdim=True) + xhat.abs() * (g * xhat).abs().mean(-1, keepdim=True))
    close(dx, given, what="dx", terms=terms)
    if n > 8:
        close(dx, xd.grad, what="dx against float64 statistics", terms=terms)
    if w is None:
        assert dw is None and db is None
        return
    column_close(dw, wd.grad, rows, "dweight")
    column_close(db, bd.grad, rows, "dbias")


def check_rms_norm_backward(dy, x, w, rstd=None):
    """rms_norm_backward into a poisoned dx against float64 autograd (dweight over the rows), and dx against float64
    given the forward's float32 rstd, as the kernel is: rows of N = 1 with |x| ~ 1e-2 are ill-conditioned
    (dx ~ w dy rstd (1 - x^2 rstd^2), a difference of nearly equal terms), so that rstd's last-bit rounding alone
    moved dx past the float32 tolerance (once in 70 random rows). Without a weight: no dweight."""
    if rstd is None:
        _, rstd = zoo.rms_norm(x, w, 1e-6, return_stats=True)
    dx, dw = zoo.rms_norm_backward(dy, x, w, rstd, dx=poison(x), dweight=None if w is None else poison(w))
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_() if w is not None else None
    out = xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6)
    (out * wd if wd is not None else out).backward(dy.double())
    r, g, xs = rstd.double()[:, None], dy.double() * (w.double() if w is not None else 1.0), xd.detach()
    terms = r * g.abs() + xs.abs() * r**3 * (g * xs).abs().mean(-1, keepdim=True)  # float32 rounding of both
    close(dx, r * g - xs * r**3 * (g * xs).mean(-1, keepdim=True), what="dx", terms=terms)
    if x.shape[1] > 1:  # well-conditioned: against float64 statistics too
        close(dx, xd.grad, what="dx against float64 statistics", terms=terms)
    if w is None:
        assert dw is None
    else:
        column_close(dw, wd.grad, x.shape[0], "dweight")


# --- launches along a chosen route ----------------------------------------------------------------------------------


def launch_forward(cfg, x, out, *, rms, eps=1e-6, weight=None, bias=None, residual=None, residual_out=None, **stats):
    """The norms' forward along ``Route(op, STAGED, cfg)`` on validated torch tensors (``stats``: mean, rstd)."""
    t = NormTensors(
        x=from_torch(x),
        out=from_torch(out),
        residual=from_torch(residual),
        weight=from_torch(weight),
        bias=from_torch(bias),
        residual_out=from_torch(residual_out),
        mean=from_torch(stats.get("mean")),
        rstd=from_torch(stats.get("rstd")),
    )
    op = RowOp.FUSED_ADD_RMS_NORM if residual is not None else RowOp.RMS_NORM if rms else RowOp.LAYER_NORM
    forward_mod.forward(t, eps, rms, chosen=Route(op, RowKernel.STAGED, cfg))


def launch_softmax(cfg, x, out):
    """Softmax's forward along ``Route(SOFTMAX, STAGED, cfg)``."""
    softmax_mod.forward(
        SoftmaxTensors(x=from_torch(x), out=from_torch(out)), chosen=Route(RowOp.SOFTMAX, RowKernel.STAGED, cfg)
    )


def launch_softmax_backward(cfg, dy, y, dx):
    """Softmax's backward along ``Route(SOFTMAX_BACKWARD, STAGED, cfg)``."""
    t = SoftmaxTensors(x=from_torch(y), out=from_torch(dx), dy=from_torch(dy))
    softmax_mod.backward(t, chosen=Route(RowOp.SOFTMAX_BACKWARD, RowKernel.STAGED, cfg))


def gradients_sums(t: NormGradients) -> int:
    """The column sums the backward keeps for ``t`` (as backward_route counts them)."""
    return 0 if t.weight is None else (2 if t.dbias is not None else 1)


@contextlib.contextmanager
def backward_configs(monkeypatch, choose):
    """The public backward functions launch ``choose(routed, sums)`` (a config) instead of the route's config
    ``routed`` (``sums``: the column sums of the call). Yields the list of the configs launched."""
    routed_route = backward_mod.backward_route
    launched = []

    def chosen(t, rms):
        routed = routed_route(t, rms)
        cfg = choose(routed.config, gradients_sums(t))
        launched.append(cfg)
        return Route(routed.op, RowKernel.STAGED if cfg.staged else RowKernel.REGISTER, cfg)

    monkeypatch.setattr(backward_mod, "backward_route", chosen)
    yield launched
    monkeypatch.setattr(backward_mod, "backward_route", routed_route)


@contextlib.contextmanager
def spied_routes(monkeypatch, module, name: str):
    """Records the routes ``module.name`` (a ``*_route`` function) returns while inside."""
    real = getattr(module, name)
    taken = []

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        taken.append(found)
        return found

    monkeypatch.setattr(module, name, spy)
    yield taken
    monkeypatch.setattr(module, name, real)
