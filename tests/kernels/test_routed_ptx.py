"""A refactor of the zoo keeps its generated code: what the entry points launch for a selection of inputs (kernel,
grid, block, cluster and the PTX's hash) is what ``golden/routed_ptx.json`` records. ``python -m
tests.kernels.routed_ptx`` compares every case of the file (1405: each routing edge of every op, dtype and layout,
and gemm's planned kernels); ``--write`` rewrites it once a change is meant to change the code."""

from __future__ import annotations

import json

from . import routed_ptx
from .norms_cpu_support import private_cache  # noqa: F401 (an autouse fixture)


def _differences(found: dict) -> list:
    golden = json.loads(routed_ptx.GOLDEN.read_text())
    return [(name, golden.get(name), value) for name, value in found.items() if golden.get(name) != value]


def test_row_ops_launch_as_the_golden_file_says():
    found = json.loads(json.dumps(routed_ptx.launches(routed_ptx.smoke_cases())))
    assert len(found) == len(routed_ptx.smoke_cases())
    assert not _differences(found)


def test_gemm_launches_as_the_golden_file_says():
    found = json.loads(json.dumps(routed_ptx.gemm_launches(routed_ptx.smoke_gemm_cases())))
    assert not _differences(found)


def test_a_changed_kernel_changes_its_hash(monkeypatch):
    """The comparison sees code changes: another store group in the routed register config gives other PTX."""
    from flydsl.kernels.rows import router

    case = routed_ptx.Case("rms_norm", "bf16", 1024)
    before = routed_ptx.launches([case])[case.name]
    monkeypatch.setitem(router.FORWARD_STORE_GROUP, "bf16", 1)
    router.clear_cache()
    try:
        after = routed_ptx.launches([case])[case.name]
    finally:
        monkeypatch.undo()
        router.clear_cache()
    assert before[0][4] != after[0][4] and before[0][:4] == after[0][:4]
