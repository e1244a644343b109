"""examples/moe.py (docs/moe.md). CPU: without a GPU ``main`` compiles the kernels both routes launch (the grouped
warp-specialized GEMMs, the gather, the grouped skinny GEMMs, the combine) for sm_90a and summarizes them. GPU
(``gpu``): a prefill and a decode batch checked against the float32 reference."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

import flydsl.compiler as flyc

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe.py"


def _example():
    spec = importlib.util.spec_from_file_location("flydsl_example_moe", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(flyc.runtime.is_available(), reason="on a GPU main() runs the batches (the GPU test does that)")
def test_main_compiles_and_summarizes_without_a_gpu(capsys):
    assert _example().main(["--experts", "16", "--top-k", "4", "--hidden", "512", "--inter", "256"]) == 0
    out = capsys.readouterr().out
    for name in ("prefill stage 1: gemm_ws_grouped", "prefill stage 2", "prefill gather", "decode stage 1", "combine"):
        assert f"{name}" in out
    assert out.count("compiled, ") == 6 and "wgmma" in out and "mma.sync" in out
    if flyc.toolchain.find_ptxas() is not None:
        assert out.count("assembled for sm_90a") == 6
    assert out.rstrip().endswith("compiled only (run on a GPU machine to run both batches and check them)")


def test_bad_sizes_are_refused(capsys):
    assert _example().main(["--hidden", "1000", "--inter", "100"]) == 2
    assert "multiples of 8" in capsys.readouterr().err


@pytest.mark.gpu
def test_main_runs_and_checks_both_batches_on_a_gpu(capsys):
    if not flyc.runtime.is_available():
        pytest.skip("needs an NVIDIA GPU with a working CUDA driver")
    assert _example().main([]) == 0
    out = capsys.readouterr().out
    assert "decode (grouped skinny GEMM)" in out and "prefill (warp-specialized)" in out and "WRONG" not in out
