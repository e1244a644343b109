"""flydsl.kernels on the GPU: every kernel against a float64 reference computed from the same (rounded) inputs, with
random data, outputs poisoned with NaN before the run, N at the edge of every regime and odd N, strided rows, and
invariants (softmax rows sum to 1); the backward's variants (held rows, folded means, bulk fills, prefetched team
pairs) launched along chosen configs. Every routed configuration on data: test_norms_routes_gpu.py.

Tolerances (|out - ref| <= atol + rtol * |ref|), per output dtype: float32 1e-5 / 1e-5 (float32 reductions and
``ex2.approx``: a few ulp), float16 2e-3 / 2e-3, bfloat16 1.6e-2 / 1.6e-2 (the output's own rounding, 2^-11 and
2^-8, twice). Column sums (dweight, dbias) over R rows: rtol 1e-3 and atol 1e-4 * sqrt(R) * max|ref| on top."""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels.norms import backward as backward_mod  # noqa: E402
from flydsl.kernels.rows import layout, router  # noqa: E402
from flydsl.kernels.rows.configs import (  # noqa: E402
    LoopedShape,
    StagedBackwardShape,
    staged_backward_config,
    team_backward_config,
)
from flydsl.kernels.rows.layout import CacheHints  # noqa: E402

from .norms_gpu_support import (  # noqa: E402
    DTYPE_NAME,
    TOL,
    backward_configs,
    check_fused_add_in_place,
    check_layer_norm_backward,
    check_rms_norm_backward,
    close,
    column_close,
    column_sum_mod,
    forward_mod,
    ln_ref,
    make_input,
    poison,
    softmax_backward_ref,
    softmax_mod,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Edges of the regimes (warp <= 32 threads per row, block <= 1024, cluster of 2..8 CTAs) and odd sizes.
SIZES = [1, 3, 8, 257, 1000, 1024, 4097, 8192, 20001, 32768, 32769, 65537, 131072, 262144]  # 20001: one 1024-thread CTA


def _rows(n, max_elements=1 << 22):
    return max(1, min(67, max_elements // n))


@pytest.fixture
def fresh_routes():
    """Routes found again after the test edits the router's tables or the layout's constants (and after it)."""
    router.clear_cache()
    yield
    router.clear_cache()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_softmax_forward(n, dtype):
    rows = _rows(n)
    x = make_input(rows, n, dtype) * 3
    out = poison(x)
    assert zoo.softmax(x, out) is out
    ref = torch.softmax(x.double(), dim=-1)
    close(out, ref)
    sums = out.double().sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=TOL[dtype][1] * max(1, n**0.5) + 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 1000, 4097, 65537])
def test_softmax_strided_rows_and_allocated_output(n, dtype):
    x = make_input(9, n, dtype, strided=True)
    out = zoo.softmax(x)
    close(out, torch.softmax(x.double(), dim=-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 3, 1024, 4097, 32769, 131072])
def test_softmax_backward(n, dtype):
    rows = _rows(n)
    y = torch.softmax(make_input(rows, n, torch.float32), dim=-1).to(dtype)
    dy = make_input(rows, n, dtype)
    dx = zoo.softmax_backward(dy, y, poison(dy))
    ref, magnitude = softmax_backward_ref(dy, y)
    close(dx, ref, what="dx")
    close(dx.double() * n, ref * n, dtype, "dx * N", n, magnitude * n)  # at the scale of the mean element


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_layer_norm_forward(n, dtype):
    rows = _rows(n)
    x = make_input(rows, n, dtype) * 2 + 0.5
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=torch.float32)  # fp32 parameters work too
    out, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, poison(x), return_stats=True)
    ref, ref_mean, ref_rstd = ln_ref(x, w, b, 1e-5)
    close(out, ref)
    close(mean, ref_mean, torch.float32, "mean")
    close(rstd, ref_rstd, torch.float32, "rstd")
    out2, m2, r2 = zoo.layer_norm(x, None, None, 1e-5)
    assert m2 is None and r2 is None
    close(out2, ln_ref(x, None, None, 1e-5)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_rms_norm_forward(n, dtype):
    rows = _rows(n)
    x = make_input(rows, n, dtype, strided=n in (1000, 4097))
    w = torch.randn(n, device="cuda", dtype=dtype)
    rstd = torch.full((rows,), float("nan"), device="cuda")
    out, r = zoo.rms_norm(x, w, 1e-6, poison(x), rstd=rstd)
    assert r is rstd
    xd = x.double()
    ref_rstd = 1 / torch.sqrt((xd * xd).mean(-1) + 1e-6)
    close(out, xd * ref_rstd[:, None] * w.double())
    close(rstd, ref_rstd, torch.float32, "rstd")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 1024, 4097, 12289, 32768, 65537, 262144])  # 12289: one 1024-thread CTA
def test_fused_add_rms_norm(n, dtype):
    rows = _rows(n)
    x, residual = make_input(rows, n, dtype), make_input(rows, n, dtype)
    w = torch.randn(n, device="cuda", dtype=torch.float32)
    expected_residual = (x.float() + residual.float()).to(dtype)
    original = residual.clone()
    out, res_out, rstd = zoo.fused_add_rms_norm(x, residual, w, 1e-6, residual_out=residual, return_stats=True)
    assert res_out is residual  # in place
    assert torch.equal(res_out, expected_residual), "residual_out"
    rd = expected_residual.double()
    ref_rstd = 1 / torch.sqrt((rd * rd).mean(-1) + 1e-6)
    close(out, rd * ref_rstd[:, None] * w.double())
    close(rstd, ref_rstd, torch.float32, "rstd")
    assert not torch.equal(original, residual) or n == 0


@pytest.mark.parametrize("shape", [(32, 16), (256, 1)])
@pytest.mark.parametrize("parts, n", [(1, 1000), (4, 262144), (15, 4099), (33, 65536), (264, 8192)])
def test_column_sum_kernel(parts, n, shape):
    """column_sum_kernel in both block shapes: dweight and dbias are the float32 column sums of the partial rows,
    in a fixed order (the same bits twice), nothing written past N."""
    partial = torch.randn(parts, 2 * n, device="cuda")
    outs = [torch.full((n + 8,), float("nan"), device="cuda") for _ in range(4)]
    for dw, db in (outs[:2], outs[2:]):
        column_sum_mod.column_sum_kernel(partial, dw[:n], db[:n], 2, shape).launch(
            grid=-(-2 * n // shape[0]), block=shape[0] * shape[1]
        )
    torch.cuda.synchronize()
    ref, magnitude = partial.double().sum(0), partial.double().abs().sum(0)  # float32 sums: error ~ the terms
    close(outs[0][:n], ref[:n], what="dweight", magnitude=magnitude[:n])
    close(outs[1][:n], ref[n:], what="dbias", magnitude=magnitude[n:])
    assert torch.equal(outs[0][:n], outs[2][:n]) and torch.equal(outs[1][:n], outs[3][:n]), "not deterministic"
    assert all(torch.isnan(t[n:]).all() for t in outs), "written past N"


@pytest.mark.parametrize("hints", ["rows=evict_first,out=evict_first,vectors=evict_last", "rows=stream,out=stream"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1000, 1024, 4096, 8192, 20000])
def test_register_forwards_with_cache_hints(n, dtype, hints, monkeypatch, fresh_routes):
    """The register forwards (the route's ``staged=False``) with cache-hinted accesses (rows.layout's
    FORWARD_CACHE_HINTS): the same values, the fused add in place."""
    every_dtype = dict.fromkeys(layout.FORWARD_CACHE_HINTS, CacheHints.parse(hints))
    monkeypatch.setattr(layout, "FORWARD_CACHE_HINTS", every_dtype)
    for module in (forward_mod, softmax_mod):
        routed = module.forward_route
        monkeypatch.setattr(module, "forward_route", lambda *args, _routed=routed: _routed(*args, staged=False))
    rows = _rows(n)
    x = make_input(rows, n, dtype) * 2 + 0.5
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    out, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, poison(x), return_stats=True)
    ref, ref_mean, ref_rstd = ln_ref(x, w, b, 1e-5)
    close(out, ref)
    close(rstd, ref_rstd, torch.float32, "rstd")
    close(zoo.softmax(x, poison(x)), torch.softmax(x.double(), dim=-1))
    check_fused_add_in_place(x, w)


_HINTED = ("rows=evict_last,vectors=evict_last", "rows=evict_first")
LOOPED_SHAPES = [(512, 1), (256, 2), (1024, 1), (512, 2, *_HINTED), (1024, 8, *_HINTED)]


@pytest.mark.parametrize("shape", LOOPED_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}" + ("-hinted" if len(s) > 2 else ""))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 1000, 2048, 4097, 8192, 12289, 32768, 65544])
def test_looped_forwards(n, dtype, shape, monkeypatch, fresh_routes):
    """The looped forward (router.LOOPED_FORWARD routing every N there), plain and with cache hints: LayerNorm
    with its statistics on rows offset from zero (three passes), RMSNorm and the fused add (in place) on strided rows
    (16-byte aligned ones looped, the others the register kernel); segments past N, odd N and a single segment."""
    looped = LoopedShape(*shape[:2], *map(CacheHints.parse, shape[2:]))
    routes = {(kind, DTYPE_NAME[dtype]): [(1, 1 << 30, looped)] for kind in ("layer", "rms", "fused")}
    monkeypatch.setattr(router, "LOOPED_FORWARD", routes)
    rows = _rows(n)
    x = make_input(rows, n, dtype) * 2 + 8.0
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=torch.float32)
    out, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, poison(x), return_stats=True)
    ref, ref_mean, ref_rstd = ln_ref(x, w, b, 1e-5)
    close(out, ref)
    close(mean, ref_mean, torch.float32, "mean")
    close(rstd, ref_rstd, torch.float32, "rstd")
    xs = make_input(rows, n, dtype, strided=True)
    out, rstd = zoo.rms_norm(xs, w, 1e-6, poison(xs), return_stats=True)
    xd = xs.double()
    ref_rstd = 1 / torch.sqrt((xd * xd).mean(-1) + 1e-6)
    close(out, xd * ref_rstd[:, None] * w.double())
    close(rstd, ref_rstd, torch.float32, "rstd")
    check_fused_add_in_place(xs, w)


# Backward regimes: rows in registers; several rows per 256-thread CTA, one CTA of up to 1024 threads (4097),
# clusters (32768, 32769: 16 then 8 values per thread for 16-bit rows); two passes over rows longer than 65536 (the
# second from L2); LayerNorm's column sums in global memory past 131072; odd N (element-wise tails).
BACKWARD_SIZES = [1, 3, 1000, 1024, 4097, 32768, 32769, 65536, 65537, 262147]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", BACKWARD_SIZES)
def test_layer_norm_backward(n, dtype, rows=None, offset=0.0):
    rows = rows or _rows(n, 1 << 21) + 5
    x = (make_input(rows, n, torch.float32) + offset).to(dtype)  # offset: rows' mean that far from 0
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    check_layer_norm_backward(make_input(rows, n, dtype), x, w, b)


@pytest.mark.parametrize("n", [1000, 4097, 40968])  # register kernel (whole chunks, per element), staged kernel
def test_layer_norm_backward_huge_constant_rows(n):
    """Rows of one huge constant value (mean 2e36, variance 0, rstd = 1/sqrt(eps)): each real xhat is 0, but the
    padding's and a row past the end's would be -mean * rstd = -6e38, -inf in float32, and 0 * inf = NaN; the
    kernel keeps them out of the sums (masks per chunk, zero statistics past the last row). Statistics given in
    float64-exact form (the forward's float32 sum of 1000 x 2e36 overflows)."""
    rows = 37  # CTAs with rows past the end
    x = torch.full((rows, n), 2e36, device="cuda")
    w = torch.randn(n, device="cuda")
    dy = make_input(rows, n, torch.float32)
    mean = torch.full((rows,), 2e36, device="cuda")
    rstd = torch.full((rows,), 1e-5**-0.5, device="cuda")
    dx, dw, db = zoo.layer_norm_backward(dy, x, w, mean, rstd, dx=poison(x))
    g = dy.double() * w.double()
    ref_dx = (g - g.mean(-1, keepdim=True)) * rstd.double()[:, None]  # xhat = 0 everywhere
    close(dx, ref_dx, what="dx")
    assert torch.equal(dw, torch.zeros_like(dw)), "dweight = sum(dy * xhat) = 0"
    column_close(db, dy.double().sum(0), rows, "dbias")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", BACKWARD_SIZES[:-1] + [262144])
def test_rms_norm_backward(n, dtype, rows=None):
    rows = rows or _rows(n, 1 << 21) + 3
    x = make_input(rows, n, dtype)
    w = torch.randn(n, device="cuda", dtype=torch.float32)
    dy = make_input(rows, n, dtype)
    check_rms_norm_backward(dy, x, w)
    check_rms_norm_backward(dy, x, None)  # no weight: no column sums (sums = 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 3, 1000, 1024, 4097, 8192])
def test_norm_backward_few_rows(n, dtype):
    """A few rows: one CTA walks them all and writes dweight/dbias itself (``direct``), up to the last row count
    that does; one row group more: the persistent grid and the column-sum kernel."""
    for rms, sums in ((False, 2), (True, 1)):
        op = router.RowOp.RMS_NORM_BACKWARD if rms else router.RowOp.LAYER_NORM_BACKWARD
        cfg = router.route(op, n, DTYPE_NAME[dtype], sums=sums).config
        last = backward_mod.DIRECT_ROW_GROUPS * cfg.row.rows_per_cta
        assert backward_mod.direct_rows(cfg, last) and not backward_mod.direct_rows(cfg, last + 1)
        for rows in (1, 2, last, last + 1):
            if rms:
                test_rms_norm_backward(n, dtype, rows=rows)
            else:
                test_layer_norm_backward(n, dtype, rows=rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1000, 1024])
def test_norm_backward_many_rows(n, dtype):
    """More row groups than the persistent grid has CTAs: each CTA walks several (reduction slots alternate)."""
    test_layer_norm_backward(n, dtype, rows=9001)
    test_rms_norm_backward(n, dtype, rows=9001)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [16384, 65536])
def test_norm_backward_staged_many_rows(n, dtype):
    """The staged kernel (rows through a shared-memory ring) over more rows than clusters: the ring wraps around,
    rows past the last are zero-filled; one call with every argument 16-byte aligned (staged), one with rows that
    start 2 or 4 bytes off (the register kernel)."""
    rows = 3 * 132 + 7
    test_layer_norm_backward(n, dtype, rows=rows)
    test_rms_norm_backward(n, dtype, rows=rows)
    base = torch.randn(rows, n + 8, device="cuda", dtype=torch.float32).to(dtype)
    x, dy = base[:, 1 : 1 + n], torch.randn_like(base)[:, 1 : 1 + n]
    check_rms_norm_backward(dy, x, torch.randn(n, device="cuda", dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [131072, 262144])
def test_norm_backward_team(n, dtype):
    """Rows split over a team of CTAs that share their sums through global memory (LayerNorm and RMSNorm, with and
    without weight; where routed, clusters): more rows than teams (the ring wraps around, each row's tagged pairs are
    polled)."""
    test_layer_norm_backward(n, dtype, rows=45)
    test_rms_norm_backward(n, dtype, rows=45)


# Staged backward shapes that hold each row's (g, x - mean) in registers from the first pass to dx (lag 0) and keep
# the weight in registers: one CTA per row, clusters, a team; (threads, chunks, stages, team).
HELD_SHAPES = [(1024, 1, 4, False), (1024, 2, 3, False), (512, 2, 6, False), (1024, 1, 4, True)]


def _held_config(n, dtype, sums, shape, keep):
    threads, chunks, stages, team = shape
    if team:
        team_shape = router.team_shape(dtype, sums)._replace(
            threads=threads, chunks=chunks, stages=stages, lag=0, bulk=False, hold=True, keep_weights=keep
        )
        return team_backward_config(n, dtype, sums, team_shape, smallest=2)
    held = StagedBackwardShape(threads, chunks, 0, stages, hold=True, keep_weights=keep)
    return staged_backward_config(n, dtype, sums, held)


@pytest.mark.parametrize("keep", [False, True], ids=["loaded", "kept"])
@pytest.mark.parametrize("shape", HELD_SHAPES, ids=lambda s: "x".join(map(str, s[:3])) + ("-team" if s[3] else ""))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [8192, 65536, 65544])
def test_norm_backward_staged_held(n, dtype, shape, keep, monkeypatch):
    """The staged backward with ``hold`` (each slot refilled right after the row's first pass) and
    ``keep_weights``, more rows than CTA groups (the ring wraps around, rows past the last are zero-filled); 65544:
    the last chunks past N."""
    configs = {sums: _held_config(n, DTYPE_NAME[dtype], sums, shape, keep) for sums in (0, 1, 2)}
    if any(cfg is None for cfg in configs.values()):
        pytest.skip("no such config at this N")
    rows = 2 * 132 + 9
    with backward_configs(monkeypatch, lambda routed, sums: configs[sums]) as launched:
        test_layer_norm_backward(n, dtype, rows=rows)
        test_rms_norm_backward(n, dtype, rows=rows)
    assert {cfg.sums for cfg in launched} == {0, 1, 2}, launched


@pytest.mark.parametrize("offset", [0.0, 64.0], ids=["centered", "offset"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [16384, 65536, 65544, 131072, 262144])
def test_layer_norm_backward_fma_dx(n, dtype, offset, monkeypatch):
    """The staged LayerNorm backward folding the mean into fmas (``fma_dx``) on its routed shapes (one CTA, a
    cluster, 512 x 4 clusters, a team; 65544: chunks past N): values within the 16-bit tolerance, also on rows whose
    mean is 64 standard deviations from 0 (where the folded mean loses the most)."""

    def folded(routed, sums):
        return dataclasses.replace(routed, fma_dx=True) if routed.staged else routed

    with backward_configs(monkeypatch, folded) as launched:
        test_layer_norm_backward(n, dtype, rows=2 * 132 + 9, offset=offset)
    assert launched and all(cfg.staged for cfg in launched), launched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [131072, 262144])
def test_norm_backward_team_prefetch(n, dtype, monkeypatch):
    """Teams reading each row's pairs a step early (``prefetch_pairs``): values as without (rows past the last
    and the ring's wrap-around included)."""

    def prefetched(routed, sums):
        return dataclasses.replace(routed, prefetch_pairs=routed.row.team and routed.lag > 0)

    with backward_configs(monkeypatch, prefetched):
        test_layer_norm_backward(n, dtype, rows=45)
        test_rms_norm_backward(n, dtype, rows=45)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [131072, 262144, 262152])
def test_norm_backward_team_bulk(n, dtype, monkeypatch):
    """Teams and clusters whose ring one thread per CTA fills by bulk copies (``bulk``): values and column sums as the
    float64 reference, with rows past the last (their slots keep an earlier row: dbias must not count it), more rows
    than teams (the mbarriers' phases wrap around) and 262152 (a CTA mostly past N, its tail zeroed once)."""

    def bulk(routed, sums):
        return dataclasses.replace(routed, bulk=routed.staged and routed.row.cluster > 1 and not routed.hold)

    with backward_configs(monkeypatch, bulk) as launched:
        for rows in (45, 3):
            test_layer_norm_backward(n, dtype, rows=rows)
            test_rms_norm_backward(n, dtype, rows=rows)
    assert launched and all(cfg.bulk for cfg in launched), launched


@pytest.mark.parametrize("prefetch", [False, True], ids=["polled", "prefetched"])
@pytest.mark.parametrize("n", [262144, 262152])
def test_layer_norm_backward_team_512x4(n, prefetch, monkeypatch):
    """16-bit LayerNorm rows over a team of 512 x 4-chunk CTAs (16 per row at 262144; 262152: one more CTA, mostly
    past N), lag 1 in a 3-row ring, with and without prefetched pairs: values as the float64 reference."""

    def team(sums):
        shape = router.team_shape("bf16", sums)._replace(
            threads=512, chunks=4, stages=3, lag=1, prefetch_pairs=prefetch, fma_dx=False
        )
        return team_backward_config(n, "bf16", sums, shape, smallest=2)

    configs = {sums: team(sums) for sums in (0, 2)}
    assert all(cfg is not None and cfg.row.team for cfg in configs.values())
    with backward_configs(monkeypatch, lambda routed, sums: configs[sums]):
        test_layer_norm_backward(n, torch.bfloat16, rows=45)


@pytest.mark.parametrize("n", [4096, 32768, 131072])
def test_norm_backward_is_deterministic(n):
    rows = 3001 if n < 65536 else 301
    x, dy = make_input(rows, n, torch.bfloat16), make_input(rows, n, torch.bfloat16)
    w, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    _, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, return_stats=True)
    first = zoo.layer_norm_backward(dy, x, w, mean, rstd)
    for _ in range(3):
        again = zoo.layer_norm_backward(dy, x, w, mean, rstd)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_errors_before_launch():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="flydsl.kernels.softmax: x: expected a CUDA tensor"):
        zoo.softmax(x.cpu())
    with pytest.raises(ValueError, match="softmax: x: expected unit stride"):
        zoo.softmax(x.t())
    with pytest.raises(TypeError, match="rms_norm: weight: expected dtype float32"):
        zoo.rms_norm(x, torch.ones(64, device="cuda", dtype=torch.float64))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cupy_arrays_in_and_out(dtype):
    """cupy inputs: outputs and statistics allocated with cupy, values as with torch (through the native launch path
    for array-interface objects after the first call)."""
    cupy = pytest.importorskip("cupy")
    x_t = make_input(64, 1000, getattr(torch, dtype))
    w_t = torch.randn(1000, device="cuda")
    x, w = cupy.asarray(x_t), cupy.asarray(w_t)
    ref = torch.nn.functional.layer_norm(x_t.double(), (1000,), w_t.double(), None, 1e-5)
    for _ in range(2):  # the first call compiles (Python path), the second launches natively
        out, mean, rstd = zoo.layer_norm(x, w, None, 1e-5, return_stats=True)
        assert type(out).__module__.split(".")[0] == "cupy" and out.dtype == x.dtype and mean.dtype == cupy.float32
        close(torch.as_tensor(out, device="cuda"), ref, getattr(torch, dtype))
