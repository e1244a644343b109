"""FlyDSL's kernel zoo: row kernels (softmax, LayerNorm, RMSNorm, fused residual-add + RMSNorm) over 2-D tensors,
forward and backward, and the Hopper GEMM (:mod:`flydsl.kernels.gemm`).

    from flydsl.kernels import softmax, layer_norm, rms_norm
    y = softmax(x)                                   # x: (rows, N) torch tensor on the GPU
    from flydsl.kernels.gemm import gemm
    c = gemm(a, b, bias=bias, activation="gelu")     # bf16/fp16 a (M, K), b (K, N)

Which kernel runs for an input: ``python -m flydsl.kernels.route layer_norm 4096 --dtype bf16``. The contracts and
numbers: ``docs/kernels-zoo.md``; the layout of this package: ``docs/architecture.md``.
"""

from flydsl.kernels.norms import fused_add_rms_norm, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from flydsl.kernels.softmax import softmax, softmax_backward

# The zoo's functions and classes are keyed by its sources' hash in every kernel's cache key, not walked again per
# kernel (flydsl.compiler.fingerprint): its modules keep no state that a kernel reads and that changes at run time.
__flydsl_key_by_stamps__ = True

__all__ = [
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "fused_add_rms_norm",
]
