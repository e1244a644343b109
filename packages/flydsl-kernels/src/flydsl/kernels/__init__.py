"""FlyDSL kernel zoo: row kernels (softmax, LayerNorm, RMSNorm, fused residual-add + RMSNorm) over 2-D tensors, and
the Hopper GEMM (:mod:`flydsl.kernels.gemm`).

    from flydsl.kernels import softmax, layer_norm, rms_norm
    y = softmax(x)                                   # x: (rows, N) torch tensor on the GPU
    from flydsl.kernels.gemm import gemm
    c = gemm(a, b, bias=bias, activation="gelu")     # bf16/fp16 a (M, K), b (K, N)

See :mod:`flydsl.kernels.norms` for the contract and ``docs/kernels-zoo.md`` for regimes, tolerances and numbers;
``docs/gemm-tutorial.md`` for the GEMM.
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
