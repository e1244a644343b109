"""The checks of the GEMM entry points (:func:`~flydsl.kernels.gemm.gemm`, :func:`~flydsl.kernels.gemm.skinny_gemm`)
before anything is planned or launched, each error naming its argument, and the result of a product with an empty
dimension."""

from __future__ import annotations

from flydsl.kernels.gemm.epilogue import ACTIVATIONS

__all__ = ["check_arguments", "check_devices", "zero_product"]


def check_arguments(who: str, a, b, out, bias, activation):
    """The checks every GEMM entry point makes before launching, naming the argument: ``a`` (M, K) and ``b``
    (K, N) 2-D CUDA tensors of one 16-bit float dtype on one device, ``out`` (M, N) row-major bf16/fp16/fp32 there
    (allocated in a's dtype when None), ``bias`` (N,) contiguous in a's dtype or float32, ``activation`` one of
    ACTIVATIONS. Returns ``(m, n, k, out)``. Devices are checked by :func:`check_devices`."""
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{who} {name}: expected a 2-D CUDA torch tensor, got {type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{who} {name}: expected bfloat16 or float16, got {t.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"{who}: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{who}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    elif (
        not isinstance(out, torch.Tensor)
        or out.shape != (m, n)
        or out.stride(-1) != 1
        or out.dtype not in (torch.bfloat16, torch.float16, torch.float32)
    ):
        raise ValueError(
            f"{who} out: expected a row-major ({m}, {n}) bf16/fp16/fp32 tensor, got"
            f" {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
            f" strides {out.stride() if isinstance(out, torch.Tensor) else ()}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"{who} activation: expected one of {ACTIVATIONS}, got {activation!r}")
    if bias is not None and (
        not isinstance(bias, torch.Tensor)
        or bias.device != a.device
        or bias.shape != (n,)
        or bias.stride(0) != 1
        or bias.dtype not in (a.dtype, torch.float32)
    ):
        raise ValueError(
            f"{who} bias: expected a contiguous ({n},) tensor of {a.dtype} or float32 on {a.device}, got"
            f" {getattr(bias, 'dtype', type(bias).__name__)} {tuple(getattr(bias, 'shape', ()))}"
        )
    return m, n, k, out


def check_devices(who: str, a, b, out) -> None:
    """The last check before launching (after :func:`check_arguments`, whose checks thus run on CPU tensors too):
    ``a``, ``b`` and ``out`` on one CUDA device."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not t.is_cuda or t.device != a.device:
            raise ValueError(f"{who} {name}: expected a CUDA tensor on {a.device}, got one on {t.device}")


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
