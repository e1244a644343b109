"""The replay contract of the zoo's plans, checked where it costs nothing at run time: a replayed launch runs no torch
operation that writes memory (a fill, a copy: a replay would skip it) -- only views, and the scratch functions'
allocations happen outside it. The launches of each kind of plan run on CPU tensors taken as if on a GPU, with the
kernel launches recorded, inside a TorchDispatchMode that notes every other torch operation."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from flydsl.kernels import memory, validation  # noqa: E402


class _Writes(TorchDispatchMode):
    """Notes the torch operations that are neither views nor allocations."""

    def __init__(self):
        super().__init__()
        aten = torch.ops.aten
        self.allowed = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default}
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func in self.allowed):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def recorded(monkeypatch):
    kernel_module = importlib.import_module("flydsl.compiler.kernel")
    device = importlib.import_module("flydsl.kernels.device")
    launches = []

    def describe(who, name, t):
        return validation.TensorInfo(t, t.shape, t.stride(), validation.torch_dtype(t.dtype), 0, t.data_ptr())

    monkeypatch.setattr(validation, "describe", describe)
    monkeypatch.setattr(device, "sm_count", lambda index=0: 132)
    monkeypatch.setattr(device, "l2_bytes", lambda index=0: 50 * 2**20)
    monkeypatch.setattr(memory, "stream_key", lambda t: (-1, 0))
    monkeypatch.setattr(kernel_module.KernelCall, "launch", lambda call, **config: launches.append(call))
    return launches


def _launch_writes(plan, args) -> list:
    """The torch operations that write memory during ``plan``'s launches (a ScratchPlan: its scratch made first)."""
    from flydsl.kernels.plans import ScratchPlan

    extra = plan.scratch(*args) if isinstance(plan, ScratchPlan) else ()
    launch = plan.launch if isinstance(plan, ScratchPlan) else plan
    with _Writes() as watch:
        launch(*args, *extra)
    return watch.seen


@pytest.mark.parametrize("granularity", [None, "channel", "tensor"])
def test_fused_moe_decode_launches_write_nothing_but_kernels(recorded, granularity):
    from flydsl.kernels.moe import experts

    tokens, hidden, count, inter = 4, 256, 8, 128
    x = torch.randn(tokens, hidden).bfloat16()
    w1, w2 = torch.randn(count, 2 * inter, hidden), torch.randn(count, hidden, inter)
    ids, weights = torch.tensor([[0, 3], [3, 5], [7, 0], [2, 3]], dtype=torch.int32), torch.rand(tokens, 2)
    scales = {"w1_scale": None, "w2_scale": None}
    if granularity is None:
        w1, w2 = w1.bfloat16(), w2.bfloat16()
    else:
        shapes = ((count, 2 * inter), (count, hidden)) if granularity == "channel" else ((count,), (count,))
        scales = {"w1_scale": torch.rand(shapes[0]), "w2_scale": torch.rand(shapes[1])}
        w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    quant = None if granularity is None else "fp8"
    plan = experts._fused_plan(
        x, w1, w2, weights, ids, "silu", quant=quant, granularity=granularity, out=None, **scales
    )
    assert _launch_writes(plan, (x, w1, w2, weights, ids, None, scales["w1_scale"], scales["w2_scale"])) == []


@pytest.mark.parametrize("modes,launches", [("direct", 3), ("direct,combine", 2)])
@pytest.mark.parametrize("granularity", [None, "block"])
def test_one_token_in_the_decode_modes_launches_writes_nothing_but_kernels(
    recorded, monkeypatch, granularity, modes, launches
):
    """The decode modes (FLYDSL_MOE_DECODE picks them): the flat ids are a view made at launch, not a copy."""
    from flydsl.kernels.moe import experts

    monkeypatch.setenv("FLYDSL_MOE_DECODE", modes)
    hidden, count, inter = 256, 8, 128
    x, ids, weights = torch.randn(1, hidden).bfloat16(), torch.tensor([[6, 1]], dtype=torch.int32), torch.rand(1, 2)
    w1, w2 = torch.randn(count, 2 * inter, hidden), torch.randn(count, hidden, inter)
    scales = {"w1_scale": None, "w2_scale": None}
    if granularity is None:
        w1, w2 = w1.bfloat16(), w2.bfloat16()
    else:
        scales = {"w1_scale": torch.rand(count, 2, 2), "w2_scale": torch.rand(count, 2, 1)}
        w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    quant = None if granularity is None else "fp8"
    plan = experts._fused_plan(
        x, w1, w2, weights, ids, "silu", quant=quant, granularity=granularity, out=None, **scales
    )
    assert _launch_writes(plan, (x, w1, w2, weights, ids, None, scales["w1_scale"], scales["w2_scale"])) == []
    assert len(recorded) == launches  # no alignment; stage 2 and the combine in one launch with "combine"


@pytest.mark.parametrize("granularity", ["token", "group", "tensor"])
def test_quantize_launches_write_nothing_but_kernels(recorded, granularity):
    from flydsl.kernels.quantize import api

    x = torch.randn(16, 512).bfloat16()
    plan = api._plan(x, granularity, 128, None, None, None, False)
    assert _launch_writes(plan, (x, None, None)) == []


def test_gemm_launches_write_nothing_but_kernels(recorded):
    """A GEMM whose A needs a padded copy for TMA and whose K is split: the copy and the workspace come from the
    scratch function; the launch only binds them."""
    from flydsl.kernels.gemm import GemmConfig, MatrixSpec, plan_gemm
    from flydsl.kernels.gemm.launch import _kept

    a, b = torch.randn(300, 77).bfloat16(), torch.randn(520, 77).bfloat16().t()
    out = torch.empty(300, 520).bfloat16()
    for config in (None, GemmConfig(split_k=2)):
        gemm_plan = plan_gemm(*(MatrixSpec.of(t) for t in (a, b, out)), sms=132, config=config)
        assert _launch_writes(_kept(gemm_plan), (a, b, out, None)) == []


def test_gemm_plans_without_memory_are_their_launches_alone(recorded):
    """Where a GEMM call needs no memory beyond its arguments (aligned operands, no split K), its kept plan is the
    launches alone: no scratch function runs in Python on each call, and the plan can be kept on disk."""
    from flydsl.kernels.gemm import GemmConfig, MatrixSpec, plan_gemm
    from flydsl.kernels.gemm.launch import _kept, needs_memory
    from flydsl.kernels.plans import ScratchPlan

    a, b = torch.randn(256, 128).bfloat16(), torch.randn(512, 128).bfloat16().t()
    out = torch.empty(256, 512).bfloat16()
    plain = plan_gemm(*(MatrixSpec.of(t) for t in (a, b, out)), sms=132, config=GemmConfig(split_k=1))
    split = plan_gemm(*(MatrixSpec.of(t) for t in (a, b, out)), sms=132, config=GemmConfig(split_k=2))
    assert not needs_memory(plain) and needs_memory(split)
    kept = _kept(plain)
    assert not isinstance(kept, ScratchPlan) and isinstance(_kept(split), ScratchPlan)
    assert kept(a, b, out, None) is None and len(recorded) == len(plain.launches)
    assert _launch_writes(kept, (a, b, out, None)) == []
    padded = torch.randn(300, 77).bfloat16()  # rows of 154 bytes: A is copied for TMA
    copied = plan_gemm(*(MatrixSpec.of(t) for t in (padded, b[:77], torch.empty(300, 512).bfloat16())), sms=132)
    assert needs_memory(copied) and isinstance(_kept(copied), ScratchPlan)


def test_fp8_and_blockscale_plans_without_memory_are_their_launches_alone(recorded):
    from flydsl.kernels.gemm.launch import _BlockscalePlanned, _FP8Planned
    from flydsl.kernels.gemm.plan import GemmPlan
    from flydsl.kernels.plans import ScratchPlan

    bare = GemmPlan(route="gemm_ws_scaled", config=None, epilogue=None, specs={}, preparations=(), launches=())
    f32, ue8m0 = torch.ones(4, dtype=torch.float32), torch.ones(4, dtype=torch.uint8)
    assert not isinstance(_FP8Planned(bare, False, False).kept(), ScratchPlan)
    assert not isinstance(_BlockscalePlanned(bare).kept(f32, f32), ScratchPlan)
    assert isinstance(_BlockscalePlanned(bare).kept(ue8m0, f32), ScratchPlan)  # widened per call


@pytest.mark.parametrize("rms", [False, True])
def test_the_norms_backward_makes_its_partial_sums_in_the_replay(recorded, monkeypatch, rms):
    """With a weight the backward sums its column partials over the rows' CTAs: the partial sums are the plan's only
    scratch, fresh float32 rows a replay makes itself (``made``: no Python per call), and its launches write nothing
    else; without one there is no scratch at all."""
    from flydsl.kernels.norms import api, backward
    from flydsl.kernels.plans import ScratchPlan
    from flydsl.kernels.rows import launch as rows_launch

    for module in (backward, rows_launch):  # (imported by name there)
        monkeypatch.setattr(module, "sm_count", lambda index=0: 132)

    x, dy, w = torch.randn(64, 512).bfloat16(), torch.randn(64, 512).bfloat16(), torch.randn(512).bfloat16()
    stats = torch.rand(64)
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)

    def info(t):
        return None if t is None else validation.describe("test", "t", t)

    for weight in (w, None):
        gradients = api.NormGradients(
            dy=info(dy), x=info(x), weight=info(weight), mean=None if rms else info(stats), rstd=info(stats),
            dx=info(dx), dweight=info(dw if weight is not None else None),
            dbias=info(db if weight is not None and not rms else None),
        )  # fmt: skip
        plan = backward.backward_plan(gradients, rms=rms)
        args = (dy, x, weight, None if rms else stats, stats, dx, dw if weight is not None else None, None)
        if weight is None:
            assert not isinstance(plan, ScratchPlan)
            continue
        assert isinstance(plan, ScratchPlan) and len(plan.made) == 1
        like, shape, dtype = plan.made[0]
        (partial,) = plan.scratch(*args)
        assert args[like] is x and shape == tuple(partial.shape) and dtype is partial.dtype is torch.float32
        assert _launch_writes(plan, args) == []


def test_a_staged_forward_takes_the_streams_claimed_rows_counter_in_the_replay(recorded, monkeypatch):
    """A staged LayerNorm whose CTAs claim their rows: its only scratch is the stream's held counter pair, which a
    replay takes itself (``made`` with the held name the Python path uses); its launch writes nothing else."""
    from flydsl.kernels import memory
    from flydsl.kernels.norms import api, forward
    from flydsl.kernels.plans import ScratchPlan
    from flydsl.kernels.rows import launch as rows_launch

    monkeypatch.setattr(rows_launch, "max_active_clusters", lambda *args: 132)
    for module in (forward, rows_launch):  # (imported by name there)
        monkeypatch.setattr(module, "sm_count", lambda index=0: 132)
    monkeypatch.setattr(memory, "held", lambda like, name, count, dtype, key=None: torch.zeros(count, dtype=dtype))
    x, w = torch.randn(4, 32768).bfloat16(), torch.randn(32768).bfloat16()
    out = torch.empty_like(x)
    info = lambda t: validation.describe("test", "t", t)  # noqa: E731
    tensors = api.NormTensors(x=info(x), out=info(out), weight=info(w))
    route = forward.forward_route(tensors, rms=False)
    assert route.kernel.name == "STAGED" and route.config.claim_rows and not route.config.row.team
    plan = forward.forward_plan(tensors, rms=False, chosen=route)
    assert isinstance(plan, ScratchPlan) and plan.made == ((0, (2,), torch.int32, memory.CLAIM_COUNTERS),)
    args = (x, out, None, w, None, None, None, None, 1e-5)
    (counter,) = plan.scratch(*args)
    assert counter.shape == (2,) and counter.dtype == torch.int32
    assert _launch_writes(plan, args) == []
