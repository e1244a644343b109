"""``quantize_fp8``: a tensor cast to fp8 with float32 scales, in one fused pass per row (amax, scale, cast), for the
fp8 GEMMs (:func:`flydsl.kernels.gemm.fp8_gemm`) and ``flydsl.torch.nn.Fp8Linear``. The zoo's one quantizer
vocabulary: the granularity words here are the ones ``Fp8Linear`` (and later the MoE and block-scaled GEMMs) take.

    from flydsl.kernels.quantize import quantize_fp8
    a8, scale_a = quantize_fp8(x, "token")      # x (M, K) bf16 -> e4m3 (M, K), scale_a (M, 1): x ~ a8 * scale_a
    w8, scale_w = quantize_fp8(w, "channel")    # w (N, K) nn.Linear weights -> e4m3 (N, K), scale_w (1, N)
    out = fp8_gemm(a8, w8.t(), scale_a, scale_w)
"""

from __future__ import annotations

import functools

from flydsl.kernels import validation as check
from flydsl.kernels.plans import Plans, signature

__all__ = ["GRANULARITIES", "quantize_fp8"]

GRANULARITIES = ("tensor", "token", "channel")  # the block-scaled GEMM adds "group" (1 x 128) and "block" (128 x 128)
_FORMATS = {"torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2"}
_QUANTIZE = Plans("flydsl.kernels.quantize_fp8")


@functools.cache
def _kernels():
    from flydsl.kernels.quantize import kernels

    return kernels


def quantize_fp8(x, granularity: str = "token", *, dtype=None, out=None, scales=None):
    """``(x_fp8, scales)`` with ``x ~ x_fp8 * scales``: ``x`` a (rows, N) torch CUDA tensor (float32, float16 or
    bfloat16, unit stride on the last dim), cast to ``dtype`` (``torch.float8_e4m3fn``, the default, or
    ``torch.float8_e5m2``) after division by its float32 scale ``amax / fp8_max`` (448 for e4m3), with saturation
    to the finite range, rounding to nearest even. ``granularity``: "token" (one scale per row, shape (rows, 1):
    activations), "channel" (one per row of an nn.Linear weight (N, K), i.e. per output channel, shape (1, N): the
    ``scale_b`` of ``fp8_gemm(a, w.t(), ...)``), or "tensor" (one, shape ()). Rows of zeros get scale 0; NaN makes
    its scale NaN. Per token or channel one read and one write; per tensor two reads (the amax first) and one
    write. ``out`` (rows, N) row-major fp8 and ``scales`` (float32, contiguous, of the granularity's shape): written
    where given (``dtype`` then is ``out``'s), else allocated."""
    key = signature(x, granularity, None if dtype is None else str(dtype), out, scales)
    plan = _QUANTIZE.get(key)
    if plan is None:
        plan = _QUANTIZE.add(key, _plan(x, granularity, dtype, out, scales))
    return plan(x, out, scales)


def _plan(x, granularity: str, dtype, out, scales):
    """The launches of a call of this signature, checked: a function of ``(x, out, scales)`` (outputs None: allocated)
    returning ``(x_fp8, scales)``."""
    who = _QUANTIZE.name
    check.one_of(who, "granularity", granularity, GRANULARITIES)
    if dtype is None and out is not None:
        dtype = out.dtype
    fmt = "e4m3" if dtype is None else _FORMATS.get(str(dtype))
    if fmt is None:
        raise TypeError(f"{who}: dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    info = check.rows(who, "x", x)
    import torch

    dtype = torch.float8_e4m3fn if dtype is None else dtype
    rows, n = info.shape
    shape = {"token": (rows, 1), "channel": (1, rows), "tensor": ()}[granularity]
    _check_outputs(who, info, out, scales, (rows, n), dtype, shape)
    if rows == 0 or n == 0:

        def empty(x, out, scales):
            out = x.new_empty((rows, n), dtype=dtype) if out is None else out
            scales = x.new_empty(shape, dtype=torch.float32) if scales is None else scales
            return out, scales.zero_()

        return empty
    kernels = _kernels()
    from flydsl.kernels.rows.layout import forward_row_config

    cfg = forward_row_config(n, info.dtype)
    launch = dict(grid=cfg.grid(rows), block=cfg.block, cluster=cfg.cluster_shape)
    kernel = kernels.quantize_rows_kernel
    if granularity != "tensor":
        spec = kernels.QuantizeSpec("row", fmt)

        def per_row(x, out, scales):
            out = x.new_empty((rows, n), dtype=dtype) if out is None else out
            scales = x.new_empty(shape, dtype=torch.float32) if scales is None else scales
            kernel(x, out.view(torch.uint8), scales.view(-1), scales, cfg, spec).launch(**launch)
            return out, scales

        return per_row
    amax_spec, cast_spec = kernels.QuantizeSpec("amax", fmt), kernels.QuantizeSpec("cast", fmt)

    def per_tensor(x, out, scale):
        out = x.new_empty((rows, n), dtype=dtype) if out is None else out
        scale = x.new_empty((), dtype=torch.float32) if scale is None else scale
        amax = torch.zeros(1, dtype=torch.int32, device=x.device)
        kernel(x, out.view(torch.uint8), scale.view(1), amax, cfg, amax_spec).launch(**launch)
        kernel(x, out.view(torch.uint8), scale.view(1), amax, cfg, cast_spec).launch(**launch)
        return out, scale

    return per_tensor


def _check_outputs(who: str, x, out, scales, out_shape: tuple, dtype, scales_shape: tuple) -> None:
    """Given outputs: ``out`` a row-major fp8 (rows, N) tensor of ``dtype``, ``scales`` a contiguous float32 tensor
    of the granularity's shape, both on x's device and apart from x."""
    for name, t, shape in (("out", out, out_shape), ("scales", scales, scales_shape)):
        if t is None:
            continue
        info = check.describe(who, name, t)
        check.same_device(who, x, (name, info))
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{who}: {name}: expected a contiguous {shape} tensor, got shape {tuple(t.shape)}")
        wanted = dtype if name == "out" else "float32"
        wanted, got = str(wanted).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        if got != wanted:
            raise TypeError(f"{who}: {name}: expected dtype {wanted}, got {got}")
        check.not_aliased(who, name, info, ("x", x))
