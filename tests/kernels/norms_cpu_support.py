"""Helpers of the norms' CPU tests (test_norms_cpu.py, test_norms_staged_forward_cpu.py): arrays that only describe
themselves, PTX assembled and its spills counted by ptxas, the forward's variants."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import tempfile

import pytest

import flydsl.compiler as flyc

norm_mod = importlib.import_module("flydsl.kernels.normalization")
softmax_mod = importlib.import_module("flydsl.kernels.softmax")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test compiles into its own cache (imported by the test modules: autouse there)."""
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))


class FakeGpuTensor:
    """Only ``__cuda_array_interface__`` (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, pointer=1 << 20):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (pointer, False),
            "strides": strides,
            "version": 3,
        }


def fake(shape=(4, 64), typestr="<f4", strides=None):
    return FakeGpuTensor(shape, typestr, strides)


def assembled(module) -> str:
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def exchange_spec(cfg):
    """The backward's ``exchange`` argument: a team's tagged row sums, else unused."""
    return flyc.TensorSpec((8, norm_mod.exchange_columns(cfg)), "f32")


def _ptxas_report(ptx: str) -> str:
    """ptxas -v's report for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        report = subprocess.run(
            [flyc.find_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.devnull], capture_output=True, text=True
        )
    return report.stdout + report.stderr


def spill_bytes(ptx: str) -> int:
    """ptxas -v's spill stores for sm_90a."""
    report = _ptxas_report(ptx)
    found = re.search(r"(\d+) bytes spill stores", report)
    assert found, report
    return int(found.group(1))


def registers(ptx: str) -> int:
    """ptxas -v's registers per thread for sm_90a."""
    report = _ptxas_report(ptx)
    found = re.search(r"Used (\d+) registers", report)
    assert found, report
    return int(found.group(1))


# The forward's variants: LayerNorm with every output, RMSNorm, the fused add + RMSNorm
FORWARD_FLAGS = {
    "layer": norm_mod.NormFlags(False, weight=True, bias=True, mean=True, rstd=True),
    "rms": norm_mod.NormFlags(True, weight=True, rstd=True),
    "fused": norm_mod.NormFlags(True, residual=True, weight=True, rstd=True),
}
