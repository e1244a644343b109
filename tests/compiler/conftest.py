from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def layout_offsets_mlir() -> str:
    """The MLIR demo kernel: thread i writes L(i % 64) for L = ((4,2),8):((16,1),2)."""
    return (EXAMPLES / "layout_offsets.mlir").read_text()


@pytest.fixture(autouse=True)
def _private_kernel_cache(tmp_path, monkeypatch):
    """Every test gets its own on-disk kernel cache."""
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "flydsl-cache"))
