"""Gradients of the functional ``torch.ops.flydsl.*`` ops through the backward kernels (``register_autograd``, so
that ``torch.compile`` traces forward and backward into one graph without breaks).

The statistics outputs (``mean``, ``rstd``) are not differentiable. Double backward is not supported: the backward
ops have no gradients of their own. The gradient of an output that nothing used arrives as None (the registry does
not materialize zeros), and contributes nothing. The backward ops are called through ``FlyOp.call``: without the
dispatcher on plain CUDA tensors in eager mode, through ``torch.ops.flydsl`` when traced.
"""

from __future__ import annotations

import math

import torch
from flydsl.torch import ops
from flydsl.torch._nodes import NativeBackward, Saved

__all__: list[str] = []


# --- softmax ---------------------------------------------------------------------------------------------------------


def _softmax_backward(ctx, dy):
    if dy is None:
        return None
    (y,) = ctx.saved_tensors
    return ops.softmax_backward.call(dy, y)


ops.softmax.register_autograd(
    _softmax_backward,
    Saved(tensors=(("output", 0),)),
    native=NativeBackward(ops.softmax_backward, arguments=(("grad", 0), ("saved", 0)), gradients=(0,)),
)


# --- layer norm ------------------------------------------------------------------------------------------------------


def _bias_grad(dy: torch.Tensor, normalized_shape, dtype: torch.dtype) -> torch.Tensor:
    """dbias without a weight (the kernel writes dbias beside dweight only): the column sums of dy in float32."""
    rows = dy.reshape(-1, math.prod(normalized_shape))
    return rows.sum(0, dtype=torch.float32).to(dtype).view(tuple(normalized_shape))


# layer_norm(x, normalized_shape, weight, bias, eps) -> (out, mean, rstd): the backward keeps x, weight, mean and rstd,
# and reads normalized_shape and bias (for its dtype, and whether there is one) from the context.
_LAYER_NORM_SAVED = Saved(
    tensors=(("input", 0), ("input", 2), ("output", 1), ("output", 2)),
    non_differentiable=(1, 2),
    values=(("normalized_shape", 1), ("bias", 3)),
)


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    if dy is None:
        return None, None, None, None, None
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dweight, dbias = ops.layer_norm_backward.call(dy, x, ctx.normalized_shape, weight, mean, rstd)
    if weight is None:  # dweight and dbias came back empty
        dweight = None
        dbias = None if ctx.bias is None else _bias_grad(dy, ctx.normalized_shape, ctx.bias.dtype)
    elif ctx.bias is None:
        dbias = None
    return dx, None, dweight, dbias, None


ops.layer_norm.register_autograd(
    _layer_norm_backward,
    _LAYER_NORM_SAVED,
    native=NativeBackward(
        ops.layer_norm_backward,
        arguments=(
            ("grad", 0),
            ("saved", 0),
            ("context", "normalized_shape"),
            ("saved", 1),
            ("saved", 2),
            ("saved", 3),
        ),
        gradients=(0, None, 1, 2, None),  # (dbias lands on no input where bias is None)
        defined=(0, 3),  # without a weight, dbias is computed in Python
    ),
)


# --- rms norm --------------------------------------------------------------------------------------------------------


# rms_norm_backward's arguments (dy, x, normalized_shape, weight, rstd) from the output's gradient and what both
# rms norms' setup_context saves (the normed input, weight, rstd) and sets (normalized_shape).
_RMS_NORM_BACKWARD = (("grad", 0), ("saved", 0), ("context", "normalized_shape"), ("saved", 1), ("saved", 2))


def _rms_norm_backward(ctx, dy, _drstd):
    if dy is None:
        return None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = ops.rms_norm_backward.call(dy, x, ctx.normalized_shape, weight, rstd)
    return dx, None, None if weight is None else dweight, None


ops.rms_norm.register_autograd(
    _rms_norm_backward,
    # rms_norm(x, normalized_shape, weight, eps) -> (out, rstd)
    Saved(
        tensors=(("input", 0), ("input", 2), ("output", 1)), non_differentiable=(1,), values=(("normalized_shape", 1),)
    ),
    native=NativeBackward(
        ops.rms_norm_backward,
        arguments=_RMS_NORM_BACKWARD,
        gradients=(0, None, 1, None),  # (dweight lands on no input where weight is None)
        defined=(0,),
    ),
)


def _fused_add_rms_norm_backward(ctx, dy, dresidual_out, _drstd):
    # residual_out = x + residual feeds both outputs: its gradient is dresidual_out plus the norm's dx, and x and
    # residual both receive it.
    if dy is None:  # only residual_out was used: its gradient passes through the add
        return dresidual_out, dresidual_out, None, None, None
    residual_out, weight, rstd = ctx.saved_tensors
    dsum, dweight = ops.rms_norm_backward.call(dy, residual_out, ctx.normalized_shape, weight, rstd)
    if dresidual_out is not None:
        dsum = dsum + dresidual_out
    return dsum, dsum, None, None if weight is None else dweight, None


ops.fused_add_rms_norm.register_autograd(
    _fused_add_rms_norm_backward,
    # fused_add_rms_norm(x, residual, normalized_shape, weight, eps) -> (out, residual_out, rstd)
    Saved(
        tensors=(("output", 1), ("input", 3), ("output", 2)),
        non_differentiable=(2,),
        values=(("normalized_shape", 2),),
    ),
    native=NativeBackward(
        ops.rms_norm_backward,
        arguments=_RMS_NORM_BACKWARD,
        gradients=(0, 0, None, 1, None),  # x and residual both take dsum
        defined=(0,),
        unused=(1,),  # with residual_out's gradient, dsum adds it (Python)
    ),
)


# --- gemm ------------------------------------------------------------------------------------------------------------


def _gemm_setup(ctx, inputs, output):
    a, b, bias, activation = inputs
    ctx.activation = activation
    ctx.bias_dtype = None if bias is None else bias.dtype
    if activation == "relu":  # its derivative from the output: 1 where it is positive
        ctx.save_for_backward(a, b, output)
    elif activation is not None:  # gelu, silu: from the pre-activation, computed again in the backward
        ctx.save_for_backward(a, b, bias)
    else:
        ctx.save_for_backward(a, b)


def _matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y by the flydsl GEMM (any strides: operands TMA cannot read as they are are copied into aligned rows)."""
    return ops.gemm.call(x, y, None, None)


def _activation_grad(ctx, dc: torch.Tensor, saved: tuple) -> torch.Tensor:
    """The gradient at the fused activation's input: dc itself without one; relu's from the output; gelu's (erf)
    and silu's through torch's own derivative kernels at the pre-activation ``a @ b + bias``, computed again by the
    flydsl GEMM (rounded to the output's dtype, as an unfused matmul would hand it to the activation)."""
    if ctx.activation is None:
        return dc
    a, b, third = saved
    if ctx.activation == "relu":
        return torch.ops.aten.threshold_backward(dc, third, 0)
    z = ops.gemm.call(a, b, third, None)
    if ctx.activation == "gelu":
        return torch.ops.aten.gelu_backward(dc, z)
    return torch.ops.aten.silu_backward(dc, z)


def _gemm_backward(ctx, dc):
    if dc is None:
        return None, None, None, None
    saved = ctx.saved_tensors
    a, b = saved[:2]
    dz = _activation_grad(ctx, dc, saved)
    da = _matmul(dz, b.t()) if ctx.needs_input_grad[0] else None
    db = _matmul(a.t(), dz) if ctx.needs_input_grad[1] else None
    dbias = dz.sum(0, dtype=torch.float32).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
    return da, db, dbias, None


ops.gemm.register_autograd(_gemm_backward, _gemm_setup)
