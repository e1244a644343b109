"""Prepared fp8 weights without a GPU: prepare_weight's K panels ((K / 128, N, 128), zero padded), the plans that
read them as they are (the skinny kernel's ``w``, the warp-specialized kernel's 3-D TMA view: contiguous boxes), their
PTX and SASS, and the checks of a PreparedWeight argument."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import toolchain
from flydsl.kernels.gemm import GemmConfig, MatrixSpec, Scale, plan_gemm
from flydsl.kernels.gemm.prepared import PreparedWeight, check_prepared, prepared_shape

from .ptxas_report import spill_bytes

SMS = 132
E4M3 = "f8E4M3FN"


def _specs(m, n, k):
    a = MatrixSpec.dense((m, k), E4M3)
    blocks = MatrixSpec.dense(prepared_shape(k, n), E4M3)
    scales = ((Scale(rows=1), MatrixSpec.dense((m,), "f32")), (Scale(columns=1), MatrixSpec.dense((n,), "f32")))
    return a, blocks, MatrixSpec.dense((m, n), "bf16"), scales


def test_prepared_panels_hold_each_weight_once_and_zeros_past_it():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import prepare_weight

    n, k = 1001, 4112  # K not a multiple of the panel: a partial last panel
    w = (torch.randn(n, k) * 8).to(torch.float8_e4m3fn)
    prepared = prepare_weight(w.t())
    assert prepared.shape == (k, n) and prepared.data.shape == (33, 1001, 128) == prepared_shape(k, n)
    assert prepared.data.dtype == torch.float8_e4m3fn and prepared.data.is_contiguous()
    panels, bytes_ = prepared.data.view(torch.uint8), w.view(torch.uint8)
    rows, cols = torch.randint(0, n, (500,)), torch.randint(0, k, (500,))
    assert torch.equal(panels[cols // 128, rows, cols % 128], bytes_[rows, cols])
    assert panels[32, :, 16:].count_nonzero() == 0  # K 4112..4223
    assert torch.equal(prepared.unprepared().view(torch.uint8), w.t().view(torch.uint8))
    # A TMA box of B (rows r0.. of one 128-byte row of K) is one contiguous piece of a panel.
    flat = panels.reshape(-1)
    assert torch.equal(flat[(5 * n + 256) * 128 : (5 * n + 384) * 128].view(128, 128), bytes_[256:384, 640:768])


def test_prepare_weight_refuses_what_it_cannot_lay_out():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import prepare_weight

    with pytest.raises(TypeError, match=r"prepare_weight: b: expected dtype float8_e4m3fn or float8_e5m2"):
        prepare_weight(torch.zeros(64, 32).bfloat16())
    with pytest.raises(ValueError, match=r"prepare_weight: b: K = 40; expected a multiple of 16"):
        prepare_weight(torch.zeros(40, 32).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"prepare_weight: b: expected a \(K, N\) matrix"):
        prepare_weight(torch.zeros(2, 64, 32).to(torch.float8_e4m3fn))


def test_a_prepared_weight_is_checked_before_use():
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import prepare_weight

    prepared = prepare_weight(torch.zeros(256, 24).to(torch.float8_e4m3fn))
    stand_in = check_prepared("fp8_gemm", prepared)
    assert stand_in.shape == (256, 24) and stand_in.device.type == "meta" and stand_in.dtype == prepared.dtype
    wrong = PreparedWeight(prepared.data, 256, 40)  # extents its panels do not hold
    with pytest.raises(
        ValueError,
        match=r"fp8_gemm: b: a PreparedWeight of \(256, 40\) holds contiguous panels of shape \(2, 40, 128\)",
    ):
        check_prepared("fp8_gemm", wrong)
    with pytest.raises(TypeError, match=r"fp8_gemm: b.data: expected dtype float8_e4m3fn or float8_e5m2"):
        check_prepared("fp8_gemm", PreparedWeight(prepared.data.view(torch.uint8), 256, 24))


def test_prepared_weights_stream_through_the_skinny_kernel_as_they_are():
    m, n, k = 16, 7168, 2048
    a, blocks, out, scales = _specs(m, n, k)
    plan = plan_gemm(a, blocks, out, sms=SMS, scales=scales)
    assert plan.route == "skinny" and plan.launches[0].kernel.name == "skinny_gemm_scaled_kernel"
    assert [(p.role, p.source, p.steps) for p in plan.preparations] == [("w", "b", ())]
    variant = plan.launches[0].arguments[-1]
    assert variant.prepared and variant.vector_loads and plan.specs["w"] == blocks


def test_prepared_weights_are_a_2d_tma_view_for_the_warp_specialized_kernel():
    """No copy; the panels one after another as a (K / 128 * N, 128) matrix, one contiguous box of (rows, 128) per
    128-byte K panel of the CTA's part of the B tile (a 2-D copy: the same boxes through a 3-D descriptor ran 1-5%
    slower)."""
    m, n, k = 4096, 4100, 4096
    a, blocks, out, scales = _specs(m, n, k)
    plan = plan_gemm(a, blocks, out, sms=SMS, scales=scales)
    cfg = plan.config
    assert plan.route == "gemm_ws_scaled" and plan.preparations == ()
    b_view = plan.launches[0].arguments[1].view
    assert b_view.major == "prepared"
    assert b_view.box == (cfg.tile_n // cfg.cluster_m, 128) and b_view.matrix == (k // 128 * n, 128)
    assert b_view.strides == (128, 1)
    assert plan.launches[0].arguments[-2] == ("K", "prepared")


def test_prepared_view_refuses_panels_that_are_not_contiguous():
    from flydsl.kernels.gemm.operands import prepared_view

    panels = MatrixSpec((4, 256, 128), (128, 512, 1), "f8E4M3FN")
    with pytest.raises(ValueError, match="expected contiguous prepared panels"):
        prepared_view(panels, 128)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize(
    "m,n,k,config",
    [
        (4096, 4096, 4096, None),  # 128 x 256 tiles in 2-CTA clusters: B parts of 128 rows
        (64, 7168, 2048, None),  # 64-row tiles, split K
        (520, 392, 272, GemmConfig(tile_m=128, tile_n=128, tile_k=256, stages=3)),  # 2 panels per K step
    ],
)
def test_the_prepared_dense_kernel_multiplies_with_fp8_wgmma(m, n, k, config):
    """The same fp8 wgmmas as plain weights, a rank-2 TMA load per panel (no rank-3 ones), no spills; QGMMA in the
    SASS."""
    a, blocks, out, scales = _specs(m, n, k)
    plan = plan_gemm(a, blocks, out, sms=SMS, scales=scales, config=config)
    (module,) = plan.lower()
    cfg = plan.config
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.tile_n}k32\.f32\.e4m3\.e4m3", module.ptx)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in module.ptx
    assert "cp.async.bulk.tensor.3d" not in module.ptx
    assert spill_bytes(module.ptx) == 0
    sass = toolchain.disassemble_cubin(module.cubin) if module.cubin is not None else None
    if sass is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    assert re.search(rf"QGMMA\.64x{cfg.tile_n}x32\.F32\.E4M3\.E4M3", sass)


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_the_prepared_skinny_kernel_assembles():
    (module,) = plan_gemm(*_specs(16, 7168, 2048)[:3], sms=SMS, scales=_specs(16, 7168, 2048)[3]).lower()
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in module.ptx
    assert "ld.global.nc.L1::no_allocate.L2::256B.v4.b32" in module.ptx
    assert spill_bytes(module.ptx) == 0
