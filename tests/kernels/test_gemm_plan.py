"""flydsl.kernels.gemm.plan and launch without a GPU: which kernel a call takes, with which configuration (the
properties of choose_config's choice, not its table), how operands are prepared, the scratch split K and stream-K
need, every routed configuration assembling without spills, the route printed, and a plan's arguments bound to
torch tensors as gemm() binds them (launches recorded instead of run)."""

from __future__ import annotations

import importlib

import pytest

import flydsl.compiler as flyc
from flydsl.kernels import memory
from flydsl.kernels.gemm import (
    Epilogue,
    GemmConfig,
    MatrixSpec,
    SkinnyConfig,
    candidate_configs,
    choose_config,
    estimated_seconds,
    plan_gemm,
)
from flydsl.kernels.gemm import plan as plan_module
from flydsl.kernels.gemm.plan import Scratch, Tensor, Tma

from .ptxas_report import spill_bytes

SMS = 132
NK = [(4096, 4096), (14336, 4096), (4096, 14336), (1536, 7168), (7168, 16384), (18432, 7168), (28672, 8192)]
NK += [(2048, 7168), (776, 520)]
ROUTED = [(m, n, k) for m in (1, 8, 16, 17, 64, 128, 256, 512, 2048, 8192) for n, k in NK]


def _specs(m, n, k, dtype="bf16", b_major="K", out_dtype=None):
    b = MatrixSpec.dense((n, k), dtype).transposed() if b_major == "K" else MatrixSpec.dense((k, n), dtype)
    return MatrixSpec.dense((m, k), dtype), b, MatrixSpec.dense((m, n), out_dtype or dtype)


def test_routes():
    """Decode-sized M with K-major weights streams them (split K summed by split_k_reduce where K is split); an
    MN-major B, M > 16, a configuration given or epilogue scales take the warp-specialized kernel."""
    names = lambda plan: [launch.kernel.name for launch in plan.launches]  # noqa: E731
    assert names(plan_gemm(*_specs(16, 4096, 4096), sms=SMS)) == ["skinny_gemm_kernel"]
    assert names(plan_gemm(*_specs(8, 512, 7168), sms=SMS)) == ["skinny_gemm_kernel", "split_k_reduce"]
    assert names(plan_gemm(*_specs(16, 4096, 4096, b_major="MN"), sms=SMS)) == ["gemm_ws"]
    assert names(plan_gemm(*_specs(17, 4096, 4096), sms=SMS)) == ["gemm_ws"]
    assert names(plan_gemm(*_specs(16, 4096, 4096), sms=SMS, config=GemmConfig())) == ["gemm_ws"]


def test_choose_config_picks_among_the_candidates():
    """For every routed shape: one of candidate_configs, of the kinds choose_config takes (cooperative, no stream-K,
    at most 128 rows; 64-row tiles exactly when M <= 64; B shared by 2-CTA clusters wherever two tile rows can
    share it), within the split-tail margin of the cost model's fastest of those (and the fastest where it splits
    the last wave), K split only where the tiles leave SMs idle, and a grid of at most one CTA per SM."""
    for m, n, k in ROUTED:
        cfg = choose_config(m, n, k, SMS)
        candidates = candidate_configs(m, n, k, SMS)
        assert cfg in candidates
        assert cfg.schedule == "cooperative" and not cfg.stream_k and cfg.tile_m <= 128
        assert (cfg.tile_m == 64) == (m <= 64)
        assert cfg.cluster_m == 2 or -(-m // cfg.tile_m) < 2 or cfg.tile_n % 128
        eligible = [
            c
            for c in candidates
            if (c.tile_m == 64) == (m <= 64)
            and (c.cluster_m == 2 or -(-m // c.tile_m) < 2 or c.tile_n % 128)
            and c.schedule == "cooperative"
            and not c.stream_k
            and c.tile_m <= 128
        ]
        fastest = min(estimated_seconds(m, n, k, c, SMS) for c in eligible)
        chosen = estimated_seconds(m, n, k, cfg, SMS)
        assert chosen < 1.05 * fastest and (chosen == fastest or not cfg.split_tail)
        tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
        assert cfg.split_k == 1 or cfg.split_tail or tiles < SMS
        plan = plan_gemm(*_specs(m, n, k, b_major="MN"), sms=SMS)
        assert plan.launches[0].grid <= SMS and plan.launches[0].block == cfg.threads


def _routed_kernels():
    """One plan per distinct kernel the routes compile over the routed shapes (both majors of B; no epilogue, and
    a float32 bias with gelu into float32 C): {key: plan}."""
    plans = {}
    for (m, n, k), b_major, epilogue in (
        (shape, major, epi) for shape in ROUTED for major in ("K", "MN") for epi in ("none", "bias_gelu")
    ):
        out_dtype = "f32" if epilogue == "bias_gelu" else None
        bias = MatrixSpec.dense((n,), "f32") if epilogue == "bias_gelu" else None
        activation = "gelu" if epilogue == "bias_gelu" else None
        plan = plan_gemm(
            *_specs(m, n, k, b_major=b_major, out_dtype=out_dtype), sms=SMS, bias=bias, activation=activation
        )
        key = tuple(
            (
                launch.kernel.name,
                out_dtype,
                *(arg for arg in launch.arguments if not isinstance(arg, (Tensor, Tma, Scratch))),
            )
            for launch in plan.launches
        )
        plans.setdefault(key, plan)
    return plans


# Routed kernels that spill (ptxas -v's spill stores + loads; STL/LDL in their SASS), as at 06a63cd (the refactor kept
# their PTX byte for byte): the epilogue of a bias with gelu stored from registers, and 8- or 4-way split K. By
# (tile_m, tile_n, cluster_m, split_k, bias, activation, store); listed so that a new spill fails the test, and a
# fixed one too (then drop it here).
KNOWN_SPILLS = {
    (64, 128, 1, 8, True, "gelu", "registers"): 44,
    (64, 128, 1, 8, False, None, "tma"): 72,
    (64, 256, 1, 1, True, "gelu", "registers"): 56,
    (128, 192, 1, 1, True, "gelu", "registers"): 56,
    (128, 256, 1, 1, True, "gelu", "registers"): 232,
    (128, 256, 2, 1, True, "gelu", "registers"): 144,
    (128, 256, 2, 4, False, None, "tma"): 292,
    (128, 256, 2, 4, True, "gelu", "registers"): 328,
}


@pytest.mark.skipif(flyc.toolchain.find_ptxas() is None, reason="needs ptxas")
def test_every_routed_kernel_assembles_without_spills():
    """Every kernel a routed call launches (each configuration choose_config and choose_skinny_config pick over the
    routed shapes, with the operand majors, epilogue and TMA store the plan gives it) assembles for sm_90a without
    ptxas's performance notes (C7514: wgmma serialized; they are errors in the tests) and without spills, but for
    the KNOWN_SPILLS."""
    spilled = {}
    for key, plan in _routed_kernels().items():
        for launch, module in zip(plan.launches, plan.lower(), strict=True):
            assert module.cubin is not None, key
            cfg, epilogue = plan.config, plan.epilogue
            if launch.kernel.name == "gemm_ws":
                structure = (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.split_k, epilogue.bias, epilogue.activation)
                structure += (epilogue.store,)
            else:
                structure = (launch.kernel.name, cfg)
            spilled[structure] = spill_bytes(module.ptx)
    assert {structure: spills for structure, spills in spilled.items() if spills} == KNOWN_SPILLS


def test_operands_tma_cannot_read_are_prepared():
    """Odd K pads the rows of both operands (row-major A, K-major B: the transpose of a padded (N, K)); the skinny
    route takes b's transpose as its (N, K) weights and copies a column-major A."""
    a, b, out = _specs(300, 520, 77)
    plan = plan_gemm(a, b, out, sms=SMS)
    assert [(p.role, p.steps) for p in plan.preparations] == [("a", ("pad_rows",)), ("b", ("pad_columns",))]
    assert plan.specs["a"].strides == (80, 1) and plan.specs["b"].strides == (1, 80)
    views = [arg.view for arg in plan.launches[0].arguments[:2]]
    assert [(v.major, v.matrix, v.strides) for v in views] == [("K", (300, 77), (80, 1)), ("K", (520, 77), (80, 1))]
    column_major_a = MatrixSpec.dense((1000, 8), "bf16").transposed()
    skinny = plan_gemm(column_major_a, *_specs(8, 4096, 1000)[1:], sms=SMS)
    assert [(p.role, p.source, p.steps) for p in skinny.preparations] == [
        ("a", "a", ("contiguous",)),
        ("w", "b", ("transpose",)),
    ]
    assert skinny.specs["w"] == MatrixSpec.dense((4096, 1000), "bf16")


@pytest.mark.parametrize(
    "cfg",
    [GemmConfig(split_k=3), GemmConfig(tile_n=128, split_k=2, split_tail=True), GemmConfig(cluster_m=1, stream_k=True)],
    ids=str,
)
def test_partial_tiles_scratch(cfg):
    """Split K: a workspace slot per consumer of each CTA of every split unit and a counter each; stream-K: one per
    consumer of each CTA of the (full) grid."""
    m, n, k = 3000, 5000, 2048
    plan = plan_gemm(*_specs(m, n, k), sms=SMS, config=cfg)
    launch = plan.launches[0]
    workspace, flags = launch.arguments[5:7]
    workers = SMS // cfg.cluster
    tiles = -(-m // (cfg.tile_m * cfg.cluster_m)) * -(-n // cfg.tile_n)
    split_from = tiles - tiles % workers if cfg.split_tail else 0
    slots = launch.grid if cfg.stream_k else (tiles - split_from) * cfg.split_k * cfg.cluster
    assert (
        launch.grid
        == (workers if cfg.stream_k else min(split_from + (tiles - split_from) * cfg.split_k, workers)) * cfg.cluster
    )
    assert workspace == Scratch("workspace", (slots * cfg.consumers * cfg.consumer_rows * cfg.tile_n,), "f32")
    assert flags == Scratch("flags", (slots * cfg.consumers,), "i32")


def test_a_replay_makes_the_scratch_itself():
    """made_memory: split K's workspace and flags held per stream by name, the skinny kernel's partials fresh per
    call, in the order of the scratch arguments (plan_memory's); nothing where an operand is copied."""
    import torch

    from flydsl.kernels.gemm.launch import made_memory

    plan = plan_gemm(*_specs(3000, 5000, 2048), sms=SMS, config=GemmConfig(split_k=3))
    workspace, flags = plan.launches[0].arguments[5:7]
    assert made_memory(plan) == (
        (0, workspace.shape, torch.float32, "gemm.workspace"),
        (0, flags.shape, torch.int32, "gemm.flags"),
    )
    skinny = plan_gemm(*_specs(8, 512, 7168), sms=SMS)
    (partials,) = {arg for launch in skinny.launches for arg in launch.arguments if isinstance(arg, Scratch)}
    assert made_memory(skinny) == ((0, partials.shape, torch.float32),)
    assert made_memory(plan_gemm(*_specs(64, 512, 7161), sms=SMS)) is None  # rows padded for TMA: copies


def test_mn_major_b_parts_are_refused():
    with pytest.raises(ValueError, match="b is MN-major"):
        plan_gemm(*_specs(1000, 776, 520, b_major="MN"), sms=SMS, config=GemmConfig(tile_n=192, stages=4))


def test_the_route_is_printed(capsys):
    assert plan_module.main(["8", "512", "7168", "--bias", "f32", "--activation", "silu"]) == 0
    printed = capsys.readouterr().out
    assert "route: skinny" in printed and "launch split_k_reduce" in printed and "scratch partials f32" in printed
    assert plan_module.main(["2048", "4096", "4096", "--b-major", "MN"]) == 0
    printed = capsys.readouterr().out
    assert "route: gemm_ws" in printed and "MN-major" in printed and "TMA of out" in printed
    assert "(unread)" in printed  # no bias, no split: those parameters are filled with C


class _Recorded:
    """Launches recorded instead of run: (kernel name, arguments, grid, block)."""

    def __init__(self, monkeypatch):
        kernel_module = importlib.import_module("flydsl.compiler.kernel")  # (flydsl.compiler.kernel: the decorator)
        self.launches = []
        recorded = self.launches

        def launch(call, grid, block, smem=None, stream=None, cluster=None):
            recorded.append((call.kernel.name, list(call.values), grid, block))

        monkeypatch.setattr(kernel_module.KernelCall, "launch", launch)


def test_launch_binds_a_plan_to_tensors(monkeypatch):
    """launch_plan on CPU torch tensors: operands copied where the plan says (odd K), TMA tiles of the copies as the
    plan's views, C, the bias and the epilogue in the kernel's parameter order; per-stream scratch reused (and
    grown, flags zeroed) across calls."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import launch as launch_module

    recorded = _Recorded(monkeypatch).launches
    monkeypatch.setattr(memory, "stream_key", lambda t: (-1, 0))
    a, b = torch.randn(300, 77).bfloat16(), torch.randn(520, 77).bfloat16().t()
    out, bias = torch.empty(300, 520), torch.randn(520)
    plan = plan_gemm(*(MatrixSpec.of(t) for t in (a, b, out)), sms=SMS, bias=MatrixSpec.of(bias), activation="relu")
    assert launch_module.launch_plan(plan, a, b, out, bias) is out
    [(name, values, grid, block)] = recorded
    assert (name, grid, block) == ("gemm_ws", plan.launches[0].grid, plan.config.threads)
    a_tile, b_tile = values[:2]
    assert (a_tile.shape, a_tile.strides, a_tile.box) == ((300, 77), (80, 1), (plan.config.tile_m, 64))
    assert a_tile.pointer != a.data_ptr()  # a padded copy
    assert (
        values[2] is out and values[4] is bias and values[-1] == plan.epilogue == Epilogue(bias=True, activation="relu")
    )
    split = plan_gemm(*(MatrixSpec.of(t) for t in (a, b, out)), sms=SMS, config=GemmConfig(split_k=2))
    for _ in range(2):
        launch_module.launch_plan(split, a, b, out)
    workspace, flags = recorded[1][1][5:7], recorded[2][1][5:7]
    assert workspace[0] is flags[0] and workspace[1] is flags[1]  # the stream's scratch, kept
    assert flags[1].dtype == torch.int32 and not flags[1].any()


def test_skinny_plan_binds_its_partials(monkeypatch):
    """The skinny route with split K: fresh fp32 partials shared by both launches, b's transpose as the weights."""
    torch = pytest.importorskip("torch")
    from flydsl.kernels.gemm import launch as launch_module

    recorded = _Recorded(monkeypatch).launches
    a, w, out = torch.randn(8, 7168).bfloat16(), torch.randn(512, 7168).bfloat16(), torch.empty(8, 512).bfloat16()
    plan = plan_gemm(*(MatrixSpec.of(t) for t in (a, w.t(), out)), sms=SMS)
    assert isinstance(plan.config, SkinnyConfig) and plan.config.splits > 1
    launch_module.launch_plan(plan, a, w.t(), out)
    (first, values, _, _), (second, reduce_values, _, _) = recorded
    assert (first, second) == ("skinny_gemm_kernel", "split_k_reduce")
    assert values[0] is a and values[1].data_ptr() == w.data_ptr() and values[1].stride() == (7168, 1)
    assert values[2] is values[3] is reduce_values[0] and values[2].shape == (plan.config.splits * 8, 512)
    assert reduce_values[1] is out
