"""blockscale_gemm on the GPU against a float64 reference of the dequantized operands, on fresh random fp8 data with
per-block scales spanning 2^-10..2^10, into NaN-poisoned outputs: M and N tails, K a multiple of 16 with a partial last
block and block counts of every residue mod 4 (where cuBLAS's blockwise path was reported wrong), both layouts of
a_scales, UE8M0 scales, split K, stream-K and small tiles, bias and activations, output dtypes, prepared weights (the
very bits of plain ones) and NaN scales propagating."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.gemm import GemmConfig, blockscale_gemm, prepare_weight  # noqa: E402

_ACTIVATIONS = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu}


def _operands(m, n, k, dtype=torch.float8_e4m3fn):
    """a (M, K) and nn.Linear weights w (N, K), fp8 over much of e4m3's range, and their block scales (M, K / 128) and
    (N / 128, K / 128), powers of two spanning 2^-10..2^10 times a factor in [0.5, 1.5)."""
    blocks = -(-k // 128)
    a = (torch.randn(m, k, device="cuda") * 16).clamp(-448, 448).to(dtype)
    w = (torch.randn(n, k, device="cuda") * 16).clamp(-448, 448).to(dtype)

    def scales(shape):
        return 2.0 ** torch.randint(-10, 11, shape, device="cuda").float() * (torch.rand(shape, device="cuda") + 0.5)

    return a, w, scales((m, blocks)), scales((-(-n // 128), blocks))


def _reference(a, w, a_scales, w_scales, bias=None, activation=None):
    m, k = a.shape
    n = w.shape[0]
    sa = a_scales.double().repeat_interleave(128, dim=1)[:, :k]
    sw = w_scales.double().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    a_deq, w_deq = a.double() * sa, w.double() * sw
    ref = a_deq @ w_deq.t()
    if bias is not None:
        ref = ref + bias.double()
    return _ACTIVATIONS[activation](ref), a_deq.abs() @ w_deq.abs().t()


def _m_major(scales):
    """The same scales M-major, as quantize_fp8(x, "group") writes them: a (K / 128, M padded to 4) buffer's view."""
    m, blocks = scales.shape
    buffer = torch.empty(blocks, -(-m // 4) * 4, device="cuda")
    buffer[:, :m] = scales.t()
    return buffer[:, :m].t()


def _checked(a, w, a_scales, w_scales, out_dtype=torch.bfloat16, bias=None, activation=None, config=None, b=None):
    m, n = a.shape[0], w.shape[0]
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    b = w.t() if b is None else b
    result = blockscale_gemm(a, b, a_scales, w_scales, out, config, bias=bias, activation=activation)
    assert result is out
    ref, magnitude = _reference(a, w, a_scales.float(), w_scales.float(), bias, activation)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite outputs"
    # Each element within its output dtype's rounding and the error of its terms' magnitudes that the tensor cores'
    # fp8 accumulation (about 13-14 bits: 2^-12 measured too tight at fp32 output) leaves in each block's sum.
    rounding = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-20}[out_dtype]
    smallest = 2.0**-24 if out_dtype == torch.float16 else 1e-30  # fp16's subnormal spacing
    bound = ref.abs() * rounding + magnitude * 2.0**-11 + smallest
    excess = ((out.double() - ref).abs() / bound).max().item()
    assert excess <= 1.0, excess
    return out


@pytest.mark.parametrize(
    "m,n,k",
    [
        (256, 512, 1024),
        (1000, 776, 528),  # K = 4 blocks and a partial one of 16
        (130, 264, 16 * 37),  # 5 blocks, the last of 80
        (64, 2112, 7168),
        (1, 128, 128),
        (17, 136, 144),
        (4104, 1160, 1040),
        (512, 4096, 128 * 6),  # block counts 6, 7, 9: (K / 128) % 4 != 0
        (512, 4096, 128 * 7),
        (512, 4096, 128 * 9),
    ],
)
@pytest.mark.parametrize("layout", ["row-major", "M-major"])
def test_blockscale_gemm_shapes(m, n, k, layout):
    a, w, a_scales, w_scales = _operands(m, n, k)
    _checked(a, w, _m_major(a_scales) if layout == "M-major" else a_scales, w_scales)


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(tile_m=128, tile_n=128, tile_k=128, stages=6, split_k=3),
        GemmConfig(tile_m=64, tile_n=128, tile_k=128, stages=8, consumers=1, cluster_m=1),
        GemmConfig(tile_m=128, tile_n=64, tile_k=128, stages=8, cluster_m=1),
        GemmConfig(tile_m=128, tile_n=128, tile_k=128, stages=6, cluster_m=1, stream_k=True),
        GemmConfig(tile_m=128, tile_n=192, tile_k=128, stages=5, store_boxes=1),
        GemmConfig(tile_m=128, tile_n=192, tile_k=128, stages=5, cluster_m=1, split_k=2),
        GemmConfig(tile_m=64, tile_n=192, tile_k=128, stages=6, consumers=1, cluster_m=1),
        GemmConfig(tile_m=128, tile_n=192, tile_k=128, stages=5, cluster_m=1, stream_k=True),
        GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=4, cluster_m=1, cluster_n=2, store_boxes=1),
        GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=4, cluster_m=2, store_boxes=1),
        GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=4, cluster_m=1, split_k=2, store_boxes=1),
        GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=3, cluster_m=1, cluster_n=2, store_boxes=4),
        GemmConfig(tile_m=64, tile_n=64, tile_k=128, stages=13, consumers=1, cluster_m=1, store_boxes=1),
        GemmConfig(tile_m=64, tile_n=32, tile_k=128, stages=16, consumers=1, cluster_m=1, store_boxes=1),
    ],
    ids=[
        "split K",
        "64-row tiles",
        "64-wide tiles",
        "stream-K",
        "192-wide",
        "192-wide split K",
        "64x192",
        "192 stream-K",
        "256-row waves, clusters along N",
        "256-row waves, clusters along M",
        "256-row waves split K",
        "256-row waves, tile staged whole",
        "64x64, 13 stages, one box",
        "64x32, 16 stages, one box",
    ],
)
def test_blockscale_gemm_configs(config):
    a, w, a_scales, w_scales = _operands(1000, 776, 1040)
    _checked(a, w, a_scales, w_scales, config=config)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_blockscale_gemm_output_dtypes(out_dtype):
    a, w, a_scales, w_scales = _operands(520, 392, 272)
    shrink = 2.0**-12 if out_dtype == torch.float16 else 1.0
    _checked(a, w, a_scales * shrink, w_scales * shrink, out_dtype)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_blockscale_gemm_bias_and_activation(activation):
    a, w, a_scales, w_scales = _operands(520, 392, 272)
    bias = torch.randn(392, device="cuda") * 1000
    _checked(a, w, a_scales, w_scales, bias=bias, activation=activation)


def test_blockscale_gemm_e5m2():
    a, w, a_scales, w_scales = _operands(520, 392, 272, torch.float8_e5m2)
    _checked(a, w, a_scales, w_scales)


def test_blockscale_gemm_ue8m0_scales():
    a, w, a_scales, w_scales = _operands(520, 392, 400)
    powers = [torch.exp2(torch.round(torch.log2(s))).to(torch.float8_e8m0fnu) for s in (a_scales, w_scales)]
    _checked(a, w, *powers)


def test_blockscale_gemm_prepared_weights_same_bits():
    a, w, a_scales, w_scales = _operands(1000, 776, 1040)
    plain = _checked(a, w, a_scales, w_scales)
    prepared = _checked(a, w, a_scales, w_scales, b=prepare_weight(w.t()))
    assert torch.equal(plain, prepared)


def test_blockscale_gemm_nan_scale_propagates():
    a, w, a_scales, w_scales = _operands(256, 256, 512)
    a_scales[3, 1] = float("nan")
    out = blockscale_gemm(a, w.t(), a_scales, w_scales)
    torch.cuda.synchronize()
    assert out[3].isnan().all() and not out[4].isnan().any()
