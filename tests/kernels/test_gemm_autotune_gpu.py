"""Autotuned GEMMs on the GPU (``gpu``): ``gemm``, ``skinny`` shapes and ``fp8_gemm`` with ``autotune=True`` give
right results into poisoned outputs, time their candidates once (the progress line), keep the winner on disk (a fresh
process state finds it without timing again) and keep plans apart from untuned calls of the same shapes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import flydsl.compiler as flyc  # noqa: E402
from flydsl.kernels import plans  # noqa: E402
from flydsl.kernels.gemm import fp8_gemm, gemm  # noqa: E402


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path))  # (kernels compile again here: a few seconds)
    flyc.autotune.clear()
    plans.clear_all()
    yield tmp_path
    flyc.autotune.clear()
    plans.clear_all()


def _forget_in_memory():
    flyc.autotune.clear()
    plans.clear_all()


@pytest.mark.parametrize("m,n,k", [(1000, 776, 520), (8, 4096, 1024)], ids=["dense", "skinny"])
def test_autotuned_gemm_is_right_and_tunes_once(fresh_cache, capfd, m, n, k):
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()
    reference = a.double() @ b.double()
    for attempt in range(2):  # the second after forgetting everything but the disk
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert gemm(a, b, out, autotune=True) is out
        torch.cuda.synchronize()
        assert ((out.double() - reference).norm() / reference.norm()).item() < 1e-2
        progress = capfd.readouterr().err
        assert ("flydsl autotune" in progress) == (attempt == 0), progress
        _forget_in_memory()
    assert any(fresh_cache.rglob("*.flyc"))


def test_autotuned_fp8_gemm_is_right(fresh_cache):
    m, n, k = 520, 1032, 528
    a = (torch.randn(m, k, device="cuda") * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 8).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_gemm(a, b, scale_a, scale_b, out, autotune=True)
    torch.cuda.synchronize()
    reference = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    assert ((out.double() - reference).norm() / reference.norm()).item() < 8e-3
    untuned = fp8_gemm(a, b, scale_a, scale_b)  # its own plan: the cost model's
    torch.cuda.synchronize()
    assert ((untuned.double() - reference).norm() / reference.norm()).item() < 8e-3
