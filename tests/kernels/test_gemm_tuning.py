"""GEMM autotuning without a GPU: the candidate lists (the cost model's choice first, no two alike, each one planning
for bf16 and fp8 e4m3 operands of several shapes) and tuned_plan's choice through a fake timer."""

from __future__ import annotations

import pytest

from flydsl.compiler import autotune
from flydsl.kernels.gemm import MatrixSpec, Scale, choose_config, choose_fp8_config, plan_gemm, tuning
from flydsl.kernels.gemm.plan import plan_dense, plan_skinny
from flydsl.kernels.gemm.skinny import choose_skinny_config

SMS = 132
E4M3 = "f8E4M3FN"
DENSE_SHAPES = [(4096, 4096, 4096), (64, 7168, 2048), (512, 1536, 7168), (8192, 28672, 8192), (1, 4096, 4096),
                (128, 128, 8192), (3000, 1000, 3000)]  # fmt: skip
SKINNY_SHAPES = [(1, 4096, 4096), (16, 14336, 4096), (8, 1536, 7168), (1, 128, 8192), (12, 1000, 4112)]


def _specs(m, n, k, dtype, b_major="K"):
    a = MatrixSpec.dense((m, k), dtype)
    b = MatrixSpec.dense((n, k), dtype).transposed() if b_major == "K" else MatrixSpec.dense((k, n), dtype)
    return a, b, MatrixSpec.dense((m, n), "bf16")


def _fp8_scales(m, n):
    return (Scale(rows=1), MatrixSpec.dense((m,), "f32")), (Scale(columns=1), MatrixSpec.dense((n,), "f32"))


@pytest.mark.parametrize("m,n,k", DENSE_SHAPES)
@pytest.mark.parametrize("dtype", ["bf16", E4M3])
def test_dense_candidates_start_with_the_cost_models_choice_and_all_plan(m, n, k, dtype):
    operand_bytes = 2 if dtype == "bf16" else 1
    candidates = tuning.dense_candidates(m, n, k, SMS, operand_bytes)
    chosen = (choose_config if operand_bytes == 2 else choose_fp8_config)(m, n, k, SMS)
    assert candidates[0] == chosen
    assert 1 < len(candidates) <= tuning.MAX_CANDIDATES and len(set(candidates)) == len(candidates)
    scales = () if operand_bytes == 2 else _fp8_scales(m, n)
    for b_major in ("K", "MN"):
        for cfg in candidates:
            plan = plan_dense(*_specs(m, n, k, dtype, b_major), sms=SMS, scales=scales, config=cfg)
            assert plan.config == cfg and plan.launches


@pytest.mark.parametrize("m,n,k", SKINNY_SHAPES)
@pytest.mark.parametrize("dtype", ["bf16", E4M3])
def test_skinny_candidates_start_with_the_cost_models_choice_and_all_plan(m, n, k, dtype):
    element_bytes = 2 if dtype == "bf16" else 1
    candidates = tuning.skinny_candidates(m, n, k, SMS, element_bytes)
    first = choose_skinny_config(m, n, k * element_bytes // 2, SMS, element_bytes)
    assert candidates[0] == (first if element_bytes == 2 else first.__class__(**{**first.__dict__, "splits": 1}))
    assert 1 < len(candidates) <= tuning.MAX_CANDIDATES and len(set(candidates)) == len(candidates)
    scales = () if element_bytes == 2 else _fp8_scales(m, n)
    for cfg in candidates:
        assert element_bytes == 2 or cfg.splits == 1  # the scaled skinny kernel does not split K
        plan = plan_skinny(*_specs(m, n, k, dtype), sms=SMS, scales=scales, config=cfg)
        assert plan is not None and plan.route == "skinny" and plan.config == cfg


@pytest.fixture
def fake_tuning(tmp_path, monkeypatch):
    """A private disk cache, a fixed device, and a timer that charges each plan by its configuration's place in a
    list the test sets (the last candidate fastest unless set)."""
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "flydsl-cache"))
    monkeypatch.setattr(tuning, "_device", lambda device: ("Fake H200", "132 SMs"))
    autotune.clear()
    ran = []

    def timer(fn):
        fn()
        return 1.0 / (1 + timed.index(ran[-1].config))

    timed = []
    monkeypatch.setattr(tuning, "_timer", timer)
    yield ran, timed
    autotune.clear()


def test_tuned_plan_takes_the_fastest_dense_config(fake_tuning):
    ran, timed = fake_tuning
    m, n, k = 3000, 4096, 4096
    a, b, out = _specs(m, n, k, "bf16")
    timed.extend(tuning.dense_candidates(autotune.bucket(m), n, k, SMS))
    plan = tuning.tuned_plan(a, b, out, ran.append, sms=SMS)
    assert plan.route == "gemm_ws" and plan.config == timed[-1] and len(ran) == len(timed)
    ran.clear()
    again = tuning.tuned_plan(*_specs(2500, n, k, "bf16"), ran.append, sms=SMS)  # the same M bucket
    assert again.config == timed[-1] and ran == []


def test_tuned_plan_keeps_the_skinny_route_for_fp8_decode(fake_tuning):
    ran, timed = fake_tuning
    m, n, k = 4, 4096, 4096
    timed.extend(tuning.skinny_candidates(autotune.bucket(m), n, k, SMS, 1))
    scales = _fp8_scales(m, n)
    plan = tuning.tuned_plan(*_specs(m, n, k, E4M3), ran.append, sms=SMS, scales=scales)
    assert plan.route == "skinny" and plan.config == timed[-1]
    assert plan_gemm(*_specs(m, n, k, E4M3), sms=SMS, scales=scales).route == "skinny"
