"""flydsl.kernels' staged forward without a GPU (norm_forward_staged_kernel, softmax's staged kernels) and what the
public functions launch: staged_forward_config's rules (rings, lags, held chunks, CTAs per SM, claimed rows, equal
shares, teams); shapes the router does not pick assemble for sm_90a without spills with the accesses expected
(weights kept, two CTAs per SM, teams); a team must fit the device; the routes follow their table's claims; and
every public function launches exactly its route (kernel, config, grid, block, cluster) for the arrays it is given:
aligned or not, a framework that allocates scratch or not. The routed configurations themselves:
test_norms_routes_cpu.py."""

from __future__ import annotations

import dataclasses

import pytest

import flydsl.compiler as flyc
import flydsl.kernels as zoo
from flydsl.kernels.norms.api import NormTensors
from flydsl.kernels.norms.backward import direct_rows
from flydsl.kernels.rows import launch as rows_launch
from flydsl.kernels.rows import router
from flydsl.kernels.rows.configs import (
    FORWARD_STAGE_BYTES,
    MAX_FORWARD_TEAM,
    MAX_STAGES,
    RING_BYTES,
    StagedForwardConfig,
    StagedForwardShape,
    staged_forward_config,
)
from flydsl.kernels.rows.exchange import exchange_columns
from flydsl.kernels.rows.launch import device_groups, persistent_groups
from flydsl.kernels.rows.router import RowKernel, RowOp, route
from flydsl.kernels.validation import describe, element_bytes

from . import norms_routes
from .norms_cpu_support import (
    FORWARD_FLAGS,
    HAS_PTXAS,
    FakeGpuTensor,
    assembled,
    backward_mod,
    fake,
    forward_args,
    forward_mod,
    launch_mod,
    private_cache,  # noqa: F401 (an autouse fixture)
    record_launches,
    softmax_mod,
    spill_bytes,
)


def _config(n: int, dtype: str, residual: bool = False, **shape) -> StagedForwardConfig | None:
    return staged_forward_config(n, dtype, StagedForwardShape(**shape), residual=residual)


def _lower_norm(cfg, n: int, dtype: str, variant: str, weight_dtype: str | None = None, exchange=None):
    args = forward_args(n, dtype, weight_dtype)
    exchange = exchange or flyc.TensorSpec((8, n), dtype)
    return forward_mod.norm_forward_staged_kernel.lower(*args, exchange, 1e-5, cfg, FORWARD_FLAGS[variant])


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
    hoisted out of it, the wide values spilled 128-200 bytes). Float32 weights on 16-bit rows are not kept (twice
    the registers)."""
    cfg = _config(n, dtype, keep_weights=True, **shape)
    assert cfg.keep_weights
    ptx = assembled(_lower_norm(cfg, n, dtype, variant))
    kept = cfg.row.chunks * (1 if FORWARD_FLAGS[variant].rms else 2)
    assert ptx.count("ld.global.v4.b32") == kept
    # all of them before the row loop, whose first step waits for the ring's copies
    assert ptx.rindex("ld.global.v4.b32") < ptx.index("cp.async.wait_group")
    plain = _lower_norm(_config(n, dtype, **shape), n, dtype, variant).ptx  # without: loaded in the loop, per row
    assert plain.index("ld.global.v4.b32") > plain.index("cp.async.wait_group")
    if dtype != "f32":
        mixed = _lower_norm(cfg, n, dtype, variant, weight_dtype="f32").ptx
        assert mixed.index("ld.global.v4.b32") > mixed.index("cp.async.wait_group")
        if HAS_PTXAS:
            assert spill_bytes(mixed) == 0
    if HAS_PTXAS:
        assert spill_bytes(ptx) == 0, (n, dtype, cfg)


def test_staged_forward_several_ctas_per_sm_assemble():
    """Two 512-thread CTAs per SM (single-row rings of 64 KB): ptxas caps the registers at 64, without spills."""
    rows = flyc.TensorSpec((8, 32768), "bf16")
    cfg = _config(32768, "bf16", chunks=8, stages=1, threads=512, blocks_per_sm=2)
    for module in (
        softmax_mod.softmax_forward_staged_kernel.lower(rows, rows, rows, cfg),
        _lower_norm(cfg, 32768, "bf16", "layer"),
    ):
        ptx = assembled(module)
        assert ".minnctapersm 2" in ptx
        if HAS_PTXAS:
            assert spill_bytes(ptx) == 0


@pytest.mark.parametrize("variant", ["layer", "rms", "fused", "softmax"])
@pytest.mark.parametrize(
    "n, dtype", [(262144, "f32"), (196612, "f32"), (524288, "f32"), (524288, "bf16")]
)  # 16 CTAs per row; 13, the last one short; 32; 16 (the fused add 32)
def test_staged_forward_teams_assemble(variant, n, dtype):
    """Rows over more CTAs than a cluster holds as a team (``StagedForwardShape(team=True)``): each CTA's pair
    written to the row's line of the exchange tensor as tagged 64-bit stores, the first warp polling one rank's pair
    per lane (one 16-byte ``ld.relaxed.gpu`` per poll) and combining them by shuffles; no cluster barriers, no
    mbarriers, no spills. Without ``team`` no config holds such a row; teams of more than 32 CTAs: none."""
    residual = variant == "fused"
    assert _config(n, dtype, residual) is None  # no cluster holds the row
    cfg = _config(n, dtype, residual, team=True)
    sources = 2 if residual else 1
    count = -(-n * element_bytes(dtype) * sources // FORWARD_STAGE_BYTES)  # CTAs of the default ring row
    if count > MAX_FORWARD_TEAM:
        assert cfg is None
        return
    assert cfg.row.team and cfg.row.cluster == count and cfg.row.cluster_shape is None and cfg.lag == 1
    exchange = flyc.TensorSpec((8, exchange_columns(cfg)), "f32")
    if variant == "softmax":
        rows = flyc.TensorSpec((8, n), dtype)
        module = softmax_mod.softmax_forward_staged_kernel.lower(rows, rows, exchange, cfg)
    else:
        module = _lower_norm(cfg, n, dtype, variant, exchange=exchange)
    ptx = assembled(module)
    assert ptx.count("st.relaxed.gpu.global.b64") == 2 and "ld.relaxed.gpu.global.v2.b64" in ptx
    assert "barrier.cluster" not in ptx and "mbarrier" not in ptx and "st.async" not in ptx
    if HAS_PTXAS:
        assert spill_bytes(ptx) == 0, (n, variant, cfg)


def test_staged_forward_team_must_fit_the_device(monkeypatch):
    """A team's CTAs all wait for each other: one larger than the SMs hold at once is refused before launch."""
    cfg = _config(262144, "f32", team=True)
    assert cfg.row.team and cfg.blocks_per_sm == 1
    monkeypatch.setattr(launch_mod, "sm_count", lambda device: 132)
    assert device_groups(cfg, 1000, 0) == 132 // cfg.row.cluster
    monkeypatch.setattr(launch_mod, "sm_count", lambda device: cfg.row.cluster - 2)  # e.g. a MIG slice
    with pytest.raises(ValueError, match=f"team of {cfg.row.cluster} CTAs"):
        device_groups(cfg, 1000, 0)


def test_staged_forward_config_rules():
    """staged_forward_config: by default a ring row of FORWARD_STAGE_BYTES per CTA, as few CTAs per row as hold it
    (a power of two up to 8), as many ring rows as RING_BYTES holds (at most MAX_STAGES); None where a row needs more
    than 8 CTAs (without ``team``), N is not a multiple of 16 bytes, the ring is too small for the pipeline (lag 2
    needs 4 rows) or larger than the shared memory, several CTAs per SM exceed its threads or shared memory; held
    chunks (a count up to the thread's, True: all) and claimed rows only at lag 0 in a cluster, never in a team."""
    for n, dtype, residual in [(32768, "bf16", False), (262144, "bf16", False), (65536, "f32", True)]:
        cfg = _config(n, dtype, residual)
        sources = 2 if residual else 1
        assert cfg.sources == sources and cfg.row.block * cfg.row.chunks * 16 * sources == FORWARD_STAGE_BYTES
        ctas = -(-n * element_bytes(dtype) * sources // FORWARD_STAGE_BYTES)
        assert cfg.row.cluster == 1 << (ctas - 1).bit_length() and cfg.row.capacity >= n
        assert cfg.stages == min(MAX_STAGES, RING_BYTES // FORWARD_STAGE_BYTES)
        assert cfg.lag == (1 if cfg.row.cluster > 1 else 0) and cfg.hold == 0 and not cfg.row.team
    assert _config(262144, "f32") is None and _config(262144, "bf16", residual=True) is None  # 16 CTAs
    assert _config(65540, "bf16") is None
    assert _config(65536, "bf16", lag=2) is None
    assert _config(65536, "bf16", chunks=2, lag=2).stages == 4
    assert _config(65536, "bf16", stages=4) is None  # 256 KB
    single = _config(262144, "f32", chunks=8, lag=0)  # a single-row ring: 128 KB per CTA, 1 MB rows over 8 CTAs
    assert (single.row.cluster, single.row.chunks, single.stages, single.lag) == (8, 8, 1, 0)
    assert _config(262144, "f32", chunks=8, lag=1) is None
    assert _config(262144, "f32", chunks=8, stages=2, lag=0) is None  # 256 KB
    assert _config(65536, "bf16", stages=2, lag=1) is None  # 2 rows, none ahead
    assert _config(65536, "bf16", lag=0, hold=True).hold == 4
    assert _config(65536, "bf16", lag=1, hold=False).hold == 0
    assert _config(65536, "bf16", lag=1, hold=2) is None
    with pytest.raises(ValueError, match=r"hold: expected 0\.\.4 chunks"):
        _config(65536, "bf16", lag=0, hold=8)
    two = _config(32768, "bf16", chunks=8, stages=1, threads=512, blocks_per_sm=2)
    assert two.blocks_per_sm == 2 and two.row.cluster == 1 and two.ring_bytes == 64 * 1024
    assert _config(32768, "bf16", chunks=8, threads=512, blocks_per_sm=2).stages == 1
    assert _config(32768, "bf16", chunks=8, stages=2, threads=512, blocks_per_sm=2) is None  # 2 x 128 KB
    assert _config(32768, "bf16", chunks=4, threads=1024, blocks_per_sm=3) is None  # 3072 threads
    assert persistent_groups(two, 8192, 132) == 2 * 132  # the grid takes them all
    with pytest.raises(ValueError, match="blocks_per_sm: expected a positive int"):
        _config(32768, "bf16", blocks_per_sm=0)
    assert _config(65536, "bf16", lag=1, claim_rows=True) is None  # a cluster at lag 1
    assert _config(65536, "bf16", lag=0, claim_rows=True).claim_rows
    assert _config(65536, "bf16", team=True, claim_rows=True) is None  # a team
    with pytest.raises(ValueError, match="claim_rows needs one CTA per row or a cluster at lag 0"):
        dataclasses.replace(_config(65536, "bf16"), claim_rows=True)
    with pytest.raises(TypeError):
        StagedForwardConfig(two.row, 1)  # keyword-only
    clustered = _config(262144, "bf16")  # the persistent grid: the driver's count of clusters, when it gives one
    assert persistent_groups(clustered, 1024, 132, active=16) == 16
    assert persistent_groups(clustered, 3, 132, active=16) == 3
    assert persistent_groups(_config(32768, "bf16"), 8192, 132) == 132


def test_staged_forward_equal_shares():
    """``equal_shares``: set for a cluster where N is a multiple of cluster x threads x vec (every CTA holds
    N / cluster elements), never for one CTA per row or a team. LayerNorm then holds one count for all ranks: a
    config for equal shares traps on another N (behind a check before the row loop), one for unequal shares has no
    such check; both assemble without spills."""
    assert _config(131072, "bf16", lag=0).equal_shares  # 8 x 1024 x 8 elements: 16 chunks
    assert not _config(131064, "bf16", lag=0).equal_shares
    assert _config(98304, "bf16", lag=0).equal_shares  # chunks go round the 4 ranks: 3 each
    assert not _config(98312, "bf16", lag=0).equal_shares
    assert not _config(32768, "bf16", lag=0).equal_shares  # one CTA per row
    assert not _config(262144, "f32", team=True).equal_shares  # a team: counts per rank
    with pytest.raises(ValueError, match="equal_shares is about a cluster's CTAs"):
        dataclasses.replace(_config(32768, "bf16", lag=0), equal_shares=True)
    n, dtype = 131072, "bf16"
    equal = _config(n, dtype, lag=0, stages=2, keep_weights=True, claim_rows=True)
    assert equal.equal_shares and equal.claim_rows and equal.row.cluster > 1
    ptx = assembled(_lower_norm(equal, n, dtype, "layer", exchange=flyc.TensorSpec((2,), "i32")))
    assert ptx.count("trap;") == 1 and ptx.index("trap;") < ptx.index("cp.async.wait_group")
    unequal = dataclasses.replace(equal, equal_shares=False, claim_rows=False)
    unequal_ptx = assembled(_lower_norm(unequal, n, dtype, "layer"))
    assert "trap;" not in unequal_ptx
    if HAS_PTXAS:
        assert spill_bytes(ptx) == 0 and spill_bytes(unequal_ptx) == 0


def _table_row(kind: str, n: int, dtype: str):
    """The STAGED_FORWARD row (most CTAs, shape) that lists ``kind`` rows of ``n`` ``dtype`` elements: the first
    whose CTAs of 64 KB ring rows hold the row."""
    sources = 2 if kind == "fused" else 1
    ctas = -(-sources * n * element_bytes(dtype) // FORWARD_STAGE_BYTES)
    cls = "f32" if dtype == "f32" else "16-bit"
    table = router.STAGED_FORWARD.get((kind, cls)) or router.STAGED_FORWARD[kind, "any"]
    return next((most, shape) for most, shape in table if ctas <= most)


def test_staged_routes_claim_rows_as_their_table_says():
    """A STAGED_FORWARD row claims its rows (True), never (False), or where every CTA of the cluster holds N / 8
    elements (router.WHERE_SHARES_EQUAL): the routed config claims exactly there (with a counter to claim from:
    scratch), its shape otherwise the row's."""
    seen = set()
    for case in norms_routes.cases():
        if case.route.kernel is not RowKernel.STAGED or case.op.backward:
            continue
        cfg = case.route.config
        _, shape = _table_row(case.op.kind, case.n, case.dtype)
        claim = cfg.equal_shares if shape.claim_rows == router.WHERE_SHARES_EQUAL else bool(shape.claim_rows)
        assert cfg.claim_rows == claim, case.name
        assert (cfg.row.block, cfg.row.chunks, cfg.blocks_per_sm) == (shape.threads, shape.chunks, shape.blocks_per_sm)
        assert cfg.keep_weights == shape.keep_weights and cfg.row.team == (shape.team and cfg.row.cluster > 1)
        seen.add(shape.claim_rows)
    assert seen == {True, False, router.WHERE_SHARES_EQUAL}  # the grid meets every kind of row


# --- what the public functions launch ---------------------------------------------------------------------------

_TYPESTR = {"f32": "<f4", "f16": "<f2", "bf16": "<bfloat16"}
_KERNELS = {
    forward_mod: {"norm_forward_kernel": -2, "norm_forward_looped_kernel": -2, "norm_forward_staged_kernel": -2},
    softmax_mod: {name: -1 for name in ("softmax_forward_kernel", "softmax_forward_staged_kernel")}
    | {name: -1 for name in ("softmax_backward_kernel", "softmax_backward_staged_kernel")},
    backward_mod: {"norm_backward_kernel": -2, "column_sum_kernel": -1},
}
_NAMES = {
    (False, RowKernel.REGISTER): ("norm_forward_kernel", "softmax_forward_kernel"),
    (False, RowKernel.LOOPED): ("norm_forward_looped_kernel", None),
    (False, RowKernel.STAGED): ("norm_forward_staged_kernel", "softmax_forward_staged_kernel"),
    (True, RowKernel.REGISTER): ("norm_backward_kernel", "softmax_backward_kernel"),
    (True, RowKernel.STAGED): ("norm_backward_kernel", "softmax_backward_staged_kernel"),
}
ROWS = 5


def _call(op: RowOp, n: int, dtype: str, sums: int, rows_offset: int, weight_offset: int) -> None:
    """``op``'s public function on fake arrays of ROWS rows of ``n`` ``dtype`` elements with every output given;
    ``rows_offset`` / ``weight_offset``: bytes past a 16-byte boundary of x / the weight."""
    typestr = _TYPESTR[dtype]

    def rows(offset=0):
        return FakeGpuTensor((ROWS, n), typestr, pointer=(1 << 20) + offset)

    def vector(offset=0):
        return FakeGpuTensor((n,), typestr, pointer=(1 << 20) + offset)

    x, stats = rows(rows_offset), fake((ROWS,))
    if op is RowOp.SOFTMAX:
        zoo.softmax(x, rows())
    elif op is RowOp.SOFTMAX_BACKWARD:
        zoo.softmax_backward(rows(), x, rows())
    elif op is RowOp.LAYER_NORM:
        zoo.layer_norm(x, vector(weight_offset), vector(), out=rows(), mean=stats, rstd=stats)
    elif op is RowOp.RMS_NORM:
        zoo.rms_norm(x, vector(weight_offset), out=rows(), rstd=stats)
    elif op is RowOp.FUSED_ADD_RMS_NORM:
        zoo.fused_add_rms_norm(x, rows(), vector(weight_offset), out=rows(), residual_out=rows(), rstd=stats)
    elif op is RowOp.LAYER_NORM_BACKWARD:
        weights = (vector(), vector(), vector()) if sums else (None, None, None)
        zoo.layer_norm_backward(rows(), x, weights[0], stats, stats, dx=rows(), dweight=weights[1], dbias=weights[2])
    else:
        weights = (vector(), vector()) if sums else (None, None)
        zoo.rms_norm_backward(rows(), x, weights[0], stats, dx=rows(), dweight=weights[1])


def _launch_shape(cfg, kernel: RowKernel) -> dict:
    """The launch keywords a route's config asks for on ROWS rows (132 SMs, no driver count of clusters)."""
    if kernel is RowKernel.LOOPED:
        return {"grid": ROWS, "block": cfg.row.block, "cluster": None}
    if hasattr(cfg, "row"):
        groups = persistent_groups(cfg, ROWS, 132)
        return {"grid": groups * cfg.row.cluster, "block": cfg.row.block, "cluster": cfg.row.cluster_shape}
    return {"grid": cfg.grid(ROWS), "block": cfg.block, "cluster": (cfg.cluster, 1, 1) if cfg.cluster > 1 else None}


@pytest.mark.parametrize("scratch", [False, True], ids=["fake arrays", "scratch allocated"])
def test_public_functions_launch_their_route(scratch, monkeypatch):
    """Each public function, on every (op, N, dtype, column sums) of the routes' grid, with its rows 16-byte aligned
    or not and (norms forward) its weight aligned or not, launches exactly the route for those facts: its kernel,
    its config, and the grid, block and cluster the config asks for (then the column sums, where there are any; a
    norm backward whose ROWS rows take few enough row groups runs its config ``direct`` in one CTA instead, alone).
    Fake arrays allocate nothing (no scratch: no team, no claimed rows, and no backward with a weight but a direct
    one); with scratch, the input's framework gives the exchange, the counter and the partial sums."""
    taken = record_launches(monkeypatch, _KERNELS)
    if scratch:
        for module in (forward_mod, softmax_mod, backward_mod):
            monkeypatch.setattr(module, "can_allocate", lambda like: True)
        monkeypatch.setattr(rows_launch, "staged_exchange", lambda cfg, like, rows: like.obj)
        monkeypatch.setattr(backward_mod, "team_exchange", lambda cfg, like, rows, what: like.obj)
        monkeypatch.setattr(backward_mod, "empty_rows", lambda like, shape, what, scratch=False: fake(shape))
    layouts = {"aligned": (0, 0), "rows offset": (4, 0), "weight offset": (0, 4)}
    directs = 0
    for case in norms_routes.cases():
        op, n, dtype = case.op, case.n, case.dtype
        for layout, (rows_offset, weight_offset) in layouts.items():
            if weight_offset and (op.backward or op is RowOp.SOFTMAX):
                continue
            facts = dict(rows_aligned=not rows_offset, vectors_aligned=not weight_offset, scratch=scratch)
            chosen = route(op, n, dtype, sums=case.sums, **facts)
            cfg = chosen.config
            direct = case.sums and op.kind != "softmax" and direct_rows(cfg, ROWS)
            if case.sums and not (scratch or direct):
                continue
            del taken[:]
            _call(op, n, dtype, case.sums, rows_offset, weight_offset)
            name = _NAMES[op.backward, chosen.kernel][op.kind == "softmax"]
            if direct:
                cfg = dataclasses.replace(cfg, direct=True)
                assert taken == [(name, cfg, {"grid": 1, "block": cfg.row.block, "cluster": None})], case.name
                directs += 1
                continue
            assert taken[0] == (name, cfg, _launch_shape(cfg, chosen.kernel)), (case.name, layout)
            assert len(taken) == 1 + bool(case.sums and op is not RowOp.SOFTMAX_BACKWARD), (case.name, taken)
            if len(taken) == 2:  # the column sums: a block per columns of the partial rows
                assert taken[1][0] == "column_sum_kernel", case.name
    assert directs  # the grid holds configs of several rows per CTA, whose ROWS rows go direct
    x = describe("test", "x", fake((4, 8192)))
    looped = route(RowOp.RMS_NORM, 8192, "f32")
    assert looped.kernel is RowKernel.LOOPED
    with pytest.raises(ValueError, match="no kernel takes"):  # a route whose kernel does not take its config
        forward_mod.forward(NormTensors(x=x, out=x), 1e-5, rms=True, chosen=looped._replace(kernel=RowKernel.REGISTER))
