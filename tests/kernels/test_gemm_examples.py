"""The GEMM tutorial's four steps (examples/gemm_{1..4}_*.py, docs/gemm-tutorial.md). CPU: each step's kernel
compiles to PTX that assembles for sm_90a and holds the instructions that step is about (and not the next step's);
configurations are validated; a step's ``main`` compiles and summarizes without a GPU. GPU (``gpu``): each step
against a float64 reference on small odd shapes (tails in M, N and K) with a NaN-poisoned output, and the arguments
refused before launch."""

from __future__ import annotations

import importlib
import pathlib
import re
import sys

import pytest

import flydsl.compiler as flyc

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
STEPS = ("gemm_1_naive", "gemm_2_mma_sync", "gemm_3_tma_wgmma", "gemm_4_warp_specialized")


def _step(name: str):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the steps import the harness of step 1 as a top-level module
    return importlib.import_module(name)


def _count(ptx: str, pattern: str) -> int:
    return len(re.findall(pattern, ptx))


# (step, the instructions it must have: pattern -> count, or None for "at least one"; patterns it must not have)
EXPECTED = {
    "gemm_1_naive": ({r"fma\.rn\.f32": None, r"ld\.global\.b16": None}, [r"mma\.sync", r"wgmma", r"cp\.async"]),
    # 4 x 4 m16n8k16 tiles per warp, 2 per K step of 32; 2 chunks of A and 2 of B per thread
    "gemm_2_mma_sync": (
        {r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32": 32, r"cp\.async\.cg\.shared\.global": 4},
        [r"wgmma", r"cp\.async\.bulk"],
    ),
    # one m64n256k16 per 16 of the 64-wide K step; 1 + 4 boxes per stage, issued in the prologue (3) and the loop (1)
    "gemm_3_tma_wgmma": (
        {r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16": 4, r"cp\.async\.bulk\.tensor\.2d": 20},
        [r"setmaxnreg", r"mma\.sync", r"multicast"],
    ),
    "gemm_4_warp_specialized": (
        {
            r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16": 4,
            r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;": 1,
            r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;": 1,
            r"multicast::cluster": None,
            r"\.reqnctapercluster 2, 1, 1": 1,
        },
        [r"mma\.sync"],
    ),
}


@pytest.mark.parametrize("name", STEPS)
def test_step_compiles_to_its_instructions(name):
    compiled = _step(name).lower(1000, 776, 520)
    ptx = compiled.ptx
    present, absent = EXPECTED[name]
    for pattern, count in present.items():
        found = _count(ptx, pattern)
        assert found >= 1 if count is None else found == count, (name, pattern, found)
    for pattern in absent:
        assert _count(ptx, pattern) == 0, (name, pattern)
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_step_3_pipeline_and_shared_memory():
    step = _step("gemm_3_tma_wgmma")
    compiled = step.lower(512, 512, 512)
    assert compiled.shared_bytes["gemm_tma_wgmma"] >= step.CFG.stages * step.CFG.stage_bytes
    assert ".reqntid 256, 1, 1" in compiled.ptx
    # The full/empty barriers of every stage are waited on by parity (consumers on full, the producer on empty).
    assert _count(compiled.ptx, r"mbarrier\.try_wait\.parity") >= 2


def test_configurations_are_validated():
    with pytest.raises(ValueError, match="warp tiles must be whole 16x8 mma tiles"):
        _step("gemm_2_mma_sync").TileConfig(bk=24)
    step3 = _step("gemm_3_tma_wgmma")
    with pytest.raises(ValueError, match="tile_n of 64 up to 256"):
        step3.Config(tile_n=320)
    with pytest.raises(ValueError, match="exceed the 227 KiB"):
        step3.Config(stages=6)


def test_instruction_counts_reads_opcodes_only():
    harness = _step("gemm_1_naive")
    ptx = "\t// mma.sync in a comment\n\t@%p1 mma.sync.aligned.m16n8k16 {..};\n\tmma.sync.aligned.m16n8k16 {..};\n"
    assert harness.instruction_counts(ptx, [r"mma\.sync", r"ld\.global"]) == {r"mma\.sync": 2, r"ld\.global": 0}


def test_fp8_step_compiles_to_fp8_wgmma():
    """Step 5: the warp-specialized kernel on e4m3 operands (m64nNk32 wgmmas, four per 128-element K step and 64 rows),
    the scales read in the epilogue."""
    compiled = _step("gemm_5_fp8").lower(1000, 776, 528)
    assert _count(compiled.ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3") >= 4
    assert _count(compiled.ptx, r"bf16") == 0 and "setmaxnreg" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@pytest.mark.skipif(flyc.runtime.is_available(), reason="on a GPU main() checks and times (the GPU tests do that)")
def test_main_compiles_and_summarizes_without_a_gpu(capsys):
    assert _step("gemm_3_tma_wgmma").main(["--m", "200", "--n", "136", "--k", "72"]) == 0
    out = capsys.readouterr().out
    assert "gemm_tma_wgmma: compiled" in out and r"wgmma.mma_async: 4" in out and "compiled only" in out


# --- GPU ----------------------------------------------------------------------------------------------------------

SHAPES = [(1, 8, 8), (37, 40, 24), (200, 136, 72), (129, 264, 520), (300, 520, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", STEPS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_step_on_gpu(name, m, n, k):
    pytest.importorskip("torch")
    step = _step(name)
    harness = _step("gemm_1_naive")
    assert harness.check_on_gpu(step.matmul, m, n, k, seed=m + n + k) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (200, 136, 80), (300, 520, 1008)])
def test_fp8_step_on_gpu(m, n, k):
    pytest.importorskip("torch")
    step = _step("gemm_5_fp8")
    assert _step("gemm_1_naive").check_on_gpu(step.matmul, m, n, k, step.TOLERANCE, seed=m + n + k) <= step.TOLERANCE


@pytest.mark.gpu
def test_naive_step_takes_any_shape_on_gpu():
    pytest.importorskip("torch")
    harness = _step("gemm_1_naive")
    assert harness.check_on_gpu(harness.matmul, 33, 17, 5) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("name", STEPS[1:])
def test_steps_refuse_bad_arguments_before_launch(name):
    torch = pytest.importorskip("torch")
    step = _step(name)
    a = torch.randn(64, 36, device="cuda").bfloat16()
    b = torch.randn(36, 64, device="cuda").bfloat16()
    c = torch.empty(64, 64, device="cuda")
    with pytest.raises(ValueError, match=r"K \(36\) and N \(64\) must be multiples of 8"):
        step.matmul(a, b, c)
    a32, b32 = a[:, :32].contiguous(), b[:32].contiguous()
    with pytest.raises(ValueError, match="matmul a: expected a contiguous row-major matrix"):
        step.matmul(a[:, :32], b32, c)
    with pytest.raises(TypeError, match="matmul c: expected torch.float32"):
        step.matmul(a32, b32, c.bfloat16())
    with pytest.raises(ValueError, match="inner dimensions differ"):
        step.matmul(a32, b[:16].contiguous(), c)
