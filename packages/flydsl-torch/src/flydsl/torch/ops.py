"""``torch.ops.flydsl.*``: the kernels of ``flydsl.kernels`` (norms, softmax, GEMMs, fp8, paged attention, MoE) as
torch custom ops.

Each op comes as a functional op and a mutating ``*_out`` op (see ``_registry``); inputs may have any leading dims
(they are viewed as ``(rows, N)`` without a copy where their strides allow, else made contiguous), normalized over
the last dim (softmax) or over the trailing ``normalized_shape`` (the norms, as in ``torch.nn.functional``).

========================================= ===================================================================
functional op                             returns
========================================= ===================================================================
``softmax(x)``                            ``y`` (softmax over the last dim)
``softmax_backward(dy, y)``               ``dx``
``layer_norm(x, ns, weight, bias, eps)``  ``(out, mean, rstd)``; ``mean``/``rstd`` float32 of x's leading shape
``layer_norm_backward(dy, x, ns, weight,  ``(dx, dweight, dbias)``; ``dweight``/``dbias`` are empty without a weight
mean, rstd)``
``rms_norm(x, ns, weight, eps)``          ``(out, rstd)``
``rms_norm_backward(dy, x, ns, weight,    ``(dx, dweight)``
rstd)``
``fused_add_rms_norm(x, residual, ns,     ``(out, residual_out, rstd)`` with ``residual_out = x + residual``
weight, eps)``
``gemm(a, b, bias, activation)``          ``activation(a @ b + bias)`` (bf16/fp16; the Hopper GEMM)
``fp8_gemm(a, b, scale_a, scale_b, bias,  ``activation((scale_a * a) @ (b * scale_b) + bias)`` in ``out_dtype``
activation, out_dtype)``                  (default bf16; fp8 a, b; flydsl.kernels.gemm.fp8_gemm)
``fp8_gemm_prepared(a, panels, n,        ``fp8_gemm`` with weights prepared by ``flydsl.kernels.gemm.prepare_weight``
scale_a, scale_b, bias, activation,       (``panels``: its ``data``, ``n``: the output features)
out_dtype)``
``blockscale_gemm(a, b, a_scales,        the block-scaled fp8 GEMM (flydsl.kernels.gemm.blockscale_gemm): scales per
b_scales, bias, activation, out_dtype)``  1 x 128 of a and 128 x 128 of b, promoted per K block
``quantize_fp8(x, granularity, dtype)``   ``(x_fp8, scales)`` (flydsl.kernels.quantize; x viewed as (rows, N))
``paged_decode(q, k_cache, ...)``         a decode step's attention over a paged KV cache (flydsl.torch.attention)
``topk_route``, ``align_tokens``,         the MoE routing and experts (flydsl.torch.moe: their signatures, fp8
``fused_moe``                             arguments of fused_moe)
========================================= ===================================================================

``write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)`` writes the new keys and values into the caches
(a mutating op: ``register_mutating_op``, no functional form, no ``*_out`` op; :mod:`flydsl.torch.attention`).

The ``*_out`` ops take the same inputs and write keyword-only outputs (``out=``, ``mean=``, ...); statistics are
optional there (not written when not given). ``eps=None`` in the RMS ops means ``torch.finfo(torch.float32).eps``,
as ``torch.nn.functional.rms_norm`` uses for float32, float16 and bfloat16 inputs.
"""

from __future__ import annotations

import math

import flydsl.kernels as zoo
import torch
from flydsl.kernels import validation as check
from flydsl.torch._registry import register_op
from torch import Tensor

__all__ = [
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "fused_add_rms_norm",
    "gemm",
    "fp8_gemm",
    "fp8_gemm_prepared",
    "blockscale_gemm",
    "quantize_fp8",
    "DTYPES",
]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the kernels read and write


# --- checks shared by the fake and the real implementations (flydsl.kernels.validation's) -------------------------


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(t: Tensor) -> str:
    return check.torch_dtype(t.dtype)


def _check_input(op: str, name: str, x: Tensor) -> None:
    check.check_dtype(f"flydsl.{op}", name, _dtype(x), check.ROW_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"flydsl.{op}: {name}: expected at least one dim, got a 0-dim tensor")


def _check_like(op: str, name: str, t: Tensor, like: Tensor, like_name: str) -> None:
    check.check_like(f"flydsl.{op}", name, t.shape, _dtype(t), like.shape, _dtype(like), like_name)


def _check_normalized_shape(op: str, x: Tensor, normalized_shape: list[int]) -> None:
    check.trailing_shape(f"flydsl.{op}", x.shape, normalized_shape)


def _check_param(op: str, name: str, p: Tensor | None, x: Tensor, normalized_shape: list[int]) -> None:
    if p is None:
        return
    if tuple(p.shape) != tuple(normalized_shape):
        raise ValueError(
            f"flydsl.{op}: {name}: expected shape {tuple(normalized_shape)} (normalized_shape), got {tuple(p.shape)}"
        )
    check.check_dtype(f"flydsl.{op}", name, _dtype(p), (_dtype(x), "f32"), like="x")


def _check_stats(op: str, name: str, s: Tensor, x: Tensor, normalized_shape: list[int]) -> None:
    lead = tuple(x.shape[: x.dim() - len(normalized_shape)])
    if tuple(s.shape) != lead or s.dtype != torch.float32:
        raise ValueError(
            f"flydsl.{op}: {name}: expected a float32 tensor of shape {lead} (x's leading dims), "
            f"got {_name(s.dtype)} {tuple(s.shape)}"
        )


def _check_eps(op: str, eps: float | None) -> None:
    if eps is not None:
        check.nonnegative(f"flydsl.{op}", "eps", eps)


# --- output descriptions ---------------------------------------------------------------------------------------------


def _like(t: Tensor):
    return tuple(t.shape), t.dtype


def _stats(x: Tensor, normalized_shape: list[int]):
    return tuple(x.shape[: x.dim() - len(normalized_shape)]), torch.float32


def _param(p: Tensor | None):
    return None if p is None else (tuple(p.shape), p.dtype)


# --- views handed to the kernels --------------------------------------------------------------------------------------


def _rows(t: Tensor, n: int) -> Tensor:
    """An input as (rows, n) with unit stride on the last dim and non-overlapping rows: a view where possible (the
    tensor itself when it is one already: no view to build on the common path)."""
    t2 = t if t.dim() == 2 and t.shape[1] == n else t.reshape(-1, n)
    stride = t2.stride()
    if (n > 1 and stride[1] != 1) or (t2.shape[0] > 1 and stride[0] < n):
        t2 = t2.contiguous()  # e.g. a transposed input, or a gradient broadcast with stride 0
    return t2


def _out_rows(op: str, name: str, t: Tensor, n: int) -> Tensor:
    """An output as (rows, n): always a view (a copy would not be written back)."""
    if t.dim() == 2 and t.shape[1] == n:
        t2 = t
    else:
        try:
            t2 = t.view(-1, n)
        except RuntimeError:
            t2 = None
    if t2 is not None:
        stride = t2.stride()
        if (n > 1 and stride[1] != 1) or (t2.shape[0] > 1 and stride[0] < n):
            t2 = None
    if t2 is None:
        raise ValueError(
            f"flydsl.{op}: {name}: expected unit stride over the normalized dims, got strides {t.stride()}"
            " (pass a contiguous tensor)"
        )
    return t2


def _vector(t: Tensor | None) -> Tensor | None:
    if t is None or (t.dim() == 1 and t.stride(0) == 1):
        return t
    return t.reshape(-1).contiguous()


def _out_vector(op: str, name: str, t: Tensor | None) -> Tensor | None:
    if t is None:
        return None
    if not t.is_contiguous():
        raise ValueError(f"flydsl.{op}: {name}: expected a contiguous tensor, got strides {t.stride()}")
    return t if t.dim() == 1 else t.view(-1)


def _stats_in(t: Tensor) -> Tensor:
    return t if t.dim() == 1 else t.reshape(-1)


_FLOAT32_EPS = torch.finfo(torch.float32).eps


def _rms_eps(eps: float | None) -> float:
    return _FLOAT32_EPS if eps is None else float(eps)


# --- softmax ---------------------------------------------------------------------------------------------------------


def _check_softmax(x: Tensor) -> None:
    _check_input("softmax", "x", x)


@register_op("softmax", outputs=lambda x: (_like(x),), check=_check_softmax)
def softmax(x: Tensor, *, out: Tensor) -> None:
    if x.numel() == 0:
        return
    n = x.shape[-1]
    zoo.softmax(_rows(x, n), out=_out_rows("softmax", "out", out, n))


def _check_softmax_backward(dy: Tensor, y: Tensor) -> None:
    _check_input("softmax_backward", "y", y)
    _check_like("softmax_backward", "dy", dy, y, "y")


@register_op("softmax_backward", outputs=lambda dy, y: (_like(y),), check=_check_softmax_backward)
def softmax_backward(dy: Tensor, y: Tensor, *, dx: Tensor) -> None:
    if y.numel() == 0:
        return
    n = y.shape[-1]
    zoo.softmax_backward(_rows(dy, n), _rows(y, n), dx=_out_rows("softmax_backward", "dx", dx, n))


# --- layer norm ------------------------------------------------------------------------------------------------------


def _check_layer_norm(x, normalized_shape, weight, bias, eps) -> None:
    _check_input("layer_norm", "x", x)
    _check_normalized_shape("layer_norm", x, normalized_shape)
    _check_param("layer_norm", "weight", weight, x, normalized_shape)
    _check_param("layer_norm", "bias", bias, x, normalized_shape)
    _check_eps("layer_norm", eps)


@register_op(
    "layer_norm",
    outputs=lambda x, ns, weight, bias, eps: (_like(x), _stats(x, ns), _stats(x, ns)),
    check=_check_layer_norm,
)
def layer_norm(
    x: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    out: Tensor,
    mean: Tensor | None = None,
    rstd: Tensor | None = None,
) -> None:
    if x.numel() == 0:
        return
    n = math.prod(normalized_shape)
    zoo.layer_norm(
        _rows(x, n),
        _vector(weight),
        _vector(bias),
        float(eps),
        out=_out_rows("layer_norm", "out", out, n),
        mean=_out_vector("layer_norm", "mean", mean),
        rstd=_out_vector("layer_norm", "rstd", rstd),
    )


def _check_layer_norm_backward(dy, x, normalized_shape, weight, mean, rstd) -> None:
    _check_input("layer_norm_backward", "x", x)
    _check_like("layer_norm_backward", "dy", dy, x, "x")
    _check_normalized_shape("layer_norm_backward", x, normalized_shape)
    _check_param("layer_norm_backward", "weight", weight, x, normalized_shape)
    _check_stats("layer_norm_backward", "mean", mean, x, normalized_shape)
    _check_stats("layer_norm_backward", "rstd", rstd, x, normalized_shape)


@register_op(
    "layer_norm_backward",
    outputs=lambda dy, x, ns, weight, mean, rstd: (_like(x), _param(weight), _param(weight)),
    check=_check_layer_norm_backward,
)
def layer_norm_backward(
    dy: Tensor,
    x: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    *,
    dx: Tensor,
    dweight: Tensor | None = None,
    dbias: Tensor | None = None,
) -> None:
    if x.numel() == 0:
        for grad in (dweight, dbias):  # sums over no rows
            if grad is not None:
                grad.zero_()
        return
    n = math.prod(normalized_shape)
    op = "layer_norm_backward"
    zoo.layer_norm_backward(
        _rows(dy, n),
        _rows(x, n),
        _vector(weight),
        _stats_in(mean),
        _stats_in(rstd),
        dx=_out_rows(op, "dx", dx, n),
        dweight=_out_vector(op, "dweight", dweight),
        dbias=_out_vector(op, "dbias", dbias),
    )


# --- rms norm --------------------------------------------------------------------------------------------------------


def _check_rms_norm(x, normalized_shape, weight, eps) -> None:
    _check_input("rms_norm", "x", x)
    _check_normalized_shape("rms_norm", x, normalized_shape)
    _check_param("rms_norm", "weight", weight, x, normalized_shape)
    _check_eps("rms_norm", eps)


@register_op(
    "rms_norm",
    outputs=lambda x, ns, weight, eps: (_like(x), _stats(x, ns)),
    check=_check_rms_norm,
)
def rms_norm(
    x: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None = None,
    eps: float | None = None,
    *,
    out: Tensor,
    rstd: Tensor | None = None,
) -> None:
    if x.numel() == 0:
        return
    n = math.prod(normalized_shape)
    zoo.rms_norm(
        _rows(x, n),
        _vector(weight),
        _rms_eps(eps),
        out=_out_rows("rms_norm", "out", out, n),
        rstd=_out_vector("rms_norm", "rstd", rstd),
    )


def _check_rms_norm_backward(dy, x, normalized_shape, weight, rstd) -> None:
    _check_input("rms_norm_backward", "x", x)
    _check_like("rms_norm_backward", "dy", dy, x, "x")
    _check_normalized_shape("rms_norm_backward", x, normalized_shape)
    _check_param("rms_norm_backward", "weight", weight, x, normalized_shape)
    _check_stats("rms_norm_backward", "rstd", rstd, x, normalized_shape)


@register_op(
    "rms_norm_backward",
    outputs=lambda dy, x, ns, weight, rstd: (_like(x), _param(weight)),
    check=_check_rms_norm_backward,
)
def rms_norm_backward(
    dy: Tensor,
    x: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None,
    rstd: Tensor,
    *,
    dx: Tensor,
    dweight: Tensor | None = None,
) -> None:
    if x.numel() == 0:
        if dweight is not None:
            dweight.zero_()
        return
    n = math.prod(normalized_shape)
    op = "rms_norm_backward"
    zoo.rms_norm_backward(
        _rows(dy, n),
        _rows(x, n),
        _vector(weight),
        _stats_in(rstd),
        dx=_out_rows(op, "dx", dx, n),
        dweight=_out_vector(op, "dweight", dweight),
    )


def _check_fused_add_rms_norm(x, residual, normalized_shape, weight, eps) -> None:
    _check_input("fused_add_rms_norm", "x", x)
    _check_like("fused_add_rms_norm", "residual", residual, x, "x")
    _check_normalized_shape("fused_add_rms_norm", x, normalized_shape)
    _check_param("fused_add_rms_norm", "weight", weight, x, normalized_shape)
    _check_eps("fused_add_rms_norm", eps)


@register_op(
    "fused_add_rms_norm",
    outputs=lambda x, residual, ns, weight, eps: (_like(x), _like(x), _stats(x, ns)),
    check=_check_fused_add_rms_norm,
)
def fused_add_rms_norm(
    x: Tensor,
    residual: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None = None,
    eps: float | None = None,
    *,
    out: Tensor,
    residual_out: Tensor,
    rstd: Tensor | None = None,
) -> None:
    if x.numel() == 0:
        return
    n = math.prod(normalized_shape)
    op = "fused_add_rms_norm"
    zoo.fused_add_rms_norm(
        _rows(x, n),
        _rows(residual, n),
        _vector(weight),
        _rms_eps(eps),
        out=_out_rows(op, "out", out, n),
        residual_out=_out_rows(op, "residual_out", residual_out, n),
        rstd=_out_vector(op, "rstd", rstd),
    )


# --- gemm ------------------------------------------------------------------------------------------------------------


def _check_gemm(a: Tensor, b: Tensor, bias: Tensor | None, activation: str | None) -> None:
    check.matmul("flydsl.gemm", a, b, None, bias, activation, contiguous_bias=False)  # (the op makes bias contiguous)


@register_op(
    "gemm",
    outputs=lambda a, b, bias, activation: (((a.shape[0], b.shape[1]), a.dtype),),
    check=_check_gemm,
)
def gemm(a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None, *, out: Tensor) -> None:
    """``out = activation(a @ b + bias)`` (flydsl.kernels.gemm: the Hopper kernel; a, b row- or column-major)."""
    from flydsl.kernels.gemm import gemm as kernel

    kernel(a, b, out, bias=None if bias is None else bias.contiguous(), activation=activation)


# --- fp8 -------------------------------------------------------------------------------------------------------------


def _check_fp8_gemm(a, b, scale_a, scale_b, bias, activation, out_dtype) -> None:
    who = "flydsl.fp8_gemm"
    m, n, _ = check.matmul(who, a, b, None, bias, activation, contiguous_bias=False, fp8=True)
    check.gemm_scale(who, "scale_a", scale_a, m, "row")
    check.gemm_scale(who, "scale_b", scale_b, n, "column")
    if out_dtype is not None:
        check.check_dtype(who, "out_dtype", check.torch_dtype(out_dtype), check.GEMM_OUT_DTYPES)


@register_op(
    "fp8_gemm",
    outputs=lambda a, b, sa, sb, bias, activation, out_dtype: (
        ((a.shape[0], b.shape[1]), out_dtype or torch.bfloat16),
    ),
    check=_check_fp8_gemm,
)
def fp8_gemm(
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    out: Tensor,
) -> None:
    """``out = activation((scale_a * a) @ (b * scale_b) + bias)`` (flydsl.kernels.gemm.fp8_gemm)."""
    from flydsl.kernels.gemm import fp8_gemm as kernel

    kernel(a, b, scale_a, scale_b, out, bias=None if bias is None else bias.contiguous(), activation=activation)


def _prepared(panels: Tensor, k: int, n: int):
    from flydsl.kernels.gemm.prepared import PreparedWeight

    return PreparedWeight(panels, k, n)


def _check_fp8_gemm_prepared(a, panels, n, scale_a, scale_b, bias, activation, out_dtype) -> None:
    from flydsl.kernels.gemm.prepared import check_prepared

    who = "flydsl.fp8_gemm_prepared"
    check.torch_tensor(who, "a", a)
    if a.dim() != 2:
        raise ValueError(f"{who}: a: expected a 2-D matrix, got shape {tuple(a.shape)}")
    stand_in = check_prepared(who, _prepared(panels, a.shape[1], n))
    _check_fp8_gemm(a, stand_in, scale_a, scale_b, bias, activation, out_dtype)


@register_op(
    "fp8_gemm_prepared",
    outputs=lambda a, panels, n, sa, sb, bias, activation, out_dtype: (((a.shape[0], n), out_dtype or torch.bfloat16),),
    check=_check_fp8_gemm_prepared,
)
def fp8_gemm_prepared(
    a: Tensor,
    panels: Tensor,
    n: int,
    scale_a: Tensor,
    scale_b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    out: Tensor,
) -> None:
    """``fp8_gemm`` with prepared weights: ``panels`` the ``data`` of ``prepare_weight(b)`` for a (K, n) ``b``."""
    from flydsl.kernels.gemm import fp8_gemm as kernel

    b = _prepared(panels, a.shape[1], n)
    kernel(a, b, scale_a, scale_b, out, bias=None if bias is None else bias.contiguous(), activation=activation)


def _check_blockscale_gemm(a, b, a_scales, b_scales, bias, activation, out_dtype) -> None:
    from flydsl.kernels.gemm.arguments import check_blockscale_arguments

    who = "flydsl.blockscale_gemm"
    check.torch_tensor(who, "a", a)
    check.torch_tensor(who, "b", b)
    check_blockscale_arguments(who, a, b, a_scales, b_scales, None, bias, activation)
    if out_dtype is not None:
        check.check_dtype(who, "out_dtype", check.torch_dtype(out_dtype), check.GEMM_OUT_DTYPES)


@register_op(
    "blockscale_gemm",
    outputs=lambda a, b, sa, sb, bias, activation, out_dtype: (
        ((a.shape[0], b.shape[1]), out_dtype or torch.bfloat16),
    ),
    check=_check_blockscale_gemm,
)
def blockscale_gemm(
    a: Tensor,
    b: Tensor,
    a_scales: Tensor,
    b_scales: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    out: Tensor,
) -> None:
    """The block-scaled fp8 GEMM (flydsl.kernels.gemm.blockscale_gemm): ``a_scales`` per 1 x 128 of ``a``,
    ``b_scales`` per 128 x 128 block of ``b``."""
    from flydsl.kernels.gemm import blockscale_gemm as kernel

    kernel(a, b, a_scales, b_scales, out, bias=None if bias is None else bias.contiguous(), activation=activation)


# Each granularity's scales, of x viewed as (rows, n): "group" row-major (rows, groups of 128 columns), "block" one
# per 128 x 128 block (a weight's: rows are its output channels).
_SCALE_SHAPES = {
    "token": lambda rows, n: (rows, 1),
    "channel": lambda rows, n: (1, rows),
    "tensor": lambda rows, n: (),
    "group": lambda rows, n: (rows, -(-n // 128)),
    "block": lambda rows, n: (-(-rows // 128), -(-n // 128)),
}


def _check_quantize_fp8(x: Tensor, granularity: str, dtype) -> None:
    who = "flydsl.quantize_fp8"
    check.check_dtype(who, "x", _dtype(x), check.ROW_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"{who}: x: expected at least one dim, got a 0-dim tensor")
    check.one_of(who, "granularity", granularity, tuple(_SCALE_SHAPES))
    if dtype is not None and dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{who}: dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")


def _quantize_outputs(x: Tensor, granularity: str, dtype):
    rows, n = math.prod(x.shape[:-1]), x.shape[-1]
    return (tuple(x.shape), dtype or torch.float8_e4m3fn), (_SCALE_SHAPES[granularity](rows, n), torch.float32)


@register_op("quantize_fp8", outputs=_quantize_outputs, check=_check_quantize_fp8)
def quantize_fp8(
    x: Tensor, granularity: str = "token", dtype: torch.dtype | None = None, *, out: Tensor, scales: Tensor
) -> None:
    """``(out, scales)`` with ``x ~ out * scales`` (flydsl.kernels.quantize.quantize_fp8 over x's rows; "group"
    scales row-major, the faster layout for blockscale_gemm)."""
    from flydsl.kernels.quantize import quantize_fp8 as kernel

    n = x.shape[-1] if x.dim() else 1
    if x.numel() == 0:
        scales.zero_()
        return
    kernel(_rows(x, n), granularity, out=out.view(-1, n), scales=scales)
