"""benchmarks/moe_bench.py on the CPU: its model table and cases, the FLOP and byte accounting (bf16 and fp8), the
routing (an expert-parallel shard's ids among them), the fp8 quantization of weights and rows, the torch peers
(``_grouped_mm`` pipeline, its fp8 ``_scaled_grouped_mm`` peer, loop over experts) against the float32 reference, the
summary, and whole runs on small models with fused_moe replaced by the reference and the timer by fixed times.

``torch._scaled_grouped_mm`` has no CPU kernel: where it has none, a stand-in computes its definition (rowwise
scales: accumulator times the row's scale of the 2-D operand and the expert's column scale) after torch's own meta
function has checked the arguments (dtypes, row-major A, column-major B, scale shapes, offs), plus the CUDA op's
multiples of 16."""

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


@pytest.fixture
def peers(monkeypatch):
    """benchmarks/moe_torch.py: the torch MoE layers and quantization the bench times and checks."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import moe_torch

    return moe_torch


def test_models_cases_and_accounting(bench):
    models = bench.MODELS
    assert models["mixtral-8x7b"] == (8, 2, 4096, 14336, 8, "softmax")
    assert models["qwen3-30b-a3b"] == (128, 8, 2048, 768, 128, "softmax")
    assert models["deepseek-v3-tp8"] == (256, 8, 7168, 256, 256, "sigmoid")
    assert models["deepseek-v3-ep8"] == (32, 8, 7168, 2048, 256, "sigmoid")
    assert bench.TOKENS == (1, 16, 64, 256, 1024, 4096, 16384)
    assert bench.QUANTS == ("bf16", "fp8", "block")
    assert bench.TOLERANCES == {"bf16": 2e-2, "fp8": 6e-2, "block": 6e-2}
    everything = bench.cases(list(models), bench.TOKENS, bench.QUANTS)
    assert len(everything) == 84 and everything[0] == ("mixtral-8x7b", 1, "bf16")
    # per model every T in bf16, then every T in fp8: one format's weights at a time
    assert everything[6:8] == [("mixtral-8x7b", 16384, "bf16"), ("mixtral-8x7b", 1, "fp8")]
    assert everything[13:15] == [("mixtral-8x7b", 16384, "fp8"), ("mixtral-8x7b", 1, "block")]
    assert everything[-1] == ("deepseek-v3-ep8", 16384, "block")
    # 2 * T * k * (2I * H + H * I): Mixtral at T = 16384 is 11.5 TFLOP
    assert bench.layer_flops(16384 * 2, 4096, 14336) == 2 * 16384 * 2 * 3 * 14336 * 4096
    assert bench.layer_flops(0, 4096, 14336) == 0
    assert bench.expert_bytes(4096, 14336, "bf16") == 8 * 3 * 14336 * 4096 * 2 // 8  # Mixtral's 2.8 GB / 8
    # fp8: a byte a weight, plus a float32 scale per output channel (w1's 2I rows, w2's H)
    assert bench.expert_bytes(4096, 14336, "fp8") == 3 * 14336 * 4096 + (2 * 14336 + 4096) * 4
    assert bench.expert_bytes(7168, 256, "fp8") == 3 * 256 * 7168 + (2 * 256 + 7168) * 4
    # block: a float32 scale per 128 x 128 block (w1: 2I / 128 x H / 128, w2: H / 128 x I / 128)
    assert bench.expert_bytes(7168, 256, "block") == 3 * 256 * 7168 + (4 * 56 + 56 * 2) * 4
    with pytest.raises(ValueError, match="unknown weight format"):
        bench.expert_bytes(4096, 14336, "fp4")
    assert bench.checked_tokens(3, 4) == [0, 1, 2] and bench.checked_tokens(16384, 1) == [0]
    spread = bench.checked_tokens(16384, 4096)
    assert len(spread) == 4096 and spread[0] == 0 and spread[-1] == 16383


def test_arguments(bench, capsys):
    args = bench.parse_args([])
    assert args.model == list(bench.MODELS) and args.tokens == list(bench.TOKENS) and args.repeats == 5
    assert args.quant == ["bf16", "fp8", "block"] and args.peers == ["grouped_mm", "loop"] and args.json is None
    assert bench.parse_args(["--quant", "fp8"]).quant == ["fp8"]
    args = bench.parse_args(["--model", "qwen3-30b-a3b,mixtral-8x7b", "--tokens", "1,4096", "--peers", "none"])
    assert args.model == ["qwen3-30b-a3b", "mixtral-8x7b"] and args.tokens == [1, 4096] and args.peers == []
    assert bench.main(["--list", "--model", "deepseek-v3-ep8"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("21 cases") and "deepseek-v3-ep8  E=32   k=8 T=1024   bf16 loop" in out
    assert "T=4096   bf16\n" in out  # no loop past 1024 tokens
    assert "T=1024   fp8\n" in out  # nor in fp8
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
def test_peers_match_the_reference(bench, peers, kind):
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
    for out in (peers.grouped_mm_moe(x, w1, w2, weights, ids, drops=drops), peers.loop_moe(x, w1, w2, weights, ids)):
        assert out.dtype == torch.bfloat16 and out.shape == x.shape
        worst, fro = bench.rel_errors(out, reference)
        assert worst < 1e-2 and fro < 1e-2, kind
    if kind == "all dropped":
        assert reference.abs().max() == 0 and bench.rel_errors(torch.zeros_like(x), reference) == (0.0, 0.0)
    poisoned = reference.clone()
    poisoned[5, 5] = float("nan")
    assert not bench.rel_errors(poisoned, reference)[0] <= bench.TOLERANCE  # NaN fails the check


def test_quantize_experts_round_trip(bench, peers):
    """Per output channel: the row's amax lands on e4m3's 448, every weight comes back within e4m3's rounding (3
    mantissa bits: half an ulp is 2^-4 of the value, 2^-10 of the scale among the subnormals), a zero row gets
    scale 1; the same per row for activations."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3, 48, 32, generator=g) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different sizes
    w[1, 7] = 0  # an all-zero output channel
    w[2, 3, 5] = -40.0  # a row whose amax is an outlier: the others go subnormal
    w = w.bfloat16()
    w8, scale = peers.quantize_experts(w)
    assert w8.dtype == torch.float8_e4m3fn and w8.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (3, 48)
    assert scale[1, 7] == 1 and (w8[1, 7].float() == 0).all()
    amax = w.float().abs().amax(-1)
    kept = amax > 0
    assert torch.allclose(scale[kept], amax[kept] / 448, rtol=1e-6)
    assert (w8.float().abs().amax(-1)[kept] == 448).all()
    back = peers.dequantize(w8, scale)
    assert back.dtype == torch.float32
    error = (back - w.float()).abs()
    assert (error <= w.float().abs() * 2**-4 + scale[..., None] * 2**-10 + 1e-12).all()
    assert error.max() > 0  # it did round
    rows8, row_scale = peers.quantize_rows(w[0])  # (N, K): one scale a row
    assert torch.equal(rows8.view(torch.uint8), w8[0].view(torch.uint8)) and torch.equal(row_scale, scale[0])
    assert bench.exact_weights(bench.Weights(w8, w8, scale, scale))[0].dtype == torch.float32
    assert bench.exact_weights(bench.Weights(w, w))[0] is w


def test_format_weights(bench):
    x, w1, w2, weights, ids = _operands(5, 4, 2)
    bf16 = bench.format_weights(w1, w2, "bf16")
    assert bf16.w1 is w1 and bf16.w2 is w2 and bf16.w1_scale is None and bf16.w2_scale is None
    fp8 = bench.format_weights(w1, w2, "fp8")
    assert fp8.w1.dtype == fp8.w2.dtype == torch.float8_e4m3fn
    assert fp8.w1_scale.shape == (4, 32) and fp8.w2_scale.shape == (4, 32)  # (E, 2I) and (E, H)
    with pytest.raises(ValueError, match="unknown weight format"):
        bench.format_weights(w1, w2, "int4")


def _scaled_grouped_mm_stand_in(real, calls):
    """torch._scaled_grouped_mm's 2-D x 3-D rowwise case by its definition, on the CPU: the arguments checked by
    ``real`` on meta tensors (torch's own checks), the CUDA op's multiples of 16, then per expert the float32
    product times the rows' and the expert's columns' scales, cast to bf16."""

    def stand_in(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None, **kw):
        def meta(t):
            return None if t is None else t.to("meta")

        shape = real(
            meta(mat_a), meta(mat_b), scale_a=meta(scale_a), scale_b=meta(scale_b), offs=meta(offs), out_dtype=out_dtype
        ).shape
        assert mat_a.dim() == 2 and mat_b.dim() == 3 and offs is not None and out_dtype == torch.bfloat16
        assert mat_a.shape[-1] % 16 == 0 and mat_b.shape[-2] % 16 == 0 and mat_b.shape[-1] % 16 == 0
        assert offs.numel() == mat_b.shape[0] and int(offs[-1]) == mat_a.shape[0]
        calls.append((tuple(mat_a.shape), tuple(mat_b.shape)))
        out = torch.zeros(shape)
        start = 0
        for e, end in enumerate(offs.tolist()):
            product = mat_a[start:end].float() @ mat_b[e].float()
            out[start:end] = product * scale_a[start:end, None] * scale_b[e][None, :]
            start = end
        return out.bfloat16()

    return stand_in


@pytest.fixture
def scaled_grouped_mm(monkeypatch):
    """The calls of ``torch._scaled_grouped_mm`` (mat_a's and mat_b's shapes); the stand-in where the CPU has no
    kernel for it."""
    calls = []
    probe = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_grouped_mm(
            probe,
            probe.view(1, 16, 16).transpose(1, 2),
            scale_a=torch.ones(16),
            scale_b=torch.ones(1, 16),
            offs=torch.tensor([16], dtype=torch.int32),
            out_dtype=torch.bfloat16,
        )
    except (NotImplementedError, RuntimeError):  # no CPU kernel: the stand-in
        monkeypatch.setattr(torch, "_scaled_grouped_mm", _scaled_grouped_mm_stand_in(torch._scaled_grouped_mm, calls))
    return calls


def test_scaled_grouped_mm_stand_in_checks(scaled_grouped_mm):
    """The stand-in refuses what the op refuses: a row-major B (not w.transpose(1, 2) of a contiguous (E, N, K)), B's
    scales per K rather than per N, K or N not a multiple of 16."""
    if torch._scaled_grouped_mm.__name__ != "stand_in":
        pytest.skip("torch runs _scaled_grouped_mm on the CPU: the real checks apply")
    a = torch.randn(20, 32).to(torch.float8_e4m3fn)
    w = torch.randn(2, 48, 32).to(torch.float8_e4m3fn)  # (E, N, K)
    offs = torch.tensor([8, 20], dtype=torch.int32)
    good = dict(scale_a=torch.ones(20), scale_b=torch.ones(2, 48), offs=offs, out_dtype=torch.bfloat16)
    assert torch._scaled_grouped_mm(a, w.transpose(1, 2), **good).shape == (20, 48)
    with pytest.raises(RuntimeError, match="column major"):
        torch._scaled_grouped_mm(a, w.transpose(1, 2).contiguous(), **good)
    with pytest.raises(RuntimeError, match="non-batch dimension"):
        torch._scaled_grouped_mm(a, w.transpose(1, 2), **(good | {"scale_b": torch.ones(2, 32)}))
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):  # K: the rows' stride
        torch._scaled_grouped_mm(a[:, :24].contiguous(), w[:, :, :24].contiguous().transpose(1, 2), **good)
    with pytest.raises(AssertionError):  # N 40: the meta function passes it, the CUDA op does not
        torch._scaled_grouped_mm(a, w[:, :40].transpose(1, 2), **(good | {"scale_b": torch.ones(2, 40)}))


@pytest.mark.parametrize("kind", ["all valid", "dropped", "all dropped", "empty experts"])
def test_fp8_peer_matches_the_reference(bench, peers, scaled_grouped_mm, kind):
    """The fp8 pipeline (x and h quantized per row, two _scaled_grouped_mm) computes the layer of the dequantized
    weights within the fp8 tolerance, dropped ids left out; it calls the op twice with (M, K) x (E, K, N)."""
    from flydsl.kernels.moe.reference import fused_moe_reference

    x, w1, w2, weights, ids = _operands(37, 6, 3)
    if kind == "dropped":
        ids[torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.4] = -1
        ids[0, 0] = 6
    elif kind == "all dropped":
        ids.fill_(-1)
    elif kind == "empty experts":
        ids = ids % 3
    fp8 = bench.format_weights(w1, w2, "fp8")
    reference = fused_moe_reference(x, *bench.exact_weights(fp8), weights, ids)
    drops = kind in ("dropped", "all dropped")
    out = peers.scaled_grouped_mm_moe(x, *fp8[:2], fp8.w1_scale, fp8.w2_scale, weights, ids, drops=drops)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    if kind == "all dropped":
        assert not scaled_grouped_mm and (out == 0).all()
        return
    worst, fro = bench.rel_errors(out, reference)
    assert worst <= bench.TOLERANCES["fp8"] and fro < 4e-2, kind
    assert worst > 1e-3  # the activations were quantized: not the bf16 pipeline's error
    if scaled_grouped_mm:  # the stand-in's record
        rows = int(((ids >= 0) & (ids < 6)).sum())  # kept ids only
        assert scaled_grouped_mm == [((rows, 32), (6, 32, 32)), ((rows, 16), (6, 16, 32))]


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
    assert s["fp8_speedup_over_bf16_ours"] is None  # no fp8 rows
    assert s["stage_tflops_at_16384"] == {"bf16": {"a": {}}}
    empty = bench.summarize([])
    assert empty["prefill_geomean_vs_grouped_mm"] == {} and empty["decode_min_fraction_of_copy"] is None
    assert empty["max_rel_error"] is None and empty["layer_tflops_at_16384"] == {}
    assert empty["fp8_speedup_over_bf16_ours"] is None and empty["stage_tflops_at_16384"] == {}


def test_summary_with_fp8(bench):
    """fp8 rows: their own ratios to the fp8 pipeline; our bf16 / fp8 times paired by model and T over the prefill
    rows that passed (a row without its pair left out); the stages' TFLOP/s at 16384 keyed by format."""

    def row(model, tokens, quant, ours, **more):
        fields = {"model": model, "tokens": tokens, "quant": quant, "ours_us": ours, "correct": True}
        return fields | {"rel_error": 1e-3 if quant == "bf16" else 4e-2, "ours_tflops": 1.0} | more

    stages = {"stage1_tflops": 500.0, "stage2_tflops": 400.0}
    rows = [
        row("a", 1024, "bf16", 100.0, grouped_mm_us=200.0),
        row("a", 1024, "fp8", 50.0, grouped_mm_us=100.0),  # fp8 2x faster: ratio 2, speedup 2
        row("a", 16384, "bf16", 1000.0, grouped_mm_us=1000.0, **stages),
        row("a", 16384, "fp8", 800.0, grouped_mm_us=3200.0, stage1_tflops=900.0, stage2_tflops=700.0),
        row("b", 4096, "bf16", 100.0, grouped_mm_us=100.0),
        row("b", 4096, "fp8", 200.0, grouped_mm_us=400.0),  # fp8 slower here: speedup 0.5
        row("b", 16384, "fp8", 100.0, grouped_mm_us=100.0),  # no bf16 pair: not in the speedup
        row("b", 1024, "bf16", 100.0),
        row("b", 1024, "fp8", 10.0, correct=False, rel_error=0.2),  # failed: out of everything
        row("b", 64, "fp8", 10.0, grouped_mm_us=1000.0, fraction_of_copy=0.3),  # decode: not prefill
    ]
    s = bench.summarize(rows)
    assert s["prefill_geomean_vs_grouped_mm"]["bf16"] == pytest.approx((2 * 1 * 1) ** (1 / 3))
    assert s["prefill_geomean_vs_grouped_mm"]["fp8"] == pytest.approx((2 * 4 * 2 * 1) ** (1 / 4))
    assert s["fp8_speedup_over_bf16_ours"] == pytest.approx((2 * 1.25 * 0.5) ** (1 / 3))
    assert s["stage_tflops_at_16384"] == {
        "bf16": {"a": {"stage1": 500.0, "stage2": 400.0}},
        "fp8": {"a": {"stage1": 900.0, "stage2": 700.0}, "b": {}},
    }
    assert s["layer_tflops_at_16384"] == {"a": {"ours": 1.0}}  # bf16's, as before
    assert s["geomean_vs_grouped_mm"]["fp8"] == pytest.approx((2 * 4 * 2 * 1 * 100) ** (1 / 5))
    assert s["geomean_vs_loop"] == {"bf16": None, "fp8": None}
    assert s["decode_min_fraction_of_copy"] == 0.3 and s["max_rel_error"] == 4e-2
    assert s["cases"] == 10 and s["cases_failed"] == 1


# Whole runs: small models, fused_moe replaced by the reference, fixed times.

TIMES_MS = {"ours": 2.0, "grouped_mm": 3.0, "loop": 8.0, "copy": 1.0, "copy_read": 1.6, "read": 1.2}
SMALL = {"small": (4, 2, 64, 32, 4, "softmax"), "small-ep": (4, 2, 64, 32, 16, "sigmoid")}


def _fused_moe(x, w1, w2, topk_weights, topk_ids, *, activation="silu", out=None, quant=None, **fp8):
    """fused_moe's API by the reference: fp8 (quant="fp8", granularity="channel", w1_scale (E, 2I), w2_scale (E, H))
    computed with the dequantized weights."""
    from flydsl.kernels.moe.reference import dequantize_experts, fused_moe_reference

    if quant is not None:
        granularity = fp8.pop("granularity")
        assert quant == "fp8" and granularity in ("channel", "block") and w1.dtype == torch.float8_e4m3fn
        w1_scale, w2_scale = fp8.pop("w1_scale"), fp8.pop("w2_scale")
        if granularity == "channel":
            assert w1_scale.shape == w1.shape[:2] and w2_scale.shape == w2.shape[:2]
        w1, w2 = dequantize_experts(w1, w1_scale, granularity), dequantize_experts(w2, w2_scale, granularity)
    assert not fp8, fp8
    result = fused_moe_reference(x, w1, w2, topk_weights, topk_ids, activation=activation)
    out = out if out is not None else torch.empty_like(x)
    return out.copy_(result)


@pytest.fixture
def on_cpu(bench, monkeypatch, scaled_grouped_mm):
    """The benchmark on the CPU, small models, the timer calling each callable once and returning its fixed time,
    ``torch._scaled_grouped_mm`` run (or stood in for) on the CPU."""
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
    assert record["tolerance"] == {"bf16": 2e-2, "fp8": 6e-2, "block": 6e-2}
    assert record["grouped_mm"].endswith("_grouped_mm, _scaled_grouped_mm")
    rows = record["results"]
    order = [(m, t, q) for m in SMALL for q in ("bf16", "fp8", "block") for t in (1, 16, 80)]
    assert [(r["model"], r["tokens"], r["quant"]) for r in rows] == order
    by = {(r["model"], r["tokens"], r["quant"]): r for r in rows}
    for r in rows:
        fp8 = r["quant"] != "bf16"
        assert r["tolerance"] == (6e-2 if fp8 else 2e-2)
        assert r["correct"] and r["unwritten"] == 0 and r["rel_error"] < 1e-2, r
        # (block's torch peer computes with the weights quantized per channel: not the block reference's numbers)
        assert r["grouped_mm_rel_error"] < (0.2 if r["quant"] == "block" else r["tolerance"])
        assert r["grouped_mm_synchronizes"] == (r["model"] == "small-ep")
        assert r["ours_us"] == 2000 and r["ratio_vs_grouped_mm"] == 1.5 and len(r["runs_us"]["ours"]) == 2
        assert r["checked_tokens"] == min(r["tokens"], 50)
        assert r["flops"] == bench.layer_flops(r["kept_ids"], 64, 32)
        assert r["ours_tflops"] == pytest.approx(r["flops"] / 2e-3 / 1e12)
        per_expert = {"bf16": 3 * 32 * 64 * 2, "fp8": 3 * 32 * 64 + (2 * 32 + 64) * 4, "block": 3 * 32 * 64 + 2 * 4}
        per_expert = per_expert[r["quant"]]
        assert r["touched_bytes"] == r["touched_experts"] * per_expert
        if r["model"] == "small":
            assert r["kept_ids"] == 2 * r["tokens"]
        if fp8:  # the same x and routing as bf16's row: they pair up
            twin = by[r["model"], r["tokens"], "bf16"]
            assert (r["kept_ids"], r["touched_experts"]) == (twin["kept_ids"], twin["touched_experts"])
            assert "loop_us" not in r and "loop_error" not in r  # the loop is bf16's only
        elif r["tokens"] <= 16:
            assert r["ratio_vs_loop"] == 4.0 and r["loop_rel_error"] < 2e-2
        if r["tokens"] > 16:
            assert "loop_us" not in r and "fraction_of_copy" not in r
        if r["tokens"] <= 16 and r["touched_bytes"]:
            assert r["fraction_of_copy"] == 0.5 and r["touched_tbps"] > 0
            assert r["fraction_of_read_copy"] == pytest.approx(0.8)  # a copy_ of all the touched bytes
            assert r["fraction_of_read"] == pytest.approx(0.6)
    summary = record["summary"]
    assert summary == bench.summarize(rows)
    assert summary["prefill_geomean_vs_grouped_mm"] == {"bf16": 1.5, "fp8": 1.5, "block": 1.5}
    assert (
        summary["fp8_speedup_over_bf16_ours"] == 1.0
        and summary["block_vs_fp8_geomean"] == 1.0
        and summary["decode_min_fraction_of_copy"] == 0.5
        and summary["decode_min_fraction_of_read_copy"] == pytest.approx(0.8)
    )
    assert set(summary["layer_tflops_at_16384"]) == set(SMALL) and summary["cases_failed"] == 0
    assert summary["stage_tflops_at_16384"] == {
        q: {m: {} for m in SMALL} for q in ("bf16", "fp8", "block")
    }  # no profile here


def test_one_format_on_cpu(bench, on_cpu, monkeypatch, capsys):
    """--quant fp8 alone: the fp8 weights made once from the bf16 ones; fp8 rows only."""
    made = []
    original = bench.format_weights

    def spy(w1, w2, quant):
        made.append((w1.dtype, quant))
        return original(w1, w2, quant)

    monkeypatch.setattr(bench, "format_weights", spy)
    assert bench.main(["--model", "small", "--tokens", "16,80", "--quant", "fp8", "--repeats", "1"]) == 0
    assert made == [(torch.bfloat16, "fp8")]
    out = capsys.readouterr().out
    assert "small               80 fp8 " in out and " bf16 " not in out


def test_failures_are_recorded(bench, on_cpu, tmp_path, monkeypatch, capsys):
    """A kernel that raises, one that leaves an element unwritten and failing peers (bf16's _grouped_mm pipeline,
    fp8's _scaled_grouped_mm refusing the GPU): each is recorded in its row, the sweep goes on, and the failed cases
    stay out of the summary."""

    def flaky(x, w1, w2, topk_weights, topk_ids, *, out, **kwargs):
        if x.shape[0] == 16:
            raise RuntimeError("no tile for 16 tokens\nsecond line")
        _fused_moe(x, w1, w2, topk_weights, topk_ids, out=out, **kwargs)
        if topk_ids.min() < 0:  # the EP shard
            out[-1, -1] = float("nan")
        return out

    def no_grouped_mm(*args, **kwargs):
        raise NotImplementedError("_grouped_mm: no kernel")

    def no_scaled_grouped_mm(*args, **kwargs):
        raise RuntimeError("torch._scaled_grouped_mm is only supported on CUDA devices with compute capability 9.0")

    monkeypatch.setattr(on_cpu, "fused_moe", flaky)
    monkeypatch.setattr(bench, "grouped_mm_moe", no_grouped_mm)
    monkeypatch.setattr(torch, "_scaled_grouped_mm", no_scaled_grouped_mm)
    path = tmp_path / "moe.json"
    assert bench.main(["--tokens", "16,80", "--repeats", "1", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    by = {(r["model"], r["tokens"], r["quant"]): r for r in record["results"]}
    for quant in ("bf16", "fp8", "block"):
        failed = by[("small", 16, quant)]
        assert failed["error"] == "RuntimeError: no tile for 16 tokens" and "ours_us" not in failed
        assert by[("small", 80, quant)]["correct"] and "ratio_vs_grouped_mm" not in by[("small", 80, quant)]
        assert by[("small-ep", 80, quant)]["unwritten"] == 1 and not by[("small-ep", 80, quant)]["correct"]
    assert by[("small", 80, "bf16")]["grouped_mm_error"].startswith("NotImplementedError: _grouped_mm")
    assert by[("small", 80, "fp8")]["grouped_mm_error"].startswith("RuntimeError: torch._scaled_grouped_mm is only")
    summary = record["summary"]
    assert summary["cases"] == 12 and summary["cases_failed"] == 9
    assert summary["prefill_geomean_vs_grouped_mm"] == {"bf16": None, "fp8": None, "block": None}
    assert summary["fp8_speedup_over_bf16_ours"] == 1.0  # small at 80 tokens, every format passed
    assert summary["block_vs_fp8_geomean"] == 1.0
    assert "FAILED (RuntimeError: no tile for 16 tokens)" in capsys.readouterr().out
