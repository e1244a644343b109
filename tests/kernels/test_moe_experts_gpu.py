"""fused_moe (bf16/fp16) on the GPU against the float32 references of flydsl.kernels.moe.reference, on fresh random
routing and adversarial routing (skewed, empty experts, all tokens on one expert, dropped ids, top_k 1, T 1, E not
a power of two, I not a multiple of the tile), outputs poisoned with NaN first; bitwise-identical outputs over
repeated calls and with the tokens permuted (the deterministic combine); CUDA-graph capture with new routing each
replay."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm.skinny_grouped import choose_grouped_skinny_config  # noqa: E402
from flydsl.kernels.gemm.skinny_one_token import (  # noqa: E402
    choose_one_launch_configs,
)
from flydsl.kernels.moe import fused_moe, topk_route  # noqa: E402
from flydsl.kernels.moe.decode import decode_modes, decodes  # noqa: E402
from flydsl.kernels.moe.reference import fused_moe_reference  # noqa: E402

DEVICE = "cuda"


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _layer(tokens, experts, hidden, inter, dtype=torch.bfloat16, seed=0):
    """x, w1, w2 with the scales of a trained layer (outputs of order one)."""
    g = _generator(seed)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, device=DEVICE, generator=g) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=DEVICE, generator=g) / inter**0.5).to(dtype)
    return x, w1, w2


def _routing(tokens, experts, top_k, seed=0, skew=0.0):
    """Weights and distinct ids per token from random logits (``skew`` > 0 favours the low experts)."""
    g = _generator(seed + 1000)
    logits = torch.randn(tokens, experts, device=DEVICE, generator=g)
    logits -= skew * torch.arange(experts, device=DEVICE, dtype=torch.float32)
    return topk_route(logits, top_k)


def _check(x, w1, w2, weights, ids, **options):
    """fused_moe into a NaN-poisoned output against the float32 reference (bf16 intermediates: ~1e-2 relative)."""
    out = torch.full_like(x, float("nan"))
    got = fused_moe(x, w1, w2, weights, ids, out=out, **options)
    assert got is out
    expected = fused_moe_reference(x, w1, w2, weights, ids)
    scale = expected.abs().max().clamp(min=1e-3)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float() / scale, expected / scale, rtol=0, atol=2e-2)
    return out


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter",
    [
        (1, 8, 2, 256, 128),  # one token
        (7, 8, 1, 512, 256),  # top 1
        (300, 8, 2, 256, 512),  # 75 rows per expert: 64-row blocks
        (2000, 8, 2, 512, 384),  # 500 rows per expert: 128-row blocks
        (5000, 8, 2, 256, 384),  # 1250 rows per expert: 2-CTA clusters sharing B (gate and up halves)
        (4200, 8, 2, 256, 200),  # clusters, I not a multiple of the tile
        (100, 60, 4, 256, 200),  # E not a power of two, I not a multiple of the tile
        (64, 128, 8, 512, 96),  # many experts, few rows each
        (37, 256, 8, 1024, 256),  # DeepSeek-V3-like routing, small
        (5, 16, 4, 1000, 200),  # decode: K tails in both skinny stages (H 1000, I 200)
        (64, 256, 8, 2048, 128),  # decode at its bound: 512 ids over 256 experts
        (200, 256, 8, 512, 128),  # past the decode bound: the warp-specialized stages with 64-row tiles
    ],
)
def test_fused_moe_matches_the_reference(tokens, experts, top_k, hidden, inter):
    x, w1, w2 = _layer(tokens, experts, hidden, inter, seed=tokens)
    weights, ids = _routing(tokens, experts, top_k, seed=tokens)
    _check(x, w1, w2, weights, ids)


@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_decode_and_prefill_routes_agree(tokens):
    """The weight-streaming stages (decode) against the warp-specialized ones on the same routing (the latter forced
    by a larger call holding the same tokens twice): the same result to bf16 rounding."""
    x, w1, w2 = _layer(tokens, 64, 512, 256, seed=12)
    weights, ids = _routing(tokens, 64, 8, seed=12)
    decoded = fused_moe(x, w1, w2, weights, ids)
    doubled = fused_moe(x.repeat(70, 1), w1, w2, weights.repeat(70, 1), ids.repeat(70, 1))[:tokens]
    scale = float(doubled.float().abs().max())
    torch.testing.assert_close(decoded.float(), doubled.float(), rtol=0, atol=2e-2 * scale)


@pytest.mark.parametrize("quant", [None, "channel", "block"])
@pytest.mark.parametrize("modes", ["direct", "direct,combine"])
@pytest.mark.parametrize("experts,top_k,hidden,inter", [(64, 8, 512, 256), (32, 4, 384, 320)])
def test_decode_modes_give_the_same_output(monkeypatch, modes, quant, experts, top_k, hidden, inter):
    """One token with the decode modes (FLYDSL_MOE_DECODE: no alignment; stage 2 and the combine in one launch)
    against the aligned plan (``FLYDSL_MOE_DECODE=none``): the same sums in the same order, so the same bits (combined:
    each pair's sum over all of I in one warp rather than over K-warps, so y's bf16 rounding may differ by an ulp:
    within the bf16 layer's tolerance of the float32 reference, and the same bits call after call); dropped ids
    (outside [0, E)) add nothing."""
    from flydsl.kernels import plans

    x, w1, w2 = _layer(1, experts, hidden, inter, seed=30)
    weights, ids = _routing(1, experts, top_k, seed=30)
    ids[0, -1] = -1  # an id this rank does not serve
    options = {}
    if quant is not None:
        w1, s1, _ = _fp8_weights(w1, quant)
        w2, s2, _ = _fp8_weights(w2, quant)
        options = dict(quant="fp8", granularity=quant, w1_scale=s1, w2_scale=s2)
    monkeypatch.setenv("FLYDSL_MOE_DECODE", "none")
    plans.clear_all()
    expected = fused_moe(x, w1, w2, weights, ids, **options)
    monkeypatch.setenv("FLYDSL_MOE_DECODE", modes)
    plans.clear_all()
    try:
        outs = []
        for _ in range(2):  # the first call records the plan, the second replays it
            out = torch.full_like(x, float("nan"))
            fused_moe(x, w1, w2, weights, ids, out=out, **options)
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        if "combine" not in modes:
            assert torch.equal(outs[0], expected)
        else:
            scale = float(expected.float().abs().max())
            torch.testing.assert_close(outs[0].float(), expected.float(), rtol=0, atol=1e-2 * scale)
    finally:
        plans.clear_all()


@pytest.mark.parametrize("quant", [None, "channel", "block"])
@pytest.mark.parametrize("experts,top_k,hidden,inter", [(64, 8, 512, 256), (32, 4, 384, 320), (128, 8, 2048, 768)])
def test_one_launch_gives_the_two_launches_bits(monkeypatch, quant, experts, top_k, hidden, inter):
    """One token with FLYDSL_MOE_DECODE's single (stage 1, stage 2 and the combine in one launch, the stage-2 CTAs
    waiting on a count of finished stage-1 CTAs) against the combined kernel's two launches: where stage 1 takes the
    same tiles in both, the same sums in the same order, so the same bits, call after call on new tokens and routings
    (the counters left at zero by each launch; a stage-2 CTA reading h before its stage-1 CTAs stored it would show as a
    difference); elsewhere within a rounding of the output."""
    from flydsl.kernels import plans

    _x, w1, w2 = _layer(1, experts, hidden, inter, seed=40)
    options = {}
    if quant is not None:
        w1, s1, _ = _fp8_weights(w1, quant)
        w2, s2, _ = _fp8_weights(w2, quant)
        options = dict(quant="fp8", granularity=quant, w1_scale=s1, w2_scale=s2)
    calls = []
    for seed in range(12):
        x, _, _ = _layer(1, 1, hidden, 8, seed=100 + seed)
        weights, ids = _routing(1, experts, top_k, seed=100 + seed)
        if seed % 3 == 2:
            ids[0, 0] = -1  # an id this rank does not serve
        calls.append((x, weights, ids))
    results = {}
    try:
        for modes in ("direct,combine", "direct,combine,single"):
            monkeypatch.setenv("FLYDSL_MOE_DECODE", modes)
            plans.clear_all()
            results[modes] = [fused_moe(x, w1, w2, weights, ids, **options).clone() for x, weights, ids in calls]
    finally:
        plans.clear_all()
    # The same bits where both launch stage 1 as the same tiles; else (the two launches' stage 1 chosen by I, the one
    # launch's held to the combined kernel's CTA size) the sums' order differs: within a rounding of the output.
    element_bytes = 1 if quant else 2
    cfg1, _ = choose_one_launch_configs(hidden, top_k, element_bytes)
    same_tiles = cfg1 == choose_grouped_skinny_config(hidden, True, element_bytes, True, quant == "block", n_out=inter)
    for two, one in zip(results["direct,combine"], results["direct,combine,single"], strict=True):
        assert not one.isnan().any()
        if same_tiles:
            assert torch.equal(one, two)
        else:
            torch.testing.assert_close(one.float(), two.float(), rtol=0, atol=1e-2 * float(two.float().abs().max()))


def test_fused_moe_fp16_and_new_output():
    x, w1, w2 = _layer(200, 16, 256, 128, dtype=torch.float16, seed=3)
    weights, ids = _routing(200, 16, 4, seed=3)
    out = fused_moe(x, w1, w2, weights, ids)
    assert out.dtype == torch.float16 and out.shape == x.shape
    expected = fused_moe_reference(x, w1, w2, weights, ids)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


def test_skewed_and_empty_experts():
    """Most tokens on the first experts, many experts without a token."""
    x, w1, w2 = _layer(1000, 64, 256, 256, seed=5)
    weights, ids = _routing(1000, 64, 2, seed=5, skew=0.5)
    assert ids.unique().numel() < 64
    _check(x, w1, w2, weights, ids)


def test_all_tokens_on_one_expert():
    x, w1, w2 = _layer(777, 8, 256, 128, seed=6)
    weights = torch.rand(777, 1, device=DEVICE)
    ids = torch.full((777, 1), 5, dtype=torch.int32, device=DEVICE)
    _check(x, w1, w2, weights, ids)


def test_dropped_ids_and_int64_ids():
    """Expert parallelism: ids this rank does not serve (-1, past E) add nothing; a token with none gets zeros."""
    x, w1, w2 = _layer(300, 32, 256, 128, seed=7)
    weights, ids = _routing(300, 128, 8, seed=7)
    ids = torch.where(ids < 32, ids, torch.full_like(ids, -1)).long()
    ids[0] = -1
    ids[1, :4] = 200
    out = _check(x, w1, w2, weights, ids)
    assert (out[0] == 0).all()


def test_outputs_are_deterministic_and_independent_of_token_order():
    x, w1, w2 = _layer(1500, 16, 512, 256, seed=8)
    weights, ids = _routing(1500, 16, 4, seed=8)
    first = fused_moe(x, w1, w2, weights, ids)
    for _ in range(3):
        assert torch.equal(fused_moe(x, w1, w2, weights, ids), first)
    order = torch.randperm(1500, device=DEVICE, generator=_generator(9))
    permuted = fused_moe(x[order], w1, w2, weights[order], ids[order])
    assert torch.equal(permuted, first[order])


def test_no_tokens():
    x, w1, w2 = _layer(0, 8, 256, 128)
    weights = torch.empty(0, 2, device=DEVICE)
    ids = torch.empty(0, 2, dtype=torch.int32, device=DEVICE)
    assert fused_moe(x, w1, w2, weights, ids).shape == (0, 256)


def test_fused_moe_is_captured_in_a_cuda_graph(graphed):
    tokens, experts, top_k = 500, 32, 4
    x, w1, w2 = _layer(tokens, experts, 256, 256, seed=10)
    weights, ids = _routing(tokens, experts, top_k, seed=10)
    graph, out = graphed(lambda: fused_moe(x, w1, w2, weights, ids))
    for seed in range(3):
        new_weights, new_ids = _routing(tokens, experts, top_k, seed=20 + seed, skew=0.3 * seed)
        if seed == 2:
            new_ids[::3] = -1  # fewer rows: a shorter padded total
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        x.copy_(torch.randn(tokens, 256, device=DEVICE, generator=_generator(seed)).to(x.dtype))
        graph.replay()
        torch.cuda.synchronize()
        expected = fused_moe_reference(x, w1, w2, weights, ids)
        scale = float(expected.abs().max())
        torch.testing.assert_close(out.float(), expected, rtol=0, atol=2e-2 * scale)


def test_large_layer_rows_past_two_to_the_31_elements():
    """A gathered A of more than 2^31 elements (capacity x H): 64-bit row offsets in the gather and the combine."""
    tokens, experts, top_k, hidden, inter = 40000, 8, 8, 7168, 64
    x, w1, w2 = _layer(tokens, experts, hidden, inter, seed=11)
    weights, ids = _routing(tokens, experts, top_k, seed=11)
    assert tokens * top_k * hidden > 2**31
    out = fused_moe(x, w1, w2, weights, ids)
    rows = torch.arange(0, tokens, 997, device=DEVICE)  # a sample of tokens against the reference
    expected = fused_moe_reference(x[rows], w1, w2, weights[rows], ids[rows])
    torch.testing.assert_close(out[rows].float(), expected, rtol=0, atol=2e-2 * float(expected.abs().max()))


# --- fp8 ------------------------------------------------------------------------------------------------------------


def _fp8_weights(w, granularity):
    """(w8, scales, dequantized) of bf16 experts' weights (E, N, K): per expert and row ("channel"), per expert
    ("tensor") or per expert and 128 x 128 block ("block"), e4m3."""
    from flydsl.kernels.moe.reference import dequantize_experts
    from flydsl.kernels.quantize import quantize_fp8

    experts, rows, k = w.shape
    if granularity == "block":
        w8, scales = zip(*(quantize_fp8(w[e], "block") for e in range(experts)), strict=True)
        w8, scales = torch.stack(w8), torch.stack(scales)
        return w8, scales, dequantize_experts(w8, scales, "block")
    if granularity == "channel":
        w8, scales = quantize_fp8(w.reshape(experts * rows, k), "token")
        scales = scales.view(experts, rows)
        return w8.view(experts, rows, k), scales, w8.view(experts, rows, k).float() * scales[..., None]
    scales = w.float().abs().amax(dim=(1, 2)) / 448.0
    w8 = (w.float() / scales[:, None, None]).to(torch.float8_e4m3fn)
    return w8, scales, w8.float() * scales[:, None, None]


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter",
    [
        (1, 8, 2, 256, 128),  # one token: the weight-streaming stages (weight-only fp8)
        (5, 16, 4, 1008, 208),  # decode: K tails in both skinny stages, N tails
        (40, 64, 4, 512, 256),  # decode: 160 ids over 64 experts, K tails none
        (3, 8, 2, 272, 1040),  # decode: a long-K stage 2 (two columns of warps), K and N tails
        (300, 8, 2, 256, 512),  # 64-row tiles
        (2000, 8, 2, 512, 384),  # 128-row tiles
        (5000, 8, 2, 256, 400),  # 2-CTA clusters, I not a multiple of the tile
        (64, 128, 8, 512, 96),  # many experts
    ],
)
def test_fused_moe_fp8_matches_the_reference(tokens, experts, top_k, hidden, inter, granularity):
    """fp8 weights and per-token fp8 activations (x, then h): against the float32 layer of the dequantized weights
    within the activations' two fp8 roundings (decode-sized calls with x quantized: one); weight-only decode (x and h
    in bf16) within 3e-2 (bf16 roundings of h and the output, as bf16 weights' 2e-2, with room)."""
    x, w1, w2 = _layer(tokens, experts, hidden, inter, seed=tokens + 1)
    w1_8, s1, w1_deq = _fp8_weights(w1, granularity)
    w2_8, s2, w2_deq = _fp8_weights(w2, granularity)
    weights, ids = _routing(tokens, experts, top_k, seed=tokens + 1)
    out = torch.full_like(x, float("nan"))
    options = dict(quant="fp8", granularity=granularity, w1_scale=s1, w2_scale=s2)
    fused_moe(x, w1_8, w2_8, weights, ids, out=out, **options)
    expected = fused_moe_reference(x, w1_deq, w2_deq, weights, ids)
    scale = expected.abs().max().clamp(min=1e-3)
    assert not out.isnan().any()
    weight_only = decodes(tokens, tokens * top_k, experts) and not decode_modes(tokens, top_k, inter).quantized
    atol = 3e-2 if weight_only else 6e-2
    torch.testing.assert_close(out.float() / scale, expected / scale, rtol=0, atol=atol)
    assert torch.equal(fused_moe(x, w1_8, w2_8, weights, ids, **options), out)  # deterministic


@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter",
    [
        (1, 8, 2, 256, 128),  # one token: the weight-streaming stages (weight-only fp8)
        (5, 16, 4, 384, 320),  # decode: K tails in both skinny stages, stage 2's last K block half (I 320)
        (40, 64, 4, 512, 256),  # decode: 160 ids over 64 experts
        (300, 8, 2, 256, 512),  # 64-row tiles
        (2000, 8, 2, 512, 384),  # 128-row tiles
        (5000, 8, 2, 256, 448),  # 2-CTA clusters; stage 2's last K block partial (I 448)
        (64, 128, 8, 512, 192),  # many experts, few rows each (decode)
        (37, 256, 8, 1024, 256),  # DeepSeek-V3-like routing, small (decode)
    ],
)
def test_fused_moe_block_scaled_matches_the_reference(tokens, experts, top_k, hidden, inter):
    """fp8 weights in 128 x 128 blocks and fp8 activations in 1 x 128 groups (x, then h): against the float32 layer
    of the dequantized weights within the activations' two fp8 roundings (8e-2 of the largest output: a single
    token's outputs are few, and the error of one of them is measured against their max); decode-sized calls of
    more than one token (weight-only fp8: x and h in bf16) within 3e-2; deterministic."""
    x, w1, w2 = _layer(tokens, experts, hidden, inter, seed=tokens + 7)
    w1_8, s1, w1_deq = _fp8_weights(w1, "block")
    w2_8, s2, w2_deq = _fp8_weights(w2, "block")
    weights, ids = _routing(tokens, experts, top_k, seed=tokens + 7)
    out = torch.full_like(x, float("nan"))
    options = dict(quant="fp8", granularity="block", w1_scale=s1, w2_scale=s2)
    fused_moe(x, w1_8, w2_8, weights, ids, out=out, **options)
    expected = fused_moe_reference(x, w1_deq, w2_deq, weights, ids)
    scale = expected.abs().max().clamp(min=1e-3)
    assert not out.isnan().any()
    atol = 3e-2 if decodes(tokens, tokens * top_k, experts) and tokens > 1 else 8e-2
    torch.testing.assert_close(out.float() / scale, expected / scale, rtol=0, atol=atol)
    assert torch.equal(fused_moe(x, w1_8, w2_8, weights, ids, **options), out)


@pytest.mark.parametrize("tokens", [500, 6], ids=["prefill", "decode"])
def test_fused_moe_block_scaled_uses_each_blocks_scale(tokens):
    """Blocks scaled far apart (powers of two from 2^-6 to 2^6, per expert, block row and K block): a scale applied
    to the wrong block, gate half or K step shows at once (both routes)."""
    experts, top_k, hidden, inter = 4, 2, 512, 256
    x, w1, w2 = _layer(tokens, experts, hidden, inter, seed=3)
    g = _generator(5)
    w1_8, w2_8 = (w.float().clamp(-1, 1).mul(400).to(torch.float8_e4m3fn) for w in (w1 * hidden**0.5, w2 * inter**0.5))
    s1 = torch.exp2(torch.randint(-6, 7, (experts, 2 * inter // 128, hidden // 128), device=DEVICE, generator=g))
    s2 = torch.exp2(torch.randint(-6, 7, (experts, hidden // 128, inter // 128), device=DEVICE, generator=g))
    s1, s2 = s1.float() / 400 / hidden**0.5, s2.float() / 400 / inter**0.5
    from flydsl.kernels.moe.reference import dequantize_experts

    weights, ids = _routing(tokens, experts, top_k, seed=3)
    out = fused_moe(x, w1_8, w2_8, weights, ids, quant="fp8", granularity="block", w1_scale=s1, w2_scale=s2)
    expected = fused_moe_reference(
        x, dequantize_experts(w1_8, s1, "block"), dequantize_experts(w2_8, s2, "block"), weights, ids
    )
    scale = expected.abs().max().clamp(min=1e-3)
    torch.testing.assert_close(out.float() / scale, expected / scale, rtol=0, atol=6e-2)


@pytest.mark.parametrize("tokens", [300, 20], ids=["prefill", "decode"])
def test_fused_moe_fp8_drops_ids(tokens):
    x, w1, w2 = _layer(tokens, 32, 256, 128, seed=13)
    (w1_8, s1, w1_deq), (w2_8, s2, w2_deq) = _fp8_weights(w1, "channel"), _fp8_weights(w2, "channel")
    weights, ids = _routing(tokens, 128, 8, seed=13)
    ids = torch.where(ids < 32, ids, torch.full_like(ids, -1))
    out = fused_moe(x, w1_8, w2_8, weights, ids, quant="fp8", granularity="channel", w1_scale=s1, w2_scale=s2)
    expected = fused_moe_reference(x, w1_deq, w2_deq, weights, ids)
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=6e-2 * float(expected.abs().max()))


@pytest.mark.parametrize("quantize", ["", "quantize", "quantize,quantize_h"], ids=["weight-only", "x", "x and h"])
@pytest.mark.parametrize("granularity", ["channel", "tensor", "block"])
@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_fp8_decode_precision(monkeypatch, tokens, granularity, quantize):
    """Decode-sized fp8 calls keep h in bf16 (stage 2 weight-only, the weights converted exactly); x too for one
    token and for block scales: then as close to the float32 layer of the dequantized weights as bf16 weights are to
    theirs (2e-2 of the largest output), closer than the prefill route with its fp8 activations (forced by a larger
    call holding the same tokens 70 times), which they agree with to those activations' roundings. From two tokens
    on, per-row scales with FLYDSL_MOE_DECODE's quantize (opt-in) quantize x per token as the prefill route does
    (stage 1 on fp8 MMAs): within the prefill route's own tolerance of both, and still closer to the reference than
    the prefill route while h is not quantized (quantize_h: h per row too, the prefill route's arithmetic)."""
    from flydsl.kernels import plans

    monkeypatch.setenv("FLYDSL_MOE_DECODE", f"direct,combine,{quantize}")
    plans.clear_all()
    x, w1, w2 = _layer(tokens, 64, 512, 256, seed=21)
    w1_8, s1, w1_deq = _fp8_weights(w1, granularity)
    w2_8, s2, w2_deq = _fp8_weights(w2, granularity)
    weights, ids = _routing(tokens, 64, 8, seed=21)
    assert decodes(tokens, tokens * 8, 64) and not decodes(70 * tokens, 70 * tokens * 8, 64)
    options = dict(quant="fp8", granularity=granularity, w1_scale=s1, w2_scale=s2)
    decoded = fused_moe(x, w1_8, w2_8, weights, ids, **options).float()
    doubled = fused_moe(x.repeat(70, 1), w1_8, w2_8, weights.repeat(70, 1), ids.repeat(70, 1), **options)
    prefilled = doubled[:tokens].float()
    expected = fused_moe_reference(x, w1_deq, w2_deq, weights, ids)
    scale = float(expected.abs().max())
    modes = decode_modes(tokens, 8, 256)
    quantized, quantized_h = granularity != "block" and modes.quantized, granularity != "block" and modes.quantized_h
    if not quantized_h:
        assert (decoded - expected).abs().mean() < (prefilled - expected).abs().mean()
    torch.testing.assert_close(decoded, expected, rtol=0, atol=(8e-2 if quantized else 2e-2) * scale)
    torch.testing.assert_close(decoded, prefilled, rtol=0, atol=8e-2 * scale)
    plans.clear_all()
