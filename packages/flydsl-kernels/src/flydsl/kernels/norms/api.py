"""LayerNorm, RMSNorm and the fused residual add + RMSNorm over the rows of 2-D tensors, forward and backward.

Every function takes ``(rows, N)`` tensors with unit stride on the last dim and any row stride, in float32, float16
or bfloat16; weights and biases have the input's dtype or float32. Reductions run in float32. Outputs that are not
given are allocated through the input's framework (torch or cupy; other frameworks must pass them) and every
function returns what it wrote. Arguments are validated before anything is launched
(:mod:`flydsl.kernels.validation`); errors name the function and the argument. That happens on the first call of
each signature (the arguments' shapes, strides, dtypes, alignment and device); later calls with that signature run
the plan it made (:mod:`flydsl.kernels.plans`).

Statistics (``mean``, ``rstd``: float32, shape ``(rows,)``) are written only when asked for, so that inference pays
nothing for them: pass tensors to fill (``mean=..., rstd=...``), or ``return_stats=True`` to have them allocated.
Otherwise the returned ``mean``/``rstd`` are ``None``. The backward functions need them (``rstd = 1 / sqrt(var +
eps)``, ``var`` the biased variance, as torch computes it).
"""

from __future__ import annotations

from typing import NamedTuple

from flydsl.kernels import validation as check
from flydsl.kernels.memory import allocated, empty_like, empty_rows, torch_empty_like, torch_statistics
from flydsl.kernels.plans import Plans, signature
from flydsl.kernels.validation import TensorInfo

__all__ = [
    "NormTensors",
    "NormGradients",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "fused_add_rms_norm",
    "output",
    "statistics",
]


class NormTensors(NamedTuple):
    """The forward's validated tensors (TensorInfo; None where absent): ``residual`` and ``residual_out`` for the
    fused add, ``bias`` and ``mean`` for LayerNorm."""

    x: TensorInfo
    out: TensorInfo
    residual: TensorInfo | None = None
    weight: TensorInfo | None = None
    bias: TensorInfo | None = None
    residual_out: TensorInfo | None = None
    mean: TensorInfo | None = None
    rstd: TensorInfo | None = None

    def rows(self) -> list:
        """The row tensors present."""
        return [t for t in (self.x, self.residual, self.out, self.residual_out) if t is not None]

    def vectors(self) -> list:
        """The weight and bias present."""
        return [t for t in (self.weight, self.bias) if t is not None]


class NormGradients(NamedTuple):
    """The backward's validated tensors (TensorInfo; None where absent): the inputs (``mean`` only for LayerNorm,
    ``weight`` None without affine parameters) and the gradients written (``dweight`` with a weight, ``dbias`` for
    LayerNorm's bias)."""

    dy: TensorInfo
    x: TensorInfo
    weight: TensorInfo | None
    mean: TensorInfo | None
    rstd: TensorInfo
    dx: TensorInfo
    dweight: TensorInfo | None = None
    dbias: TensorInfo | None = None


_LAYER_NORM = Plans("flydsl.kernels.layer_norm", replay=True)
_LAYER_NORM_BACKWARD = Plans("flydsl.kernels.layer_norm_backward", replay=True)
_RMS_NORM = Plans("flydsl.kernels.rms_norm", replay=True)
_RMS_NORM_BACKWARD = Plans("flydsl.kernels.rms_norm_backward", replay=True)
_FUSED_ADD_RMS_NORM = Plans("flydsl.kernels.fused_add_rms_norm", replay=True)


def _forward():
    """The forward kernels' module, imported on the first call, so that ``import flydsl.kernels`` (and
    ``flydsl.torch``, which validates through it) loads no compiler; the backward's is imported apart
    (:func:`_backward`), so that a first forward call does not pay for it."""
    from flydsl.kernels.norms import forward

    return forward


def _backward():
    from flydsl.kernels.norms import backward

    return backward


def output(who: str, given, name: str, like):
    """A validated output tensor: the one given (``like``'s shape and dtype, on its device) or a new one like the
    input (allocated here: nothing to check)."""
    if given is None:
        return allocated(empty_like(like, f"{who}: {name}"))
    t = check.rows(who, name, given, rows=like.shape[0], n=like.shape[1], dtypes=(like.dtype,))
    check.same_device(who, like, (name, t))
    return t


def statistics(who: str, given, name: str, like, wanted: bool):
    """A statistics output: the one given (float32 (rows,)), a new one where ``wanted``, else None."""
    if given is None and not wanted:
        return None
    if given is None:
        return allocated(empty_rows(like, (like.shape[0],), f"{who}: {name}"))
    t = check.stats(who, name, given, like.shape[0])
    check.same_device(who, like, (name, t))
    return t


def _weight(who: str, obj, name: str, like, optional: bool = True):
    t = check.vector(who, name, obj, like.shape[1], dtypes=(like.dtype, "f32"), optional=optional)
    check.same_device(who, like, (name, t))
    return t


def _gradient(who: str, given, name: str, weight, like):
    """``dweight``/``dbias``: the one given, else a new one like the weight."""
    return _weight(who, given if given is not None else empty_like(weight, f"{who}: {name}"), name, like, False)


def _obj(t):
    return None if t is None else t.obj


def layer_norm(x, weight, bias, eps=1e-5, out=None, mean=None, rstd=None, *, return_stats=False):
    """``out = (x - mean) * rstd * weight + bias`` over each row (``torch.nn.functional.layer_norm`` on the last
    dim); ``weight``/``bias`` (N,) may be ``None``. Returns ``(out, mean, rstd)``: the statistics (float32, (rows,))
    are written only into the tensors given or, with ``return_stats=True``, into new ones; else they are ``None``."""
    key = signature(x, weight, bias, eps, out, mean, rstd, return_stats)
    plan = _LAYER_NORM.get(key)
    if plan is None:  # the first call with this signature: validated and routed (flydsl.kernels.plans)
        who = "flydsl.kernels.layer_norm"
        x_t = check.rows(who, "x", x)
        w_t, b_t = _weight(who, weight, "weight", x_t), _weight(who, bias, "bias", x_t)
        eps = check.nonnegative(who, "eps", eps)
        out_t = output(who, out, "out", x_t)
        mean_t = statistics(who, mean, "mean", x_t, return_stats)
        rstd_t = statistics(who, rstd, "rstd", x_t, return_stats)
        tensors = NormTensors(x=x_t, out=out_t, weight=w_t, bias=b_t, mean=mean_t, rstd=rstd_t)
        plan = _LAYER_NORM.add(key, _forward().forward_plan(tensors, rms=False))
        out, mean, rstd = out_t.obj, _obj(mean_t), _obj(rstd_t)
    else:
        out, mean, rstd = _planned_outputs(x, out, mean, rstd, return_stats)
    plan(x, out, None, weight, bias, None, mean, rstd, float(eps))
    return out, mean, rstd


def layer_norm_backward(dy, x, weight, mean, rstd, dx=None, dweight=None, dbias=None):
    """Gradients of :func:`layer_norm` from the forward's ``mean`` and ``rstd``: ``dx`` (rows, N) in ``x``'s dtype,
    and when ``weight`` is given, ``dweight`` and ``dbias`` (N,) in ``weight``'s dtype (the sums over rows run in
    float32: per-CTA partial sums, then one small reduction kernel). Without ``weight``, ``dweight``/``dbias`` are
    ``None`` (the forward had no affine parameters)."""
    key = signature(dy, x, weight, mean, rstd, dx, dweight, dbias)
    plan = _LAYER_NORM_BACKWARD.get(key)
    if plan is None:
        who = "flydsl.kernels.layer_norm_backward"
        x_t = check.rows(who, "x", x)
        dy_t = check.rows(who, "dy", dy, rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
        w_t = _weight(who, weight, "weight", x_t)
        mean_t, rstd_t = check.stats(who, "mean", mean, x_t.shape[0]), check.stats(who, "rstd", rstd, x_t.shape[0])
        check.same_device(who, x_t, ("dy", dy_t), ("mean", mean_t), ("rstd", rstd_t))
        dx_t = output(who, dx, "dx", x_t)
        dw_t = db_t = None
        if w_t is not None:
            dw_t = _gradient(who, dweight, "dweight", w_t, x_t)
            db_t = _gradient(who, dbias, "dbias", w_t, x_t)
        grads = NormGradients(dy=dy_t, x=x_t, weight=w_t, mean=mean_t, rstd=rstd_t, dx=dx_t, dweight=dw_t, dbias=db_t)
        plan = _LAYER_NORM_BACKWARD.add(key, _backward().backward_plan(grads, rms=False))
        dx, dweight, dbias = dx_t.obj, _obj(dw_t), _obj(db_t)
    else:
        dx = torch_empty_like(x) if dx is None else dx
        if weight is not None:
            dweight = torch_empty_like(weight) if dweight is None else dweight
            dbias = torch_empty_like(weight) if dbias is None else dbias
        else:
            dweight = dbias = None
    plan(dy, x, weight, mean, rstd, dx, dweight, dbias)
    return dx, dweight, dbias


def rms_norm(x, weight, eps=1e-6, out=None, rstd=None, *, return_stats=False):
    """``out = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` over each row; ``weight`` (N,) may be
    ``None``. Returns ``(out, rstd)``; ``rstd`` follows :func:`layer_norm`'s convention (written when given or with
    ``return_stats=True``, else ``None``)."""
    key = signature(x, weight, eps, out, rstd, return_stats)
    plan = _RMS_NORM.get(key)
    if plan is None:
        who = "flydsl.kernels.rms_norm"
        x_t = check.rows(who, "x", x)
        w_t = _weight(who, weight, "weight", x_t)
        eps = check.nonnegative(who, "eps", eps)
        out_t = output(who, out, "out", x_t)
        rstd_t = statistics(who, rstd, "rstd", x_t, return_stats)
        tensors = NormTensors(x=x_t, out=out_t, weight=w_t, rstd=rstd_t)
        plan = _RMS_NORM.add(key, _forward().forward_plan(tensors, rms=True))
        out, rstd = out_t.obj, _obj(rstd_t)
    else:
        out, _, rstd = _planned_outputs(x, out, None, rstd, return_stats, mean_wanted=False)
    plan(x, out, None, weight, None, None, None, rstd, float(eps))
    return out, rstd


def rms_norm_backward(dy, x, weight, rstd, dx=None, dweight=None):
    """Gradients of :func:`rms_norm` from the forward's ``rstd``: ``dx`` (rows, N), and ``dweight`` (N,) when
    ``weight`` is given (else ``None``)."""
    key = signature(dy, x, weight, rstd, dx, dweight)
    plan = _RMS_NORM_BACKWARD.get(key)
    if plan is None:
        who = "flydsl.kernels.rms_norm_backward"
        x_t = check.rows(who, "x", x)
        dy_t = check.rows(who, "dy", dy, rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
        w_t = _weight(who, weight, "weight", x_t)
        rstd_t = check.stats(who, "rstd", rstd, x_t.shape[0])
        check.same_device(who, x_t, ("dy", dy_t), ("rstd", rstd_t))
        dx_t = output(who, dx, "dx", x_t)
        dw_t = _gradient(who, dweight, "dweight", w_t, x_t) if w_t is not None else None
        grads = NormGradients(dy=dy_t, x=x_t, weight=w_t, mean=None, rstd=rstd_t, dx=dx_t, dweight=dw_t)
        plan = _RMS_NORM_BACKWARD.add(key, _backward().backward_plan(grads, rms=True))
        dx, dweight = dx_t.obj, _obj(dw_t)
    else:
        dx = torch_empty_like(x) if dx is None else dx
        dweight = None if weight is None else torch_empty_like(weight) if dweight is None else dweight
    plan(dy, x, weight, None, rstd, dx, dweight, None)
    return dx, dweight


def fused_add_rms_norm(x, residual, weight, eps=1e-6, out=None, residual_out=None, rstd=None, *, return_stats=False):
    """``residual_out = x + residual`` (rounded to the input dtype) and ``out = rms_norm(residual_out) * weight``,
    in one pass. ``residual_out`` may be ``residual`` itself (an in-place update, as in vLLM). Returns ``(out,
    residual_out, rstd)`` (``rstd`` as in :func:`rms_norm`)."""
    key = signature(x, residual, weight, eps, out, residual_out, rstd, return_stats)
    plan = _FUSED_ADD_RMS_NORM.get(key)
    if plan is None:
        who = "flydsl.kernels.fused_add_rms_norm"
        x_t = check.rows(who, "x", x)
        r_t = check.rows(who, "residual", residual, rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
        check.same_device(who, x_t, ("residual", r_t))
        w_t = _weight(who, weight, "weight", x_t)
        eps = check.nonnegative(who, "eps", eps)
        out_t = output(who, out, "out", x_t)
        ro_t = output(who, residual_out, "residual_out", x_t)
        rstd_t = statistics(who, rstd, "rstd", x_t, return_stats)
        tensors = NormTensors(x=x_t, out=out_t, residual=r_t, weight=w_t, residual_out=ro_t, rstd=rstd_t)
        plan = _FUSED_ADD_RMS_NORM.add(key, _forward().forward_plan(tensors, rms=True))
        out, residual_out, rstd = out_t.obj, ro_t.obj, _obj(rstd_t)
    else:
        out = torch_empty_like(x) if out is None else out
        residual_out = torch_empty_like(x) if residual_out is None else residual_out
        rstd = torch_statistics(x) if rstd is None and return_stats else rstd
    plan(x, out, residual, weight, None, residual_out, None, rstd, float(eps))
    return out, residual_out, rstd


def _planned_outputs(x, out, mean, rstd, return_stats: bool, mean_wanted: bool = True) -> tuple:
    """The outputs of a planned forward call (torch tensors: the plan was made for the same signature): the ones
    given, else new ones where the signature's first call allocated them."""
    out = torch_empty_like(x) if out is None else out
    if return_stats:
        mean = torch_statistics(x) if mean is None and mean_wanted else mean
        rstd = torch_statistics(x) if rstd is None else rstd
    return out, mean, rstd
