"""Pre-arranged ("prepared") fp8 weights: laid out once, ahead of time, in the order the fp8 kernels load them.

:func:`prepare_weight` takes ``b`` as :func:`~flydsl.kernels.gemm.fp8_gemm` does, (K, N) (an ``nn.Linear`` weight W
(N, K) passed as ``W.t()``), and stores W as K panels of 128 bytes: each panel the contiguous (N, 128) matrix of 128
columns of K (docs/kernels-zoo.md#prepared-weights has the picture)::

    data[k // 128, n, k % 128] = W[n, k]       # (ceil(K / 128), N, 128), K zero padded

Why this order: the warp-specialized kernel's TMA box of a B tile (its CTA's rows x one 128-byte swizzled row of K)
is one contiguous piece of a panel instead of rows K bytes apart, and lands in shared memory exactly as a plain
weight's does (the same 128B-swizzled slots, the same wgmma); the M <= 16 kernel's warp load (8 rows x 64 bytes) is
half of one contiguous kilobyte. The padding holds zeros: K past K adds 0. Measured on the H200
(fp8_gemm/2026-12-03_a559724.json): the same bits as plain weights, 1.006x their speed geomean (1-3% faster at M
64-512, 2-5% slower at M >= 2048). An earlier order in 512-byte blocks of 8 rows x 64 bytes (every skinny warp load
one block) gained nothing on the skinny kernel and cost the warp-specialized kernel 0-9% through the 64B swizzle its
panels need, so it was dropped.
"""

from __future__ import annotations

from typing import NamedTuple

from flydsl.kernels import validation as check
from flydsl.kernels.gemm.operands import SWIZZLE_BYTES

__all__ = ["PreparedWeight", "check_prepared", "prepare_weight", "prepared_shape"]


class PreparedWeight(NamedTuple):
    """fp8 weights from :func:`prepare_weight`: ``data`` the (ceil(K / 128), N, 128) panels, ``k`` and ``n`` the
    extents of the ``b`` (K, N) they were made from. Pass it as ``fp8_gemm``'s ``b``."""

    data: object
    k: int
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of the ``b`` it stands for: (K, N)."""
        return (self.k, self.n)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    def unprepared(self):
        """The (K, N) ``b`` again (a view of a new (N, K) row-major tensor: ``W.t()``)."""
        panels, n, width = self.data.shape
        return self.data.permute(1, 0, 2).reshape(n, panels * width)[:, : self.k].contiguous().t()


def prepared_shape(k: int, n: int) -> tuple[int, int, int]:
    """The panels' shape of a (K, N) fp8 weight."""
    return (-(-k // SWIZZLE_BYTES), n, SWIZZLE_BYTES)


def prepare_weight(b) -> PreparedWeight:
    """``b`` (K, N) float8_e4m3fn or float8_e5m2 torch tensor (e.g. ``W.t()`` of ``nn.Linear`` weights W (N, K)), any
    strides, on any device, K a multiple of 16, laid out as the module docstring says: a new tensor, made once."""
    import torch

    who = "flydsl.kernels.gemm.prepare_weight"
    check.torch_tensor(who, "b", b)
    check.check_dtype(who, "b", check.torch_dtype(b.dtype), check.FP8_DTYPES)
    if b.dim() != 2:
        raise ValueError(f"{who}: b: expected a (K, N) matrix, got shape {tuple(b.shape)}")
    k, n = b.shape
    if k % 16:
        raise ValueError(f"{who}: b: K = {k}; expected a multiple of 16 (fp8 operands' 16-byte rows)")
    panels, _, width = prepared_shape(k, n)
    padded = torch.zeros((n, panels * width), dtype=torch.uint8, device=b.device)
    padded[:, :k] = b.t().view(torch.uint8)
    data = padded.view(n, panels, width).permute(1, 0, 2).contiguous().view(b.dtype)
    return PreparedWeight(data, k, n)


def check_prepared(who: str, b: PreparedWeight, out=None):
    """``b``'s panels as :func:`prepare_weight` makes them (an fp8 torch tensor of :func:`prepared_shape`,
    contiguous; read for its geometry only: fake tensors too) and not ``out``'s memory. Returns a (K, N) meta tensor
    of its dtype that stands for ``b`` in the shape checks of ``fp8_gemm``."""
    import torch

    data = check.torch_tensor(who, "b.data", b.data)
    check.check_dtype(who, "b.data", check.torch_dtype(data.dtype), check.FP8_DTYPES)
    expected = prepared_shape(b.k, b.n)
    if tuple(data.shape) != expected or not data.is_contiguous():
        raise ValueError(
            f"{who}: b: a PreparedWeight of ({b.k}, {b.n}) holds contiguous panels of shape"
            f" {expected} (from prepare_weight), got shape {tuple(data.shape)} strides {tuple(data.stride())}"
        )
    if out is not None and out.device.type != "meta":
        check.not_aliased(who, "out", check.tensor_addresses(out), ("b", check.tensor_addresses(data)))
    return torch.empty((b.k, b.n), dtype=data.dtype, device="meta")
