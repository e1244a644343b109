"""blockscale_gemm without a GPU: its plans (the block-scaled warp-specialized kernel, tiles at most 128 wide, the
scales' layouts), the PTX and SASS of its kernel (fp8 wgmma into fresh accumulators per K block, FMAs promoting them,
no spills) and the argument checks, each error naming the argument."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import toolchain
from flydsl.kernels.gemm import GemmConfig, MatrixSpec, choose_blockscale_config, mainloop, plan_blockscale
from flydsl.kernels.gemm.arguments import check_blockscale_arguments
from flydsl.kernels.gemm.block_scales import tile_takes_blocks
from flydsl.kernels.gemm.operands import TmaView
from flydsl.kernels.gemm.plan import Preparation, Tma

from .ptxas_report import spill_bytes

SMS = 132
E4M3 = "f8E4M3FN"


def _specs(m, n, k, a_layout="M-major", out="bf16"):
    blocks = -(-k // 128)
    a = MatrixSpec.dense((m, k), E4M3)
    b = MatrixSpec.dense((n, k), E4M3).transposed()
    a_scales = MatrixSpec.dense((blocks, m), "f32").transposed() if a_layout == "M-major" else None
    a_scales = a_scales or MatrixSpec.dense((m, blocks), "f32")
    return a, b, MatrixSpec.dense((m, n), out), a_scales, MatrixSpec.dense((-(-n // 128), blocks), "f32")


@pytest.mark.parametrize(
    "m,n,k", [(4096, 7168, 16384), (64, 2112, 7168), (128, 24576, 1536), (8192, 32768, 512), (1, 128, 144)]
)
def test_blockscale_configs_take_one_scale_block_per_step_and_tile(m, n, k):
    cfg = choose_blockscale_config(m, n, k, SMS)
    assert cfg.tile_k == 128 and tile_takes_blocks(cfg.tile_n) and cfg.schedule == "cooperative"
    plan = plan_blockscale(*_specs(m, n, k), sms=SMS)
    assert plan.route == "gemm_ws_blockscaled" and plan.config == cfg and not plan.epilogue.scales


@pytest.mark.parametrize(
    "m,n,k,width",
    [(512, 18432, 7168, 192), (2048, 7168, 2048, 192), (2048, 7168, 16384, 192), (8192, 2112, 7168, 192)]
    + [(512, 4096, 7168, 128), (4096, 2112, 7168, 128)],
)
def test_blockscale_tiles_go_192_wide_where_fewer_waves_pay_for_them(m, n, k, width):
    """192-wide tiles where their waves, 1.5 times as long less the wider tile's gain, take less time than the 128-wide
    tiles' and than 256 x 128 tiles' (as measured on an H100, docs/tuning/blockscale.md#wide-tiles, #unrolled), and
    never with a split K."""
    cfg = choose_blockscale_config(m, n, k, SMS)
    assert cfg.tile_m == 128 and cfg.tile_n == width and (width == 128 or cfg.split_k == 1)
    assert cfg.stages == (5 if width == 192 else 6)


@pytest.mark.parametrize(
    "m,n,k,tall",
    [(4096, 7168, 16384, True), (4096, 4096, 7168, True), (8192, 32768, 512, True), (2048, 4096, 7168, True)]
    + [(512, 7168, 16384, True), (512, 32768, 512, True), (4096, 18432, 7168, True)]
    + [(4096, 2112, 7168, False), (2048, 7168, 2048, False), (512, 4096, 7168, False), (256, 7168, 16384, False)],
)
def test_blockscale_tiles_go_256_rows_where_their_waves_pay(m, n, k, tall):
    """256 x 128 tiles in 2-CTA clusters along N (DeepGEMM's) where the waves model, each such tile's time per element
    1/1.12 of a 128 x 128 tile's, has them faster than the 128-row choice, from M 512 (fitted at M 512-8192 on an
    H100, docs/tuning/blockscale.md#unrolled)."""
    cfg = choose_blockscale_config(m, n, k, SMS)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == (
        (256, 128, 1, 2) if tall else (128, cfg.tile_n, 2, 1)
    )
    assert not tall or (cfg.split_k == 1 and cfg.stages == 4)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_192_wide_tiles_promote_step_by_step_with_the_consumers_offset():
    """Each step's wgmmas (four k32 instructions, each m64n192) waited for at once, ``WIDE_UNROLL`` steps per loop
    iteration (the count's remainder first, a step at a time), no spills, and the consumers' one-step offset: named
    barrier 3, the first consumer arriving (bar.arrive) and the second waiting (bar.sync) for all 256 threads;
    128-wide tiles (pairs) take no offset."""
    plan = plan_blockscale(*_specs(2048, 7168, 2048), sms=SMS)
    assert plan.config.tile_n == 192
    (module,) = plan.lower()
    steps = mainloop.WIDE_UNROLL + (mainloop.WIDE_UNROLL > 1)  # the loop's steps and the remainder's
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n192k32", module.ptx)) == 4 * steps
    assert re.search(r"bar\.arrive (%r\d+|3), 256;", module.ptx)
    assert re.search(r"bar\.sync \t(%r\d+|3), 256;", module.ptx)
    assert spill_bytes(module.ptx) == 0
    (paired,) = plan_blockscale(*_specs(512, 4096, 7168), sms=SMS).lower()
    assert "bar.arrive" not in paired.ptx


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("unroll", [2, 4])
def test_256_row_tiles_promote_each_consumer_block_in_turn(unroll, monkeypatch):
    """256 x 128 tiles (DeepGEMM's waves of 64 rows): per K step each consumer issues one 64-row block's four
    m64n128k32 wgmmas, waits for them and promotes them before the next block's, so both blocks' MMAs write the same
    parts registers and the sums of 128 rows fit beside them without spills; the consumers start a block apart.
    ``unroll`` K steps per loop iteration (the count's remainder first, a step at a time): the remainder's step and
    the loop's in the code."""
    monkeypatch.setattr(mainloop, "WAVES_UNROLL", unroll)  # a declared tunable: in the kernel's cache key
    cfg = GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=4, cluster_m=1, cluster_n=2, store_boxes=1)
    (module,) = plan_blockscale(*_specs(4096, 7168, 16384), sms=SMS, config=cfg).lower()
    steps = 1 + unroll  # the remainder's step and the loop's
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32", module.ptx)) == 8 * steps
    assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+0;", module.ptx)) >= 2
    assert re.search(r"bar\.arrive (%r\d+|3), 256;", module.ptx)
    assert spill_bytes(module.ptx) == 0
    sass = toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    first = re.findall(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[\w+\], RZ, !UPT", sass)
    assert len(first) == 2 * steps and len(set(first)) == 1  # each block's first MMA into the same registers


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_256_row_tiles_staged_whole():
    """Four staging boxes per consumer (3 stages beside them, as DeepGEMM's 256 x 128 kernel keeps its whole output
    tile): each consumer's four 64 x 64 parts go out through their own boxes, none waiting for another's store."""
    cfg = GemmConfig(tile_m=256, tile_n=128, tile_k=128, stages=3, cluster_m=1, cluster_n=2, store_boxes=4)
    (module,) = plan_blockscale(*_specs(4096, 7168, 16384), sms=SMS, config=cfg).lower()
    waits = re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+);", module.ptx)
    assert waits == ["3"] * 4
    assert module.ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 4
    assert spill_bytes(module.ptx) == 0


def test_blockscale_straddling_tiles_only_in_dense_gemms():
    assert tile_takes_blocks(192) and not tile_takes_blocks(192, grouped=True) and not tile_takes_blocks(192, 2)
    assert tile_takes_blocks(128, 2) and not tile_takes_blocks(256) and not tile_takes_blocks(96)
    assert tile_takes_blocks(128, consumer_rows=128) and not tile_takes_blocks(192, consumer_rows=128)


def test_blockscale_plan_loads_m_major_a_scales_in_place_by_tma():
    """M-major A scales with 16-byte aligned columns (quantize_fp8's) are read as they are, a box of tile_m floats
    of one K block per step; B scales as they are."""
    a, b, out, a_scales, b_scales = _specs(1000, 776, 1040)
    plan = plan_blockscale(a, b, out, a_scales, b_scales, sms=SMS)
    assert plan.specs["scale_0"] == a_scales and plan.specs["scale_1"] == b_scales and not plan.preparations
    (view,) = [arg.view for arg in plan.launches[0].arguments if isinstance(arg, Tma) and arg.role == "scale_0"]
    assert view == TmaView((9, 1000), (1000, 1), "f32", (1, plan.config.tile_m), "MN", swizzle=0)


@pytest.mark.parametrize(
    "strides,aligned",
    [((9, 1), True), ((1, 1001), True), ((1, 1000), False), ((2, 2000), True)],
    ids=["row-major", "odd-columns", "unaligned", "strided"],
)
def test_blockscale_plan_copies_other_a_scales_into_m_major_columns(strides, aligned):
    """Any other A scales (row-major as users may hold them, columns not 16-byte aligned) are first copied into
    M-major columns padded to 16 bytes: the kernel's TMA loads need them so."""
    a, b, out, _, b_scales = _specs(1000, 776, 1040)
    a_scales = MatrixSpec((1000, 9), strides, "f32", aligned)
    plan = plan_blockscale(a, b, out, a_scales, b_scales, sms=SMS)
    assert plan.preparations == (Preparation("scale_0", "scale_0", ("transpose", "pad_rows", "transpose")),)
    assert plan.specs["scale_0"] == MatrixSpec((1000, 9), (1, 1000), "f32", True)


@pytest.mark.parametrize(
    "config,message",
    [
        (GemmConfig(tile_n=256, tile_k=128), "a tile_n of at most 128"),
        (GemmConfig(tile_n=128, tile_k=256, stages=2), "expected tile_k 128"),
        (GemmConfig(tile_n=128, tile_k=128, stages=4, schedule="pingpong", cluster_m=1), "cooperative schedule"),
        (GemmConfig(tile_m=256, tile_n=192, tile_k=128, stages=3), "64 rows per consumer"),
    ],
)
def test_blockscale_plan_refuses_configs_that_straddle_blocks(config, message):
    with pytest.raises(ValueError, match=message):
        plan_blockscale(*_specs(512, 512, 1024), sms=SMS, config=config)


def test_blockscale_plan_checks_the_scales_geometry():
    a, b, out, a_scales, b_scales = _specs(512, 520, 1040)
    with pytest.raises(ValueError, match=r"a_scales: expected a float32 \(512, 9\) tensor"):
        plan_blockscale(a, b, out, MatrixSpec.dense((512, 8), "f32"), b_scales, sms=SMS)
    with pytest.raises(ValueError, match=r"b_scales: expected a float32 \(5, 9\) tensor"):
        plan_blockscale(a, b, out, a_scales, MatrixSpec.dense((5, 9), "bf16"), sms=SMS)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("m,n,k", [(4096, 7168, 16384), (64, 2112, 7168), (4096, 24576, 1536)])
def test_blockscale_kernel_promotes_each_block_of_fp8_wgmma(m, n, k):
    """Each K step's wgmmas start fresh accumulators (scale-d off: ``p`` false), the kernel assembles for sm_90a without
    spills, and its SASS multiplies with QGMMA on E4M3 operands and adds each step into the sums with FFMA."""
    plan = plan_blockscale(*_specs(m, n, k), sms=SMS)
    (module,) = plan.lower()
    cfg = plan.config
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.tile_n}k32\.f32\.e4m3\.e4m3", module.ptx)
    assert wgmmas and len(wgmmas) % ((cfg.consumer_rows // 64) * 4) == 0
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", module.ptx)
    assert spill_bytes(module.ptx) == 0
    sass = toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    assert re.search(rf"QGMMA\.64x{cfg.tile_n}x32\.F32\.E4M3\.E4M3", sass)
    # the promotion: one FFMA per accumulator element and step at least (tile_n / 2 per 64 rows of a thread)
    assert len(re.findall(r"\bFFMA\b", sass)) >= cfg.consumer_rows // 64 * cfg.tile_n // 2


# --- argument checks (CPU tensors: shapes and dtypes only) ---------------------------------------------------------


def _tensors(torch, m=64, n=200, k=272):
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(n, k).to(torch.float8_e4m3fn).t()
    return a, b, torch.ones(m, 3), torch.ones(2, 3)


def test_blockscale_arguments_accept_both_layouts_and_ue8m0():
    torch = pytest.importorskip("torch")
    a, b, a_scales, b_scales = _tensors(torch)
    check = lambda sa, sb: check_blockscale_arguments("blockscale_gemm", a, b, sa, sb, None, None, None)  # noqa: E731
    assert check(a_scales, b_scales) == (64, 200, 272)
    assert check(a_scales.t().contiguous().t(), b_scales) == (64, 200, 272)
    if hasattr(torch, "float8_e8m0fnu"):
        assert check(a_scales.to(torch.float8_e8m0fnu), b_scales.to(torch.float8_e8m0fnu)) == (64, 200, 272)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t, a, b, sa, sb: (a, b, t.ones(64, 2), sb), r"a_scales: expected shape \(64, 3\) \(one per row of a"),
        (lambda t, a, b, sa, sb: (a, b, sa, t.ones(1, 3)), r"b_scales: expected shape \(2, 3\) \(one per 128 x 128"),
        (lambda t, a, b, sa, sb: (a, b, sa.half(), sb), r"a_scales: expected float32 \(or float8_e8m0fnu\) scales"),
        (lambda t, a, b, sa, sb: (a.float(), b, sa, sb), r"\ba\b"),
        (lambda t, a, b, sa, sb: (a[:, :264], b[:264], t.ones(64, 3), sb), r"multiple of 16"),
    ],
)
def test_blockscale_argument_errors_name_the_argument(change, message):
    torch = pytest.importorskip("torch")
    args = change(torch, *_tensors(torch))
    with pytest.raises((ValueError, TypeError), match=message):
        check_blockscale_arguments("blockscale_gemm", *args, None, None, None)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("tile_n, stages", [(64, 13), (32, 16)])
def test_narrow_tiles_one_consumer_one_box_deep_pipeline(tile_n, stages):
    """64-row tiles with one consumer and one staging box (DeepGEMM's choice at M <= 128: one wave of narrow tiles,
    no split K, a deep pipeline): the staging keeps its box mode at one box (it did not: a LayoutError), and more
    than 8 stages fit beside it."""
    cfg = GemmConfig(
        tile_m=64, tile_n=tile_n, tile_k=128, stages=stages, consumers=1, cluster_m=1, cluster_n=1, store_boxes=1
    )
    (module,) = plan_blockscale(*_specs(128, 4096, 7168), sms=SMS, config=cfg).lower()
    assert spill_bytes(module.ptx) == 0
    assert module.shared_bytes["gemm_ws_blockscaled"] >= stages * (64 + tile_n) * 128
