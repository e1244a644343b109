"""torch.ops.flydsl.fp8_gemm, fp8_gemm_prepared and quantize_fp8 without a GPU: fake implementations (shapes, dtypes,
refusals naming the argument) and flydsl.torch.nn.Fp8Linear (its buffers, plain and prepared, the state_dict round
trip, the CPU fallback's product)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import flydsl.torch  # noqa: E402, F401  (registers the ops)
from flydsl.torch.nn import Fp8Linear  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _fake_operands(m=8, n=32, k=64):
    a = torch.empty(m, k, dtype=E4M3, device="cuda")
    b = torch.empty(n, k, dtype=E4M3, device="cuda").t()
    return a, b, torch.empty(m, 1, device="cuda"), torch.empty(1, n, device="cuda")


def test_fake_fp8_gemm_gives_the_output_dtype():
    with FakeTensorMode():
        a, b, sa, sb = _fake_operands()
        assert torch.ops.flydsl.fp8_gemm(a, b, sa, sb).dtype == torch.bfloat16
        out = torch.ops.flydsl.fp8_gemm(a, b, sa, sb, None, None, torch.float32)
        assert out.shape == (8, 32) and out.dtype == torch.float32


@pytest.mark.parametrize(
    "change,message",
    [
        ("k", r"flydsl.fp8_gemm: a: K = 40: expected a multiple of 16"),
        ("scale", r"flydsl.fp8_gemm: scale_b: expected one float32 scale"),
        ("out_dtype", r"flydsl.fp8_gemm: out_dtype: expected dtype bfloat16, float16 or float32, got float64"),
    ],
)
def test_fake_fp8_gemm_refuses_naming_the_argument(change, message):
    with FakeTensorMode():
        a, b, sa, sb = _fake_operands(k=40 if change == "k" else 64)
        sb = torch.empty(32, 2, device="cuda") if change == "scale" else sb
        out_dtype = torch.float64 if change == "out_dtype" else None
        with pytest.raises((TypeError, ValueError), match=message):
            torch.ops.flydsl.fp8_gemm(a, b, sa, sb, None, None, out_dtype)


@pytest.mark.parametrize(
    "granularity,scales",
    [("token", (6, 1)), ("channel", (1, 6)), ("tensor", ()), ("group", (6, 3)), ("block", (1, 3))],
)
def test_fake_quantize_fp8_shapes(granularity, scales):
    with FakeTensorMode():
        x = torch.empty(2, 3, 272, dtype=torch.bfloat16, device="cuda")
        q, s = torch.ops.flydsl.quantize_fp8(x, granularity, torch.float8_e5m2)
        assert q.shape == x.shape and q.dtype == torch.float8_e5m2 and s.shape == scales and s.dtype == torch.float32


def test_quantize_fp8_op_refuses_a_granularity():
    with FakeTensorMode():
        x = torch.empty(4, 128, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match=r"flydsl.quantize_fp8: granularity: expected one of"):
            torch.ops.flydsl.quantize_fp8(x, "row", None)


def test_fake_fp8_gemm_prepared_gives_n_columns():
    from flydsl.kernels.gemm.prepared import prepared_shape

    with FakeTensorMode():
        a, _, sa, sb = _fake_operands(n=40)
        blocks = torch.empty(prepared_shape(64, 40), dtype=E4M3, device="cuda")
        out = torch.ops.flydsl.fp8_gemm_prepared(a, blocks, 40, sa, sb, None, "relu", torch.float16)
        assert out.shape == (8, 40) and out.dtype == torch.float16
        with pytest.raises(ValueError, match=r"flydsl.fp8_gemm_prepared: b: a PreparedWeight of \(64, 48\) holds"):
            torch.ops.flydsl.fp8_gemm_prepared(a, blocks, 48, sa, sb, None, None, None)


@pytest.mark.parametrize("prepared", [True, False])
def test_fp8_linear_from_linear_and_state_dict(prepared):
    from flydsl.kernels.gemm.prepared import prepared_shape

    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96, dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(linear, prepared=prepared)
    shape = prepared_shape(256, 96) if prepared else (96, 256)
    assert layer.weight.dtype == E4M3 and layer.weight.shape == shape and layer.weight_scale.shape == (1, 96)
    expected_scale = linear.weight.float().abs().amax(dim=1) / 448.0
    torch.testing.assert_close(layer.weight_scale[0], expected_scale)
    dense = layer.dense_weight()
    assert dense.shape == (96, 256)
    expected = (linear.weight.float() / expected_scale[:, None]).clamp(-448, 448).to(E4M3)
    assert torch.equal(dense.view(torch.uint8), expected.view(torch.uint8))
    x = torch.randn(3, 7, 256, dtype=torch.bfloat16)
    y, ref = layer(x), linear(x)
    assert y.shape == (3, 7, 96) and y.dtype == torch.bfloat16
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 0.05  # the weights' fp8 rounding
    other = Fp8Linear(256, 96, prepared=prepared)
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other(x), y)


def test_fp8_linear_takes_pre_quantized_inputs():
    layer = Fp8Linear(64, 32, bias=False)
    x8 = torch.randn(5, 64).to(E4M3)
    scale = torch.full((5, 1), 0.5)
    y = layer(x8, scale)
    ref = (x8.float() * 0.5) @ (layer.dense_weight().float() * layer.weight_scale.t()).t()
    torch.testing.assert_close(y.float(), ref.bfloat16().float())
    with pytest.raises(ValueError, match="pass scale with an fp8 x"):
        layer(x8)
    with pytest.raises(ValueError, match=r"Fp8Linear: x: expected a last dim of 64, got shape \(5, 63\)"):
        layer(torch.randn(5, 63))
    with pytest.raises(ValueError, match="granularity: expected 'token', 'tensor' or 'block'"):
        Fp8Linear(64, 32, granularity="channel")
    with pytest.raises(ValueError, match="prepared: granularity 'block' takes plain weights"):
        Fp8Linear(64, 32, granularity="block", prepared=True)


def test_fp8_linear_block_quantizes_per_128_x_128_block():
    """granularity="block": weight_scale per 128 x 128 block of W (partial blocks at the edges), each block's amax /
    448; the CPU product, from x's own 1 x 128 groups when pre-quantized, close to the nn.Linear; the state_dict
    round trip."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(300, 200, dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(linear, "block")
    assert layer.weight.shape == (200, 300) and layer.weight_scale.shape == (2, 3)
    w = linear.weight.float()
    torch.testing.assert_close(layer.weight_scale[1, 2], w[128:, 256:].abs().amax() / 448.0)
    torch.testing.assert_close(layer.weight_scale[0, 0], w[:128, :128].abs().amax() / 448.0)
    x = torch.randn(9, 300, dtype=torch.bfloat16)
    y, ref = layer(x), linear(x)
    assert y.shape == (9, 200) and ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 0.05
    groups = x.float().view(9, 1, 300)  # x per 1 x 128 group, by hand: scales (9, 3)
    scales = torch.stack([x.float()[:, g * 128 : (g + 1) * 128].abs().amax(dim=1) / 448.0 for g in range(3)], dim=1)
    x8 = (groups[:, 0] / scales.repeat_interleave(128, 1)[:, :300]).to(E4M3)
    pre = layer(x8, scales)
    assert pre.dtype == torch.bfloat16 and ((pre.float() - ref.float()).norm() / ref.float().norm()).item() < 0.06
    other = Fp8Linear(300, 200, granularity="block")
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other(x), y)


def test_fake_blockscale_gemm_gives_the_output_and_names_the_scales():
    with FakeTensorMode():
        a, b, _, _ = _fake_operands(m=8, n=200, k=272)
        a_scales, b_scales = torch.empty(8, 3, device="cuda"), torch.empty(2, 3, device="cuda")
        out = torch.ops.flydsl.blockscale_gemm(a, b, a_scales, b_scales, None, "gelu", torch.float32)
        assert out.shape == (8, 200) and out.dtype == torch.float32
        with pytest.raises(ValueError, match=r"flydsl.blockscale_gemm: b_scales: expected shape \(2, 3\)"):
            torch.ops.flydsl.blockscale_gemm(a, b, a_scales, torch.empty(3, 3, device="cuda"), None, None, None)


def test_casts_keep_the_fp8_weight():
    """``Fp8Linear.to(dtype)`` casts the bias only: the e4m3 weight and its float32 scale keep their dtypes and bits."""
    layer = Fp8Linear(256, 128)
    weight, scale = layer.weight.clone(), layer.weight_scale.clone()
    layer.to(torch.float16)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8)) and torch.equal(
        layer.weight_scale, scale
    )
    assert layer.bias.dtype == torch.float16


@pytest.mark.parametrize("granularity, prepared, ops", [
    ("token", False, ["flydsl.quantize_fp8.default", "flydsl.fp8_gemm.default"]),
    ("token", True, ["flydsl.quantize_fp8.default", "flydsl.fp8_gemm_prepared.default"]),
    ("block", False, ["flydsl.quantize_fp8.default", "flydsl.blockscale_gemm.default"]),
])  # fmt: skip
def test_fp8_linear_on_fake_cuda_tensors_goes_through_the_ops(op_recorder, granularity, prepared, ops):
    """Fp8Linear's CUDA path calls the ops' ``call``: under a dispatch mode (fake tensors here, as torch.compile
    traces) that is the torch.ops.flydsl ops, each once, with the output's shape and dtype from their fakes."""
    layer = Fp8Linear(256, 96, granularity=granularity, prepared=prepared)
    with FakeTensorMode():
        for store in (layer._buffers, layer._parameters):  # the weights, scales and bias as fake CUDA tensors
            for name, value in list(store.items()):
                if value is not None:
                    store[name] = torch.empty(value.shape, dtype=value.dtype, device="cuda")
        x = torch.empty(3, 7, 256, dtype=torch.bfloat16, device="cuda")
        with op_recorder() as rec:
            y = layer(x)
    assert [name for name in rec.names if name.startswith("flydsl.")] == ops
    assert y.shape == (3, 7, 96) and y.dtype == torch.bfloat16
