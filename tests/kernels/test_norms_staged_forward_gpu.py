"""flydsl.kernels' staged forward on the GPU (norm_forward_staged_kernel and the staged softmax, forward and
backward), against float64 with the tolerances of test_norms_gpu.py: routed and explicit shapes (rings, held chunks,
kept weights, clusters, teams, two CTAs per SM), rows of masked tails."""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels import norms  # noqa: E402

from .norms_gpu_support import (  # noqa: E402
    _DTYPE_NAME,
    _NORM,
    TOL,
    _close,
    _input,
    _ln_ref,
    _poison,
    _softmax_backward_ref,
)

# The staged forward (normalization.forward's default for long rows; STAGED_FORWARD set here all the same): rows
# through a shared-memory ring, a row's CTAs pushing their pairs to each other. N from the register kernel's cluster
# regime on, and odd multiples of 16 bytes (CTAs of a row holding unequal parts: 40968 bf16 over 2 CTAs, 98308 f32
# over 8); the fused add's single-row ring of 1 MB rows (bf16 262144); 8-CTA clusters keeping their weights (bf16
# 262144, f32 131072); teams past 8 CTAs per row (f32 262144: 16, the fused add 32; bf16 524288); where no staged
# config is routed (the fused add f32 32768, N not a multiple of 16 bytes), the register kernel. The other forward
# tests above take the default route: the staged kernel from 32768 on.
STAGED_FORWARD_SIZES = [32768, 40968, 65536, 98308, 131072, 262144, 524288]


@pytest.fixture
def staged_launches(monkeypatch):
    """Turns the staged forward on (the default), routes no row to the looped forward (which takes some of the
    staged kernel's shapes: norm_config.LOOPED_FORWARD), and records the configs it launches."""
    from flydsl.kernels import norm_config

    monkeypatch.setattr(norm_config, "LOOPED_FORWARD", {})
    taken = []
    real = _NORM._launch_staged_forward

    def spy(args, eps, cfg, *rest):
        taken.append(cfg)
        real(args, eps, cfg, *rest)

    monkeypatch.setattr(_NORM, "STAGED_FORWARD", True)
    monkeypatch.setattr(_NORM, "_launch_staged_forward", spy)
    return taken


def _staged_rows(n):
    """More rows than the persistent grid has CTA groups (the ring wraps around), and fewer."""
    return [max(3, (1 << 24) // n), 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", STAGED_FORWARD_SIZES)
def test_staged_forward(n, dtype, staged_launches):
    for variant in ("layer", "rms", "fused"):
        expected = _NORM.routed_staged_forward_config(n, _DTYPE_NAME[dtype], variant)
        for rows in _staged_rows(n):
            staged_launches.clear()
            x = _input(rows, n, dtype) * 2 + 8  # a mean well away from 0
            w = torch.randn(n, device="cuda", dtype=dtype)
            rstd = torch.full((rows,), float("nan"), device="cuda")
            if variant == "layer":
                b = torch.randn(n, device="cuda", dtype=torch.float32)
                mean = torch.full((rows,), float("nan"), device="cuda")
                out, _, _ = norms.layer_norm(x, w, b, 1e-5, _poison(x), mean=mean, rstd=rstd)
                ref, ref_mean, ref_rstd = _ln_ref(x, w, b, 1e-5)
                _close(mean, ref_mean, torch.float32, "mean")
            elif variant == "rms":
                out, _ = norms.rms_norm(x, w, 1e-6, _poison(x), rstd=rstd)
                xd = x.double()
                ref_rstd = 1 / torch.sqrt((xd * xd).mean(-1) + 1e-6)
                ref = xd * ref_rstd[:, None] * w.double()
            else:
                residual = _input(rows, n, dtype)
                expected_residual = (x.float() + residual.float()).to(dtype)
                out, res_out, _ = norms.fused_add_rms_norm(
                    x, residual, w, 1e-6, _poison(x), residual_out=residual, rstd=rstd
                )
                assert torch.equal(res_out, expected_residual), "residual_out"
                rd = expected_residual.double()
                ref_rstd = 1 / torch.sqrt((rd * rd).mean(-1) + 1e-6)
                ref = rd * ref_rstd[:, None] * w.double()
            _close(out, ref)
            _close(rstd, ref_rstd, torch.float32, "rstd")
            assert staged_launches == ([expected] if expected is not None else []), (variant, rows)


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
    """The staged kernel launched directly with shapes the default does not pick (benchmarks/norms_forward_staged.py
    sweeps them): LayerNorm with every output, against float64."""
    cfg = _NORM.staged_forward_config(n, _DTYPE_NAME[dtype], **shape)
    assert cfg is not None
    x = _input(300, n, dtype) * 2 + 8
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    _check_staged_layer_norm(x, w, b, cfg)


def _check_staged_layer_norm(x, w, b, cfg):
    """The staged kernel launched directly with ``cfg``: LayerNorm with every output against float64."""
    rows = x.shape[0]
    out = _poison(x)
    mean, rstd = torch.full((rows,), float("nan"), device="cuda"), torch.full((rows,), float("nan"), device="cuda")
    flags = _NORM.NormFlags(False, weight=True, bias=True, mean=True, rstd=True)
    _NORM._launch_staged_forward([x, x, w, b, out, x, mean, rstd], 1e-5, cfg, flags, rows, x.device.index)
    ref, ref_mean, ref_rstd = _ln_ref(x, w, b, 1e-5)
    _close(out, ref)
    _close(mean, ref_mean, torch.float32, "mean")
    _close(rstd, ref_rstd, torch.float32, "rstd")


# Teams of 16 CTAs per row; of 13, the last holding part of a share; of 4 (float32 65536, bf16 131072: rows a
# cluster would hold, as a team); of 5, the last mostly past N.
@pytest.mark.parametrize(
    "n, dtype",
    [(262144, torch.float32), (196612, torch.float32), (65536, torch.float32)]
    + [(131072, torch.bfloat16), (131080, torch.bfloat16)],
)
def test_staged_forward_teams(n, dtype):
    """Rows over several CTAs as a team (``staged_forward_config(team=True)``: pairs through tagged stores in global
    memory; routed past a cluster): LayerNorm with every output, RMSNorm, the fused add and softmax against float64,
    300 rows (each team walks ~37 of them at 16 CTAs per row)."""
    from flydsl.kernels.host import row_tensor
    from flydsl.kernels.softmax_staged import forward_staged

    rows, name = 300, _DTYPE_NAME[dtype]
    x = (_input(rows, n, torch.float32) * 2 + 8).to(dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    mean, rstd = torch.full((rows,), float("nan"), device="cuda"), torch.full((rows,), float("nan"), device="cuda")
    cfg = _NORM.staged_forward_config(n, name, team=True)
    assert cfg.row.team
    _check_staged_layer_norm(x, w, b, cfg)

    out = _poison(x)
    flags = _NORM.NormFlags(True, weight=True)
    _NORM._launch_staged_forward([x, x, w, b, out, x, mean, rstd], 1e-6, cfg, flags, rows, x.device.index)
    xd = x.double()
    _close(out, xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * w.double())

    residual, out = _input(rows, n, dtype), _poison(x)
    expected_residual = x + residual
    fused = _NORM.staged_forward_config(n, name, True, team=True)
    flags = _NORM.NormFlags(True, residual=True, weight=True)
    _NORM._launch_staged_forward([x, residual, w, b, out, residual, mean, rstd], 1e-6, fused, flags, rows, 0)
    assert torch.equal(residual, expected_residual), "residual_out"
    rd = expected_residual.double()
    _close(out, rd * torch.rsqrt((rd * rd).mean(-1, keepdim=True) + 1e-6) * w.double())

    out = _poison(x)
    assert forward_staged(row_tensor(x, "x"), row_tensor(out, "out"), cfg)
    _close(out, torch.softmax(x.double(), dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", STAGED_FORWARD_SIZES)
def test_staged_softmax_forward(n, dtype):
    """The staged softmax (flydsl.kernels.softmax_staged, routed by norms.softmax for long rows), launched on
    validated arguments, against float64; rows sum to 1. Where it has no config (f32 below 65536, N not a multiple of
    16 bytes) it declines (returns False) and launches nothing."""
    from flydsl.kernels.host import row_tensor
    from flydsl.kernels.softmax_staged import forward_staged, softmax_staged_config

    for rows in _staged_rows(n):
        x = _input(rows, n, dtype) * 3 + 5
        out = _poison(x)
        taken = forward_staged(row_tensor(x, "x"), row_tensor(out, "out"))
        assert taken == (softmax_staged_config(n, _DTYPE_NAME[dtype]) is not None)
        if not taken:
            return
        ref = torch.softmax(x.double(), dim=-1)
        _close(out, ref)
        _close(out.double() * n, ref * n, dtype, "out * N")  # at the scale of the mean element (~1), not of 1/N
        sums = out.double().sum(dim=-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=TOL[dtype][1] * max(1, n**0.5) + 1e-6)


@pytest.mark.parametrize(
    "n, shape",
    [(32768, dict(chunks=8, stages=1)), (65536, dict(chunks=8, stages=1, lag=0, hold=2)), (65544, dict(lag=0))],
    ids=str,
)
def test_staged_softmax_two_ctas_per_sm(n, shape):
    """The staged softmax in 512-thread CTAs two per SM (``blocks_per_sm=2``): one CTA per row, a cluster with held
    exps, a cluster of 4 whose third CTA holds a sliver and fourth nothing; against float64."""
    from flydsl.kernels.host import row_tensor
    from flydsl.kernels.softmax_staged import forward_staged

    cfg = _NORM.staged_forward_config(n, "bf16", threads=512, blocks_per_sm=2, **shape)
    assert cfg is not None and cfg.blocks_per_sm == 2
    for rows in _staged_rows(n):
        x = _input(rows, n, torch.bfloat16) * 3 + 5
        out = _poison(x)
        assert forward_staged(row_tensor(x, "x"), row_tensor(out, "out"), cfg)
        _close(out, torch.softmax(x.double(), dim=-1))


@pytest.mark.parametrize("hold", [None, 0, 2], ids=["routed", "hold0", "hold2"])
@pytest.mark.parametrize("n, dtype", [(65536, torch.bfloat16), (131072, torch.float32), (40968, torch.bfloat16)])
def test_staged_softmax_masked_tails(n, dtype, hold, monkeypatch):
    """Rows whose tail is -inf (a causal mask's: only the first ``keep`` columns finite), so that whole CTAs of a row
    hold nothing but -inf: their pair must add nothing (it was (-inf, NaN), from exp(-inf - -inf), and the row NaN).
    Against float64; the register kernel (norms.softmax) on the same rows as a peer. ``hold``: the routed config,
    or it with that many chunks' exps held in registers (0: none; 2: half of them, the rest recomputed)."""
    from flydsl.kernels.host import row_tensor
    from flydsl.kernels.softmax_staged import forward_staged, softmax_staged_config

    rows = 64
    keep = torch.randint(1, n + 1, (rows,), device="cuda")
    keep[:6] = torch.tensor([1, 7, 1000, 8192, n // 2 + 8, n], device="cuda")
    x = _input(rows, n, dtype) * 3
    x = x.masked_fill(torch.arange(n, device="cuda")[None, :] >= keep[:, None], float("-inf"))
    out = _poison(x)
    cfg = softmax_staged_config(n, _DTYPE_NAME[dtype])
    cfg = cfg if hold is None else dataclasses.replace(cfg, hold=hold)
    assert forward_staged(row_tensor(x, "x"), row_tensor(out, "out"), cfg)
    ref = torch.softmax(x.double(), dim=-1)
    _close(out, ref)
    _close(out.double() * n, ref * n, dtype, "out * N")
    _close(norms.softmax(x, _poison(x)), ref)  # routed: the staged kernel
    monkeypatch.setattr(_NORM, "STAGED_FORWARD", False)  # FLYDSL_NORM_STAGED_FORWARD=0: the register kernel
    _close(norms.softmax(x, _poison(x)), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [8192, 16384, 24584, *STAGED_FORWARD_SIZES])
def test_staged_softmax_backward(n, dtype, monkeypatch):
    """Softmax's backward on the staged kernel (dy and y through the ring; one CTA, clusters, the single-row ring of
    1 MB rows, teams), launched on validated arguments and routed by norms.softmax_backward, against float64 at the
    scale of the mean element; with STAGED_FORWARD off, the register kernel on the same rows."""
    from flydsl.kernels.host import row_tensor
    from flydsl.kernels.softmax_staged import backward_staged, softmax_backward_staged_config

    for rows in _staged_rows(n):
        y = torch.softmax(_input(rows, n, torch.float32) * 3, dim=-1).to(dtype)
        dy = _input(rows, n, dtype) + 0.5
        ref, magnitude = _softmax_backward_ref(dy, y)
        dx = _poison(dy)
        taken = backward_staged(row_tensor(dy, "dy"), row_tensor(y, "y"), row_tensor(dx, "dx"))
        assert taken == (softmax_backward_staged_config(n, _DTYPE_NAME[dtype]) is not None)
        for got in ([dx] if taken else []) + [norms.softmax_backward(dy, y, _poison(dy))]:
            _close(got, ref, what="dx")
            _close(got.double() * n, ref * n, dtype, "dx * N", n, magnitude * n)
    monkeypatch.setattr(_NORM, "STAGED_FORWARD", False)
    _close(norms.softmax_backward(dy, y, _poison(dy)).double() * n, ref * n, dtype, "dx * N", n, magnitude * n)


def test_staged_softmax_masked_tails_team(monkeypatch):
    """The masked tails of :func:`test_staged_softmax_masked_tails` in a team (float32 262144: 16 CTAs per row, the
    routed config): a CTA of nothing but -inf adds nothing to the combined pair."""
    test_staged_softmax_masked_tails(262144, torch.float32, None, monkeypatch)


@pytest.mark.parametrize("rows", [1, 131, 263, 264, 265, 1000, 4099])
def test_staged_forward_claimed_rows(rows):
    """Rows claimed from a counter (``claim_rows``: routed for 16-bit softmax and LayerNorm at 32768, in two CTAs
    per SM, and softmax up to 65536, in one 128 KB CTA; RMSNorm's 3-row ring; the fused add in a 128 KB single-row
    ring): every row written once, around the grid's size (264 CTAs at two per SM), against float64; the counter
    is back at zero after each launch, one per stream."""
    from flydsl.kernels.host import _CLAIM_COUNTERS, claim_counter, row_tensor
    from flydsl.kernels.softmax_staged import forward_staged, softmax_staged_config

    for n in (32768, 40968, 65536):
        cfg = softmax_staged_config(n, "bf16")
        assert cfg.claim_rows
        x = _input(rows, n, torch.bfloat16) * 3 + 5
        out = _poison(x)
        assert forward_staged(row_tensor(x, "x"), row_tensor(out, "out"), cfg)
        _close(out, torch.softmax(x.double(), dim=-1))
    n = 32768
    x = _input(rows, n, torch.bfloat16) * 2 + 8
    w, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    _check_staged_layer_norm(x, w, b, _NORM.routed_staged_forward_config(n, "bf16", "layer"))
    rms = _NORM.routed_staged_forward_config(n, "bf16", "rms")
    fused = _NORM.staged_forward_config(n, "bf16", True, chunks=4, stages=1, lag=0, claim_rows=True)
    assert rms.claim_rows and fused is not None and fused.row.cluster == 1
    residual, out, rstd = _input(rows, n, torch.bfloat16), _poison(x), torch.full((rows,), float("nan"), device="cuda")
    expected_residual = x + residual
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs and expected_residual are made on this stream
    with torch.cuda.stream(side):  # a stream of its own: its own counter
        _NORM._launch_staged_forward(
            [x, residual, w, b, out, residual, rstd, rstd], 1e-6, fused, _NORM.NormFlags(True, True, True), rows, 0
        )
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(residual, expected_residual), "residual_out"
    rd = expected_residual.double()
    _close(out, rd * torch.rsqrt((rd * rd).mean(-1, keepdim=True) + 1e-6) * w.double())
    out = _poison(x)
    flags = _NORM.NormFlags(True, weight=True)
    _NORM._launch_staged_forward([x, x, w, b, out, x, rstd, rstd], 1e-6, rms, flags, rows, 0)
    xd = x.double()
    _close(out, xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * w.double())
    torch.cuda.synchronize()
    assert claim_counter(row_tensor(x, "x")).tolist() == [0, 0]
    assert len({key for key in _CLAIM_COUNTERS if key[0] == x.get_device()}) >= 2  # the side stream's and this one's
    assert all(counter.tolist() == [0, 0] for counter in _CLAIM_COUNTERS.values())


@pytest.mark.parametrize("rows", [1, 29, 30, 31, 300, 1001])
@pytest.mark.parametrize("n, dtype", [(98312, torch.bfloat16), (65536, torch.float32), (262144, torch.bfloat16)])
def test_staged_forward_claimed_rows_in_clusters(n, dtype, rows):
    """Rows claimed from a counter by clusters (lag 0: the cluster's rank 0 claims, and pushes each claimed row to its
    peers with its pairs): 4 CTAs per row, the last holding 8 elements (bf16 98312), and 8 (bf16 262144); around
    the grid's size (30 clusters of 4, 15 of 8 on the H200); softmax and LayerNorm with every output against
    float64, RMSNorm with its weight kept; the counter back at zero."""
    from flydsl.kernels.host import claim_counter, row_tensor
    from flydsl.kernels.softmax_staged import forward_staged

    name = _DTYPE_NAME[dtype]
    x = (_input(rows, n, torch.float32) * 2 + 8).to(dtype)
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    layer = _NORM.staged_forward_config(n, name, lag=0, claim_rows=True)
    assert layer.claim_rows and layer.row.cluster in (4, 8)
    _check_staged_layer_norm(x, w, b, layer)
    out = _poison(x)
    assert forward_staged(row_tensor(x, "x"), row_tensor(out, "out"), layer)
    _close(out, torch.softmax(x.double(), dim=-1))
    rms = _NORM.staged_forward_config(n, name, lag=0, keep_weights=True, claim_rows=True)
    out, rstd = _poison(x), torch.full((rows,), float("nan"), device="cuda")
    flags = _NORM.NormFlags(True, weight=True, rstd=True)
    _NORM._launch_staged_forward([x, x, w, b, out, x, rstd, rstd], 1e-6, rms, flags, rows, 0)
    xd = x.double()
    ref_rstd = torch.rsqrt((xd * xd).mean(-1) + 1e-6)
    _close(out, xd * ref_rstd[:, None] * w.double())
    _close(rstd, ref_rstd, torch.float32, "rstd")
    torch.cuda.synchronize()
    assert claim_counter(row_tensor(x, "x")).tolist() == [0, 0]


@pytest.mark.parametrize("rows", [1, 15, 16, 300])
@pytest.mark.parametrize(
    "n, dtype", [(98304, torch.bfloat16), (131072, torch.bfloat16), (262144, torch.bfloat16), (131072, torch.float32)]
)
def test_staged_forward_claimed_layer_norm_clusters_of_8(n, dtype, rows):
    """LayerNorm's routed clusters of 8 (weights kept) claim their rows where every CTA holds N / 8 elements
    (``equal_shares``: one count for all ranks in Chan's combination); bf16 98304/131072 are two 512-thread CTAs per
    SM. Every output against float64, around the grid's size; the counter back at zero."""
    from flydsl.kernels.host import claim_counter, row_tensor

    cfg = _NORM.routed_staged_forward_config(n, _DTYPE_NAME[dtype], "layer")
    assert cfg.claim_rows and cfg.equal_shares and cfg.row.cluster == 8 and cfg.keep_weights
    x = (_input(rows, n, torch.float32) * 2 + 8).to(dtype)  # a mean well away from 0
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    _check_staged_layer_norm(x, w, b, cfg)
    torch.cuda.synchronize()
    assert claim_counter(row_tensor(x, "x")).tolist() == [0, 0]
