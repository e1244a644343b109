"""fp8_gemm on the GPU against a float64 reference of the dequantized inputs, on fresh random fp8 data spanning the
format's range (rows and columns of magnitudes 2^-6..2^6), into NaN-poisoned outputs: tails in M, N and K, both majors
of each operand, every scale granularity, e4m3 and e5m2, each output dtype, bias and activations, split K and the
small-M tiles; weights prepared by prepare_weight give the very bits plain ones do; NaN scales propagate; a call
captured in a CUDA graph replays on new values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm import GemmConfig, fp8_gemm, prepare_weight  # noqa: E402

_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_ACTIVATIONS = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


def _fp8(rows, cols, dtype=torch.float8_e4m3fn, major="K"):
    """Random fp8 values over much of the format's range: each row its own power-of-two magnitude. ``major`` "MN":
    the same matrix stored transposed (a column-major view)."""
    magnitude = 2.0 ** torch.randint(-6, 7, (rows, 1), device="cuda").float()
    x = (torch.randn(rows, cols, device="cuda") * magnitude).clamp(-_FP8_MAX[dtype], _FP8_MAX[dtype]).to(dtype)
    return x if major == "K" else x.t().contiguous().t()


def _scale(extent, granularity, shape):
    if granularity == "tensor":
        return torch.rand((), device="cuda") + 0.5
    return (torch.rand(extent, device="cuda") + 0.5).reshape(shape)


def _operands(m, n, k, a_major="K", b_major="K", b_dtype=torch.float8_e4m3fn):
    a = _fp8(m, k, major=a_major)
    w = _fp8(n, k, b_dtype)  # nn.Linear weights (N, K): b = w.t() is K-major
    b = w.t() if b_major == "K" else w.t().contiguous()
    return a, b


def _reference(a, b, scale_a, scale_b, bias=None, activation=None):
    sa = scale_a.double().reshape(-1, 1) if scale_a.numel() > 1 else scale_a.double().reshape(())
    sb = scale_b.double().reshape(1, -1) if scale_b.numel() > 1 else scale_b.double().reshape(())
    ref = (a.double() * sa) @ (b.double() * sb)
    if bias is not None:
        ref = ref + bias.double()
    return _ACTIVATIONS[activation](ref)


def _checked(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, bias=None, activation=None, config=None, tol=None):
    m, n = a.shape[0], b.shape[1]
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    result = fp8_gemm(a, b, scale_a, scale_b, out, config, bias=bias, activation=activation)
    assert result is out
    ref = _reference(a, b, scale_a, scale_b, bias, activation)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite outputs"
    error = ((out.double() - ref).norm() / ref.norm()).item()
    # bf16/fp16 outputs round each element (2^-9 / 2^-12 relative); fp32 ones keep the fp8 MMA's accumulation error.
    assert error < (tol or {torch.bfloat16: 8e-3, torch.float16: 2e-3, torch.float32: 2e-3}[out_dtype]), error
    return out


@pytest.mark.parametrize(
    "m,n,k",
    [
        (1000, 776, 528),
        (4104, 1160, 1040),
        (130, 264, 64),
        (64, 1536, 7168),
        (1, 4096, 4096),  # M <= 16: the skinny kernel
        (16, 7168, 2048),
        (9, 4104, 1040),
        (3, 2056, 4112),
        (16, 1000, 512),  # (it would split K: the warp-specialized kernel)
    ],
)
def test_fp8_gemm_per_token_and_channel(m, n, k):
    a, b = _operands(m, n, k)
    _checked(a, b, _scale(m, "row", (m, 1)), _scale(n, "column", (1, n)))


@pytest.mark.parametrize("a_per,b_per", [("tensor", "tensor"), ("row", "tensor"), ("tensor", "column")])
@pytest.mark.parametrize("shapes", ["2-D", "1-D"])
def test_fp8_gemm_every_granularity(a_per, b_per, shapes):
    m, n, k = 520, 392, 272
    a, b = _operands(m, n, k)
    scale_a = _scale(m, a_per, (m, 1) if shapes == "2-D" else (m,))
    scale_b = _scale(n, b_per, (1, n) if shapes == "2-D" else (n,))
    _checked(a, b, scale_a, scale_b)


@pytest.mark.parametrize("a_major,b_major", [("MN", "K"), ("K", "MN"), ("MN", "MN")])
def test_fp8_gemm_mn_major_operands(a_major, b_major):
    m, n, k = 1000, 776, 528
    a, b = _operands(m, n, k, a_major, b_major)
    _checked(a, b, _scale(m, "row", (m, 1)), _scale(n, "column", (1, n)))


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_fp8_gemm_output_dtypes(out_dtype):
    m, n, k = 1000, 776, 528
    a, b = _operands(m, n, k)
    shrink = 2.0**-10 if out_dtype == torch.float16 else 1.0  # products of 2^6-magnitude rows overflow fp16
    _checked(a, b, _scale(m, "row", (m, 1)) * shrink, _scale(n, "column", (1, n)), out_dtype)


def test_fp8_gemm_e4m3_by_e5m2():
    m, n, k = 1000, 776, 528
    a, b = _operands(m, n, k, b_dtype=torch.float8_e5m2)
    _checked(a, b, _scale(m, "row", (m, 1)), _scale(n, "column", (1, n)), tol=1.5e-2)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
def test_fp8_gemm_bias_and_activation(activation, bias_dtype):
    m, n, k = 520, 392, 272
    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m, 1)), _scale(n, "column", (1, n))
    bias = (torch.randn(n, device="cuda") * 100).to(bias_dtype)
    _checked(a, b, scale_a, scale_b, bias=bias, activation=activation)


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(tile_m=128, tile_n=128, tile_k=128, stages=6, split_k=3),
        GemmConfig(tile_m=64, tile_n=256, tile_k=128, stages=5, consumers=1, cluster_m=1),
        GemmConfig(tile_m=128, tile_n=256, tile_k=256, stages=2, cluster_m=1),
    ],
    ids=["split K", "64-row tiles", "K steps of 256"],
)
def test_fp8_gemm_configs(config):
    m, n, k = 1000, 776, 1040
    a, b = _operands(m, n, k)
    _checked(a, b, _scale(m, "row", (m, 1)), _scale(n, "column", (1, n)), config=config)


@pytest.mark.parametrize(
    "m,n,k,config",
    [
        (1, 4096, 4096, None),  # the skinny kernel
        (13, 1004, 2064, None),  # skinny, M > 8, a partial K panel
        (16, 1536, 7168, None),  # skinny in clusters of 2 CTAs splitting K
        (1, 1536, 7168, None),
        (1000, 776, 528, None),
        (4104, 1160, 1040, None),  # 2-CTA clusters: each loads half the B tile's rows
        (16, 1000, 512, None),  # split K in the warp-specialized kernel
        (520, 392, 272, GemmConfig(tile_m=128, tile_n=128, tile_k=256, stages=3)),  # 2 panels per K step
        (1000, 776, 1040, GemmConfig(tile_m=64, tile_n=256, tile_k=128, stages=5, consumers=1, cluster_m=1)),
    ],
)
def test_prepared_weights_give_the_bits_plain_ones_do(m, n, k, config):
    """The same products in the same order: bit for bit the plain weights' output, and right against the reference."""
    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m, 1)), _scale(n, "column", (1, n))
    plain = _checked(a, b, scale_a, scale_b, config=config)
    prepared = torch.full_like(plain, float("nan"))
    assert fp8_gemm(a, prepare_weight(b), scale_a, scale_b, prepared, config) is prepared
    torch.cuda.synchronize()
    assert torch.equal(prepared, plain)


@pytest.mark.parametrize("cluster_k", [2])
@pytest.mark.parametrize(
    "m,n,k", [(1, 1536, 7168), (16, 1536, 7168), (13, 1004, 2064), (5, 776, 1040), (1, 7168, 2048)]
)
def test_skinny_clusters_splitting_k(m, n, k, cluster_k):
    """SkinnyConfig.cluster_k: the CTAs of a cluster split each tile's K (K tails and empty parts included) and the
    first sums them through distributed shared memory."""
    import dataclasses

    from flydsl.kernels.gemm import Scale, choose_skinny_config, launch_plan
    from flydsl.kernels.gemm.operands import MatrixSpec
    from flydsl.kernels.gemm.plan import plan_skinny

    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m,)), _scale(n, "column", (n,))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = dataclasses.replace(choose_skinny_config(m, n, k // 2, sms, 1), splits=1, cluster_k=cluster_k)
    scales = ((Scale(rows=1), MatrixSpec.of(scale_a)), (Scale(columns=1), MatrixSpec.of(scale_b)))
    plan = plan_skinny(MatrixSpec.of(a), MatrixSpec.of(b), MatrixSpec.of(out), sms=sms, scales=scales, config=cfg)
    assert plan.launches[0].grid[0] == -(-n // cfg.rows) * cluster_k
    for _ in range(50):  # back to back (each a dependent launch of the one before)
        launch_plan(plan, a, b, out, None, (scale_a, scale_b))
    ref = _reference(a, b, scale_a, scale_b)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite outputs"
    assert ((out.double() - ref).norm() / ref.norm()).item() < 8e-3


def test_fp8_gemm_allocates_its_output():
    m, n, k = 130, 264, 64
    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m, 1)), _scale(n, "column", (1, n))
    for out_dtype in (None, torch.float32):
        out = fp8_gemm(a, b, scale_a, scale_b, out_dtype=out_dtype)
        assert out.dtype == (out_dtype or torch.bfloat16) and out.shape == (m, n)
        ref = _reference(a, b, scale_a, scale_b)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 8e-3


def test_nan_scales_propagate():
    """A NaN scale makes its row (or column) NaN, never zero; the rest stays right."""
    m, n, k = 256, 256, 256
    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m, 1)), _scale(n, "column", (1, n))
    scale_a[3] = float("nan")
    scale_b[0, 5] = float("inf")
    out = fp8_gemm(a, b, scale_a, scale_b)
    torch.cuda.synchronize()
    assert out[3].isnan().all()
    column = torch.cat([out[:3, 5], out[4:, 5]])
    assert (column.isinf() | column.isnan()).all()  # inf times a sum that is zero here and there is NaN
    rest = torch.ones(m, n, dtype=torch.bool, device="cuda")
    rest[3], rest[:, 5] = False, False
    ref = _reference(a, b, scale_a.nan_to_num(), scale_b.nan_to_num(posinf=1.0))
    assert ((out.double() - ref)[rest].norm() / ref[rest].norm()).item() < 8e-3


def test_fp8_gemm_replays_in_a_cuda_graph(graphed):
    m, n, k = 520, 4096, 1024
    a, b = _operands(m, n, k)
    scale_a, scale_b = _scale(m, "row", (m, 1)), _scale(n, "column", (1, n))
    graph, out = graphed(lambda: fp8_gemm(a, b, scale_a, scale_b))
    for _ in range(3):
        new_a, new_b = _operands(m, n, k)
        a.copy_(new_a)
        b.copy_(new_b)
        scale_a.copy_(_scale(m, "row", (m, 1)))
        graph.replay()
        torch.cuda.synchronize()
        ref = _reference(a, b, scale_a, scale_b)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 8e-3
