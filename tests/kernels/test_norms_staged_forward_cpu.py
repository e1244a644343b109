"""flydsl.kernels' staged forward without a GPU (norm_forward_staged_kernel, the staged softmax): the shapes
``forward_shape`` routes (rings, held chunks, kept weights, clusters, teams) assemble for sm_90a without spills,
with the accesses and exchanges expected; where the forward takes the staged kernel and where the register kernel."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest

import flydsl.compiler as flyc
from flydsl.kernels import norm_config, norms
from flydsl.kernels.reduction import row_config

from .norms_cpu_support import (
    FORWARD_FLAGS,
    FakeGpuTensor,
    assembled,
    fake,
    norm_mod,
    private_cache,  # noqa: F401 (an autouse fixture)
    softmax_mod,
    spill_bytes,
)

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
    (131072, "bf16", "layer"),  # two CTAs per SM
    (131072, "bf16", "fused"),
    (65536, "f32", "fused"),
    (32768, "f32", "rms"),
    (262144, "bf16", "fused"),
    (131072, "f32", "fused"),
    (262144, "bf16", "rms"),  # weights kept
    (131072, "f32", "rms"),
    (131064, "bf16", "layer"),  # clusters of 8, unequal shares: rows strided, one count per rank
    (98304, "f32", "layer"),  # clusters of 8, equal shares: rows claimed
]


@pytest.mark.parametrize("n, dtype, variant", STAGED_FORWARD_CASES)
def test_staged_forward_assembles_without_spills(n, dtype, variant):
    flags = FORWARD_FLAGS[variant]
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
    ptx = assembled(module)
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
        assert spill_bytes(ptx) == 0, (n, dtype, cfg)


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
    flags = FORWARD_FLAGS[variant]
    module = norm_mod.norm_forward_staged_kernel.lower(
        rows, rows, weight, weight, rows, rows, stats, stats, rows, 1e-5, cfg, flags
    )
    ptx = assembled(module)
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
            assert spill_bytes(mixed.ptx) == 0
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0, (n, dtype, cfg)


def test_staged_forward_several_ctas_per_sm_assemble():
    """Two 512-thread CTAs per SM (single-row rings of 64 KB): ptxas caps the registers at 64, without spills."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    rows = flyc.TensorSpec((8, 32768), "bf16")
    cfg = norm_mod.staged_forward_config(32768, "bf16", chunks=8, stages=1, threads=512, blocks_per_sm=2)
    for module in (
        staged.softmax_forward_staged_kernel.lower(rows, rows, rows, cfg),
        norm_mod.norm_forward_staged_kernel.lower(
            rows,
            rows,
            *[flyc.TensorSpec((32768,), "bf16")] * 2,
            rows,
            rows,
            *[flyc.TensorSpec((8,), "f32")] * 2,
            rows,
            1e-5,
            cfg,
            FORWARD_FLAGS["layer"],
        ),
    ):
        ptx = assembled(module)
        assert ".minnctapersm 2" in ptx
        if flyc.find_ptxas() is not None:
            assert spill_bytes(ptx) == 0


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
                rows, rows, weight, weight, rows, rows, stats, stats, exchange, 1e-5, each, FORWARD_FLAGS[variant]
            )
        ptx = assembled(module)
        assert ptx.count("st.relaxed.gpu.global.b64") == 2 and "ld.relaxed.gpu.global.v2.b64" in ptx
        assert "barrier.cluster" not in ptx and "mbarrier" not in ptx and "st.async" not in ptx
        if flyc.find_ptxas() is not None:
            assert spill_bytes(ptx) == 0, (n, variant, each)


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

    # Several CTAs per SM: their rings share the shared memory, their threads an SM's 2048; the grid takes them all.
    two = norm_mod.staged_forward_config(32768, "bf16", chunks=8, stages=1, threads=512, blocks_per_sm=2)
    assert two.blocks_per_sm == 2 and two.row.cluster == 1 and two.ring_bytes == 64 * 1024
    assert norm_mod.staged_forward_config(32768, "bf16", chunks=8, threads=512, blocks_per_sm=2).stages == 1
    assert norm_mod.staged_forward_config(32768, "bf16", chunks=8, stages=2, threads=512, blocks_per_sm=2) is None
    assert norm_mod.staged_forward_config(32768, "bf16", chunks=4, threads=1024, blocks_per_sm=3) is None  # threads
    assert norm_mod.backward_groups(two, 8192, 132) == 264
    with pytest.raises(ValueError, match="blocks_per_sm: expected a positive int"):
        norm_mod.staged_forward_config(32768, "bf16", blocks_per_sm=0)
    # Routed by default (forward_shape): per kind, from the sweep of norms_forward_staged/2026-11-30_d932a98.json.
    routed = {
        (kind, dtype, n): _shape(norm_mod.routed_staged_forward_config(n, dtype, kind))
        for kind in norm_mod.FORWARD_KINDS
        for dtype in ("bf16", "f32")
        for n in (16384, 32768, 65536, 262144)
    }
    assert routed == {
        ("layer", "bf16", 16384): None,  # short rows: the register kernel, unchanged
        ("layer", "bf16", 32768): (1, 512, 8, 1, 0, 0),  # two CTAs per SM, single-row rings, rows claimed
        ("layer", "bf16", 65536): (2, 1024, 4, 2, 0, 0, True),  # clusters at lag 0, a 2-row ring, weights kept
        ("layer", "bf16", 262144): (8, 1024, 4, 2, 0, 0, True),  # 8 CTAs per row: weights kept, no chunks held
        ("layer", "f32", 16384): None,
        ("layer", "f32", 32768): (2, 1024, 4, 2, 0, 2),  # 2 chunks held
        ("layer", "f32", 65536): (4, 1024, 4, 2, 0, 0, True),
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
        ("softmax", "bf16", 32768): (1, 512, 8, 1, 0, 0),  # two CTAs per SM, single-row rings, rows claimed
        ("softmax", "bf16", 65536): (1, 1024, 8, 1, 0, 0),  # one CTA per row: a single-row ring of 128 KB, claimed
        ("softmax", "bf16", 262144): (8, 1024, 4, 3, 0, 4),
        ("softmax", "f32", 16384): None,
        ("softmax", "f32", 32768): None,
        ("softmax", "f32", 65536): (4, 512, 8, 3, 0, 8),  # 512 threads x 8 chunks, held
        ("softmax", "f32", 262144): (16, 1024, 4, 3, 1, 0, False, True),
    }
    assert norm_mod.routed_staged_forward_config(131072, "f32", "fused") is not None  # 1 MB: 2 x 512 KB
    # 16-bit LayerNorm at 3-4 ring rows: clusters of 8 two-per-SM 512-thread CTAs, weights kept (not float32's)
    for n, dtype in ((131072, "bf16"), (131072, "f16"), (98304, "bf16")):
        cfg = norm_mod.routed_staged_forward_config(n, dtype, "layer")
        assert _shape(cfg) == (8, 512, 4, 2, 0, 0, True) and cfg.blocks_per_sm == 2, (n, dtype)
    assert norm_mod.routed_staged_forward_config(65536, "f32", "layer").blocks_per_sm == 1
    # 16-bit teams (524288): LayerNorm without its weights kept (they spill), RMSNorm with them
    assert _shape(norm_mod.routed_staged_forward_config(524288, "bf16", "layer")) == (16, 1024, 4, 3, 1, 0, False, True)
    assert _shape(norm_mod.routed_staged_forward_config(524288, "bf16", "rms")) == (16, 1024, 4, 3, 1, 0, True, True)
    assert norm_mod.routed_staged_forward_config(1 << 20, "f32", "layer") is None  # 64 CTAs: the register kernel
    assert norm_mod.routed_staged_forward_config(65540, "bf16", "rms") is None  # N not a multiple of 16 bytes
    assert _shape(norm_mod.routed_staged_forward_config(32768, "f16", "layer")) == (1, 512, 8, 1, 0, 0)
    # Rows claimed from a counter (claim_rows): where one CTA holds a row (16-bit softmax and LayerNorm at 32768 in
    # two CTAs per SM, softmax up to 65536 in one 128 KB CTA, RMSNorm's 3-row ring) and by RMSNorm and softmax
    # clusters at lag 0 (not 16-bit softmax at 8 CTAs: it would spill), LayerNorm's clusters of 8 where every CTA
    # holds N / 8 elements (equal_shares; not 40968 f32 over 8 CTAs: per-rank counts, which would spill); no team.
    claimed = {
        (kind, dtype, n)
        for kind in norm_mod.FORWARD_KINDS
        for dtype in ("bf16", "f16", "f32")
        for n in (32768, 40968, 65536, 131072, 262144)
        if getattr(norm_mod.routed_staged_forward_config(n, dtype, kind), "claim_rows", False)
    }
    sixteen = {("softmax", 32768), ("layer", 32768), ("softmax", 40968), ("softmax", 65536), ("softmax", 131072)}
    sixteen |= {("layer", 40968), ("layer", 65536), ("layer", 131072), ("layer", 262144)}
    sixteen |= {("rms", n) for n in (32768, 40968, 65536, 131072, 262144)}
    wide = {("rms", n) for n in (32768, 40968, 65536, 131072)} | {("softmax", 65536), ("softmax", 131072)}
    wide |= {("layer", 32768), ("layer", 40968), ("layer", 65536), ("layer", 131072)}
    assert claimed == {(k, d, n) for d in ("bf16", "f16") for k, n in sixteen} | {(k, "f32", n) for k, n in wide}
    assert norm_mod.routed_staged_forward_config(32768, "bf16", "softmax").blocks_per_sm == 2
    assert norm_mod.staged_forward_config(65536, "bf16", lag=1, claim_rows=True) is None  # a cluster at lag 1
    assert norm_mod.staged_forward_config(65536, "bf16", lag=0, claim_rows=True).claim_rows
    assert norm_mod.staged_forward_config(65536, "bf16", team=True, claim_rows=True) is None  # a team
    with pytest.raises(ValueError, match="claim_rows needs one CTA per row or a cluster at lag 0"):
        dataclasses.replace(norm_mod.routed_staged_forward_config(65536, "bf16", "fused"), claim_rows=True)
    with pytest.raises(ValueError, match="kind: expected one of"):
        norm_mod.forward_shape(65536, "bf16", "layernorm")
    # The persistent grid: the driver's count of clusters, when it gives one (as the staged backward's).
    cfg = norm_mod.staged_forward_config(262144, "bf16")
    assert norm_mod.backward_groups(cfg, 1024, 132, active=16) == 16
    assert norm_mod.backward_groups(cfg, 3, 132, active=16) == 3
    assert norm_mod.backward_groups(norm_mod.staged_forward_config(32768, "bf16"), 8192, 132) == 132


def test_looped_forward_routing(monkeypatch):
    """norm_config.LOOPED_FORWARD's rows take the looped kernel (one CTA per row, its threads), ahead of the staged
    kernel (float32 LayerNorm 1793-6144 and 8192 too); N not a multiple of 16 bytes, 16-bit LayerNorm, and
    staged=False keep the others."""
    taken = []

    class Launch:
        def __init__(self, *args):
            self.cfg = args[-2]

        def launch(self, **kwargs):
            taken.append((self.cfg, kwargs))

    monkeypatch.setattr(norm_mod, "norm_forward_looped_kernel", Launch)
    monkeypatch.setattr(norm_mod, "norm_forward_kernel", Launch)
    monkeypatch.setattr(norm_mod, "_launch_staged_forward", lambda args, eps, cfg, *rest: taken.append((cfg, None)))
    for n, typestr, threads, chunks in ((8192, "<f2", 512, 2), (32768, "<f2", 512, 8), (4096, "<f4", 512, 2)) + (
        (32768, "<f4", 1024, 8),
    ):
        x = fake((5, n), typestr)
        norms.rms_norm(x, None, out=fake((5, n), typestr))
        cfg, kwargs = taken[-1]
        assert isinstance(cfg, norm_mod.LoopedForwardConfig) and kwargs == {"grid": 5, "block": threads}
        assert (cfg.row.threads_per_row, cfg.row.chunks) == (threads, chunks)
        assert cfg.row.hints.rows == "evict_last" and cfg.reread.rows == "evict_first"
    x = fake((5, 4096), "<f4")
    norms.fused_add_rms_norm(x, fake((5, 4096), "<f4"), None, out=fake((5, 4096), "<f4"), residual_out=x)
    assert isinstance(taken[-1][0], norm_mod.LoopedForwardConfig) and taken[-1][0].row.block == 1024
    x = fake((5, 1024), "<f4")  # the fused add f32 1024: 256 threads of one chunk
    norms.fused_add_rms_norm(x, fake((5, 1024), "<f4"), None, out=fake((5, 1024), "<f4"), residual_out=x)
    assert isinstance(taken[-1][0], norm_mod.LoopedForwardConfig) and taken[-1][0].row.block == 256
    for n, typestr in ((8200 - 4, "<f2"), (65536, "<f2")):  # 8196 % 8: per-element tails; 65536: the staged kernel
        norms.rms_norm(fake((5, n), typestr), None, out=fake((5, n), typestr))
        assert not isinstance(taken[-1][0], norm_mod.LoopedForwardConfig), n
    for n, threads in ((2048, 128), (3072, 128), (4096, 256), (6144, 256), (8192, 512)):  # float32 LayerNorm
        norms.layer_norm(fake((5, n), "<f4"), fake((n,), "<f4"), fake((n,), "<f4"), out=fake((5, n), "<f4"))
        cfg, kwargs = taken[-1]
        assert isinstance(cfg, norm_mod.LoopedForwardConfig) and kwargs == {"grid": 5, "block": threads}, n
        assert cfg.static_n == (n if n == 8192 else 0), n  # 8192: N compiled in, 3 CTAs per SM
    assert cfg.blocks_per_sm == 3
    for n in (8184, 10240):  # float32 LayerNorm past the timed N: the register kernel
        norms.layer_norm(fake((5, n), "<f4"), None, None, out=fake((5, n), "<f4"))
        assert not isinstance(taken[-1][0], norm_mod.LoopedForwardConfig), n
    norms.layer_norm(fake((5, 8192), "<f2"), None, None, out=fake((5, 8192), "<f2"))
    register = norm_mod.forward_row_config(8192, "f16", 1, 2)  # 16-bit: weight loads 2 chunks ahead of the stores
    assert taken[-1][0] == register and register.store_group == 2 == norm_config.FORWARD_STORE_GROUP["f16"]
    # Its hinted accesses are 16-byte instructions: rows or a weight off a 16-byte boundary take the register kernel.
    shifted = FakeGpuTensor((5, 8192), "<f2", pointer=(1 << 20) + 4)
    norms.rms_norm(shifted, None, out=fake((5, 8192), "<f2"))
    assert taken[-1][0] == register
    weight = FakeGpuTensor((8192,), "<f2", pointer=(1 << 20) + 8)
    norms.rms_norm(fake((5, 8192), "<f2"), weight, out=fake((5, 8192), "<f2"))
    assert taken[-1][0] == register
    xt = importlib.import_module("flydsl.kernels.host").row_tensor(fake((5, 8192), "<f2"), "x")
    norm_mod.forward(xt, None, None, None, xt, None, None, None, 1e-6, rms=True, staged=False)
    assert taken[-1][0] == register


def test_staged_forward_is_the_default(monkeypatch):
    """The forward takes the staged kernel by default where a config exists and the rows are 16-byte aligned;
    staged=False and STAGED_FORWARD off (FLYDSL_NORM_STAGED_FORWARD=0) force the register kernel, as do short rows,
    unaligned rows and the rows the looped forward takes first (the fused add f32 32768)."""
    taken = []

    class Launch:
        kind = "register"

        def __init__(self, *args):
            self.args = args

        def launch(self, **kwargs):
            taken.append((self.kind, self.args[-2]))

    class LoopedLaunch(Launch):
        kind = "looped"

    monkeypatch.setattr(norm_mod, "norm_forward_kernel", Launch)
    monkeypatch.setattr(norm_mod, "norm_forward_looped_kernel", LoopedLaunch)
    monkeypatch.setattr(norm_mod, "_launch_staged_forward", lambda args, eps, cfg, *rest: taken.append(("staged", cfg)))
    assert norm_mod.STAGED_FORWARD  # the environment of the tests does not set FLYDSL_NORM_STAGED_FORWARD=0
    n = 65536
    x, out = fake((4, n), "<f2"), fake((4, n), "<f2")
    host = importlib.import_module("flydsl.kernels.host")
    xt, ot = host.row_tensor(x, "x"), host.row_tensor(out, "out")
    norms.rms_norm(x, None, out=out)
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(n, "f16", "rms"))
    norms.layer_norm(x, None, None, out=out)
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(n, "f16", "layer"))
    norms.fused_add_rms_norm(x, fake((4, n), "<f2"), None, out=out, residual_out=fake((4, n), "<f2"))
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
    short = host.row_tensor(fake((4, 16384), "<f2"), "x")
    norm_mod.forward(short, None, None, None, short, None, None, None, 1e-6, rms=True)
    assert taken[-1] == ("register", dataclasses.replace(row_config(16384, "f16"), store_group=2))
    wide = fake((4, 32768), "<f4")
    norms.fused_add_rms_norm(wide, fake((4, 32768), "<f4"), None, out=fake((4, 32768), "<f4"), residual_out=wide)
    assert taken[-1][0] == "looped"  # the fused add f32 32768: the looped forward (norm_config.LOOPED_FORWARD)
    norms.layer_norm(wide, None, None, out=fake((4, 32768), "<f4"))
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(32768, "f32", "layer"))
    # A team (float32 262144: 16 CTAs per row) where the SMs hold it at once and the input's framework allocates its
    # exchange tensor (torch, cupy), else the register kernel: these fake arrays allocate nothing.
    long = fake((2, 262144), "<f4")
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    norms.rms_norm(long, None, out=fake((2, 262144), "<f4"))
    assert taken[-1][0] == "register"
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    norms.rms_norm(long, None, out=fake((2, 262144), "<f4"))
    assert taken[-1] == ("staged", norm_mod.routed_staged_forward_config(262144, "f32", "rms"))
    assert taken[-1][1].row.team and taken[-1][1].row.cluster == 16
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 14)  # e.g. a MIG slice
    norms.rms_norm(long, None, out=fake((2, 262144), "<f4"))
    assert taken[-1][0] == "register"


def _record_softmax_launches(monkeypatch, direction: str):
    """Replaces softmax's ``direction`` ("forward" or "backward") kernels, staged and register, by stand-ins whose
    launches append ``(kind, config)`` to the list returned (the config is the kernel's last argument); the staged
    grid is one group. Returns (the softmax_staged module, that list)."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    taken = []

    class Launch:
        def __init__(self, *args):
            self.cfg = args[-1]

        def launch(self, **kwargs):
            kind = "staged" if isinstance(self.cfg, norm_mod.StagedForwardConfig) else "register"
            taken.append((kind, self.cfg))

    monkeypatch.setattr(softmax_mod, f"softmax_{direction}_kernel", Launch)
    monkeypatch.setattr(staged, f"softmax_{direction}_staged_kernel", Launch)
    monkeypatch.setattr(staged, "staged_forward_groups", lambda cfg, rows, device: 1)
    return staged, taken


def test_staged_softmax_is_the_default(monkeypatch):
    """softmax.forward takes the staged kernel where softmax_staged_config has one and the rows are 16-byte aligned
    (by default; staged=False and STAGED_FORWARD off keep the register kernel), else the register kernel."""
    host = importlib.import_module("flydsl.kernels.host")
    staged, taken = _record_softmax_launches(monkeypatch, "forward")
    n = 65536
    x, out = fake((4, n), "<f2"), fake((4, n), "<f2")
    norms.softmax(x, out)
    routed = staged.softmax_staged_config(n, "f16")
    assert routed.claim_rows  # rows claimed from a counter, which a fake array's framework cannot allocate:
    assert taken[-1] == ("staged", dataclasses.replace(routed, claim_rows=False))  # every groups-th row instead
    monkeypatch.setattr(norm_mod, "claim_counter", lambda like: "counter")
    norms.softmax(x, out)
    assert taken[-1] == ("staged", routed)
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
        softmax_mod.forward(host.row_tensor(fake(rows_n, typestr), "x"), host.row_tensor(fake(rows_n, typestr), "out"))
        assert taken[-1][0] == "register", rows_n
    # float32 262144 takes a team of 16 CTAs; not where the SMs cannot hold one at once, nor where the input's
    # framework cannot allocate its exchange tensor
    assert staged.softmax_staged_config(262144, "f32").row.team
    long = host.row_tensor(fake((2, 262144), "<f4"), "x"), host.row_tensor(fake((2, 262144), "<f4"), "out")
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    softmax_mod.forward(*long)
    assert taken[-1][0] == "register"  # a fake array: no framework to allocate with
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    monkeypatch.setattr(staged, "forward_exchange", lambda cfg, x, rows: (cfg, x))
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
    ptx = assembled(staged.softmax_forward_staged_kernel.lower(rows, rows, rows, cfg))
    ahead = cfg.stages - 1 - cfg.lag
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group \t{ahead};" in ptx
    assert "ex2.approx.ftz.f32" in ptx and "st.global.v4.b32" in ptx and ptx.count("bar.sync") == 2
    pushed = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
    assert pushed == (cfg.row.cluster > 1) and ptx.count("barrier.cluster.wait") == (2 if pushed else 0)
    assert _shift_guarded_against_minus_inf(ptx), "a CTA's part all -inf would push (-inf, NaN): the row turns NaN"
    # One ex2 per element whose exp is held in registers (then one for the CTA's rescale), two for the others; one
    # per rank of the cluster to combine the pairs.
    values, held = cfg.row.chunks * cfg.row.vec, cfg.hold * cfg.row.vec
    combine = cfg.row.cluster if cfg.row.cluster > 1 else 0
    assert ptx.count("ex2.approx.ftz.f32") == held + (1 if held else 0) + 2 * (values - held) + combine
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0, (n, dtype, cfg)
    assert staged.softmax_staged_config(16384, dtype) is None and staged.softmax_staged_config(n + 1, dtype) is None


def _shift_guarded_against_minus_inf(ptx: str) -> bool:
    """The staged softmax's CTA shift is 0, not -inf * log2(e), where the CTA's max is -inf (its part of the row all
    -inf, e.g. a causal mask's tail): a compare of the max with -inf whose predicate selects 0.0 for the shift.
    Without it, exp(-inf - -inf) = NaN makes the CTA's sum NaN, and NaN * exp(-inf - max) = NaN the whole row."""
    for pred in re.findall(r"setp\.(?:ne|gt|neu|gtu)\.f32\s+(%p\d+), %r\d+, 0fFF800000;", ptx):
        if re.search(rf"selp\.f32\s+%r\d+, (?:%r\d+, 0f00000000|0f00000000, %r\d+), {pred};", ptx):
            return True
    return False


# Softmax's backward on the staged kernel: (cluster or team, threads, chunks per source, ring rows, lag) as routed.
SOFTMAX_BACKWARD_SHAPES = {
    ("bf16", 4096): None,
    ("bf16", 8192): (1, 1024, 2, 2, 0),  # half the chunks past N: measured faster than one chunk per thread
    ("bf16", 16384): (1, 1024, 2, 2, 0),
    ("bf16", 32768): (2, 1024, 2, 3, 1),
    ("bf16", 65536): (8, 1024, 1, 4, 0),
    ("bf16", 131072): (8, 1024, 2, 3, 1),
    ("bf16", 262144): (16, 1024, 2, 3, 1),  # a team
    ("bf16", 524288): (32, 1024, 2, 3, 1),
    ("bf16", 1048576): None,  # 64 CTAs: the register kernel
    ("f32", 65536): None,  # the register kernel is at copy speed
    ("f32", 131072): (16, 1024, 2, 3, 1),
    ("f32", 262144): (32, 1024, 2, 3, 1),
}


@pytest.mark.parametrize("dtype, n", list(SOFTMAX_BACKWARD_SHAPES))
def test_staged_softmax_backward_assembles_without_spills(dtype, n):
    """softmax_backward_shape's configs: dy and y both in the ring (cp.async of each), a cluster's pushes
    (st.async) or a team's tagged pairs, no spills."""
    staged = importlib.import_module("flydsl.kernels.softmax_staged")
    cfg = norm_config.softmax_backward_staged_config(n, dtype)
    expected = SOFTMAX_BACKWARD_SHAPES[(dtype, n)]
    if expected is None:
        assert cfg is None
        return
    rc = cfg.row
    assert (rc.cluster, rc.block, rc.chunks, cfg.stages, cfg.lag) == expected and cfg.sources == 2
    assert rc.capacity >= n and cfg.ring_bytes <= 200 * 1024 and rc.team == (rc.cluster > 8)
    rows = flyc.TensorSpec((8, n), dtype)
    exchange = flyc.TensorSpec((8, norm_mod.exchange_columns(cfg)), "f32")
    ptx = assembled(staged.softmax_backward_staged_kernel.lower(rows, rows, rows, exchange, cfg))
    # Each source's chunks are loaded for the rows the prologue fills (stages - lag: rows 0 .. ahead) and once in
    # the loop.
    loads = 2 * rc.chunks * (cfg.stages - cfg.lag + 1)
    assert len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)) == loads
    if rc.team:
        assert ptx.count("st.relaxed.gpu.global.b64") == 2 and "st.async" not in ptx
    elif rc.cluster > 1:
        assert "st.async" in ptx and "ld.relaxed.gpu" not in ptx
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0, (n, dtype, cfg)


def test_staged_softmax_backward_is_the_default(monkeypatch):
    """softmax.backward takes the staged kernel where softmax_backward_staged_config has one and dy, y, dx are
    16-byte aligned (by default; staged=False and STAGED_FORWARD off keep the register kernel), else the register
    kernel; a team only where its exchange tensor can be allocated."""
    host = importlib.import_module("flydsl.kernels.host")
    staged, taken = _record_softmax_launches(monkeypatch, "backward")

    def run(shape, typestr, dx_pointer=1 << 20, **kwargs):
        dy, y = (host.row_tensor(fake(shape, typestr), name) for name in ("dy", "y"))
        dx = host.row_tensor(FakeGpuTensor(shape, typestr, pointer=dx_pointer), "dx")
        softmax_mod.backward(dy, y, dx, **kwargs)
        return taken[-1]

    assert run((4, 32768), "<f2") == ("staged", norm_config.softmax_backward_staged_config(32768, "f16"))
    assert run((4, 32768), "<f2", staged=False)[0] == "register"
    assert run((4, 32768), "<f2", dx_pointer=(1 << 20) + 2)[0] == "register"  # dx not 16-byte aligned
    for shape, typestr in (((4, 4096), "<f2"), ((4, 65536), "<f4"), ((4, 32772), "<f2")):
        assert run(shape, typestr)[0] == "register", shape
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", False)
    assert run((4, 32768), "<f2")[0] == "register"
    monkeypatch.setattr(norm_mod, "STAGED_FORWARD", True)
    monkeypatch.setattr(norm_mod, "sm_count", lambda device: 132)
    assert run((2, 262144), "<f4")[0] == "register"  # a team, on a fake array: no framework to allocate with
    monkeypatch.setattr(norm_mod, "can_allocate", lambda like: True)
    monkeypatch.setattr(staged, "forward_exchange", lambda cfg, x, rows: (cfg, x))
    assert run((2, 262144), "<f4") == ("staged", norm_config.softmax_backward_staged_config(262144, "f32"))


def test_staged_forward_equal_shares():
    """``equal_shares``: set by staged_forward_config for a cluster where N is a multiple of cluster x threads x vec
    (every CTA holds N / cluster elements), never for one CTA per row or a team. LayerNorm then holds one count for
    all ranks: its routed clusters of 8 claim rows where shares are equal and assemble without spills either way; a
    config for equal shares traps on another N (behind a check before the row loop), one for unequal shares has no
    such check."""
    assert norm_mod.staged_forward_config(131072, "bf16", lag=0).equal_shares  # 8 x 1024 x 8 elements: 16 chunks
    assert not norm_mod.staged_forward_config(131064, "bf16", lag=0).equal_shares
    assert norm_mod.staged_forward_config(98304, "bf16", lag=0).equal_shares  # chunks go round the 4 ranks: 3 each
    assert not norm_mod.staged_forward_config(98312, "bf16", lag=0).equal_shares
    assert not norm_mod.staged_forward_config(32768, "bf16", lag=0).equal_shares  # one CTA per row
    assert not norm_mod.staged_forward_config(262144, "f32", team=True).equal_shares  # a team: counts per rank
    with pytest.raises(ValueError, match="equal_shares is about a cluster's CTAs"):
        dataclasses.replace(norm_mod.staged_forward_config(32768, "bf16", lag=0), equal_shares=True)
    for n, dtype in ((98304, "bf16"), (131072, "bf16"), (196608, "f16"), (262144, "bf16"), (131072, "f32")):
        cfg = norm_mod.routed_staged_forward_config(n, dtype, "layer")
        assert cfg.row.cluster == 8 and cfg.claim_rows and cfg.equal_shares, (n, dtype)
    for n, dtype in ((98312, "bf16"), (163840, "bf16"), (262136, "f16"), (98312, "f32")):
        cfg = norm_mod.routed_staged_forward_config(n, dtype, "layer")
        assert cfg.row.cluster == 8 and not cfg.claim_rows and not cfg.equal_shares, (n, dtype)
    rows, weight = flyc.TensorSpec((8, 131072), "bf16"), flyc.TensorSpec((131072,), "bf16")
    stats = flyc.TensorSpec((8,), "f32")
    counter = flyc.TensorSpec((2,), "i32")
    equal = norm_mod.routed_staged_forward_config(131072, "bf16", "layer")
    flags = FORWARD_FLAGS["layer"]
    ptx = assembled(
        norm_mod.norm_forward_staged_kernel.lower(
            rows, rows, weight, weight, rows, rows, stats, stats, counter, 1e-5, equal, flags
        )
    )
    assert ptx.count("trap;") == 1 and ptx.index("trap;") < ptx.index("cp.async.wait_group")
    unequal = dataclasses.replace(equal, equal_shares=False, claim_rows=False)
    assert (
        "trap;"
        not in norm_mod.norm_forward_staged_kernel.lower(
            rows, rows, weight, weight, rows, rows, stats, stats, rows, 1e-5, unequal, flags
        ).ptx
    )
    if flyc.find_ptxas() is not None:
        assert spill_bytes(ptx) == 0
