"""Helpers of the row kernels' CPU tests (test_norms_cpu.py, test_norms_staged_forward_cpu.py,
test_norms_routes_cpu.py): arrays that only describe themselves, PTX assembled and read back by ``ptxas -v`` (spills,
registers, shared memory), the forward's variants, and a route's kernel compiled for fake arguments."""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import subprocess
import tempfile
from typing import NamedTuple

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.rows.configs import NormFlags
from flydsl.kernels.rows.exchange import exchange_columns
from flydsl.kernels.rows.router import Route, RowKernel, RowOp

forward_mod = importlib.import_module("flydsl.kernels.norms.forward")
backward_mod = importlib.import_module("flydsl.kernels.norms.backward")
column_sum_mod = importlib.import_module("flydsl.kernels.norms.column_sum")
softmax_mod = importlib.import_module("flydsl.kernels.softmax.kernels")  # (flydsl.kernels.softmax: the function)
launch_mod = importlib.import_module("flydsl.kernels.rows.launch")


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """Each test module compiles into a cache of its own (imported by the test modules: autouse there); its tests
    share it, so that a kernel two tests lower is compiled once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLYDSL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


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


HAS_PTXAS = flyc.find_ptxas() is not None


def assembled(module) -> str:
    if HAS_PTXAS:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def exchange_spec(cfg):
    """A staged kernel's ``exchange`` argument: a team's tagged pairs (its columns), else unused."""
    return flyc.TensorSpec((8, exchange_columns(cfg)), "f32")


class Resources(NamedTuple):
    """What ``ptxas -v`` reports for a kernel on sm_90a: spill stores (bytes), registers per thread, static shared
    memory (bytes)."""

    spills: int
    registers: int
    shared: int


_REPORTS: dict = {}  # sha256 of the PTX -> ptxas -v's report


def _ptxas_report(ptx: str) -> str:
    """ptxas -v's report for sm_90a (run once per PTX)."""
    digest = hashlib.sha256(ptx.encode()).hexdigest()
    if digest not in _REPORTS:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            report = subprocess.run(
                [flyc.find_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.devnull], capture_output=True, text=True
            )
        _REPORTS[digest] = report.stdout + report.stderr
    return _REPORTS[digest]


def resources(ptx: str) -> Resources:
    """``ptxas -v``'s report for sm_90a (one kernel per module)."""
    report = _ptxas_report(ptx)
    spills = re.search(r"(\d+) bytes spill stores", report)
    used = re.search(r"Used (\d+) registers", report)
    assert spills and used, report
    shared = re.search(r"(\d+) bytes smem", report)
    return Resources(int(spills.group(1)), int(used.group(1)), int(shared.group(1)) if shared else 0)


def spill_bytes(ptx: str) -> int:
    """ptxas -v's spill stores for sm_90a."""
    return resources(ptx).spills


def registers(ptx: str) -> int:
    """ptxas -v's registers per thread for sm_90a."""
    return resources(ptx).registers


# The forward's variants: LayerNorm with every output, RMSNorm, the fused add + RMSNorm
FORWARD_FLAGS = {
    "layer": NormFlags(rms=False, weight=True, bias=True, mean=True, rstd=True),
    "rms": NormFlags(rms=True, weight=True, rstd=True),
    "fused": NormFlags(rms=True, residual=True, weight=True, rstd=True),
}
_FORWARD_VARIANT = {RowOp.LAYER_NORM: "layer", RowOp.RMS_NORM: "rms", RowOp.FUSED_ADD_RMS_NORM: "fused"}


def backward_flags(op: RowOp, sums: int) -> NormFlags:
    """The backward's flags for ``sums`` column sums (0: no weight; LayerNorm 2: weight and bias, RMSNorm 1)."""
    return NormFlags(rms=op is RowOp.RMS_NORM_BACKWARD, weight=sums > 0, bias=sums > 1)


def forward_args(n: int, dtype: str, weight_dtype: str | None = None) -> tuple:
    """The norms' forward tensors as specs: (x, residual, weight, bias, out, residual_out, mean, rstd) of 8 rows."""
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    weight = flyc.TensorSpec((n,), weight_dtype or dtype)
    return rows, rows, weight, weight, rows, rows, stats, stats


def backward_args(n: int, dtype: str, cfg, weight_dtype: str | None = None) -> tuple:
    """The backward's tensors as specs: (dy, x, weight, mean, rstd, dx, dweight, dbias, partial, exchange) of 8
    rows."""
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, max(1, cfg.sums) * n), "f32")
    weight = flyc.TensorSpec((n,), weight_dtype or dtype)
    return rows, rows, weight, stats, stats, rows, weight, weight, partial, exchange_spec(cfg)


def lower_route(op: RowOp, chosen: Route, n: int, dtype: str, sums: int = 0, weight_dtype: str | None = None):
    """The kernel of ``chosen`` (a route of ``op`` on rows of ``n`` ``dtype`` elements; ``sums``: the backward's
    column sums) compiled for 8 rows of fake tensors, with every input and output of the op (LayerNorm's forward:
    its statistics too)."""
    cfg, kernel = chosen.config, chosen.kernel
    rows = flyc.TensorSpec((8, n), dtype)
    if op is RowOp.SOFTMAX:
        if kernel is RowKernel.STAGED:
            return softmax_mod.softmax_forward_staged_kernel.lower(rows, rows, exchange_spec(cfg), cfg)
        return softmax_mod.softmax_forward_kernel.lower(rows, rows, cfg)
    if op is RowOp.SOFTMAX_BACKWARD:
        if kernel is RowKernel.STAGED:
            return softmax_mod.softmax_backward_staged_kernel.lower(rows, rows, rows, exchange_spec(cfg), cfg)
        return softmax_mod.softmax_backward_kernel.lower(rows, rows, rows, cfg)
    if op.backward:
        args = backward_args(n, dtype, cfg, weight_dtype)
        return backward_mod.norm_backward_kernel.lower(*args, cfg, backward_flags(op, sums))
    flags = FORWARD_FLAGS[_FORWARD_VARIANT[op]]
    args = forward_args(n, dtype, weight_dtype)
    if kernel is RowKernel.STAGED:
        return forward_mod.norm_forward_staged_kernel.lower(*args, exchange_spec(cfg), 1e-5, cfg, flags)
    if kernel is RowKernel.LOOPED:
        return forward_mod.norm_forward_looped_kernel.lower(*args, 1e-5, cfg, flags)
    return forward_mod.norm_forward_kernel.lower(*args, 1e-5, cfg, flags)


def forward_flags(op: RowOp) -> NormFlags:
    """The flags :func:`lower_route` compiles a norm forward ``op`` with."""
    return FORWARD_FLAGS[_FORWARD_VARIANT[op]]


class Recorder:
    """Stands in for a kernel: each launch appends ``(name, config, launch keywords)`` to ``taken`` (the config is
    the kernel's argument at ``position``)."""

    def __init__(self, name: str, taken: list, position: int):
        self.name, self.taken, self.position = name, taken, position

    def __call__(self, *args):
        recorder = self

        class Call:
            def launch(self, **kwargs):
                recorder.taken.append((recorder.name, args[recorder.position], kwargs))

        return Call()


def record_launches(monkeypatch, kernels: dict, sms: int = 132) -> list:
    """Replaces the kernels ``kernels`` names (``{module: {name: the position of its config among its arguments}}``)
    by :class:`Recorder` stand-ins; the device has ``sms`` SMs and the driver says nothing about clusters. Returns
    the list the launches go to."""
    taken = []
    for module, names in kernels.items():
        for name, position in names.items():
            monkeypatch.setattr(module, name, Recorder(name, taken, position))
    for module in (*kernels, launch_mod):
        if hasattr(module, "sm_count"):
            monkeypatch.setattr(module, "sm_count", lambda device: sms)
    monkeypatch.setattr(launch_mod, "max_active_clusters", lambda *args: None)
    return taken
