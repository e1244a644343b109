"""Drop-in ``torch.nn.LayerNorm``, ``torch.nn.RMSNorm`` and ``torch.nn.Linear`` running FlyDSL's kernels,
``Fp8Linear`` and ``MoE``.

The drop-ins subclass torch's modules: same constructor, parameters and ``state_dict`` (checkpoints load both ways)
and ``isinstance(m, torch.nn.LayerNorm)`` holds. ``forward`` runs the FlyDSL kernels on CUDA tensors of float32,
float16 or bfloat16 (``Linear``: bfloat16 or float16 of the weight's dtype) and falls back to torch's own
implementation on anything else (CPU tensors, float64), so that a model keeps working off the GPU. ``Fp8Linear``
replaces an ``nn.Linear`` for inference with fp8 weights; ``MoE`` is a mixture-of-experts block for inference,
bf16/fp16 or fp8, that loads Hugging Face checkpoints (Mixtral, Qwen-MoE, DeepSeek-V3's fp8 experts).
"""

from __future__ import annotations

import torch
from flydsl.torch import functional as F
from flydsl.torch import ops
from flydsl.torch._fixed_dtypes import FixedDtypeBuffers
from flydsl.torch.moe_layer import MoE
from flydsl.torch.ops import DTYPES
from torch import Tensor

__all__ = ["Fp8Linear", "LayerNorm", "Linear", "MoE", "RMSNorm"]


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


class Linear(torch.nn.Linear):
    """``torch.nn.Linear(in_features, out_features, bias=True, device=None, dtype=None)`` whose forward runs the
    FlyDSL GEMM (``flydsl.torch.functional.linear``: the weight read in place) on CUDA bfloat16/float16 inputs of the
    weight's dtype (torch's otherwise)."""

    def forward(self, input: Tensor) -> Tensor:
        weight = self.weight
        if not (input.is_cuda and input.dtype in _GEMM_DTYPES and weight.dtype == input.dtype):
            return super().forward(input)
        return F.linear(input, weight, self.bias)


_GEMM_DTYPES = (torch.bfloat16, torch.float16)


class Fp8Linear(FixedDtypeBuffers):
    """An ``nn.Linear`` for inference on fp8: ``y = x @ W.t() + bias`` with W quantized to e4m3 once, per output
    channel (``weight``: the (out, in) float8_e4m3fn matrix; with ``prepared=True`` laid out once as the
    (ceil(in / 128), out, 128) K panels of ``flydsl.kernels.gemm.prepare_weight``: no faster overall on the H200,
    docs/kernels-zoo.md#prepared-weights), with ``weight_scale`` (1, out) float32 (buffers: a ``state_dict``
    holds them); the activations quantized on the fly by one fused kernel, per token (``granularity="token"``, the
    default) or per tensor; both feed ``torch.ops.flydsl.fp8_gemm_prepared`` (or ``fp8_gemm``), whose output has
    x's dtype (bf16 or fp16; float32 inputs give float32). ``granularity="block"`` is DeepSeek-V3's recipe: W per
    128 x 128 block (``weight_scale`` (ceil(out / 128), ceil(in / 128))), x per 1 x 128 group, through
    ``torch.ops.flydsl.blockscale_gemm`` (plain weights only). ``forward(x, scale)`` takes x already quantized (fp8,
    with its float32 scale: per token, per tensor, or per group (rows, ceil(in / 128)) for "block"). Works under
    ``torch.compile(fullgraph=True)`` and CUDA graph capture; off the GPU it computes the same product from the
    dequantized operands.

        layer = Fp8Linear.from_linear(torch.nn.Linear(4096, 14336, device="cuda", dtype=torch.bfloat16))
        y = layer(x)                      # x (..., 4096) bf16 -> y (..., 14336) bf16

    ``.to(dtype)`` casts the bias only: ``weight`` and ``weight_scale`` keep their dtypes.
    """

    fixed_dtype_buffers = ("weight", "weight_scale")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        granularity="token",
        prepared: bool = False,
    ):
        super().__init__()
        linear = torch.nn.Linear(in_features, out_features, bias, device=device, dtype=dtype or torch.bfloat16)
        self._adopt(linear, granularity, prepared)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, granularity: str = "token", prepared: bool = False) -> Fp8Linear:
        """An Fp8Linear of ``linear``'s weights (quantized per output channel) and bias (kept in its dtype)."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._adopt(linear, granularity, prepared)
        return layer

    def _adopt(self, linear: torch.nn.Linear, granularity: str, prepared: bool) -> None:
        """``linear``'s shape, its weights quantized into the fp8 buffers and a copy of its bias (no gradient)."""
        from flydsl.kernels.gemm.prepared import prepared_shape

        if granularity not in ("token", "tensor", "block"):
            raise ValueError(f"Fp8Linear: granularity: expected 'token', 'tensor' or 'block', got {granularity!r}")
        if granularity == "block" and prepared:
            raise ValueError("Fp8Linear: prepared: granularity 'block' takes plain weights (prepared=False)")
        self.in_features, self.out_features, self.granularity = linear.in_features, linear.out_features, granularity
        self.prepared = prepared
        weight = linear.weight.detach()
        shape = prepared_shape(*weight.shape[::-1]) if prepared else weight.shape
        self.register_buffer("weight", torch.empty(shape, dtype=torch.float8_e4m3fn, device=weight.device))
        blocks = (-(-weight.shape[0] // 128), -(-weight.shape[1] // 128))
        scale_shape = blocks if granularity == "block" else (1, weight.shape[0])
        self.register_buffer("weight_scale", torch.empty(scale_shape, dtype=torch.float32, device=weight.device))
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.load_weight(weight)

    @torch.no_grad()
    def load_weight(self, weight: Tensor) -> None:
        """Quantizes ``weight`` (out, in), in any float dtype, into ``weight`` (prepared where the layer is) and
        ``weight_scale`` (per output channel, each row's amax / 448; or per 128 x 128 block)."""
        from flydsl.kernels.gemm import prepare_weight
        from flydsl.kernels.quantize.api import quantize_blocks

        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"Fp8Linear: weight: expected shape {(self.out_features, self.in_features)}, got {tuple(weight.shape)}"
            )
        quantized = self.weight if not self.prepared else torch.empty_like(weight, dtype=torch.float8_e4m3fn)
        per = "block" if self.granularity == "block" else "channel"
        if weight.is_cuda:
            w = weight if weight.dtype in DTYPES else weight.float()
            torch.ops.flydsl.quantize_fp8_out(w, per, torch.float8_e4m3fn, quantized, self.weight_scale)
        elif per == "block":  # the same torch ops as the GPU's block quantizer
            q, scale = quantize_blocks(weight.float(), torch.float8_e4m3fn, "e4m3")
            quantized.copy_(q)
            self.weight_scale.copy_(scale)
        else:  # the same quantization in torch (CPU modules, before .cuda())
            w = weight.float()
            scale = w.abs().amax(dim=1) / 448.0
            quantized.copy_((w / scale.clamp(min=1e-30)[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
            self.weight_scale.copy_(scale[None, :])
        if self.prepared:
            self.weight.copy_(prepare_weight(quantized.t()).data)

    def dense_weight(self) -> Tensor:
        """The quantized weights as the (out, in) fp8 matrix (the prepared panels laid out back)."""
        from flydsl.kernels.gemm.prepared import PreparedWeight

        if not self.prepared:
            return self.weight
        return PreparedWeight(self.weight, self.in_features, self.out_features).unprepared().t()

    def dequantized_weight(self) -> Tensor:
        """The weights as float32 (out, in): the fp8 values times their scales."""
        w = self.dense_weight().float()
        if self.granularity != "block":
            return w * self.weight_scale.t()
        return w * _expanded(self.weight_scale, w.shape, 128)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None},"
            f" granularity={self.granularity}, prepared={self.prepared}"
        )

    def forward(self, x: Tensor, scale: Tensor | None = None) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Fp8Linear: x: expected a last dim of {self.in_features}, got shape {tuple(x.shape)}")
        fp8 = x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        if fp8 != (scale is not None):
            raise ValueError("Fp8Linear: pass scale with an fp8 x (pre-quantized), and only then")
        leading = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        out_dtype = self.bias.dtype if fp8 and self.bias is not None else (torch.bfloat16 if fp8 else x.dtype)
        block = self.granularity == "block"
        if not x.is_cuda:  # the same product from the dequantized operands
            a = rows.float() * _per_column(scale, rows.shape, block) if fp8 else rows.float()
            y = a @ self.dequantized_weight().t()
            y = y if self.bias is None else y + self.bias.float()
            return y.to(out_dtype).reshape(*leading, self.out_features)
        if fp8:
            a8, scale_a = rows, scale.reshape(rows.shape[0], -1) if scale.numel() > 1 or block else scale
        else:
            a8, scale_a = F.quantize_fp8(rows, "group" if block else self.granularity, torch.float8_e4m3fn)
        if block:
            y = F.blockscale_gemm(a8, self.weight.t(), scale_a, self.weight_scale, self.bias, None, out_dtype)
        elif self.prepared:
            y = ops.fp8_gemm_prepared.call(
                a8, self.weight, self.out_features, scale_a, self.weight_scale, self.bias, None, out_dtype
            )
        else:
            y = F.fp8_gemm(a8, self.weight.t(), scale_a, self.weight_scale, self.bias, None, out_dtype)
        return y.reshape(*leading, self.out_features)


def _per_column(scale: Tensor, shape, block: bool) -> Tensor:
    """A pre-quantized x's float32 scales broadcast over its (rows, in) values: per row or tensor, or per 1 x 128
    group (``block``)."""
    if not block:
        return scale.reshape(-1, 1).float()
    return _expanded(scale.reshape(shape[0], -1).float(), shape, 1)


def _expanded(scales: Tensor, shape, rows_per_scale: int) -> Tensor:
    """Block scales over a ``shape`` (rows, cols) matrix, one per ``rows_per_scale`` x 128 block (partial blocks at
    the edges), expanded to one per element."""
    return scales.repeat_interleave(rows_per_scale, 0).repeat_interleave(128, 1)[: shape[0], : shape[1]]
