"""The checks of the GEMM entry points (:func:`~flydsl.kernels.gemm.gemm`, :func:`~flydsl.kernels.gemm.skinny_gemm`,
``torch.ops.flydsl.gemm``), through the zoo's validation layer (:mod:`flydsl.kernels.validation`): the devices
first (:func:`check_devices`), then shapes, dtypes and strides (:func:`check_arguments`, which reads no data, so
that the torch op's fake implementation runs it too); each error names the function and the argument. And the result
of a product with an empty dimension."""

from __future__ import annotations

from flydsl.kernels import validation as check
from flydsl.kernels.gemm.skinny import MAX_M

__all__ = [
    "check_arguments",
    "check_blockscale_arguments",
    "check_devices",
    "check_fp8_arguments",
    "check_skinny",
    "zero_product",
]


def check_devices(who: str, a, b, out=None, bias=None, **others) -> None:
    """The first check: ``a``, ``b`` (and ``out``, ``bias`` and the named ``others`` where given) CUDA torch tensors
    on one device."""
    device = None
    for name, t in (("a", a), ("b", b), ("out", out), ("bias", bias), *others.items()):
        if t is None:
            continue
        check.torch_tensor(who, name, t)
        if not t.is_cuda:
            raise ValueError(f"{who}: {name}: expected a CUDA tensor, got one on {t.device}")
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"{who}: {name}: expected a tensor on {device} (a's), got one on {t.device}")


def check_arguments(who: str, a, b, out, bias, activation) -> tuple[int, int, int]:
    """Shapes, dtypes and strides (:func:`flydsl.kernels.validation.matmul`). Returns ``(m, n, k)``."""
    return check.matmul(who, a, b, out, bias, activation)


def check_fp8_arguments(who: str, a, b, scale_a, scale_b, out, bias, activation) -> tuple:
    """:func:`check_arguments` for fp8 operands (float8_e4m3fn or float8_e5m2, K a multiple of 16; the bias bf16,
    fp16 or float32) and their float32 scales: ``scale_a`` one or one per row of a, ``scale_b`` one or one per column
    of b. Returns ``(m, n, k, a's granularity, b's)`` ("tensor", "row", "column")."""
    m, n, k = check.matmul(who, a, b, out, bias, activation, fp8=True)
    a_per = check.gemm_scale(who, "scale_a", scale_a, m, "row")
    return m, n, k, a_per, check.gemm_scale(who, "scale_b", scale_b, n, "column")


def check_blockscale_arguments(who: str, a, b, a_scales, b_scales, out, bias, activation) -> tuple[int, int, int]:
    """:func:`check_arguments` for block-scaled fp8 operands (as :func:`check_fp8_arguments`) and their scales:
    ``a_scales`` (M, ceil(K / 128)) and ``b_scales`` (ceil(N / 128), ceil(K / 128)), float32 or UE8M0
    (``torch.float8_e8m0fnu``), any non-negative strides. Returns ``(m, n, k)``."""
    m, n, k = check.matmul(who, a, b, out, bias, activation, fp8=True)
    blocks = -(-k // 128)
    for name, scales, shape in (("a_scales", a_scales, (m, blocks)), ("b_scales", b_scales, (-(-n // 128), blocks))):
        check.torch_tensor(who, name, scales)
        if str(scales.dtype) not in ("torch.float32", "torch.float8_e8m0fnu"):
            got = str(scales.dtype).removeprefix("torch.")
            raise TypeError(f"{who}: {name}: expected float32 (or float8_e8m0fnu) scales, got {got}")
        if tuple(scales.shape) != shape:
            what = "one per row of a and 128 of K" if name == "a_scales" else "one per 128 x 128 block of b"
            raise ValueError(f"{who}: {name}: expected shape {shape} ({what}), got {tuple(scales.shape)}")
        if any(s < 0 for s in scales.stride()):
            raise ValueError(f"{who}: {name}: expected non-negative strides, got {tuple(scales.stride())}")
    return m, n, k


def check_skinny(who: str, a, b, out, bias, activation) -> tuple[int, int, int]:
    """:func:`check_arguments`, and what the skinny kernel needs on top: at most 16 rows of ``a``, ``b``
    column-major (``w.t()`` of (N, K) row-major weights). Returns ``(m, n, k)``."""
    m, n, k = check_arguments(who, a, b, out, bias, activation)
    if m > MAX_M:
        raise ValueError(f"{who}: a: expected at most {MAX_M} rows, got {m} (use flydsl.kernels.gemm.gemm)")
    if b.stride(0) != 1 and not (n == 1 or k == 1):
        raise ValueError(
            f"{who}: b: expected a column-major (K, N) matrix (b = w.t() of (N, K) row-major weights), got"
            f" strides {tuple(b.stride())}; row-major b is not supported (use flydsl.kernels.gemm.gemm)"
        )
    return m, n, k


def zero_product(out, bias, activation):
    """``out`` of a product with an empty dimension: nothing for M or N = 0, the epilogue of zeros for K = 0."""
    import torch

    if out.numel() == 0:
        return out
    zero = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    result = zero if bias is None else zero + bias.float()
    if activation is not None:
        result = {"relu": torch.relu, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[activation](
            result
        )
    return out.copy_(result)
