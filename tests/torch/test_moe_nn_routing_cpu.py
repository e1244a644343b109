"""flydsl.torch.nn.MoE with DeepSeek-V3's routing on the CPU (the float32 reference path): sigmoid scores, the router's
correction bias (``gate.e_score_correction_bias``, for the choice only), grouped top-k and ``routed_scaling_factor``,
against a plain-torch transcription of DeepSeek-V3's MoE gate; the options carried by ``quantized``, kept float32 by
``.to(dtype)``, and refused where inconsistent."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import flydsl.torch as ft  # noqa: E402

E, H, INTER, K, GROUPS, TOP_GROUPS, SCALING = 16, 64, 32, 4, 4, 2, 2.5


def _deepseek_block(seed=0, prefix="model.layers.3.mlp."):
    """A DeepSeek-V3 MoE block's state dict (float32, random): the router with its correction bias, each expert's
    projections, and a shared expert (not read by MoE)."""
    g = torch.Generator().manual_seed(seed)
    state = {prefix + "gate.weight": torch.randn(E, H, generator=g) / H**0.5}
    state[prefix + "gate.e_score_correction_bias"] = torch.rand(E, generator=g) * 0.2
    for e in range(E):
        state[f"{prefix}experts.{e}.gate_proj.weight"] = torch.randn(INTER, H, generator=g) / H**0.5
        state[f"{prefix}experts.{e}.up_proj.weight"] = torch.randn(INTER, H, generator=g) / H**0.5
        state[f"{prefix}experts.{e}.down_proj.weight"] = torch.randn(H, INTER, generator=g) / INTER**0.5
    state[prefix + "shared_experts.gate_proj.weight"] = torch.randn(INTER, H, generator=g)
    return state, prefix


def _deepseek_moe(x, state, prefix):
    """DeepSeek-V3's routed experts in plain torch: sigmoid scores; the choice scores with the bias; each group's score
    the sum of its two best; the top groups' experts only; the top k of those; their (unbiased) scores normalized and
    times the scaling factor; each expert's down(silu(gate(x)) * up(x)) weighted and summed."""
    logits = x @ state[prefix + "gate.weight"].t()
    scores = logits.sigmoid()
    choice = scores + state[prefix + "gate.e_score_correction_bias"]
    grouped = choice.view(-1, GROUPS, E // GROUPS)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(TOP_GROUPS, dim=-1).indices, 1.0)
    mask = kept[:, :, None].expand_as(grouped).reshape(-1, E).bool()
    ids = choice.masked_fill(~mask, float("-inf")).topk(K, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * SCALING
    out = torch.zeros_like(x)
    for e in range(E):
        token, slot = torch.where(ids == e)
        if token.numel() == 0:
            continue
        w = {n: state[f"{prefix}experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down")}
        h = F.linear(F.silu(F.linear(x[token], w["gate"])) * F.linear(x[token], w["up"]), w["down"])
        out.index_add_(0, token, h * weights[token, slot, None])
    return out


def _from_hf(state, prefix):
    options = dict(scoring="sigmoid", num_groups=GROUPS, top_groups=TOP_GROUPS, routed_scaling_factor=SCALING)
    return ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix, **options)


def test_deepseek_routing_matches_deepseek_v3():
    state, prefix = _deepseek_block()
    moe = _from_hf(state, prefix)
    assert torch.equal(moe.gate.e_score_correction_bias, state[prefix + "gate.e_score_correction_bias"])
    assert "num_groups=4, top_groups=2, correction_bias=True, routed_scaling_factor=2.5" in repr(moe)
    x = torch.randn(50, H, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = moe(x)
    expected = _deepseek_moe(x, state, prefix)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # each option matters: without the bias, the groups or the scaling the output differs
    for change in (dict(routed_scaling_factor=1.0), dict(num_groups=None, top_groups=None)):
        other = ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix, scoring="sigmoid", **{**_options(), **change})
        with torch.no_grad():
            assert not torch.allclose(other(x), expected, atol=1e-4)
    unbiased = _from_hf(state, prefix)
    unbiased.gate.e_score_correction_bias.zero_()
    with torch.no_grad():
        assert not torch.allclose(unbiased(x), expected, atol=1e-4)


def _options():
    return dict(num_groups=GROUPS, top_groups=TOP_GROUPS, routed_scaling_factor=SCALING)


def test_routing_options_survive_state_dict_quantized_and_casts():
    state, prefix = _deepseek_block(seed=2)
    moe = _from_hf(state, prefix)
    assert set(moe.state_dict()) == {"gate.weight", "gate.e_score_correction_bias", "w1", "w2"}
    copy = ft.nn.MoE(H, INTER, E, K, scoring="sigmoid", correction_bias=True, **_options())
    copy.load_state_dict(moe.state_dict())
    x = torch.randn(20, H, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(copy(x), moe(x))
    fp8 = moe.quantized("channel")
    assert (fp8.num_groups, fp8.top_groups, fp8.routed_scaling_factor) == (GROUPS, TOP_GROUPS, SCALING)
    assert torch.equal(fp8.gate.e_score_correction_bias, moe.gate.e_score_correction_bias)
    moe.to(torch.bfloat16)  # the bias decides which experts win: it stays float32
    assert moe.gate.weight.dtype == torch.bfloat16 and moe.gate.e_score_correction_bias.dtype == torch.float32


def test_routing_options_are_checked():
    with pytest.raises(ValueError, match=r"MoE: top_groups: expected the number of groups kept \(1 to 4\), got None"):
        ft.nn.MoE(H, INTER, E, K, num_groups=GROUPS)
    with pytest.raises(ValueError, match="MoE: num_groups: expected a divisor of E = 16"):
        ft.nn.MoE(H, INTER, E, K, num_groups=5, top_groups=2)
    with pytest.raises(TypeError, match="MoE: routed_scaling_factor: expected a number, got '2'"):
        ft.nn.MoE(H, INTER, E, K, routed_scaling_factor="2")
    state, prefix = _deepseek_block()
    plain = ft.nn.MoE(H, INTER, E, K)
    with pytest.raises(ValueError, match="gate.e_score_correction_bias: the checkpoint's router has a correction bias"):
        plain.load_hf_state_dict(state, prefix)
    biased = ft.nn.MoE(H, INTER, E, K, correction_bias=True)
    del state[prefix + "gate.e_score_correction_bias"]
    with pytest.raises(KeyError, match="MoE: missing model.layers.3.mlp.gate.e_score_correction_bias"):
        biased.load_hf_state_dict(state, prefix)
