"""MoE routing without a GPU: the top-k kernel and the three-plus-one counting-sort kernels of align_tokens compiled
for sm_90a (the butterflies and shuffles each configuration needs, 16-byte row loads, 64-bit row offsets, no
atomics in the sort, assembled without spills), the lane layouts and launch plans, the argument checks (described
tensors: flyc.TensorSpec; CPU tensors are refused as such), and the float32 torch references that
test_moe_routing_gpu.py compares the kernels with, checked against torch.topk and a Python loop."""

from __future__ import annotations

import math
import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.moe import align, align_capacity, align_tokens, topk_route
from flydsl.kernels.moe.api import check_align_shapes, check_align_tokens, check_route_shapes, check_topk_route
from flydsl.kernels.moe.topk import RouteConfig, route_config, route_layout, topk_route_kernel

from .ptxas_report import spill_bytes

WHO_TOPK = r"flydsl\.kernels\.moe\.topk_route: "
WHO_ALIGN = r"flydsl\.kernels\.moe\.align_tokens: "
DEEPSEEK_V3 = dict(scoring="sigmoid", bias=True, num_groups=8, top_groups=4)

_ADDRESSES = iter(range(1 << 32, 1 << 60, 1 << 40))  # described tensors far apart


def spec(shape, dtype, strides=None):
    """A described tensor (no memory, device 0) at an address of its own."""
    t = flyc.TensorSpec(shape, dtype, strides)
    t.pointer = next(_ADDRESSES)
    return t


def _assembles(module) -> None:
    if flyc.toolchain.find_ptxas() is not None:
        assert module.cubin is not None
        assert spill_bytes(module.ptx) == 0


# --- the top-k kernel -----------------------------------------------------------------------------------------------


def lower_topk(cfg: RouteConfig, *, tokens=1000, dtype="f32", row_stride=None):
    logits = spec((tokens, cfg.experts), dtype, None if row_stride is None else (row_stride, 1))
    k = cfg.top_k
    return topk_route_kernel.lower(
        logits, spec((cfg.experts,), "f32"), spec((tokens, k), "f32"), spec((tokens, k), "i32"), cfg
    )


def _butterflies(cfg: RouteConfig) -> int:
    """The shfl.bfly a configuration needs: softmax's max and sum over the team, the group's top two (two keys a
    step), and per round the (key, expert[, score]) pair over the team."""
    steps = int(math.log2(cfg.lanes))
    count = 2 * steps if cfg.scoring == "softmax" else 0
    if cfg.num_groups > 1:
        count += 2 * int(math.log2(cfg.lanes_per_group))
    return count + cfg.top_k * steps * (3 if cfg.bias else 2)


@pytest.mark.parametrize(
    "experts,top_k,dtype,options,load",
    [
        (8, 2, "f32", {}, "ld.global.v4.b32"),  # one lane per token: no shuffles at all
        (60, 4, "f32", {}, "ld.global.v4.b32"),  # 16 lanes of 4
        (60, 4, "bf16", {}, "ld.global.b16"),  # rows of 120 bytes: 8-byte loads not provably aligned
        (61, 3, "f16", {}, "ld.global.b16"),  # ragged: 8 lanes of 8, the last one's elements predicated
        (128, 8, "f32", dict(scoring="sigmoid"), "ld.global.v4.b32"),
        (256, 8, "bf16", {}, "ld.global.v4.b32"),
        (256, 8, "f32", DEEPSEEK_V3, "ld.global.v4.b32"),
        (256, 8, "bf16", DEEPSEEK_V3, "ld.global.v4.b32"),
        (160, 6, "bf16", dict(num_groups=8, top_groups=3), "ld.global.b16"),  # DeepSeek-V2: 8 groups of 20, 5 a lane
        (96, 5, "f32", dict(scoring="sigmoid", num_groups=3, top_groups=2, renormalize=False), "ld.global.v4.b32"),
        (384, 8, "bf16", dict(scoring="sigmoid", bias=True), "ld.global.v2.b32"),  # Kimi K2: 12 a lane, 24 bytes
        (512, 16, "f32", dict(bias=True), "ld.global.v4.b32"),
        (1, 1, "f32", {}, "ld.global.b32"),
    ],
)
def test_topk_route_kernel_assembles(experts, top_k, dtype, options, load):
    options = dict(options)
    bias = spec((experts,), "f32") if options.pop("bias", False) else None
    cfg, tokens = check_topk_route(spec((1000, experts), dtype), top_k, bias=bias, **options)
    assert tokens == 1000 and cfg.bias == (bias is not None)
    module = lower_topk(cfg, dtype=dtype)
    ptx = module.ptx
    assert load in ptx
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", ptx)) == _butterflies(cfg)
    assert len(re.findall(r"shfl\.sync\.idx\.b32", ptx)) == (cfg.num_groups if cfg.num_groups > 1 else 0)
    assert not re.search(r"\s(atom|red)\.", ptx)
    _assembles(module)


@pytest.mark.parametrize("top_k,store", [(8, "st.global.v4.b32"), (4, "st.global.v4.b32"), (3, "st.global.b32")])
def test_topk_route_stores_each_row_in_one_go(top_k, store):
    """The team's first lane stores the k weights and ids of its token (16-byte stores where rows of k are 16-byte
    multiples)."""
    ptx = lower_topk(route_config(256, top_k)).ptx
    assert store in ptx


def test_topk_route_row_offsets_are_64_bit():
    """2^23 tokens of 512 experts (2^32 elements, a strided view): the row index meets the row stride in 64 bits."""
    cfg = route_config(512, 8, scoring="sigmoid", bias=True)
    module = lower_topk(cfg, tokens=1 << 23, row_stride=1024)
    assert re.search(r"mul\.(lo\.s64|wide\.s32)", module.ptx)
    _assembles(module)


@pytest.mark.parametrize(
    "experts,groups,layout",
    [
        (1, 1, (1, 1)),
        (8, 1, (1, 8)),  # a token per lane
        (60, 1, (16, 4)),  # 16 lanes of 4 rather than 8 of 8 (whole vectors: 60 % 4 == 0)
        (61, 1, (8, 8)),  # no split of 61: the last lane ragged
        (128, 1, (16, 8)),
        (256, 1, (32, 8)),
        (384, 1, (32, 12)),
        (512, 1, (32, 16)),
        (256, 8, (32, 8)),  # DeepSeek-V3: 4 lanes a group
        (160, 8, (32, 5)),  # DeepSeek-V2
        (64, 4, (8, 8)),
        (96, 3, (16, 8)),  # 12 lanes used
        (72, 8, (8, 9)),  # groups of 9: one lane each
        (64, 32, (32, 2)),
        (66, 33, None),  # more groups than lanes
    ],
)
def test_route_layout(experts, groups, layout):
    assert route_layout(experts, groups) == layout
    if layout is not None:
        lanes, per_lane = layout
        assert lanes * per_lane >= experts and per_lane <= 16 and lanes & (lanes - 1) == 0


def test_route_config_is_checked():
    with pytest.raises(ValueError, match="experts must be 1..512 and top_k"):
        RouteConfig(experts=8, top_k=9, lanes=1, per_lane=8)
    with pytest.raises(ValueError, match="lanes must be a power of two up to 32 covering the experts"):
        RouteConfig(experts=256, top_k=8, lanes=16, per_lane=8)
    with pytest.raises(ValueError, match="groups must be whole lanes"):
        RouteConfig(experts=256, top_k=8, num_groups=8, top_groups=4, lanes=32, per_lane=12)
    with pytest.raises(ValueError, match="top_groups must be 1..num_groups"):
        RouteConfig(experts=256, top_k=8, num_groups=8, top_groups=9, lanes=32, per_lane=8)
    with pytest.raises(ValueError, match="top_groups without groups"):
        RouteConfig(experts=256, top_k=8, top_groups=2, lanes=32, per_lane=8)
    with pytest.raises(ValueError, match="scoring must be softmax or sigmoid"):
        RouteConfig(experts=8, top_k=2, scoring="relu", lanes=1, per_lane=8)
    assert route_config(256, 8, **DEEPSEEK_V3).lanes_per_group == 4


# --- the sort's kernels ---------------------------------------------------------------------------------------------


def lower_align(cfg: align.AlignConfig, ids: int, id_dtype="i32"):
    """The four kernels compiled for ``ids`` flattened ids as align_tokens passes them."""
    capacity = align_capacity(ids, cfg.experts, cfg.block_m)
    per_warp, chunks = align.align_plan(cfg, ids)
    flat, counts = spec((ids,), id_dtype), spec((chunks * cfg.experts,), "i32")
    starts, padded = spec((cfg.experts + 1,), "i32"), spec((1,), "i32")
    sorted_ids, blocks = spec((capacity,), "i32"), spec((capacity // cfg.block_m,), "i32")
    return {
        "count": align.count_kernel.lower(flat, counts, per_warp, cfg),
        "scan": align.scan_kernel.lower(counts, starts, sorted_ids, padded, ids, cfg),
        "scatter": align.scatter_kernel.lower(flat, counts, starts, sorted_ids, blocks, per_warp, cfg),
        "small": align.align_small_kernel.lower(flat, sorted_ids, blocks, padded, per_warp, cfg),
    }


@pytest.mark.parametrize(
    "experts,block_m,id_dtype", [(8, 16, "i32"), (60, 1, "i32"), (256, 64, "i64"), (512, 128, "i32"), (1, 7, "i64")]
)
def test_align_kernels_assemble_without_atomics(experts, block_m, id_dtype):
    """Each warp ranks its step's ids with match.any.sync and popc (a bar.warp.sync between steps); the counts
    live in shared memory, one row per warp; nothing is atomic (the order is the same on every run)."""
    cfg = align.AlignConfig(experts=experts, block_m=block_m)
    modules = lower_align(cfg, 2_000_000, id_dtype)
    for name, module in modules.items():
        ptx = module.ptx
        assert not re.search(r"\s(atom|red)\.", ptx), name
        walks = {"count": 1, "scatter": 2, "small": 2}.get(name, 0)
        assert len(re.findall(r"match\.any\.sync\.b32", ptx)) == walks * cfg.unroll, name
        if walks:
            assert "bar.warp.sync" in ptx and "popc.b32" in ptx
            load = "ld.global.b64" if id_dtype == "i64" else "ld.global.b32"
            assert load in ptx, name
        _assembles(module)
    hist = cfg.warps * experts * 4
    assert modules["count"].shared_bytes["count_kernel"] == hist
    assert modules["small"].shared_bytes["align_small_kernel"] >= hist + (experts + 1) * 4


def test_align_config_is_checked():
    with pytest.raises(ValueError, match="experts must be 1..512 and block_m 1..1024"):
        align.AlignConfig(experts=513, block_m=16)
    with pytest.raises(ValueError, match="threads must be a multiple of 32 from E to 1024"):
        align.AlignConfig(experts=256, block_m=16, threads=128)


@pytest.mark.parametrize("experts", [1, 8, 60, 256, 512])
@pytest.mark.parametrize("ids", [0, 1, 7, 4095, 8192, 8193, 100_000, 2_400_000, 50_000_000])
def test_align_plan_covers_every_id_once(experts, ids):
    """The warps' ranges ``[chunk * warps * per_warp + warp * per_warp, + per_warp)`` over the chunks cover ``[0,
    ids)`` (a multiple of the walk's step each, no chunk empty); one chunk up to SMALL_IDS; the scan totals at most
    64 chunks per thread."""
    cfg = align.AlignConfig(experts=experts, block_m=16)
    per_warp, chunks = align.align_plan(cfg, ids)
    assert per_warp % cfg.step == 0 and per_warp > 0
    assert chunks * cfg.warps * per_warp >= ids > (chunks - 1) * cfg.warps * per_warp or (ids == 0 and chunks == 1)
    assert (chunks == 1) == (ids <= align.SMALL_IDS)
    assert chunks <= 64 * cfg.slices
    assert cfg.slices * cfg.padded_experts <= align.SCAN_THREADS


# --- argument checks ------------------------------------------------------------------------------------------------


def _route_arguments(**change):
    args = dict(router_logits=spec((5, 256), "bf16"), top_k=8)
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change,error,message",
    [
        (
            dict(router_logits=((5, 256), "i32")),
            TypeError,
            "router_logits: expected dtype float32, float16 or bfloat16",
        ),
        (dict(router_logits=((5, 4, 64), "f32")), ValueError, r"router_logits: expected a 2-D tensor \(rows, N\)"),
        (dict(router_logits=((5, 256), "f32", (1, 5))), ValueError, "router_logits: expected unit stride"),
        (dict(router_logits=((5, 513), "f32")), ValueError, r"router_logits: expected 1 to 512 experts"),
        (dict(router_logits=((5, 0), "f32")), ValueError, r"router_logits: expected 1 to 512 experts"),
        (dict(top_k=0), ValueError, "top_k: expected an int from 1 to 16, got 0"),
        (dict(top_k=17), ValueError, "top_k: expected an int from 1 to 16, got 17"),
        (dict(top_k=2.0), ValueError, "top_k: expected an int from 1 to 16, got 2.0"),
        (dict(top_k=True), ValueError, "top_k: expected an int from 1 to 16, got True"),
        (dict(router_logits=((5, 8), "f32"), top_k=9), ValueError, r"top_k: expected at most E = 8"),
        (dict(scoring="relu"), ValueError, r"scoring: expected one of \('softmax', 'sigmoid'\), got 'relu'"),
        (dict(renormalize=1), TypeError, "renormalize: expected a bool, got 1"),
        (dict(bias=((128,), "f32")), ValueError, r"bias: expected shape \(256,\)"),
        (dict(bias=((256,), "bf16")), TypeError, "bias: expected dtype float32, got bfloat16"),
        (dict(bias=((256,), "f32", (2,))), ValueError, "bias: expected a contiguous vector"),
        (dict(num_groups=7, top_groups=2), ValueError, "num_groups: expected a divisor of E = 256"),
        (dict(num_groups=0, top_groups=2), ValueError, "num_groups: expected an int from 1 to 32, got 0"),
        (dict(num_groups=64, top_groups=2), ValueError, "num_groups: expected an int from 1 to 32, got 64"),
        (dict(num_groups=8), ValueError, r"top_groups: expected the number of groups kept \(1 to 8\), got None"),
        (dict(num_groups=8, top_groups=9), ValueError, "top_groups: expected an int from 1 to 8, got 9"),
        (dict(top_groups=2), ValueError, r"top_groups: expected None \(or 1\) without num_groups, got 2"),
        (
            dict(router_logits=((5, 64), "f32"), num_groups=32, top_groups=1, top_k=3),
            ValueError,
            r"top_k: expected at most top_groups \* E / num_groups = 1 \* 2 experts to choose from, got 3",
        ),
        (
            dict(router_logits=((5, 16), "f32"), num_groups=16, top_groups=4, top_k=2),
            ValueError,
            "num_groups: a group's score is the sum of its two best experts: expected groups of at least 2 experts",
        ),
        (
            dict(router_logits=((5, 198), "f32"), num_groups=6, top_groups=2, top_k=2),
            ValueError,
            "num_groups: 6 groups of 33 experts cannot be laid on a warp's lanes",
        ),
    ],
)
def test_topk_route_arguments_are_refused_naming_them(change, error, message):
    """Refused before anything is launched, by topk_route itself (described tensors: no memory)."""
    args = _route_arguments(**{k: spec(*v) if isinstance(v, tuple) else v for k, v in change.items()})
    with pytest.raises(error, match=WHO_TOPK + message):
        topk_route(**args)


def test_topk_route_checks_give_the_kernel_configuration():
    cfg, tokens = check_topk_route(spec((7, 256), "bf16"), 8, "sigmoid", True, spec((256,), "f32"), 8, 4)
    assert tokens == 7 and cfg == route_config(256, 8, **DEEPSEEK_V3)
    cfg, tokens = check_topk_route(spec((0, 60), "f32"), 2, num_groups=1, top_groups=1)  # one group: ungrouped
    assert tokens == 0 and cfg == route_config(60, 2)


def test_topk_route_refuses_cpu_tensors_and_other_arrays():
    """CPU tensors are refused as such (and keep no launch plan); valid arrays of other frameworks after the checks
    (outputs are torch's)."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.moe import api

    for _ in range(2):
        with pytest.raises(ValueError, match=WHO_TOPK + "router_logits: expected a CUDA tensor, got one on cpu"):
            topk_route(torch.zeros(4, 64), 2)
    assert len(api._TOPK) == 0
    with pytest.raises(TypeError, match=WHO_TOPK + "router_logits: expected a torch tensor, got TensorSpec"):
        topk_route(spec((4, 64), "f32"), 2, bias=spec((64,), "f32"))


@pytest.mark.parametrize(
    "change,error,message",
    [
        (dict(topk_ids=((5, 8), "f32")), TypeError, "topk_ids: expected int32 or int64, got float32"),
        (dict(topk_ids=((40,), "i32")), ValueError, r"topk_ids: expected a 2-D tensor \(T, k\), got shape \(40,\)"),
        (dict(topk_ids=((5, 8), "i32", (1, 5))), ValueError, r"topk_ids: expected a contiguous \(T, k\) tensor"),
        (dict(topk_ids=((5, 8), "i32", (16, 1))), ValueError, r"topk_ids: expected a contiguous \(T, k\) tensor"),
        (dict(num_experts=0), ValueError, "num_experts: expected an int from 1 to 512, got 0"),
        (dict(num_experts=513), ValueError, "num_experts: expected an int from 1 to 512, got 513"),
        (dict(num_experts=8.0), ValueError, "num_experts: expected an int from 1 to 512, got 8.0"),
        (dict(block_m=0), ValueError, "block_m: expected an int from 1 to 1024, got 0"),
        (dict(block_m=2048), ValueError, "block_m: expected an int from 1 to 1024, got 2048"),
        (
            dict(topk_ids=((1 << 27, 8), "i32")),
            ValueError,
            r"topk_ids: expected at most 2\^30 padded positions .* got 134217728 x 8 ids",
        ),
    ],
)
def test_align_tokens_arguments_are_refused_naming_them(change, error, message):
    args = dict(topk_ids=spec((5, 8), "i32"), num_experts=256, block_m=64)
    args.update({k: spec(*v) if isinstance(v, tuple) else v for k, v in change.items()})
    with pytest.raises(error, match=WHO_ALIGN + message):
        align_tokens(**args)


def test_align_tokens_checks_give_the_sizes():
    cfg, ids, capacity = check_align_tokens(spec((5, 8), "i64"), 256, 64)
    assert (cfg.experts, cfg.block_m, ids) == (256, 64, 40)
    assert capacity == align_capacity(40, 256, 64) == -(-(40 + 256 * 63) // 64) * 64
    assert check_align_tokens(spec((0, 8), "i32"), 4, 1)[1:] == (0, 0)
    assert align_capacity(10, 3, 4) == 20  # 10 + 3 * 3 = 19, rounded up to 4


def test_align_tokens_refuses_cpu_tensors_and_other_arrays():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.moe import api

    for _ in range(2):
        with pytest.raises(ValueError, match=WHO_ALIGN + "topk_ids: expected a CUDA tensor, got one on cpu"):
            align_tokens(torch.zeros(4, 2, dtype=torch.int32), 8, 16)
    assert len(api._ALIGN) == 0
    with pytest.raises(TypeError, match=WHO_ALIGN + "topk_ids: expected a torch tensor, got TensorSpec"):
        align_tokens(spec((4, 2), "i64"), 8, 16)


@pytest.mark.parametrize(
    "outputs,error,message",
    [
        (
            dict(topk_weights=((5, 3), "f32")),
            ValueError,
            r"topk_weights: expected a float32 tensor of shape \(5, 2\), got float32 \(5, 3\)",
        ),
        (
            dict(topk_ids=((5, 2), "f32")),
            ValueError,
            r"topk_ids: expected a int32 tensor of shape \(5, 2\), got float32",
        ),
        (
            dict(topk_weights=((5, 2), "f32", (4, 1))),
            ValueError,
            r"topk_weights: expected a contiguous tensor, got strides \(4, 1\)",
        ),
        (dict(topk_ids=((5, 2), "i32")), TypeError, "topk_ids: expected a torch tensor, got TensorSpec"),
    ],
)
def test_topk_route_checks_the_outputs_given(outputs, error, message):
    """Outputs given by keyword: of the output's shape and dtype, contiguous, torch tensors (the plans fill them)."""
    given = {name: spec(*value) for name, value in outputs.items()}
    with pytest.raises(error, match=WHO_TOPK + message):
        check_topk_route(spec((5, 64), "bf16"), 2, **given)


@pytest.mark.parametrize(
    "outputs,message",
    [
        (
            dict(sorted_ids=((100,), "i32")),
            r"sorted_ids: expected a int32 tensor of shape \(320,\), got int32 \(100,\)",
        ),
        (
            dict(expert_of_block=((3,), "i32")),
            r"expert_of_block: expected a int32 tensor of shape \(5,\), got int32 \(3,\)",
        ),
        (dict(padded_count=((1,), "f32")), r"padded_count: expected a int32 tensor of shape \(1,\), got float32"),
        (dict(sorted_ids=((320,), "i32", (2,))), r"sorted_ids: expected a contiguous tensor, got strides \(2,\)"),
    ],
)
def test_align_tokens_checks_the_outputs_given(outputs, message):
    assert align_capacity(40, 4, 64) == 320  # 5 blocks
    given = {name: spec(*value) for name, value in outputs.items()}
    with pytest.raises(ValueError, match=WHO_ALIGN + message):
        check_align_tokens(spec((5, 8), "i32"), 4, 64, **given)


def test_shape_checks_read_shapes_and_dtypes_alone():
    """check_route_shapes and check_align_shapes (torch.ops.flydsl's fake implementations run them) take anything
    with a shape and a dtype, our names or torch's, and name the caller."""

    class Meta:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    assert check_route_shapes("op", Meta((7, 256), "bf16"), 8, "sigmoid", True, Meta((256,), "f32"), 8, 4) == (
        7, 256, 8, 4,
    )  # fmt: skip
    assert check_route_shapes("op", Meta((0, 60), "f32"), 2, "softmax", False, None, None, None) == (0, 60, 1, 1)
    with pytest.raises(ValueError, match=r"^op: bias: expected shape \(256,\)"):
        check_route_shapes("op", Meta((7, 256), "bf16"), 8, "softmax", True, Meta((128,), "f32"), None, None)
    with pytest.raises(ValueError, match=r"^op: router_logits: expected a 2-D tensor"):
        check_route_shapes("op", Meta((7,), "bf16"), 1, "softmax", True, None, None, None)
    assert check_align_shapes("op", Meta((5, 8), "int64"), 256, 64) == (40, align_capacity(40, 256, 64))
    assert check_align_shapes("op", Meta((5, 8), "i32"), 256, 64)[0] == 40
    with pytest.raises(TypeError, match="^op: topk_ids: expected int32 or int64, got float32"):
        check_align_shapes("op", Meta((5, 8), "f32"), 256, 64)


# --- the references -------------------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


def _distinct_logits(torch, generator, tokens, experts):
    """Logits whose scores are all distinct and well apart (a random permutation of a grid per row)."""
    grid = torch.arange(experts, dtype=torch.float32) * (6.0 / experts) - 3.0
    return torch.stack([grid[torch.randperm(experts, generator=generator)] for _ in range(tokens)])


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (60, 4), (256, 8)])
def test_topk_route_reference_is_torch_topk_without_ties(scoring, renormalize, experts, top_k):
    torch = _torch()
    from flydsl.kernels.moe.reference import topk_route_reference

    generator = torch.Generator().manual_seed(experts + top_k)
    logits = _distinct_logits(torch, generator, 33, experts)
    bias = torch.randn(experts, generator=generator) * 0.01 if scoring == "sigmoid" else None
    weights, ids = topk_route_reference(logits, top_k, scoring=scoring, renormalize=renormalize, bias=bias)
    scores = torch.softmax(logits, -1) if scoring == "softmax" else torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias
    expected_ids = choice.topk(top_k, dim=-1).indices
    expected = scores.gather(1, expected_ids)
    if renormalize:
        expected = expected / expected.sum(-1, keepdim=True)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights, expected, rtol=0, atol=0)


def _grouped_topk(torch, logits, bias, top_k, num_groups, top_groups):
    """DeepSeek-V3's grouped top-k as vLLM writes it (sigmoid scores, the bias for the choice, groups ranked by the
    sum of their top two, the rest masked), on inputs without ties."""
    scores = torch.sigmoid(logits)
    choice = scores + bias
    tokens = logits.shape[0]
    group_scores = choice.view(tokens, num_groups, -1).topk(2, dim=-1).values.sum(-1)
    group_idx = group_scores.topk(top_groups, dim=-1).indices
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand(tokens, num_groups, logits.shape[1] // num_groups).reshape(tokens, -1)
    ids = choice.masked_fill(mask == 0, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(-1, keepdim=True), ids


@pytest.mark.parametrize("experts,top_k,groups,kept", [(256, 8, 8, 4), (160, 6, 8, 3), (64, 4, 4, 2)])
def test_topk_route_reference_is_deepseeks_grouped_topk(experts, top_k, groups, kept):
    torch = _torch()
    from flydsl.kernels.moe.reference import topk_route_reference

    generator = torch.Generator().manual_seed(experts)
    logits = _distinct_logits(torch, generator, 40, experts)
    bias = torch.randperm(experts, generator=generator).float() * 1e-3  # distinct: no ties anywhere
    weights, ids = topk_route_reference(logits, top_k, scoring="sigmoid", bias=bias, num_groups=groups, top_groups=kept)
    expected, expected_ids = _grouped_topk(torch, logits, bias, top_k, groups, kept)
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights, expected, rtol=0, atol=0)
    for row in (ids.long() // (experts // groups)).tolist():
        assert len(set(row)) <= kept


def test_topk_route_reference_breaks_ties_by_the_lower_expert_and_group():
    torch = _torch()
    from flydsl.kernels.moe.reference import order_keys, topk_route_reference

    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    _, ids = topk_route_reference(logits, 4)
    assert ids.tolist() == [[1, 2, 4, 5], [0, 1, 2, 3]]
    # groups of two: scores 0.5 each (logits 0) but for group 2's, whose sum ties group 0's (bias)
    logits = torch.zeros(1, 6)
    bias = torch.tensor([0.25, 0.25, 0.0, 0.0, 0.5, 0.0])
    _, ids = topk_route_reference(logits, 2, scoring="sigmoid", bias=bias, num_groups=3, top_groups=1)
    assert ids.tolist() == [[0, 1]]  # groups 0 and 2 both sum to 1.5: the lower group
    # NaN ranks above everything, -0 equals +0
    scores = torch.tensor([1.0, float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -1.0])
    keys = order_keys(scores)
    assert keys.argsort(descending=True, stable=True).tolist() == [1, 4, 0, 2, 3, 6, 5]
    assert keys[2] == keys[3]
    _, ids = topk_route_reference(torch.tensor([[0.0, float("nan"), 5.0]]), 2, scoring="sigmoid")
    assert ids.tolist() == [[1, 2]]


def test_order_keys_round_trip():
    torch = _torch()
    from flydsl.kernels.moe.reference import key_values, order_keys

    x = torch.randn(1000) * 100
    x[:10] = torch.tensor([0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, float("inf"), -float("inf"), 1.0, -1.0, 0.5])
    keys = order_keys(x)
    assert torch.equal(key_values(keys), x)
    assert torch.equal(keys.argsort(stable=True), x.argsort(stable=True))


def _align_by_loop(ids, num_experts, block_m):
    """align_tokens by its definition, one id at a time."""
    flat = [int(v) for v in ids.reshape(-1)]
    count = len(flat)
    runs = {e: [i for i, v in enumerate(flat) if v == e] for e in range(num_experts)}
    sorted_ids, blocks = [], []
    for e in range(num_experts):
        run = runs[e]
        if not run:
            continue
        padded = -(-len(run) // block_m) * block_m
        sorted_ids += run + [count] * (padded - len(run))
        blocks += [e] * (padded // block_m)
    total = len(sorted_ids)
    capacity = -(-(count + num_experts * (block_m - 1)) // block_m) * block_m
    sorted_ids += [count] * (capacity - total)
    blocks += [-1] * (capacity // block_m - len(blocks))
    return sorted_ids, blocks, total


@pytest.mark.parametrize(
    "tokens,k,experts,block_m,kind",
    [
        (7, 2, 8, 4, "random"),
        (50, 8, 60, 16, "random"),
        (33, 4, 16, 1, "random"),
        (20, 3, 8, 5, "empty experts"),
        (25, 2, 8, 16, "one expert"),
        (40, 4, 8, 8, "dropped"),
        (0, 8, 8, 16, "random"),
        (1, 1, 1, 3, "random"),
    ],
)
def test_align_tokens_reference_is_the_loop(tokens, k, experts, block_m, kind):
    torch = _torch()
    from flydsl.kernels.moe.reference import align_tokens_reference

    generator = torch.Generator().manual_seed(tokens * 7 + k)
    ids = torch.randint(0, experts, (tokens, k), generator=generator, dtype=torch.int32)
    if kind == "empty experts":
        ids = ids % 3 * 2  # experts 0, 2, 4 only
    elif kind == "one expert":
        ids.fill_(experts - 1)
    elif kind == "dropped":
        ids[ids % 3 == 0] = -1
        ids[0, 0] = experts  # out of range: dropped too
        ids[1, 1] = -(1 << 30)
    sorted_ids, expert_of_block, padded_count = align_tokens_reference(ids, experts, block_m)
    expected_sorted, expected_blocks, total = _align_by_loop(ids, experts, block_m)
    assert sorted_ids.dtype == expert_of_block.dtype == padded_count.dtype == torch.int32
    assert sorted_ids.tolist() == expected_sorted
    assert expert_of_block.tolist() == expected_blocks
    assert padded_count.tolist() == [total]
    assert sorted_ids.numel() == align_capacity(tokens * k, experts, block_m)
    # int64 ids give the same
    again = align_tokens_reference(ids.long(), experts, block_m)
    assert all(torch.equal(a, b) for a, b in zip(again, (sorted_ids, expert_of_block, padded_count), strict=True))
