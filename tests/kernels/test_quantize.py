"""quantize_fp8 without a GPU: its kernels' PTX for each mode (the saturating fp8 conversion, 8-byte stores of 16-bit
rows, the amax's red.max, the group kernel's butterfly over a group's threads, assembled for sm_90a without spills),
the argument checks, and the torch references of the group and block scales (used by test_quantize_gpu.py) against
the block quantizer on the CPU."""

from __future__ import annotations

import math
import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.quantize.groups import GroupConfig, group_config, quantize_groups_kernel
from flydsl.kernels.quantize.kernels import QuantizeSpec, quantize_row_config, quantize_rows_kernel
from flydsl.kernels.rows.layout import forward_row_config

from .ptxas_report import spill_bytes

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


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


@pytest.mark.parametrize(
    "n,dtype,threads,chunks",
    [(18432, "bf16", 512, 5), (24576, "bf16", 512, 6), (24584, "bf16", 1024, 4), (18432, "f32", 1024, 5)],
)
def test_rows_of_1024_threads_take_512_where_each_holds_few_chunks(n, dtype, threads, chunks):
    """quantize_row_config: a row of up to 6 chunks per thread on 512 threads (N = 18432 bf16: 1024 threads x 3
    chunks ran 0.88 of a copy, 512 x 5 1.00); otherwise the row kernels' configuration. No spills either way."""
    cfg = quantize_row_config(n, dtype)
    assert (cfg.threads_per_row, cfg.chunks, cfg.cluster) == (threads, chunks, 1)
    assert cfg.threads_per_row * cfg.chunks * cfg.vec >= n
    specs = (flyc.TensorSpec((64, n), dtype), flyc.TensorSpec((64, n), "i8"))
    specs += (flyc.TensorSpec((64,), "f32"), flyc.TensorSpec((1,), "i32"))
    if flyc.toolchain.find_ptxas() is not None:
        assert spill_bytes(quantize_rows_kernel.lower(*specs, cfg, QuantizeSpec("row")).ptx) == 0


def test_quantize_spec_is_checked():
    with pytest.raises(ValueError, match="mode must be row, amax or cast"):
        QuantizeSpec("block")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(granularity="row"),
            r"quantize_fp8: granularity: expected one of \('tensor', 'token', 'channel', 'group', 'block'\)",
        ),
        (dict(dtype="int8"), r"quantize_fp8: dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got int8"),
        (dict(), r"quantize_fp8: x: expected a CUDA tensor, got one on cpu"),
    ],
)
def test_quantize_arguments_are_refused_naming_them(kwargs, message):
    torch = pytest.importorskip("torch")
    from flydsl.kernels.quantize import quantize_fp8

    with pytest.raises((TypeError, ValueError), match=message):
        quantize_fp8(torch.ones(4, 64), **kwargs)


# --- the group kernel -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,n,fmt,power_of_two,load,store",
    [
        ("bf16", 7168, "e4m3", False, "ld.global.v4.b32", "st.global.v4.b16"),
        ("f16", 144, "e5m2", True, "ld.global.v4.b32", "st.global.v4.b16"),  # a last group of 16 columns
        ("f32", 272, "e4m3", False, "ld.global.v4.b32", "st.global.v2.b16"),  # two groups and 16 columns
        ("bf16", 100, "e4m3", False, "ld.global.b16", "st.global.b8"),  # N % 8 != 0: element accesses
    ],
)
def test_group_kernel_reduces_over_a_groups_threads_and_assembles(dtype, n, fmt, power_of_two, load, store):
    """Each of a thread's ``unroll`` groups: one 16-byte load (or element loads), a butterfly of shuffles over the
    group's 16 (float32: 32) threads, the hardware's saturating conversion and one scale store; the factor a true
    division (a power of two's: its reciprocal), never an approximate one; no spills on sm_90a."""
    cfg = group_config(n, dtype, fmt, power_of_two)
    rows, groups = 130, -(-n // 128)
    specs = (flyc.TensorSpec((rows, n), dtype), flyc.TensorSpec((rows, n), "i8"))
    specs += (flyc.TensorSpec((rows, groups), "f32", strides=(1, 132)),)  # M-major, rows padded to 4
    module = quantize_groups_kernel.lower(*specs, cfg)
    ptx = module.ptx
    assert f"cvt.rn.satfinite.{fmt}x2.f32" in ptx
    shuffles = re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+), (\d+), -1;", ptx)
    offsets = [cfg.lanes >> (k + 1) for k in range(int(math.log2(cfg.lanes)))]  # 8, 4, 2, 1 (float32: 16 first)
    assert [int(offset) for offset, _ in shuffles] == offsets * cfg.unroll
    assert {int(clamp) for _, clamp in shuffles} == {((32 - cfg.lanes) << 8) | 0x1F}  # segments of a group's lanes
    assert set(re.findall(r"ld\.global[.\w]*", ptx)) == {load}
    assert store in ptx and len(re.findall(r"st\.global\.b32\b", ptx)) == cfg.unroll  # one scale per group
    assert not re.search(r"div\.(approx|full)", ptx)
    assert ("rcp.rn.f32" in ptx) == power_of_two and ("div.rn.f32" in ptx) != power_of_two
    if flyc.toolchain.find_ptxas() is not None:
        assert module.cubin is not None
        assert spill_bytes(ptx) == 0


def test_group_config_is_checked():
    assert (GroupConfig(dtype="bf16", even=True).lanes, GroupConfig(dtype="f32", even=True).lanes) == (16, 32)
    with pytest.raises(ValueError, match="dtype must be f32, f16 or bf16"):
        GroupConfig(dtype="f8", even=True)
    with pytest.raises(ValueError, match="block must be a multiple of 32"):
        GroupConfig(dtype="bf16", even=True, block=48)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(group=64), r"quantize_fp8: group: expected 128 \(the block-scaled GEMM's K block\), got 64"),
        (dict(granularity="token", power_of_two=True), r"quantize_fp8: power_of_two: for granularity 'group' or"),
        (dict(scales=((4, 3), "f32", None)), r"quantize_fp8: scales: expected a \(4, 2\) tensor, M-major"),
        (dict(scales=((4, 2), "f32", (2, 2))), r"scales: .* got shape \(4, 2\) strides \(2, 2\)"),
        (dict(scales=((4, 2), "f32", (1, 2))), r"scales: .* got shape \(4, 2\) strides \(1, 2\)"),  # overlapping
        (dict(scales=((4, 2), "bf16", (1, 4))), r"quantize_fp8: scales: expected dtype float32, got bfloat16"),
        (dict(x=((4, 200), "f32", (100, 1))), r"quantize_fp8: x: rows overlap"),
    ],
)
def test_group_arguments_are_refused_naming_them(kwargs, message):
    """Described tensors (TensorSpec: no memory, taken as on device 0) get as far as the shape checks."""
    from flydsl.kernels.quantize import quantize_fp8

    x = flyc.TensorSpec(*kwargs.pop("x", ((4, 200), "bf16", None)))
    if "scales" in kwargs:
        kwargs["scales"] = flyc.TensorSpec(*kwargs["scales"])
    with pytest.raises((TypeError, ValueError), match=message):
        quantize_fp8(x, kwargs.pop("granularity", "group"), **kwargs)


# --- torch references (the GPU tests' too) -------------------------------------------------------------------------


def reference_scales(amax, fp8_max: float, power_of_two: bool = False):
    """``(scale, factor)`` of float32 amaxes as the quantizer defines them: ``amax * (1 / fp8_max)`` and values
    multiplied by ``fp8_max / max(amax, 1e-30)`` (a division of tensors: torch's ``scalar / tensor`` is a reciprocal
    and a product); or the scale rounded up to a power of two (exactly, by frexp: not the kernels' bit trick), at
    least 2^-126, and its inverse."""
    import torch

    scale = amax * (1.0 / fp8_max)
    if not power_of_two:
        return scale, torch.full_like(amax, fp8_max) / amax.clamp(min=1e-30)
    mantissa, exponent = torch.frexp(scale)  # scale = mantissa * 2^exponent, mantissa in [0.5, 1)
    up = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).int()).clamp(min=2.0**-126)
    scale = torch.where((scale > 0) & scale.isfinite(), up, scale)  # zeros, infinity and NaN stay
    return scale, scale.clamp(min=2.0**-126).reciprocal()


def reference_quantize(x, rows_per_scale: int, dtype, power_of_two: bool = False):
    """``(x_fp8, scales)`` of ``x`` (rows, N) per ``rows_per_scale`` (1: groups, 128: blocks) x 128 elements, zeros
    padded to whole tiles, by the definition: values times the factor of :func:`reference_scales`, clamped to the
    finite range, cast by torch (round to nearest even)."""
    import torch.nn.functional as F

    fp8_max = FP8_MAX[str(dtype).removeprefix("torch.")]
    rows, n = x.shape
    tiles_r, tiles_c = -(-rows // rows_per_scale), -(-n // 128)
    padded = F.pad(x.float(), (0, tiles_c * 128 - n, 0, tiles_r * rows_per_scale - rows))
    tiles = padded.view(tiles_r, rows_per_scale, tiles_c, 128)
    amax = tiles.abs().amax(dim=(1, 3))
    scale, factor = reference_scales(amax, fp8_max, power_of_two)
    values = (tiles * factor[:, None, :, None]).clamp(-fp8_max, fp8_max).to(dtype)
    return values.view(tiles_r * rows_per_scale, tiles_c * 128)[:rows, :n], scale


def assert_same_fp8(q, ref) -> None:
    """Equal bytes, and NaN exactly where the reference has NaN (whatever the sign bits)."""
    import torch

    nan = ref.float().isnan()
    assert torch.equal(q.float().isnan(), nan)
    assert torch.equal(q.view(torch.uint8)[~nan], ref.view(torch.uint8)[~nan])


def assert_same_scales(scales, ref) -> None:
    """Equal float32 scales (NaN where the reference has NaN)."""
    import torch

    assert scales.shape == ref.shape and scales.dtype == torch.float32
    assert torch.equal(scales.isnan(), ref.isnan())
    assert torch.equal(scales[~ref.isnan()], ref[~ref.isnan()])


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("shape", [(128, 128), (300, 520), (1, 100)])
def test_block_quantizer_is_the_reference_on_the_cpu(shape, fp8, power_of_two):
    """ "block" is torch ops (quantize_blocks): on CPU tensors too, bit for bit the definition, with a block of
    zeros, a NaN block and magnitudes spread over 2^-40 .. 2^40 (subnormal fp8 values, saturating scales)."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.quantize.api import quantize_blocks

    dtype = getattr(torch, fp8)
    generator = torch.Generator().manual_seed(sum(shape))
    magnitude = 2.0 ** torch.randint(-40, 41, (shape[0], 1), generator=generator).float()
    w = torch.randn(shape, generator=generator) * magnitude
    if shape[0] > 128:
        w[:128, :128] = 0
        w[-1, -1] = float("nan")
    fmt = "e4m3" if fp8 == "float8_e4m3fn" else "e5m2"
    q, scales = quantize_blocks(w, dtype, fmt, power_of_two)
    q_ref, scales_ref = reference_quantize(w, 128, dtype, power_of_two)
    assert q.shape == shape and q.dtype == dtype and scales.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    assert_same_scales(scales, scales_ref)
    assert_same_fp8(q, q_ref)
    if power_of_two:
        finite = scales[scales.isfinite() & (scales > 0)]
        assert (torch.frexp(finite).mantissa == 0.5).all()
    if shape[0] > 128:
        assert scales[0, 0] == 0 and (q[:128, :128].float() == 0).all()
        assert scales[-1, -1].isnan() and q[256:, 512:].float().isnan().all()
