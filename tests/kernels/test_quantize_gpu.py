"""quantize_fp8 on the GPU, on fresh random rows of mixed magnitudes: each value within fp8's rounding of x / scale,
scales amax / fp8_max (per row, or of the whole tensor), rows of zeros scale 0, NaN propagates, every output written
(poisoned allocations cannot be checked: outputs are allocated here, so every element is compared). Per group and
per block: bit for bit the definition (test_quantize.reference_quantize), in both scale layouts, with given outputs
poisoned first."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.quantize import quantize_fp8  # noqa: E402

from .test_quantize import assert_same_fp8, assert_same_scales, reference_quantize  # noqa: E402

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
@pytest.mark.parametrize("rows,n", [(1, 7), (64, 4096), (33, 7168), (6, 18440), (3, 65536), (5, 100)])
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


# --- "group" (1 x 128) and "block" (128 x 128) ----------------------------------------------------------------------

GROUP_SHAPES = [(rows, n) for rows in (1, 3, 130) for n in (128, 144, 7168, 16 * 17)]


def _grouped(rows, n, dtype, spread=8):
    """Rows whose 128-wide groups have magnitudes of their own (2^-spread .. 2^spread), so that every group's scale
    differs from its row's."""
    groups = -(-n // 128)
    magnitude = 2.0 ** torch.randint(-spread, spread + 1, (rows, groups), device="cuda").float()
    return (torch.randn(rows, n, device="cuda") * magnitude.repeat_interleave(128, dim=1)[:, :n]).to(dtype)


def _m_major(rows, groups, fill=float("nan")):
    """M-major group scales as the GEMM takes them: a (groups, rows padded to 4) buffer's transposed view."""
    buffer = torch.full((groups, -(-rows // 4) * 4), fill, device="cuda")
    return buffer, buffer[:, :rows].t()


def _check_groups(x, q, scales, fp8, power_of_two=False):
    """Bit for bit the definition (test_quantize.reference_quantize), and each value within fp8's rounding of
    x / scale: the reference's semantics, checked apart from its arithmetic."""
    q_ref, scales_ref = reference_quantize(x, 1, fp8, power_of_two)
    torch.cuda.synchronize()
    assert q.dtype == fp8 and q.shape == x.shape and q.is_contiguous()
    assert_same_scales(scales, scales_ref)
    assert_same_fp8(q, q_ref)
    finite = scales.isfinite().repeat_interleave(128, dim=1)[:, : x.shape[1]]
    per_value = scales.repeat_interleave(128, dim=1)[:, : x.shape[1]]
    xf, dequantized = x.float(), q.float() * per_value
    bound = xf.abs() * 2.0 ** -(_MANTISSA[fp8] + 1) * 1.0001 + per_value * _SMALLEST[fp8]
    assert ((dequantized - xf).abs() <= bound)[finite].all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,n", GROUP_SHAPES)
def test_quantize_fp8_group(rows, n, dtype):
    x = _grouped(rows, n, dtype)
    q, scales = quantize_fp8(x, "group")
    groups, padded = -(-n // 128), -(-rows // 4) * 4
    assert scales.shape == (rows, groups) and scales.stride() == (1, padded)  # M-major, rows padded to 16 bytes
    assert scales.untyped_storage().nbytes() == groups * padded * 4
    _check_groups(x, q, scales, torch.float8_e4m3fn)


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("rows,n", [(3, 144), (130, 7168), (1, 16 * 17)])
def test_quantize_fp8_group_e5m2(rows, n, power_of_two):
    x = _grouped(rows, n, torch.bfloat16, spread=20)
    q, scales = quantize_fp8(x, "group", dtype=torch.float8_e5m2, power_of_two=power_of_two)
    _check_groups(x, q, scales, torch.float8_e5m2, power_of_two)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,n", [(1, 128), (3, 144), (130, 7168), (130, 16 * 17)])
def test_quantize_fp8_group_power_of_two(rows, n, dtype):
    """UE8M0 scales: powers of two, the least >= amax / 448, the values divided by them exactly."""
    x = _grouped(rows, n, dtype, spread=12)
    q, scales = quantize_fp8(x, "group", power_of_two=True)
    _check_groups(x, q, scales, torch.float8_e4m3fn, power_of_two=True)
    assert (torch.frexp(scales).mantissa == 0.5).all()
    exact = reference_quantize(x, 1, torch.float8_e4m3fn)[1]
    assert ((scales >= exact) & (scales < 2 * exact)).all()


def test_group_zeros_nan_and_strided_rows():
    """A row of zeros and a group of zeros: scale 0 and zeros; NaN: its group's scale and values NaN, the rest of
    its row untouched; a row stride of 3000 (16-byte rows still); a partial last group of 16 columns."""
    base = _grouped(16, 3000, torch.bfloat16)
    x = base[:, :400]  # groups of 128, 128, 128 and 16 columns
    x[2] = 0
    x[7, 128:256] = 0
    x[5, 300] = float("nan")
    x[9, 390] = float("nan")  # in the partial last group
    q, scales = quantize_fp8(x, "group")
    _check_groups(x, q, scales, torch.float8_e4m3fn)
    assert (scales[2] == 0).all() and (q[2].float() == 0).all()
    assert scales[7, 1] == 0 and (q[7, 128:256].float() == 0).all() and (scales[7, [0, 2, 3]] > 0).all()
    assert scales[5, 2].isnan() and q[5, 256:384].float().isnan().all() and scales[5, [0, 1, 3]].isfinite().all()
    assert scales[9, 3].isnan() and q[9, 384:].float().isnan().all() and not q[9, :384].float().isnan().any()


def test_group_saturates_and_keeps_subnormals():
    """The group's largest value is exactly fp8_max; values about 2^-16 of it land on e4m3's subnormals (rounded to
    nearest even, as torch does); a single tiny value in a group of zeros is its own amax."""
    x = torch.zeros(4, 256, device="cuda")
    x[0, :128] = torch.linspace(-3.0, 3.0, 128, device="cuda")
    x[1, 128:] = torch.randn(128, device="cuda") * 2.0**-16
    x[1, 130] = 1.0
    x[2, 5] = -1e-20
    q, scales = quantize_fp8(x, "group")
    _check_groups(x, q, scales, torch.float8_e4m3fn)
    assert q[0, 0].float() == -448 and q[0, 127].float() == 448 and q[2, 5].float() == -448
    subnormal = q[1, 128:].float().abs()
    assert ((subnormal > 0) & (subnormal < 2.0**-6)).any()


@pytest.mark.parametrize("layout", ["m_major", "row_major"])
@pytest.mark.parametrize("rows,n", [(3, 144), (130, 7168), (1, 128)])
def test_group_given_outputs_are_written_through_their_strides(layout, rows, n):
    """Given outputs poisoned first (NaN scales, 0x7f bytes): every element written, the M-major buffer's padding
    rows left as they were, the same results as allocated ones."""
    x = _grouped(rows, n, torch.bfloat16)
    groups = -(-n // 128)
    out = torch.full((rows, n), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    if layout == "m_major":
        buffer, scales = _m_major(rows, groups, fill=-7.0)
    else:
        buffer, scales = None, torch.full((rows, groups), -7.0, device="cuda")
    q, s = quantize_fp8(x, "group", out=out, scales=scales)
    assert q is out and s is scales
    _check_groups(x, q, s, torch.float8_e4m3fn)
    q_alloc, s_alloc = quantize_fp8(x, "group")
    torch.cuda.synchronize()
    assert torch.equal(q.view(torch.uint8), q_alloc.view(torch.uint8)) and torch.equal(s, s_alloc)
    if buffer is not None:
        assert (buffer[:, rows:] == -7.0).all()


def test_group_refuses_outputs_of_another_shape_or_dtype():
    x = _grouped(8, 256, torch.bfloat16)
    with pytest.raises(ValueError, match=r"quantize_fp8: scales: expected a \(8, 2\) tensor"):
        quantize_fp8(x, "group", scales=torch.empty(8, 3, device="cuda"))
    with pytest.raises(ValueError, match=r"quantize_fp8: scales: expected a \(8, 2\) tensor.*strides \(1, 4\)"):
        quantize_fp8(x, "group", scales=torch.empty_strided((8, 2), (1, 4), device="cuda"))  # groups overlap rows
    with pytest.raises(TypeError, match=r"quantize_fp8: scales: expected dtype float32, got float16"):
        quantize_fp8(x, "group", scales=torch.empty(8, 2, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"quantize_fp8: out: expected a contiguous \(8, 256\) tensor"):
        quantize_fp8(x, "group", out=torch.empty(8, 128, device="cuda", dtype=torch.float8_e4m3fn))
    xf = x.float()
    with pytest.raises(ValueError, match=r"quantize_fp8: scales: overlaps x"):
        quantize_fp8(xf, "group", scales=xf[:, :2])


def test_group_empty_inputs():
    q, scales = quantize_fp8(torch.empty(0, 256, device="cuda"), "group")
    assert q.shape == (0, 256) and scales.shape == (0, 2)
    q, scales = quantize_fp8(torch.empty(5, 0, device="cuda"), "group")
    assert q.shape == (5, 0) and scales.shape == (5, 0)


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(128, 128), (300, 7168), (130, 16 * 17), (1, 100)])
def test_quantize_fp8_block(shape, dtype, power_of_two):
    w = _grouped(*shape, dtype)
    if shape[0] > 128:
        w[:128, :128] = 0
        w[-1, -1] = float("nan")
    q, scales = quantize_fp8(w, "block", power_of_two=power_of_two)
    q_ref, scales_ref = reference_quantize(w, 128, torch.float8_e4m3fn, power_of_two)
    torch.cuda.synchronize()
    assert q.shape == shape and q.is_contiguous() and scales.is_contiguous()
    assert scales.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    assert_same_scales(scales, scales_ref)
    assert_same_fp8(q, q_ref)
    if shape[0] > 128:
        assert scales[0, 0] == 0 and scales[-1, -1].isnan()


def test_block_given_outputs_and_e5m2():
    w = _grouped(260, 300, torch.bfloat16, spread=20)
    out = torch.full((260, 300), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e5m2)
    scales = torch.full((3, 3), float("nan"), device="cuda")
    q, s = quantize_fp8(w, "block", out=out, scales=scales)
    assert q is out and s is scales
    q_ref, scales_ref = reference_quantize(w, 128, torch.float8_e5m2)
    torch.cuda.synchronize()
    assert_same_scales(s, scales_ref)
    assert_same_fp8(q, q_ref)
    with pytest.raises(ValueError, match=r"quantize_fp8: scales: expected a contiguous \(3, 3\) tensor"):
        quantize_fp8(w, "block", scales=torch.empty(260, 3, device="cuda"))


def test_group_and_block_operands_feed_blockscale_gemm():
    """The quantizer's group scales (M-major) and block scales are the block-scaled GEMM's a_scales and b_scales."""
    from flydsl.kernels.gemm import blockscale_gemm

    x, w = _grouped(200, 1024, torch.bfloat16), _grouped(384, 1024, torch.bfloat16)
    a8, scale_a = quantize_fp8(x, "group")
    w8, scale_w = quantize_fp8(w, "block")
    out = blockscale_gemm(a8, w8.t(), scale_a, scale_w)
    ref = x.double() @ w.double().t()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 6e-2  # two fp8 roundings of 2^-4 each
