"""flydsl.kernels.gemm.epilogue: the Epilogue description and its float32 scales. CPU: how a Scale maps onto C and
the descriptions' checks; gemm_ws_scaled compiled through the plan for each granularity (one value, per row, per
column, per group of columns, per 2-D block, a row and a column scale together), from registers and through the TMA
store: it assembles without spills or ptxas's C7514 note, loads each scale value once per thread where it is the same
for several of the thread's elements, and multiplies before the bias. GPU (``gpu``): against a float64 reference on
fresh random data with the output poisoned, tails in M and N."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm import Epilogue, GemmConfig, MatrixSpec, Scale, gemm_ws, gemm_ws_scaled, plan_gemm

from .ptxas_report import spill_bytes

CFG = GemmConfig()  # 128 x 256 tiles: each consumer stores one 64-row block


def test_a_scale_maps_onto_c():
    assert (Scale().granularity, Scale().shape(300, 520)) == ("tensor", (1,))
    assert (Scale(rows=1).granularity, Scale(rows=1).shape(300, 520)) == ("row", (300,))
    assert (Scale(columns=128).granularity, Scale(columns=128).shape(300, 520)) == ("column", (5,))
    assert (Scale(rows=128, columns=128).granularity, Scale(rows=128, columns=128).shape(300, 520)) == ("block", (3, 5))
    with pytest.raises(ValueError, match="rows must be None or a positive int"):
        Scale(rows=0)
    with pytest.raises(TypeError):
        Scale(1)  # keyword-only: which dimension a group runs along is always named


def test_an_epilogue_is_checked():
    assert Epilogue().identity and not Epilogue(scales=(Scale(),)).identity
    with pytest.raises(ValueError, match="activation must be one of"):
        Epilogue(activation="tanh")
    with pytest.raises(ValueError, match="store must be 'registers' or 'tma'"):
        Epilogue(store="shared")
    with pytest.raises(ValueError, match="scales must be a tuple of Scale"):
        Epilogue(scales=[Scale()])


def _plan(scales, out_dtype="bf16", m=300, n=520, k=136, bias="bf16", activation="silu"):
    a = MatrixSpec.dense((m, k), "bf16")
    b = MatrixSpec.dense((n, k), "bf16").transposed()
    out = MatrixSpec.dense((m, n), out_dtype)
    specs = tuple((scale, MatrixSpec.dense(scale.shape(m, n), "f32")) for scale in scales)
    bias_spec = None if bias is None else MatrixSpec.dense((n,), bias)
    return plan_gemm(a, b, out, sms=132, bias=bias_spec, activation=activation, scales=specs, config=CFG)


# (scales, the f32 loads of scale values per thread and 64-row block: one per distinct value its elements need)
GRANULARITIES = [
    ((Scale(),), 1),
    ((Scale(rows=1),), 2),  # a thread's rows r and r + 8
    ((Scale(columns=1),), CFG.tile_n // 4),  # its 2 columns of each 8
    ((Scale(columns=128),), CFG.tile_n // 8),  # both columns of a pair lie in one group
    ((Scale(rows=128, columns=128),), CFG.tile_n // 8),  # both rows lie in one 16-row-aligned block
    ((Scale(rows=1), Scale(columns=1)), 2 + CFG.tile_n // 4),  # fp8's per-token x per-channel
]


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])  # TMA store, registers
@pytest.mark.parametrize("scales,loads", GRANULARITIES, ids=lambda v: str(v) if isinstance(v, tuple) else None)
def test_scaled_kernels_compile_without_spills(scales, loads, out_dtype):
    plan = _plan(scales, out_dtype)
    assert plan.epilogue.store == ("tma" if out_dtype == "bf16" else "registers")
    [launch] = plan.launches
    assert launch.kernel is gemm_ws_scaled and plan.epilogue.scales == scales
    [module] = plan.lower()
    ptx = module.ptx
    assert module.cubin is not None and spill_bytes(ptx) == 0
    assert len(re.findall(r"ld\.global(?:\.nc)?\.(?:f32|b32)\s", ptx)) == loads
    assert ptx.count("wgmma.mma_async") == CFG.tile_k // 16  # the main loop is gemm_ws's


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_scales_multiply_before_the_bias():
    """``acc * scale + bias``: with one value per tensor and a bias, the accumulators are multiplied (or fused into
    an fma with the bias, ``fma(acc, scale, bias)``), never added to the bias first."""
    ptx = _plan((Scale(),), "f32", activation=None).lower()[0].ptx
    products = len(re.findall(r"\b(?:mul|fma)\.rn\.f32\s+%r\d+, %r\d+, %r\d+", ptx))
    assert products >= CFG.tile_n // 2  # each of a thread's 128 accumulators (64 x 256 / 128 threads)


def test_kernels_refuse_epilogues_they_cannot_apply():
    a, b, c = _plan((Scale(),)).argument_specs(_plan((Scale(),)).launches[0])[:3]
    with pytest.raises(ValueError, match="gemm_ws: an epilogue with scales takes gemm_ws_scaled"):
        gemm_ws.lower(a, b, c, a, c, c, c, CFG, ("K", "K"), Epilogue(scales=(Scale(),)))
    with pytest.raises(ValueError, match="gemm_ws_scaled: expected an epilogue with one or two scales"):
        gemm_ws_scaled.lower(a, b, c, a, c, c, c, c, c, CFG, ("K", "K"), Epilogue())
    with pytest.raises(ValueError, match=r"gemm scale_0: expected a float32 \(300,\) tensor"):
        m, n = 300, 520
        plan_gemm(
            MatrixSpec.dense((m, 64), "bf16"),
            MatrixSpec.dense((64, n), "bf16"),
            MatrixSpec.dense((m, n), "bf16"),
            sms=132,
            scales=((Scale(rows=1), MatrixSpec.dense((n,), "f32")),),
        )


def _expanded(torch, scale: Scale, values, m, n):
    """The (m, n) float64 factors of ``values`` under ``scale``."""
    values = values.double()
    rows = torch.arange(m, device=values.device)
    cols = torch.arange(n, device=values.device)
    if scale.rows is None and scale.columns is None:
        return values[0].expand(m, n)
    if scale.columns is None:
        return values[rows // scale.rows][:, None].expand(m, n)
    if scale.rows is None:
        return values[cols // scale.columns][None, :].expand(m, n)
    return values[(rows // scale.rows)[:, None], (cols // scale.columns)[None, :]]


@pytest.mark.gpu
@pytest.mark.parametrize("scales,loads", GRANULARITIES, ids=lambda v: str(v) if isinstance(v, tuple) else None)
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("cfg", [GemmConfig(), GemmConfig(tile_n=128, split_k=3)], ids=["whole", "split_k"])
def test_scaled_gemm_on_gpu(scales, loads, out_dtype, cfg):
    """``silu(acc * scales + bias)`` against float64, scales spanning 2^-8..2^8 (NaN-poisoned C, tails in M and N)."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.device import sm_count
    from flydsl.kernels.gemm import launch_plan

    m, n, k = 300, 520, 136
    a = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda").bfloat16()
    values = [2.0 ** torch.randint(-8, 9, scale.shape(m, n), device="cuda").float() for scale in scales]
    out = torch.full((m, n), float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
    specs = tuple((scale, MatrixSpec.of(v)) for scale, v in zip(scales, values, strict=True))
    geometry = (MatrixSpec.of(t) for t in (a, w.t(), out))
    plan = plan_gemm(*geometry, sms=sm_count(0), bias=MatrixSpec.of(bias), activation="silu", scales=specs, config=cfg)
    launch_plan(plan, a, w.t(), out, bias, scales=values)
    torch.cuda.synchronize()
    reference = a.double() @ w.double().t()
    for scale, v in zip(scales, values, strict=True):
        reference = reference * _expanded(torch, scale, v, m, n)
    reference = torch.nn.functional.silu(reference + bias.double())
    error = (out.double() - reference).norm() / reference.norm()
    assert not torch.isnan(out).any() and error < (1e-2 if out_dtype == "bfloat16" else 1e-4), error
