"""torch.ops.flydsl.topk_route, align_tokens and fused_moe without a GPU: schemas, fake and meta implementations
(shapes and dtypes, align_tokens' capacity), refusals naming the argument (the same from meta and fake CUDA tensors),
a MoE layer (route, align, experts) traced by torch.compile(fullgraph=True) into one graph, static and dynamic; and
flydsl.torch.nn.MoE: its parameters, Hugging Face checkpoints of both namings stacked into w1 and w2, errors naming
the key, the flydsl ops on (fake) CUDA tensors and the float32 references elsewhere, against a plain torch Mixtral
block."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.kernels.moe import align_capacity  # noqa: E402

BF16, F16 = torch.bfloat16, torch.float16
E, H, INTER, K = 16, 256, 128, 4  # experts, hidden, intermediate, top k


def _schema(name: str) -> str:
    return str(getattr(torch.ops.flydsl, name).default._schema)


def _layer_args(*, device="cuda", tokens=100, experts=E, hidden=H, inter=INTER, top_k=K, dtype=BF16):
    """fused_moe's arguments (empty tensors on ``device``): x, w1, w2, topk_weights, topk_ids."""
    x = torch.empty(tokens, hidden, dtype=dtype, device=device)
    w1 = torch.empty(experts, 2 * inter, hidden, dtype=dtype, device=device)
    w2 = torch.empty(experts, hidden, inter, dtype=dtype, device=device)
    weights = torch.empty(tokens, top_k, device=device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=device)
    return [x, w1, w2, weights, ids]


# --- registration ----------------------------------------------------------------------------------------------------


def test_schemas():
    assert _schema("topk_route") == (
        'flydsl::topk_route(Tensor router_logits, SymInt top_k, str scoring="softmax", bool renormalize=True,'
        " Tensor? bias=None, SymInt? num_groups=None, SymInt? top_groups=None) -> (Tensor, Tensor)"
    )
    assert _schema("topk_route_out") == (
        "flydsl::topk_route_out(Tensor router_logits, SymInt top_k, str scoring, bool renormalize, Tensor? bias,"
        " SymInt? num_groups, SymInt? top_groups, Tensor(a7!) topk_weights, Tensor(a8!) topk_ids) -> ()"
    )
    assert _schema("align_tokens") == (
        "flydsl::align_tokens(Tensor topk_ids, SymInt num_experts, SymInt block_m) -> (Tensor, Tensor, Tensor)"
    )
    assert _schema("align_tokens_out") == (
        "flydsl::align_tokens_out(Tensor topk_ids, SymInt num_experts, SymInt block_m, Tensor(a3!) sorted_ids,"
        " Tensor(a4!) expert_of_block, Tensor(a5!) padded_count) -> ()"
    )
    assert _schema("fused_moe") == (
        'flydsl::fused_moe(Tensor x, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids, str activation="silu",'
        " str? quant=None, str? granularity=None, Tensor? w1_scale=None, Tensor? w2_scale=None) -> Tensor"
    )
    assert _schema("fused_moe_out") == (
        "flydsl::fused_moe_out(Tensor x, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids, str activation,"
        " str? quant, str? granularity, Tensor? w1_scale, Tensor? w2_scale, Tensor(a10!) out) -> ()"
    )


def test_the_ops_are_registered_functional_and_out():
    ops = ft.registered_ops()
    assert ops["topk_route"].output_names == ("topk_weights", "topk_ids")
    assert ops["align_tokens"].output_names == ("sorted_ids", "expert_of_block", "padded_count")
    assert ops["fused_moe"].output_names == ("out",)
    assert ft.moe.fused_moe is ops["fused_moe"]  # the module's names are the FlyOps


# --- fake and meta implementations -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [0, 1, 100])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_fake_ops_give_the_outputs_shapes_and_dtypes(tokens, dtype):
    with FakeTensorMode():
        logits = torch.empty(tokens, E, dtype=dtype, device="cuda")
        weights, ids = torch.ops.flydsl.topk_route(logits, K)
        assert (weights.shape, weights.dtype, ids.shape, ids.dtype) == (
            (tokens, K),
            torch.float32,
            (tokens, K),
            torch.int32,
        )
        assert weights.device.type == ids.device.type == "cuda"
        sorted_ids, expert_of_block, padded_count = torch.ops.flydsl.align_tokens(ids, E, 64)
        capacity = align_capacity(tokens * K, E, 64)
        assert (sorted_ids.shape, expert_of_block.shape, padded_count.shape) == ((capacity,), (capacity // 64,), (1,))
        assert sorted_ids.dtype == expert_of_block.dtype == padded_count.dtype == torch.int32
        x, w1, w2, _, _ = _layer_args(tokens=tokens, dtype=dtype)
        out = torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids)
        assert (out.shape, out.dtype, out.device.type) == (x.shape, dtype, "cuda")


def test_fake_fused_moe_fp8():
    """fp8 weights with per-channel scales trace; a missing scale is refused by the fake implementation too."""
    with FakeTensorMode():
        x, w1, w2, weights, ids = _layer_args(tokens=6)
        w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
        s1 = torch.empty(w1.shape[:2], device="cuda")
        s2 = torch.empty(w2.shape[:2], device="cuda")
        out = torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids, "silu", "fp8", "channel", s1, s2)
        assert out.shape == x.shape and out.dtype == x.dtype
        with pytest.raises(ValueError, match=r"flydsl.fused_moe: w2_scale: expected a float32"):
            torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids, "silu", "fp8", "channel", s1, None)


def test_fake_topk_route_takes_its_options():
    with FakeTensorMode():
        logits = torch.empty(7, 256, device="cuda")
        bias = torch.empty(256, device="cuda")
        weights, ids = torch.ops.flydsl.topk_route(logits, 8, "sigmoid", True, bias, 8, 4)  # DeepSeek-V3's router
        assert weights.shape == ids.shape == (7, 8)
        weights, ids = torch.ops.flydsl.topk_route(logits, 2, scoring="softmax", renormalize=False)
        assert weights.shape == (7, 2)


def test_meta_tensors_run_the_fake_implementations():
    logits = torch.empty(5, E, dtype=BF16, device="meta")
    weights, ids = torch.ops.flydsl.topk_route(logits, K)
    assert weights.device.type == "meta" and weights.shape == (5, K)
    sorted_ids, _, _ = torch.ops.flydsl.align_tokens(ids.long(), E, 16)  # int64 ids too
    assert sorted_ids.shape == (align_capacity(5 * K, E, 16),)
    x, w1, w2, _, _ = _layer_args(device="meta", tokens=5)
    out = torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids, "silu")
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == BF16


def test_fake_out_ops_check_the_outputs_given():
    with FakeTensorMode():
        logits = torch.empty(10, E, dtype=BF16, device="cuda")
        weights = torch.empty(10, K, device="cuda")
        ids = torch.empty(10, K, dtype=torch.int32, device="cuda")
        torch.ops.flydsl.topk_route_out(logits, K, "softmax", True, None, None, None, weights, ids)
        with pytest.raises(
            ValueError, match=r"flydsl.topk_route: topk_ids: expected a int32 tensor of shape \(10, 4\)"
        ):
            torch.ops.flydsl.topk_route_out(logits, K, "softmax", True, None, None, None, weights, ids.long())
        capacity = align_capacity(10 * K, E, 32)
        sorted_ids = torch.empty(capacity, dtype=torch.int32, device="cuda")
        blocks = torch.empty(capacity // 32, dtype=torch.int32, device="cuda")
        count = torch.empty(1, dtype=torch.int32, device="cuda")
        torch.ops.flydsl.align_tokens_out(ids, E, 32, sorted_ids, blocks, count)
        with pytest.raises(ValueError, match=rf"flydsl.align_tokens: expert_of_block: .* shape \({capacity // 32},\)"):
            torch.ops.flydsl.align_tokens_out(ids, E, 32, sorted_ids, sorted_ids, count)
        x, w1, w2, _, _ = _layer_args(tokens=10)
        torch.ops.flydsl.fused_moe_out(x, w1, w2, weights, ids, "silu", None, None, None, None, torch.empty_like(x))
        with pytest.raises(ValueError, match=r"flydsl.fused_moe: out: expected a bfloat16 tensor of shape \(10, 256\)"):
            torch.ops.flydsl.fused_moe_out(
                x, w1, w2, weights, ids, "silu", None, None, None, None, torch.empty(10, 256, device="cuda")
            )


# --- refusals naming the argument ------------------------------------------------------------------------------------


def _meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _on_cuda(a):
    """A meta tensor as a (fake) CUDA tensor of its shape and dtype; anything else as it is."""
    return torch.empty(a.shape, dtype=a.dtype, device="cuda") if isinstance(a, torch.Tensor) else a


def _replace(args, index, value):
    args = list(args)
    args[index] = value
    return args


def _refused(op, args, error, message):
    """The same refusal from meta tensors and from fake CUDA tensors (torch.compile's tracing)."""
    with pytest.raises(error, match=f"flydsl.{op}: {message}"):
        getattr(torch.ops.flydsl, op)(*args)
    with FakeTensorMode():
        with pytest.raises(error, match=f"flydsl.{op}: {message}"):
            getattr(torch.ops.flydsl, op)(*[_on_cuda(a) for a in args])


ROUTE = [_meta(5, E), K, "softmax", True, None, None, None]


@pytest.mark.parametrize(
    "index, value, error, message",
    [
        (0, _meta(5, E, dtype=torch.float64), TypeError, "router_logits: expected dtype float32, float16 or bfloat16"),
        (0, _meta(5, 2, E), ValueError, r"router_logits: expected a 2-D tensor \(rows, N\)"),
        (0, _meta(5, 513), ValueError, "router_logits: expected 1 to 512 experts"),
        (1, 17, ValueError, "top_k: expected an int from 1 to 16, got 17"),
        (1, 0, ValueError, "top_k: expected an int from 1 to 16, got 0"),
        (0, _meta(5, 3), ValueError, r"top_k: expected at most E = 3 \(router_logits' last dim\), got 4"),
        (2, "relu", ValueError, r"scoring: expected one of \('softmax', 'sigmoid'\), got 'relu'"),
        (4, _meta(8, dtype=torch.float32), ValueError, r"bias: expected shape \(16,\)"),
        (4, _meta(E), TypeError, "bias: expected dtype float32, got bfloat16"),
        (5, 3, ValueError, "num_groups: expected a divisor of E = 16"),
        (5, 4, ValueError, r"top_groups: expected the number of groups kept \(1 to 4\), got None"),
    ],
)
def test_topk_route_refusals_name_the_argument(index, value, error, message):
    _refused("topk_route", _replace(ROUTE, index, value), error, message)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((_meta(5, K, dtype=torch.float32), E, 64), TypeError, "topk_ids: expected int32 or int64, got float32"),
        ((_meta(20, dtype=torch.int32), E, 64), ValueError, r"topk_ids: expected a 2-D tensor \(T, k\)"),
        ((_meta(5, K, dtype=torch.int32), 0, 64), ValueError, "num_experts: expected an int from 1 to 512, got 0"),
        ((_meta(5, K, dtype=torch.int32), 513, 64), ValueError, "num_experts: expected an int from 1 to 512, got 513"),
        ((_meta(5, K, dtype=torch.int32), E, 2048), ValueError, "block_m: expected an int from 1 to 1024, got 2048"),
    ],
)
def test_align_tokens_refusals_name_the_argument(args, error, message):
    _refused("align_tokens", args, error, message)


@pytest.mark.parametrize(
    "index, value, error, message",
    [
        (0, _meta(5, H, dtype=torch.float32), TypeError, "x: expected dtype bfloat16 or float16, got float32"),
        (0, _meta(5, 1, H), ValueError, r"x: expected a 2-D tensor \(T, H\)"),
        (1, _meta(E, 2 * INTER, 128), ValueError, r"w1: expected \(E, 2I, H\) with H = 256"),
        (1, _meta(E, 2 * INTER + 1, H), ValueError, r"w1: expected \(E, 2I, H\)"),
        (1, _meta(0, 2 * INTER, H), ValueError, "w1: expected 1 to 512 experts E"),
        (1, _meta(E, 2 * INTER, H, dtype=F16), TypeError, r"w1: expected dtype bfloat16 \(x's\), got float16"),
        (2, _meta(E, H, 64), ValueError, r"w2: expected \(E, H, I\) = \(16, 256, 128\)"),
        (2, _meta(E, H, INTER, dtype=torch.float32), TypeError, r"w2: expected dtype bfloat16 \(x's\), got float32"),
        (3, _meta(5, K + 1, dtype=torch.float32), ValueError, r"topk_weights: expected topk_ids' shape \(5, 4\)"),
        (3, _meta(5, K, dtype=torch.float64), TypeError, "topk_weights: expected dtype float32, bfloat16 or float16"),
        (4, _meta(6, K, dtype=torch.int32), ValueError, r"topk_ids: expected \(T, k\) with T = 5"),
        (4, _meta(5, K, dtype=torch.float32), TypeError, "topk_ids: expected int32 or int64, got float32"),
        (5, "gelu", ValueError, r"activation: expected one of \('silu',\), got 'gelu'"),
    ],
)
def test_fused_moe_refusals_name_the_argument(index, value, error, message):
    args = _layer_args(device="meta", tokens=5) + ["silu"]
    _refused("fused_moe", _replace(args, index, value), error, message)


def test_fused_moe_needs_whole_16_byte_rows():
    args = _layer_args(device="meta", tokens=5, hidden=100, inter=128)
    _refused("fused_moe", args, ValueError, r"w1: H = 100 and I = 128; expected multiples of 8 \(16-byte rows\)")


def test_real_tensors_must_be_on_one_cuda_device():
    with pytest.raises(ValueError, match="flydsl.topk_route: router_logits: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.topk_route(torch.zeros(4, E), K)
    with pytest.raises(ValueError, match="flydsl.align_tokens: topk_ids: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.align_tokens(torch.zeros(4, K, dtype=torch.int32), E, 64)
    with pytest.raises(ValueError, match="flydsl.fused_moe: x: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.fused_moe(*_layer_args(device="cpu", tokens=4))
    with FakeTensorMode():
        args = _layer_args(tokens=4)
        args[2] = torch.empty(E, H, INTER, dtype=BF16)  # on the CPU
        with pytest.raises(ValueError, match=r"flydsl.fused_moe: w2: expected a tensor on cuda:0 \(where x is\)"):
            torch.ops.flydsl.fused_moe(*args)


# --- torch.compile ---------------------------------------------------------------------------------------------------


def _moe_layer(x, logits, w1, w2, top_k: int):
    """A MoE layer through the three ops: route, the routing sorted by expert (as a caller of the grouped GEMM would
    use it), the experts."""
    weights, ids = torch.ops.flydsl.topk_route(logits, top_k, "softmax", True)
    sorted_ids, expert_of_block, padded_count = torch.ops.flydsl.align_tokens(ids, w1.shape[0], 64)
    return torch.ops.flydsl.fused_moe(x, w1, w2, weights, ids), sorted_ids, expert_of_block, padded_count


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_traces_a_moe_layer(dynamic, aot_graphs):
    """The three ops in one graph without breaks; with dynamic shapes one graph serves every token count (E, top_k
    and block_m specialized: the kernels are)."""
    torch._dynamo.reset()
    backend, graphs = aot_graphs()
    x, w1, w2, _, _ = _layer_args(device="meta")
    logits = torch.empty(100, E, dtype=BF16, device="meta")
    compiled = torch.compile(_moe_layer, backend=backend, fullgraph=True, dynamic=dynamic)
    with torch.no_grad():
        out, sorted_ids, expert_of_block, padded_count = compiled(x, logits, w1, w2, K)
        assert out.shape == x.shape and out.dtype == BF16 and out.device.type == "meta"
        capacity = align_capacity(100 * K, E, 64)
        assert sorted_ids.shape == (capacity,) and expert_of_block.shape == (capacity // 64,)
        assert padded_count.shape == (1,)
        out = compiled(x[:37], logits[:37], w1, w2, K)[0]
        assert out.shape == (37, H)
    assert len(graphs) == (1 if dynamic else 2)
    graph = str(graphs[-1].graph)
    for name in ("topk_route", "align_tokens", "fused_moe"):
        assert graph.count(f"flydsl.{name}.default") == 1, graph
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_moe_layer)(x, logits, w1, w2, K)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compile_fullgraph_traces_the_calls_of_nn_moe(aot_graphs):
    """nn.MoE calls the ops through FlyOp.call (no dispatcher in eager calls on plain CUDA tensors): traced, it is the
    functional ops, in one graph."""
    torch._dynamo.reset()
    backend, graphs = aot_graphs()

    def experts(x, logits, w1, w2):
        weights, ids = ft.moe.topk_route.call(logits, K, "softmax", True, None, None, None)
        return ft.moe.fused_moe.call(x, w1, w2, weights, ids, "silu", None, None, None, None)

    x, w1, w2, _, _ = _layer_args(device="meta")
    with torch.no_grad():
        out = torch.compile(experts, backend=backend, fullgraph=True)(x, torch.empty(100, E, device="meta"), w1, w2)
    assert out.shape == x.shape and out.dtype == BF16
    graph = str(graphs[0].graph)
    assert "flydsl.topk_route.default" in graph and "flydsl.fused_moe.default" in graph, graph


# --- nn.MoE ----------------------------------------------------------------------------------------------------------


def _hf_block(experts=8, hidden=64, inter=32, naming="qwen", seed=0, prefix=""):
    """A Hugging Face MoE block's state dict (float32, random): the router and each expert's projections, in Qwen-MoE
    (gate_proj, up_proj, down_proj) or Mixtral (w1, w3, w2) naming; and a shared expert, which MoE does not read."""
    g = torch.Generator().manual_seed(seed)
    gate, up, down = ("gate_proj", "up_proj", "down_proj") if naming == "qwen" else ("w1", "w3", "w2")
    state = {prefix + "gate.weight": torch.randn(experts, hidden, generator=g)}
    for e in range(experts):
        state[f"{prefix}experts.{e}.{gate}.weight"] = torch.randn(inter, hidden, generator=g) / hidden**0.5
        state[f"{prefix}experts.{e}.{up}.weight"] = torch.randn(inter, hidden, generator=g) / hidden**0.5
        state[f"{prefix}experts.{e}.{down}.weight"] = torch.randn(hidden, inter, generator=g) / inter**0.5
    state[prefix + "shared_expert.gate_proj.weight"] = torch.randn(inter, hidden, generator=g)
    return state


def _mixtral_block(x, state, top_k, prefix="", naming="qwen"):
    """Hugging Face's MixtralSparseMoeBlock.forward in plain torch, in x's dtype: softmax of the router's logits in
    float32, the top k renormalized and cast to x's dtype, each expert's ``down(silu(gate(x)) * up(x))`` scaled by
    its weight and summed."""
    gate, up, down = ("gate_proj", "up_proj", "down_proj") if naming == "qwen" else ("w1", "w3", "w2")
    rows = x.reshape(-1, x.shape[-1])
    routing = F.softmax(F.linear(rows, state[prefix + "gate.weight"].to(x.dtype)), dim=1, dtype=torch.float)
    routing, selected = torch.topk(routing, top_k, dim=-1)
    routing = (routing / routing.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(rows)
    for e in range(state[prefix + "gate.weight"].shape[0]):
        token, slot = torch.where(selected == e)
        if token.numel() == 0:
            continue
        w = {name: state[f"{prefix}experts.{e}.{name}.weight"].to(x.dtype) for name in (gate, up, down)}
        h = F.linear(F.silu(F.linear(rows[token], w[gate])) * F.linear(rows[token], w[up]), w[down])
        out.index_add_(0, token, h * routing[token, slot, None])
    return out.view(x.shape)


def test_moe_parameters_and_state_dict():
    moe = ft.nn.MoE(64, 32, 8, 2, dtype=BF16)
    assert moe.gate.weight.shape == (8, 64) and moe.gate.bias is None
    assert moe.w1.shape == (8, 64, 64) and moe.w2.shape == (8, 64, 32)
    assert {p.dtype for p in moe.parameters()} == {BF16}
    assert set(moe.state_dict()) == {"gate.weight", "w1", "w2"}
    assert moe.w1.abs().max() <= 1 / 64**0.5 and moe.w2.abs().max() <= 1 / 32**0.5  # nn.Linear's bounds
    other = ft.nn.MoE(64, 32, 8, 2, dtype=BF16)
    other.load_state_dict(moe.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(moe.state_dict().values(), other.state_dict().values(), strict=True))
    assert "num_experts=8, top_k=2, scoring=softmax, renormalize=True" in repr(moe)
    with pytest.raises(ValueError, match="MoE: top_k: expected 1 to num_experts = 8, got 9"):
        ft.nn.MoE(64, 32, 8, 9)
    with pytest.raises(ValueError, match=r"MoE: scoring: expected one of \('softmax', 'sigmoid'\), got 'relu'"):
        ft.nn.MoE(64, 32, 8, 2, scoring="relu")
    with pytest.raises(ValueError, match=r"MoE: activation: expected one of \('silu',\), got 'gelu'"):
        ft.nn.MoE(64, 32, 8, 2, activation="gelu")


@pytest.mark.parametrize(
    "naming, prefix", [("qwen", "model.layers.3.mlp."), ("mixtral", "model.layers.0.block_sparse_moe."), ("qwen", "")]
)
def test_load_hf_state_dict_stacks_the_experts(naming, prefix):
    state = _hf_block(naming=naming, prefix=prefix)
    gate, up, down = ("gate_proj", "up_proj", "down_proj") if naming == "qwen" else ("w1", "w3", "w2")
    moe = ft.nn.MoE(64, 32, 8, 2)
    moe.load_hf_state_dict(state, prefix)
    assert torch.equal(moe.gate.weight, state[prefix + "gate.weight"])
    for e in range(8):
        expected_w1 = torch.cat(
            [state[f"{prefix}experts.{e}.{gate}.weight"], state[f"{prefix}experts.{e}.{up}.weight"]]
        )
        assert torch.equal(moe.w1[e], expected_w1)
        assert torch.equal(moe.w2[e], state[f"{prefix}experts.{e}.{down}.weight"])
    half = ft.nn.MoE(64, 32, 8, 2, dtype=BF16)  # converted to the module's dtype
    half.load_hf_state_dict(state, prefix)
    assert half.w1.dtype == BF16 and torch.equal(half.w1[3, 32:], state[f"{prefix}experts.3.{up}.weight"].to(BF16))


def test_from_hf_takes_the_sizes_dtype_and_device_of_the_weights():
    state = {key: value.to(F16) for key, value in _hf_block(experts=4, hidden=48, inter=24, naming="mixtral").items()}
    moe = ft.nn.MoE.from_hf(state, top_k=2)
    assert (moe.num_experts, moe.hidden_size, moe.intermediate_size, moe.top_k) == (4, 48, 24, 2)
    assert moe.w1.dtype == F16 and moe.w1.device.type == "cpu"
    assert torch.equal(moe.w2[1], state["experts.1.w2.weight"])
    moe = ft.nn.MoE.from_hf(state, top_k=1, dtype=torch.float32, renormalize=False, scoring="sigmoid")
    assert moe.w1.dtype == torch.float32 and not moe.renormalize and moe.scoring == "sigmoid"


def test_load_hf_state_dict_errors_name_the_key_and_write_nothing():
    moe = ft.nn.MoE(64, 32, 8, 2)
    before = {key: value.clone() for key, value in moe.state_dict().items()}
    state = _hf_block(prefix="mlp.")
    missing = dict(state)
    del missing["mlp.experts.5.down_proj.weight"]
    with pytest.raises(KeyError, match=r"MoE: missing mlp.experts.5.down_proj.weight \(a \(64, 32\) tensor\)"):
        moe.load_hf_state_dict(missing, "mlp.")
    wrong = dict(state, **{"mlp.experts.7.up_proj.weight": torch.zeros(32, 63)})
    with pytest.raises(
        ValueError, match=r"MoE: mlp.experts.7.up_proj.weight: expected shape \(32, 64\), got \(32, 63\)"
    ):
        moe.load_hf_state_dict(wrong, "mlp.")
    with pytest.raises(ValueError, match=r"MoE: mlp.gate.weight: expected shape \(8, 64\), got \(4, 64\)"):
        moe.load_hf_state_dict(dict(state, **{"mlp.gate.weight": torch.zeros(4, 64)}), "mlp.")
    with pytest.raises(KeyError, match="found neither experts.0.gate_proj.weight nor experts.0.w1.weight"):
        moe.load_hf_state_dict(state)  # without its prefix
    with pytest.raises(KeyError, match="MoE: missing gate.weight"):
        ft.nn.MoE.from_hf(state, top_k=2)
    for key, value in moe.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("naming", ["qwen", "mixtral"])
def test_moe_off_the_gpu_is_the_float32_reference(naming):
    """CPU tensors take the float32 references of flydsl.kernels.moe.reference: Hugging Face's Mixtral block."""
    state = _hf_block(naming=naming, seed=1)
    moe = ft.nn.MoE.from_hf(state, top_k=2)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y = moe(x)
        expected = _mixtral_block(x, state, 2, naming=naming)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        half = moe.to(BF16)(x.to(BF16))
    assert half.dtype == BF16 and (half.float() - expected).abs().max() < 2e-2 * expected.abs().max()
    with pytest.raises(ValueError, match=r"MoE: x: expected a last dim of 64, got shape \(3, 63\)"):
        moe(torch.randn(3, 63))


def test_moe_runs_the_flydsl_ops_on_cuda_tensors(op_recorder):
    # Built on meta, then given fake CUDA storage: a CPU build of torch cannot initialize fake CUDA parameters.
    moe = ft.nn.MoE(64, 32, 8, 2, device="meta", dtype=BF16)
    float_router = ft.nn.MoE(64, 32, 8, 2, device="meta", dtype=BF16)
    float_router.gate.float()  # DeepSeek's: x is cast to the router's dtype, the experts keep x's
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        moe.to_empty(device="cuda")
        float_router.to_empty(device="cuda")
        x = torch.empty(2, 3, 64, dtype=BF16, device="cuda")
        with op_recorder() as rec:
            y = moe(x)
        assert y.shape == x.shape and y.dtype == BF16 and y.device.type == "cuda"
        called = [name for name in rec.names if name.startswith("flydsl.")]
        assert called == ["flydsl.topk_route.default", "flydsl.fused_moe.default"]
        with op_recorder() as rec:
            assert float_router(x).dtype == BF16
        assert "aten.mm.default" in rec.names or "aten.addmm.default" in rec.names
        assert [name for name in rec.names if name.startswith("flydsl.")] == called
