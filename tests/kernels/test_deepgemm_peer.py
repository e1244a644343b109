"""benchmarks/deepgemm_peer.py, blockscale_gemm_bench.py's DeepGEMM peer, without a GPU or DeepGEMM: its import
error recorded, a stand-in module checked and timed, refusals recorded, the summary's DeepGEMM fields."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_blockscale_bench_deepgemm_peer(monkeypatch):
    """blockscale_gemm_bench's DeepGEMM peer without a GPU: an absent deep_gemm is recorded with its import error;
    a stand-in module (its fp8_gemm_nt the float32 product of the dequantized operands, on CPU tensors) is checked
    against the reference and timed; shapes DeepGEMM refuses, calls that fail and outputs that miss the reference are
    recorded why; the summary's DeepGEMM fields and ``--shapes``."""
    import argparse
    import types

    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import blockscale_gemm_bench as bench
    import deepgemm_peer

    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # an import of it fails
    dg, info = deepgemm_peer.load()
    assert dg is None and info["available"] is False and "deep_gemm" in info["import_error"]
    assert bench.shape_arg("4096x7168X16384") == (4096, 7168, 16384)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.shape_arg("4096x7168")
    assert deepgemm_peer.refusal(512, 7168, 16384) is None and "K 1000" in deepgemm_peer.refusal(512, 7168, 1000)

    m, n, k = 8, 256, 384
    a = (torch.randn(m, k) * 16).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k) * 16).to(torch.float8_e4m3fn)
    a_scales, w_scales = torch.rand(m, k // 128) + 0.5, torch.rand(n // 128, k // 128) + 0.5
    sa = a_scales.repeat_interleave(128, dim=1)
    sw = w_scales.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    reference = (a.float() * sa) @ (w.float() * sw).t()
    calls = []

    def fp8_gemm_nt(lhs, rhs, out):
        (x, sx), (y, sy) = lhs, rhs
        calls.append(sx.stride())
        out.copy_(
            (x.float() * sx.repeat_interleave(128, dim=1))
            @ (y.float() * sy.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
        )

    stand_in = types.SimpleNamespace(
        get_mn_major_tma_aligned_tensor=lambda sf: bench._m_major(torch, sf), fp8_gemm_nt=fp8_gemm_nt
    )
    call, fields = deepgemm_peer.check(torch, stand_in, a, w, a_scales, w_scales, reference, bench._error)
    assert call is not None and fields["deepgemm_rel_error_vs_f32"] < 1e-2 and "deepgemm_refused" not in fields
    assert fields["deepgemm_sfa_strides"] == [1, 8] and calls == [(1, 8)]  # M-major, M padded to 4 floats
    call()
    assert len(calls) == 2
    stand_in.fp8_gemm_nt = lambda lhs, rhs, out: out.zero_()
    call, fields = deepgemm_peer.check(torch, stand_in, a, w, a_scales, w_scales, reference, bench._error)
    assert call is None and fields["deepgemm_refused"].startswith("ran, rel error 1.00e+00")

    def refuse(lhs, rhs, out):
        raise RuntimeError("Assertion error (csrc/apis/gemm.hpp:93): m == m_ and n == n_\nmore")

    stand_in.fp8_gemm_nt = refuse
    call, fields = deepgemm_peer.check(torch, stand_in, a, w, a_scales, w_scales, reference, bench._error)
    assert call is None and fields == {
        "deepgemm_refused": "RuntimeError: Assertion error (csrc/apis/gemm.hpp:93): m == m_ and n == n_"
    }

    rows = [
        {
            "m": 4096,
            "n": 7168,
            "k": 16384,
            "flydsl_tflops": 700.0,
            "deepgemm_tflops": 650.0,
            "ratio_vs_deepgemm": 1.25,
            "deepgemm_rel_error_vs_f32": 3e-3,
            "rel_error_vs_f32": 2e-3,
            "flydsl_rested_tflops": 800.0,  # --rested: each call after an 8 GB fill, as DeepGEMM times itself
            "deepgemm_rested_tflops": 780.0,
        },
        {"m": 512, "n": 7168, "k": 16384, "flydsl_tflops": 500.0, "ratio_vs_deepgemm": 0.8, "rel_error_vs_f32": 2e-3},
        {"m": 64, "n": 7168, "k": 1000, "flydsl_tflops": 50.0, "deepgemm_refused": "K 1000", "rel_error_vs_f32": 2e-3},
    ]
    rows[2].update(fraction_of_copy=0.6, fraction_of_read_copy=1.1)  # the half copy's bytes, and all the weights'
    rows[1].update(fraction_of_copy=0.7, fraction_of_read_copy=1.0)
    summary = bench.summarize(rows, {"available": True, "commit": "54e2261"})
    assert summary["geomean_ratio_vs_deepgemm"] == pytest.approx(1.0) and summary["min_ratio_vs_deepgemm"] == 0.8
    assert summary["deepgemm_tflops_4096x7168x16384"] == 650.0 and summary["cases_deepgemm_refused"] == 1
    assert summary["deepgemm_commit"] == "54e2261" and summary["max_deepgemm_rel_error_vs_f32"] == 3e-3
    assert summary["cases_vs_cublas"] == 0 and summary["geomean_ratio_vs_rowwise_m_ge_512"] is None
    assert summary["tflops_4096x7168x16384_rested"] == 800.0
    assert summary["deepgemm_tflops_4096x7168x16384_rested"] == 780.0
    assert summary["decode_min_fraction_of_copy"] == 0.6 and summary["decode_min_fraction_of_read_copy"] == 1.0
    assert bench.summarize(rows[1:], info)["deepgemm_import_error"] == info["import_error"]
