"""torch.ops.flydsl.topk_route, align_tokens and fused_moe on the GPU: the ops give the kernels' results
(flydsl.kernels.moe, bit for bit, functional and ``_out``) and the float32 references' (the routing exactly, on logits
whose ranking is unambiguous; the experts within bf16 rounding); route and experts compiled with
torch.compile(fullgraph=True) equal eager bit for bit; captured in a CUDA graph and replayed on new inputs;
flydsl.torch.nn.MoE loaded from a Mixtral checkpoint against Hugging Face's Mixtral block in plain torch, eager,
compiled and in a CUDA graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.kernels.moe import align_capacity, align_tokens, fused_moe, topk_route  # noqa: E402
from flydsl.kernels.moe.reference import (  # noqa: E402
    align_tokens_reference,
    fused_moe_reference,
    topk_route_reference,
)

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BF16 = torch.bfloat16
TOKENS, E, K, H, INTER = 100, 16, 4, 256, 128
TOL = 2e-2  # of the reference's largest magnitude: bf16 intermediates


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _logits(tokens, experts, seed, dtype=torch.float32):
    """Router logits that rank unambiguously: each row a permutation of 0, 1/4, ..., (E - 1) / 4 (exact in bf16 and
    fp16; softmax scores a factor e^(1/4) apart, sigmoid scores far more than float32's rounding apart), so that the
    kernel's scores and torch's, a few ulps apart, choose the same experts."""
    g = _generator(seed)
    return (torch.rand(tokens, experts, device=DEVICE, generator=g).argsort(dim=1).float() / 4).to(dtype)


def _layer(tokens=TOKENS, experts=E, hidden=H, inter=INTER, dtype=BF16, seed=0):
    """x, w1, w2 at the scales of a trained layer (outputs of order one)."""
    g = _generator(seed)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, device=DEVICE, generator=g) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=DEVICE, generator=g) / inter**0.5).to(dtype)
    return x, w1, w2


def _assert_close(out, expected):
    """``out`` within TOL of the largest magnitude of ``expected`` (float32), NaN-free."""
    assert not out.isnan().any(), "unwritten outputs"
    scale = expected.abs().max().clamp(min=1e-3)
    error = (out.float() - expected.float()).abs().max()
    assert error <= TOL * scale, (float(error), float(scale))


# --- the ops against the kernels and the references ------------------------------------------------------------------


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_topk_route_op_equals_the_kernel_and_the_reference(scoring, dtype):
    logits = _logits(TOKENS, E, seed=1, dtype=dtype)
    weights, ids = torch.ops.flydsl.topk_route(logits, K, scoring)
    kernel_weights, kernel_ids = topk_route(logits, K, scoring=scoring)
    assert torch.equal(weights, kernel_weights) and torch.equal(ids, kernel_ids)
    reference_weights, reference_ids = topk_route_reference(logits, K, scoring=scoring)
    assert torch.equal(ids, reference_ids)
    torch.testing.assert_close(weights, reference_weights, rtol=1e-5, atol=1e-6)
    given_weights = torch.full((TOKENS, K), float("nan"), device=DEVICE)
    given_ids = torch.full((TOKENS, K), -7, dtype=torch.int32, device=DEVICE)
    torch.ops.flydsl.topk_route_out(logits, K, scoring, True, None, None, None, given_weights, given_ids)
    assert torch.equal(given_weights, weights) and torch.equal(given_ids, ids)


def test_topk_route_op_passes_its_options():
    """DeepSeek-V3's router (sigmoid, a correction bias, 8 groups keeping 4), unnormalized, from a strided view of
    the logits (made contiguous rows by the op where needed)."""
    wide = torch.randn(50, 2 * 64, device=DEVICE, generator=_generator(2))
    logits = wide[:, ::2]  # stride 2 on E: the op copies it
    bias = torch.randn(64, device=DEVICE, generator=_generator(3)) / 10
    weights, ids = torch.ops.flydsl.topk_route(logits, 8, "sigmoid", False, bias, 8, 4)
    expected = topk_route(
        logits.contiguous(), 8, scoring="sigmoid", renormalize=False, bias=bias, num_groups=8, top_groups=4
    )
    assert torch.equal(weights, expected[0]) and torch.equal(ids, expected[1])


@pytest.mark.parametrize("tokens, block_m", [(1, 16), (TOKENS, 64), (3000, 64)])  # 3000 x 4 ids: three kernels
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_align_tokens_op_equals_the_reference(tokens, block_m, id_dtype):
    _, ids = topk_route_reference(_logits(tokens, E, seed=tokens), K)
    ids = ids.to(id_dtype)
    ids[::7, 1] = -1  # dropped (expert parallelism)
    got = torch.ops.flydsl.align_tokens(ids, E, block_m)
    expected = align_tokens_reference(ids, E, block_m)
    capacity = align_capacity(tokens * K, E, block_m)
    assert [tuple(t.shape) for t in got] == [(capacity,), (capacity // block_m,), (1,)]
    for ours, theirs in zip(got, expected, strict=True):
        assert torch.equal(ours, theirs)
    given = [torch.full_like(t, 0x5A5A5A5A) for t in got]
    torch.ops.flydsl.align_tokens_out(ids, E, block_m, *given)
    for ours, theirs in zip(given, expected, strict=True):
        assert torch.equal(ours, theirs)
    assert all(torch.equal(a, b) for a, b in zip(align_tokens(ids, E, block_m), expected, strict=True))


@pytest.mark.parametrize("tokens", [1, TOKENS])  # 1: the decode path
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_fused_moe_op_equals_the_kernel_and_the_reference(tokens, dtype):
    x, w1, w2 = _layer(tokens, dtype=dtype, seed=tokens)
    weights, ids = topk_route(_logits(tokens, E, seed=tokens), K)
    ids[::5, 0] = -1  # dropped: adds nothing
    out = torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids)
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(out, fused_moe(x, w1, w2, weights, ids))  # the deterministic combine
    _assert_close(out, fused_moe_reference(x, w1, w2, weights, ids))
    given = torch.full_like(x, float("nan"))
    torch.ops.flydsl.fused_moe_out(x, w1, w2, weights, ids, "silu", None, None, None, None, given)
    assert torch.equal(given, out)


def test_fused_moe_op_fp8():
    """quant="fp8" through the op: the kernel's result, bit for bit (per-channel e4m3 weights)."""
    from flydsl.kernels.quantize import quantize_fp8

    x, w1, w2 = _layer(TOKENS, seed=3)
    weights, ids = topk_route(_logits(TOKENS, E, seed=3), K)
    (w1_8, s1), (w2_8, s2) = (quantize_fp8(w.reshape(-1, w.shape[2]), "token") for w in (w1, w2))
    w1_8, w2_8 = w1_8.view(w1.shape), w2_8.view(w2.shape)
    s1, s2 = s1.view(w1.shape[:2]), s2.view(w2.shape[:2])
    out = torch.ops.flydsl.fused_moe(x, w1_8, w2_8, weights, ids, "silu", "fp8", "channel", s1, s2)
    expected = fused_moe(x, w1_8, w2_8, weights, ids, quant="fp8", granularity="channel", w1_scale=s1, w2_scale=s2)
    assert torch.equal(out, expected)


def test_opcheck():
    x, w1, w2 = _layer(seed=4)
    logits = _logits(TOKENS, E, seed=4)
    weights, ids = topk_route(logits, K)
    torch.library.opcheck(torch.ops.flydsl.topk_route, (logits, K))
    torch.library.opcheck(torch.ops.flydsl.align_tokens, (ids, E, 64))
    torch.library.opcheck(torch.ops.flydsl.fused_moe, (x, w1, w2, weights, ids))


# --- torch.compile and CUDA graphs -----------------------------------------------------------------------------------


def _route_and_experts(x, logits, w1, w2):
    weights, ids = torch.ops.flydsl.topk_route(logits, K)
    return torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids)


@pytest.mark.parametrize("tokens", [1, TOKENS])
def test_compiled_route_and_experts_equal_eager(tokens):
    torch._dynamo.reset()
    x, w1, w2 = _layer(tokens, seed=5)
    logits = _logits(tokens, E, seed=5, dtype=BF16)
    compiled = torch.compile(_route_and_experts, fullgraph=True)
    with torch.no_grad():
        eager = _route_and_experts(x, logits, w1, w2)
        assert torch.equal(compiled(x, logits, w1, w2), eager)
    _assert_close(eager, fused_moe_reference(x, w1, w2, *topk_route_reference(logits, K)))


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_route_and_experts_replay_in_a_cuda_graph(graphed, mode):
    """Captured once, replayed on new tokens and logits copied into the captured inputs: each replay routes and
    runs the experts anew (nothing read back to the host)."""
    torch._dynamo.reset()
    x, w1, w2 = _layer(seed=6)
    logits = _logits(TOKENS, E, seed=6)
    step = _route_and_experts if mode == "eager" else torch.compile(_route_and_experts, fullgraph=True)

    def run():
        with torch.no_grad():
            return step(x, logits, w1, w2)

    graph, out = graphed(run)
    for seed in range(7, 10):
        x.copy_(_layer(seed=seed)[0])
        logits.copy_(_logits(TOKENS, E, seed=seed))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(out, fused_moe_reference(x, w1, w2, *topk_route_reference(logits, K)))


def test_out_ops_replay_into_static_buffers(graphed):
    """The ``_out`` forms write the buffers given, so a captured step needs no allocation of its outputs."""
    x, w1, w2 = _layer(seed=11)
    logits = _logits(TOKENS, E, seed=11)
    weights = torch.empty(TOKENS, K, device=DEVICE)
    ids = torch.empty(TOKENS, K, dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(x)

    def run():
        torch.ops.flydsl.topk_route_out(logits, K, "softmax", True, None, None, None, weights, ids)
        torch.ops.flydsl.fused_moe_out(x, w1, w2, weights, ids, "silu", None, None, None, None, out)

    graph, _ = graphed(run)
    logits.copy_(_logits(TOKENS, E, seed=12))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    expected_weights, expected_ids = topk_route_reference(logits, K)
    assert torch.equal(ids, expected_ids)
    _assert_close(out, fused_moe_reference(x, w1, w2, expected_weights, expected_ids))


# --- nn.MoE against Hugging Face's Mixtral block ---------------------------------------------------------------------

MIXTRAL_EXPERTS, MIXTRAL_TOP_K = 8, 2


def _mixtral(tokens, seed=0, experts=MIXTRAL_EXPERTS, hidden=H, inter=INTER):
    """A Mixtral block's checkpoint (block_sparse_moe naming, bf16) and an input (T, H) whose router logits rank
    unambiguously: the router reads x's first E features (gate.weight one-hot), each token's a permutation of 0, 1/4,
    ..., (E - 1) / 4, so the logits are exact in bf16 and both implementations choose the same experts."""
    g = _generator(seed)
    router = torch.zeros(experts, hidden, device=DEVICE)
    router[:, :experts] = torch.eye(experts, device=DEVICE)
    state = {"gate.weight": router.to(BF16)}
    for e in range(experts):
        for name, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
            weight = torch.randn(shape, device=DEVICE, generator=g) / shape[1] ** 0.5  # fan_in: unit outputs
            state[f"experts.{e}.{name}.weight"] = weight.to(BF16)
    x = torch.randn(tokens, hidden, device=DEVICE, generator=g)
    x[:, :experts] = _logits(tokens, experts, seed + 1)
    return state, x.to(BF16)


def _mixtral_block(x, state, top_k):
    """Hugging Face's MixtralSparseMoeBlock.forward in plain torch, in x's dtype: softmax of the router's logits in
    float32, the top k renormalized and cast to x's dtype, each expert's ``w2(silu(w1(x)) * w3(x))`` scaled by its
    weight and summed."""
    rows = x.reshape(-1, x.shape[-1])
    routing = F.softmax(F.linear(rows, state["gate.weight"]), dim=1, dtype=torch.float)
    routing, selected = torch.topk(routing, top_k, dim=-1)
    routing = (routing / routing.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(rows)
    for e in range(state["gate.weight"].shape[0]):
        token, slot = torch.where(selected == e)
        if token.numel() == 0:
            continue
        w1, w3, w2 = (state[f"experts.{e}.{name}.weight"] for name in ("w1", "w3", "w2"))
        h = F.linear(F.silu(F.linear(rows[token], w1)) * F.linear(rows[token], w3), w2)
        out.index_add_(0, token, h * routing[token, slot, None])
    return out.view(x.shape)


@pytest.mark.parametrize("tokens", [1, TOKENS])
def test_moe_module_matches_hf_mixtral(tokens):
    state, x = _mixtral(tokens, seed=tokens)
    moe = ft.nn.MoE.from_hf(state, top_k=MIXTRAL_TOP_K)
    assert moe.w1.is_cuda and moe.w1.dtype == BF16
    x = x.view(1, tokens, H)  # (batch, sequence, hidden)
    with torch.no_grad():
        y = moe(x)
        expected = _mixtral_block(x, state, MIXTRAL_TOP_K)
    assert y.shape == x.shape and y.dtype == BF16
    _assert_close(y, expected)


def test_compiled_moe_module_equals_eager():
    torch._dynamo.reset()
    state, x = _mixtral(TOKENS, seed=13)
    moe = ft.nn.MoE.from_hf(state, top_k=MIXTRAL_TOP_K)
    with torch.no_grad():
        eager = moe(x)
        compiled = torch.compile(moe, fullgraph=True)(x)
    assert torch.equal(compiled, eager)


def test_moe_module_replays_in_a_cuda_graph(graphed):
    state, x = _mixtral(TOKENS, seed=14)
    moe = ft.nn.MoE.from_hf(state, top_k=MIXTRAL_TOP_K)

    def run():
        with torch.no_grad():
            return moe(x)

    graph, y = graphed(run)
    for seed in (15, 16):
        x.copy_(_mixtral(TOKENS, seed=seed)[1])
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(y, _mixtral_block(x, state, MIXTRAL_TOP_K))
