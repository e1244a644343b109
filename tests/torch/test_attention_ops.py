"""torch.ops.flydsl.paged_decode and write_kv without a GPU: schemas (write_kv: a mutating-only op, its caches and
scales annotated as written), fake and meta implementations (shapes, dtypes), refusals naming the argument, and a
decode step (write_kv, then paged_decode) traced by torch.compile(fullgraph=True) into one graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.torch import _mutating  # noqa: E402

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


def _schema(name: str) -> str:
    return str(getattr(torch.ops.flydsl, name).default._schema)


def _decode_args(
    *, device="cuda", batch=3, queries=1, q_heads=8, kv_heads=2, dim=128, blocks=10, block_size=16, max_blocks=4,
    dtype=BF16, cache_dtype=None, scales=None,
):  # fmt: skip
    """paged_decode's arguments (empty tensors on ``device``): scales None, "tensor" (one element) or "token"."""
    cache_dtype = cache_dtype or dtype
    q_shape = (batch, q_heads, dim) if queries == 1 else (batch, queries, q_heads, dim)
    q = torch.empty(q_shape, dtype=dtype, device=device)
    k_cache = torch.empty(blocks, block_size, kv_heads, dim, dtype=cache_dtype, device=device)
    v_cache = torch.empty_like(k_cache)
    tables = torch.empty(batch, max_blocks, dtype=torch.int32, device=device)
    lens = torch.empty(batch, dtype=torch.int32, device=device)
    scale_shape = {None: None, "tensor": (1,), "token": (blocks, block_size, kv_heads)}[scales]
    k_scale = v_scale = None
    if scale_shape is not None:
        k_scale = torch.empty(scale_shape, device=device)
        v_scale = torch.empty(scale_shape, device=device)
    return [q, k_cache, v_cache, tables, lens, None, k_scale, v_scale, None, None, None]


def _write_args(
    *, device="cuda", tokens=3, kv_heads=2, dim=128, blocks=10, block_size=16, cache_dtype=BF16, scales=None
):
    k = torch.empty(tokens, kv_heads, dim, dtype=BF16, device=device)
    v = torch.empty_like(k)
    k_cache = torch.empty(blocks, block_size, kv_heads, dim, dtype=cache_dtype, device=device)
    v_cache = torch.empty_like(k_cache)
    slots = torch.empty(tokens, dtype=torch.int64, device=device)
    scale_shape = {None: None, "tensor": (1,), "token": (blocks, block_size, kv_heads)}[scales]
    k_scale = v_scale = None
    if scale_shape is not None:
        k_scale = torch.empty(scale_shape, device=device)
        v_scale = torch.empty(scale_shape, device=device)
    return [k, v, k_cache, v_cache, slots, k_scale, v_scale]


# --- registration ----------------------------------------------------------------------------------------------------


def test_schemas():
    assert _schema("paged_decode") == (
        "flydsl::paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens,"
        " float? scale=None, Tensor? k_scale=None, Tensor? v_scale=None, SymInt? sliding_window=None,"
        " float? soft_cap=None, SymInt? max_context=None) -> Tensor"
    )
    assert _schema("paged_decode_out") == (
        "flydsl::paged_decode_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens,"
        " float? scale, Tensor? k_scale, Tensor? v_scale, SymInt? sliding_window, float? soft_cap,"
        " SymInt? max_context, Tensor(a11!) out) -> ()"
    )
    assert _schema("write_kv") == (
        "flydsl::write_kv(Tensor k, Tensor v, Tensor(a2!) k_cache, Tensor(a3!) v_cache, Tensor slot_mapping,"
        " Tensor(a5!)? k_scale=None, Tensor(a6!)? v_scale=None) -> ()"
    )


def test_write_kv_is_a_mutating_only_op():
    assert "paged_decode" in ft.registered_ops()
    mutating = _mutating.registered_mutating_ops()
    assert set(mutating) == {"write_kv"} and "write_kv" not in ft.registered_ops()
    assert mutating["write_kv"].mutates == ("k_cache", "v_cache", "k_scale", "v_scale")
    assert not hasattr(torch.ops.flydsl, "write_kv_out")
    with pytest.raises(RuntimeError, match="flydsl op write_kv is already registered"):
        _mutating.register_mutating_op("write_kv", mutates=("x",), check=lambda x: None)(lambda x: None)
    with pytest.raises(RuntimeError, match="flydsl op paged_decode is already registered"):
        _mutating.register_mutating_op("paged_decode", mutates=("x",), check=lambda x: None)(lambda x: None)


def test_mutating_ops_name_tensor_parameters():
    def impl(x: torch.Tensor, n: int) -> None: ...

    register = _mutating.register_mutating_op
    with pytest.raises(TypeError, match=r"mutates: expected names of its tensor parameters, got \('n',\)"):
        register("attention_test_unregistered", mutates=("n",), check=lambda x, n: None)(impl)
    with pytest.raises(TypeError, match="takes its inputs as plain parameters"):
        register("attention_test_unregistered", mutates=("x",), check=lambda x: None)(
            lambda x, *, out: None  # outputs: register_op's
        )
    assert not hasattr(torch.ops.flydsl, "attention_test_unregistered")


# --- fake and meta implementations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "queries, dim, dtype, cache_dtype, scales",
    [
        (1, 128, BF16, None, None),
        (4, 64, torch.float16, None, None),
        (2, 256, BF16, E4M3, "tensor"),
        (1, 128, torch.float16, E4M3, "token"),
    ],
)
def test_fake_paged_decode_gives_qs_shape_and_dtype(queries, dim, dtype, cache_dtype, scales):
    with FakeTensorMode():
        args = _decode_args(queries=queries, dim=dim, dtype=dtype, cache_dtype=cache_dtype, scales=scales)
        out = torch.ops.flydsl.paged_decode(*args)
        assert (out.shape, out.dtype, out.device.type) == (args[0].shape, dtype, "cuda")
        torch.ops.flydsl.paged_decode_out(*args, out=torch.empty_like(args[0]))
        with pytest.raises(ValueError, match=r"flydsl.paged_decode: out: expected a \w+ tensor of shape"):
            torch.ops.flydsl.paged_decode_out(*args, out=torch.empty(1, device="cuda", dtype=dtype))


def test_meta_tensors_run_the_fake_implementations():
    args = _decode_args(device="meta", queries=3, dim=64)
    out = torch.ops.flydsl.paged_decode(*args[:5], sliding_window=100, soft_cap=30.0, max_context=64, scale=0.5)
    assert out.device.type == "meta" and out.shape == args[0].shape and out.dtype == BF16
    k, v, k_cache, v_cache, slots, _, _ = _write_args(device="meta")
    assert torch.ops.flydsl.write_kv(k, v, k_cache, v_cache, slots) is None  # 16-bit caches: no scales
    assert torch.ops.flydsl.write_kv(*_write_args(device="meta", cache_dtype=E4M3, scales="token")) is None


def test_fake_write_kv_returns_nothing():
    with FakeTensorMode():
        for cache_dtype, scales in ((BF16, None), (torch.float16, None), (E4M3, "tensor"), (E4M3, "token")):
            args = _write_args(cache_dtype=cache_dtype, scales=scales)
            assert torch.ops.flydsl.write_kv(*args) is None
            assert torch.ops.flydsl.write_kv(*args[:5], k_scale=args[5], v_scale=args[6]) is None


# --- refusals naming the argument ------------------------------------------------------------------------------------

DECODE = "flydsl.paged_decode: "


def _replace(args, index, value):
    args = list(args)
    args[index] = value
    return args


def _meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _on_cuda(a):
    """A meta tensor as a (fake) CUDA tensor of its shape and dtype; anything else as it is."""
    return torch.empty(a.shape, dtype=a.dtype, device="cuda") if isinstance(a, torch.Tensor) else a


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: _replace(a, 0, a[0].float()), TypeError, "q: expected dtype bfloat16 or float16, got float32"),
        (lambda a: _replace(a, 0, _meta(3, 128)), ValueError, r"q: expected \(B, Hq, D\) or \(B, Q, Hq, D\)"),
        (lambda a: _replace(a, 0, _meta(3, 8, 96)), ValueError, "q: expected a head dim D of 64, 128, 256, got 96"),
        (lambda a: _replace(a, 0, _meta(3, 5, 8, 128)), ValueError, "q: expected 1..4 query tokens per sequence"),
        (lambda a: _replace(a, 0, _meta(3, 7, 128)), ValueError, "q: expected a head count Hq that is a multiple of"),
        (
            lambda a: _replace(a, 1, a[1].half()),
            TypeError,
            r"k_cache: expected dtype bfloat16 \(q's\) or float8_e4m3fn, got float16",
        ),
        (lambda a: _replace(a, 1, _meta(10, 16, 2, 64)), ValueError, "k_cache: expected .* with q's D 128"),
        (lambda a: _replace(a, 2, _meta(11, 16, 2, 128)), ValueError, r"v_cache: expected shape \(10, 16, 2, 128\)"),
        (
            lambda a: _replace(_replace(a, 1, _meta(10, 8, 2, 128)), 2, _meta(10, 8, 2, 128)),
            ValueError,
            "k_cache: expected a block_size that is a multiple of 16, got 8",
        ),
        (lambda a: _replace(a, 3, a[3].long()), TypeError, "block_tables: expected dtype int32, got int64"),
        (
            lambda a: _replace(a, 3, _meta(2, 4, dtype=torch.int32)),
            ValueError,
            r"block_tables: expected shape \(3, max_blocks\)",
        ),
        (lambda a: _replace(a, 4, a[4].float()), TypeError, "context_lens: expected dtype int32, got float32"),
        (lambda a: _replace(a, 4, _meta(3, 1, dtype=torch.int32)), ValueError, r"context_lens: expected shape \(3,\)"),
        (lambda a: _replace(a, 6, _meta(1, dtype=torch.float32)), ValueError, "k_scale: scales apply to fp8 caches"),
        (lambda a: _replace(a, 5, float("inf")), ValueError, "scale: expected a finite float or None, got inf"),
        (lambda a: _replace(a, 8, 0), ValueError, "sliding_window: expected an int >= 1 or None, got 0"),
        (lambda a: _replace(a, 9, -1.0), ValueError, "soft_cap: expected a positive finite float or None, got -1.0"),
        (lambda a: _replace(a, 10, 0), ValueError, "max_context: expected an int >= 1 or None, got 0"),
    ],
)
def test_paged_decode_refusals_name_the_argument(change, error, message):
    args = change(_decode_args(device="meta"))
    with pytest.raises(error, match=DECODE + message):
        torch.ops.flydsl.paged_decode(*args)
    with FakeTensorMode():  # the same error from fake tensors (torch.compile's tracing)
        fake = [_on_cuda(a) for a in args]
        with pytest.raises(error, match=DECODE + message):
            torch.ops.flydsl.paged_decode(*fake)


@pytest.mark.parametrize(
    "scales, index, value, error, message",
    [
        (None, 6, None, ValueError, r"k_scale: an fp8 cache needs its scale: a one-element float32 tensor"),
        ("tensor", 7, None, ValueError, r"v_scale: an fp8 cache needs its scale"),
        ("tensor", 6, _meta(1, dtype=torch.float16), TypeError, "k_scale: expected dtype float32, got float16"),
        ("token", 7, _meta(10, 16, 1, dtype=torch.float32), ValueError, r"v_scale: expected one float32 scale"),
    ],
)
def test_paged_decode_fp8_caches_need_their_scales(scales, index, value, error, message):
    args = _replace(_decode_args(device="meta", cache_dtype=E4M3, scales=scales), index, value)
    with pytest.raises(error, match=DECODE + message):
        torch.ops.flydsl.paged_decode(*args)


WRITE = "flydsl.write_kv: "


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: _replace(a, 0, _meta(3, 256)), ValueError, r"k: expected a 3-D tensor \(T, Hkv, D\)"),
        (lambda a: _replace(a, 0, a[0].float()), TypeError, "k: expected dtype bfloat16 or float16, got float32"),
        (
            lambda a: _replace(_replace(a, 0, _meta(3, 2, 12)), 1, _meta(3, 2, 12)),
            ValueError,
            "k: expected a head size D that is a multiple of 8 up to 1024, got 12",
        ),
        (lambda a: _replace(a, 1, a[1].half()), TypeError, r"v: expected dtype bfloat16 \(k's\), got float16"),
        (lambda a: _replace(a, 1, _meta(4, 2, 128)), ValueError, r"v: expected shape \(3, 2, 128\) \(k's\)"),
        (
            lambda a: _replace(a, 2, _meta(10, 16, 4, 128)),
            ValueError,
            r"k_cache: expected shape \(num_blocks, block_size, 2, 128\) \(Hkv and D: k's\)",
        ),
        (
            lambda a: _replace(_replace(a, 2, a[2].float()), 3, a[3].float()),
            TypeError,
            "k_cache: expected dtype bfloat16, float16 or float8_e4m3fn, got float32",
        ),
        (lambda a: _replace(a, 3, a[3].half()), TypeError, r"v_cache: expected dtype bfloat16 \(k_cache's\)"),
        (lambda a: _replace(a, 4, a[4].float()), TypeError, "slot_mapping: expected dtype int32 or int64, got float32"),
        (
            lambda a: _replace(a, 4, _meta(4, dtype=torch.int32)),
            ValueError,
            r"slot_mapping: expected shape \(3,\) \(one slot per token of k\)",
        ),
        (lambda a: _replace(a, 5, _meta(1, dtype=torch.float32)), ValueError, "k_scale: scales apply to fp8 caches"),
    ],
)
def test_write_kv_refusals_name_the_argument(change, error, message):
    args = change(_write_args(device="meta"))
    with pytest.raises(error, match=WRITE + message):
        torch.ops.flydsl.write_kv(*args)
    with FakeTensorMode():
        fake = [_on_cuda(a) for a in args]
        with pytest.raises(error, match=WRITE + message):
            torch.ops.flydsl.write_kv(*fake)


def test_write_kv_fp8_caches_need_their_scales():
    args = _write_args(device="meta", cache_dtype=E4M3, scales="token")
    with pytest.raises(ValueError, match=WRITE + r"k_scale: an fp8 cache needs its scale"):
        torch.ops.flydsl.write_kv(*_replace(args, 5, None))
    with pytest.raises(ValueError, match=WRITE + r"v_scale: expected one float32 scale .* got shape \(10, 16\)"):
        torch.ops.flydsl.write_kv(*_replace(args, 6, _meta(10, 16, dtype=torch.float32)))


def test_real_tensors_must_be_on_one_cuda_device():
    with pytest.raises(ValueError, match="flydsl.paged_decode: q: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.paged_decode(*_decode_args(device="cpu"))
    with pytest.raises(ValueError, match="flydsl.write_kv: k: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.write_kv(*_write_args(device="cpu"))
    with FakeTensorMode():
        args = _write_args()
        args[4] = torch.empty(3, dtype=torch.int64)  # on the CPU
        with pytest.raises(ValueError, match=r"flydsl.write_kv: slot_mapping: expected a tensor on cuda:0 \(where k"):
            torch.ops.flydsl.write_kv(*args)


# --- torch.compile ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [False, True])
def test_compile_fullgraph_traces_a_decode_step(fp8, aot_graphs):
    """write_kv (functionalized: auto_functionalized over the caches and scales) then paged_decode on the caches it
    wrote, in one graph without breaks; the result has q's shape and dtype."""
    torch._dynamo.reset()
    backend, graphs = aot_graphs()
    cache_dtype, scales = (E4M3, "token") if fp8 else (BF16, None)
    q, k_cache, v_cache, tables, lens, _, k_scale, v_scale, *_ = _decode_args(
        device="meta", cache_dtype=cache_dtype, scales=scales
    )
    k, v, _, _, slots, _, _ = _write_args(device="meta")

    def step(q, k, v, slots, lens):
        torch.ops.flydsl.write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
        return torch.ops.flydsl.paged_decode(q, k_cache, v_cache, tables, lens, None, k_scale, v_scale, None, None, 64)

    with torch.no_grad():
        out = torch.compile(step, backend=backend, fullgraph=True)(q, k, v, slots, lens)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"
    graph = str(graphs[0].graph)
    assert "auto_functionalized" in graph and "flydsl.write_kv.default" in graph, graph
    assert graph.count("flydsl.paged_decode.default") == 1, graph
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(q, k, v, slots, lens)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
