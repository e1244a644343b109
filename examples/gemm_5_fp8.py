"""GEMM tutorial, step 5: fp8 operands with float32 scales in the epilogue (``flydsl.kernels.gemm.fp8_gemm``,
docs/gemm-tutorial.md).

Same interface as steps 1-4 (bf16 a and b in, float32 c out); this step quantizes both operands to e4m3 first and
multiplies them on the fp8 tensor cores, twice the rate of bf16. The one idea it adds to step 4:

* **Scales in the epilogue.** e4m3 holds 3 mantissa bits and magnitudes up to 448, so each row of A (a token) and
  each row of the weights W = B^T (an output channel) is divided by its own ``amax / 448`` before the cast
  (``quantize_fp8``: one fused pass, amax then cast). The kernel multiplies the fp8 values as they are, accumulates
  in float32, and the epilogue multiplies each accumulator by ``scale_a[row] * scale_w[col]`` before the store:
  ``c = (scale_a * A8) @ (W8 * scale_w)^T``, the dequantized product. The mainloop is step 4's, with K steps of
  128 fp8 elements (one 128-byte swizzled row, the same bytes per stage as bf16's 64) and ``m64nNk32`` wgmmas;
  fp8 wgmma reads both operands K-major, which an nn.Linear weight W (N, K) already is (``b = W.t()``).

The price is precision: two fp8 roundings (2^-4 relative each) leave a relative error of a few percent against the
bf16 product, which is what fp8 inference accepts.

    python examples/gemm_5_fp8.py                  # CPU: compile and summarize; GPU: check and time
    python examples/gemm_5_fp8.py --m 4096 --n 4096 --k 4096
"""

from __future__ import annotations

import sys

from gemm_1_naive import check_operands, run_example

from flydsl.kernels.gemm import MatrixSpec, Scale, fp8_gemm, plan_gemm  # pip install packages/flydsl-kernels
from flydsl.kernels.quantize import quantize_fp8

TOLERANCE = 6e-2  # two fp8 roundings


def matmul(a, b, c) -> None:
    """c = a @ b through fp8: a (M, K) and b (K, N) bf16, c (M, N) float32, row-major CUDA tensors; K a multiple of
    16 (fp8_gemm says so otherwise), N of 8. ``a`` is quantized per row (token), ``b`` per column (the weights'
    output channel)."""
    check_operands(a, b, c, k_multiple=8)
    a8, scale_a = quantize_fp8(a, "token")  # a ~ a8 * scale_a, scale_a (M, 1)
    w8, scale_w = quantize_fp8(b.t().contiguous(), "channel")  # W = b^T (N, K) ~ w8 * scale_w^T, scale_w (1, N)
    fp8_gemm(a8, w8.t(), scale_a, scale_w, c)


def lower(m: int, n: int, k: int):
    """What ``fp8_gemm`` launches for a row-major (M, K) e4m3 A and nn.Linear-style weights (B = W.t(), K-major),
    per-token and per-channel scales, a float32 C (register stores)."""
    a = MatrixSpec.dense((m, k), "f8E4M3FN")
    b = MatrixSpec.dense((n, k), "f8E4M3FN").transposed()
    scales = ((Scale(rows=1), MatrixSpec.dense((m,), "f32")), (Scale(columns=1), MatrixSpec.dense((n,), "f32")))
    plan = plan_gemm(a, b, MatrixSpec.dense((m, n), "f32"), sms=132, scales=scales)
    (compiled,) = plan.lower()
    return compiled


PATTERNS = (
    r"cp\.async\.bulk\.tensor",
    r"wgmma\.mma_async.*\.e4m3\.e4m3",
    r"setmaxnreg",
    r"st\.global",
)


def main(argv=None) -> int:
    return run_example(__doc__, "gemm_ws_scaled", lower, matmul, PATTERNS, argv, (1000, 776, 528), TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
