"""fused_moe's decode-sized plan without a GPU: CPU tensors taken as if on device 0, launches recorded instead of run.
The plan's scratch function makes every buffer the steps use (so that a replay's launches touch nothing else), and
the launches bind them in order: align into the alignment buffers, stage 1 from x (or its fp8 copy) into h, stage 2
from h (or its fp8 copy) into y, the combine from y into the output. The GPU side (results, replays) is
tests/kernels/test_plans_gpu.py and test_moe_experts_gpu.py."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from flydsl.kernels import validation  # noqa: E402
from flydsl.kernels.moe import experts  # noqa: E402

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
    else:
        scales = dict(w1_scale=torch.rand(EXPERTS), w2_scale=torch.rand(EXPERTS))
    w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    return x, w1, w2, weights, ids, dict(quant="fp8", granularity=granularity, **scales)


def _same(a, b) -> bool:
    """The same memory seen the same way (views made at launch are other objects)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


@pytest.mark.parametrize("granularity", [None, "channel", "tensor"], ids=["bf16", "fp8 channel", "fp8 tensor"])
def test_the_decode_plan_launches_on_its_scratch_alone(recorded, granularity):
    fp8 = granularity is not None
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
    stage1, stage2 = (call.values for call in recorded if "skinny_gemm_grouped" in call.kernel.name)
    combine = kernels["combine_kernel"]
    assert _same(stage1[2], h) and _same(stage2[0], h if not fp8 else memory[9]) and _same(stage2[2], y)
    assert _same(combine[0], y) and _same(combine[1], positions) and combine[4] is out
    if fp8:  # x and h quantized into the scratch's fp8 buffers, each stage scaled by its rows' and weights' scales
        x8, x_scales, h8, h_scales, rows1, rows2 = memory[7:]
        quantizes = [call.values for call in recorded if call.kernel.name.startswith("quantize")]
        assert [q[0] for q in quantizes] == [x, h] and _same(stage1[0], x8) and _same(stage2[0], h8)
        assert _same(quantizes[0][3], x_scales) and _same(quantizes[1][3], h_scales)
        if granularity == "channel":  # the weights' scales viewed per row at launch
            assert rows1 is None and rows2 is None and stage1[-4].data_ptr() == w1_scale.data_ptr()
        else:  # per tensor: repeated per row in the scratch (a copy per call)
            assert rows1.shape == (EXPERTS * 2 * INTER,) and rows2.shape == (EXPERTS * HIDDEN,)
            assert stage1[-4] is rows1 and stage2[-4] is rows2
    assert names[-1] == "combine_kernel" and len(names) == (6 if fp8 else 4)
    # what a replay needs: every tensor a launch reads or writes lies in an argument or in the scratch
    owners = [t for t in (*args, *memory) if isinstance(t, torch.Tensor)]
    for call in recorded:
        for value in call.values:
            if isinstance(value, torch.Tensor):
                assert any(_inside(value, owner) for owner in owners), (call.kernel.name, value.shape)


def _inside(t, owner) -> bool:
    start, end = owner.data_ptr(), owner.data_ptr() + owner.untyped_storage().nbytes()
    return start <= t.data_ptr() < end or t.data_ptr() == start
