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
from flydsl.kernels.gemm.skinny import SkinnyVariant
from flydsl.kernels.gemm.skinny_grouped import GroupedMode, choose_grouped_skinny_config, skinny_gemm_grouped_kernel
from flydsl.kernels.moe.decode import decodes
from flydsl.kernels.moe.experts import check_fused_moe, combine_kernel, experts_config, gather_kernel

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
    shapes = {
        "channel": ((experts, 2 * inter), (experts, hidden)),
        "tensor": ((experts,), (experts,)),
        "block": ((experts, 2 * inter // 128, -(-hidden // 128)), (experts, hidden // 128, -(-inter // 128))),
    }[granularity]
    specs["w1_scale"], specs["w2_scale"] = S(shapes[0], "f32"), S(shapes[1], "f32")
    return dict(specs, quant="fp8", granularity=granularity)


@pytest.mark.parametrize("granularity", ["channel", "tensor", "block"])
def test_check_fused_moe_fp8(granularity):
    assert check_fused_moe(**_fp8_specs(granularity=granularity)) == (10, 256, 8, 128, 2)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(granularity="group"), "granularity: expected one of"),
        (dict(granularity="block"), r"w1_scale: expected a float32 \(8, 2, 2\) tensor \(block scales\)"),
        (
            dict(granularity="block", x=S((10, 320), "bf16"), w1=S((8, 256, 320), "f8E4M3FN"),
                 w2=S((8, 320, 128), "f8E4M3FN")),
            "H a multiple of 128 and I of 64",
        ),  # fmt: skip
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
        top_k if gated else 0, cfg, variant, GroupedMode(),
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


@pytest.mark.parametrize(
    "ids,experts,hidden,inter", [(32768, 8, 4096, 14336), (8192, 256, 7168, 256), (1024, 128, 2048, 768)]
)
def test_block_scaled_grouped_stages_compile_without_spills(ids, experts, hidden, inter, tmp_path):
    """fp8 with 128 x 128 weight blocks: both stages promote each K block with its row's group scale (M-major) and
    its weight block's (stage 1: the gate rows' block and the up rows' block), 128-wide tiles."""
    cfg = experts_config(ids, experts, fp8=True, block=True)
    assert cfg.stage1.tile_n == 128 and cfg.stage1.tile_k == 128
    capacity = 1024 * cfg.block_m
    for k, rows, n, gate in ((hidden, 2 * inter, inter, "silu"), (inter, hidden, hidden, None)):
        k_blocks = -(-k // 128)
        block_scales = (
            MatrixSpec((capacity, k_blocks), (1, capacity), "f32"),
            MatrixSpec.dense((experts * rows // 128, k_blocks), "f32"),
        )
        plan = plan_grouped(
            MatrixSpec.dense((capacity, k), "f8E4M3FN"),
            MatrixSpec.dense((experts, rows, k), "f8E4M3FN"),
            MatrixSpec.dense((capacity, n), "bf16"),
            sms=132,
            gate=gate,
            config=cfg.stage1,
            block_scales=block_scales,
        )
        assert plan.route == "gemm_ws_grouped_blockscaled"
        (module,) = plan.lower()
        assert "wgmma.mma_async" in module.ptx and "cp.async.ca.shared.global" in module.ptx
        report = _ptxas(module.ptx, tmp_path)
        assert "0 bytes spill stores" in report, report


def test_block_scaled_grouped_plan_refuses_partial_weight_blocks():
    cfg = experts_config(1024, 8, fp8=True, block=True)
    block_scales = (MatrixSpec((4096, 2), (1, 4096), "f32"), MatrixSpec.dense((8 * 192 // 128, 2), "f32"))
    with pytest.raises(ValueError, match="whole 128s"):
        plan_grouped(
            MatrixSpec.dense((4096, 256), "f8E4M3FN"),
            MatrixSpec.dense((8, 192, 256), "f8E4M3FN"),
            MatrixSpec.dense((4096, 192), "bf16"),
            sms=132,
            config=cfg.stage2,
            block_scales=block_scales,
        )


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
    gather_groups = gather_kernel.lower(  # fp8 rows with their per-group scales, M-major
        S((tokens, hidden // 4), "i32"), S((capacity,), "i32"), S((1,), "i32"), S((capacity, hidden // 4), "i32"),
        S((tokens * top_k,), "i32"), S((tokens, hidden // 128), "f32", (1, tokens)),
        S((capacity, hidden // 128), "f32", (1, capacity)), top_k, True,
    )  # fmt: skip
    assert gather_groups.ptx.count("$L__BB") > gather_fp8.ptx.count("$L__BB")  # the group scales: a loop over lanes
    for module in (gather, gather_fp8, gather_groups, combine):
        assert "ld.global.v4" in module.ptx  # 16-byte rows
        assert "0 bytes spill stores" in _ptxas(module.ptx, tmp_path)
