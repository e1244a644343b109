"""The grouped skinny GEMM on fp8 operands without a GPU (skinny_gemm_grouped_scaled_kernel: fused_moe's decode
stages with per-token and per-weight-row scales): gated and plain, at MoE shapes, lowered to PTX ISA 8.4 with e4m3
mma.sync that ptxas assembles for sm_90a without spills; the fp8 configuration's steps; the kernels' checks of their
scales. The numbers: test_skinny_grouped_fp8_gpu.py."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm.epilogue import Epilogue, Scale
from flydsl.kernels.gemm.skinny import (
    GROUPED_SCALES,
    SkinnyConfig,
    SkinnyVariant,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_kernel,
    skinny_gemm_grouped_scaled_kernel,
)

from .ptxas_report import ptxas_report

S = flyc.TensorSpec
FP8 = "f8E4M3FN"
TOKENS, TOP_K, EXPERTS, CAPACITY = 8, 8, 256, 4096
_MMA = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"


def _arguments(gated: bool, k: int, n_out: int, operand: str = FP8) -> tuple:
    """The tensors (up to the scales) of one stage: stage 1 reads x (T, K) by index, stage 2 A in the aligned order."""
    rows = (TOKENS, k) if gated else (CAPACITY, k)
    weight_rows = EXPERTS * n_out * (2 if gated else 1)
    return (
        S(rows, operand), S((weight_rows, k), operand), S((CAPACITY, n_out), "bf16"), S((CAPACITY,), "i32"),
        S((CAPACITY // 16,), "i32"), S((1,), "i32"), S((TOKENS * TOP_K,), "i32"),
    )  # fmt: skip


def _lower_scaled(gated: bool, k: int, n_out: int, cfg: SkinnyConfig, epilogue: Epilogue | None = None):
    arguments = _arguments(gated, k, n_out)
    scales = (S((arguments[0].shape[0],), "f32"), S((arguments[1].shape[0],), "f32"))
    epilogue = epilogue or Epilogue(gate="silu" if gated else None, scales=GROUPED_SCALES)
    variant = SkinnyVariant(True, epilogue, True)
    return skinny_gemm_grouped_scaled_kernel.lower(*arguments, *scales, TOP_K if gated else 0, cfg, variant)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize(
    "gated,k,n_out",
    [
        (True, 7168, 256),  # DeepSeek-V3 TP8's stage 1 (H 7168, I 256)
        (True, 2048, 768),  # Qwen3-30B-A3B's (H 2048, I 768)
        (True, 4096, 14336),  # Mixtral's (H 4096, I 14336)
        (False, 256, 7168),  # their stage 2s: K = I
        (False, 768, 2048),
        (False, 2048, 7168),  # DeepSeek-V3 without TP (I 2048)
        (False, 14336, 4096),
    ],
)
def test_grouped_fp8_compiles_without_spills(gated, k, n_out):
    cfg = choose_grouped_skinny_config(k, gated, 1)
    module = _lower_scaled(gated, k, n_out, cfg)
    ptx = module.ptx
    assert ".version 8.4" in ptx and "griddepcontrol.wait" in ptx
    # Pipelined: the first step, the loop's, the last full one's, the K tail's; 2 k32 MMAs per load and n8 tile.
    assert ptx.count(_MMA) == 3 * 2 * cfg.unroll * cfg.groups
    assert "m16n8k16" not in ptx
    assert ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == 3 * cfg.unroll * cfg.groups
    report = ptxas_report(ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 65536 // (2 * cfg.threads), report  # two CTAs per SM (choose_grouped_skinny_config says why)


@pytest.mark.parametrize("k", [256, 768, 1024, 1040, 2048, 4096, 7168, 14336])
@pytest.mark.parametrize("gated", [True, False])
def test_fp8_configuration_takes_the_16_bit_steps(k, gated):
    """fp8 steps hold the K values of the 16-bit configuration's (half its loads: half the bytes), over the same
    warps and weight rows; the 16-bit answers are what they were."""
    fp8, bf16 = choose_grouped_skinny_config(k, gated, 1), choose_grouped_skinny_config(k, gated)
    assert fp8.k_step(1) == bf16.k_step(2) and fp8.unroll * 2 == bf16.unroll
    assert (fp8.rows, fp8.threads, fp8.warps_n, fp8.groups) == (bf16.rows, bf16.threads, bf16.warps_n, bf16.groups)
    short = k <= 1024 and not gated
    assert bf16 == (SkinnyConfig(groups=4, warps=4, warps_n=2, unroll=2) if short else SkinnyConfig())
    assert choose_grouped_skinny_config(k, gated, 2) == bf16


def test_fp8_configuration_checks_the_element_size():
    with pytest.raises(ValueError, match="element_bytes"):
        choose_grouped_skinny_config(7168, True, 4)


@pytest.mark.parametrize(
    "epilogue",
    [
        Epilogue(gate="silu"),  # no scales
        Epilogue(gate="silu", scales=GROUPED_SCALES[::-1]),  # the weight rows' first
        Epilogue(scales=(Scale(rows=1), Scale(columns=1))),  # per output column, not per weight row
        Epilogue(scales=GROUPED_SCALES, bias=True),
    ],
)
def test_scaled_kernel_takes_exactly_the_grouped_scales(epilogue):
    with pytest.raises(ValueError, match="grouped"):
        _lower_scaled(False, 256, 7168, choose_grouped_skinny_config(256, False, 1), epilogue)


def test_16_bit_kernel_takes_no_scales():
    variant = SkinnyVariant(True, Epilogue(scales=GROUPED_SCALES), True)
    with pytest.raises(ValueError, match="expected no scales"):
        skinny_gemm_grouped_kernel.lower(
            *_arguments(False, 256, 7168, "bf16"), 0, choose_grouped_skinny_config(256, False), variant
        )
