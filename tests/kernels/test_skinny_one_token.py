"""skinny_gemm_one_launch_kernel without a GPU (one decode token's stage 1, stage 2 and combine in one launch): lowered
at MoE shapes for 16-bit, per-row fp8 and block-scaled fp8 weights, PTX that ptxas assembles for sm_90a without
spills within the combined kernel's registers; the stage-2 CTAs wait on the stage-1 CTAs' count (release, acquire),
read h through L2 and zero the counters at the end; the configurations. The numbers: test_skinny_one_token_gpu.py and
the fused_moe GPU tests (FLYDSL_MOE_DECODE's single)."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm.epilogue import Epilogue
from flydsl.kernels.gemm.skinny import SkinnyVariant
from flydsl.kernels.gemm.skinny_one_token import (
    choose_combined_config,
    choose_one_launch_configs,
    skinny_gemm_one_launch_kernel,
)

from .ptxas_report import ptxas_report

S = flyc.TensorSpec
FP8 = "f8E4M3FN"
EXPERTS = 64


def lower_one_launch(weights: str, top_k: int, hidden: int, inter: int):
    fp8 = weights != "bf16"
    cfg1, cfg2 = choose_one_launch_configs(hidden, top_k, 1 if fp8 else 2)
    w = FP8 if fp8 else "bf16"
    if weights == "block":
        scales = (
            S((EXPERTS * 2 * inter // 128, hidden // 128), "f32"),
            S((EXPERTS * hidden // 128, inter // 128), "f32"),
        )
    else:
        scales = (S((EXPERTS * 2 * inter,), "f32"), S((EXPERTS * hidden,), "f32"))
    module = skinny_gemm_one_launch_kernel.lower(
        S((1, hidden), "bf16"), S((EXPERTS * 2 * inter, hidden), w), S((top_k * 16, inter), "bf16"),
        S((EXPERTS * hidden, inter), w), S((1, hidden), "bf16"), S((top_k,), "i32"), S((1, top_k), "i32"),
        S((1, top_k), "f32"), S((top_k,), "i32"), *scales, S((2,), "i32"), cfg1, cfg2, top_k,
        SkinnyVariant(True, Epilogue(gate="silu"), True),
    )  # fmt: skip
    return module, cfg1, cfg2


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("weights", ["bf16", "row", "block"])
@pytest.mark.parametrize("top_k,hidden,inter", [(8, 2048, 768), (8, 7168, 256), (4, 1024, 512)])
def test_one_launch_compiles_without_spills(weights, top_k, hidden, inter):
    module, cfg1, cfg2 = lower_one_launch(weights, top_k, hidden, inter)
    ptx = module.ptx
    assert cfg1.threads == cfg2.threads == 256
    # stage 1 counts itself with release, stage 2 spins with acquire and counts its CTAs (the last zeroes both)
    assert "red.release.gpu.global.add.s32" in ptx and "ld.acquire.gpu.global.b32" in ptx
    assert "atom.acq_rel.gpu.global.add.s32" in ptx and "griddepcontrol.wait" in ptx
    assert "ld.global.cg.v4.b32" in ptx  # h, written in this launch: through L2
    # every thread reads the count once more after the barrier, and h's rows depend on what it read: h's loads
    # come after the last acquire (the compiler may not hoist them above the wait)
    assert ptx.count("ld.acquire.gpu.global.b32") == 2 and ptx.rindex("ld.acquire") < ptx.index("ld.global.cg.v4")
    report = ptxas_report(ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 65536 // ((cfg2.min_blocks or 1) * cfg2.threads), report


@pytest.mark.parametrize("element_bytes", [1, 2])
@pytest.mark.parametrize("top_k", [2, 4, 8, 16])
def test_one_launch_configs_share_a_cta_size(top_k, element_bytes):
    """The direct stage 1's configuration and the combined kernel's with its warps (a warp per pair, or two), fp8
    at 2 CTAs of 256 threads per SM (128 registers) as the combined kernel is held."""
    cfg1, cfg2 = choose_one_launch_configs(2048, top_k, element_bytes)
    combined = choose_combined_config(top_k, element_bytes)
    assert cfg2.threads == cfg1.threads and (cfg2.groups, cfg2.unroll, cfg2.landed) == (1, 4, combined.landed)
    assert cfg2.min_blocks == (2 if element_bytes == 1 else None)
