"""fused_moe without a GPU: its argument checks (TensorSpecs stand for the tensors), the grouped GEMM's scheduler run
on Python ints (every routed block's tiles once, each with its expert's weights), and the kernels (gather, the two
grouped GEMMs, combine) compiled to PTX that ptxas assembles for sm_90a without spills."""

from __future__ import annotations

import itertools
import shutil
import subprocess

import pytest

import flydsl.compiler as flyc
from flydsl.kernels.gemm import GemmConfig
from flydsl.kernels.gemm.epilogue import Epilogue, Scale
from flydsl.kernels.gemm.operands import MatrixSpec
from flydsl.kernels.gemm.plan import plan_grouped
from flydsl.kernels.gemm.schedulers import ExpertTiles
from flydsl.kernels.gemm.skinny import SkinnyVariant, choose_grouped_skinny_config, skinny_gemm_grouped_kernel
from flydsl.kernels.moe.experts import check_fused_moe, combine_kernel, decodes, experts_config, gather_kernel

S = flyc.TensorSpec


def _specs(tokens=10, experts=8, hidden=256, inter=128, top_k=2, dtype="bf16", ids="i32"):
    return dict(
        x=S((tokens, hidden), dtype),
        w1=S((experts, 2 * inter, hidden), dtype),
        w2=S((experts, hidden, inter), dtype),
        topk_weights=S((tokens, top_k), "f32"),
        topk_ids=S((tokens, top_k), ids),
    )


def test_check_fused_moe_accepts_and_measures():
    assert check_fused_moe(**_specs()) == (10, 256, 8, 128, 2)
    assert check_fused_moe(**_specs(ids="i64", dtype="f16")) == (10, 256, 8, 128, 2)


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(x=S((10, 256, 1), "bf16")), ValueError, "x: expected a 2-D tensor"),
        (dict(x=S((10, 256), "f32")), TypeError, "x: expected dtype"),
        (dict(w1=S((8, 255, 256), "bf16")), ValueError, r"w1: expected \(E, 2I, H\)"),
        (dict(w2=S((8, 256, 64), "bf16")), ValueError, r"w2: expected \(E, H, I\)"),
        (dict(w2=S((8, 256, 128), "f16")), TypeError, "w2: expected dtype"),
        (dict(topk_ids=S((11, 2), "i32")), ValueError, "topk_ids: expected"),
        (dict(topk_weights=S((10, 3), "f32")), ValueError, "topk_weights: expected topk_ids' shape"),
        (dict(topk_ids=S((10, 2), "f32")), TypeError, "topk_ids: expected int32 or int64"),
        (dict(x=S((10, 256), "bf16", (512, 1))), ValueError, "x: expected a contiguous tensor"),
        (dict(w1=S((8, 256, 256), "bf16", (256 * 256, 1, 256))), ValueError, "w1: expected a contiguous tensor"),
        (dict(out=S((10, 128), "bf16")), ValueError, "out: expected a"),
        (dict(quant="fp4"), ValueError, "quant: expected one of"),
        (dict(granularity="channel"), ValueError, "go with quant='fp8'"),
        (dict(quant="fp8"), TypeError, "w1: expected dtype float8_e4m3fn"),
        (dict(activation="gelu"), ValueError, "activation"),
    ],
)
def test_check_fused_moe_names_the_bad_argument(change, error, match):
    arguments = {**_specs(), **change}
    with pytest.raises(error, match=match):
        check_fused_moe(**arguments)


def _fp8_specs(tokens=10, experts=8, hidden=256, inter=128, granularity="channel"):
    specs = _specs(tokens, experts, hidden, inter)
    specs["w1"], specs["w2"] = S((experts, 2 * inter, hidden), "f8E4M3FN"), S((experts, hidden, inter), "f8E4M3FN")
    per_channel = granularity == "channel"
    specs["w1_scale"] = S((experts, 2 * inter) if per_channel else (experts,), "f32")
    specs["w2_scale"] = S((experts, hidden) if per_channel else (experts,), "f32")
    return dict(specs, quant="fp8", granularity=granularity)


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
def test_check_fused_moe_fp8(granularity):
    assert check_fused_moe(**_fp8_specs(granularity=granularity)) == (10, 256, 8, 128, 2)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(granularity="block"), "granularity: expected one of"),
        (dict(w1_scale=None), r"w1_scale: expected a float32 \(8, 256\) tensor"),
        (dict(w2_scale=S((8,), "f32")), r"w2_scale: expected a float32 \(8, 256\) tensor"),
        (dict(w1_scale=S((8, 256), "bf16")), "w1_scale: expected a float32"),
        (
            dict(x=S((10, 264), "bf16"), w1=S((8, 256, 264), "f8E4M3FN"), w2=S((8, 264, 128), "f8E4M3FN")),
            "multiples of 16",
        ),
    ],
)
def test_check_fused_moe_fp8_names_the_bad_argument(change, match):
    with pytest.raises(ValueError, match=match):
        check_fused_moe(**{**_fp8_specs(), **change})


def test_hidden_and_intermediate_sizes_need_16_byte_rows():
    with pytest.raises(ValueError, match="multiples of 8"):
        check_fused_moe(**_specs(inter=100))


def test_decode_route():
    assert decodes(1, 8, 256) and decodes(64, 512, 256) and decodes(16, 32, 8)
    assert not decodes(65, 520, 256) and not decodes(64, 128, 8)  # past 64 tokens; Mixtral at 16 rows per expert


@pytest.mark.parametrize("gated,k", [(True, 7168), (True, 1000), (False, 256), (False, 2048)])
def test_grouped_skinny_compiles_without_spills(gated, k, tmp_path):
    tokens, top_k, experts, n_out, capacity = 8, 8, 256, 256, 4096
    cfg = choose_grouped_skinny_config(k, gated)
    variant = SkinnyVariant(True, Epilogue(gate="silu" if gated else None), True)
    rows = (tokens, k) if gated else (capacity, k)
    module = skinny_gemm_grouped_kernel.lower(
        S(rows, "bf16"), S((experts * n_out * (2 if gated else 1), k), "bf16"), S((capacity, n_out), "bf16"),
        S((capacity,), "i32"), S((capacity // 16,), "i32"), S((1,), "i32"), S((tokens * top_k,), "i32"),
        top_k if gated else 0, cfg, variant,
    )  # fmt: skip
    assert "mma.sync.aligned.m16n8k16" in module.ptx and "griddepcontrol.wait" in module.ptx
    assert "0 bytes spill stores" in _ptxas(module.ptx, tmp_path)


def test_experts_config_blocks_follow_the_rows_per_expert():
    assert experts_config(2000, 8).block_m == 128  # 250 rows per expert: 128-row tiles, no cluster
    assert experts_config(1024 * 8, 256).block_m == 64  # DeepSeek-V3 TP8: 32 rows per expert
    cfg = experts_config(64, 8)
    assert cfg.stage1.tile_m == 64 and cfg.stage1.consumers == 1 and cfg.stage1.cluster == 1
    prefill = experts_config(16384 * 2, 8)  # 4096 rows per expert: 2-CTA clusters sharing B, 256-row blocks
    assert prefill.stage1.cluster_m == 2 and prefill.block_m == 256


class _Order:
    """A tile order on Python ints, as fx.TileScheduler answers it in a kernel (row-major here)."""

    def __init__(self, tiles_m, tiles_n, worker, workers):
        self.tiles_m, self.tiles_n, self.first, self.stride = tiles_m, tiles_n, worker, workers
        self.count = tiles_m * tiles_n

    def coords(self, tile):
        return tile // self.tiles_n, tile % self.tiles_n


@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("blocks,tiles_n,workers", [(1, 1, 4), (7, 3, 5), (40, 2, 66)])
def test_expert_tiles_cover_each_routed_block_once_with_its_experts_weights(blocks, tiles_n, workers, cluster_m):
    """Each routed block's tiles once (a cluster's CTAs take its tile rows, rank by rank), with the block's expert's
    rows of B; blocks are cluster tiles (the routing pads each expert's run to them)."""
    cfg = GemmConfig(cluster_m=cluster_m)
    expert_of_block = [(3 * b) // 5 for b in range(blocks)] + [-1] * 4  # blocks past the padded count: -1
    rows_per_expert = 1000
    seen = []
    for worker, rank in itertools.product(range(workers), range(cluster_m)):
        order = _Order(blocks, tiles_n, worker, workers)
        schedule = ExpertTiles(order, 9, cfg, rank, expert_of_block, rows_per_expert)
        for unit in range(schedule.worker, schedule.count, schedule.stride):
            work = schedule.work(unit)
            assert (work.k_begin, work.k_end) == (0, 9)
            assert work.b_row0 == expert_of_block[work.tile_m // cluster_m] * rows_per_expert
            seen.append((work.tile_m, work.tile_n))
    assert sorted(seen) == [(m, n) for m in range(blocks * cluster_m) for n in range(tiles_n)]


def test_gated_epilogue_rules():
    assert Epilogue(gate="silu").width(256) == 128 and Epilogue().width(256) == 256
    assert not Epilogue(gate="silu").identity
    for bad in (dict(gate="tanh"), dict(gate="silu", bias=True), dict(gate="silu", activation="relu")):
        with pytest.raises(ValueError, match="gate"):
            Epilogue(**bad)


def test_plan_grouped_checks_shapes():
    cfg = experts_config(1000, 8).stage1
    a = MatrixSpec.dense((1024, 256), "bf16")
    with pytest.raises(ValueError, match="do not match"):
        plan_grouped(a, MatrixSpec.dense((8, 256, 256), "bf16"), MatrixSpec.dense((1024, 256), "bf16"), sms=132,
                     gate="silu", config=cfg)  # fmt: skip


def _ptxas(ptx: str, tmp_path) -> str:
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    done = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", str(source), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("ids,experts,hidden,inter", [(32768, 8, 4096, 14336), (8192, 256, 7168, 256)])
def test_grouped_stages_compile_without_spills(ids, experts, hidden, inter, fp8, tmp_path):
    """Mixtral's prefill (128-row blocks) and DeepSeek-V3 TP8's (64-row blocks): both stages, bf16 and fp8 (with the
    per-row and per-weight-row scales)."""
    cfg = experts_config(ids, experts, fp8)
    capacity = 1024 * cfg.block_m
    operand = "f8E4M3FN" if fp8 else "bf16"
    for a, weights, out, gate in (
        ((capacity, hidden), (experts, 2 * inter, hidden), (capacity, inter), "silu"),
        ((capacity, inter), (experts, hidden, inter), (capacity, hidden), None),
    ):
        scales = ()
        if fp8:
            scales = ((Scale(rows=1), MatrixSpec.dense((capacity,), "f32")),)
            scales += ((Scale(columns=1, experts=True), MatrixSpec.dense((weights[0] * weights[1],), "f32")),)
        plan = plan_grouped(
            MatrixSpec.dense(a, operand),
            MatrixSpec.dense(weights, operand),
            MatrixSpec.dense(out, "bf16"),
            sms=132,
            gate=gate,
            config=cfg.stage1,
            scales=scales,
        )
        (module,) = plan.lower()
        assert "wgmma.mma_async" in module.ptx and "cp.async.bulk.tensor.2d" in module.ptx
        report = _ptxas(module.ptx, tmp_path)
        assert "0 bytes spill stores" in report, report


def test_gather_and_combine_compile(tmp_path):
    tokens, top_k, hidden, capacity = 100, 8, 7168, 4096
    gather = gather_kernel.lower(
        S((tokens, hidden), "bf16"), S((capacity,), "i32"), S((1,), "i32"), S((capacity, hidden), "bf16"),
        S((tokens * top_k,), "i32"), S((1,), "f32"), S((1,), "f32"), top_k, False,
    )  # fmt: skip
    gather_fp8 = gather_kernel.lower(  # fp8 rows as 32-bit words, with their scales
        S((tokens, hidden // 4), "i32"), S((capacity,), "i32"), S((1,), "i32"), S((capacity, hidden // 4), "i32"),
        S((tokens * top_k,), "i32"), S((tokens,), "f32"), S((capacity,), "f32"), top_k, True,
    )  # fmt: skip
    combine = combine_kernel.lower(
        S((capacity, hidden), "bf16"), S((tokens * top_k,), "i32"), S((tokens, top_k), "f32"),
        S((tokens, top_k), "i64"), S((tokens, hidden), "bf16"), 256, top_k,
    )  # fmt: skip
    for module in (gather, gather_fp8, combine):
        assert "ld.global.v4" in module.ptx  # 16-byte rows
        assert "0 bytes spill stores" in _ptxas(module.ptx, tmp_path)
