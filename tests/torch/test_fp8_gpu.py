"""torch.ops.flydsl.fp8_gemm / fp8_gemm_prepared / quantize_fp8 and flydsl.torch.nn.Fp8Linear on the GPU: the ops give
the kernels' results (per token, per tensor, pre-quantized inputs, prepared weights), Fp8Linear (plain or prepared) is
close to the nn.Linear it replaces, and runs under torch.compile(fullgraph=True) and in a CUDA graph replayed on new
values."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flydsl.torch  # noqa: E402, F401
from flydsl.kernels.gemm import fp8_gemm  # noqa: E402
from flydsl.kernels.quantize import quantize_fp8  # noqa: E402
from flydsl.torch.nn import Fp8Linear  # noqa: E402

pytestmark = pytest.mark.gpu


def _error(y, ref) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def _linear(k=1024, n=768, dtype=torch.bfloat16):
    torch.manual_seed(1)
    return torch.nn.Linear(k, n, device="cuda", dtype=dtype)


def test_ops_match_the_kernels():
    x = torch.randn(2, 100, 512, device="cuda", dtype=torch.bfloat16)
    q, s = torch.ops.flydsl.quantize_fp8(x, "token", None)
    q_k, s_k = quantize_fp8(x.reshape(-1, 512), "token")
    assert torch.equal(q.view(torch.uint8).reshape(-1, 512), q_k.view(torch.uint8)) and torch.equal(s, s_k)
    w8, sw = quantize_fp8(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), "channel")
    a8 = q.reshape(-1, 512)
    y = torch.ops.flydsl.fp8_gemm(a8, w8.t(), s, sw, None, "silu", torch.float16)
    assert torch.equal(y, fp8_gemm(a8, w8.t(), s, sw, activation="silu", out_dtype=torch.float16))


def test_the_functional_forms_equal_the_ops():
    """flydsl.torch.functional's quantize_fp8, fp8_gemm and blockscale_gemm (no dispatcher in eager mode; the second
    call a kept plan's replay) give the ops' bits."""
    x = torch.randn(100, 512, device="cuda", dtype=torch.bfloat16)
    w8, sw = quantize_fp8(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), "channel")
    wb, swb = quantize_fp8(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), "block")
    for _ in range(2):
        q, s = flydsl.torch.functional.quantize_fp8(x, "token")
        q_op, s_op = torch.ops.flydsl.quantize_fp8(x, "token", None)
        assert torch.equal(q.view(torch.uint8), q_op.view(torch.uint8)) and torch.equal(s, s_op)
        y = flydsl.torch.functional.fp8_gemm(q, w8.t(), s, sw, None, "silu")
        assert torch.equal(y, torch.ops.flydsl.fp8_gemm(q, w8.t(), s, sw, None, "silu", None))
        g, sg = flydsl.torch.functional.quantize_fp8(x, "group")
        y = flydsl.torch.functional.blockscale_gemm(g, wb.t(), sg, swb)
        assert torch.equal(y, torch.ops.flydsl.blockscale_gemm(g, wb.t(), sg, swb, None, None, None))


def test_the_prepared_op_gives_the_plain_ops_bits():
    from flydsl.kernels.gemm import prepare_weight

    a8, s = quantize_fp8(torch.randn(5, 512, device="cuda", dtype=torch.bfloat16), "token")
    w8, sw = quantize_fp8(torch.randn(264, 512, device="cuda", dtype=torch.bfloat16), "channel")
    for rows in (a8, torch.cat([a8] * 40)):  # the skinny and the warp-specialized kernel
        scale = s if rows is a8 else torch.cat([s] * 40)
        blocks = prepare_weight(w8.t()).data
        y = torch.ops.flydsl.fp8_gemm_prepared(rows, blocks, 264, scale, sw, None, "gelu", None)
        assert torch.equal(y, torch.ops.flydsl.fp8_gemm(rows, w8.t(), scale, sw, None, "gelu", None))


@pytest.mark.parametrize("granularity", ["token", "tensor", "block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("prepared", [True, False])
def test_fp8_linear_is_close_to_linear(granularity, dtype, prepared):
    if granularity == "block" and prepared:
        pytest.skip("granularity 'block' takes plain weights")
    linear = _linear(dtype=dtype)
    layer = Fp8Linear.from_linear(linear, granularity, prepared=prepared)
    x = torch.randn(4, 33, 1024, device="cuda", dtype=dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (4, 33, 768)
    assert _error(y, linear(x)) < 6e-2  # two fp8 roundings (2^-4 each, relative)


def test_fp8_linear_pre_quantized_and_per_tensor_scale():
    linear = _linear()
    layer = Fp8Linear.from_linear(linear)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    for granularity in ("token", "tensor"):
        x8, scale = quantize_fp8(x, granularity)
        assert _error(layer(x8, scale), linear(x)) < 6e-2


def test_fp8_linear_compiles_fullgraph():
    linear = _linear()
    layer = Fp8Linear.from_linear(linear)
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(48, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(compiled(x), layer(x))


def test_fp8_linear_replays_in_a_cuda_graph(graphed):
    linear = _linear()
    layer = Fp8Linear.from_linear(linear)
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    graph, y = graphed(lambda: layer(x))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert _error(y, linear(x)) < 6e-2


def test_the_blockscale_op_matches_the_kernel():
    from flydsl.kernels.gemm import blockscale_gemm

    a = (torch.randn(300, 400, device="cuda") * 8).to(torch.float8_e4m3fn)
    w = (torch.randn(200, 400, device="cuda") * 8).to(torch.float8_e4m3fn)
    a_scales, w_scales = torch.rand(300, 4, device="cuda") + 0.5, torch.rand(2, 4, device="cuda") + 0.5
    y = torch.ops.flydsl.blockscale_gemm(a, w.t(), a_scales, w_scales, None, "relu", None)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, blockscale_gemm(a, w.t(), a_scales, w_scales, activation="relu"))


def test_the_group_and_block_quantize_ops_match_the_kernel_and_feed_the_blockscale_op(graphed):
    """The op's "group" scales are row-major (rows, ceil(K / 128)) with the kernel's values; "block" gives the
    kernel's blocks; Fp8Linear(granularity="block") is the op chain on its buffers, in eager, compiled and CUDA graph
    forms."""
    x = torch.randn(3, 70, 400, device="cuda", dtype=torch.bfloat16)
    q, s = torch.ops.flydsl.quantize_fp8(x, "group", None)
    q_k, s_k = quantize_fp8(x.reshape(-1, 400), "group")
    assert s.shape == (210, 4) and s.stride() == (4, 1) and torch.equal(s, s_k)
    assert torch.equal(q.view(torch.uint8).reshape(-1, 400), q_k.view(torch.uint8))
    w = torch.randn(200, 400, device="cuda", dtype=torch.bfloat16)
    w8, sw = torch.ops.flydsl.quantize_fp8(w, "block", None)
    w8_k, sw_k = quantize_fp8(w, "block")
    assert torch.equal(w8.view(torch.uint8), w8_k.view(torch.uint8)) and torch.equal(sw, sw_k)
    linear = torch.nn.Linear(400, 200, device="cuda", dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(linear, "block")
    rows = x.reshape(-1, 400)
    expected = torch.ops.flydsl.blockscale_gemm(
        q.reshape(-1, 400), layer.weight.t(), s, layer.weight_scale, layer.bias, None, None
    )
    assert torch.equal(layer(rows), expected) and torch.equal(layer(q.reshape(-1, 400), s), expected)
    assert _error(expected, linear(rows)) < 6e-2
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(rows), expected)
    graph, y = graphed(lambda: layer(rows))
    rows.copy_(torch.randn_like(rows))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, layer(rows))
