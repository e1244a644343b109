"""quantize_fp8 on the GPU, on fresh random rows of mixed magnitudes: each value within fp8's rounding of x / scale,
scales amax / fp8_max (per row, or of the whole tensor), rows of zeros scale 0, NaN propagates, every output written
(poisoned allocations cannot be checked: outputs are allocated here, so every element is compared)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.quantize import quantize_fp8  # noqa: E402

_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
_SMALLEST = {torch.float8_e4m3fn: 2.0**-9, torch.float8_e5m2: 2.0**-16}  # subnormal steps


def _rows(rows, n, dtype):
    magnitude = 2.0 ** torch.randint(-8, 9, (rows, 1), device="cuda").float()
    return (torch.randn(rows, n, device="cuda") * magnitude).to(dtype)


def _check(x, q, scales, granularity, fp8):
    xf = x.float()
    amax = xf.abs().amax() if granularity == "tensor" else xf.abs().amax(dim=1)
    expected = amax / _MAX[fp8]
    flat = scales.reshape(-1) if granularity != "tensor" else scales
    torch.testing.assert_close(flat, expected, rtol=1e-6, atol=0)
    per_row = flat.reshape(-1, 1) if granularity != "tensor" else flat
    dequantized = q.float() * per_row
    bound = xf.abs() * 2.0 ** -(_MANTISSA[fp8] + 1) * 1.0001 + per_row * _SMALLEST[fp8]
    assert ((dequantized - xf).abs() <= bound).all()


@pytest.mark.parametrize("granularity", ["token", "channel", "tensor"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,n", [(1, 7), (64, 4096), (33, 7168), (3, 65536), (5, 100)])
def test_quantize_fp8(granularity, dtype, rows, n):
    x = _rows(rows, n, dtype)
    q, scales = quantize_fp8(x, granularity)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and scales.dtype == torch.float32
    assert scales.shape == {"token": (rows, 1), "channel": (1, rows), "tensor": ()}[granularity]
    _check(x, q, scales, granularity, torch.float8_e4m3fn)


@pytest.mark.parametrize("granularity", ["token", "tensor"])
def test_quantize_e5m2(granularity):
    x = _rows(48, 2048, torch.bfloat16)
    q, scales = quantize_fp8(x, granularity, dtype=torch.float8_e5m2)
    assert q.dtype == torch.float8_e5m2
    _check(x, q, scales, granularity, torch.float8_e5m2)


def test_strided_rows_zeros_and_nan():
    base = _rows(16, 3000, torch.bfloat16)
    x = base[:, :2048]  # a row stride of 3000
    x[2] = 0
    x[5, 17] = float("nan")
    q, scales = quantize_fp8(x, "token")
    torch.cuda.synchronize()
    assert scales[2, 0] == 0 and (q[2].float() == 0).all()
    assert scales[5, 0].isnan() and q[5].float().isnan().all()
    keep = torch.ones(16, dtype=torch.bool, device="cuda")
    keep[5] = False
    _check(x[keep], q[keep], scales[keep], "token", torch.float8_e4m3fn)
    _, tensor_scale = quantize_fp8(x, "tensor")
    assert tensor_scale.isnan()


def test_quantized_operands_feed_fp8_gemm():
    """The quantizer's scales are the fp8 GEMM's: token scales for a, channel scales for w.t()."""
    from flydsl.kernels.gemm import fp8_gemm

    x, w = _rows(200, 1024, torch.bfloat16), _rows(384, 1024, torch.bfloat16)
    a8, scale_a = quantize_fp8(x, "token")
    w8, scale_w = quantize_fp8(w, "channel")
    out = fp8_gemm(a8, w8.t(), scale_a, scale_w)
    ref = x.double() @ w.double().t()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 6e-2  # two fp8 roundings of 2^-4 each
