"""Compiles in a worker process: same results as in process, and a backend abort becomes a CompilationError."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import isolate, pipeline, settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# A TMA load in its CTA-only form (shared::cta destination) needs PTX ISA 8.6; for the default target's +ptx80
# LLVM's NVPTX backend has no pattern and calls report_fatal_error ("Cannot select"), which aborts the process.
BACKEND_ABORT = """
module attributes {gpu.container_module} {
  gpu.module @abort_demo {
    gpu.func @tma_cta_only(%tmap: !llvm.ptr, %dst: !llvm.ptr<3>, %bar: !llvm.ptr<3>) kernel {
      %c0 = arith.constant 0 : i32
      "nvvm.cp.async.bulk.tensor.shared.cluster.global"(%dst, %tmap, %c0, %c0, %bar)
          <{isCTAOnly = true, operandSegmentSizes = array<i32: 1, 1, 2, 1, 0, 0, 0, 0>}>
          : (!llvm.ptr<3>, !llvm.ptr, i32, i32, !llvm.ptr<3>) -> ()
      gpu.return
    }
  }
}
"""


def test_isolated_compile_gives_what_the_in_process_compile_gives(layout_offsets_mlir):
    here = flyc.compile_mlir(layout_offsets_mlir, keep_stages=True, assemble=True, isolate=False)
    there = flyc.compile_mlir(layout_offsets_mlir, keep_stages=True, assemble=True, isolate=True)
    assert there.ptx == here.ptx
    assert there.kernels == here.kernels == {"layout_offsets": "pi"}
    assert there.stages == here.stages
    assert there.cubin is not None and there.cubin[:4] == b"\x7fELF"
    assert there.target == here.target and there.name == here.name


def test_a_backend_abort_in_process_ends_the_interpreter():
    # Why isolation exists: run in a child of its own, the in-process compile takes its interpreter down.
    script = (
        "import sys, flydsl.compiler as flyc\n"
        "flyc.compile_mlir(sys.stdin.read(), assemble=False, isolate=False)\n"
        "print('survived')\n"
    )
    child = subprocess.run([sys.executable, "-c", script], input=BACKEND_ABORT, capture_output=True, text=True)
    assert child.returncode == -signal.SIGABRT, child.stderr
    assert "LLVM ERROR: Cannot select" in child.stderr
    assert "survived" not in child.stdout


def test_a_backend_abort_in_the_worker_raises_a_compilation_error():
    with pytest.raises(flyc.CompilationError, match="killed by SIGABRT") as info:
        flyc.compile_mlir(BACKEND_ABORT, assemble=False, isolate=True)
    assert info.value.stage == "ptx"
    assert "LLVM ERROR: Cannot select: intrinsic %llvm.nvvm.cp.async.bulk.tensor.g2s.cta" in info.value.diagnostics


def test_compiles_are_isolated_unless_the_environment_variable_says_0(layout_offsets_mlir, monkeypatch):
    calls = []
    real = isolate.compile_in_worker

    def spy(request):
        calls.append(request["start_after"])
        return real(request)

    monkeypatch.setattr(pipeline.isolation, "compile_in_worker", spy)
    monkeypatch.delenv("FLYDSL_COMPILE_ISOLATED", raising=False)
    assert settings.current().compile_isolated
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    assert calls == [None]
    flyc.compile_mlir(layout_offsets_mlir, assemble=False, isolate=False)  # the argument wins
    assert calls == [None]
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "1")
    assert settings.current().compile_isolated
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")
    assert not settings.current().compile_isolated
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    assert calls == [None]
    flyc.compile_mlir(layout_offsets_mlir, assemble=False, isolate=True)
    assert calls == [None, None]


def test_errors_raised_in_the_worker_are_raised_as_they_are(layout_offsets_mlir, monkeypatch):
    with pytest.raises(flyc.CompilationError, match=r"stage 'input' failed") as info:
        flyc.compile_mlir("module {\n  gpu.module @m {\n    %x = fly.size\n  }\n}", isolate=True)
    assert info.value.stage == "input" and ":3:" in info.value.diagnostics
    monkeypatch.setenv("FLYDSL_PTXAS", "/nonexistent/ptxas")  # the worker sees the caller's environment
    with pytest.raises(flyc.ToolchainError, match="FLYDSL_PTXAS='/nonexistent/ptxas' is not an executable"):
        flyc.compile_mlir(layout_offsets_mlir, assemble=True, isolate=True)


def test_bad_arguments_fail_before_a_worker_starts(layout_offsets_mlir, monkeypatch):
    monkeypatch.setattr(isolate, "compile_in_worker", None)  # never reached
    with pytest.raises(ValueError, match="start_after"):
        flyc.compile_mlir(layout_offsets_mlir, start_after="ptx", isolate=True)


def test_stages_are_dumped_by_the_worker(layout_offsets_mlir, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_DUMP_IR", str(tmp_path))
    flyc.compile_mlir(layout_offsets_mlir, assemble=False, isolate=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"layout_demo.{s}" for s in ("fly.mlir", "input.mlir", "llvm.mlir", "ptx.ptx")
    ]


@pytest.fixture
def fresh_worker():
    """No worker before the test, none after it (the next compile starts one)."""
    isolate.stop_worker()
    yield
    isolate.stop_worker()


@pytest.mark.parametrize(
    "bootstrap, how",
    [("import os; os.abort()", "killed by SIGABRT"), ("import sys; sys.exit(3)", "exited with status 3")],
)
def test_a_worker_that_dies_before_any_stage_is_a_backend_failure(
    layout_offsets_mlir, monkeypatch, fresh_worker, bootstrap, how
):
    monkeypatch.setattr(isolate, "_BOOTSTRAP", bootstrap)
    with pytest.raises(flyc.CompilationError, match=how) as info:
        flyc.compile_mlir(layout_offsets_mlir, isolate=True)
    assert info.value.stage == "backend"


def test_one_worker_serves_every_compile_and_survives_its_childrens_crashes(layout_offsets_mlir, fresh_worker):
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    worker = isolate._worker.process.pid
    for _ in range(3):
        with pytest.raises(flyc.CompilationError, match="killed by SIGABRT"):
            flyc.compile_mlir(BACKEND_ABORT, assemble=False)
        assert flyc.compile_mlir(layout_offsets_mlir, assemble=False).kernels == {"layout_offsets": "pi"}
    assert isolate._worker.process.pid == worker


def test_a_worker_killed_between_compiles_is_replaced(layout_offsets_mlir, fresh_worker):
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    first = isolate._worker.process
    first.kill()
    first.wait()
    assert flyc.compile_mlir(layout_offsets_mlir, assemble=False).kernels == {"layout_offsets": "pi"}
    assert isolate._worker.process.pid != first.pid


def test_an_interrupted_wait_stops_the_worker(layout_offsets_mlir, fresh_worker):
    # Its answer to the interrupted compile would otherwise be read as the answer to the next one.
    class Interrupted:
        def read(self, *args):
            raise KeyboardInterrupt

        readline = readinto = peek = read

        def fileno(self):  # waited on for the answer (the compile's timeout), which then cannot be read
            return answers.fileno()

        def close(self):
            pass

    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    worker = isolate._worker
    answers, worker.process.stdout = worker.process.stdout, Interrupted()
    with pytest.raises(KeyboardInterrupt):
        flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    answers.close()
    assert worker.process.poll() is not None
    assert flyc.compile_mlir(layout_offsets_mlir, assemble=False).kernels == {"layout_offsets": "pi"}
    assert isolate._worker is not worker


def test_the_worker_follows_the_callers_sys_path(layout_offsets_mlir, fresh_worker, monkeypatch, tmp_path):
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    first = isolate._worker.process.pid
    monkeypatch.syspath_prepend(str(tmp_path))
    flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    assert isolate._worker.process.pid != first and isolate._worker.path[0] == str(tmp_path)


# The inputs that killed the caller's process before (issue 37): now each is an error.
LOAD_ALIGNED_3 = """
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%p: !llvm.ptr) kernel {
      %v = llvm.load %p {alignment = 3 : i64} : !llvm.ptr -> f32
      llvm.store %v, %p : f32, !llvm.ptr
      gpu.return
    }
  }
}
"""
EXTRACT_OUT_OF_RANGE = """
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%p: !llvm.ptr) kernel {
      %s = llvm.mlir.undef : !llvm.struct<(f32, f32)>
      %v = llvm.extractvalue %s[4294967296] : !llvm.struct<(f32, f32)>
      llvm.store %v, %p : f32, !llvm.ptr
      gpu.return
    }
  }
}
"""


def nested_modules(depth: int) -> str:
    return (
        "module attributes {gpu.container_module} {\n  gpu.module @m {\n"
        + "builtin.module {\n" * depth
        + "}\n" * depth
        + "  }\n}\n"
    )


@pytest.mark.parametrize("isolated", [True, False])
def test_an_llvm_alignment_that_is_not_a_power_of_two_is_refused_before_llvm(isolated):
    with pytest.raises(flyc.CompilationError, match=r"<input>:5:12: error: 'llvm.load' alignment = 3") as info:
        flyc.compile_mlir(LOAD_ALIGNED_3, assemble=False, isolate=isolated)
    assert info.value.stage == "input"


def test_an_assertion_in_the_parser_is_a_compilation_error():
    with pytest.raises(flyc.CompilationError, match="killed by SIGABRT") as info:
        flyc.compile_mlir(EXTRACT_OUT_OF_RANGE, assemble=False)
    assert info.value.stage == "input" and "Assertion `Index < Length" in info.value.diagnostics


def test_an_assertion_in_mlirs_python_bindings_is_a_compilation_error():
    # Found by tests/compiler/fuzz_mlir.py: this stray '.' makes the parser report an error that the bindings'
    # ErrorCapture does not expect.
    text = (EXAMPLES / "transpose.mlir").read_text()
    text = text.replace("        %out_ptr = fly.make_ptr", "  .     %out_ptr = fly.make_ptr")
    with pytest.raises(flyc.CompilationError, match="killed by SIGABRT") as info:
        flyc.compile_mlir(text, assemble=False)
    assert info.value.stage == "input" and "unhandled captured errors" in info.value.diagnostics


@pytest.mark.parametrize("isolated", [True, False])
def test_target_features_that_llvm_would_assert_on_are_refused(layout_offsets_mlir, isolated):
    # Found by tests/compiler/fuzz_mlir.py: "Feature flags should start with '+' or '-'" (MCSubtargetInfo.cpp).
    llvm = flyc.compile_mlir(layout_offsets_mlir, keep_stages=True, assemble=False).stages["llvm"]
    assert 'features = "+ptx80"' in llvm
    flyc.compile_mlir(llvm.replace('"+ptx80"', '"+ptx80,,-ptx81"'), start_after="llvm", assemble=False)
    with pytest.raises(flyc.CompilationError, match="target features: expected flags like '\\+ptx80'.* got 'ptx80'"):
        flyc.compile_mlir(llvm.replace('"+ptx80"', '"ptx80"'), start_after="llvm", assemble=False, isolate=isolated)


@pytest.mark.parametrize("isolated", [True, False])
def test_text_nested_too_deep_is_refused_before_parsing(isolated):
    flyc.compile_mlir(nested_modules(200), assemble=False, isolate=isolated)  # deep, but within the bound
    with pytest.raises(flyc.CompilationError, match=r"<input>:257:16: error: brackets nested more than 256 deep"):
        flyc.compile_mlir(nested_modules(5000), assemble=False, isolate=isolated)


def opt(*args: str, input: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flydsl.compiler.opt", "-", *args], input=input, capture_output=True, text=True
    )


def test_the_opt_cli_reports_an_assertion_as_an_error():
    result = opt(input=EXTRACT_OUT_OF_RANGE)
    assert result.returncode == 1, result.stderr
    assert "Assertion `Index < Length" in result.stderr
    assert "<stdin>: error: the compiler process was killed by SIGABRT; its stderr ends with:" in result.stderr


def test_the_opt_cli_goes_on_after_a_case_that_kills_its_child(layout_offsets_mlir):
    cases = [layout_offsets_mlir, EXTRACT_OUT_OF_RANGE, nested_modules(300), layout_offsets_mlir, "module {"]
    result = opt("--split", input="// -----\n".join(cases))
    assert result.returncode == 1
    outputs = result.stdout.split("// -----\n")
    assert [bool(output) for output in outputs] == [True, False, False, True, False]
    assert outputs[0] == outputs[3] and "fly.crd2idx" in outputs[0]
    deaths = result.stderr.split("<stdin>: error: the compiler process was killed by SIGABRT")
    assert len(deaths) == 2 and "Assertion `Index < Length" in deaths[1]
    assert "brackets nested more than 256 deep" in result.stderr and "error: expected operation name" in result.stderr
    assert result.stderr.index("Assertion") < result.stderr.index("brackets")  # in the order of the cases


def test_the_opt_cli_refuses_deep_nesting_and_unknown_binary_formats(layout_offsets_mlir):
    result = opt(input=nested_modules(5000))
    assert result.returncode == 1 and "<stdin>:257:16: error: brackets nested more than 256 deep" in result.stderr
    result = opt("-p", "builtin.module(gpu-module-to-binary{format=bogus})", input=layout_offsets_mlir)
    assert result.returncode == 2
    assert "--pass-pipeline: pass pipeline: gpu-module-to-binary's format must be one of" in result.stderr
    assert "got bogus" in result.stderr


def test_the_opt_cli_in_process_when_the_environment_says_so(monkeypatch):
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")
    result = opt(input=EXTRACT_OUT_OF_RANGE)
    assert result.returncode == -signal.SIGABRT  # what isolation prevents


def test_a_compile_past_the_timeout_kills_its_worker_and_raises(layout_offsets_mlir, monkeypatch):
    isolate.start_worker()  # (its start-up is not the compile's time)
    monkeypatch.setenv("FLYDSL_COMPILE_TIMEOUT", "0.001")
    with pytest.raises(flyc.CompilationError, match=r"did not finish within 0.001 s \(FLYDSL_COMPILE_TIMEOUT\)"):
        flyc.compile_mlir(layout_offsets_mlir, assemble=False, isolate=True)
    assert isolate._worker is None or isolate._worker.process.poll() is not None  # killed, not left running
    monkeypatch.setenv("FLYDSL_COMPILE_TIMEOUT", "0")  # no limit: a new worker compiles it
    assert flyc.compile_mlir(layout_offsets_mlir, assemble=False, isolate=True).kernels == {"layout_offsets": "pi"}


@pytest.mark.parametrize("text", ["soon", "-1", "inf"])
def test_a_timeout_that_is_not_a_duration_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("FLYDSL_COMPILE_TIMEOUT", text)
    with pytest.raises(ValueError, match="FLYDSL_COMPILE_TIMEOUT=.*expected a number of seconds"):
        settings.current()
