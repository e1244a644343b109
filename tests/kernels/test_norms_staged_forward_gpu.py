"""flydsl.kernels' staged forward on the GPU (norm_forward_staged_kernel and softmax's staged kernels, forward and
backward), against float64 with the tolerances of test_norms_gpu.py: shapes the router does not pick (rings, held
chunks, kept weights, clusters, teams, two CTAs per SM) launched along a chosen route, rows of masked tails, rows
claimed from a counter (one CTA per row, clusters, LayerNorm's equal shares), and the staged and register kernels
on the same rows. Every routed configuration on data: test_norms_routes_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels import memory  # noqa: E402
from flydsl.kernels.rows import router  # noqa: E402
from flydsl.kernels.rows.configs import StagedForwardShape, staged_forward_config  # noqa: E402
from flydsl.kernels.rows.router import RowKernel, RowOp, route  # noqa: E402
from flydsl.kernels.softmax.api import SoftmaxTensors  # noqa: E402
from flydsl.kernels.validation import from_torch  # noqa: E402

from . import norms_routes  # noqa: E402
from .norms_gpu_support import (  # noqa: E402
    DTYPE_NAME,
    close,
    launch_forward,
    launch_softmax,
    ln_ref,
    make_input,
    nan_stats,
    poison,
    softmax_backward_ref,
    softmax_mod,
)


def _config(n, dtype, residual=False, **shape):
    return staged_forward_config(n, DTYPE_NAME.get(dtype, dtype), StagedForwardShape(**shape), residual=residual)


def _staged_rows(n):
    """More rows than the persistent grid has CTA groups (the ring wraps around), and fewer."""
    return [max(3, (1 << 24) // n), 3]


def _check_staged_layer_norm(x, w, b, cfg):
    """The staged kernel launched directly with ``cfg``: LayerNorm with every output against float64."""
    rows = x.shape[0]
    out, mean, rstd = poison(x), nan_stats(rows), nan_stats(rows)
    launch_forward(cfg, x, out, rms=False, eps=1e-5, weight=w, bias=b, mean=mean, rstd=rstd)
    ref, ref_mean, ref_rstd = ln_ref(x, w, b, 1e-5)
    close(out, ref)
    close(mean, ref_mean, torch.float32, "mean")
    close(rstd, ref_rstd, torch.float32, "rstd")


def _check_staged_rms_norm(x, w, cfg):
    rstd = nan_stats(x.shape[0])
    out = poison(x)
    launch_forward(cfg, x, out, rms=True, weight=w, rstd=rstd)
    xd = x.double()
    ref_rstd = torch.rsqrt((xd * xd).mean(-1) + 1e-6)
    close(out, xd * ref_rstd[:, None] * w.double())
    close(rstd, ref_rstd, torch.float32, "rstd")


def _check_staged_fused_add(x, w, cfg):
    residual, out = make_input(*x.shape, x.dtype), poison(x)
    expected_residual = x + residual
    launch_forward(cfg, x, out, rms=True, weight=w, residual=residual, residual_out=residual)
    assert torch.equal(residual, expected_residual), "residual_out"
    rd = expected_residual.double()
    close(out, rd * torch.rsqrt((rd * rd).mean(-1, keepdim=True) + 1e-6) * w.double())


def _check_staged_softmax(x, cfg):
    out = poison(x)
    launch_softmax(cfg, x, out)
    close(out, torch.softmax(x.double(), dim=-1))


@pytest.mark.parametrize(
    "n, dtype, shape",
    [
        (40968, torch.bfloat16, dict(chunks=1)),  # 8 CTAs per row, two of them holding nothing
        (65536, torch.bfloat16, dict(chunks=2, lag=2)),  # a 4-row ring, outputs two rows behind
        (131072, torch.bfloat16, dict(lag=0)),  # a cluster writing each row once its pairs are in
        (131072, torch.float32, dict(chunks=8, threads=512)),
        (32768, torch.bfloat16, dict(stages=2)),  # one CTA per row, a 2-row ring
        (32768, torch.float32, dict(lag=0)),  # clusters of 2 at lag 0
        (262144, torch.float32, dict(chunks=8, stages=1, lag=0)),  # a single-row ring at 1024 threads
        (98308, torch.float32, dict(chunks=8, stages=1, lag=0)),  # a single-row ring, CTAs holding unequal parts
        (65536, torch.bfloat16, dict(lag=0, hold=2)),  # half of each thread's chunks held in registers
        (32768, torch.bfloat16, dict(stages=2, hold=3)),  # one CTA per row, 3 of 4 chunks held
        (131080, torch.bfloat16, dict(lag=0, hold=4)),  # every chunk held, CTAs holding unequal parts
        (131072, torch.bfloat16, dict(lag=0, stages=2, keep_weights=True)),  # weight and bias kept for all rows
        (65544, torch.float32, dict(lag=0, keep_weights=True)),  # kept, CTAs holding unequal parts
        # two CTAs per SM: clusters of 8 (the last CTA holding one chunk), one CTA per row in single-row rings
        (114696, torch.bfloat16, dict(threads=512, chunks=4, lag=0, stages=2, keep_weights=True, blocks_per_sm=2)),
        (32768, torch.bfloat16, dict(threads=512, chunks=8, stages=1, blocks_per_sm=2)),
    ],
    ids=str,
)
def test_staged_forward_shapes(n, dtype, shape):
    """The staged kernel launched along shapes the router may not pick (benchmarks/norms_forward_staged.py sweeps
    them): LayerNorm with every output, against float64."""
    cfg = _config(n, dtype, **shape)
    assert cfg is not None
    x = make_input(300, n, dtype) * 2 + 8
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    _check_staged_layer_norm(x, w, b, cfg)


# Teams of 16 CTAs per row; of 13, the last holding part of a share; of 4 (float32 65536, bf16 131072: rows a
# cluster would hold, as a team); of 5, the last mostly past N.
@pytest.mark.parametrize(
    "n, dtype",
    [(262144, torch.float32), (196612, torch.float32), (65536, torch.float32)]
    + [(131072, torch.bfloat16), (131080, torch.bfloat16)],
)
def test_staged_forward_teams(n, dtype):
    """Rows over several CTAs as a team (``StagedForwardShape(team=True)``: pairs through tagged stores in global
    memory): LayerNorm with every output, RMSNorm, the fused add and softmax against float64, 300 rows (each team
    walks ~37 of them at 16 CTAs per row)."""
    x = (make_input(300, n, torch.float32) * 2 + 8).to(dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    cfg = _config(n, dtype, team=True)
    assert cfg.row.team
    _check_staged_layer_norm(x, w, b, cfg)
    _check_staged_rms_norm(x, w, cfg)
    fused = _config(n, dtype, True, team=True)
    assert fused.row.team and fused.sources == 2
    _check_staged_fused_add(x, w, fused)
    _check_staged_softmax(x, cfg)


@pytest.mark.parametrize(
    "n, shape",
    [(32768, dict(chunks=8, stages=1)), (65536, dict(chunks=8, stages=1, lag=0, hold=2)), (65544, dict(lag=0))],
    ids=str,
)
def test_staged_softmax_two_ctas_per_sm(n, shape):
    """The staged softmax in 512-thread CTAs two per SM (``blocks_per_sm=2``): one CTA per row, a cluster with held
    exps, a cluster of 4 whose third CTA holds a sliver and fourth nothing; against float64."""
    cfg = _config(n, "bf16", threads=512, blocks_per_sm=2, **shape)
    assert cfg is not None and cfg.blocks_per_sm == 2
    for rows in _staged_rows(n):
        _check_staged_softmax(make_input(rows, n, torch.bfloat16) * 3 + 5, cfg)


def _softmax_register(x):
    """Softmax on the register kernel (the route's ``staged=False``)."""
    out = poison(x)
    chosen = route(RowOp.SOFTMAX, x.shape[1], DTYPE_NAME[x.dtype], staged=False)
    softmax_mod.forward(SoftmaxTensors(x=from_torch(x), out=from_torch(out)), chosen=chosen)
    return out


@pytest.mark.parametrize("hold", [None, 0, 2], ids=["routed", "hold0", "hold2"])
@pytest.mark.parametrize("n, dtype", [(65536, torch.bfloat16), (131072, torch.float32), (40968, torch.bfloat16)])
def test_staged_softmax_masked_tails(n, dtype, hold):
    """Rows whose tail is -inf (a causal mask's: only the first ``keep`` columns finite), so that whole CTAs of a row
    hold nothing but -inf: their pair must add nothing (it was (-inf, NaN), from exp(-inf - -inf), and the row NaN).
    Against float64; the routed softmax and the register kernel on the same rows as peers. ``hold``: the routed
    staged config, or it with that many chunks' exps held in registers (0: none; 2: half of them, the rest
    recomputed)."""
    rows = 64
    keep = torch.randint(1, n + 1, (rows,), device="cuda")
    keep[:6] = torch.tensor([1, 7, 1000, 8192, n // 2 + 8, n], device="cuda")
    x = make_input(rows, n, dtype) * 3
    x = x.masked_fill(torch.arange(n, device="cuda")[None, :] >= keep[:, None], float("-inf"))
    routed = route(RowOp.SOFTMAX, n, DTYPE_NAME[dtype])
    assert routed.kernel is RowKernel.STAGED, routed
    cfg = (
        routed.config if hold is None else dataclasses.replace(routed.config, hold=min(hold, routed.config.row.chunks))
    )
    out = poison(x)
    launch_softmax(cfg, x, out)
    ref = torch.softmax(x.double(), dim=-1)
    close(out, ref)
    close(out.double() * n, ref * n, dtype, "out * N")
    close(zoo.softmax(x, poison(x)), ref)  # routed: the staged kernel
    close(_softmax_register(x), ref)


def test_staged_softmax_masked_tails_team():
    """The masked tails of :func:`test_staged_softmax_masked_tails` in a team (float32 262144: 16 CTAs per row, the
    routed config): a CTA of nothing but -inf adds nothing to the combined pair."""
    assert route(RowOp.SOFTMAX, 262144, "f32").config.row.team
    test_staged_softmax_masked_tails(262144, torch.float32, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [8192, 16384, 24584, 32768, 40968, 65536, 98308, 131072, 262144, 524288])
def test_softmax_backward_staged_and_register(n, dtype):
    """Softmax's backward as routed (the staged kernel where its table has a shape: one CTA, clusters, teams) and on
    the register kernel (``staged=False``), on the same rows, against float64 at the scale of the mean element."""
    name = DTYPE_NAME[dtype]
    for rows in _staged_rows(n):
        y = torch.softmax(make_input(rows, n, torch.float32) * 3, dim=-1).to(dtype)
        dy = make_input(rows, n, dtype) + 0.5
        ref, magnitude = softmax_backward_ref(dy, y)
        register = poison(dy)
        chosen = route(RowOp.SOFTMAX_BACKWARD, n, name, staged=False)
        softmax_mod.backward(SoftmaxTensors(x=from_torch(y), out=from_torch(register), dy=from_torch(dy)), chosen)
        for got in (zoo.softmax_backward(dy, y, poison(dy)), register):
            close(got, ref, what="dx")
            close(got.double() * n, ref * n, dtype, "dx * N", n, magnitude * n)


def _claimed(cfg):
    return dataclasses.replace(cfg, claim_rows=True)


@pytest.mark.parametrize("rows", [1, 131, 263, 264, 265, 1000, 4099])
def test_staged_forward_claimed_rows(rows):
    """Rows claimed from a counter (``claim_rows``) by one CTA per row (softmax and LayerNorm in the staged table's
    shapes for bf16 32768-65536, two 512-thread CTAs per SM among them; RMSNorm's ring; the fused add in a 128 KB
    single-row ring): every row written once, around the grid's size (264 CTAs at two per SM), against float64; the
    counter is back at zero after each launch, one per stream."""
    for n in (32768, 40968, 65536):
        cfg = _config(n, "bf16", **router.staged_forward_shape("softmax", n, "bf16")._asdict())
        assert cfg.row.cluster == 1
        _check_staged_softmax(make_input(rows, n, torch.bfloat16) * 3 + 5, _claimed(cfg))
    n = 32768
    x = make_input(rows, n, torch.bfloat16) * 2 + 8
    w, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    layer = _config(n, "bf16", **router.staged_forward_shape("layer", n, "bf16")._asdict())
    rms = _config(n, "bf16", **router.staged_forward_shape("rms", n, "bf16")._asdict())
    fused = _config(n, "bf16", True, chunks=4, stages=1, lag=0, claim_rows=True)
    assert layer.row.cluster == 1 and rms.row.cluster == 1 and fused is not None and fused.row.cluster == 1
    _check_staged_layer_norm(x, w, b, _claimed(layer))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs are made on this stream
    with torch.cuda.stream(side):  # a stream of its own: its own counter
        residual, out = make_input(rows, n, torch.bfloat16), poison(x)
        expected_residual = x + residual
        launch_forward(fused, x, out, rms=True, weight=w, residual=residual, residual_out=residual)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(residual, expected_residual), "residual_out"
    rd = expected_residual.double()
    close(out, rd * torch.rsqrt((rd * rd).mean(-1, keepdim=True) + 1e-6) * w.double())
    _check_staged_rms_norm(x, w, _claimed(rms))
    torch.cuda.synchronize()
    assert memory.claim_counter(from_torch(x)).tolist() == [0, 0]
    counters = [held for held in memory.held_buffers() if held[0] == "rows.claim_counters"]
    assert len({stream for _, device, stream, *_ in counters if device == x.get_device()}) >= 2  # the side stream's
    assert all(counter[:2].tolist() == [0, 0] for *_, counter in counters)


@pytest.mark.parametrize("rows", [1, 29, 30, 31, 300, 1001])
@pytest.mark.parametrize("n, dtype", [(98312, torch.bfloat16), (65536, torch.float32), (262144, torch.bfloat16)])
def test_staged_forward_claimed_rows_in_clusters(n, dtype, rows):
    """Rows claimed from a counter by clusters (lag 0: the cluster's rank 0 claims, and pushes each claimed row to its
    peers with its pairs): 4 CTAs per row, the last holding 8 elements (bf16 98312), and 8 (bf16 262144); around
    the grid's size (30 clusters of 4, 15 of 8 on the H200); softmax and LayerNorm with every output against
    float64, RMSNorm with its weight kept; the counter back at zero."""
    x = (make_input(rows, n, torch.float32) * 2 + 8).to(dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    layer = _config(n, dtype, lag=0, claim_rows=True)
    assert layer.claim_rows and layer.row.cluster in (4, 8)
    _check_staged_layer_norm(x, w, b, layer)
    _check_staged_softmax(x, layer)
    _check_staged_rms_norm(x, w, _config(n, dtype, lag=0, keep_weights=True, claim_rows=True))
    torch.cuda.synchronize()
    assert memory.claim_counter(from_torch(x)).tolist() == [0, 0]


def _claimed_layer_clusters():
    """The routed LayerNorm clusters that claim their rows with equal shares (one count for every rank)."""
    found = {}
    for case in norms_routes.cases():
        cfg = case.route.config
        if case.op is RowOp.LAYER_NORM and case.route.kernel is RowKernel.STAGED and not cfg.row.team:
            if cfg.claim_rows and cfg.equal_shares:
                found.setdefault(cfg, (case.n, case.dtype))
    return sorted(found.values())


@pytest.mark.parametrize("rows", [1, 15, 16, 300])
@pytest.mark.parametrize("n, dtype", _claimed_layer_clusters())
def test_staged_forward_claimed_layer_norm_clusters(n, dtype, rows):
    """LayerNorm's routed clusters that claim their rows where every CTA holds N / cluster elements
    (``equal_shares``: one count for all ranks in Chan's combination): every output against float64, around the
    grid's size; the counter back at zero."""
    cfg = route(RowOp.LAYER_NORM, n, dtype).config
    torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    x = (make_input(rows, n, torch.float32) * 2 + 8).to(torch_dtype)  # a mean well away from 0
    w, b = torch.randn(n, device="cuda", dtype=torch_dtype), torch.randn(n, device="cuda", dtype=torch_dtype)
    _check_staged_layer_norm(x, w, b, cfg)
    torch.cuda.synchronize()
    assert memory.claim_counter(from_torch(x)).tolist() == [0, 0]
