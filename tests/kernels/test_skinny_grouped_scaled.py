"""The grouped skinny GEMM on fp8 activations and weights without a GPU (skinny_gemm_grouped_scaled_kernel: fused_moe's
decode stage 1 from two tokens on, x quantized per token): gated and plain, at MoE shapes, lowered to PTX that ptxas
assembles for sm_90a without spills, e4m3 MMAs and nothing converted; its configuration and checks. The numbers:
test_skinny_grouped_scaled_gpu.py."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm.epilogue import Epilogue
from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
from flydsl.kernels.gemm.skinny_grouped import (
    GroupedMode,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_scaled_kernel,
)

from .ptxas_report import ptxas_report
from .test_skinny_grouped_fp8 import FP8, SHAPES, TOP_K, _arguments, _scales

S = flyc.TensorSpec
_MMA = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"


def _fp8_arguments(gated, k, n_out) -> tuple:
    """A stage's tensors with fp8 activations (a) and a bf16 output (c)."""
    a, *rest = _arguments(gated, k, n_out)
    return (S(a.shape, FP8), *rest)


def _lower(gated, k, n_out, cfg=None, arguments=None, a_scale=None, w_scale=None):
    cfg = cfg or choose_grouped_skinny_config(k, gated, 1, quantized=True)
    variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
    arguments = arguments or _fp8_arguments(gated, k, n_out)
    a_scale = a_scale or S((arguments[0].shape[0],), "f32")
    w_scale = w_scale or _scales(gated, k, n_out, False)
    module = skinny_gemm_grouped_scaled_kernel.lower(
        *arguments, w_scale, a_scale, TOP_K if gated else 0, cfg, variant, GroupedMode()
    )
    return module, cfg


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("gated,k,n_out", SHAPES)
def test_grouped_scaled_compiles_without_spills(gated, k, n_out):
    module, cfg = _lower(gated, k, n_out)
    ptx = module.ptx
    assert "griddepcontrol.wait" in ptx and "mul.rn.bf16x2" not in ptx  # nothing converted in registers
    # Pipelined: the first step, the loop's, the last full one's, the K tail's; 2 k32 MMAs per load and n8 tile.
    assert ptx.count(_MMA) == 3 * 2 * cfg.unroll * cfg.groups
    assert ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == 3 * cfg.unroll * cfg.groups
    report = ptxas_report(ptx)
    # the gated stage's 4 tiles x 4 loads hold both operands' next step: 254 registers and one 8-byte spill slot
    # (measured the fastest all the same, choose_grouped_skinny_config); every other shape none
    spill = "8" if gated else "0"
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [(spill, spill)], report


@pytest.mark.parametrize("k", [256, 768, 1024, 2048, 7168, 14336])
@pytest.mark.parametrize("gated", [True, False])
def test_scaled_configuration(k, gated):
    """A gated stage 1 as the weight-only one of several tokens (4 tiles x 4 loads over 4 warps: measured best);
    otherwise a load of fp8 activations holds 16 values of K as a 16-bit weight load holds 8: the 16-bit shapes,
    each step twice the K."""
    quantized, bf16 = choose_grouped_skinny_config(k, gated, 1, quantized=True), choose_grouped_skinny_config(k, gated)
    if gated:
        assert quantized == SkinnyConfig(groups=4, warps=4, unroll=4) == choose_grouped_skinny_config(k, gated, 1)
    else:
        assert quantized == bf16 and quantized.k_step(1) == 2 * bf16.k_step(2)
    with pytest.raises(ValueError, match="fp8 activations take fp8 weights with per-row scales"):
        choose_grouped_skinny_config(k, gated, 2, quantized=True)
    with pytest.raises(ValueError, match="fp8 activations take fp8 weights with per-row scales"):
        choose_grouped_skinny_config(k, gated, 1, block=True, quantized=True)


def test_scaled_kernel_takes_fp8_activations_and_row_scales():
    with pytest.raises(ValueError, match="expected fp8 a and w of one dtype"):
        _lower(False, 256, 7168, arguments=_arguments(False, 256, 7168))  # bf16 activations
    with pytest.raises(ValueError, match="expected 1-D scales"):
        _lower(False, 256, 7168, w_scale=_scales(False, 256, 7168, True))  # block scales
    with pytest.raises(ValueError, match="expected 1-D scales"):
        _lower(False, 256, 7168, a_scale=S((4096, 2), "f32"))


def test_scaled_kernel_takes_no_epilogue_scales():
    from flydsl.kernels.gemm.epilogue import Scale

    cfg = choose_grouped_skinny_config(256, False, 1, quantized=True)
    variant = SkinnyVariant(True, Epilogue(scales=(Scale(columns=1, experts=True),)), True)
    with pytest.raises(ValueError, match="no epilogue scales"):
        skinny_gemm_grouped_scaled_kernel.lower(
            *_fp8_arguments(False, 256, 7168), _scales(False, 256, 7168, False), S((4096,), "f32"), 0, cfg,
            variant, GroupedMode(),
        )  # fmt: skip
    assert isinstance(cfg, SkinnyConfig)
