"""flydsl.torch.nn.MoE with fp8 experts on the GPU: MoE.quantized (per channel, per expert, per 128 x 128 block)
quantizes as flydsl.kernels.quantize.quantize_fp8 does, and as its torch fallback does on the CPU; from_hf(quant="fp8")
gives the same module; the forward (topk_route, then fused_moe on the fp8 weights) against the float32 reference on
the dequantized weights within the activations' fp8 roundings; a DeepSeek-V3 fp8 checkpoint loaded as it is, against
its projections dequantized by hand; compiled with torch.compile(fullgraph=True) equal to eager; replayed in a CUDA
graph."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import flydsl.torch as ft  # noqa: E402
from flydsl.kernels.moe.reference import (  # noqa: E402
    dequantize_experts,
    fused_moe_reference,
    topk_route_reference,
)
from flydsl.kernels.quantize import quantize_fp8  # noqa: E402

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
E, K, H = 8, 2, 256
GRANULARITIES = ("channel", "tensor", "block")
# of the reference's largest magnitude: x and h rounded to fp8 on the way (per token, or per 1 x 128 group for
# "block"), as tests/kernels/test_moe_experts_gpu.py's fp8 and block-scaled tests allow (a single token's few outputs
# measured against their max; one scale per expert, or per 128 x 128 block, rounds small rows' weights coarser than
# one per row)
TOL = {"channel": 6e-2, "tensor": 8e-2, "block": 8e-2}


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _logits(tokens, seed):
    """Router logits that rank unambiguously: each row a permutation of 0, 1/4, ..., (E - 1) / 4 (exact in bf16), so
    that the kernel's routing and the reference's choose the same experts."""
    g = _generator(seed)
    return torch.rand(tokens, E, device=DEVICE, generator=g).argsort(dim=1).float() / 4


def _router():
    """A one-hot router (bf16): each expert's logit is one of x's first E features, exactly."""
    router = torch.zeros(E, H, device=DEVICE)
    router[:, :E] = torch.eye(E, device=DEVICE)
    return router.to(BF16)


def _input(tokens, seed):
    """x (T, H) bf16 of order one, its first E features the logits of :func:`_logits`."""
    x = torch.randn(tokens, H, device=DEVICE, generator=_generator(seed))
    x[:, :E] = _logits(tokens, seed + 1)
    return x.to(BF16)


def _mixtral(inter, seed):
    """A Mixtral block's bf16 checkpoint (block_sparse_moe naming) with the one-hot router, weights at the scale of
    a trained layer (outputs of order one)."""
    g = _generator(seed)
    state = {"gate.weight": _router()}
    for e in range(E):
        for name, shape in (("w1", (inter, H)), ("w3", (inter, H)), ("w2", (H, inter))):
            weight = torch.randn(shape, device=DEVICE, generator=g) / shape[1] ** 0.5
            state[f"experts.{e}.{name}.weight"] = weight.to(BF16)
    return state


def _deepseek(inter, seed, prefix="model.layers.5.mlp."):
    """A DeepSeek-V3 block's fp8 checkpoint: the one-hot router (bf16), each expert's float8_e4m3fn projections with
    their float32 ``weight_scale_inv`` per 128 x 128 block (dequantized: of order 1 / sqrt(fan_in))."""
    g = _generator(seed)
    state = {prefix + "gate.weight": _router(), prefix + "gate.e_score_correction_bias": torch.zeros(E, device=DEVICE)}
    for e in range(E):
        for name, (rows, cols) in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            values = (torch.randn(rows, cols, device=DEVICE, generator=g) * 16).clamp(-448, 448).to(FP8)
            blocks = (-(-rows // 128), -(-cols // 128))
            scales = (0.5 + torch.rand(blocks, device=DEVICE, generator=g)) / (16 * cols**0.5)
            state[f"{prefix}experts.{e}.{name}.weight"] = values
            state[f"{prefix}experts.{e}.{name}.weight_scale_inv"] = scales
    return state


def _reference(moe, x, w1=None, w2=None):
    """float32 (T, H): the module's router on x, topk_route_reference, then fused_moe_reference on the experts'
    dequantized weights (or on ``w1`` / ``w2`` where given)."""
    rows = x.reshape(-1, H)
    with torch.no_grad():
        weights, ids = topk_route_reference(moe.gate(rows), K)
    if w1 is None:
        w1 = dequantize_experts(moe.w1, moe.w1_scale, moe.granularity)
        w2 = dequantize_experts(moe.w2, moe.w2_scale, moe.granularity)
    return fused_moe_reference(rows, w1, w2, weights, ids)


def _assert_close(out, expected, granularity):
    """``out`` within the granularity's TOL of the largest magnitude of ``expected`` (float32), NaN-free."""
    assert not out.isnan().any(), "unwritten outputs"
    scale = expected.abs().max().clamp(min=1e-3)
    error = (out.float().reshape(expected.shape) - expected).abs().max()
    assert error <= TOL[granularity] * scale, (float(error), float(scale))


def _bits(t):
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _same_state(a, b) -> bool:
    a, b = a.state_dict(), b.state_dict()
    return list(a) == list(b) and all(torch.equal(_bits(a[k]).cpu(), _bits(b[k]).cpu()) for k in a)


# --- quantization ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantized_on_the_gpu_is_quantize_fp8(granularity):
    """Each expert's weights through quantize_fp8 ("token" rows for "channel"); from_hf(quant="fp8") gives the same
    module; the torch fallback on the CPU gives the same bits."""
    state = _mixtral(128, seed=1)
    moe = ft.nn.MoE.from_hf(state, top_k=K)
    q = moe.quantized(granularity)
    assert q.w1.is_cuda and q.w1.dtype == FP8 and q.w1_scale.dtype == torch.float32
    per = {"channel": "token", "tensor": "tensor", "block": "block"}[granularity]
    for w, w8, scale in ((moe.w1, q.w1, q.w1_scale), (moe.w2, q.w2, q.w2_scale)):
        for e in range(E):
            values, scales = quantize_fp8(w[e].detach(), per)
            assert torch.equal(_bits(w8[e]), _bits(values)), e
            assert torch.equal(scale[e], scales.reshape(scale[e].shape)), e
    assert _same_state(ft.nn.MoE.from_hf(state, top_k=K, quant="fp8", granularity=granularity), q)
    assert _same_state(copy.deepcopy(moe).cpu().quantized(granularity), q)


# --- the forward -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("inter", [128, 256])
@pytest.mark.parametrize("tokens", [1, 33, 300])
def test_fp8_moe_matches_the_reference(granularity, inter, tokens):
    q = ft.nn.MoE.from_hf(_mixtral(inter, seed=tokens + inter), top_k=K).quantized(granularity)
    x = _input(tokens, seed=tokens).view(1, tokens, H)  # (batch, sequence, hidden)
    with torch.no_grad():
        y = q(x)
        again = q(x)
    assert y.shape == x.shape and y.dtype == BF16
    _assert_close(y, _reference(q, x), granularity)
    assert torch.equal(again, y)  # the deterministic combine


@pytest.mark.parametrize("inter", [128, 256])
@pytest.mark.parametrize("tokens", [1, 33, 300])
def test_deepseek_fp8_checkpoint_matches_its_dequantized_projections(inter, tokens):
    prefix = "model.layers.5.mlp."
    state = _deepseek(inter, seed=tokens + inter, prefix=prefix)
    moe = ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix)
    assert (moe.quant, moe.granularity) == ("fp8", "block") and moe.w1.is_cuda

    def dequantized(e, name):
        key = f"{prefix}experts.{e}.{name}"
        w = state[key + ".weight"].float()
        blocks = state[key + ".weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)
        return w * blocks[: w.shape[0], : w.shape[1]]

    w1 = torch.stack([torch.cat([dequantized(e, "gate_proj"), dequantized(e, "up_proj")]) for e in range(E)])
    w2 = torch.stack([dequantized(e, "down_proj") for e in range(E)])
    x = _input(tokens, seed=tokens + 1)
    with torch.no_grad():
        y = moe(x)
    assert y.shape == x.shape and y.dtype == BF16
    _assert_close(y, _reference(moe, x, w1, w2), "block")


# --- torch.compile and CUDA graphs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_compiled_fp8_moe_equals_eager(granularity):
    torch._dynamo.reset()
    q = ft.nn.MoE.from_hf(_mixtral(128, seed=20), top_k=K).quantized(granularity)
    x = _input(100, seed=21)
    with torch.no_grad():
        eager = q(x)
        compiled = torch.compile(q, fullgraph=True)(x)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_fp8_moe_replays_in_a_cuda_graph(graphed, granularity):
    q = ft.nn.MoE.from_hf(_mixtral(128, seed=30), top_k=K).quantized(granularity)
    x = _input(100, seed=31)

    def run():
        with torch.no_grad():
            return q(x)

    graph, y = graphed(run)
    for seed in (32, 33):
        x.copy_(_input(100, seed=seed))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(y, _reference(q, x), granularity)
