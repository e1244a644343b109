"""The grouped skinny GEMM on fp8 weights without a GPU (skinny_gemm_grouped_fp8_kernel: fused_moe's decode stages,
weight-only fp8: bf16 or fp16 activations, the weights converted exactly in registers): gated and plain, per-row and
block scales, at MoE shapes, lowered to PTX that ptxas assembles for sm_90a without spills at the 16-bit kernels'
occupancy; the conversion's bit trick over every e4m3 byte; the fp8 configuration; the kernel's checks. The numbers:
test_skinny_grouped_fp8_gpu.py."""

from __future__ import annotations

import dataclasses
import re
import struct

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm.epilogue import Epilogue, Scale
from flydsl.kernels.gemm.skinny import SkinnyConfig, SkinnyVariant
from flydsl.kernels.gemm.skinny_grouped import (
    GroupedMode,
    choose_grouped_skinny_config,
    skinny_gemm_grouped_fp8_kernel,
    skinny_gemm_grouped_kernel,
)
from flydsl.kernels.gemm.skinny_one_token import (
    choose_combined_config,
    skinny_gemm_combined_kernel,
)

from .ptxas_report import ptxas_report

S = flyc.TensorSpec
FP8 = "f8E4M3FN"
TOKENS, TOP_K, EXPERTS, CAPACITY = 8, 8, 256, 4096
ROW_SCALE = Scale(columns=1, experts=True)  # a per-row scale as an epilogue would take it
_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32"


def _arguments(gated: bool, k: int, n_out: int, dtype: str = "bf16", weights: str = FP8) -> tuple:
    """The tensors (up to the scales) of one stage: stage 1 reads x (T, K) by index, stage 2 A in the aligned order."""
    rows = (TOKENS, k) if gated else (CAPACITY, k)
    weight_rows = EXPERTS * n_out * (2 if gated else 1)
    return (
        S(rows, dtype), S((weight_rows, k), weights), S((CAPACITY, n_out), dtype), S((CAPACITY,), "i32"),
        S((CAPACITY // 16,), "i32"), S((1,), "i32"), S((TOKENS * TOP_K,), "i32"),
    )  # fmt: skip


def _scales(gated: bool, k: int, n_out: int, block: bool):
    weight_rows = EXPERTS * n_out * (2 if gated else 1)
    return S((weight_rows // 128, -(-k // 128)), "f32") if block else S((weight_rows,), "f32")


def _lower(gated, k, n_out, block, dtype="bf16", cfg=None, epilogue=None, arguments=None, mode=None):
    direct = isinstance(mode, GroupedMode) and mode.direct
    cfg = cfg or choose_grouped_skinny_config(k, gated, 1, direct, block, n_out=n_out)
    variant = SkinnyVariant(True, epilogue or Epilogue(gate="silu" if gated else None), True)
    arguments = arguments or _arguments(gated, k, n_out, dtype)
    scales = _scales(gated, k, n_out, block)
    module = skinny_gemm_grouped_fp8_kernel.lower(
        *arguments, scales, TOP_K if gated else 0, cfg, variant, mode or GroupedMode()
    )
    return module, cfg


SHAPES = [
    (True, 7168, 256),  # DeepSeek-V3 TP8's stage 1 (H 7168, I 256): 3 whole steps and a masked one
    (True, 2048, 768),  # Qwen3-30B-A3B's (H 2048, I 768)
    (True, 4096, 14336),  # Mixtral's (H 4096, I 14336)
    (False, 256, 7168),  # their stage 2s: K = I
    (False, 768, 2048),
    (False, 2048, 7168),  # DeepSeek-V3 without TP (I 2048)
    (False, 14336, 4096),
]


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
@pytest.mark.parametrize("gated,k,n_out", SHAPES)
def test_grouped_fp8_compiles_without_spills(gated, k, n_out, block):
    module, cfg = _lower(gated, k, n_out, block)
    ptx = module.ptx
    assert "griddepcontrol.wait" in ptx and "e4m3" not in ptx  # no fp8 MMA, no hardware fp8 conversion
    # Pipelined: the first step, the loop's, the last full one's, the K tail's; 4 k16 MMAs per load and n8 tile.
    assert ptx.count(_MMA.format("bf16")) == 3 * 4 * cfg.unroll * cfg.groups
    assert ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == 3 * cfg.unroll * cfg.groups
    assert ptx.count("mul.rn.bf16x2") == 3 * 8 * cfg.unroll * cfg.groups  # 8 16-bit words per weight load
    report = ptxas_report(ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 65536 // ((cfg.min_blocks or 1) * cfg.threads), report  # the CTAs per SM asked for


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("weights", ["bf16", "row", "block"])
@pytest.mark.parametrize(
    "gated,k,n_out",
    [(True, 2048, 768), (True, 7168, 256), (True, 4096, 14336), (False, 768, 2048), (False, 14336, 4096)],
)
def test_the_decode_modes_compile_without_spills(weights, gated, k, n_out):
    """GroupedMode(direct) (one decode token: no alignment): the same MMAs and weight loads, no spills, the
    default's CTAs per SM."""
    mode = GroupedMode(direct=True)
    if weights == "bf16":
        cfg = choose_grouped_skinny_config(k, gated)
        variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
        arguments = _arguments(gated, k, n_out, weights="bf16")
        module = skinny_gemm_grouped_kernel.lower(*arguments, TOP_K if gated else 0, cfg, variant, mode)
        loads, mmas = 3 * cfg.unroll * cfg.groups, 3 * 2 * cfg.unroll * cfg.groups
    else:
        module, cfg = _lower(gated, k, n_out, weights == "block", mode=mode)
        loads, mmas = 3 * cfg.unroll * cfg.groups, 3 * 4 * cfg.unroll * cfg.groups
    ptx = module.ptx
    assert ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == loads
    assert ptx.count(_MMA.format("bf16")) == mmas
    report = ptxas_report(ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 65536 // ((cfg.min_blocks or 1) * cfg.threads), report


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("weights", ["bf16", "row", "block"])
@pytest.mark.parametrize("top_k,hidden,inter", [(8, 2048, 768), (8, 7168, 256), (2, 4096, 14336)])
def test_the_combined_kernel_compiles_without_spills(weights, top_k, hidden, inter):
    """skinny_gemm_combined_kernel (one token's stage 2 and combine): a warp per routed pair streaming all of I,
    as many MMAs per step as the grouped kernels' (2 per 16-bit load, 4 per fp8 load) for each pair, no spills."""
    fp8 = weights != "bf16"
    cfg = choose_combined_config(top_k, 1 if fp8 else 2, inter)
    assert cfg.warps == top_k and cfg.rows == (16 if fp8 and inter <= 256 else 8)  # (I 256: 2 tiles a warp)
    scales = {"bf16": S((1, top_k), "f32"), "row": S((EXPERTS * hidden,), "f32")}
    scales["block"] = S((EXPERTS * hidden // 128, -(-inter // 128)), "f32")
    module = skinny_gemm_combined_kernel.lower(
        S((top_k * 16, inter), "bf16"), S((EXPERTS * hidden, inter), FP8 if fp8 else "bf16"), S((1, hidden), "bf16"),
        S((1, top_k), "i32"), S((1, top_k), "f32"), scales[weights], cfg, top_k,
    )  # fmt: skip
    ptx = module.ptx
    per_load = 4 if fp8 else 2
    assert ptx.count(_MMA.format("bf16")) == 3 * per_load * cfg.unroll * cfg.groups  # pipelined: 3 copies of a step
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    report = ptxas_report(ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= (128 if fp8 else 255), report


@pytest.mark.parametrize("weights", ["row", "block"])
def test_the_combined_kernel_reads_its_weights_before_the_wait(weights):
    """One token's stage 1 (direct) lets the combined kernel launch only after its own wait (the routing is then
    complete), so the combined kernel reads the experts (through L2) and issues its first step of fp8 weights before
    its wait, taken by the wait as operands; h's loads come after it."""
    module, _cfg = _lower(True, 2048, 768, weights == "block", mode=GroupedMode(direct=True))
    ptx = module.ptx
    assert ptx.index("griddepcontrol.wait;") < ptx.index("griddepcontrol.launch_dependents;")
    cfg = choose_combined_config(TOP_K, 1)
    scales = S((EXPERTS * 2048 // 128, 6), "f32") if weights == "block" else S((EXPERTS * 2048,), "f32")
    combined = skinny_gemm_combined_kernel.lower(
        S((TOP_K * 16, 768), "bf16"), S((EXPERTS * 2048, 768), FP8), S((1, 2048), "bf16"), S((1, TOP_K), "i32"),
        S((1, TOP_K), "f32"), scales, cfg, TOP_K,
    )  # fmt: skip
    ptx = combined.ptx
    wait, trigger = ptx.index("griddepcontrol.wait;"), ptx.index("griddepcontrol.launch_dependents;")
    weight_loads = [m.start() for m in re.finditer(r"ld\.global\.nc\.L1::no_allocate\.L2::256B\.v4\.b32", ptx)]
    assert trigger < wait and ptx.index("ld.global.cg.b32") < wait
    assert sum(start < wait for start in weight_loads) == cfg.unroll * cfg.groups
    activation_loads = [m.start() for m in re.finditer(r"ld\.global\.nc\.v4\.b32", ptx)]
    assert activation_loads and min(activation_loads) > wait


def _loads_before_mmas(sass: str) -> list:
    """Per run of HMMAs in the SASS, the activation loads (``LDG.E.128.CONSTANT``, no L1 hint: the weights' loads
    carry ``.NA``) issued since the previous run."""
    runs, loads = [], 0
    for line in sass.splitlines():
        if re.search(r"LDG\.E\.128\.CONSTANT", line):
            loads += 1
        elif "HMMA." in line and loads:
            runs.append(loads)
            loads = 0
    return runs


@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
@pytest.mark.parametrize("stage", ["stage1", "combined"])
def test_one_tokens_fp8_steps_issue_their_activations_together(stage, block):
    """direct (one token): a step's MMAs wait until its activations have landed (SkinnyConfig.landed), so ptxas
    issues every activation load of a step before its first MMA (8 at a stage-1 step, 16 words of one row at a
    combined step) instead of each chunk's beside its MMAs (one L2 round trip per chunk: 1-2 loads per run)."""
    if stage == "stage1":
        cfg = choose_grouped_skinny_config(2048, True, 1, direct=True)
        module, _cfg = _lower(True, 2048, 768, block, cfg=cfg, mode=GroupedMode(direct=True))
    else:
        cfg = choose_combined_config(TOP_K, 1)
        scales = S((EXPERTS * 2048 // 128, 6), "f32") if block else S((EXPERTS * 2048,), "f32")
        module = skinny_gemm_combined_kernel.lower(
            S((TOP_K * 16, 768), "bf16"), S((EXPERTS * 2048, 768), FP8), S((1, 2048), "bf16"), S((1, TOP_K), "i32"),
            S((1, TOP_K), "f32"), scales, cfg, TOP_K,
        )  # fmt: skip
    assert cfg.landed and not choose_grouped_skinny_config(2048, True, 1).landed
    sass = flyc.toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs ptxas and nvdisasm (pip install nvidia-cuda-nvdisasm)")
    assert min(_loads_before_mmas(sass)) >= 8, _loads_before_mmas(sass)


def test_the_direct_and_combined_kernels_take_int64_ids():
    """fused_moe takes int64 ``topk_ids``: the direct mode reads them as the blocks' experts, the combined kernel as
    the slots' (converted to int32 on load)."""
    cfg = choose_grouped_skinny_config(2048, True)
    variant = SkinnyVariant(True, Epilogue(gate="silu"), True)
    ids = S((TOKENS * TOP_K,), "i64")
    module = skinny_gemm_grouped_kernel.lower(
        S((TOKENS, 2048), "bf16"), S((EXPERTS * 2 * 768, 2048), "bf16"), S((TOKENS * TOP_K * 16, 768), "bf16"),
        ids, ids, ids, S((TOKENS * TOP_K,), "i32"), TOP_K, cfg, variant, GroupedMode(direct=True),
    )  # fmt: skip
    assert module.cubin is not None or flyc.toolchain.find_ptxas() is None  # (LLVM loads an id's low word)
    combined = skinny_gemm_combined_kernel.lower(
        S((TOP_K * 16, 768), "bf16"), S((EXPERTS * 2048, 768), "bf16"), S((1, 2048), "bf16"), S((1, TOP_K), "i64"),
        S((1, TOP_K), "f32"), S((1, TOP_K), "f32"), choose_combined_config(TOP_K), TOP_K,
    )  # fmt: skip
    assert combined.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_the_combined_kernel_checks_its_configuration():
    cfg = dataclasses.replace(choose_combined_config(8), warps_n=2)
    with pytest.raises(ValueError, match="one column of warps"):
        skinny_gemm_combined_kernel.lower(
            S((128, 768), "bf16"), S((EXPERTS * 2048, 768), "bf16"), S((1, 2048), "bf16"), S((1, 8), "i32"),
            S((1, 8), "f32"), S((1, 8), "f32"), cfg, 8,
        )  # fmt: skip
    with pytest.raises(ValueError, match="element_bytes"):
        choose_combined_config(8, 4)


def test_the_kernels_take_a_grouped_mode():
    with pytest.raises(TypeError, match="mode must be a GroupedMode"):
        module, _ = _lower(False, 256, 7168, False, mode=(True, False))


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("block", [False, True], ids=["row", "block"])
@pytest.mark.parametrize("gated,k,n_out", [(True, 2048, 768), (False, 768, 2048)])
def test_grouped_fp8_with_fp16_activations(gated, k, n_out, block):
    module, cfg = _lower(gated, k, n_out, block, dtype="f16")
    assert module.ptx.count(_MMA.format("f16")) == 3 * 4 * cfg.unroll * cfg.groups
    assert "mul.rn.f16x2" in module.ptx and "bf16" not in module.ptx
    report = ptxas_report(module.ptx)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")], report


def _e4m3_values() -> list[float]:
    """The e4m3fn value of each byte, from its definition (sign, 4 exponent bits of bias 7, 3 mantissa bits; 0x7f
    and 0xff NaN)."""
    values = []
    for b in range(256):
        sign, exponent, mantissa = -1.0 if b & 0x80 else 1.0, (b >> 3) & 15, b & 7
        if b & 0x7F == 0x7F:
            values.append(float("nan"))
        elif exponent == 0:
            values.append(sign * mantissa * 2.0**-9)
        else:
            values.append(sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return values


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_the_bit_trick_is_exact_for_every_finite_e4m3_byte(dtype):
    """nvvm.unpack_e4m3x4's conversion: byte b placed as the 16-bit pattern t (bf16: magnitude << 4, f16: << 7; the
    sign to bit 15) is e4m3(b) * 2^-120 (bf16) or 2^-8 (f16) exactly, so that one multiply by the power of two gives
    e4m3(b); the NaN bytes read as +-480 (documented)."""
    torch = pytest.importorskip("torch")
    reference = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    values = _e4m3_values()
    for b in range(256):
        if b & 0x7F == 0x7F:
            assert reference[b] != reference[b] and values[b] != values[b]
        else:
            assert reference[b] == values[b] and str(reference[b]) == str(values[b])  # (the sign of zero too)
    shift, power = (4, 2.0**120) if dtype == "bf16" else (7, 2.0**8)
    for b, expected in enumerate(values):
        t = ((b & 0x7F) << shift) | ((b & 0x80) << 8)
        if dtype == "bf16":
            got = struct.unpack("<f", struct.pack("<I", t << 16))[0] * power
        else:
            got = struct.unpack("<e", struct.pack("<H", t))[0] * power
        if expected != expected:
            assert got == (-480.0 if b & 0x80 else 480.0)
        else:
            assert got == expected and str(got) == str(expected), (b, got, expected)
    assert struct.unpack("<f", struct.pack("<I", 0x7B80 << 16))[0] == 2.0**120  # the bf16 multiplier, exact
    assert struct.unpack("<e", struct.pack("<H", 0x5C00))[0] == 2.0**8


def test_unpack_lowers_to_the_documented_instructions():
    module, _ = _lower(False, 256, 7168, False)
    ptx = module.ptx
    for instruction in ("prmt.b32", "shr.b32", "and.b32", "or.b32", "mul.rn.bf16x2"):
        assert instruction in ptx
    assert "0x7b807b80" in ptx and "0x07f007f0" in ptx.lower()


@pytest.mark.parametrize("k", [256, 768, 1024, 1040, 2048, 4096, 7168, 14336])
@pytest.mark.parametrize("gated", [True, False])
def test_fp8_configuration(k, gated):
    """fp8 weights: short K keeps the 16-bit configuration's 16-byte weight loads per warp and step, weight rows per CTA
    and threads, held to its CTAs per SM, each step twice the K (one step of K: 4 n8 tiles x 4 loads); a stage 1 of
    several tokens takes 4 n8 tiles x 4 loads over 4 warps (block scales 4 x 2), one token's 2 x 2 over 8 warps with its
    activations landed; a long-K stage 2 two columns of 4 warps at 2 CTAs per SM (the measured winners, docs in
    choose_grouped_skinny_config).
    The 16-bit answers are what they were."""
    fp8, bf16 = choose_grouped_skinny_config(k, gated, 1), choose_grouped_skinny_config(k, gated)
    direct = choose_grouped_skinny_config(k, gated, 1, direct=True)
    short = k <= 1024 and not gated
    if short and k <= 256:  # one step of 4 tiles x 4 loads
        assert fp8 == SkinnyConfig(groups=4, warps=4, warps_n=4, unroll=4) and direct == fp8
        assert fp8.k_step(1) == k
    elif short:
        assert (fp8.rows, fp8.threads) == (bf16.rows, bf16.threads) and direct == fp8
        assert fp8.unroll * fp8.groups == bf16.unroll * bf16.groups
        assert fp8.k_step(1) == 2 * bf16.k_step(2)
        assert fp8.min_blocks == 65536 // (128 * fp8.threads)
    elif gated:
        assert fp8 == SkinnyConfig(groups=4, warps=4, unroll=4) and fp8.k_step(1) == bf16.k_step(2)
        assert direct == SkinnyConfig(unroll=2, landed=True) and direct.k_step(1) == bf16.k_step(2)
        assert choose_grouped_skinny_config(k, gated, 1, block=True) == SkinnyConfig(groups=4, warps=4, unroll=2)
        assert choose_grouped_skinny_config(k, gated, 1, True, block=True) == direct
    else:
        assert fp8 == SkinnyConfig(unroll=2, warps_n=2, min_blocks=2)
        assert direct == dataclasses.replace(fp8, landed=True)
    assert bf16.min_blocks is None
    assert bf16 == (SkinnyConfig(groups=4, warps=4, warps_n=2, unroll=2) if short else SkinnyConfig())
    assert choose_grouped_skinny_config(k, gated, 2) == bf16


def test_one_tokens_stage_1_by_its_tiles():
    """One token's stage 1: I < 512 (DeepSeek-V3 TP8: one wave) 2 loads landed over 8 warps; from 512 (Qwen3) 4 n8
    tiles x 2 loads over 4 warps; from 4096 (Mixtral: a stream) 2 x 4 loads over 4 warps unlanded; fp8 and block
    alike. 16-bit and the aligned stages ignore n_out."""
    for block in (False, True):
        for n_out, cfg in (
            (256, SkinnyConfig(unroll=2, landed=True)),
            (768, SkinnyConfig(groups=4, warps=4, unroll=2)),
            (2048, SkinnyConfig(groups=4, warps=4, unroll=2)),
            (14336, SkinnyConfig(warps=4, unroll=4)),
        ):
            assert choose_grouped_skinny_config(4096, True, 1, direct=True, block=block, n_out=n_out) == cfg
    assert choose_grouped_skinny_config(4096, True, 2, direct=True, n_out=14336) == SkinnyConfig()
    assert choose_grouped_skinny_config(4096, True, 1, n_out=14336) == choose_grouped_skinny_config(4096, True, 1)
    assert choose_grouped_skinny_config(14336, False, 1, direct=True, n_out=4096).warps_n == 2


def test_fp8_configuration_checks_the_element_size():
    with pytest.raises(ValueError, match="element_bytes"):
        choose_grouped_skinny_config(7168, True, 4)


def test_fp8_kernel_takes_no_epilogue_scales():
    with pytest.raises(ValueError, match="no epilogue scales"):
        _lower(False, 256, 7168, False, epilogue=Epilogue(scales=(ROW_SCALE,)))


def test_fp8_kernel_takes_fp8_weights_and_16_bit_activations():
    with pytest.raises(ValueError, match="fp8 weights, 16-bit a"):
        _lower(False, 256, 7168, False, arguments=_arguments(False, 256, 7168, weights="bf16"))
    with pytest.raises(ValueError, match="fp8 weights, 16-bit a"):
        _lower(False, 256, 7168, False, arguments=_arguments(False, 256, 7168, dtype=FP8))


def test_16_bit_kernel_takes_no_scales():
    variant = SkinnyVariant(True, Epilogue(scales=(ROW_SCALE,)), True)
    with pytest.raises(ValueError, match="expected no scales"):
        skinny_gemm_grouped_kernel.lower(
            *_arguments(False, 256, 7168, weights="bf16"), 0, choose_grouped_skinny_config(256, False), variant,
            GroupedMode(),
        )  # fmt: skip
