"""Shared pytest configuration: GPU tests are marked ``gpu`` and skipped where no CUDA device can be used."""

from __future__ import annotations

import pytest


def _gpu_available() -> bool:
    try:
        from flydsl.compiler import runtime
    except ImportError:
        return False
    return runtime.is_available()


def pytest_configure(config):
    # ptxas's "Potential Performance Loss" notes (e.g. every wgmma of a kernel serialized) fail the tests that compile
    # the kernel, warm disk cache or not; where only flydsl-layout is installed (tox's layout env) there is no compiler.
    try:
        import flydsl.compiler.errors  # noqa: F401
    except ImportError:
        return
    config.addinivalue_line("filterwarnings", "error::flydsl.compiler.errors.PerformanceWarning")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/compiler/golden/* from the current compiler"
    )


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items) or _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a working CUDA driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_launch_plans(monkeypatch):
    """Each test starts without the zoo's launch plans (flydsl.kernels.plans): a plan kept by an earlier test holds
    the kernels and routes of its time, which a test that replaces them (monkeypatch) must not meet. Plans kept on
    disk are off too (FLYDSL_PLAN_CACHE=0; the disk keys do not see a monkeypatch): the tests of kept plans turn them
    on themselves."""
    try:
        from flydsl.kernels import plans
    except ImportError:  # flydsl-layout alone (tox's layout env)
        yield
        return
    monkeypatch.setenv("FLYDSL_PLAN_CACHE", "0")
    monkeypatch.setattr(plans, "_routes_edited", False)
    plans.clear_all()
    yield


def _graphed(fn):
    """``fn`` run once on a side stream (what may not happen while capturing: compiling, loading a module, making a
    launch plan), then captured in a CUDA graph; returns (graph, what the captured call returned)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


@pytest.fixture
def graphed():
    """The CUDA-graph capture of the GPU tests (docs/torch.md, "CUDA graphs"): ``graph, result = graphed(fn)``."""
    return _graphed
