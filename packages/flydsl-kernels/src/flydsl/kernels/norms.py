"""Softmax, LayerNorm, RMSNorm and fused residual-add + RMSNorm over the rows of 2-D tensors, forward and backward.

Every function takes ``(rows, N)`` tensors with unit stride on the last dim and any row stride (strided rows work),
in float32, float16 or bfloat16; weights and biases have the input's dtype or float32. Reductions run in float32.
Outputs that are not given are allocated through the input's framework (torch or cupy; other frameworks must pass
them) and every function returns what it wrote. Arguments are validated before anything is launched;
errors name the argument.

Statistics (``mean``, ``rstd``: float32, shape ``(rows,)``) are written only when asked for, so that inference pays
nothing for them: pass tensors to fill (``mean=..., rstd=...``), or ``return_stats=True`` to have them allocated.
Otherwise the returned ``mean``/``rstd`` are ``None``. The backward functions need them (``rstd = 1 / sqrt(var +
eps)``, ``var`` the biased variance, as torch computes it).

The kernels behind these functions are in :mod:`flydsl.kernels.softmax` and :mod:`flydsl.kernels.normalization`;
they share :mod:`flydsl.kernels.reduction` (thread layouts per N and dtype, 16-byte row tiles, warp/block/cluster
reductions). Long rows are split over a cluster of CTAs that reduce through distributed shared memory, so that each
element is read from memory once.
"""

from __future__ import annotations

from flydsl.kernels import normalization as _norm
from flydsl.kernels import softmax as _softmax
from flydsl.kernels.host import (
    allocated,
    empty_like,
    empty_rows,
    row_tensor,
    same_device,
    stats_tensor,
    vector_tensor,
)

__all__ = [
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "fused_add_rms_norm",
]


def _output(given, name: str, like, what: str):
    """A validated output tensor: the one given (same shape as the input) or a new one like the input (allocated
    here: nothing to check)."""
    if given is None:
        return allocated(empty_like(like, f"{what}: {name}"))
    t = row_tensor(given, name, rows=like.shape[0], n=like.shape[1], dtypes=(like.dtype,))
    same_device(like, (name, t))
    return t


def _stats(given, name: str, like, wanted: bool, what: str):
    if given is None and not wanted:
        return None
    if given is None:
        return allocated(empty_rows(like, (like.shape[0],), f"{what}: {name}"))
    t = stats_tensor(given, name, like.shape[0])
    same_device(like, (name, t))
    return t


def _weight(obj, name: str, like, allow_none: bool = True):
    t = vector_tensor(obj, name, like.shape[1], dtypes=(like.dtype, "f32"), allow_none=allow_none)
    same_device(like, (name, t))
    return t


def _obj(t):
    return None if t is None else t.obj


# --- softmax ---------------------------------------------------------------------------------------------------------


def softmax(x, out=None):
    """``out = softmax(x, dim=-1)`` over each row of ``x`` (rows, N); ``out`` has ``x``'s shape and dtype.

    Computed in float32 from the row's maximum (``exp(x - max) / sum``); rows of ``-inf`` give NaN as torch does."""
    x_t = row_tensor(x, "x")
    out_t = _output(out, "out", x_t, "softmax")
    _softmax.forward(x_t, out_t)
    return out_t.obj


def softmax_backward(dy, y, dx=None):
    """The gradient of softmax: ``dx = y * (dy - sum(dy * y, dim=-1))`` with ``y`` the forward's output; all three
    (rows, N) of one dtype."""
    y_t = row_tensor(y, "y")
    dy_t = row_tensor(dy, "dy", rows=y_t.shape[0], n=y_t.shape[1], dtypes=(y_t.dtype,))
    same_device(y_t, ("dy", dy_t))
    dx_t = _output(dx, "dx", y_t, "softmax_backward")
    _softmax.backward(dy_t, y_t, dx_t)
    return dx_t.obj


# --- layer norm ------------------------------------------------------------------------------------------------------


def layer_norm(x, weight, bias, eps=1e-5, out=None, mean=None, rstd=None, *, return_stats=False):
    """``out = (x - mean) * rstd * weight + bias`` over each row (``torch.nn.functional.layer_norm`` on the last
    dim); ``weight``/``bias`` (N,) may be ``None``. Returns ``(out, mean, rstd)``: the statistics (float32, (rows,))
    are written only into the tensors given or, with ``return_stats=True``, into new ones; else they are ``None``."""
    x_t = row_tensor(x, "x")
    w_t, b_t = _weight(weight, "weight", x_t), _weight(bias, "bias", x_t)
    eps = _eps(eps)
    out_t = _output(out, "out", x_t, "layer_norm")
    mean_t = _stats(mean, "mean", x_t, return_stats, "layer_norm")
    rstd_t = _stats(rstd, "rstd", x_t, return_stats, "layer_norm")
    _norm.forward(x_t, None, w_t, b_t, out_t, None, mean_t, rstd_t, eps, rms=False)
    return out_t.obj, _obj(mean_t), _obj(rstd_t)


def layer_norm_backward(dy, x, weight, mean, rstd, dx=None, dweight=None, dbias=None):
    """Gradients of :func:`layer_norm` from the forward's ``mean`` and ``rstd``: ``dx`` (rows, N) in ``x``'s dtype,
    and when ``weight`` is given, ``dweight`` and ``dbias`` (N,) in ``weight``'s dtype (the sums over rows run in
    float32: per-CTA partial sums, then one small reduction kernel). Without ``weight``, ``dweight``/``dbias`` are
    ``None`` (the forward had no affine parameters)."""
    x_t = row_tensor(x, "x")
    dy_t = row_tensor(dy, "dy", rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
    w_t = _weight(weight, "weight", x_t)
    mean_t, rstd_t = stats_tensor(mean, "mean", x_t.shape[0]), stats_tensor(rstd, "rstd", x_t.shape[0])
    same_device(x_t, ("dy", dy_t), ("mean", mean_t), ("rstd", rstd_t))
    dx_t = _output(dx, "dx", x_t, "layer_norm_backward")
    dw_t = db_t = None
    if w_t is not None:
        dw_t = _weight(dweight if dweight is not None else empty_like(w_t, "dweight"), "dweight", x_t, False)
        db_t = _weight(dbias if dbias is not None else empty_like(w_t, "dbias"), "dbias", x_t, False)
    _norm.backward(dy_t, x_t, w_t, mean_t, rstd_t, dx_t, dw_t, db_t, rms=False)
    return dx_t.obj, _obj(dw_t), _obj(db_t)


# --- rms norm --------------------------------------------------------------------------------------------------------


def rms_norm(x, weight, eps=1e-6, out=None, rstd=None, *, return_stats=False):
    """``out = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` over each row; ``weight`` (N,) may be
    ``None``. Returns ``(out, rstd)``; ``rstd`` follows :func:`layer_norm`'s convention (written when given or with
    ``return_stats=True``, else ``None``)."""
    x_t = row_tensor(x, "x")
    w_t = _weight(weight, "weight", x_t)
    eps = _eps(eps)
    out_t = _output(out, "out", x_t, "rms_norm")
    rstd_t = _stats(rstd, "rstd", x_t, return_stats, "rms_norm")
    _norm.forward(x_t, None, w_t, None, out_t, None, None, rstd_t, eps, rms=True)
    return out_t.obj, _obj(rstd_t)


def rms_norm_backward(dy, x, weight, rstd, dx=None, dweight=None):
    """Gradients of :func:`rms_norm` from the forward's ``rstd``: ``dx`` (rows, N), and ``dweight`` (N,) when
    ``weight`` is given (else ``None``)."""
    x_t = row_tensor(x, "x")
    dy_t = row_tensor(dy, "dy", rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
    w_t = _weight(weight, "weight", x_t)
    rstd_t = stats_tensor(rstd, "rstd", x_t.shape[0])
    same_device(x_t, ("dy", dy_t), ("rstd", rstd_t))
    dx_t = _output(dx, "dx", x_t, "rms_norm_backward")
    dw_t = None
    if w_t is not None:
        dw_t = _weight(dweight if dweight is not None else empty_like(w_t, "dweight"), "dweight", x_t, False)
    _norm.backward(dy_t, x_t, w_t, None, rstd_t, dx_t, dw_t, None, rms=True)
    return dx_t.obj, _obj(dw_t)


def fused_add_rms_norm(x, residual, weight, eps=1e-6, out=None, residual_out=None, rstd=None, *, return_stats=False):
    """``residual_out = x + residual`` (rounded to the input dtype) and ``out = rms_norm(residual_out) * weight``,
    in one pass. ``residual_out`` may be ``residual`` itself (an in-place update, as in vLLM). Returns ``(out,
    residual_out, rstd)`` (``rstd`` as in :func:`rms_norm`)."""
    x_t = row_tensor(x, "x")
    r_t = row_tensor(residual, "residual", rows=x_t.shape[0], n=x_t.shape[1], dtypes=(x_t.dtype,))
    same_device(x_t, ("residual", r_t))
    w_t = _weight(weight, "weight", x_t)
    eps = _eps(eps)
    out_t = _output(out, "out", x_t, "fused_add_rms_norm")
    ro_t = _output(residual_out, "residual_out", x_t, "fused_add_rms_norm")
    rstd_t = _stats(rstd, "rstd", x_t, return_stats, "fused_add_rms_norm")
    _norm.forward(x_t, r_t, w_t, None, out_t, ro_t, None, rstd_t, eps, rms=True)
    return out_t.obj, ro_t.obj, _obj(rstd_t)


def _eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps: expected a non-negative number, got {eps!r}")
    return float(eps)
