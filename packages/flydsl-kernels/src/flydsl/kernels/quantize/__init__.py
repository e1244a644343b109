"""fp8 quantization (:mod:`.api`: ``quantize_fp8`` and its granularities; :mod:`.kernels`: the fused row kernel;
:mod:`.groups`: the per-group kernel of the block-scaled GEMM's activations)."""

from flydsl.kernels.quantize.api import GRANULARITIES, quantize_fp8

__all__ = ["GRANULARITIES", "quantize_fp8"]
