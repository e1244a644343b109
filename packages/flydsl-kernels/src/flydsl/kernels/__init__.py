"""FlyDSL kernel zoo: row kernels (softmax, LayerNorm, RMSNorm, fused residual-add + RMSNorm) over 2-D tensors.

    from flydsl.kernels import softmax, layer_norm, rms_norm
    y = softmax(x)                                   # x: (rows, N) torch tensor on the GPU

See :mod:`flydsl.kernels.norms` for the contract and ``docs/kernels-zoo.md`` for regimes, tolerances and numbers.
"""

from flydsl.kernels.norms import (
    fused_add_rms_norm,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
    softmax,
    softmax_backward,
)

__all__ = [
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "fused_add_rms_norm",
]
