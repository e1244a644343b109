"""benchmarks/paged_decode_merge.py on the CPU: its cases and its summary (the timing needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import paged_decode_merge

    return paged_decode_merge


def test_cases(bench):
    assert bench._case("llama3-8b:4:512:fp8-token") == ("llama3-8b", 4, 512, "fp8-token")
    assert len(bench.CASES) == 14 and all(len(bench._case(c)) == 4 for c in bench.CASES)
    with pytest.raises(Exception, match="model:batch:context:kv"):
        bench._case("llama2:1:512:bf16")


def test_summary(bench):
    def row(default, last, kernel, read=10.0, correct=True):
        times = {"default_us": default, "last_us": last, "kernel_us": kernel, "read_us": read}
        return times | {"kernel_speedup": last / kernel, "default_fraction_of_read": read / default, "correct": correct}

    rows = [row(20.0, 20.0, 25.0), row(16.0, 20.0, 16.0), row(40.0, 30.0, 40.0), row(1.0, 9.0, 9.0, correct=False)]
    s = bench.summarize(rows)
    assert s["default_vs_best_geomean"] == pytest.approx((30 / 40) ** (1 / 3))  # the third case picked the slower
    assert s["kernel_speedup_geomean"] == pytest.approx((0.8 * 1.25 * 0.75) ** (1 / 3))
    assert s["min_default_fraction_of_read"] == 0.25 and s["cases"] == 4 and s["cases_failed"] == 1
