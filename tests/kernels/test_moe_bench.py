"""benchmarks/moe_bench.py on the CPU: its model table and cases, the FLOP and byte accounting, the routing (an
expert-parallel shard's ids among them), the torch peers (``_grouped_mm`` pipeline, loop over experts) against the
float32 reference, the summary, and whole runs on small models with fused_moe replaced by the reference and the
timer by fixed times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import moe_bench

    return moe_bench


def test_models_cases_and_accounting(bench):
    models = bench.MODELS
    assert models["mixtral-8x7b"] == (8, 2, 4096, 14336, 8, "softmax")
    assert models["qwen3-30b-a3b"] == (128, 8, 2048, 768, 128, "softmax")
    assert models["deepseek-v3-tp8"] == (256, 8, 7168, 256, 256, "sigmoid")
    assert models["deepseek-v3-ep8"] == (32, 8, 7168, 2048, 256, "sigmoid")
    assert bench.TOKENS == (1, 16, 64, 256, 1024, 4096, 16384)
    everything = bench.cases(list(models), bench.TOKENS, bench.QUANTS)
    assert len(everything) == 28 and everything[0] == ("mixtral-8x7b", 1, "bf16")
    assert everything[-1] == ("deepseek-v3-ep8", 16384, "bf16")
    # 2 * T * k * (2I * H + H * I): Mixtral at T = 16384 is 11.5 TFLOP
    assert bench.layer_flops(16384 * 2, 4096, 14336) == 2 * 16384 * 2 * 3 * 14336 * 4096
    assert bench.layer_flops(0, 4096, 14336) == 0
    assert bench.expert_bytes(4096, 14336, "bf16") == 8 * 3 * 14336 * 4096 * 2 // 8  # Mixtral's 2.8 GB / 8
    with pytest.raises(ValueError, match="unknown weight format"):
        bench.expert_bytes(4096, 14336, "fp8")
    assert bench.checked_tokens(3, 4) == [0, 1, 2] and bench.checked_tokens(16384, 1) == [0]
    spread = bench.checked_tokens(16384, 4096)
    assert len(spread) == 4096 and spread[0] == 0 and spread[-1] == 16383


def test_arguments(bench, capsys):
    args = bench.parse_args([])
    assert args.model == list(bench.MODELS) and args.tokens == list(bench.TOKENS) and args.repeats == 5
    assert args.quant == ["bf16"] and args.peers == ["grouped_mm", "loop"] and args.json is None
    args = bench.parse_args(["--model", "qwen3-30b-a3b,mixtral-8x7b", "--tokens", "1,4096", "--peers", "none"])
    assert args.model == ["qwen3-30b-a3b", "mixtral-8x7b"] and args.tokens == [1, 4096] and args.peers == []
    assert bench.main(["--list", "--model", "deepseek-v3-ep8"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("7 cases") and "deepseek-v3-ep8  E=32   k=8 T=1024   bf16 loop" in out
    assert "T=4096   bf16\n" in out  # no loop past 1024 tokens
    for bad in (["--model", "llama"], ["--quant", "fp4"], ["--peers", "sglang"]):
        with pytest.raises(SystemExit):
            bench.main(["--list", *bad])


def test_routing(bench):
    """Weights renormalized, ids int32 and distinct per token; an expert-parallel shard keeps the full top-k's
    weights and renumbers its own experts from 0, the others -1."""
    full = bench.Model(16, 4, 8, 8, 16, "sigmoid")
    shard = bench.Model(4, 4, 8, 8, 16, "sigmoid")
    torch.manual_seed(3)
    weights, ids = bench.route(full, 50, device="cpu")
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (50, 4)
    assert torch.allclose(weights.sum(-1), torch.ones(50)) and (weights > 0).all()
    assert all(len(set(r)) == 4 for r in ids.tolist())
    torch.manual_seed(3)
    shard_weights, shard_ids = bench.route(shard, 50, device="cpu", rank=1)
    assert torch.equal(shard_weights, weights)
    assert torch.equal(shard_ids, torch.where((ids >= 4) & (ids < 8), ids - 4, -1))
    assert bench.routing_counts(shard_ids, 4) == (int((shard_ids >= 0).sum()), len(set(ids[ids // 4 == 1].tolist())))
    torch.manual_seed(0)
    _, softmax_ids = bench.route(bench.Model(8, 2, 8, 8, 8, "softmax"), 5, device="cpu")
    assert softmax_ids.min() >= 0 and softmax_ids.max() < 8


def _operands(tokens, experts, k, hidden=32, inter=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).bfloat16()
    weights = torch.rand(tokens, k, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).to(torch.int32)
    return x, w1, w2, weights, ids


@pytest.mark.parametrize("kind", ["all valid", "dropped", "all dropped", "empty experts"])
def test_peers_match_the_reference(bench, kind):
    """The _grouped_mm pipeline (torch's CPU fallback here: the same argument conventions) and the loop over experts
    compute fused_moe_reference's layer, dropped ids left out."""
    from flydsl.kernels.moe.reference import fused_moe_reference

    x, w1, w2, weights, ids = _operands(37, 6, 3)
    if kind == "dropped":
        ids[torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.4] = -1
        ids[0, 0] = 6  # out of range: dropped too
    elif kind == "all dropped":
        ids.fill_(-1)
    elif kind == "empty experts":
        ids = ids % 3  # experts 3..5 get nothing
    reference = fused_moe_reference(x, w1, w2, weights, ids)
    drops = kind in ("dropped", "all dropped")
    for out in (bench.grouped_mm_moe(x, w1, w2, weights, ids, drops=drops), bench.loop_moe(x, w1, w2, weights, ids)):
        assert out.dtype == torch.bfloat16 and out.shape == x.shape
        worst, fro = bench.rel_errors(out, reference)
        assert worst < 1e-2 and fro < 1e-2, kind
    if kind == "all dropped":
        assert reference.abs().max() == 0 and bench.rel_errors(torch.zeros_like(x), reference) == (0.0, 0.0)
    poisoned = reference.clone()
    poisoned[5, 5] = float("nan")
    assert not bench.rel_errors(poisoned, reference)[0] <= bench.TOLERANCE  # NaN fails the check


def test_summary(bench):
    def row(model, tokens, ours, **more):
        fields = {"model": model, "tokens": tokens, "quant": "bf16", "ours_us": ours, "correct": True}
        return fields | {"rel_error": 1e-3, "ours_tflops": 100.0} | more

    rows = [
        row("a", 1, 10.0, grouped_mm_us=30.0, loop_us=40.0, fraction_of_copy=0.6),
        row("a", 64, 10.0, grouped_mm_us=20.0, fraction_of_copy=0.4),
        row("a", 1024, 100.0, grouped_mm_us=200.0, loop_us=400.0),
        row("a", 16384, 100.0, grouped_mm_us=50.0, grouped_mm_tflops=200.0, rel_error=5e-3),
        row("b", 4096, 100.0, grouped_mm_us=800.0),
        row("b", 16384, 100.0, fraction_of_copy=0.1, correct=False),  # failed its check: left out
        {"model": "b", "tokens": 1, "quant": "bf16", "correct": False, "error": "RuntimeError: no"},
    ]
    s = bench.summarize(rows)
    assert s["prefill_geomean_vs_grouped_mm"]["bf16"] == pytest.approx(2.0)  # 2, 0.5 and 8
    assert s["decode_min_fraction_of_copy"] == 0.4
    assert s["layer_tflops_at_16384"] == {"a": {"ours": 100.0, "grouped_mm": 200.0}}
    assert s["geomean_vs_grouped_mm"]["bf16"] == pytest.approx((3 * 2 * 2 * 0.5 * 8) ** 0.2)
    assert s["geomean_vs_loop"]["bf16"] == pytest.approx(4.0)  # 40 / 10 and 400 / 100
    assert s["max_rel_error"] == 5e-3 and s["cases"] == 7 and s["cases_failed"] == 2
    empty = bench.summarize([])
    assert empty["prefill_geomean_vs_grouped_mm"] == {} and empty["decode_min_fraction_of_copy"] is None
    assert empty["max_rel_error"] is None and empty["layer_tflops_at_16384"] == {}


# Whole runs: small models, fused_moe replaced by the reference, fixed times.

TIMES_MS = {"ours": 2.0, "grouped_mm": 3.0, "loop": 8.0, "copy": 1.0}
SMALL = {"small": (4, 2, 64, 32, 4, "softmax"), "small-ep": (4, 2, 64, 32, 16, "sigmoid")}


def _fused_moe(x, w1, w2, topk_weights, topk_ids, *, activation="silu", out=None):
    from flydsl.kernels.moe.reference import fused_moe_reference

    result = fused_moe_reference(x, w1, w2, topk_weights, topk_ids, activation=activation)
    out = out if out is not None else torch.empty_like(x)
    return out.copy_(result)


@pytest.fixture
def on_cpu(bench, monkeypatch):
    """The benchmark on the CPU, small models, the timer calling each callable once and returning its fixed time."""
    import flydsl.kernels.moe as moe

    monkeypatch.setattr(moe, "fused_moe", _fused_moe, raising=False)
    monkeypatch.setattr(bench, "MODELS", {name: bench.Model(*fields) for name, fields in SMALL.items()})
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "LOOP_TOKENS", 16)
    monkeypatch.setattr(bench, "PREFILL_TOKENS", (80,))
    monkeypatch.setattr(bench, "SUMMARY_TOKENS", 80)

    def timer(fn):
        fn()
        return TIMES_MS[fn.__name__]

    monkeypatch.setattr(bench, "make_timer", lambda flush: timer)
    return moe


def test_run_on_cpu(bench, on_cpu, tmp_path):
    """Both small models, decode and prefill: each row checked, the peers checked, the ratios and fractions from the
    fixed times, a record that validates, the summary from the rows."""
    from record import validate

    path = tmp_path / "moe.json"
    argv = ["--tokens", "1,16,80", "--repeats", "2", "--check-tokens", "50", "--json", str(path), "--commit", "c0ffee"]
    assert bench.main(argv) == 0
    record = validate(json.loads(path.read_text()))
    assert record["command"].startswith("python benchmarks/moe_bench.py --tokens 1,16,80")
    assert record["git_commit"] == "c0ffee" and record["grouped_mm"].startswith("torch ")
    rows = record["results"]
    assert [(r["model"], r["tokens"]) for r in rows] == [(m, t) for m in SMALL for t in (1, 16, 80)]
    for r in rows:
        assert r["correct"] and r["unwritten"] == 0 and r["rel_error"] < 1e-2, r
        assert r["grouped_mm_rel_error"] < 2e-2 and r["grouped_mm_synchronizes"] == (r["model"] == "small-ep")
        assert r["ours_us"] == 2000 and r["ratio_vs_grouped_mm"] == 1.5 and len(r["runs_us"]["ours"]) == 2
        assert r["checked_tokens"] == min(r["tokens"], 50)
        assert r["flops"] == bench.layer_flops(r["kept_ids"], 64, 32)
        assert r["ours_tflops"] == pytest.approx(r["flops"] / 2e-3 / 1e12)
        assert r["touched_bytes"] == r["touched_experts"] * 3 * 32 * 64 * 2
        if r["model"] == "small":
            assert r["kept_ids"] == 2 * r["tokens"]
        if r["tokens"] <= 16:
            assert r["ratio_vs_loop"] == 4.0 and r["loop_rel_error"] < 2e-2
        else:
            assert "loop_us" not in r and "fraction_of_copy" not in r
        if r["tokens"] <= 16 and r["touched_bytes"]:
            assert r["fraction_of_copy"] == 0.5 and r["touched_tbps"] > 0
    summary = record["summary"]
    assert summary == bench.summarize(rows)
    assert summary["prefill_geomean_vs_grouped_mm"] == {"bf16": 1.5} and summary["decode_min_fraction_of_copy"] == 0.5
    assert set(summary["layer_tflops_at_16384"]) == set(SMALL) and summary["cases_failed"] == 0


def test_failures_are_recorded(bench, on_cpu, tmp_path, monkeypatch, capsys):
    """A kernel that raises, one that leaves an element unwritten and a failing peer: each is recorded in its row,
    the sweep goes on, and the failed cases stay out of the summary."""

    def flaky(x, w1, w2, topk_weights, topk_ids, *, out, **kwargs):
        if x.shape[0] == 16:
            raise RuntimeError("no tile for 16 tokens\nsecond line")
        _fused_moe(x, w1, w2, topk_weights, topk_ids, out=out)
        if topk_ids.min() < 0:  # the EP shard
            out[-1, -1] = float("nan")
        return out

    def no_grouped_mm(*args, **kwargs):
        raise NotImplementedError("_grouped_mm: no kernel")

    monkeypatch.setattr(on_cpu, "fused_moe", flaky)
    monkeypatch.setattr(bench, "grouped_mm_moe", no_grouped_mm)
    path = tmp_path / "moe.json"
    assert bench.main(["--tokens", "16,80", "--repeats", "1", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    by = {(r["model"], r["tokens"]): r for r in record["results"]}
    assert by[("small", 16)]["error"] == "RuntimeError: no tile for 16 tokens" and "ours_us" not in by[("small", 16)]
    assert by[("small", 80)]["correct"] and by[("small", 80)]["grouped_mm_error"].startswith("NotImplementedError")
    assert "ratio_vs_grouped_mm" not in by[("small", 80)]
    assert by[("small-ep", 80)]["unwritten"] == 1 and not by[("small-ep", 80)]["correct"]
    summary = record["summary"]
    assert summary["cases"] == 4 and summary["cases_failed"] == 3
    assert summary["prefill_geomean_vs_grouped_mm"] == {"bf16": None}
    assert "FAILED (RuntimeError: no tile for 16 tokens)" in capsys.readouterr().out
