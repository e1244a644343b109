"""Shared pytest configuration: GPU tests are marked ``gpu`` and skipped where no CUDA device can be used."""

from __future__ import annotations

import pytest


def _gpu_available() -> bool:
    try:
        from flydsl.compiler import runtime
    except ImportError:
        return False
    return runtime.is_available()


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
