"""Drop-in ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm`` running FlyDSL's kernels.

They subclass torch's modules: same constructor, parameters and ``state_dict`` (checkpoints load both ways) and
``isinstance(m, torch.nn.LayerNorm)`` holds. ``forward`` runs the FlyDSL kernels on CUDA tensors of float32, float16
or bfloat16 and falls back to torch's own implementation on anything else (CPU tensors, float64), so that a model
keeps working off the GPU.
"""

from __future__ import annotations

import torch
from flydsl.torch import functional as F
from flydsl.torch.ops import DTYPES
from torch import Tensor

__all__ = ["LayerNorm", "RMSNorm"]


def _ours(input: Tensor) -> bool:
    return input.is_cuda and input.dtype in DTYPES


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None,
    dtype=None)`` whose forward runs ``torch.ops.flydsl.layer_norm`` on CUDA tensors (torch's otherwise)."""

    def forward(self, input: Tensor) -> Tensor:
        if not _ours(input):
            return super().forward(input)
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None)`` whose
    forward runs ``torch.ops.flydsl.rms_norm`` on CUDA tensors (torch's otherwise).

    ``forward(input, residual)`` adds the residual first and returns ``(rms_norm(input + residual), input +
    residual)`` in one pass (``torch.ops.flydsl.fused_add_rms_norm``), as pre-norm transformer blocks use it."""

    def forward(self, input: Tensor, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if residual is None:
            if not _ours(input):
                return super().forward(input)
            return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)
        if not (_ours(input) and _ours(residual)):
            residual_out = input + residual
            return super().forward(residual_out), residual_out
        return F.fused_add_rms_norm(input, residual, self.normalized_shape, self.weight, self.eps)
