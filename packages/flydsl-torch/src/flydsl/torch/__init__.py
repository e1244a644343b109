"""FlyDSL kernels for PyTorch: ``torch.ops.flydsl.*`` (registered on import), ``flydsl.torch.functional`` and the
drop-in modules of ``flydsl.torch.nn``. See docs/torch.md."""

from flydsl.torch import attention, autograd, functional, moe, nn, ops
from flydsl.torch._registry import registered_ops
from flydsl.torch.functional import fused_add_rms_norm, layer_norm, linear, rms_norm, softmax

__all__ = [
    "attention",
    "autograd",
    "functional",
    "moe",
    "nn",
    "ops",
    "registered_ops",
    "softmax",
    "layer_norm",
    "rms_norm",
    "fused_add_rms_norm",
    "linear",
]
