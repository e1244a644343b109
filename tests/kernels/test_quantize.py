"""quantize_fp8 without a GPU: its kernel's PTX for each mode (the saturating fp8 conversion, 8-byte stores of 16-bit
rows, the amax's red.max) and the argument checks."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.quantize.kernels import QuantizeSpec, quantize_rows_kernel
from flydsl.kernels.rows.layout import forward_row_config


@pytest.mark.parametrize(
    "n,dtype,mode,store",
    [
        (4096, "bf16", "row", "st.global.v4.b16"),
        (4096, "f32", "cast", "st.global.v2.b16"),
        (65536, "bf16", "row", "st.global.v4.b16"),
    ],
)
def test_quantize_kernel_casts_with_the_hardware_conversion(n, dtype, mode, store):
    cfg = forward_row_config(n, dtype)
    specs = (flyc.TensorSpec((64, n), dtype), flyc.TensorSpec((64, n), "i8"))
    specs += (flyc.TensorSpec((64,), "f32"), flyc.TensorSpec((1,), "i32"))
    ptx = quantize_rows_kernel.lower(*specs, cfg, QuantizeSpec(mode)).ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert store in ptx  # a chunk of 16-bit rows leaves as one 8-byte store
    assert ("red.relaxed.gpu.global.max.u32" in ptx) == (mode == "amax")


def test_the_amax_pass_only_reads():
    cfg = forward_row_config(7168, "bf16")
    specs = (flyc.TensorSpec((64, 7168), "bf16"), flyc.TensorSpec((64, 7168), "i8"))
    specs += (flyc.TensorSpec((64,), "f32"), flyc.TensorSpec((1,), "i32"))
    ptx = quantize_rows_kernel.lower(*specs, cfg, QuantizeSpec("amax", "e5m2")).ptx
    assert "red.relaxed.gpu.global.max.u32" in ptx and not re.search(r"st\.global", ptx)


def test_quantize_spec_is_checked():
    with pytest.raises(ValueError, match="mode must be row, amax or cast"):
        QuantizeSpec("block")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(granularity="group"), r"quantize_fp8: granularity: expected one of \('tensor', 'token', 'channel'\)"),
        (dict(dtype="int8"), r"quantize_fp8: dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got int8"),
        (dict(), r"quantize_fp8: x: expected a CUDA tensor, got one on cpu"),
    ],
)
def test_quantize_arguments_are_refused_naming_them(kwargs, message):
    torch = pytest.importorskip("torch")
    from flydsl.kernels.quantize import quantize_fp8

    with pytest.raises((TypeError, ValueError), match=message):
        quantize_fp8(torch.ones(4, 64), **kwargs)
