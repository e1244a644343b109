"""flydsl.kernels.gemm's weight-streaming GEMM for M <= 16 (skinny_gemm). CPU: PTX with mma.sync and cache-hinted
16-byte loads that assembles for sm_90a (aligned and unaligned K, split K); the configuration's checks and the
properties of its choice (every chosen configuration assembles without spills). GPU
(``gpu``): against a float64 reference on fresh random data with the output poisoned (NaN): M in {1, 3, 8, 16},
odd N and K, bf16/fp16 inputs, fp32/bf16/fp16 outputs, bias and each activation, split K; argument errors raised
before launch, each naming its argument.

Tolerance: |ours - ref| <= atol + rtol * |ref| with rtol = 1e-2 and atol = 1e-2 * sqrt(K) * (scale of the
terms) for fp32 outputs (the fp32 sums differ from the float64 reference by order sqrt(K) * 2^-24 * terms, and
the inputs are exact in both); one output rounding (bf16: 2^-8, fp16: 2^-11 relative) on top for 16-bit outputs.
"""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm import Epilogue, SkinnyConfig, choose_skinny_config, skinny_gemm, skinny_gemm_kernel
from flydsl.kernels.gemm.skinny import SkinnyVariant

from .ptxas_report import spill_bytes


def _variant(vec, has_bias, activation, two_halves):
    return SkinnyVariant(vec, Epilogue(bias=has_bias, activation=activation), two_halves)


def _lower(m, n, k, cfg, spec, out="bf16", dtype="bf16"):
    out_spec = flyc.TensorSpec((cfg.splits * m if cfg.splits > 1 else m, n), "f32" if cfg.splits > 1 else out)
    return skinny_gemm_kernel.lower(
        flyc.TensorSpec((m, k), dtype),
        flyc.TensorSpec((n, k), dtype),
        out_spec,
        flyc.TensorSpec((n,), "f32"),
        cfg,
        _variant(*spec),
    )


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_lowers_to_mma_sync_and_streaming_loads(dtype):
    cfg = SkinnyConfig(groups=4, warps=8, unroll=2, pipelined=False, prefetch=None)
    compiled = _lower(16, 4096, 4096, cfg, (True, True, "gelu", True), dtype=dtype)
    ptx = compiled.ptx
    # The main step and the K-tail step: unroll x 2 k16 halves x groups MMAs each.
    assert len(re.findall(rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{dtype}\.{dtype}\.f32", ptx)) == 2 * 16
    # Weights stream past L1: groups x unroll 16-byte loads per step; activations: 2 rows x unroll.
    assert ptx.count("ld.global.nc.L1::no_allocate.v4.b32") == 2 * 8
    assert len(re.findall(r"ld\.global\.nc\.v4\.b32", ptx)) == 2 * 4
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_pipelined_steps_lower():
    # Double-buffered: the loop body, the last full step after it, the K-tail step: 3 x (unroll x 2 x groups) MMAs.
    cfg = SkinnyConfig()  # the default: groups 2, unroll 4, pipelined, 256-byte L2 prefetches
    compiled = _lower(16, 4096, 4096, cfg, (True, False, "silu", True))
    assert compiled.ptx.count("mma.sync.aligned.m16n8k16") == 3 * 16
    assert compiled.ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == 3 * 8
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None
    sass = flyc.toolchain.disassemble_cubin(compiled.cubin) if compiled.cubin is not None else None
    if sass is not None:  # with nvdisasm (pip install nvidia-cuda-nvdisasm): tensor-core MMAs, no local memory
        assert "HMMA.16816.F32.BF16" in sass
        assert "STL" not in sass and "LDL" not in sass


def test_warps_side_by_side_lower():
    # 2 warps along N x 4 along K: the reduction sums 4 partials per output (3 adds), the loop is unchanged.
    cfg = SkinnyConfig(groups=2, warps=8, unroll=4, pipelined=True, warps_n=2, prefetch=256, min_blocks=2)
    compiled = _lower(16, 4096, 4096, cfg, (True, True, None, True))
    assert compiled.ptx.count("mma.sync.aligned.m16n8k16") == 3 * 16
    assert compiled.ptx.count("ld.global.nc.L1::no_allocate.L2::256B.v4.b32") == 3 * 8
    assert ".minnctapersm 2" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_small_m_skips_the_upper_rows():
    compiled = _lower(8, 1000, 1024, SkinnyConfig(pipelined=False), (True, False, None, False))
    assert len(re.findall(r"ld\.global\.nc\.v4\.b32", compiled.ptx)) == 2 * 4  # row q only: one A load per chunk
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_unaligned_k_and_split_k_lower():
    # K % 8 != 0: element loads, no 16-byte vectors; split K: fp32 partials, no epilogue.
    compiled = _lower(3, 1000, 1000, SkinnyConfig(splits=4), (False, False, None, False))
    assert "ld.global.nc" not in compiled.ptx and "mma.sync.aligned.m16n8k16" in compiled.ptx
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


def test_dependent_launch_order():
    """The kernel is a dependent launch: the trigger first, then the wait before every load."""
    weight_load = "ld.global.nc.L1::no_allocate.L2::256B.v4.b32"
    compiled = _lower(16, 4096, 4096, SkinnyConfig(), (True, False, None, True))
    ptx = compiled.ptx
    trigger, wait = ptx.index("griddepcontrol.launch_dependents;"), ptx.index("griddepcontrol.wait;")
    assert trigger < wait and ptx.count(weight_load) == 3 * 8 and "ld.global" not in ptx[:wait]
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None
    assert skinny_gemm_kernel.attributes.dependent_launch


def test_config_checks():
    with pytest.raises(ValueError, match="groups 1/2/4/8"):
        SkinnyConfig(groups=3)
    with pytest.raises(ValueError, match="splits must be an int"):
        SkinnyConfig(splits=0)
    with pytest.raises(ValueError, match="warps_n must be 1, 2 or 4"):
        SkinnyConfig(warps=2, warps_n=4)
    with pytest.raises(TypeError):
        SkinnyConfig(2, 8)  # keyword-only
    cfg = SkinnyConfig(groups=2, warps=8, unroll=4, warps_n=2)
    assert (cfg.rows, cfg.warps_k, cfg.step) == (32, 4, 512)
    with pytest.raises(ValueError, match="skinny_gemm_kernel: expected an epilogue without scales"):
        variant = SkinnyVariant(True, Epilogue(store="tma"), False)
        skinny_gemm_kernel.lower(
            *(flyc.TensorSpec(s, "bf16") for s in ((4, 64), (32, 64), (4, 32), (32,))), cfg, variant
        )


SKINNY_SHAPES = [
    (m, n, k)
    for m in (1, 5, 8, 9, 16)
    for n, k in [(4096, 4096), (14336, 4096), (4096, 14336), (1536, 7168), (512, 7168), (28672, 8192), (776, 520)]
]


def test_choose_skinny_config_fills_the_sms():
    """For every shape: K split (in powers of two, at most 16) only while fewer than half the SMs would have a CTA
    and K has a whole step for each split, and split until one of those stops it."""
    for m, n, k in SKINNY_SHAPES:
        cfg = choose_skinny_config(m, n, k, 132)
        ctas = -(-n // cfg.rows)
        assert cfg.splits in (1, 2, 4, 8, 16)
        assert ctas * cfg.splits >= 132 // 2 or 2 * cfg.splits * cfg.step > k or cfg.splits == 16
        if cfg.splits > 1:
            assert ctas * cfg.splits // 2 < 132 // 2 and cfg.splits * cfg.step <= k
        else:
            assert ctas >= 132 // 2 or 2 * cfg.step > k


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_every_chosen_config_assembles_without_spills():
    """Each configuration choose_skinny_config picks, with the variants gemm() gives it (16-byte loads, one or two
    activation halves, an epilogue), assembles for sm_90a without spills (and without ptxas's performance notes:
    they are errors in the tests)."""
    compiled = set()
    for m, n, k in SKINNY_SHAPES:
        cfg = choose_skinny_config(m, n, k, 132)
        for spec in ((True, False, None, m > 8), (True, True, "gelu", m > 8)):
            if (cfg, spec) in compiled:
                continue
            compiled.add((cfg, spec))
            module = _lower(m, n, k, cfg, spec)
            assert module.cubin is not None and spill_bytes(module.ptx) == 0, (cfg, spec)


# --- GPU ---------------------------------------------------------------------------------------------------------


def _reference(a, b, bias, activation):
    import torch

    ref = a.double() @ b.double()
    if bias is not None:
        ref = ref + bias.double()
    if activation == "relu":
        ref = torch.relu(ref)
    elif activation == "gelu":
        ref = torch.nn.functional.gelu(ref)
    elif activation == "silu":
        ref = torch.nn.functional.silu(ref)
    return ref


def _check(m, n, k, dtype, out_dtype, bias_dtype=None, activation=None, config=None, a_major="row"):
    import torch

    torch.manual_seed(m * 7919 + n * 31 + k)
    a = torch.randn(m, k, device="cuda").to(dtype)
    if a_major == "col":
        a = a.t().contiguous().t()
    w = torch.randn(n, k, device="cuda").to(dtype)
    b = w.t()  # nn.Linear weights
    bias = None if bias_dtype is None else torch.randn(n, device="cuda").to(bias_dtype)
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    result = skinny_gemm(a, b, out, config, bias=bias, activation=activation)
    assert result is out
    ref = _reference(a, b, bias, activation)
    rounding = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out_dtype]
    tolerance = 1e-2 * k**0.5 / 8 + (1e-2 + rounding) * ref.abs()
    error = (out.double() - ref).abs()
    assert not torch.isnan(out).any()
    assert (error <= tolerance).all(), f"max error {error.max().item()} at {divmod(error.argmax().item(), n)}"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("n,k", [(1000, 1000), (8, 8), (4104, 4096 + 24), (4096, 4096), (1001, 1003), (3, 13)])
def test_shapes(m, n, k):
    import torch

    _check(m, n, k, torch.bfloat16, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
def test_dtypes(dtype, out_dtype):
    import torch

    _check(16, 1000, 1000, getattr(torch, dtype), getattr(torch, out_dtype))
    _check(5, 2056, 4096, getattr(torch, dtype), getattr(torch, out_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("bias_dtype", [None, "float32", "same"])
def test_epilogues(activation, bias_dtype):
    import torch

    bias = {None: None, "float32": torch.float32, "same": torch.bfloat16}[bias_dtype]
    _check(16, 1000, 1000, torch.bfloat16, torch.bfloat16, bias, activation)
    _check(2, 4104, 4096, torch.bfloat16, torch.float32, bias, activation)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize(
    "groups,unroll,pipelined,warps_n",
    [(1, 1, False, 1), (4, 2, False, 1), (8, 4, False, 4), (2, 4, True, 1), (1, 8, True, 2), (2, 4, True, 2),
     (4, 2, True, 2), (8, 1, True, 1)],  # fmt: skip
)
def test_configs_and_split_k(splits, groups, unroll, pipelined, warps_n):
    import torch

    cfg = SkinnyConfig(groups=groups, unroll=unroll, splits=splits, pipelined=pipelined, warps_n=warps_n, prefetch=None)
    _check(16, 1000, 4096 + 8, torch.bfloat16, torch.float32, torch.float32, "silu", cfg)
    _check(7, 1536, 7168, torch.float16, torch.float16, None, None, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_chained_layers_launched_as_dependents(m):
    """Layers back to back with no synchronization, each reading the output of the previous (which lets it start
    early): each output poisoned with NaN beforehand and checked against its input as written."""
    import torch

    torch.manual_seed(5)
    width, layers = 4096, 12
    weights = [(torch.randn(width, width, device="cuda") / width**0.5).bfloat16() for _ in range(layers)]
    x = torch.randn(m, width, device="cuda").bfloat16()
    outs = [torch.full((m, width), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
    for layer in range(layers):
        skinny_gemm(outs[layer - 1] if layer else x, weights[layer].t(), outs[layer])
    torch.cuda.synchronize()
    for layer in range(layers):
        source = outs[layer - 1] if layer else x
        ref = source.double() @ weights[layer].double().t()
        error = (outs[layer].double() - ref).abs()
        assert not torch.isnan(outs[layer]).any(), layer
        assert (error <= 1e-2 + (1e-2 + 2.0**-8) * ref.abs()).all(), (layer, error.max().item())


@pytest.mark.gpu
def test_large_and_column_major_a():
    import torch

    _check(16, 1000, 1000, torch.bfloat16, torch.float32, a_major="col")
    # N * K > 2^31 elements: 64-bit offsets (4 GiB of weights would not fit everyone's budget: 2^31 + a bit).
    n, k = 131080, 16384
    if torch.cuda.mem_get_info()[0] < 3 * n * k * 2:
        pytest.skip("not enough free GPU memory")
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((4, n), float("nan"), device="cuda")
    skinny_gemm(a, w.t(), out)
    tail = slice(n - 300, n)  # rows past 2^31 / K
    ref = a.double() @ w[tail].double().t()
    assert ((out[:, tail].double() - ref).abs() <= 1e-2 * k**0.5 / 8 + 1e-2 * ref.abs()).all()


def test_argument_errors_name_the_argument():
    # The device first (CPU tensors refused by name), then the rest, reached on CPU tensors through check_skinny.
    torch = pytest.importorskip("torch")
    a = torch.randn(16, 64, dtype=torch.bfloat16)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    from flydsl.kernels.gemm.arguments import check_skinny

    with pytest.raises(ValueError, match="flydsl.kernels.skinny_gemm: a: expected a CUDA tensor, got one on cpu"):
        skinny_gemm(a, w.t())

    def check(a, b, out=None, bias=None, activation=None):
        return check_skinny("flydsl.kernels.skinny_gemm", a, b, out, bias, activation)

    with pytest.raises(ValueError, match="skinny_gemm: a: expected at most 16 rows"):
        check(torch.randn(17, 64, dtype=torch.bfloat16), w.t())
    with pytest.raises(ValueError, match="skinny_gemm: b: expected a column-major"):
        check(a, w.t().contiguous())
    with pytest.raises(ValueError, match="skinny_gemm: a: expected a 2-D matrix"):
        check(a[0], w.t())
    with pytest.raises(TypeError, match="skinny_gemm: b: expected dtype bfloat16 or float16"):
        check(a, w.t().float())
    with pytest.raises(TypeError, match=r"skinny_gemm: b: expected dtype bfloat16 \(a's\)"):
        check(a, w.t().half())
    with pytest.raises(ValueError, match=r"skinny_gemm: b: expected 32 rows"):
        check(a[:, :32], w.t())
    with pytest.raises(ValueError, match="skinny_gemm: out: expected a row-major"):
        check(a, w.t(), torch.empty(32, 16))
    with pytest.raises(ValueError, match="skinny_gemm: bias"):
        check(a, w.t(), bias=torch.randn(31))
    with pytest.raises(ValueError, match="skinny_gemm: activation"):
        check(a, w.t(), activation="tanh")


@pytest.mark.gpu
def test_empty_products():
    import torch

    a = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    out = skinny_gemm(a[:, :0], w.t()[:0], bias=torch.ones(32, device="cuda"), activation="relu")
    assert (out == 1).all()
    assert skinny_gemm(a[:0], w.t()).shape == (0, 32)
