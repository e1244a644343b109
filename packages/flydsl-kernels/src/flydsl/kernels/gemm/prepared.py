"""Pre-arranged ("prepared") fp8 weights: laid out once, ahead of time, in the order both fp8 kernels load them.

:func:`prepare_weight` takes ``b`` as :func:`~flydsl.kernels.gemm.fp8_gemm` does, (K, N) (an ``nn.Linear`` weight W
(N, K) passed as ``W.t()``), and stores W in blocks of 8 rows x 64 bytes of K, each block 512 contiguous bytes, the
blocks of a row band K-ordered (docs/kernels-zoo.md#prepared-weights has the picture)::

    data[n // 8, k // 64, n % 8, k % 64] = W[n, k]       # (ceil(N / 8), ceil(K / 64), 8, 64), zero padded

Why this order: the M <= 16 kernel's warp loads 16 bytes per lane from 8 weight rows x 64 bytes of K (lane l reads
row l // 4, bytes 16 (l % 4) ..): in a prepared block those are the block itself, lane l at byte 16 l, so every
load instruction reads 512 contiguous bytes (4 cache lines instead of parts of 8). The warp-specialized kernel reads
the same blocks through a 4-D TMA view, one box of 64-byte K panels per tile, into 64B-swizzled shared memory (the
wgmma K-major atom of 8 rows x 64 bytes). The padding holds zeros: rows past N are never stored, K past K adds 0.
"""

from __future__ import annotations

from typing import NamedTuple

from flydsl.kernels import validation as check
from flydsl.kernels.gemm.operands import PREPARED_PANEL_BYTES, PREPARED_ROWS

__all__ = ["PreparedWeight", "check_prepared", "prepare_weight", "prepared_shape"]


class PreparedWeight(NamedTuple):
    """fp8 weights from :func:`prepare_weight`: ``data`` the (ceil(N / 8), ceil(K / 64), 8, 64) blocks, ``k`` and
    ``n`` the extents of the ``b`` (K, N) they were made from. Pass it as ``fp8_gemm``'s ``b``."""

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
        blocks, panels = self.data.shape[:2]
        rows = self.data.permute(0, 2, 1, 3).reshape(blocks * PREPARED_ROWS, panels * PREPARED_PANEL_BYTES)
        return rows[: self.n, : self.k].contiguous().t()


def prepared_shape(k: int, n: int) -> tuple[int, int, int, int]:
    """The blocks' shape of a (K, N) weight."""
    return (-(-n // PREPARED_ROWS), -(-k // PREPARED_PANEL_BYTES), PREPARED_ROWS, PREPARED_PANEL_BYTES)


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
    blocks, panels, rows, panel = prepared_shape(k, n)
    padded = torch.zeros((blocks * rows, panels * panel), dtype=torch.uint8, device=b.device)
    padded[:n, :k] = b.t().view(torch.uint8)
    data = padded.view(blocks, rows, panels, panel).permute(0, 2, 1, 3).contiguous().view(b.dtype)
    return PreparedWeight(data, k, n)


def check_prepared(who: str, b: PreparedWeight, out=None):
    """``b``'s blocks as :func:`prepare_weight` makes them (an fp8 torch tensor of :func:`prepared_shape`,
    contiguous; read for its geometry only: fake tensors too) and not ``out``'s memory. Returns a (K, N) meta tensor
    of its dtype that stands for ``b`` in the shape checks of ``fp8_gemm``."""
    import torch

    data = check.torch_tensor(who, "b.data", b.data)
    check.check_dtype(who, "b.data", check.torch_dtype(data.dtype), check.FP8_DTYPES)
    expected = prepared_shape(b.k, b.n)
    if tuple(data.shape) != expected or not data.is_contiguous():
        raise ValueError(
            f"{who}: b: a PreparedWeight of ({b.k}, {b.n}) holds contiguous blocks of shape"
            f" {expected} (from prepare_weight), got shape {tuple(data.shape)} strides {tuple(data.stride())}"
        )
    if out is not None and out.device.type != "meta":
        check.not_aliased(who, "out", check.tensor_addresses(out), ("b", check.tensor_addresses(data)))
    return torch.empty((b.k, b.n), dtype=data.dtype, device="meta")
