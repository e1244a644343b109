"""benchmarks/expert_parallel_bench.py on the CPU: its models and cases, the accounting (ranks per token under uniform
routing, bytes per exchange, FLOPs, phases from marks), ``--list`` without torch.distributed, and a whole run of a
small model in a world of one over gloo (float32 references, the host's clock) writing a valid record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import expert_parallel_bench

    return expert_parallel_bench


def test_models_cases_and_accounting(bench):
    assert bench.MODELS["mixtral-8x7b"] == (8, 2, 4096, 14336, "softmax")
    assert bench.MODELS["deepseek-v3"] == (256, 8, 7168, 2048, "sigmoid")
    assert bench.TOKENS == (256, 4096, 16384)
    assert bench.cases(list(bench.MODELS), bench.TOKENS)[:4] == [
        ("mixtral-8x7b", 256),
        ("mixtral-8x7b", 4096),
        ("mixtral-8x7b", 16384),
        ("deepseek-v3", 256),
    ]
    mixtral, deepseek = bench.MODELS["mixtral-8x7b"], bench.MODELS["deepseek-v3"]
    assert bench.local_experts(mixtral, 8) == 1 and bench.local_experts(deepseek, 8) == 32
    with pytest.raises(ValueError, match="8 experts do not split over 3 ranks"):
        bench.local_experts(mixtral, 3)
    # one expert a rank: a token's 2 experts are 2 ranks; one rank: 1; DeepSeek over 8: 8 * (1 - C(224, 8) / C(256, 8))
    assert bench.expected_destinations(8, 2, 8) == pytest.approx(2.0)
    assert bench.expected_destinations(256, 8, 1) == pytest.approx(1.0)
    assert bench.expected_destinations(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    assert 5.2 < bench.expected_destinations(256, 8, 8) < 5.4
    assert bench.expected_destinations(8, 2, 2) == pytest.approx(2 * (1 - math.comb(4, 2) / math.comb(8, 2)))
    assert bench.exchange_bytes(10, deepseek) == {"dispatch_bytes": 10 * (7168 * 2 + 64), "combine_bytes": 10 * 14336}
    assert bench.layer_flops(16384 * 2, 4096, 14336) == 2 * 16384 * 2 * 3 * 14336 * 4096
    marks = [("start", 0.0), ("route", 5.0), ("counts", 7.0), ("dispatch", 17.0), ("experts", 67.0)]
    marks += [("dispatch", 70.0), ("experts", 100.0), ("combine", 110.0), ("combine", 115.0), ("tail", 116.0)]
    assert bench.phase_times(marks) == {
        "route_us": 5.0,
        "counts_us": 2.0,
        "dispatch_us": 13.0,  # (chunked: both chunks' waits added)
        "experts_us": 80.0,
        "combine_us": 15.0,
        "tail_us": 1.0,
    }


def test_arguments_and_list(bench, capsys, monkeypatch):
    args = bench.parse_args([])
    assert args.model == ["mixtral-8x7b", "deepseek-v3"] and args.tokens == [256, 4096, 16384] and args.repeats == 10
    assert args.json is None and not args.cpu and not args.no_one_gpu
    args = bench.parse_args(["--model", "deepseek-v3", "--tokens", "256,4096", "--repeats", "3"])
    assert args.model == ["deepseek-v3"] and args.tokens == [256, 4096] and args.repeats == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "gpt-5"])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert bench.main(["--list"]) == 0  # (no torch.distributed: 8 ranks unless told)
    out = capsys.readouterr().out
    assert "mixtral-8x7b  world=8 T=16384  (131072 tokens) 1 experts/rank, ~2.00 ranks per token" in out
    assert out.strip().endswith("6 cases")
    assert bench.main(["--list", "--world", "3", "--model", "deepseek-v3", "--tokens", "256"]) == 0
    assert "not run: 256 experts do not split over 3 ranks" in capsys.readouterr().out


def test_a_small_run_in_a_world_of_one_writes_a_record(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(bench.MODELS, "tiny", bench.Model(8, 2, 32, 24, "softmax"))
    path = tmp_path / "ep.json"
    argv = ["--model", "tiny", "--tokens", "16,40", "--repeats", "2", "--cpu", "--json", str(path)]
    assert bench.main(argv) == 0
    record = json.loads(path.read_text())
    import record as record_module

    record_module.validate(record)
    assert record["benchmark"] == "expert_parallel_bench" and record["world"] == 1
    assert record["launcher"] == "torchrun --nproc-per-node 1"
    rows = record["results"]
    assert [row["tokens"] for row in rows] == [16, 40]
    for row in rows:
        assert row["correct"] and row["rel_error"] == 0.0  # a world of one: the plain layer's result
        assert row["rows_sent"] == row["tokens"] and row["rows_sent_expected"] == pytest.approx(row["tokens"])
        for key in ("route_us", "counts_us", "dispatch_us", "experts_us", "combine_us", "ep_us", "ep_chunked_us"):
            assert row[key] >= 0.0, key
        assert row["one_gpu_us"] > 0 and row["speedup"] == pytest.approx(
            row["one_gpu_us"] / min(row["ep_us"], row["ep_chunked_us"])
        )
    assert set(record["summary"]) == {"tiny/T16", "tiny/T40"}
    assert set(record["summary"]["tiny/T40"]["phase_share"]) == set(bench.PHASES)
    out = capsys.readouterr().out
    assert "tiny" in out and "FAILED" not in out
    assert not torch.distributed.is_initialized()
