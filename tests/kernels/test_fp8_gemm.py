"""fp8_gemm without a GPU: its plans (K steps of 128, K-major operands, the scales in the epilogue), the PTX and SASS
of its kernel (the fp8 wgmma), and the argument checks, each error naming the argument."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import toolchain
from flydsl.kernels.gemm import GemmConfig, MatrixSpec, Scale, SkinnyConfig, choose_config, choose_fp8_config, plan_gemm
from flydsl.kernels.gemm.arguments import check_fp8_arguments

from .ptxas_report import spill_bytes

SMS = 132
E4M3, E5M2 = "f8E4M3FN", "f8E5M2"


def _fp8_specs(m, n, k, a_dtype=E4M3, b_dtype=E4M3, b_major="K", out="bf16"):
    a = MatrixSpec.dense((m, k), a_dtype)
    b = MatrixSpec.dense((n, k), b_dtype).transposed() if b_major == "K" else MatrixSpec.dense((k, n), b_dtype)
    return a, b, MatrixSpec.dense((m, n), out)


def _scales(m, n, a_per="row", b_per="column"):
    a = (Scale(rows=1), MatrixSpec.dense((m,), "f32")) if a_per == "row" else (Scale(), MatrixSpec.dense((1,), "f32"))
    b = (
        (Scale(columns=1), MatrixSpec.dense((n,), "f32"))
        if b_per == "column"
        else (Scale(), MatrixSpec.dense((1,), "f32"))
    )
    return a, b


def test_an_fp8_config_is_the_bf16_config_of_half_k_in_steps_of_128():
    """To the cost model an fp8 K is a bf16 K / 2: the same tiles, clusters and splits, K steps twice as long (the same
    bytes per stage, hence the same stages)."""
    for m, n, k in [(4096, 4096, 4096), (64, 7168, 2048), (8192, 28672, 8192), (512, 1536, 7168), (1, 4096, 4096)]:
        cfg, bf16 = choose_fp8_config(m, n, k, SMS), choose_config(m, n, -(-k // 2), SMS)
        assert cfg.tile_k == 128 and cfg == GemmConfig(**{**bf16.__dict__, "tile_k": 128})
        assert cfg.stage_bytes(1) == bf16.stage_bytes(2)


def test_fp8_plan_reads_k_major_operands_in_place():
    """nn.Linear weights (b = w.t()) and a row-major a: no copies; 128-element boxes along K; the two scales in the
    epilogue, the bf16 output through the TMA store."""
    m, n, k = 4096, 4096, 4096
    plan = plan_gemm(*_fp8_specs(m, n, k), sms=SMS, scales=_scales(m, n))
    assert plan.route == "gemm_ws_scaled" and plan.preparations == ()
    assert plan.config.tile_k == 128
    a_view, b_view = (argument.view for argument in plan.launches[0].arguments[:2])
    assert (a_view.major, a_view.box) == ("K", (128, 128))
    assert (b_view.major, b_view.box) == ("K", (plan.config.tile_n // plan.config.cluster_m, 128))
    assert plan.epilogue.scales == (Scale(rows=1), Scale(columns=1)) and plan.epilogue.store == "tma"


def test_fp8_plan_copies_mn_major_operands_k_major():
    """fp8 wgmma reads K-major operands only: a column-major a becomes a row-major copy, a row-major (K, N) b the
    transpose of a row-major (N, K) copy."""
    m, n, k = 1000, 776, 528
    a = MatrixSpec.dense((k, m), E4M3).transposed()
    _, b, out = _fp8_specs(m, n, k, b_major="MN")
    plan = plan_gemm(a, b, out, sms=SMS, scales=_scales(m, n, "tensor", "tensor"))
    assert [(p.role, p.steps) for p in plan.preparations] == [
        ("a", ("contiguous",)),
        ("b", ("transpose", "contiguous", "transpose")),
    ]
    assert plan.specs["a"].strides == (k, 1) and plan.specs["b"].strides == (1, k)
    assert all(argument.view.major == "K" for argument in plan.launches[0].arguments[:2])


def test_decode_sized_fp8_streams_the_weights():
    """M <= 16 with nn.Linear weights of one fp8 dtype takes the skinny kernel with its scales (mma.sync m16n8k32);
    where it would split K (few weight rows), mixed e4m3 x e5m2, or rows 16-byte loads cannot read: the
    warp-specialized kernel."""
    m, n, k = 16, 7168, 2048
    plan = plan_gemm(*_fp8_specs(m, n, k), sms=SMS, scales=_scales(m, n))
    assert plan.route == "skinny" and plan.launches[0].kernel.name == "skinny_gemm_scaled_kernel"
    assert plan.epilogue.scales == (Scale(rows=1), Scale(columns=1)) and plan.config.splits == 1
    assert plan_gemm(*_fp8_specs(8, 256, 4096), sms=SMS, scales=_scales(8, 256)).route == "gemm_ws_scaled"
    mixed = _fp8_specs(m, n, k, b_dtype=E5M2)
    assert plan_gemm(*mixed, sms=SMS, scales=_scales(m, n)).route == "gemm_ws_scaled"
    a, b, out = _fp8_specs(m, n, k)
    assert plan_gemm(a._replace(aligned=False), b, out, sms=SMS, scales=_scales(m, n)).route == "gemm_ws_scaled"


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_fp8_skinny_kernel_assembles_with_fp8_mma():
    m, n, k = 16, 7168, 2048
    (module,) = plan_gemm(*_fp8_specs(m, n, k), sms=SMS, scales=_scales(m, n)).lower()
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in module.ptx
    assert "ld.global.nc.L1::no_allocate.L2::256B.v4.b32" in module.ptx and ".version 8.4" in module.ptx
    assert spill_bytes(module.ptx) == 0


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_every_chosen_fp8_skinny_config_assembles_without_spills():
    """Issue 32's decode shapes (M 1 and 16 x its ten (N, K)): the skinny kernel with the chosen configuration, fp8
    MMAs, no spills."""
    shapes = [(4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (18432, 7168), (7168, 18432),
              (1536, 7168), (24576, 1536), (7168, 2048)]  # fmt: skip
    compiled = set()
    for m in (1, 16):
        for n, k in shapes:
            plan = plan_gemm(*_fp8_specs(m, n, k), sms=SMS, scales=_scales(m, n))
            assert plan.route == "skinny", (m, n, k)
            if (m > 8, plan.config) in compiled:
                continue
            compiled.add((m > 8, plan.config))
            (module,) = plan.lower()
            assert "m16n8k32.row.col.f32.e4m3.e4m3.f32" in module.ptx and spill_bytes(module.ptx) == 0, plan.config


def test_few_fp8_skinny_tiles_split_k_over_a_cluster():
    """fp8 rows at one to two tiles per SM (1536 x 7168: 192 tiles on 132 SMs) take clusters of 2 CTAs splitting each
    tile's K, summed through distributed shared memory: twice the CTAs on the grid, one launch."""
    for m in (1, 16):
        plan = plan_gemm(*_fp8_specs(m, 1536, 7168), sms=SMS, scales=_scales(m, 1536))
        assert plan.route == "skinny" and plan.config.cluster_k == 2 and len(plan.launches) == 1
        assert plan.launches[0].grid == (2 * 1536 // plan.config.rows, 1)
    for n, k in ((4096, 4096), (7168, 2048), (24576, 1536)):  # two or more tiles per SM: no cluster
        assert plan_gemm(*_fp8_specs(16, n, k), sms=SMS, scales=_scales(16, n)).config.cluster_k == 1
    with pytest.raises(ValueError, match="cluster_k must be 1 or 2"):
        SkinnyConfig(cluster_k=4)
    with pytest.raises(ValueError, match="cluster_k must be 1 or 2"):
        SkinnyConfig(cluster_k=2, splits=2)
    (module,) = plan_gemm(*_fp8_specs(16, 1536, 7168), sms=SMS, scales=_scales(16, 1536)).lower()
    ptx = module.ptx
    assert ".reqnctapercluster 2, 1, 1" in ptx and "st.shared::cluster" in ptx and "barrier.cluster.arrive" in ptx


def test_fp8_plan_refuses_short_k_steps():
    a, b, out = _fp8_specs(256, 256, 256)
    with pytest.raises(ValueError, match=r"K steps of 64 f8E4M3FN elements; expected a multiple of 128"):
        plan_gemm(a, b, out, sms=SMS, scales=_scales(256, 256), config=GemmConfig(tile_k=64))


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize(
    "m,n,k,b_dtype,out,granularity",
    [
        (4096, 4096, 4096, E4M3, "bf16", ("row", "column")),  # 128 x 256 tiles in 2-CTA clusters, the TMA store
        (64, 7168, 2048, E5M2, "f32", ("tensor", "tensor")),  # 64-row tiles, split K, e4m3 x e5m2, registers
    ],
)
def test_fp8_kernel_multiplies_with_fp8_wgmma(m, n, k, b_dtype, out, granularity):
    """The routed kernel's PTX issues m64nNk32 fp8 wgmmas (four per 128-element K step and 64 rows), assembles for
    sm_90a without spills or ptxas's performance notes, and its SASS multiplies with QGMMA (Hopper's warpgroup MMA
    on fp8; HGMMA is its 16-bit form) on E4M3 (and E5M2) operands."""
    plan = plan_gemm(*_fp8_specs(m, n, k, b_dtype=b_dtype, out=out), sms=SMS, scales=_scales(m, n, *granularity))
    (module,) = plan.lower()
    cfg, types = plan.config, "e4m3." + ("e4m3" if b_dtype == E4M3 else "e5m2")
    steps = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.tile_n}k32\.f32\.{types}", module.ptx)
    per_step = (cfg.consumer_rows // 64) * cfg.tile_k // 32
    assert steps and len(steps) % per_step == 0  # (LLVM may peel the first K step off the loop: twice as many)
    assert spill_bytes(module.ptx) == 0
    sass = toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    expected = "E4M3.E4M3" if b_dtype == E4M3 else "E4M3.E5M2"
    assert re.search(rf"QGMMA\.64x{cfg.tile_n}x32\.F32\.{expected}", sass), sorted(set(re.findall(r"\wGMMA\S*", sass)))


# --- argument checks (CPU tensors: shapes and dtypes only) ---------------------------------------------------------


def _tensors(torch, m=64, n=32, k=48):
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(n, k).to(torch.float8_e4m3fn).t()
    return a, b, torch.ones(m, 1), torch.ones(1, n)


def test_fp8_arguments_give_each_scale_its_granularity():
    torch = pytest.importorskip("torch")
    a, b, scale_a, scale_b = _tensors(torch)
    check = lambda sa, sb: check_fp8_arguments("fp8_gemm", a, b, sa, sb, None, None, None)[3:]  # noqa: E731
    assert check(scale_a, scale_b) == ("row", "column")
    assert check(scale_a.reshape(-1), scale_b.reshape(-1)) == ("row", "column")
    assert check(torch.tensor(2.0), torch.ones(1)) == ("tensor", "tensor")
    assert check(torch.ones(1, 1), torch.ones(())) == ("tensor", "tensor")


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(a="bf16"), r"fp8_gemm: a: expected dtype float8_e4m3fn or float8_e5m2, got bfloat16"),
        (dict(k=40), r"fp8_gemm: a: K = 40: expected a multiple of 16"),
        (
            dict(scale_a="wrong rows"),
            r"fp8_gemm: scale_a: expected one float32 scale .* or one per row \(64,\) or \(64, 1\), got shape \(32,\)",
        ),
        (
            dict(scale_b="column vector"),
            r"fp8_gemm: scale_b: expected .* per column \(32,\) or \(1, 32\), got shape \(32, 1\)",
        ),
        (dict(scale_a="half"), r"fp8_gemm: scale_a: expected dtype float32, got float16"),
        (dict(scale_a="strided"), r"fp8_gemm: scale_a: expected contiguous scales, got strides \(2,\)"),
        (dict(bias="bad"), r"fp8_gemm: bias: expected a \(32,\) vector"),
        (dict(out="f8"), r"fp8_gemm: out: expected dtype bfloat16, float16 or float32, got float8_e4m3fn"),
    ],
)
def test_fp8_arguments_are_refused_naming_the_argument(change, message):
    torch = pytest.importorskip("torch")
    m, n, k = 64, 32, change.get("k", 48)
    a, b, scale_a, scale_b = _tensors(torch, m, n, k)
    out = bias = None
    if change.get("a") == "bf16":
        a = a.bfloat16()
    scale_a = {
        "wrong rows": torch.ones(n),
        "half": scale_a.half(),
        "strided": torch.ones(2 * m)[::2],
    }.get(change.get("scale_a"), scale_a)
    if change.get("scale_b"):
        scale_b = torch.ones(n, 1)
    if change.get("bias"):
        bias = torch.ones(n + 1)
    if change.get("out"):
        out = torch.zeros(m, n).to(torch.float8_e4m3fn)
    with pytest.raises((TypeError, ValueError), match=message):
        check_fp8_arguments("fp8_gemm", a, b, scale_a, scale_b, out, bias, None)


def test_fp8_gemm_wants_cuda_tensors_first():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import fp8_gemm

    a, b, scale_a, scale_b = _tensors(torch)
    with pytest.raises(ValueError, match=r"flydsl.kernels.fp8_gemm: a: expected a CUDA tensor, got one on cpu"):
        fp8_gemm(a, b, scale_a, scale_b)
