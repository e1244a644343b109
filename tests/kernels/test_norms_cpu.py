"""flydsl.kernels without a GPU: every kernel compiles, in every regime (warp, block, cluster; even and odd N), to PTX
that ptxas assembles for sm_90a with the accesses we expect; the configs cover N; argument validation names the
argument before anything is launched."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import tempfile

import pytest

import flydsl.compiler as flyc
from flydsl.kernels import norms
from flydsl.kernels.reduction import RowConfig, row_config

softmax_mod = importlib.import_module("flydsl.kernels.softmax")
norm_mod = importlib.import_module("flydsl.kernels.normalization")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))


class FakeGpuTensor:
    """Only ``__cuda_array_interface__`` (never dereferenced)."""

    def __init__(self, shape, typestr="<f4", strides=None, pointer=1 << 20):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (pointer, False),
            "strides": strides,
            "version": 3,
        }


_TYPESTR = {"f32": "<f4", "f16": "<f2"}

# (N, dtype): one per regime edge: warp (1 thread per row ... 32), block, cluster; odd N (per-element tails).
REGIME_CASES = [(1, "f32"), (3, "f16"), (1024, "bf16"), (4097, "f32"), (32768, "bf16"), (65537, "f16"), (262144, "f32")]


def _regime_ids():
    return [f"{n}-{dtype}-{row_config(n, dtype).regime}" for n, dtype in REGIME_CASES]


def _assembled(module) -> str:
    if flyc.find_ptxas() is not None:
        assert module.cubin is not None  # ptxas assembled it for sm_90a
    return module.ptx


def _exchange(cfg):
    """The backward's ``exchange`` argument: a team's tagged row sums, else unused."""
    return flyc.TensorSpec((8, norm_mod.exchange_columns(cfg)), "f32")


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
    for flags in _FORWARD_FLAGS.values():
        cfg = forward_row_config(n, dtype, held=2 if flags.residual else 1)
        for weight_dtype in {dtype, "f32"}:
            weight = flyc.TensorSpec((n,), weight_dtype)
            module = norm_mod.norm_forward_kernel.lower(
                rows, rows, weight, weight, rows, rows, stats, stats, 1e-5, cfg, flags
            )
            ptx = _assembled(module)
            if flyc.find_ptxas() is not None:
                assert _spill_bytes(ptx) == 0, (n, dtype, cfg, weight_dtype)
            early = cfg.threads_per_row <= 32 and dtype != "f32" and weight_dtype != "f32"
            first_shuffle = ptx.index("shfl.sync")
            loads_before = ptx[:first_shuffle].count("ld.global.")
            loads = ptx.count("ld.global.")
            assert (loads_before == loads) == early, (n, dtype, flags, weight_dtype, loads_before, loads)


@pytest.mark.parametrize("n, dtype", REGIME_CASES, ids=_regime_ids())
def test_softmax_compiles_in_every_regime(n, dtype):
    spec = flyc.TensorSpec((8, n), dtype)
    cfg = row_config(n, dtype)
    ptx = _assembled(softmax_mod.softmax_forward_kernel.lower(spec, spec, cfg))
    assert "ex2.approx.f32" in ptx
    if cfg.even:
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= _accesses(ptx)  # 16-byte row tiles
    if cfg.cluster > 1:
        assert "mapa.shared::cluster" in ptx and "barrier.cluster.wait" in ptx
    for held in (4, 2):  # the backward's layouts: held=2 for 16-bit rows from 65536
        _assembled(softmax_mod.softmax_backward_kernel.lower(spec, spec, spec, row_config(n, dtype, held=held)))


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
        _assembled(module)
    for flags, sums in (
        (norm_mod.NormFlags(False, weight=True, bias=True), 2),
        (norm_mod.NormFlags(True, weight=True), 1),
    ):
        cfg = norm_mod.backward_config(n, dtype, sums)
        partial = flyc.TensorSpec((16, sums * n), "f32")
        ptx = _assembled(
            norm_mod.norm_backward_kernel.lower(
                rows, rows, weight, stats, stats, rows, partial, _exchange(cfg), cfg, flags
            )
        )
        if cfg.smem_sums and cfg.row.even:
            assert "ld.shared.v4.b32" in ptx  # column sums in shared memory, 16 bytes at a time
        partial_out = flyc.TensorSpec((n,), dtype)
        _assembled(norm_mod.column_sum_kernel.lower(partial, partial_out, partial_out, sums))


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


def _spill_bytes(ptx: str) -> int:
    """ptxas -v's spill stores for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        report = subprocess.run(
            [flyc.find_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.devnull], capture_output=True, text=True
        )
    found = re.search(r"(\d+) bytes spill stores", report.stdout + report.stderr)
    assert found, report.stderr
    return int(found.group(1))


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
            rows, rows, weight, stats, stats, rows, partial, _exchange(cfg), cfg, flags
        )
        ptx = _assembled(module)
        if flyc.find_ptxas() is not None:
            assert _spill_bytes(ptx) == 0, (n, dtype, cfg)
    if n != 262144:
        return
    odd = norm_mod.backward_config(262147, "f32", 2)
    partial = flyc.TensorSpec((16, 2 * 262147), "f32")
    spec = flyc.TensorSpec((8, 262147), "f32")
    _assembled(
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
    cfg = norm_mod.backward_config(32768, "bf16", 2)
    assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.stages) == (True, 4, 512, 2, 4)
    cfg = norm_mod.backward_config(131072, "bf16", 1)
    assert (cfg.staged, cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.stages) == (True, 8, 512, 4, 3)
    assert not norm_mod.backward_config(65538, "bf16", 1).staged  # N not a multiple of 16 bytes
    assert norm_mod.staged_config(131072, "f32", 1) is None  # 16 CTAs per row: not a cluster (a team)
    cfg = norm_mod.backward_config(131072, "bf16", 2, staged=False)
    assert (cfg.row.cluster, cfg.row.block, cfg.two_pass, cfg.smem_sums) == (8, 1024, True, True)
    cfg = norm_mod.backward_config(262144, "bf16", 2, staged=False)
    assert cfg.two_pass and not cfg.smem_sums  # 256 KB of column sums per CTA: in the partial rows instead
    assert norm_mod.backward_config(262144, "f32", 1, staged=False).smem_sums
    # Teams (rows over 9..64 CTAs sharing through global memory): LayerNorm past 8 CTAs per row; RMSNorm keeps the
    # register kernel there (measured faster).
    assert norm_mod.backward_config(262144, "bf16", 1).row.regime == "cluster"
    for n, dtype, sums, team in ((131072, "bf16", 2, 16), (262144, "bf16", 2, 32), (262144, "f32", 2, 64)):
        cfg = norm_mod.backward_config(n, dtype, sums)
        assert (cfg.row.regime, cfg.row.cluster, cfg.row.cluster_shape, cfg.stages, cfg.lag) == (
            "team",
            team,
            None,
            6,
            2,
        )
    assert norm_mod.backward_config(65536, "f32", 1).row.regime == "cluster"  # the register kernel, measured faster
    assert norm_mod.team_backward_config(1 << 21, "f32", 2) is None  # 256 CTAs per row: not a team
    for n in (1, 3, 1000, 4097, 65537, 1 << 20):
        for dtype in ("f32", "bf16"):
            for sums in (0, 1, 2):
                cfg = norm_mod.backward_config(n, dtype, sums)
                assert cfg.row.capacity >= n and cfg.blocks_per_sm * cfg.row.block <= 1024
                smem = sums * cfg.row.block * cfg.row.chunks * cfg.row.vec * 4
                assert not cfg.smem_sums or smem * cfg.blocks_per_sm <= 200 * 1024


# The staged kernel's shapes at the longest row each takes (8 CTAs per row), and one CTA per row.
STAGED_CASES = [(16384, "bf16", 2), (65536, "bf16", 2), (131072, "bf16", 1), (65536, "f32", 2), (16384, "f32", 1)]
TEAM_CASES = [(131072, "bf16", 2), (262144, "f32", 2)]  # teams of 16 and 64 CTAs


@pytest.mark.parametrize("n, dtype, sums", STAGED_CASES + TEAM_CASES)
def test_staged_backward_assembles_without_spills(n, dtype, sums):
    cfg = norm_mod.backward_config(n, dtype, sums)
    assert cfg is not None and cfg.staged and cfg.row.capacity >= n
    assert cfg.ring_bytes <= 200 * 1024 and cfg.stages >= 2
    rows = flyc.TensorSpec((8, n), dtype)
    stats = flyc.TensorSpec((8,), "f32")
    flags = norm_mod.NormFlags(sums == 1, weight=sums > 0, bias=sums > 1)
    partial = flyc.TensorSpec((16, max(1, sums) * n), "f32")
    module = norm_mod.norm_backward_kernel.lower(
        rows, rows, flyc.TensorSpec((n,), dtype), stats, stats, rows, partial, _exchange(cfg), cfg, flags
    )
    ptx = _assembled(module)
    ahead = cfg.stages - 1 - (cfg.lag if cfg.row.cluster > 1 else 0)  # rows in flight past the one it waits for
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group \t{ahead};" in ptx
    assert "ld.shared.v4.b32" in ptx and "st.global.v4.b32" in ptx
    # Clusters: the row pairs pushed into the peers' inboxes (st.async + mbarrier); cluster barriers only at the
    # start (barriers initialized) and the end. Teams: tagged pairs in global memory (relaxed 64-bit stores, read
    # a rank's pair per 16-byte relaxed load; no fence).
    pushed = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
    assert pushed == (cfg.row.regime == "cluster") and ptx.count("barrier.cluster.wait") == (2 if pushed else 0)
    teamed = "st.relaxed.gpu.global.b64" in ptx and "ld.relaxed.gpu.global.v2.b64" in ptx
    assert teamed == cfg.row.team and (not cfg.row.team or ("fence" not in ptx and ".release" not in ptx))
    if flyc.find_ptxas() is not None:
        assert _spill_bytes(ptx) == 0, (n, dtype, cfg)


def test_teams_only_where_all_their_ctas_fit():
    """A team's CTAs wait for each other, one per SM: on a device with fewer SMs than a team has CTAs (MIG slices
    of 16 or 32 SMs) the backward takes the register kernel (hardware clusters), which cannot wait on absent CTAs."""
    for n, dtype in [(262144, "bf16"), (131072, "f32"), (262144, "f32")]:
        team = norm_mod.backward_config(n, dtype, 2)
        assert team.row.team and team.row.cluster > 16
        assert norm_mod.resident_backward_config(n, dtype, 2, True, 132) is team
        small = norm_mod.resident_backward_config(n, dtype, 2, True, 16)
        assert not small.row.team and small == norm_mod.backward_config(n, dtype, 2, False)
        assert small.row.cluster_shape is not None and small.row.cluster <= 8
    assert norm_mod.resident_backward_config(262144, "f32", 2, True, 32).row.team is False  # 64 CTAs per row


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


def _x(shape=(4, 64), typestr="<f4", strides=None):
    return FakeGpuTensor(shape, typestr, strides)


def test_validation_names_the_argument():
    x = _x()
    with pytest.raises(ValueError, match="x: expected a 2-D tensor"):
        norms.softmax(_x((64,)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float16 or bfloat16, got i32"):
        norms.softmax(_x(typestr="<i4"))
    with pytest.raises(ValueError, match="x: expected unit stride on the last dim"):
        norms.softmax(_x(strides=(4, 8)))
    with pytest.raises(ValueError, match="out: expected N = 64"):
        norms.softmax(x, out=_x((4, 32)))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        norms.softmax(x, out=_x(typestr="<f2"))
    with pytest.raises(TypeError, match=r"allocated with the input's framework \(torch or cupy\).*pass the output"):
        norms.softmax(x)
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\)"):
        norms.rms_norm(x, _x((32,)), out=_x())
    with pytest.raises(ValueError, match="eps: expected a non-negative number"):
        norms.layer_norm(x, None, None, eps=-1.0, out=_x())
    with pytest.raises(TypeError, match="rstd: expected dtype float32"):
        norms.rms_norm(x, None, out=_x(), rstd=FakeGpuTensor((4,), "<f2"))
    with pytest.raises(ValueError, match=r"mean: expected shape \(4,\)"):
        norms.layer_norm_backward(x, x, None, _x((5,)), _x((4,)), dx=_x())
    with pytest.raises(ValueError, match="residual: expected 4 rows"):
        norms.fused_add_rms_norm(x, _x((3, 64)), None, out=_x(), residual_out=_x())
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        norms.softmax_backward(_x(typestr="<f2"), x, dx=_x())


# The staged forward (norm_forward_staged_kernel), as routed by default in a cluster: one CTA per row (bf16 32768:
# LayerNorm in a 2-row ring, RMSNorm in 3), clusters of 2, 4 and 8 at lag 0 (LayerNorm, RMSNorm; bf16, f16, f32 from
# 32768; at 8 CTAs with the weights kept), the fused add's clusters at lag 1, and the fused add's single-row ring of
# 1 MB rows (bf16 262144, f32 131072), at the longest rows each shape takes (teams and the softmax's below).
STAGED_FORWARD_CASES = [
    (32768, "bf16", "layer"),
    (32768, "bf16", "rms"),
    (32768, "f32", "layer"),
    (65536, "f16", "layer"),
    (262144, "bf16", "layer"),
    (65536, "f32", "rms"),
    (131072, "f32", "layer"),
    (131072, "bf16", "fused"),
    (65536, "f32", "fused"),
    (32768, "f32", "rms"),
    (262144, "bf16", "fused"),
    (131072, "f32", "fused"),
    (262144, "bf16", "rms"),  # weights kept
    (131072, "f32", "rms"),
]
_FORWARD_FLAGS = {
    "layer": norm_mod.NormFlags(False, weight=True, bias=True, mean=True, rstd=True),
    "rms": norm_mod.NormFlags(True, weight=True, rstd=True),
    "fused": norm_mod.NormFlags(True, residual=True, weight=True, rstd=True),
}


@pytest.mark.parametrize("n, dtype, variant", STAGED_FORWARD_CASES)
def test_staged_forward_assembles_without_spills(n, dtype, variant):
    flags = _FORWARD_FLAGS[variant]
    cfg = norm_mod.routed_staged_forward_config(n, dtype, variant)
    assert cfg is not None and cfg.row.capacity >= n and cfg.row.cluster <= 8 and cfg.ring_bytes <= 200 * 1024
    ahead = cfg.stages - 1 - cfg.lag
    assert ahead >= 1 or (cfg.stages == 1 and cfg.lag == 0)  # rows in flight, or a single-row ring
    rows = flyc.TensorSpec((8, n), dtype)
    weight = flyc.TensorSpec((n,), dtype)
    stats = flyc.TensorSpec((8,), "f32")
    module = norm_mod.norm_forward_staged_kernel.lower(
        rows, rows, weight, weight, rows, rows, stats, stats, rows, 1e-5, cfg, flags
    )
    ptx = _assembled(module)
    # The ring: 16-byte cp.async copies, waiting for the row `ahead` rows behind the newest; read back 16 bytes at a
    # time, written out 16 bytes at a time; rows wider than a CTA's ring row in a cluster.
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group \t{ahead};" in ptx
    assert "ld.shared.v4.b32" in ptx and "st.global.v4.b32" in ptx
    # Clusters: each CTA's pair pushed into its peers' inboxes (st.async completing their mbarriers), waited for
    # through the mbarrier; a cluster barrier only at the start (barriers initialized) and at the end, none per row.
    pushed = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
    assert pushed == (cfg.row.regime == "cluster")
    assert ("mbarrier.try_wait.parity" in ptx) == pushed
    assert ptx.count("barrier.cluster.wait") == (2 if pushed else 0)
    assert ptx.count("barrier.cluster.arrive") == (2 if pushed else 0)
    # Block reductions per row: LayerNorm two (the sum, then the squares about the CTA's mean), RMSNorm one.
    assert ptx.count("bar.sync") == (1 if flags.rms else 2)
    if flyc.find_ptxas() is not None:
        assert _spill_bytes(ptx) == 0, (n, dtype, cfg)


@pytest.mark.parametrize(
    "n, dtype, variant, shape",
    [
        (131072, "bf16", "layer", dict(lag=0, stages=2)),  # 32 registers of packed weight and bias per thread
        (262144, "bf16", "layer", dict(lag=0, stages=2)),
        (131072, "bf16", "rms", dict(lag=0, hold=4)),  # with every chunk of x held too
        (65536, "f32", "layer", dict(lag=0)),
    ],
    ids=str,
)
def test_staged_forward_keeps_weights_in_registers(n, dtype, variant, shape):
    """``keep_weights``: the weight (and bias) loaded once per CTA, before the row loop, and widened where used: in
    the loop there are no global loads but the ring's copies, and no spills (the widening is pinned in the loop:
    hoisted out of it, the wide values spilled 128-200 bytes)."""
    cfg = norm_mod.staged_forward_config(n, dtype, False, keep_weights=True, **shape)
    assert cfg.keep_weights
    rows, weight, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((n,), dtype), flyc.TensorSpec((8,), "f32")
    flags = _FORWARD_FLAGS[variant]
    module = norm_mod.norm_forward_staged_kernel.lower(
        rows, rows, weight, weight, rows, rows, stats, stats, rows, 1e-5, cfg, flags
    )
    ptx = _assembled(module)
    kept = cfg.row.chunks * (1 if flags.rms else 2)
    assert ptx.count("ld.global.v4.b32") == kept
    # all of them before the row loop, whose first step waits for the ring's copies
    assert ptx.rindex("ld.global.v4.b32") < ptx.index("cp.async.wait_group")
    plain = norm_mod.staged_forward_config(n, dtype, False, **shape)  # without: loaded in the loop, per row
    lowered = norm_mod.norm_forward_staged_kernel.lower(
        rows, rows, weight, weight, rows, rows, stats, stats, rows, 1e-5, plain, flags
    )
    assert lowered.ptx.index("ld.global.v4.b32") > lowered.ptx.index("cp.async.wait_group")
    if dtype != "f32":  # float32 weights on 16-bit rows are not kept (twice the registers: they spilled 112 bytes)
        wide = flyc.TensorSpec((n,), "f32")
        mixed = norm_mod.norm_forward_staged_kernel.lower(
            rows, rows, wide, wide, rows, rows, stats, stats, rows, 1e-5, cfg, flags
        )
        assert mixed.ptx.index("ld.global.v4.b32") > mixed.ptx.index("cp.async.wait_group")
        if flyc.find_ptxas() is not None:
            assert _spill_bytes(mixed.ptx) == 0
    if flyc.find_ptxas() is not None:
        assert _spill_bytes(ptx) == 0, (n, dtype, cfg)


@pytest.mark.parametrize("variant", ["layer", "rms", "fused", "softmax"])
@pytest.mark.parametrize(
    "n, dtype", [(262144, "f32"), (196612, "f32"), (524288, "f32"), (524288, "bf16")]
)  # 16 CTAs per row; 13, the last one short; 32; 16 (the fused add 32)
def test_staged_forward_teams_assemble(variant, n, dtype):
    """Rows over more CTAs than a cluster holds (float32 262144: 16 CTAs of 64 KB ring rows, the fused add 32) as a
    team (``staged_forward_config(team=True)``, routed there): each CTA's pair written to the row's line of the
    exchange tensor as tagged 64-bit stores, the first warp polling one rank's pair per lane (one 16-byte
    ``ld.relaxed.gpu`` per poll) and combining them by shuffles; no cluster barriers, no mbarriers, no spills. Teams
    of more than 32: none."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    assert norm_mod.staged_forward_config(n, dtype, variant == "fused") is None  # no cluster holds the row
    cfg = norm_mod.staged_forward_config(n, dtype, variant == "fused", team=True)
    if variant == "fused" and n == 524288 and dtype == "f32":  # 64 CTAs of 2 x 32 KB
        assert cfg is None
        return
    count = -(-n // (cfg.row.vec * 1024 * cfg.row.chunks))
    assert cfg.row.team and cfg.row.cluster == count and cfg.row.cluster_shape is None and cfg.lag == 1
    routed = norm_mod.routed_staged_forward_config(n, dtype, variant)  # the same, weights kept by the norms
    kept = variant == "rms" or (variant == "layer" and dtype == "f32")  # not 16-bit LayerNorm's (they spill)
    assert routed == dataclasses.replace(cfg, keep_weights=kept)
    rows, stats = flyc.TensorSpec((8, n), dtype), flyc.TensorSpec((8,), "f32")
    exchange = flyc.TensorSpec((8, norm_mod.exchange_columns(cfg)), "f32")
    for each in {cfg, routed}:
        if variant == "softmax":
            module = staged.softmax_forward_staged_kernel.lower(rows, rows, exchange, each)
        else:
            weight = flyc.TensorSpec((n,), dtype)
            module = norm_mod.norm_forward_staged_kernel.lower(
                rows, rows, weight, weight, rows, rows, stats, stats, exchange, 1e-5, each, _FORWARD_FLAGS[variant]
            )
        ptx = _assembled(module)
        assert ptx.count("st.relaxed.gpu.global.b64") == 2 and "ld.relaxed.gpu.global.v2.b64" in ptx
        assert "barrier.cluster" not in ptx and "mbarrier" not in ptx and "st.async" not in ptx
        if flyc.find_ptxas() is not None:
            assert _spill_bytes(ptx) == 0, (n, variant, each)


def test_staged_forward_team_must_fit_the_device(monkeypatch):
    """A team's CTAs all wait for each other: one larger than the SMs hold at once is refused before launch."""
    cfg = norm_mod.staged_forward_config(262144, "f32", team=True)
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    assert norm_mod.staged_forward_groups(cfg, 1000, 0) == 132 // 16
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 14)  # e.g. a MIG slice
    with pytest.raises(ValueError, match="team of 16 CTAs"):
        norm_mod.staged_forward_groups(cfg, 1000, 0)


def _shape(cfg):
    """(cluster or team, threads, chunks, stages, lag, hold), then keep_weights and team where set."""
    if cfg is None:
        return None
    shape = (cfg.row.cluster, cfg.row.block, cfg.row.chunks, cfg.stages, cfg.lag, cfg.hold)
    return shape + (cfg.keep_weights, cfg.row.team)[: 2 if cfg.row.team else 1 if cfg.keep_weights else 0]


def test_staged_forward_configs():
    # staged_forward_config's defaults: a ring row of 64 KB per CTA (1024 threads x 4 chunks; 2 chunks of x and 2 of
    # the residual), as few CTAs per row as hold it, 3 rows in the ring.
    shapes = {
        (n, dtype, residual): _shape(norm_mod.staged_forward_config(n, dtype, residual))
        for n, dtype, residual in [(32768, "bf16", False), (262144, "bf16", False), (65536, "f32", True)]
    }
    assert shapes == {
        (32768, "bf16", False): (1, 1024, 4, 3, 0, 0),
        (262144, "bf16", False): (8, 1024, 4, 3, 1, 0),
        (65536, "f32", True): (8, 1024, 2, 3, 1, 0),
    }
    # None: a row over more than 8 CTAs, N not a multiple of 16 bytes, a ring too small for the pipeline (lag 2
    # needs 4 rows: 256 KB), or larger than the shared memory.
    assert norm_mod.staged_forward_config(262144, "f32") is None
    assert norm_mod.staged_forward_config(262144, "bf16", residual=True) is None
    assert norm_mod.staged_forward_config(65540, "bf16") is None
    assert norm_mod.staged_forward_config(65536, "bf16", lag=2) is None
    assert norm_mod.staged_forward_config(65536, "bf16", chunks=2, lag=2).stages == 4
    assert norm_mod.staged_forward_config(65536, "bf16", stages=4) is None  # 256 KB
    # A single-row ring (lag 0 only): 128 KB per CTA, the 1 MB rows over 8 CTAs.
    assert _shape(norm_mod.staged_forward_config(262144, "f32", chunks=8, lag=0)) == (8, 1024, 8, 1, 0, 0)
    assert norm_mod.staged_forward_config(262144, "f32", chunks=8, lag=1) is None
    assert norm_mod.staged_forward_config(262144, "f32", chunks=8, stages=2, lag=0) is None  # 256 KB
    assert norm_mod.staged_forward_config(65536, "bf16", stages=2, lag=1) is None  # 2 rows, none ahead
    # Held chunks: a count up to the thread's chunks (True: all), lag 0 only in a cluster.
    assert norm_mod.staged_forward_config(65536, "bf16", lag=0, hold=True).hold == 4
    assert norm_mod.staged_forward_config(65536, "bf16", lag=1, hold=False).hold == 0
    assert norm_mod.staged_forward_config(65536, "bf16", lag=1, hold=2) is None
    with pytest.raises(ValueError, match=r"hold: expected 0\.\.4 chunks"):
        norm_mod.staged_forward_config(65536, "bf16", lag=0, hold=8)

    # Routed by default (forward_shape): per kind, from the sweep of norms_forward_staged_2026-11-30.json.
    routed = {
        (kind, dtype, n): _shape(norm_mod.routed_staged_forward_config(n, dtype, kind))
        for kind in norm_mod.FORWARD_KINDS
        for dtype in ("bf16", "f32")
        for n in (16384, 32768, 65536, 262144)
    }
    assert routed == {
        ("layer", "bf16", 16384): None,  # short rows: the register kernel, unchanged
        ("layer", "bf16", 32768): (1, 1024, 4, 2, 0, 3),  # a 2-row ring, 3 of 4 chunks held in registers
        ("layer", "bf16", 65536): (2, 1024, 4, 2, 0, 3),  # clusters at lag 0, a 2-row ring
        ("layer", "bf16", 262144): (8, 1024, 4, 2, 0, 0, True),  # 8 CTAs per row: weights kept, no chunks held
        ("layer", "f32", 16384): None,
        ("layer", "f32", 32768): (2, 1024, 4, 2, 0, 3),
        ("layer", "f32", 65536): (4, 1024, 4, 2, 0, 3),
        ("layer", "f32", 262144): (16, 1024, 4, 3, 1, 0, True, True),  # a team of 16 CTAs per row, weights kept
        ("rms", "bf16", 16384): None,
        ("rms", "bf16", 32768): (1, 1024, 4, 3, 0, 4),  # RMSNorm: a 3-row ring
        ("rms", "bf16", 65536): (2, 1024, 4, 3, 0, 4),
        ("rms", "bf16", 262144): (8, 1024, 4, 3, 0, 0, True),
        ("rms", "f32", 16384): None,
        ("rms", "f32", 32768): (2, 1024, 4, 3, 0, 4),
        ("rms", "f32", 65536): (4, 1024, 4, 3, 0, 4),
        ("rms", "f32", 262144): (16, 1024, 4, 3, 1, 0, True, True),
        ("fused", "bf16", 16384): None,
        ("fused", "bf16", 32768): (2, 1024, 2, 3, 1, 0),  # two sources: lag 1
        ("fused", "bf16", 65536): (4, 1024, 2, 3, 1, 0),
        ("fused", "bf16", 262144): (8, 1024, 4, 1, 0, 0),  # 1 MB rows: a single-row ring
        ("fused", "f32", 16384): None,
        ("fused", "f32", 32768): None,  # the register kernel is at the bar there
        ("fused", "f32", 65536): (8, 1024, 2, 3, 1, 0),
        ("fused", "f32", 262144): (32, 1024, 2, 3, 1, 0, False, True),  # 2 MB rows: a team of 32
        ("softmax", "bf16", 16384): None,
        ("softmax", "bf16", 32768): (1, 1024, 4, 2, 0, 0),  # one CTA per row: not held (slower)
        ("softmax", "bf16", 65536): (2, 1024, 4, 3, 0, 4),
        ("softmax", "bf16", 262144): (8, 1024, 4, 3, 0, 4),
        ("softmax", "f32", 16384): None,
        ("softmax", "f32", 32768): None,
        ("softmax", "f32", 65536): (4, 512, 8, 3, 0, 8),  # 512 threads x 8 chunks, held
        ("softmax", "f32", 262144): (16, 1024, 4, 3, 1, 0, False, True),
    }
    assert norm_mod.routed_staged_forward_config(131072, "f32", "fused") is not None  # 1 MB: 2 x 512 KB
    # 16-bit teams (524288): LayerNorm without its weights kept (they spill), RMSNorm with them
    assert _shape(norm_mod.routed_staged_forward_config(524288, "bf16", "layer")) == (16, 1024, 4, 3, 1, 0, False, True)
    assert _shape(norm_mod.routed_staged_forward_config(524288, "bf16", "rms")) == (16, 1024, 4, 3, 1, 0, True, True)
    assert norm_mod.routed_staged_forward_config(1 << 20, "f32", "layer") is None  # 64 CTAs: the register kernel
    assert norm_mod.routed_staged_forward_config(65540, "bf16", "rms") is None  # N not a multiple of 16 bytes
    assert _shape(norm_mod.routed_staged_forward_config(32768, "f16", "layer")) == (1, 1024, 4, 2, 0, 3)
    with pytest.raises(ValueError, match="kind: expected one of"):
        norm_mod.forward_shape(65536, "bf16", "layernorm")
    # The persistent grid: the driver's count of clusters, when it gives one (as the staged backward's).
    cfg = norm_mod.staged_forward_config(262144, "bf16")
    assert norm_mod.backward_groups(cfg, 1024, 132, active=16) == 16
    assert norm_mod.backward_groups(cfg, 3, 132, active=16) == 3
    assert norm_mod.backward_groups(norm_mod.staged_forward_config(32768, "bf16"), 8192, 132) == 132


def test_backward_scratch_needs_torch_or_cupy(monkeypatch):
    """The backward with a weight sums dweight (and dbias) through partial rows it allocates itself, in the input's
    framework: arrays of any other framework get an error that says so before anything is launched (not "pass the
    output", which the caller cannot do for scratch memory)."""
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    x, w, stats = _x((4, 64)), _x((64,)), _x((4,))
    with pytest.raises(
        TypeError, match="dweight/dbias partial sums: this kernel's scratch memory .* pass torch or cupy"
    ):
        norms.layer_norm_backward(x, x, w, stats, stats, dx=_x(), dweight=_x((64,)), dbias=_x((64,)))


def test_staged_forward_is_the_default(monkeypatch):
    """The forward takes the staged kernel by default where a config exists and the rows are 16-byte aligned;
    staged=False and STAGED_FORWARD off (FLYDSL_NORM_STAGED_FORWARD=0) force the register kernel, as do short rows,
    unaligned rows and the kinds the register kernel serves at the bar (the fused add f32 32768)."""
    taken = []

    class Launch:
        def __init__(self, *args):
            self.args = args

        def launch(self, **kwargs):
            taken.append(("register", self.args[-2]))

    monkeypatch.setattr(norm_mod, "norm_forward_kernel", Launch)
    monkeypatch.setattr(norm_mod, "_launch_staged_forward", lambda args, eps, cfg, *rest: taken.append(("staged", cfg)))
    assert norm_mod.STAGED_FORWARD  # the environment of the tests does not set FLYDSL_NORM_STAGED_FORWARD=0
    n = 65536
    x, out = _x((4, n), "<f2"), _x((4, n), "<f2")
    host = importlib.import_module("flydsl.kernels.host")
    xt, ot = host.row_tensor(x, "x"), host.row_tensor(out, "out")
    norms.rms_norm(x, None, out=out)
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(n, "f16", "rms"))
    norms.layer_norm(x, None, None, out=out)
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(n, "f16", "layer"))
    norms.fused_add_rms_norm(x, _x((4, n), "<f2"), None, out=out, residual_out=_x((4, n), "<f2"))
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(n, "f16", "fused"))
    norm_mod.forward(xt, None, None, None, ot, None, None, None, 1e-6, rms=True, staged=False)
    assert taken[-1] == ("register", row_config(n, "f16"))
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", False)
    norms.rms_norm(x, None, out=out)
    assert taken[-1][0] == "register"
    norm_mod.forward(xt, None, None, None, ot, None, None, None, 1e-6, rms=True, staged=True)
    assert taken[-1][0] == "staged"
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", True)
    unaligned = host.row_tensor(FakeGpuTensor((4, n), "<f2", pointer=(1 << 20) + 2), "x")
    norm_mod.forward(unaligned, None, None, None, ot, None, None, None, 1e-6, rms=True)
    assert taken[-1][0] == "register"
    short = host.row_tensor(_x((4, 16384), "<f2"), "x")
    norm_mod.forward(short, None, None, None, short, None, None, None, 1e-6, rms=True)
    assert taken[-1] == ("register", row_config(16384, "f16"))
    wide = _x((4, 32768), "<f4")
    norms.fused_add_rms_norm(wide, _x((4, 32768), "<f4"), None, out=_x((4, 32768), "<f4"), residual_out=wide)
    assert taken[-1][0] == "register"  # the fused add f32 32768: the register kernel
    norms.layer_norm(wide, None, None, out=_x((4, 32768), "<f4"))
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(32768, "f32", "layer"))
    # A team (float32 262144: 16 CTAs per row) where the SMs hold it at once and the input's framework allocates its
    # exchange tensor (torch, cupy), else the register kernel: these fake arrays allocate nothing.
    long = _x((2, 262144), "<f4")
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    norms.rms_norm(long, None, out=_x((2, 262144), "<f4"))
    assert taken[-1][0] == "register"
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    norms.rms_norm(long, None, out=_x((2, 262144), "<f4"))
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(262144, "f32", "rms"))
    assert taken[-1][1].row.team and taken[-1][1].row.cluster == 16
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 14)  # e.g. a MIG slice
    norms.rms_norm(long, None, out=_x((2, 262144), "<f4"))
    assert taken[-1][0] == "register"


def test_staged_softmax_is_the_default(monkeypatch):
    """softmax.forward takes the staged kernel where softmax_staged_config has one and the rows are 16-byte aligned
    (by default; staged=False and STAGED_FORWARD off keep the register kernel), else the register kernel."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    host = importlib.import_module("flydsl.kernels.host")
    taken = []

    class Launch:
        def __init__(self, *args):
            self.args = args

        def launch(self, **kwargs):
            taken.append(
                ("staged" if isinstance(self.args[-1], norm_mod.StagedForwardConfig) else "register",)
                + (self.args[-1],)
            )

    monkeypatch.setattr(softmax_mod, "softmax_forward_kernel", Launch)
    monkeypatch.setattr(staged, "softmax_forward_staged_kernel", Launch)
    monkeypatch.setattr(staged, "staged_forward_groups", lambda cfg, rows, device: 1)
    n = 65536
    x, out = _x((4, n), "<f2"), _x((4, n), "<f2")
    norms.softmax(x, out)
    assert taken[-1] == ("staged", staged.softmax_staged_config(n, "f16"))
    xt, ot = host.row_tensor(x, "x"), host.row_tensor(out, "out")
    softmax_mod.forward(xt, ot, staged=False)
    assert taken[-1] == ("register", row_config(n, "f16"))
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", False)
    norms.softmax(x, out)
    assert taken[-1][0] == "register"
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", True)
    unaligned = host.row_tensor(FakeGpuTensor((4, n), "<f2", pointer=(1 << 20) + 2), "x")
    softmax_mod.forward(unaligned, ot)
    assert taken[-1][0] == "register"
    for rows_n, typestr in (((4, 16384), "<f2"), ((4, 32768), "<f4"), ((4, 65540), "<f2")):
        softmax_mod.forward(host.row_tensor(_x(rows_n, typestr), "x"), host.row_tensor(_x(rows_n, typestr), "out"))
        assert taken[-1][0] == "register", rows_n
    # float32 262144 takes a team of 16 CTAs; not where the SMs cannot hold one at once, nor where the input's
    # framework cannot allocate its exchange tensor
    assert staged.softmax_staged_config(262144, "f32").row.team
    long = host.row_tensor(_x((2, 262144), "<f4"), "x"), host.row_tensor(_x((2, 262144), "<f4"), "out")
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    softmax_mod.forward(*long)
    assert taken[-1][0] == "register"  # a fake array: no framework to allocate with
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    monkeypatch.setattr(staged, "forward_exchange", lambda cfg, x, rows: x)
    softmax_mod.forward(*long)
    assert taken[-1] == ("staged", staged.softmax_staged_config(262144, "f32"))
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 14)
    softmax_mod.forward(*long)
    assert taken[-1][0] == "register"


@pytest.mark.parametrize(
    "n, dtype", [(32768, "bf16"), (65536, "f16"), (262144, "bf16"), (65536, "f32"), (131072, "f32")]
)
def test_staged_softmax_assembles_without_spills(n, dtype):
    """The staged softmax (the norms' staged forward with SoftmaxFlags): per row a block max and a block sum
    of ex2 (two barriers), each CTA's (max, sum) pushed to its peers, no cluster barrier per row."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    cfg = staged.softmax_staged_config(n, dtype)
    assert cfg is not None and cfg.row.capacity >= n
    rows = flyc.TensorSpec((8, n), dtype)
    ptx = _assembled(staged.softmax_forward_staged_kernel.lower(rows, rows, rows, cfg))
    ahead = cfg.stages - 1 - cfg.lag
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group \t{ahead};" in ptx
    assert "ex2.approx.f32" in ptx and "st.global.v4.b32" in ptx and ptx.count("bar.sync") == 2
    pushed = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
    assert pushed == (cfg.row.cluster > 1) and ptx.count("barrier.cluster.wait") == (2 if pushed else 0)
    assert _shift_guarded_against_minus_inf(ptx), "a CTA's part all -inf would push (-inf, NaN): the row turns NaN"
    # One ex2 per element whose exp is held in registers (then one for the CTA's rescale), two for the others; one
    # per rank of the cluster to combine the pairs.
    values, held = cfg.row.chunks * cfg.row.vec, cfg.hold * cfg.row.vec
    combine = cfg.row.cluster if cfg.row.cluster > 1 else 0
    assert ptx.count("ex2.approx.f32") == held + (1 if held else 0) + 2 * (values - held) + combine
    if flyc.find_ptxas() is not None:
        assert _spill_bytes(ptx) == 0, (n, dtype, cfg)
    assert staged.softmax_staged_config(16384, dtype) is None and staged.softmax_staged_config(n + 1, dtype) is None


def _shift_guarded_against_minus_inf(ptx: str) -> bool:
    """The staged softmax's CTA shift is 0, not -inf * log2(e), where the CTA's max is -inf (its part of the row all
    -inf, e.g. a causal mask's tail): a compare of the max with -inf whose predicate selects 0.0 for the shift.
    Without it, exp(-inf - -inf) = NaN makes the CTA's sum NaN, and NaN * exp(-inf - max) = NaN the whole row."""
    for pred in re.findall(r"setp\.(?:ne|gt|neu|gtu)\.f32\s+(%p\d+), %r\d+, 0fFF800000;", ptx):
        if re.search(rf"selp\.f32\s+%r\d+, (?:%r\d+, 0f00000000|0f00000000, %r\d+), {pred};", ptx):
            return True
    return False


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
