"""fused_moe's decode-sized plan without a GPU: CPU tensors taken as if on device 0, launches recorded instead of run.
The plan's scratch function makes every buffer the steps use (so that a replay's launches touch nothing else), and
the launches bind them in order: align into the alignment buffers, stage 1 from x into h, stage 2 from h into y, the
combine from y into the output (fp8 weights, every granularity: the same four launches, weight-only); with the
decode modes (the default for one token; FLYDSL_MOE_DECODE picks them for A/B timing), one token takes no alignment,
and where I is small stage 2 and the combine are one launch. The GPU side (results,
replays) is tests/kernels/test_plans_gpu.py and test_moe_experts_gpu.py."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from flydsl.kernels import validation  # noqa: E402
from flydsl.kernels.moe import decode, experts  # noqa: E402

TOKENS, HIDDEN, EXPERTS, INTER, TOP_K = 4, 256, 8, 128, 2


@pytest.fixture
def recorded(monkeypatch):
    """Launches as (kernel name, argument values); CPU tensors pass as CUDA ones on a 132-SM device."""
    kernel_module = importlib.import_module("flydsl.compiler.kernel")  # (flydsl.compiler.kernel: the decorator)
    device = importlib.import_module("flydsl.kernels.device")
    launches = []

    def describe(who, name, t):
        values = (t, t.shape, t.stride(), validation.torch_dtype(t.dtype), 0, t.data_ptr())
        return validation.TensorInfo(*values)

    monkeypatch.setattr(validation, "describe", describe)
    monkeypatch.setattr(device, "sm_count", lambda index=0: 132)
    monkeypatch.setattr(device, "l2_bytes", lambda index=0: 50 * 2**20)
    monkeypatch.setattr(importlib.import_module("flydsl.kernels.memory"), "stream_key", lambda t: (-1, 0))
    monkeypatch.delenv("FLYDSL_MOE_DECODE", raising=False)
    monkeypatch.setattr(kernel_module.KernelCall, "launch", lambda call, **config: launches.append(call))
    return launches


def _inputs(granularity: str | None):
    x = torch.randn(TOKENS, HIDDEN).bfloat16()
    w1, w2 = torch.randn(EXPERTS, 2 * INTER, HIDDEN), torch.randn(EXPERTS, HIDDEN, INTER)
    ids = torch.tensor([[0, 3], [3, 5], [7, 0], [2, 3]], dtype=torch.int32)
    weights = torch.rand(TOKENS, TOP_K)
    if granularity is None:
        return x, w1.bfloat16(), w2.bfloat16(), weights, ids, {}
    if granularity == "channel":
        scales = dict(w1_scale=torch.rand(EXPERTS, 2 * INTER), w2_scale=torch.rand(EXPERTS, HIDDEN))
    elif granularity == "block":  # one per 128 x 128 block of each expert's weights
        scales = dict(w1_scale=torch.rand(EXPERTS, 2 * INTER // 128, HIDDEN // 128))
        scales["w2_scale"] = torch.rand(EXPERTS, HIDDEN // 128, INTER // 128)
    else:
        scales = dict(w1_scale=torch.rand(EXPERTS), w2_scale=torch.rand(EXPERTS))
    w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    return x, w1, w2, weights, ids, dict(quant="fp8", granularity=granularity, **scales)


def _same(a, b) -> bool:
    """The same memory seen the same way (views made at launch are other objects)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


@pytest.mark.parametrize(
    "granularity,quantize",
    [
        (None, ""), ("channel", ""), ("tensor", ""), ("block", ""), ("channel", "quantize"), ("tensor", "quantize"),
        ("channel", "quantize,quantize_h"), ("tensor", "quantize,quantize_h"),
    ],
    ids=[
        "bf16", "fp8 channel", "fp8 tensor", "fp8 block", "fp8 channel, x quantized", "fp8 tensor, x quantized",
        "fp8 channel, x and h quantized", "fp8 tensor, x and h quantized",
    ],
)  # fmt: skip
def test_the_decode_plan_launches_on_its_scratch_alone(recorded, monkeypatch, granularity, quantize):
    if quantize:
        monkeypatch.setenv("FLYDSL_MOE_DECODE", f"direct,combine,{quantize}")
    x, w1, w2, weights, ids, options = _inputs(granularity)
    quant, granularity = options.get("quant"), options.get("granularity")
    w1_scale, w2_scale = options.get("w1_scale"), options.get("w2_scale")
    plan = experts._fused_plan(
        x, w1, w2, weights, ids, "silu", quant=quant, granularity=granularity, w1_scale=w1_scale, w2_scale=w2_scale,
        out=None,
    )  # fmt: skip
    args = (x, w1, w2, weights, ids, None, w1_scale, w2_scale)
    memory = plan.scratch(*args)
    out, positions, sorted_ids, expert_of_block, padded_count, h, y = memory[:7]
    assert out.shape == (TOKENS, HIDDEN) and out.dtype == x.dtype and positions.shape == (TOKENS * TOP_K,)
    plan.launch(*args, *memory)
    names = [call.kernel.name for call in recorded]
    kernels = {name: call.values for name, call in zip(names, recorded, strict=True)}
    align = kernels[names[0]]
    assert names[0].startswith("align") and _same(align[1], sorted_ids) and _same(align[2], expert_of_block)
    assert _same(align[3], padded_count)
    stages = [call for call in recorded if "skinny_gemm_grouped" in call.kernel.name]
    stage1, stage2 = (call.values for call in stages)
    # "quantize": per-row fp8 scales from two tokens on have x quantized per token into the scratch, stage 1 on fp8
    # MMAs (W8A8); block scales weight-only; stage 2 weight-only either way
    quantized = bool(quantize) and granularity in ("channel", "tensor")
    quantized_h = quantized and "quantize_h" in quantize
    plain, scaled = (
        "skinny_gemm_grouped_fp8_kernel" if quant else "skinny_gemm_grouped_kernel"
    ), "skinny_gemm_grouped_scaled_kernel"
    assert [call.kernel.name for call in stages] == [scaled if quantized else plain, scaled if quantized_h else plain]
    combine = kernels["combine_kernel"]
    assert _same(stage1[2], h) and _same(stage2[2], y)
    assert _same(combine[0], y) and _same(combine[1], positions) and combine[4] is out
    assert names[-1] == "combine_kernel" and len(names) == 4 + quantized + quantized_h
    if quantized_h:  # h quantized per row between the stages, into the scratch
        h8, h_scales = memory[9:11]
        assert h8.shape == h.shape and h8.dtype == torch.float8_e4m3fn and h_scales.shape == (h.shape[0], 1)
        quantize_h = recorded[names.index(scaled) + 1].values
        assert quantize_h[0] is h or _same(quantize_h[0], h)
        assert quantize_h[1].data_ptr() == h8.data_ptr() and _same(stage2[0].view(torch.uint8), h8.view(torch.uint8))
        assert stage2[8].data_ptr() == h_scales.data_ptr()
    else:
        assert _same(stage2[0], h)
    if quantized:
        x8, x_scales = memory[7:9]
        assert x8.shape == (TOKENS, HIDDEN) and x8.dtype == torch.float8_e4m3fn and x_scales.shape == (TOKENS, 1)
        quantize = recorded[1].values
        assert "quantize" in names[1] and quantize[0] is x and quantize[1].data_ptr() == x8.data_ptr()
        assert _same(stage1[0], x8) and stage1[8].data_ptr() == x_scales.data_ptr() and stage1[8].shape == (TOKENS,)
    else:
        assert stage1[0] is x
    held = 7 + 2 * quantized + 2 * quantized_h  # (the output, positions, alignment, h, y, x8 and h8 with scales)
    if granularity == "channel":  # the weights' scales viewed per row at launch
        assert len(memory) == held and stage1[7].data_ptr() == w1_scale.data_ptr()
        assert stage1[7].shape == (EXPERTS * 2 * INTER,) and stage2[7].shape == (EXPERTS * HIDDEN,)
    elif granularity == "tensor":  # repeated per row in the scratch (a copy per call)
        rows1, rows2 = memory[held:]
        assert rows1.shape == (EXPERTS * 2 * INTER,) and rows2.shape == (EXPERTS * HIDDEN,)
        assert stage1[7] is rows1 and stage2[7] is rows2
    elif granularity == "block":  # the stacked weights' blocks, viewed at launch
        assert len(memory) == 7 and stage1[7].shape == (EXPERTS * 2 * INTER // 128, HIDDEN // 128)
        assert stage2[7].shape == (EXPERTS * HIDDEN // 128, INTER // 128)
    # how a replay makes the scratch itself (no Python per call): the output and positions fresh, the buffers kept
    # per stream; per-tensor scales are repeated per row by a torch op, so that plan keeps its Python scratch
    if granularity == "tensor":
        assert plan.made is None
    else:
        assert len(plan.made) == len(memory) and all(m[3].startswith("fused_moe.") for m in plan.made[2:])
        assert len({m[3] for m in plan.made[2:]}) == len(plan.made) - 2  # one name per buffer
        for (like, shape, dtype, *_), t in zip(plan.made, memory, strict=True):
            assert like == 0 and tuple(t.shape) == shape and t.dtype == (dtype or x.dtype)
    # what a replay needs: every tensor a launch reads or writes lies in an argument or in the scratch
    owners = [t for t in (*args, *memory) if isinstance(t, torch.Tensor)]
    for call in recorded:
        for value in call.values:
            if isinstance(value, torch.Tensor):
                assert any(_inside(value, owner) for owner in owners), (call.kernel.name, value.shape)


def test_a_given_output_is_an_argument_not_scratch(recorded):
    """With ``out`` given (a signature of its own) the scratch starts at the positions, and the combine writes the
    given tensor."""
    x, w1, w2, weights, ids, _ = _inputs(None)
    out = torch.empty(TOKENS, HIDDEN, dtype=x.dtype)
    plan = experts._fused_plan(x, w1, w2, weights, ids, "silu", quant=None, granularity=None, w1_scale=None,
                               w2_scale=None, out=out)  # fmt: skip
    args = (x, w1, w2, weights, ids, out, None, None)
    memory = plan.scratch(*args)
    assert memory[0].shape == (TOKENS * TOP_K,) and plan.made[0] == (0, (TOKENS * TOP_K,), torch.int32)
    assert len(plan.made) == len(memory) and not any(t is out for t in memory)
    plan.launch(*args, *memory)
    assert recorded[-1].kernel.name == "combine_kernel" and recorded[-1].values[4] is out


def _inside(t, owner) -> bool:
    start, end = owner.data_ptr(), owner.data_ptr() + owner.untyped_storage().nbytes()
    return start <= t.data_ptr() < end or t.data_ptr() == start


def _one_token(granularity, memory_check=None):
    """One token's plan under the FLYDSL_MOE_DECODE set by the test: (its arguments, its scratch, w2), its scratch
    checked by ``memory_check`` before the launches run."""
    x, w1, w2, weights, ids, options = _inputs(granularity)
    x, weights, ids = x[:1], weights[:1], ids[:1]
    scales = dict(w1_scale=options.get("w1_scale"), w2_scale=options.get("w2_scale"))
    plan = experts._fused_plan(
        x, w1, w2, weights, ids, "silu", quant=options.get("quant"), granularity=granularity, out=None, **scales
    )
    args = (x, w1, w2, weights, ids, None, scales["w1_scale"], scales["w2_scale"])
    memory = plan.scratch(*args)
    if memory_check is not None:
        memory_check(memory)
    plan.launch(*args, *memory)
    return args, memory, w2


@pytest.mark.parametrize("granularity", [None, "channel", "block"], ids=["bf16", "fp8 channel", "fp8 block"])
def test_one_token_in_the_direct_mode_takes_no_alignment(recorded, monkeypatch, granularity):
    monkeypatch.setenv("FLYDSL_MOE_DECODE", "direct")

    def blocks_of_16_rows(memory):  # a block of 16 rows per routed pair
        assert memory[2].shape == (TOP_K * 16, INTER) and memory[3].shape == (TOP_K * 16, HIDDEN)

    (x, w1, w2, weights, ids, *_), memory, w2 = _one_token(granularity, blocks_of_16_rows)
    positions = memory[1]
    names = [call.kernel.name for call in recorded]
    assert len(names) == 3 and "skinny_gemm_grouped" in names[0] and names[-1] == "combine_kernel"
    stage1, stage2 = recorded[0].values, recorded[1].values
    flat = ids.reshape(-1)
    for stage in (stage1, stage2):  # the flat ids stand for the order, the blocks' experts and the count
        assert all(_same(stage[i], flat) for i in (3, 4, 5)) and _same(stage[6], positions)
        assert stage[-1].direct


def test_decode_modes_follow_the_call_and_the_environment(monkeypatch):
    from flydsl.kernels.gemm.skinny_grouped import GroupedMode as Mode

    direct = Mode(direct=True)
    modes = lambda tokens, enabled=None, top_k=8, inter=768: decode.decode_modes(  # noqa: E731
        tokens, top_k, inter, enabled
    )
    monkeypatch.delenv("FLYDSL_MOE_DECODE", raising=False)
    D = decode.DecodeModes  # noqa: N806
    assert modes(1) == D(direct, direct, True)  # one token: direct and combined by default, nothing quantized
    assert modes(1, inter=decode.COMBINE_MAX_INTER + 256) == D(direct, direct, False)  # Mixtral's I: not combined
    assert modes(1, top_k=32) == D(direct, direct, False)  # top_k past 16
    assert modes(2) == D()  # two tokens take the alignment; quantize is opt-in
    assert modes(2, enabled={"quantize"}) == D(quantized=True)  # x quantized (for per-row fp8)
    assert modes(2, enabled={"quantize_h"}) == D()  # h only with x
    assert modes(2, enabled={"quantize", "quantize_h"}) == D(quantized=True, quantized_h=True)
    assert modes(1, enabled={"combine"}) == D()  # combine needs direct
    by_value = {
        "none": (D(), D()),
        "": (D(), D()),
        "direct": (D(direct, direct), D()),
        "direct,combine": (D(direct, direct, True), D()),
        "quantize": (D(), D(quantized=True)),
        "direct,combine,quantize,quantize_h": (D(direct, direct, True), D(quantized=True, quantized_h=True)),
        "direct,combine,single": (D(direct, direct, True, single=True), D()),
        "direct,single": (D(direct, direct), D()),  # single needs combine
    }
    for value, (one, two) in by_value.items():
        monkeypatch.setenv("FLYDSL_MOE_DECODE", value)
        assert modes(1) == one and modes(2) == two, value
    monkeypatch.setenv("FLYDSL_MOE_DECODE", "direct,prefetch")
    with pytest.raises(ValueError, match="FLYDSL_MOE_DECODE: expected words from"):
        modes(1)


@pytest.mark.parametrize("granularity", [None, "channel", "block"], ids=["bf16", "fp8 channel", "fp8 block"])
def test_one_token_combined_writes_the_output_in_two_launches(recorded, monkeypatch, granularity):
    monkeypatch.setenv("FLYDSL_MOE_DECODE", "direct,combine")

    def no_y(memory):  # stage 2 writes the output
        assert memory[3].numel() == 0

    (x, w1, w2, weights, ids, *_), memory, w2 = _one_token(granularity, no_y)
    out, positions, h, y = memory[:4]
    names = [call.kernel.name for call in recorded]
    assert names[1:] == ["skinny_gemm_combined_kernel"] and "skinny_gemm_grouped" in names[0]
    combined = recorded[1].values
    assert _same(combined[0], h) and combined[2] is out and combined[3] is ids and combined[4] is weights
    assert combined[1].shape == (EXPERTS * HIDDEN, INTER) and combined[1].data_ptr() == w2.data_ptr()
    if granularity == "block":
        assert combined[5].shape == (EXPERTS * HIDDEN // 128, INTER // 128)
    elif granularity == "channel":
        assert combined[5].shape == (EXPERTS * HIDDEN,)
    assert combined[-1] == TOP_K and combined[-2].warps == 2  # a warp per routed pair


@pytest.mark.parametrize("granularity", [None, "channel", "block"], ids=["bf16", "fp8 channel", "fp8 block"])
def test_one_token_single_writes_the_output_in_one_launch(recorded, monkeypatch, granularity):
    """FLYDSL_MOE_DECODE's single: stage 1, stage 2 and the combine in one launch, a 1-D grid of the direct stage 1's
    tiles and then the combined kernel's, CTAs of one size; its two counters held in the scratch."""
    monkeypatch.setenv("FLYDSL_MOE_DECODE", "direct,combine,single")
    configs = []  # each launch's grid and block, beside the recorded calls
    launch = lambda call, **config: (recorded.append(call), configs.append(config))  # noqa: E731
    monkeypatch.setattr(importlib.import_module("flydsl.compiler.kernel").KernelCall, "launch", launch)

    def counters_held(memory):
        assert memory[3].numel() == 0 and memory[-1].shape == (2,) and memory[-1].dtype == torch.int32

    (x, w1, w2, weights, ids, *_), memory, w2 = _one_token(granularity, counters_held)
    out, positions, h = memory[:3]
    assert [call.kernel.name for call in recorded] == ["skinny_gemm_one_launch_kernel"]
    call = recorded[0]
    values = call.values
    assert values[0] is x and _same(values[2], h) and values[4] is out and values[6] is ids and values[7] is weights
    assert _same(values[5], ids.reshape(-1)) and _same(values[8], positions) and _same(values[11], memory[-1])
    cfg1, cfg2, top_k = values[12:15]
    assert cfg1.threads == cfg2.threads and top_k == TOP_K
    tiles = -(-INTER // (cfg1.rows // 2)) * TOP_K + -(-HIDDEN // cfg2.rows)
    assert configs == [dict(grid=(tiles,), block=cfg1.threads)]


def test_the_decode_scratch_is_kept_per_stream(recorded):
    """The alignment, h and y are the same tensors call after call on a stream (a call reads only what it wrote);
    the output and the positions are new each call."""
    x, w1, w2, weights, ids, _ = _inputs(None)
    plan = experts._fused_plan(
        x, w1, w2, weights, ids, "silu", quant=None, granularity=None, out=None, w1_scale=None, w2_scale=None
    )
    args = (x, w1, w2, weights, ids, None, None, None)
    first, second = plan.scratch(*args), plan.scratch(*args)
    assert all(a is b for a, b in zip(first[2:], second[2:], strict=True))
    assert first[0] is not second[0] and first[1] is not second[1]
