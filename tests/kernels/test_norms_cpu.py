"""flydsl.kernels without a GPU: every kernel compiles, in every regime (warp, block, cluster; even and odd N), to PTX
that ptxas assembles for sm_90a with the accesses we expect; the configs cover N; argument validation names the
argument before anything is launched."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.kernels import norms, reduction
from flydsl.kernels.reduction import RowConfig, row_config

from .norms_cpu_support import (
    FORWARD_FLAGS,
    FakeGpuTensor,
    assembled,
    exchange_spec,
    fake,
    norm_mod,
    private_cache,  # noqa: F401 (an autouse fixture)
    registers,
    softmax_mod,
    spill_bytes,
)

_TYPESTR = {"f32": "<f4", "f16": "<f2"}

# (N, dtype): one per regime edge: warp (1 thread per row ... 32), block, cluster; odd N (per-element tails).
REGIME_CASES = [(1, "f32"), (3, "f16"), (1024, "bf16"), (4097, "f32"), (32768, "bf16"), (65537, "f16"), (262144, "f32")]


def _regime_ids():
    return [f"{n}-{dtype}-{row_config(n, dtype).regime}" for n, dtype in REGIME_CASES]


def _accesses(ptx: str) -> set:
    return {line.split()[0] for line in ptx.splitlines() if line.strip().startswith(("ld.global", "st.global"))}


def test_configs_cover_every_n():
    for dtype in ("f32", "f16", "bf16"):
        for n in [1, 2, 3, 7, 8, 31, 1000, 1024, 4097, 32768, 65537, 131072, 262144, 262145, 1 << 20]:
            for held in (1, 2, 4):
                cfg = row_config(n, dtype, held)
                assert cfg.capacity >= n, (n, dtype, cfg)
                assert cfg.block <= 1024 and cfg.cluster <= 8
    assert row_config(1024, "bf16").regime == "warp"
    assert row_config(2048, "bf16").regime == "block"
    assert row_config(65536, "bf16").regime == "cluster" and row_config(262144, "f32").cluster == 8
    with pytest.raises(ValueError, match="power of two"):
        RowConfig("f32", 4, 1, 48, 1, 1, True)


def test_forward_row_config_shapes():
    """The register forwards' layouts: a row of a whole warp alone in a 32-thread CTA, shorter rows several to a
    128-thread CTA, one CTA of up to 1024 threads where that avoids a cluster, clusters of 512-thread CTAs."""
    from flydsl.kernels.reduction import forward_row_config

    def shape(n, dtype, held=1):
        cfg = forward_row_config(n, dtype, held)
        return cfg.threads_per_row, cfg.rows_per_cta, cfg.cluster

    assert shape(1024, "bf16") == (32, 1, 1) and shape(1024, "f32") == (32, 1, 1)
    assert shape(512, "bf16") == (16, 8, 1)  # several rows per warp: 128-thread CTAs, as row_config
    assert shape(16384, "bf16", held=2) == (1024, 1, 1)  # the fused add: one CTA, not 2 x 512
    assert shape(20001, "f32") == (1024, 1, 1) and shape(32768, "f32") == (1024, 1, 1)
    assert shape(32768, "f32", held=2) == (512, 1, 4)  # a cluster anyway: CTAs of 512 (2 x 1024 measured slower)
    assert shape(65536, "f32") == (512, 1, 4)
    # float32 rows of one tensor in one CTA: 2 chunks per thread where 1024 threads hold the row (FORWARD_BLOCK_VALUES)
    assert shape(2048, "f32") == (256, 1, 1) and shape(8192, "f32") == (1024, 1, 1)
    assert shape(16384, "f32") == (512, 1, 1) and shape(8192, "f32", held=2) == (512, 1, 1)  # 8 chunks; 4
    assert shape(8192, "bf16") == (256, 1, 1)  # 16-bit rows: 4 chunks
    assert forward_row_config(4096, "bf16") is forward_row_config(4096, "bf16")  # cached: one object per shape


@pytest.mark.parametrize("n, dtype", [(1024, "bf16"), (20001, "bf16"), (12289, "f32"), (16384, "bf16"), (8192, "f32")])
def test_register_forward_assembles_without_spills(n, dtype):
    """The register forward in forward_row_config's one-warp and 1024-thread CTAs, every variant: no spills; rows of
    one warp load 16-bit weight and bias with x (before the first shuffle), float32 weights next to the stores."""
    from flydsl.kernels.reduction import forward_row_config

    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    for flags in FORWARD_FLAGS.values():
        cfg = forward_row_config(n, dtype, held=2 if flags.residual else 1)
        for weight_dtype in {dtype, "f32"}:
            weight = flyc.TensorSpec((n,), weight_dtype)
            module = norm_mod.norm_forward_kernel.lower(
                rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
            )
            ptx = assembled(module)
            if flyc.find_ptxas() is not None:
                assert spill_bytes(ptx) == 0, (n, dtype, cfg, weight_dtype)
            early = cfg.threads_per_row <= 32 and dtype != "f32" and weight_dtype != "f32"
            first_shuffle = ptx.index("shfl.sync")
            loads_before = ptx[:first_shuffle].count("ld.global.")
            loads = ptx.count("ld.global.")
            assert (loads_before == loads) == early, (n, dtype, flags, weight_dtype, loads_before, loads)


@pytest.mark.parametrize(
    "n, dtype, threads, chunks",
    [(8192, "f32", 512, 1), (32768, "bf16", 1024, 1), (4097, "f16", 256, 2), (32768, "f32", 1024, 8)]
    + [(32768, "bf16", 512, 8), (3072, "f32", 128, 4), (6144, "f32", 256, 2)],
)
def test_looped_forward_assembles_without_spills(n, dtype, threads, chunks):
    """The looped forward (every variant): one segment in registers whatever N (no spills), x read in two loops,
    one block reduction (LayerNorm's (count, sum, M2) merged by Chan's update: one shuffle of each per step)."""
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    weight = flyc.TensorSpec((n,), dtype)
    cfg = norm_mod.looped_forward_config(n, dtype, threads, chunks)
    assert cfg.row.block == threads and cfg.row.even == (n % cfg.row.vec == 0)
    for flags in FORWARD_FLAGS.values():
        module = norm_mod.norm_forward_looped_kernel.lower(
            rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
        )
        ptx = assembled(module)
        assert ptx.count("bar.sync") == 1  # the row's one reduction (LayerNorm: its moments), none per segment
        if flyc.find_ptxas() is not None:
            assert spill_bytes(ptx) == 0, (n, dtype, flags)
    with pytest.raises(ValueError, match="one CTA per row"):
        norm_mod.LoopedForwardConfig(row_config(65536, "f32"))


@pytest.mark.parametrize("n, kind", [(8192, "rms"), (8192, "layer"), (7176, "rms")])
def test_looped_forward_static_n(n, kind):
    """The routed float32 8192 looped forwards compile N in (LoopedForwardConfig.static_n): no segment loop (one
    backward branch less: none), 1/N a constant, no spills, and registers for 3 CTAs of 512 threads per SM (the
    dynamic-N kernel needs more: 2 CTAs); a static_n below 0 is refused."""
    from flydsl.kernels.norm_config import looped_forward_shape

    shape = looped_forward_shape(n, "f32", kind)
    assert shape is not None and shape[-1] is True, shape  # routed with the N compiled in
    rows, stats = flyc.TensorSpec((8, n), "f32"), flyc.TensorSpec((8,), "f32")
    weight = flyc.TensorSpec((n,), "f32")
    static = norm_mod.looped_forward_config(n, "f32", *shape)
    dynamic = norm_mod.looped_forward_config(n, "f32", *shape[:-1])
    assert (static.static_n, dynamic.static_n) == (n, 0)
    flags = FORWARD_FLAGS[kind]
    ptx = {
        cfg.static_n: assembled(
            norm_mod.norm_forward_looped_kernel.lower(
                rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
            )
        )
        for cfg in (static, dynamic)
    }
    assert "cvt.rn.f32.s64" not in ptx[n] and "cvt.rn.f32.s64" in ptx[0]  # 1/N folded (dynamic: N converted)
    assert ptx[n].count("bra") < ptx[0].count("bra")  # the segment loops are gone
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx[n]) == 0 and registers(ptx[n]) <= 40  # (65536 / (3 x 512) = 42, allocated by 8)
        assert registers(ptx[0]) > 40 or spill_bytes(ptx[0]) > 0
    with pytest.raises(ValueError, match="static_n"):
        norm_mod.LoopedForwardConfig(static.row, static_n=-1)


def _loads_before_first_store(ptx: str) -> int:
    """Global loads after the kernel's last barrier (its last row reduction) and before its first global store."""
    tail = ptx[ptx.rindex("bar.sync") :]
    return tail[: tail.index("st.global")].count("ld.global")


@pytest.mark.parametrize("group", [1, 2, 4])
def test_store_group_issues_its_loads_before_its_stores(group):
    """store_row computes ``store_group`` output chunks (here RMSNorm's weight loads) before the first of their
    stores: a load is never moved past a store that may alias it, so one chunk at a time waits for each load."""
    n, dtype = 16384, "bf16"
    cfg = dataclasses.replace(reduction.forward_row_config(n, dtype), store_group=group)
    assert cfg.chunks == 4 and cfg.threads_per_row == 512
    rows, stats, weight = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32"), flyc.TensorSpec((n,), dtype)
    args = (rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, FORWARD_FLAGS["rms"])
    ptx = assembled(norm_mod.norm_forward_kernel.lower(*args))
    assert _loads_before_first_store(ptx) == group
    with pytest.raises(ValueError, match="store_group"):
        dataclasses.replace(cfg, store_group=0)


def test_looped_forward_groups_the_output_loads():
    """The looped forward's output pass issues up to 4 chunks' loads (x again and the weight) before their stores;
    1024 x 8 float32 chunks fit 64 registers that way (one CTA per SM, as measured), without spills."""
    n, dtype = 32768, "f32"
    cfg = norm_mod.looped_forward_config(n, dtype, 1024, 8)
    assert cfg.row.store_group == 4
    rows, stats, weight = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32"), flyc.TensorSpec((n,), dtype)
    args = (rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, FORWARD_FLAGS["rms"])
    ptx = assembled(norm_mod.norm_forward_looped_kernel.lower(*args))
    assert _loads_before_first_store(ptx) == 2 * 4


def test_column_sum_shape_follows_the_partial_rows():
    """Few partial rows (clusters and teams: a group per 4-66 CTAs) take one slice of 256 columns per block, many
    (the register kernel's 2-3 CTAs per SM, one-CTA staged rows) 16 slices of 32; the 16-slice kernel keeps its
    shared-memory sum, the one-slice kernel has none."""
    assert norm_mod.column_sum_shape(4) == norm_mod.column_sum_shape(64) == (256, 1)
    assert norm_mod.column_sum_shape(65) == norm_mod.column_sum_shape(396) == (32, 16)
    partial, out = flyc.TensorSpec((16, 2 * 4096), "f32"), flyc.TensorSpec((4096,), "bf16")
    many = norm_mod.column_sum_kernel.lower(partial, out, out, 2, (32, 16)).ptx
    few = norm_mod.column_sum_kernel.lower(partial, out, out, 2, (256, 1)).ptx
    assert ".reqntid 512, 1, 1" in many and "bar.sync" in many and "ld.shared" in many
    assert ".reqntid 256, 1, 1" in few and "bar.sync" not in few and "ld.shared" not in few


@pytest.mark.parametrize("n, dtype", [(1024, "bf16"), (4100, "bf16"), (8192, "f32")])
def test_register_forward_cache_hints(n, dtype):
    """RowConfig.hints: the rows', output's and weights' 16-byte accesses carry their cache qualifiers (an L2
    policy created once), tails (N not a multiple of 16 bytes) stay per element and plain; no spills either way."""
    import dataclasses

    from flydsl.kernels.reduction import CacheHints, forward_row_config

    rows, weight, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((n,), dtype), flyc.TensorSpec((8,), "f32")
    hints = CacheHints(rows="evict_first", out="stream", vectors="evict_last")
    cfg = dataclasses.replace(forward_row_config(n, dtype), hints=hints)
    flags = FORWARD_FLAGS["layer"]
    ptx = assembled(
        norm_mod.norm_forward_kernel.lower(rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags)
    )
    if cfg.even:
        assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in ptx
        assert "ld.global.L1::evict_last.L2::cache_hint.v4.b32" in ptx
        assert "st.global.cs.v4.b32" in ptx
        assert "ld.global.v4" not in ptx and "st.global.v4" not in ptx  # every 16-byte access hinted
        assert ptx.count("createpolicy") == 2
    else:
        assert "cache_hint" not in ptx and ".cs." not in ptx
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0
    with pytest.raises(ValueError, match="CacheHints.out: stores take"):
        CacheHints(out="evict_last")
    assert CacheHints.parse("rows=stream,vectors=none") == CacheHints(rows="stream")
    assert CacheHints.parse("none") is forward_row_config(4096, "bf16").hints  # plain: the default, by identity
    with pytest.raises(ValueError, match="expected rows=, out= or vectors= HINT items, got 'row=stream'"):
        CacheHints.parse("row=stream")


@pytest.mark.parametrize("n, dtype", REGIME_CASES, ids=_regime_ids())
def test_softmax_compiles_in_every_regime(n, dtype):
    spec = flyc.TensorSpec((8, n), dtype)
    cfg = row_config(n, dtype)
    ptx = assembled(softmax_mod.softmax_forward_kernel.lower(spec, spec, cfg))
    assert "ex2.approx.ftz.f32" in ptx
    if cfg.even:
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= _accesses(ptx)  # 16-byte row tiles
    if cfg.cluster > 1:
        assert "mapa.shared::cluster" in ptx and "barrier.cluster.wait" in ptx
    for held in (4, 2):  # the backward's layouts: held=2 for 16-bit rows from 65536
        assembled(softmax_mod.softmax_backward_kernel.lower(spec, spec, spec, row_config(n, dtype, held=held)))


@pytest.mark.parametrize("n, dtype", REGIME_CASES[1::2], ids=_regime_ids()[1::2])
def test_norms_compile_in_every_regime(n, dtype):
    rows = flyc.TensorSpec((8, n), dtype)
    weight = flyc.TensorSpec((n,), "f32")
    stats = flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, n), "f32")
    variants = [
        norm_mod.NormFlags(False, weight=True, bias=True, mean=True, rstd=True),
        norm_mod.NormFlags(True, residual=True, weight=True),
    ]
    for flags in variants:
        cfg = row_config(n, dtype, held=2 if flags.residual else 1)
        module = norm_mod.norm_forward_kernel.lower(
            rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
        )
        assembled(module)
    for flags, sums in (
        (norm_mod.NormFlags(False, weight=True, bias=True), 2),
        (norm_mod.NormFlags(True, weight=True), 1),
    ):
        cfg = norm_mod.backward_config(n, dtype, sums)
        partial = flyc.TensorSpec((16, sums * n), "f32")
        ptx = assembled(
            norm_mod.norm_backward_kernel.lower(
                rows, rows, weight, stats, stats, rows, partial, exchange_spec(cfg), cfg, flags
            )
        )
        if cfg.smem_sums and cfg.row.even:
            assert "ld.shared.v4.b32" in ptx  # column sums in shared memory, 16 bytes at a time
        partial_out = flyc.TensorSpec((n,), dtype)
        for shape in (norm_mod.COLUMN_SUMS_MANY, norm_mod.COLUMN_SUMS_FEW):
            assembled(norm_mod.column_sum_kernel.lower(partial, partial_out, partial_out, sums, shape))


# (N, dtype) at the edges of the backward's regimes: 256-thread CTAs, one CTA of up to 1024 threads (bf16 8192, f32
# 4096), clusters; 16-bit rows with 16 values per thread in 256-thread CTAs (to 32768), else 8; two
# passes over rows longer than the registers hold (bf16 past 65536, f32 past 65536), LayerNorm's column sums in
# global memory (262144), odd N (element-wise accesses; with LayerNorm's column sums in global memory, a little
# spilling is accepted there).
BACKWARD_CASES = [
    (1024, "bf16"),
    (8192, "bf16"),
    (32768, "bf16"),
    (65536, "bf16"),
    (131072, "bf16"),
    (4096, "f32"),
    (65537, "f32"),
    (262144, "f32"),
]


@pytest.mark.parametrize("n, dtype", BACKWARD_CASES)
def test_norm_backward_regimes_assemble_without_spills(n, dtype):
    rows = flyc.TensorSpec((8, n), dtype)
    weight = flyc.TensorSpec((n,), dtype)
    stats = flyc.TensorSpec((8,), "f32")
    for flags, sums in (
        (norm_mod.NormFlags(False, weight=True, bias=True), 2),
        (norm_mod.NormFlags(True, weight=True), 1),
    ):
        cfg = norm_mod.backward_config(n, dtype, sums)
        assert cfg.row.capacity >= n and cfg.row.chunks % cfg.segment == 0
        partial = flyc.TensorSpec((16, sums * n), "f32")
        module = norm_mod.norm_backward_kernel.lower(
            rows, rows, weight, stats, stats, rows, partial, exchange_spec(cfg), cfg, flags
        )
        ptx = assembled(module)
        if flyc.find_ptxas() is not None:
            assert spill_bytes(ptx) <= STAGED_SPILLS.get((n, dtype, sums), 0), (n, dtype, cfg)
    if n != 262144:
        return
    odd = norm_mod.backward_config(262147, "f32", 2)
    partial = flyc.TensorSpec((16, 2 * 262147), "f32")
    spec = flyc.TensorSpec((8, 262147), "f32")
    assembled(
        norm_mod.norm_backward_kernel.lower(
            spec,
            spec,
            flyc.TensorSpec((262147,), "f32"),
            stats,
            stats,
            spec,
            partial,
            spec,
            odd,
            norm_mod.NormFlags(False, weight=True, bias=True),
        )
    )


def test_backward_configs():
    cfg = norm_mod.backward_config(1024, "bf16", 2)
    assert (cfg.row.block, cfg.row.rows_per_cta, cfg.blocks_per_sm, cfg.two_pass, cfg.smem_sums) == (
        256,
        4,
        3,
        False,
        True,
    )
    for dtype in ("bf16", "f32"):  # one CTA of 1024 threads rather than a cluster
        cfg = norm_mod.backward_config(8192, dtype, 2)
        assert (cfg.row.cluster, cfg.row.block, cfg.blocks_per_sm) == (1, 1024, 1)
    cfg = norm_mod.backward_config(32768, "bf16", 2, staged=False)
    assert (cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.blocks_per_sm) == (8, 256, 2, 3)
    # Staged (rows through a shared-memory ring) where the row fits 8 CTAs and their registers hold the sums.
    # The weight kept in registers, except in 16-bit LayerNorm's one CTA per row (it spills there).
    cfg = norm_mod.backward_config(32768, "bf16", 2)
    assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.stages, cfg.keep_weights) == (
        True,
        4,
        512,
        2,
        6,
        True,
    )
    for n, cluster, chunks in ((16384, 1, 2), (32768, 4, 1), (65536, 8, 1), (131072, 8, 2)):
        cfg = norm_mod.backward_config(n, "bf16", 1)
        assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.lag) == (True, cluster, 1024, chunks, 1)
        assert cfg.keep_weights and not cfg.hold
    cfg = norm_mod.backward_config(32768, "f32", 2)
    assert (cfg.row.cluster, cfg.row.block, cfg.stages, cfg.keep_weights) == (8, 512, 6, True)
    assert not norm_mod.backward_config(65538, "bf16", 1).staged  # N not a multiple of 16 bytes
    assert norm_mod.staged_config(131072, "f32", 1) is None  # 16 CTAs per row: not a cluster (a team)
    cfg = norm_mod.backward_config(131072, "bf16", 2, staged=False)
    assert (cfg.row.cluster, cfg.row.block, cfg.two_pass, cfg.smem_sums) == (8, 1024, True, True)
    cfg = norm_mod.backward_config(262144, "bf16", 2, staged=False)
    assert cfg.two_pass and not cfg.smem_sums  # 256 KB of column sums per CTA: in the partial rows instead
    assert norm_mod.backward_config(262144, "f32", 1, staged=False).smem_sums
    # Teams (rows over 9..64 CTAs sharing through global memory) past 8 CTAs per row: 16-bit rows in 512 x 2 CTAs
    # with a 6-row ring at lag 2 filled by bulk copies (LayerNorm's two sums spill at 1024 threads), float32 1024 x 2,
    # 3 rows, lag 1, cp.async.
    for n, dtype, sums, team, block, stages, lag in (
        (262144, "bf16", 2, 32, 512, 6, 2),
        (262144, "f32", 2, 32, 1024, 3, 1),
        (131072, "f32", 2, 16, 1024, 3, 1),
        (262144, "bf16", 1, 32, 512, 6, 2),
        (262144, "f32", 1, 32, 1024, 3, 1),
    ):
        cfg = norm_mod.backward_config(n, dtype, sums)
        assert cfg.keep_weights and cfg.prefetch_pairs == (block == 512)  # 16-bit teams read their pairs early
        assert cfg.bulk == (dtype == "bf16")
        assert (cfg.row.regime, cfg.row.cluster, cfg.row.cluster_shape, cfg.row.block, cfg.stages, cfg.lag) == (
            "team",
            team,
            None,
            block,
            stages,
            lag,
        )
    # 16-bit LayerNorm folds its mean into fmas in one CTA, 512 x 2 clusters and teams (not at 512 x 4, where it
    # spills); nothing else does
    for n, dtype, sums, folds in (
        (16384, "bf16", 2, True),
        (32768, "bf16", 2, True),
        (65536, "f16", 2, True),
        (131072, "bf16", 2, False),
        (262144, "bf16", 2, True),
        (262144, "bf16", 1, False),
        (32768, "f32", 2, False),
        (262144, "f32", 2, False),
    ):
        assert norm_mod.backward_config(n, dtype, sums).fma_dx == folds, (n, dtype, sums)
    cfg = norm_mod.backward_config(65536, "f32", 1)  # 8 CTAs of 1024 x 2 (the register kernel before kept weights)
    assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks) == (True, 8, 1024, 2)
    # One 1024 x 2 CTA per row for LayerNorm bf16 16384 (no spills since the column sums are pinned where updated)
    cfg = norm_mod.backward_config(16384, "bf16", 2)
    assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks) == (True, 1, 1024, 2)
    assert norm_mod.team_backward_config(1 << 21, "f32", 2) is None  # 256 CTAs per row: not a team
    for n in (1, 3, 1000, 4097, 65537, 1 << 20):
        for dtype in ("f32", "bf16"):
            for sums in (0, 1, 2):
                cfg = norm_mod.backward_config(n, dtype, sums)
                assert cfg.row.capacity >= n and cfg.blocks_per_sm * cfg.row.block <= 1024
                smem = sums * cfg.row.block * cfg.row.chunks * cfg.row.vec * 4
                assert not cfg.smem_sums or smem * cfg.blocks_per_sm <= 200 * 1024


# The staged kernel's shapes at the longest row each takes (8 CTAs per row), and one CTA per row.
STAGED_CASES = [
    (16384, "bf16", 2),
    (16384, "bf16", 1),
    (32768, "bf16", 2),
    (32768, "f32", 2),
    (32768, "f32", 1),
    (131072, "f16", "layer_w"),  # LayerNorm with a weight and no bias: one column sum
    (65536, "bf16", 2),
    (131072, "bf16", 2),  # 512 x 4 in a cluster of 8
    (65536, "bf16", 1),
    (131072, "bf16", 1),
    (65536, "f32", 2),
    (16384, "f32", 1),
]
TEAM_CASES = [(262144, "bf16", 2), (262144, "f32", 2), (262144, "bf16", 1)]  # teams of 32, 32 and 16 CTAs
# The one routed shape that spills: 16-bit LayerNorm at 512 x 4 (two column sums of 32 values each), 16 bytes of loop
# invariants reloaded per row from L1; measured 3.58 TB/s against 2.82 for the spill-free team (2026-12-01).
STAGED_SPILLS = {(131072, "bf16", 2): 16}


@pytest.mark.parametrize("n, dtype, sums", STAGED_CASES + TEAM_CASES)
def test_staged_backward_assembles_without_spills(n, dtype, sums):
    if sums == "layer_w":
        sums, flags = 1, norm_mod.NormFlags(False, weight=True)
    else:
        flags = norm_mod.NormFlags(sums == 1, weight=sums > 0, bias=sums > 1)
    cfg = norm_mod.backward_config(n, dtype, sums)
    assert cfg is not None and cfg.staged and cfg.row.capacity >= n
    assert cfg.ring_bytes <= 200 * 1024 and cfg.stages >= 2
    rows = flyc.TensorSpec((8, n), dtype)
    stats = flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, max(1, sums) * n), "f32")
    module = norm_mod.norm_backward_kernel.lower(
        rows, rows, flyc.TensorSpec((n,), dtype), stats, stats, rows, partial, exchange_spec(cfg), cfg, flags
    )
    ptx = assembled(module)
    ahead = cfg.stages - 1 - (cfg.lag if cfg.row.cluster > 1 else 0)  # rows in flight past the one it waits for
    if cfg.bulk:  # 16-bit LayerNorm teams: the ring filled by bulk copies on an mbarrier per slot
        assert "cp.async.bulk.shared::cluster.global" in ptx and "mbarrier.try_wait.parity" in ptx
    else:
        assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group \t{ahead};" in ptx
    assert "ld.shared.v4.b32" in ptx and "st.global.v4.b32" in ptx
    # Clusters: the row pairs pushed into the peers' inboxes (st.async + mbarrier); cluster barriers only at the
    # start (barriers initialized) and the end. Teams: tagged pairs in global memory (relaxed 64-bit stores, read
    # a rank's pair per 16-byte relaxed load; no fence).
    pushed = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
    assert pushed == (cfg.row.regime == "cluster") and ptx.count("barrier.cluster.wait") == (2 if pushed else 0)
    teamed = "st.relaxed.gpu.global.b64" in ptx and "ld.relaxed.gpu.global.v2.b64" in ptx
    per_row = ptx.replace("fence.mbarrier_init.release.cluster", "").replace("fence.proxy.async.shared::cta", "")
    assert teamed == cfg.row.team and (not cfg.row.team or ("fence" not in per_row and ".release" not in per_row))
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) <= STAGED_SPILLS.get((n, dtype, sums), 0), (n, dtype, cfg)


def test_teams_only_where_all_their_ctas_fit():
    """A team's CTAs wait for each other, one per SM: on a device with fewer SMs than a team has CTAs (MIG slices
    of 16 or 32 SMs) the backward takes the register kernel (hardware clusters), which cannot wait on absent CTAs."""
    for n, dtype, sums in [(262144, "bf16", 2), (262144, "f32", 2), (262144, "f32", 1)]:  # teams of 32 CTAs
        team = norm_mod.backward_config(n, dtype, sums)
        assert team.row.team and team.row.cluster > 16
        assert norm_mod.resident_backward_config(n, dtype, sums, True, 132) is team
        small = norm_mod.resident_backward_config(n, dtype, sums, True, 16)
        assert not small.row.team and small == norm_mod.backward_config(n, dtype, sums, False)
        assert small.row.cluster_shape is not None and small.row.cluster <= 8
    assert norm_mod.resident_backward_config(262144, "f32", 2, True, 32).row.team is True  # 32 CTAs per row fit
    assert norm_mod.resident_backward_config(524288, "f32", 2, True, 32).row.team is False  # 64 do not


def test_backward_groups():
    # Clusters: 7/8 of what the SMs would hold (a second wave otherwise); CTAs: all; never more than the rows need.
    regs = norm_mod.backward_config(32768, "bf16", 2, staged=False)
    assert norm_mod.backward_groups(regs, 8192, 132) == 3 * 132 // 8 * 7 // 8
    assert norm_mod.backward_groups(norm_mod.backward_config(1024, "bf16", 2), 1 << 20, 132) == 3 * 132
    assert norm_mod.backward_groups(norm_mod.backward_config(1024, "bf16", 2), 9, 132) == 3  # 4 rows per CTA
    assert norm_mod.backward_groups(norm_mod.backward_config(262144, "f32", 2), 1, 132) == 1
    staged = norm_mod.backward_config(65536, "bf16", 2)  # the driver's count of clusters, when it gives one
    assert norm_mod.backward_groups(staged, 4096, 132, active=16) == 16
    assert norm_mod.backward_groups(staged, 4096, 132) == 132 // 8 * 7 // 8


def test_validation_names_the_argument():
    x = fake()
    with pytest.raises(ValueError, match="x: expected a 2-D tensor"):
        norms.softmax(fake((64,)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float16 or bfloat16, got i32"):
        norms.softmax(fake(typestr="<i4"))
    with pytest.raises(ValueError, match="x: expected unit stride on the last dim"):
        norms.softmax(fake(strides=(4, 8)))
    with pytest.raises(ValueError, match="out: expected N = 64"):
        norms.softmax(x, out=fake((4, 32)))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        norms.softmax(x, out=fake(typestr="<f2"))
    with pytest.raises(TypeError, match=r"allocated with the input's framework \(torch or cupy\).*pass the output"):
        norms.softmax(x)
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\)"):
        norms.rms_norm(x, fake((32,)), out=fake())
    with pytest.raises(ValueError, match="eps: expected a non-negative number"):
        norms.layer_norm(x, None, None, eps=-1.0, out=fake())
    with pytest.raises(TypeError, match="rstd: expected dtype float32"):
        norms.rms_norm(x, None, out=fake(), rstd=FakeGpuTensor((4,), "<f2"))
    with pytest.raises(ValueError, match=r"mean: expected shape \(4,\)"):
        norms.layer_norm_backward(x, x, None, fake((5,)), fake((4,)), dx=fake())
    with pytest.raises(ValueError, match="residual: expected 4 rows"):
        norms.fused_add_rms_norm(x, fake((3, 64)), None, out=fake(), residual_out=fake())
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        norms.softmax_backward(fake(typestr="<f2"), x, dx=fake())


def test_backward_scratch_needs_torch_or_cupy(monkeypatch):
    """The backward with a weight sums dweight (and dbias) through partial rows it allocates itself, in the input's
    framework: arrays of any other framework get an error that says so before anything is launched (not "pass the
    output", which the caller cannot do for scratch memory)."""
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    x, w, stats = fake((4, 64)), fake((64,)), fake((4,))
    with pytest.raises(
        TypeError, match="dweight/dbias partial sums: this kernel's scratch memory .* pass torch or cupy"
    ):
        norms.layer_norm_backward(x, x, w, stats, stats, dx=fake(), dweight=fake((64,)), dbias=fake((64,)))


def test_backward_team_needs_an_allocating_framework(monkeypatch):
    """A backward without weight keeps no column sums (nothing to allocate) but past 8 CTAs per row runs as a team,
    whose exchange tensor comes from the input's framework: arrays of other frameworks (these fakes) take the
    register kernel instead, before any launch, rather than fail for scratch memory they cannot pass."""
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    taken = []

    class Launch:
        def __init__(self, *args):
            self.cfg = args[-2]

        def launch(self, **kwargs):
            taken.append(self.cfg)

    monkeypatch.setattr(norm_mod, "norm_backward_kernel", Launch)
    x, stats = fake((2, 262144)), fake((2,))
    team = norm_mod.backward_config(262144, "f32", 0)
    assert team.row.team
    norms.rms_norm_backward(x, x, None, stats, dx=fake((2, 262144)))
    assert taken[-1] == norm_mod.backward_config(262144, "f32", 0, False) and not taken[-1].row.team
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    monkeypatch.setattr(norm_mod, "_team_exchange", lambda cfg, like, rows, what: like.obj)
    norms.rms_norm_backward(x, x, None, stats, dx=fake((2, 262144)))
    assert taken[-1] == team


def _inbox_schedule(size: int, rows: int, lag: int, slots: int, seed: int) -> str | None:
    """Runs the staged kernels' cluster exchange (each CTA at step k pushes its pair of row k into every CTA's inbox
    slot k % slots, then waits for all pairs of row k - lag and consumes them) under a random interleaving of the
    CTAs. Returns what went wrong: a push into a slot whose previous row its owner has not consumed yet (it would
    overwrite unread pairs, or complete the wrong mbarrier phase), or a deadlock; None when the run completes."""
    import random

    rng = random.Random(seed)
    step, pushed = [0] * size, [False] * size
    consumed = [-1] * size  # the last row each CTA consumed (in order)
    arrived = [dict() for _ in range(size)]  # per CTA: row -> pairs arrived
    while any(k < rows + lag for k in step):
        ready = []
        for c in range(size):
            k = step[c]
            if k >= rows + lag:
                continue
            done = k - lag
            if not pushed[c] or done < 0 or arrived[c].get(done, 0) == size:
                ready.append(c)
        if not ready:
            return f"deadlock at steps {step}"
        c = rng.choice(ready)
        k = step[c]
        if not pushed[c]:
            pushed[c] = True
            if k < rows:
                for peer in range(size):
                    if k - slots > consumed[peer]:
                        return f"row {k} pushed into CTA {peer}'s slot before it consumed row {k - slots}"
                    arrived[peer][k] = arrived[peer].get(k, 0) + 1
            continue
        if k - lag >= 0:
            consumed[c] = k - lag
        step[c], pushed[c] = k + 1, False
    return None


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_inbox_slots_are_never_overwritten_unread(lag):
    """The cluster exchange's inbox (norm_staged.inbox_slots, shared by the staged backward and forward): with that
    many slots no push overwrites pairs not yet consumed, and the exchange never deadlocks, whatever the CTAs' relative
    speeds (random interleavings); one slot fewer is caught overwriting (the check is not vacuous)."""
    staged = importlib.import_module("flydsl.kernels.norm_staged")
    slots = staged.inbox_slots(lag)
    for size in (2, 4, 8):
        for seed in range(40):
            assert _inbox_schedule(size, 13, lag, slots, seed) is None, (size, seed)
    caught = [_inbox_schedule(2, 13, lag, slots - 1, seed) for seed in range(200)]
    assert any(c is not None and "before it consumed" in c for c in caught)


@pytest.mark.parametrize(
    "n, dtype, sums, weight",
    [
        (32768, "bf16", 2, "bf16"),
        (65536, "bf16", 1, "bf16"),
        (65536, "bf16", 1, "f32"),  # RMSNorm's float32 weight on 16-bit rows (torch's usual mix)
        (131072, "bf16", 1, "f32"),
        (262144, "bf16", 2, "bf16"),  # a team
        (262144, "bf16", 1, "f32"),  # a team of 512 x 4: 32 float32 weights per thread
        (32768, "f32", 1, "f32"),
        (262144, "f32", 2, "f32"),
    ],
)
def test_staged_backward_keeps_weights_in_registers(n, dtype, sums, weight):
    """``keep_weights`` (the routed staged shapes): each thread's weight chunks loaded once, before the row loop (whose
    first step waits for the ring's copies), none per row; no spills, float32 weights on 16-bit rows included."""
    # the ring filled by cp.async (its wait_group marks the row loop; bulk fills: test_staged_backward_bulk_ring)
    cfg = dataclasses.replace(norm_mod.backward_config(n, dtype, sums), bulk=False)
    assert cfg.staged and cfg.keep_weights
    flags = norm_mod.NormFlags(sums == 1, weight=True, bias=sums > 1)
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, sums * n), "f32")

    def lower(config):
        return norm_mod.norm_backward_kernel.lower(
            rows, rows, flyc.TensorSpec((n,), weight), stats, stats, rows, partial, exchange_spec(config), config, flags
        )

    ptx = assembled(lower(cfg))

    def vector_loads(text):  # the weight's 16-byte loads (rstd and mean are scalars)
        return [m.start() for m in re.finditer(r"ld\.global(\.nc)?\.v4\.", text)]

    loads = vector_loads(ptx)
    per_chunk = 2 if weight == "f32" and dtype != "f32" else 1  # 8 float32 values: two 16-byte loads
    assert len(loads) == cfg.row.chunks * per_chunk and max(loads) < ptx.index("cp.async.wait_group")
    plain = lower(dataclasses.replace(cfg, keep_weights=False)).ptx
    assert min(vector_loads(plain)) > plain.index("cp.async.wait_group")  # without: loaded per row, in the loop
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) <= STAGED_SPILLS.get((n, dtype, sums), 0), (n, dtype, weight, cfg)


def _backward_ptx(n: int, dtype: str, sums: int, cfg, flags) -> str:
    """The backward kernel with ``cfg`` on (8, n) rows of ``dtype`` (a weight of that dtype), assembled."""
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    partial = flyc.TensorSpec((16, max(1, sums) * n), "f32")
    weight = flyc.TensorSpec((n,), dtype)
    module = norm_mod.norm_backward_kernel.lower(
        rows, rows, weight, stats, stats, rows, partial, exchange_spec(cfg), cfg, flags
    )
    return assembled(module)


@pytest.mark.parametrize("n, dtype, sums", [(262144, "bf16", 2), (262144, "f32", 1), (131072, "bf16", 1)])
def test_staged_backward_bulk_ring(n, dtype, sums):
    """``bulk`` (a row over CTAs: a team, or RMSNorm bf16 131072's cluster): the ring filled by bulk copies completing
    on an mbarrier per slot (one per source and chunk in each fill: the prologue's ``ahead`` rows and one per row
    step), waited on instead of ``cp.async.wait_group``; no per-thread ``cp.async``; no spills."""
    cfg = dataclasses.replace(norm_mod.backward_config(n, dtype, sums), bulk=True)
    assert cfg.row.cluster > 1
    ptx = _backward_ptx(n, dtype, sums, cfg, norm_mod.NormFlags(sums == 1, weight=True, bias=sums > 1))
    ahead = cfg.stages - 1 - cfg.lag
    assert ptx.count("cp.async.bulk.shared::cluster.global") == 2 * cfg.row.chunks * ahead + 2 * cfg.row.chunks
    assert "cp.async.cg" not in ptx and "mbarrier.try_wait.parity" in ptx
    assert ("fence.proxy.async.shared::cta" in ptx) and ptx.count("mbarrier.init") >= cfg.stages
    with pytest.raises(ValueError, match="bulk fills the ring"):
        dataclasses.replace(norm_mod.backward_config(262144, "bf16", 2), bulk=True, hold=True, lag=0)
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0


def test_team_prefetch_reads_pairs_a_step_early():
    """``prefetch_pairs`` (routed for 16-bit teams): the first warp's load of row k - lag's tagged pairs is issued,
    predicated, right after row k's first pass, before the block reduction's barrier; without it there is no
    predicated load. Both assemble without spills."""
    n, dtype = 262144, "bf16"
    flags = norm_mod.NormFlags(False, weight=True, bias=True)
    routed = dataclasses.replace(norm_mod.backward_config(n, dtype, 2), bulk=False)  # wait_group marks the loop
    assert routed.row.team and routed.prefetch_pairs
    for prefetch in (True, False):
        cfg = dataclasses.replace(routed, prefetch_pairs=prefetch)
        ptx = _backward_ptx(n, dtype, 2, cfg, flags)
        early = "@p ld.relaxed.gpu.global.v2.b64" in ptx
        assert early == prefetch
        if prefetch:  # issued before the row's block reduction (its first barrier in the row loop)
            loop = ptx.index("cp.async.wait_group")
            assert loop < ptx.index("@p ld.relaxed.gpu.global.v2.b64") < ptx.index("bar.sync", loop)
        if flyc.find_ptxas() is not None:
            assert spill_bytes(ptx) == 0


def test_moments_merge_reduces_one_triple_per_step():
    """reduction.moments_merge through row_reduce: a (count, sum, M2) triple per shuffle step, every lane given its
    group's first lane's result (shfl.sync.idx), one barrier; a cluster's row cannot reduce a combine function."""
    n, dtype = 8192, "f32"
    cfg = norm_mod.looped_forward_config(n, dtype, 512, 1)
    rows, stats, weight = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32"), flyc.TensorSpec((n,), dtype)
    args = (rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, FORWARD_FLAGS["layer"])
    ptx = assembled(norm_mod.norm_forward_looped_kernel.lower(*args))
    assert ptx.count("shfl.sync.bfly") == 3 * (5 + 4)  # 32 lanes, then the row's 16 warps
    assert ptx.count("shfl.sync.idx") == 3 and ptx.count("bar.sync") == 1

    @flyc.kernel
    def merged_over_a_cluster(x: fx.Tensor, cfg: fx.Constexpr[RowConfig]):
        pos = reduction.row_position(cfg)
        one = fx.Float32(1.0)
        reduction.row_reduce(cfg, pos, reduction.row_smem(cfg, 1, 3), 0, [one, one, one], reduction.moments_merge)

    clustered = row_config(262144, "f32")
    assert clustered.cluster > 1
    with pytest.raises(ValueError, match="combine function"):
        merged_over_a_cluster.lower(flyc.TensorSpec((8, 262144), "f32"), clustered)
