"""flydsl.kernels.gemm on the GPU (``gpu``): gemm() against a float64 reference on fresh random data with the output
poisoned: odd shapes (tails in M, N, K), both majors of each operand, bf16/fp16 inputs, fp32 output, every tile shape,
schedule, cluster, split K, split tail and stream-K configuration, the epilogues and the TMA store, the route to the
skinny kernel, operands TMA cannot read as they are. The CPU side is tests/kernels/test_gemm.py."""

from __future__ import annotations

import pytest

from flydsl.kernels.gemm import GemmConfig, gemm, max_stages


def _operand(torch, rows, cols, dtype, major):
    """A (rows, cols) matrix, row-major ("K") or the transpose of a row-major (cols, rows) one ("MN")."""
    if major == "K":
        return torch.randn(rows, cols, device="cuda").to(dtype)
    return torch.randn(cols, rows, device="cuda").to(dtype).t()


def _check(torch, a, b, out):
    reference = a.double() @ b.double()
    error = (out.double() - reference).norm() / reference.norm()
    assert not torch.isnan(out).any()
    assert error < 1e-2 if out.dtype != torch.float32 else error < 1e-4, error


def _gemm_checked(torch, a, b, cfg=None):
    """gemm(a, b) into a NaN-poisoned bf16 output with ``cfg``, checked against float64."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out, cfg)
    torch.cuda.synchronize()
    _check(torch, a, b, out)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k",
    [(128, 256, 64), (256, 512, 1024), (1000, 776, 520), (8, 4096, 4096), (4104, 264, 72), (1, 8, 8)],
)
def test_gemm_on_gpu(m, n, k):
    torch = pytest.importorskip("torch")
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(k, n, device="cuda").bfloat16()
    _gemm_checked(torch, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("K", "K"), ("MN", "MN")])
@pytest.mark.parametrize(
    "tile_m,tile_n,cluster_m,split_k",
    [
        (128, 128, 1, 1),
        (128, 128, 2, 1),
        (128, 64, 1, 3),
        (64, 256, 1, 1),
        (64, 64, 1, 2),
        (128, 192, 1, 1),
        (256, 128, 2, 1),
        (256, 128, 1, 1),
    ],
)
def test_gemm_tile_shapes_on_gpu(a_major, b_major, tile_m, tile_n, cluster_m, split_k):
    """Every tile shape candidate_configs offers, with the deepest pipeline, on tails in M, N and K."""
    torch = pytest.importorskip("torch")
    m, n, k = {64: 56, 128: 520, 256: 1000}[tile_m], 392, 264
    cfg = GemmConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        stages=max_stages(tile_m, tile_n),
        consumers=min(2, tile_m // 64),
        cluster_m=cluster_m,
        split_k=split_k,
    )
    a = _operand(torch, m, k, torch.bfloat16, a_major)
    b = _operand(torch, k, n, torch.bfloat16, "MN" if b_major == "K" else "K")
    _gemm_checked(torch, a, b, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("K", "K"), ("MN", "MN")])
@pytest.mark.parametrize(
    "tile_m,cluster_n,split_k,split_tail",
    [(256, 2, 1, False), (128, 2, 1, False), (256, 4, 1, False), (256, 2, 2, True), (256, 2, 3, False)],
)
def test_gemm_cluster_along_n_on_gpu(a_major, b_major, tile_m, cluster_n, split_k, split_tail):
    """Clusters along N sharing A (15 tile columns: the last cluster's last CTA has none), on tails in M, N and K,
    with split K and split tails (5000 x 1800: 20 x 8 clusters of 256 x 128 tiles, 2.4 waves of 66)."""
    torch = pytest.importorskip("torch")
    m, n, k = (5000, 1800, 264) if split_tail else (1000, 1800, 1032)
    cfg = GemmConfig(
        tile_m=tile_m,
        tile_n=128,
        stages=max_stages(tile_m, 128),
        cluster_m=1,
        cluster_n=cluster_n,
        split_k=split_k,
        split_tail=split_tail,
    )
    a = _operand(torch, m, k, torch.bfloat16, a_major)
    b = _operand(torch, k, n, torch.bfloat16, "MN" if b_major == "K" else "K")
    _gemm_checked(torch, a, b, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("K", "K"), ("MN", "MN"), ("K", "MN")])
@pytest.mark.parametrize("m,n,k,cluster_m", [(520, 392, 264, 1), (1000, 776, 520, 2), (4104, 1160, 1032, 2)])
def test_gemm_pingpong_on_gpu(a_major, b_major, m, n, k, cluster_m):
    """Pingpong consumers (every other tile of a CTA each, odd tile counts included) on tails in M, N and K."""
    torch = pytest.importorskip("torch")
    cfg = GemmConfig(tile_n=128, stages=max_stages(128, 128), cluster_m=cluster_m, schedule="pingpong")
    a = _operand(torch, m, k, torch.bfloat16, a_major)
    b = _operand(torch, k, n, torch.bfloat16, "MN" if b_major == "K" else "K")
    _gemm_checked(torch, a, b, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1000, 776, 520), (4104, 1160, 1032), (130, 264, 64)])
@pytest.mark.parametrize("out_layout", ["contiguous", "padded rows", "odd columns"])
def test_gemm_tma_store_on_gpu(m, n, k, out_layout):
    """128 x 256 tiles store through shared memory and TMA (C 16-bit with 16-byte aligned rows) or, with odd
    columns, from registers: values equal the reference, and nothing outside C's view is written (TMA clips tiles
    at the view's edges, not the allocation's)."""
    torch = pytest.importorskip("torch")
    n = n + 1 if out_layout == "odd columns" else n
    cfg = GemmConfig()
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()
    bias = torch.randn(n, device="cuda").bfloat16()
    pad = 72 if out_layout == "padded rows" else 0
    store = torch.full((m + 3, n + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = store[:m, :n]
    gemm(a, b, out, cfg, bias=bias, activation="gelu")
    torch.cuda.synchronize()
    reference = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    assert ((out.double() - reference).norm() / reference.norm()) < 1e-2
    assert store[m:].isnan().all() and store[:, n:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile_m,tile_n,schedule",
    [(128, 192, "cooperative"), (128, 64, "cooperative"), (128, 64, "pingpong"), (256, 128, "cooperative")],
)
def test_gemm_tma_store_many_tiles_per_cta_on_gpu(tile_m, tile_n, schedule):
    """Many tiles per CTA, so that consecutive epilogues reuse the staging boxes (with an odd count of 64-column
    parts a block's first part must wait for the previous block's last TMA store to read its box), three times on
    fresh data, against float64."""
    torch = pytest.importorskip("torch")
    consumers = 2 if schedule == "pingpong" else min(2, tile_m // 64)
    cfg = GemmConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        stages=max_stages(tile_m, tile_n),
        consumers=consumers,
        schedule=schedule,
        cluster_m=1,
    )
    m, n, k = 4104, 3080, 200
    for _ in range(3):
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16().t()
        _gemm_checked(torch, a, b, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("K", "K"), ("MN", "MN")])
@pytest.mark.parametrize(
    "m,n,k,tile_n,cluster_m",
    [
        (1000, 776, 520, 256, 2),  # fewer tiles than workers: ~4 workers share each tile's 9 K steps
        (4104, 1160, 1032, 256, 1),  # 165 tiles on 132 SMs: all shared out, ~21 K steps each
        (2056, 2056, 264, 128, 1),  # 289 tiles: one wave whole, the rest shared out
        (128, 256, 520, 256, 1),  # one tile of 9 K steps: most workers have none
        (264, 200, 4104, 192, 1),  # long K
    ],
)
def test_gemm_stream_k_on_gpu(a_major, b_major, m, n, k, tile_n, cluster_m):
    """Stream-K on tails in M, N and K, with a bias and an activation; run twice on fresh data (every launch
    leaves the hand-over flags at zero for the next)."""
    torch = pytest.importorskip("torch")
    cfg = GemmConfig(tile_n=tile_n, stages=max_stages(128, tile_n), cluster_m=cluster_m, stream_k=True)
    for _ in range(2):
        a = _operand(torch, m, k, torch.bfloat16, a_major)
        b = _operand(torch, k, n, torch.bfloat16, "MN" if b_major == "K" else "K")
        bias = torch.randn(n, device="cuda")
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        gemm(a, b, out, cfg, bias=bias, activation="silu")
        torch.cuda.synchronize()
        reference = torch.nn.functional.silu(a.double() @ b.double() + bias.double())
        assert ((out.double() - reference).norm() / reference.norm()) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("b_major", ["K", "MN"])
@pytest.mark.parametrize("dtype,out_dtype", [("bfloat16", "float32"), ("float16", "float16")])
def test_gemm_majors_and_dtypes_on_gpu(a_major, b_major, dtype, out_dtype):
    torch = pytest.importorskip("torch")
    m, n, k = 392, 520, 328
    a = _operand(torch, m, k, getattr(torch, dtype), a_major)
    b = _operand(torch, k, n, getattr(torch, dtype), "MN" if b_major == "K" else "K")  # b (K, N): K-major = col
    out = torch.full((m, n), float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
    gemm(a, b, out)
    torch.cuda.synchronize()
    _check(torch, a, b, out)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("bias_dtype", [None, "bfloat16", "float32"])
def test_gemm_epilogue_on_gpu(activation, bias_dtype):
    torch = pytest.importorskip("torch")
    m, n, k = 300, 520, 136  # tails in M and N: the masked epilogue reads bias only inside C
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(k, n, device="cuda").bfloat16()
    bias = None if bias_dtype is None else torch.randn(n, device="cuda").to(getattr(torch, bias_dtype))
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    gemm(a, b, out, bias=bias, activation=activation)
    torch.cuda.synchronize()
    reference = a.double() @ b.double() + (0 if bias is None else bias.double())
    functions = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}
    reference = functions[activation](reference) if activation else reference
    error = (out.double() - reference).norm() / reference.norm()
    assert not torch.isnan(out).any() and error < 1e-4, error


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,split_k", [(16, 4096, 4096, 4), (200, 520, 1000, 3), (8, 264, 64, 5)])
def test_gemm_split_k_on_gpu(m, n, k, split_k):
    """Split K, empty parts included (k=64 is one K step for 5 parts), through the reduction's epilogue."""
    torch = pytest.importorskip("torch")
    a = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, w.t(), out, GemmConfig(split_k=split_k), bias=bias, activation="relu")
    torch.cuda.synchronize()
    reference = torch.relu(a.double() @ w.double().t() + bias.double())
    error = (out.double() - reference).norm() / reference.norm()
    assert not torch.isnan(out).any() and error < 1e-2, error


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,split_k,cluster_m,dtype",
    [(1000, 2048, 8192, 8, 2, "bf16"), (16, 512, 4096, 64, 1, "bf16"), (300, 1000, 2056, 6, 2, "f32")],
)
def test_gemm_split_k_many_waves_on_gpu(m, n, k, split_k, cluster_m, dtype):
    """Split K summed by the split that counts last, over more work units than CTAs (several waves per CTA: each
    tile's splits finish in any order) and more splits than CTAs fit on the GPU, with clusters, bf16 C (TMA stores)
    and fp32 C (from registers); called three times, so every tile's counter must be reset for the next launch."""
    torch = pytest.importorskip("torch")
    a = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    reference = a.double() @ w.double().t()
    for _ in range(3):
        out = torch.full((m, n), float("nan"), dtype=getattr(torch, {"bf16": "bfloat16", "f32": "float32"}[dtype]))
        out = out.cuda()
        gemm(a, w.t(), out, GemmConfig(tile_n=128, split_k=split_k, cluster_m=cluster_m))
        torch.cuda.synchronize()
        error = (out.double() - reference).norm() / reference.norm()
        assert not torch.isnan(out).any() and error < 1e-2, error


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,split_k,cluster_m", [(2056, 2000, 1000, 3, 2), (1100, 2100, 520, 2, 1)])
def test_gemm_split_tail_on_gpu(m, n, k, split_k, cluster_m):
    """Whole tiles for the full waves, the last wave's tiles split in K (tails in M, N and K; 64-column tiles, so
    several waves at these sizes), with bias + gelu, against float64; three calls (counters reset)."""
    torch = pytest.importorskip("torch")
    a = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(n, k, device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda")
    cfg = GemmConfig(tile_n=128, stages=max_stages(128, 128), cluster_m=cluster_m, split_k=split_k, split_tail=True)
    reference = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double())
    tiles = -(-m // (128 * cluster_m)) * -(-n // 128)
    workers = torch.cuda.get_device_properties(0).multi_processor_count // cluster_m
    assert tiles > workers and tiles % workers  # whole waves and a split last wave
    for _ in range(3):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm(a, w.t(), out, cfg, bias=bias, activation="gelu")
        torch.cuda.synchronize()
        error = (out.double() - reference).norm() / reference.norm()
        assert not torch.isnan(out).any() and error < 1e-2, error


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16])
def test_gemm_routes_decode_sizes_to_skinny_gemm_on_gpu(m):
    """M <= 16 with nn.Linear weights (b = w.t()) takes the weight-streaming kernel, epilogue included."""
    torch = pytest.importorskip("torch")
    a = torch.randn(m, 1000, device="cuda").bfloat16()
    w = torch.randn(1030, 1000, device="cuda").bfloat16()
    bias = torch.randn(1030, device="cuda")
    out = torch.full((m, 1030), float("nan"), dtype=torch.float32, device="cuda")
    gemm(a, w.t(), out, bias=bias, activation="silu")
    torch.cuda.synchronize()
    reference = torch.nn.functional.silu(a.double() @ w.double().t() + bias.double())
    error = (out.double() - reference).norm() / reference.norm()
    assert not torch.isnan(out).any() and error < 1e-4, error


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,layout",
    [
        (64, 64, 30, "row"),
        (37, 29, 1001, "row"),
        (37, 29, 1001, "col"),
        (200, 130, 77, "strided"),
        (5, 3, 1, "row"),
        (130, 1001, 72, "row"),  # odd rows of C: the full tiles' paired stores must not assume alignment
        (64, 128, 64, "broadcast"),  # a row broadcast over K (stride 0): copied, not handed to TMA
    ],
)
def test_gemm_any_shape_and_strides_on_gpu(m, n, k, layout):
    """Operands TMA cannot read as they are (odd K, odd M/N of column-major operands, every other column, an
    unaligned start) are copied into aligned rows first: any shape works."""
    torch = pytest.importorskip("torch")
    if layout == "row":
        a, b = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(k, n, device="cuda").bfloat16()
    elif layout == "col":
        a, b = torch.randn(k, m, device="cuda").bfloat16().t(), torch.randn(n, k, device="cuda").bfloat16().t()
    elif layout == "broadcast":
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(1, n, device="cuda").bfloat16().expand(k, n)
    else:  # every other column, and a view starting one element in
        a = torch.randn(m, 2 * k, device="cuda").bfloat16()[:, ::2]
        b = torch.randn(k * n + 1, device="cuda").bfloat16()[1:].view(k, n)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    gemm(a, b, out)
    torch.cuda.synchronize()
    _check(torch, a, b, out)


@pytest.mark.gpu
def test_bench_cli_times_the_gemm_on_gpu(capsys):
    from flydsl.kernels import bench

    assert bench.main(["gemm", "--m", "16,200", "--n", "264", "--k", "128", "--reps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["M", "N", "K"] and [line.split()[0] for line in lines[2:]] == ["16", "200"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile_m,tile_n,cluster_m,store_boxes",
    [
        (128, 192, 2, 1),
        (128, 192, 2, 2),
        (128, 256, 2, 1),
        (128, 64, 2, 1),
        (64, 96, 2, 2),
        (128, 144, 2, 2),
        (256, 128, 2, 4),
    ],
)
@pytest.mark.parametrize("m,n,k", [(1000, 776, 520), (2056, 1560, 1032)])
def test_gemm_b_parts_and_one_store_box_on_gpu(tile_m, tile_n, cluster_m, store_boxes, m, n, k):
    """Clusters along M whose B parts are 96, 72, 48 or 32 columns (K-major B, as nn.Linear weights), one staging box
    per consumer (a deeper pipeline) or four (a 128 x 128 consumer tile staged whole), on tails in M, N and K; an
    MN-major B is refused before launch."""
    torch = pytest.importorskip("torch")
    stages = max_stages(tile_m, tile_n, store_boxes=store_boxes)
    consumers = 1 if tile_m == 64 else 2
    cfg = GemmConfig(
        tile_m=tile_m, tile_n=tile_n, stages=stages, consumers=consumers, cluster_m=cluster_m, store_boxes=store_boxes
    )
    a = _operand(torch, m, k, torch.bfloat16, "K")
    _gemm_checked(torch, a, _operand(torch, k, n, torch.bfloat16, "MN"), cfg)
    if (tile_n // cluster_m) % 64:
        with pytest.raises(ValueError, match="b is MN-major"):
            gemm(a, _operand(torch, k, n, torch.bfloat16, "K"), config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_m,tile_n", [(64, 96), (128, 144), (128, 176)])
@pytest.mark.parametrize("m,n,k", [(1000, 776, 520), (520, 1560, 1032)])
def test_gemm_tile_widths_off_the_64_column_grid_on_gpu(tile_m, tile_n, m, n, k):
    """Tiles 96, 144 and 176 columns wide (K-major B, C from registers) on tails in M, N and K; an MN-major B is
    refused before launch."""
    torch = pytest.importorskip("torch")
    consumers = 1 if tile_m == 64 else 2
    cfg = GemmConfig(tile_m=tile_m, tile_n=tile_n, consumers=consumers, stages=max_stages(tile_m, tile_n), cluster_m=1)
    a = _operand(torch, m, k, torch.bfloat16, "K")
    _gemm_checked(torch, a, _operand(torch, k, n, torch.bfloat16, "MN"), cfg)
    with pytest.raises(ValueError, match="b is MN-major"):
        gemm(a, _operand(torch, k, n, torch.bfloat16, "K"), config=cfg)
