"""flydsl.torch.nn.MoE with fp8 experts, without a GPU: the buffers of each granularity and their state_dict,
MoE.quantized's arithmetic (quantize_fp8's), DeepSeek-V3 fp8 checkpoints loaded by from_hf (weights and block scales
stacked as they are), the float32 forward on the dequantized weights against a per-expert reference, the ops'
arguments on (fake) CUDA tensors, and errors that name the argument or key before anything is written."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.kernels.moe.reference import dequantize_experts  # noqa: E402
from flydsl.kernels.quantize.api import quantize_blocks  # noqa: E402

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
E, H, INTER, K = 4, 256, 128, 2
GRANULARITIES = ("channel", "tensor", "block")
SCALE_SHAPES = {
    "channel": ((E, 2 * INTER), (E, H)),
    "tensor": ((E,), (E,)),
    "block": ((E, 2 * INTER // 128, H // 128), (E, H // 128, 1)),
}


def _bytes(t):
    """fp8 tensors compared by their bits (NaN-safe, no fp8 arithmetic needed)."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _same_state(a, b) -> bool:
    return list(a) == list(b) and all(torch.equal(_bytes(a[k]), _bytes(b[k])) for k in a)


def _blocks(scales, rows, cols):
    """(…, ceil(rows / 128), ceil(cols / 128)) block scales, one per element of a (rows, cols) matrix."""
    return scales.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :rows, :cols]


def _deepseek(experts=E, hidden=H, inter=INTER, prefix="model.layers.3.mlp.", seed=0):
    """A DeepSeek-V3 MoE block's fp8 state dict (random): the router (bf16) and its correction bias, each expert's
    float8_e4m3fn projections with their float32 ``weight_scale_inv`` per 128 x 128 block, and a shared expert (none
    of the last two is read by MoE). The dequantized weights are of order 1 / sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    state = {
        prefix + "gate.weight": torch.randn(experts, hidden, generator=g).to(BF16),
        prefix + "gate.e_score_correction_bias": torch.zeros(experts),
    }
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    for e in ["shared_experts"] + [f"experts.{e}" for e in range(experts)]:
        for name, (rows, cols) in shapes.items():
            values = (torch.randn(rows, cols, generator=g) * 16).clamp(-448, 448).to(FP8)
            blocks = (-(-rows // 128), -(-cols // 128))
            scales = (0.5 + torch.rand(blocks, generator=g)) / (16 * cols**0.5)
            state[f"{prefix}{e}.{name}.weight"] = values
            state[f"{prefix}{e}.{name}.weight_scale_inv"] = scales
    return state


def _dequantized(state, key):
    """A checkpoint's fp8 weight times its block scales, by hand."""
    w = state[key + ".weight"].float()
    return w * _blocks(state[key + ".weight_scale_inv"], *w.shape)


def _block_reference(x, router, experts, top_k):
    """The MoE block in float32, one expert at a time: softmax of the router's logits, the top k renormalized, each
    expert's ``down(silu(gate(x)) * up(x))`` (``experts[e]``: its float32 (gate, up, down)) weighted and summed."""
    rows = x.reshape(-1, x.shape[-1]).float()
    routing = F.softmax(rows @ router.float().t(), dim=1)
    routing, selected = torch.topk(routing, top_k, dim=-1)
    routing = routing / routing.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(rows)
    for e, (gate, up, down) in enumerate(experts):
        token, slot = torch.where(selected == e)
        h = F.linear(F.silu(F.linear(rows[token], gate)) * F.linear(rows[token], up), down)
        out.index_add_(0, token, h * routing[token, slot, None])
    return out.view(x.shape)


def _module_experts(moe):
    """An fp8 MoE's experts dequantized, as (gate, up, down) per expert."""
    w1 = dequantize_experts(moe.w1, moe.w1_scale, moe.granularity)
    w2 = dequantize_experts(moe.w2, moe.w2_scale, moe.granularity)
    return [(w1[e, :INTER], w1[e, INTER:], w2[e]) for e in range(moe.num_experts)]


# --- construction and state_dict -------------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_fp8_buffers_and_state_dict_round_trip(granularity):
    torch.manual_seed(0)
    moe = ft.nn.MoE(H, INTER, E, K, dtype=BF16, quant="fp8", granularity=granularity)
    assert (moe.quant, moe.granularity) == ("fp8", granularity)
    assert moe.w1.dtype == FP8 and moe.w1.shape == (E, 2 * INTER, H)
    assert moe.w2.dtype == FP8 and moe.w2.shape == (E, H, INTER)
    assert (moe.w1_scale.shape, moe.w2_scale.shape) == SCALE_SHAPES[granularity]
    assert moe.w1_scale.dtype == moe.w2_scale.dtype == torch.float32
    assert [name for name, _ in moe.named_parameters()] == ["gate.weight"]  # the experts are buffers: no training
    assert moe.gate.weight.dtype == BF16
    assert set(moe.state_dict()) == {"gate.weight", "w1", "w2", "w1_scale", "w2_scale"}
    assert f"quant=fp8, granularity={granularity}" in repr(moe)
    # initialized as nn.Linear's weights (uniform within 1 / sqrt(fan_in)), then quantized: amax / 448 keeps them in
    w1, w2 = (dequantize_experts(w, s, granularity) for w, s in ((moe.w1, moe.w1_scale), (moe.w2, moe.w2_scale)))
    assert 0.9 / H**0.5 < w1.abs().max() <= 1.0001 / H**0.5 and 0.9 / INTER**0.5 < w2.abs().max() <= 1.0001 / INTER**0.5
    buffer = io.BytesIO()
    torch.save(moe.state_dict(), buffer)
    buffer.seek(0)
    other = ft.nn.MoE(H, INTER, E, K, dtype=BF16, quant="fp8", granularity=granularity)
    assert not _same_state(other.state_dict(), moe.state_dict())
    other.load_state_dict(torch.load(buffer), strict=True)
    assert _same_state(other.state_dict(), moe.state_dict())
    assert other.w1.dtype == FP8 and other.w1_scale.dtype == torch.float32


def test_unquantized_state_dict_is_unchanged():
    moe = ft.nn.MoE(64, 32, 8, 2, dtype=BF16)
    assert (moe.quant, moe.granularity, moe.w1_scale, moe.w2_scale) == (None, None, None, None)
    assert set(moe.state_dict()) == {"gate.weight", "w1", "w2"}
    assert "quant" not in repr(moe)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_fp8_module_on_meta(granularity):
    moe = ft.nn.MoE(H, INTER, E, K, device="meta", quant="fp8", granularity=granularity)
    assert moe.w1.device.type == "meta" and moe.w1.dtype == FP8
    assert moe.w1_scale.shape == SCALE_SHAPES[granularity][0]


# --- MoE.quantized ---------------------------------------------------------------------------------------------------


def _spec_quantized(w, per_row: bool):
    """quantize_fp8's documented arithmetic: scale amax * (1 / 448), values times 448 / max(amax, 1e-30), clamped,
    rounded to nearest even."""
    amax = w.abs().amax(dim=-1, keepdim=True) if per_row else w.abs().amax()
    values = (w * (torch.full_like(amax, 448.0) / amax.clamp(min=1e-30))).clamp(-448, 448).to(FP8)
    return values, amax * (1.0 / 448.0)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantized_follows_quantize_fp8(granularity):
    torch.manual_seed(1)
    moe = ft.nn.MoE(H, INTER, E, K)
    with torch.no_grad():
        moe.w1.mul_(torch.logspace(-3, 3, E)[:, None, None])  # experts of very different magnitudes
        moe.w1[1, 5] = 0  # a zero row: scale 0 (per channel), zeros
        moe.w1[2, :128, :128] = 0  # a zero block
        moe.w2[3] = 0  # a zero expert
    before = {key: value.clone() for key, value in moe.state_dict().items()}
    q = moe.quantized(granularity)
    assert _same_state(moe.state_dict(), before)  # the layer quantized is left as it was
    assert type(q) is ft.nn.MoE and (q.quant, q.granularity) == ("fp8", granularity)
    assert (q.top_k, q.scoring, q.renormalize, q.activation) == (moe.top_k, moe.scoring, moe.renormalize, "silu")
    assert torch.equal(q.gate.weight, moe.gate.weight)
    for w, w8, scale in ((moe.w1, q.w1, q.w1_scale), (moe.w2, q.w2, q.w2_scale)):
        for e in range(E):
            if granularity == "block":
                values, scales = quantize_blocks(w[e].detach(), FP8, "e4m3")
            else:
                values, scales = _spec_quantized(w[e].detach(), granularity == "channel")
            assert torch.equal(_bytes(w8[e]), _bytes(values)), e
            assert torch.equal(scale[e], scales.view(scale[e].shape)), e
        # e4m3 keeps 3 bits of mantissa: within 1/16 of each weight, or half a subnormal step of its scale
        per_element = dequantize_experts(torch.ones_like(w8, dtype=torch.float32), scale, granularity)
        error = (dequantize_experts(w8, scale, granularity) - w).abs()
        assert (error <= w.abs() / 16 + per_element / 512).all()
    if granularity == "channel":
        assert q.w1_scale[1, 5] == 0 and not q.w1[1, 5].view(torch.uint8).any()
    if granularity == "block":
        assert q.w1_scale[2, 0, 0] == 0
    assert not dequantize_experts(q.w2, q.w2_scale, granularity)[3].any()


def test_quantized_keeps_the_router_dtype_and_bf16_weights():
    torch.manual_seed(2)
    moe = ft.nn.MoE(H, INTER, E, K, dtype=BF16)
    q = moe.quantized("block")
    assert q.gate.weight.dtype == BF16 and torch.equal(q.gate.weight, moe.gate.weight)
    values, scales = quantize_blocks(moe.w1[1].detach().float(), FP8, "e4m3")
    assert torch.equal(_bytes(q.w1[1]), _bytes(values)) and torch.equal(q.w1_scale[1], scales)
    with pytest.raises(
        ValueError, match=r"MoE.quantized: the layer is already quantized \(quant='fp8', granularity='block'\)"
    ):
        q.quantized("channel")
    with pytest.raises(ValueError, match=r"MoE: granularity: expected one of \('channel', 'tensor', 'block'\)"):
        moe.quantized("token")


# --- forward off the GPU ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_fp8_forward_off_the_gpu_is_the_reference_of_the_dequantized_weights(granularity):
    torch.manual_seed(3)
    q = ft.nn.MoE(H, INTER, E, K).quantized(granularity)
    x = torch.randn(3, 5, H)
    with torch.no_grad():
        y = q(x)
        expected = _block_reference(x, q.gate.weight, _module_experts(q), K)
    assert y.shape == x.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    with torch.no_grad():
        half = q(x.to(BF16))
    assert half.dtype == BF16


# --- from_hf ---------------------------------------------------------------------------------------------------------


def test_from_hf_loads_deepseek_fp8_experts_as_they_are():
    prefix = "model.layers.3.mlp."
    state = _deepseek(prefix=prefix)
    moe = ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix)
    assert (moe.quant, moe.granularity) == ("fp8", "block")
    assert (moe.num_experts, moe.hidden_size, moe.intermediate_size) == (E, H, INTER)
    assert moe.gate.weight.dtype == BF16 and torch.equal(moe.gate.weight, state[prefix + "gate.weight"])
    for e in range(E):
        base = f"{prefix}experts.{e}."
        gate, up, down = (state[f"{base}{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        assert torch.equal(_bytes(moe.w1[e]), _bytes(torch.cat([gate, up])))
        assert torch.equal(_bytes(moe.w2[e]), _bytes(down))
        gate_s, up_s, down_s = (state[f"{base}{n}.weight_scale_inv"] for n in ("gate_proj", "up_proj", "down_proj"))
        assert torch.equal(moe.w1_scale[e], torch.cat([gate_s, up_s])) and torch.equal(moe.w2_scale[e], down_s)
    # the forward on the dequantized weights: each projection dequantized by hand, the block in float32
    moe = ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix, dtype=torch.float32)  # a float32 router: exact logits
    experts = [
        tuple(_dequantized(state, f"{prefix}experts.{e}.{n}") for n in ("gate_proj", "up_proj", "down_proj"))
        for e in range(E)
    ]
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y = moe(x)
    expected = _block_reference(x, state[prefix + "gate.weight"], experts, K)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_from_hf_quantizes_float_experts_as_quantized_does(granularity):
    g = torch.Generator().manual_seed(5)
    state = {"gate.weight": torch.randn(E, H, generator=g)}
    for e in range(E):
        for name, shape in (("w1", (INTER, H)), ("w3", (INTER, H)), ("w2", (H, INTER))):
            state[f"experts.{e}.{name}.weight"] = torch.randn(shape, generator=g).to(BF16)
    moe = ft.nn.MoE.from_hf(state, top_k=K, quant="fp8", granularity=granularity)
    assert (moe.quant, moe.granularity, moe.gate.weight.dtype) == ("fp8", granularity, torch.float32)
    assert _same_state(moe.state_dict(), ft.nn.MoE.from_hf(state, top_k=K).quantized(granularity).state_dict())
    assert ft.nn.MoE.from_hf(state, top_k=K, quant="fp8").granularity == "channel"


# --- on (fake) CUDA tensors: the ops' arguments ---------------------------------------------------------------------


class _Calls(TorchDispatchMode):
    """Records each op dispatched inside it with its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), args))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_fp8_moe_passes_its_scales_to_fused_moe(granularity):
    """On bf16 CUDA tensors the module calls topk_route, then fused_moe with quant="fp8", its granularity and scales
    (whose fake implementation checks their shapes as the kernel does)."""
    moe = ft.nn.MoE(H, INTER, E, K, device="meta", dtype=BF16, quant="fp8", granularity=granularity)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        moe.to_empty(device="cuda")
        x = torch.empty(2, 3, H, dtype=BF16, device="cuda")
        with _Calls() as rec:
            y = moe(x)
        assert y.shape == x.shape and y.dtype == BF16 and y.device.type == "cuda"
    ours = [(name, args) for name, args in rec.calls if name.startswith("flydsl.")]
    assert [name for name, _ in ours] == ["flydsl.topk_route.default", "flydsl.fused_moe.default"]
    args = ours[1][1]
    assert args[5:8] == ("silu", "fp8", granularity)
    assert args[1].dtype == args[2].dtype == FP8
    assert (tuple(args[8].shape), tuple(args[9].shape)) == SCALE_SHAPES[granularity]


# --- errors ----------------------------------------------------------------------------------------------------------


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"MoE: quant: expected None or 'fp8', got 'int8'"):
        ft.nn.MoE(H, INTER, E, K, quant="int8")
    with pytest.raises(ValueError, match=r"MoE: granularity: expected one of \('channel', 'tensor', 'block'\) with"):
        ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="token")
    with pytest.raises(ValueError, match=r"MoE: granularity: goes with quant='fp8', got 'block' with quant=None"):
        ft.nn.MoE(H, INTER, E, K, granularity="block")
    with pytest.raises(
        ValueError, match=r"MoE: granularity 'block': H = 192 and I = 128; expected H a multiple of 128"
    ):
        ft.nn.MoE(192, INTER, E, K, quant="fp8", granularity="block")
    with pytest.raises(ValueError, match=r"MoE: granularity 'block': H = 256 and I = 96; expected"):
        ft.nn.MoE(H, 96, E, K, quant="fp8", granularity="block")
    ft.nn.MoE(192, 96, E, K, quant="fp8", granularity="channel")  # per channel: any size (the kernel checks its own)


def test_state_dict_of_another_granularity_is_refused():
    moe = ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="block")
    channel = ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="channel")
    with pytest.raises(RuntimeError, match="size mismatch for w1_scale"):
        moe.load_state_dict(channel.state_dict())
    with pytest.raises(RuntimeError, match='Missing key.*"w1_scale"'):
        moe.load_state_dict(ft.nn.MoE(H, INTER, E, K).state_dict())


def test_fp8_checkpoint_errors_name_the_key_and_write_nothing():
    prefix = "mlp."
    state = _deepseek(prefix=prefix)
    moe = ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="block", correction_bias=True)  # (the router's bias)
    before = {key: value.clone() for key, value in moe.state_dict().items()}

    def refused(error, match, checkpoint, module=moe):
        with pytest.raises(error, match=match):
            module.load_hf_state_dict(checkpoint, prefix)

    missing = dict(state)
    del missing["mlp.experts.2.down_proj.weight_scale_inv"]
    refused(KeyError, r"MoE: missing mlp.experts.2.down_proj.weight_scale_inv \(a \(2, 1\) tensor\)", missing)
    wrong = dict(state, **{"mlp.experts.3.up_proj.weight_scale_inv": torch.ones(2, 2)})
    refused(ValueError, r"MoE: mlp.experts.3.up_proj.weight_scale_inv: expected shape \(1, 2\), got \(2, 2\)", wrong)
    mixed = dict(state, **{"mlp.experts.1.up_proj.weight": torch.zeros(INTER, H, dtype=BF16)})
    refused(ValueError, r"MoE: mlp.experts.1.up_proj.weight: expected float8_e4m3fn .* got torch.bfloat16", mixed)
    fp8_scales = dict(state, **{"mlp.experts.0.gate_proj.weight_scale_inv": torch.ones(1, 2).to(FP8)})
    refused(
        ValueError, r"weight_scale_inv: expected a float tensor that is not fp8, got torch.float8_e4m3fn", fp8_scales
    )
    plain = ft.nn.MoE(H, INTER, E, K, correction_bias=True)
    for module in (plain, ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="channel", correction_bias=True)):
        match = r"MoE: mlp.experts.0.gate_proj.weight: the checkpoint's experts are float8_e4m3fn with 128 x 128"
        refused(ValueError, match + r".*expected a MoE of quant='fp8', granularity='block'", state, module)
    with pytest.raises(ValueError, match=r"granularity='block'.*got quant='fp8', granularity='tensor'"):
        ft.nn.MoE.from_hf(state, top_k=K, prefix=prefix, granularity="tensor")
    for key, value in moe.state_dict().items():
        assert torch.equal(_bytes(value), _bytes(before[key])), key


def test_fp8_checkpoint_needs_whole_blocks_of_intermediate_rows():
    state = _deepseek(hidden=H, inter=192)  # gate and up: 2 block rows each, w1_scale: 3
    with pytest.raises(ValueError, match=r"MoE: intermediate_size: .* I a multiple of 128; got I = 192 \(H = 256\)"):
        ft.nn.MoE.from_hf(state, top_k=K, prefix="model.layers.3.mlp.")


def test_float_checkpoint_with_an_fp8_expert_is_refused():
    g = torch.Generator().manual_seed(6)
    state = {"gate.weight": torch.randn(E, H, generator=g)}
    for e in range(E):
        for name, shape in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)), ("down_proj", (H, INTER))):
            state[f"experts.{e}.{name}.weight"] = torch.randn(shape, generator=g)
    state["experts.2.down_proj.weight"] = state["experts.2.down_proj.weight"].to(FP8)
    with pytest.raises(ValueError, match="MoE: experts.2.down_proj.weight: expected a float tensor that is not fp8"):
        ft.nn.MoE.from_hf(state, top_k=K, quant="fp8")


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.float()])
def test_casts_keep_the_fp8_experts(cast):
    """``.to(dtype)`` and friends cast the router only: e4m3 weights and float32 scales keep their dtypes and bits
    (torch would cast every floating buffer, fp8 included); a bf16 layer's weights are cast as before."""
    moe = ft.nn.MoE(H, INTER, E, K, quant="fp8", granularity="block")
    before = {name: t.clone() for name, t in moe.state_dict().items() if name != "gate.weight"}
    assert cast(moe) is moe
    assert moe.w1.dtype == moe.w2.dtype == torch.float8_e4m3fn
    assert moe.w1_scale.dtype == moe.w2_scale.dtype == torch.float32
    for name, t in before.items():
        assert torch.equal(moe.state_dict()[name].view(torch.uint8), t.view(torch.uint8)), name
    assert moe.gate.weight.dtype != torch.float8_e4m3fn
    plain = cast(ft.nn.MoE(H, INTER, E, K))
    assert plain.w1.dtype == plain.gate.weight.dtype and isinstance(plain.w1, torch.nn.Parameter)
