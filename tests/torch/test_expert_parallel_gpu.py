"""``nn.MoE(ep_group=...)`` on GPUs over NCCL (tests/torch/expert_parallel_gpu_worker.py under torchrun): a world of
one on one GPU (bit for bit the plain module), then every GPU of the machine (2, 4 or 8: the whole layer's result
within bf16 rounding)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "expert_parallel_gpu_worker.py"

pytestmark = pytest.mark.gpu


def _torchrun(ranks: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(WORKER)]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_a_world_of_one():
    if _gpus() < 1:
        pytest.skip("needs a CUDA build of torch and a GPU")
    run = _torchrun(1)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "expert parallel over 1 GPU(s): ok" in run.stdout


def test_every_gpu():
    if _gpus() < 2:
        pytest.skip("needs 2 or more GPUs")
    ranks = max(r for r in (2, 4, 8) if r <= _gpus())
    run = _torchrun(ranks)
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"expert parallel over {ranks} GPU(s): ok" in run.stdout
