"""The compile pipeline on CPU: MLIR -> Fly lowering -> NVVM/LLVM -> PTX in process -> cubin through ptxas."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import toolchain


def test_ptxas_is_found():
    # CI must assemble PTX for sm_90a: a missing ptxas is a failure, not a skip.
    assert flyc.find_ptxas() is not None, "ptxas not found: install the CUDA toolkit or set FLYDSL_PTXAS"


def test_demo_kernel_compiles_to_ptx_that_assembles_for_sm_90a(layout_offsets_mlir):
    compiled = flyc.compile_mlir(layout_offsets_mlir, assemble=True)
    assert compiled.kernels == {"layout_offsets": "pi"}
    assert ".target sm_90a" in compiled.ptx
    assert ".visible .entry layout_offsets(" in compiled.ptx
    assert compiled.cubin is not None and compiled.cubin[:4] == b"\x7fELF"
    assert compiled.image == compiled.cubin


def test_every_stage_is_kept_and_compiles_again_from_there(layout_offsets_mlir):
    compiled = flyc.compile_mlir(layout_offsets_mlir, keep_stages=True, assemble=False)
    assert list(compiled.stages) == ["input", "fly", "llvm", "ptx"]
    assert "fly.crd2idx" in compiled.stages["input"]
    assert "fly." not in compiled.stages["fly"].replace("layout_offsets", "")
    assert "llvm.func" in compiled.stages["llvm"]
    for stage in ("fly", "llvm"):
        again = flyc.compile_mlir(compiled.stages[stage], start_after=stage, assemble=False)
        assert again.ptx == compiled.ptx


def test_stages_are_written_to_the_dump_directory(layout_offsets_mlir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_DUMP_IR", str(tmp_path))
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [f"layout_demo.{s}" for s in ("fly.mlir", "input.mlir", "llvm.mlir", "ptx.ptx")]


def test_sm80_target(layout_offsets_mlir):
    compiled = flyc.compile_mlir(layout_offsets_mlir, flyc.SM80, assemble=True)
    assert ".target sm_80" in compiled.ptx


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"chip": "hopper"}, "Target.chip"),
        ({"ptx_version": 8}, "Target.ptx_version"),
        ({"opt_level": 5}, "Target.opt_level"),
    ],
)
def test_bad_targets_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flyc.Target(**kwargs)


def test_bad_start_stage_names_the_choices(layout_offsets_mlir):
    with pytest.raises(ValueError, match=r"start_after: expected one of \['fly', 'llvm'\]"):
        flyc.compile_mlir(layout_offsets_mlir, start_after="ptx")


def test_parse_errors_name_the_stage_and_line():
    with pytest.raises(flyc.CompilationError, match=r"stage 'input' failed") as info:
        flyc.compile_mlir("module {\n  gpu.module @m {\n    %x = fly.size\n  }\n}")
    assert info.value.stage == "input"
    assert ":3:" in info.value.diagnostics


def test_memref_kernel_arguments_are_refused_with_the_argument_position():
    source = """
    module attributes {gpu.container_module} {
      gpu.module @m {
        gpu.func @k(%n: i32, %buf: memref<4xf32>) kernel { gpu.return }
      }
    }"""
    with pytest.raises(flyc.CompilationError, match="kernel 'k' argument 1 has type memref<4xf32>"):
        flyc.compile_mlir(source)


def test_exactly_one_gpu_module_is_required():
    with pytest.raises(flyc.CompilationError, match="exactly one gpu.module"):
        flyc.compile_mlir("module {}")


def test_ptxas_errors_carry_its_log():
    with pytest.raises(flyc.ToolchainError, match="ptxas -arch=sm_90a failed"):
        toolchain.assemble_ptx(".version 8.0\n.target sm_90a\n.address_size 64\nthis is not ptx\n", "sm_90a")


# An accumulator read between a wgmma and the wait that completes it: ptxas serializes the kernel's wgmma (C7514).
_SERIALIZED_WGMMA_PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry serialized(.param .u64 out, .param .u64 da, .param .u64 db)
{
.reg .f32 %f<4>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [da];
ld.param.u64 %rd2, [db];
ld.param.u64 %rd3, [out];
mov.f32 %f0, 0f00000000;
mov.f32 %f1, 0f00000000;
mov.f32 %f2, 0f00000000;
mov.f32 %f3, 0f00000000;
wgmma.fence.sync.aligned;
wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3}, %rd1, %rd2, 1, 1, 1, 0, 0;
st.global.f32 [%rd3], %f0;
wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3}, %rd1, %rd2, 1, 1, 1, 0, 0;
wgmma.commit_group.sync.aligned;
wgmma.wait_group.sync.aligned 0;
st.global.f32 [%rd3+4], %f1;
ret;
}
"""


@pytest.mark.skipif(toolchain.find_ptxas() is None, reason="needs ptxas")
def test_ptxas_performance_notes_become_performance_warnings():
    with pytest.warns(flyc.PerformanceWarning, match=r"C7514.*serialized.*'serialized'") as caught:
        cubin = toolchain.assemble_ptx(_SERIALIZED_WGMMA_PTX, "sm_90a")
    assert cubin  # a warning, not an error: the kernel still runs
    assert caught[0].filename == __file__  # attributed to the first caller outside FlyDSL


@pytest.mark.skipif(toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("isolate", [False, True])
def test_compile_mlir_warns_performance_notes_in_this_process(layout_offsets_mlir, tmp_path, monkeypatch, isolate):
    """A ptxas that prints a performance note (the real one, then a stand-in note): compile_mlir warns here, also
    when the compile ran in a worker process, and keeps the note in the module."""
    fake = tmp_path / "ptxas"
    fake.write_text(
        f'#!/bin/sh\n"{toolchain.find_ptxas()}" "$@" || exit $?\n'
        'echo "ptxas info    : (C7514) Potential Performance Loss: a stand-in note"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("FLYDSL_PTXAS", str(fake))
    with pytest.warns(flyc.PerformanceWarning, match="C7514.*a stand-in note") as caught:
        compiled = flyc.compile_mlir(layout_offsets_mlir, isolate=isolate)
    assert compiled.cubin and len(compiled.performance_notes) == 1
    assert caught[0].filename == __file__  # the first caller outside FlyDSL: this line


def test_missing_ptxas_override_is_reported(monkeypatch):
    monkeypatch.setenv("FLYDSL_PTXAS", "/nonexistent/ptxas")
    with pytest.raises(flyc.ToolchainError, match="FLYDSL_PTXAS='/nonexistent/ptxas' is not an executable"):
        flyc.find_ptxas()


def test_dump_switch_writes_ir_ptx_cubin_and_sass_to_the_dump_dir(layout_offsets_mlir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_DUMP_IR", "1")
    monkeypatch.setenv("FLYDSL_DUMP_DIR", str(tmp_path / "dumps"))
    flyc.compile_mlir(layout_offsets_mlir, assemble=True)
    written = {p.name for p in (tmp_path / "dumps").iterdir()}
    assert {"layout_demo.input.mlir", "layout_demo.fly.mlir", "layout_demo.llvm.mlir", "layout_demo.ptx.ptx"} <= written
    assert "layout_demo.cubin" in written
    if toolchain.find_nvdisasm():
        sass = (tmp_path / "dumps" / "layout_demo.sass").read_text()
        assert "layout_offsets" in sass and "STG" in sass
    monkeypatch.setenv("FLYDSL_DUMP_IR", "0")
    assert flyc.settings.current().dump_ir_dir is None
