"""examples/moe_expert_parallel.py: on the CPU (gloo, float32) a world of one in this process and a world of two under
torchrun, each rank's tokens through the split layer equal to the whole layer's; bad sizes refused. GPU (``gpu``): a
world of one on NCCL (bf16); more GPUs: torchrun over all of them."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "moe_expert_parallel.py"
SMALL = ["--hidden", "64", "--inter", "32", "--tokens", "40"]


def _example():
    spec = importlib.util.spec_from_file_location("flydsl_example_moe_expert_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return subprocess.run([*command, str(EXAMPLE), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_world_of_one_on_the_cpu(capsys):
    assert _example().main([*SMALL, "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "E 8 over 1 rank(s) (8 each)" in out and "gloo, float32" in out and out.rstrip().endswith("= 0.0e+00 ok")
    assert not dist.is_initialized()


def test_two_ranks_under_torchrun_on_the_cpu():
    run = _torchrun(2, *SMALL, "--cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "E 8 over 2 rank(s) (4 each)" in run.stdout and " ok" in run.stdout and "WRONG" not in run.stdout


def test_bad_sizes_are_refused(capsys):
    assert _example().main(["--hidden", "1000", "--inter", "100"]) == 2
    assert "multiples of 8" in capsys.readouterr().err
    assert _example().main([*SMALL, "--experts", "6", "--cpu"]) == 0  # one rank holds any number


@pytest.mark.gpu
def test_a_world_of_one_on_a_gpu(capsys):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch and a GPU")
    assert _example().main([]) == 0
    out = capsys.readouterr().out
    assert "1 GPU(s), NCCL, bf16" in out and " ok" in out and "one forward" in out


@pytest.mark.gpu
def test_every_gpu_under_torchrun():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 or more GPUs")
    ranks = min(torch.cuda.device_count(), 8)
    ranks = max(r for r in (2, 4, 8) if r <= ranks)
    run = _torchrun(ranks)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{ranks} GPU(s), NCCL, bf16" in run.stdout and " ok" in run.stdout
