"""paged_decode on the GPU against the float32 reference over the gathered pages: bf16/fp16 and fp8 caches (scales per
tensor and per token), grouped-query heads, 1-4 query tokens, sliding windows, soft-capping, split and unsplit
contexts, block sizes 16-128, pages shared between sequences, outputs poisoned first."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _relative_error(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def _case(
    *, batch=3, q_heads=8, kv_heads=2, dim=128, queries=1, block_size=16, contexts=(1, 17, 300), dtype=torch.bfloat16,
    fp8=None, shared=False, seed=0,
):  # fmt: skip
    """Random queries and caches; block tables a random permutation of the pages (shared: sequence 1 reuses
    sequence 0's pages). Returns the arguments of paged_decode and of the reference."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per = [-(-c // block_size) for c in contexts]
    max_blocks = max(blocks_per) + 1
    total = sum(blocks_per) + 3
    shape = (total, block_size, kv_heads, dim)
    k = torch.randn(shape, device="cuda", generator=g)
    v = torch.randn(shape, device="cuda", generator=g)
    scales = {}
    if fp8 is None:
        k_cache, v_cache = k.to(dtype), v.to(dtype)
    elif fp8 == "tensor":
        scales = {"k_scale": 0.02, "v_scale": 0.03}
        k_cache = (k / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn)
        v_cache = (v / 0.03).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:  # per token and head: each row's amax / 448
        ks = k.abs().amax(-1) / 448.0
        vs = v.abs().amax(-1) / 448.0
        scales = {"k_scale": ks, "v_scale": vs}
        k_cache = (k / ks[..., None]).to(torch.float8_e4m3fn)
        v_cache = (v / vs[..., None]).to(torch.float8_e4m3fn)
    pages = torch.randperm(total, device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(blocks_per):
        tables[b, :n] = pages[used : used + n]
        used += n
    if shared and batch > 1:
        n = min(blocks_per[0], blocks_per[1])
        tables[1, :n] = tables[0, :n]
    lens = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    q_shape = (batch, q_heads, dim) if queries == 1 else (batch, queries, q_heads, dim)
    q = torch.randn(q_shape, device="cuda", generator=g).to(dtype)
    return q, k_cache, v_cache, tables, lens, scales


def _check(case, tolerance=1e-2, **options):
    from flydsl.kernels.attention import paged_decode
    from flydsl.kernels.attention.reference import paged_decode_reference

    q, k_cache, v_cache, tables, lens, scales = case
    max_context = options.pop("max_context", None)
    out = torch.full_like(q, float("nan"))
    paged_decode(q, k_cache, v_cache, tables, lens, out=out, max_context=max_context, **scales, **options)
    torch.cuda.synchronize()
    ref = paged_decode_reference(q, k_cache, v_cache, tables, lens, **scales, **options)
    assert not out.isnan().any(), "unwritten or NaN outputs"
    error = _relative_error(out, ref)
    assert error < tolerance, f"relative error {error:.2e}"
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("contexts", [(1, 15, 17), (300, 1000, 2049)])
def test_paged_decode_16bit(dtype, contexts):
    _check(_case(dtype=dtype, contexts=contexts))


@pytest.fixture(params=["kernel", "last"])
def merges(request, monkeypatch):
    """paged_decode with its splits merged by the dependent merge kernel and by the last split, whatever their
    count."""
    from flydsl.kernels.attention import api

    monkeypatch.setattr(api, "_MERGE", request.param)
    api._PLANS.clear()
    yield request.param
    api._PLANS.clear()


@pytest.mark.parametrize("batch, max_context", [(3, None), (3, 5000), (70, 5000)])
def test_paged_decode_splits(batch, max_context, merges):
    """Contexts cut over several CTAs (merged by the last one) and, with 70 x 8 KV heads filling the GPU, one split per
    CTA writing the output itself; block_size 32."""
    contexts = tuple((1, 700, 4500)[i % 3] + i for i in range(batch))
    _check(_case(contexts=contexts, block_size=32, batch=batch, q_heads=32, kv_heads=8), max_context=max_context)


@pytest.mark.parametrize("fp8", [None, "tensor"])
def test_paged_decode_many_splits(fp8, merges):
    """One KV head and long contexts: hundreds of splits; the short sequence leaves most of its splits without
    positions (partials of weight zero)."""
    case = _case(batch=2, q_heads=8, kv_heads=1, contexts=(20000, 300), fp8=fp8)
    _check(case, tolerance=2e-2)


@pytest.mark.parametrize("fp8", ["tensor", "token"])
@pytest.mark.parametrize("contexts", [(1, 17, 33), (512, 3000, 129)])
def test_paged_decode_fp8(fp8, contexts):
    _check(_case(fp8=fp8, contexts=contexts), tolerance=2e-2)


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("fp8", [None, "tensor", "token"])
def test_paged_decode_load_depths(prefetch, fp8, monkeypatch):
    """No loads ahead, and two chunks ahead (the planned depth is one): the loop's prologue and rotation, with
    contexts shorter than the chunks loaded ahead."""
    from flydsl.kernels.attention import api

    monkeypatch.setattr(api, "_PREFETCH", prefetch)
    api._PLANS.clear()
    try:
        _check(_case(fp8=fp8, q_heads=16, kv_heads=2, contexts=(5, 70, 1500)), tolerance=2e-2)
    finally:
        api._PLANS.clear()


@pytest.mark.parametrize(
    "q_heads, kv_heads, queries",
    [(8, 8, 1), (8, 1, 1), (32, 8, 1), (16, 1, 1), (8, 2, 3), (8, 1, 4), (64, 2, 1)],
)
def test_paged_decode_groups_and_queries(q_heads, kv_heads, queries):
    """Group sizes 1..32 and 1-4 query tokens (causal among themselves): row tiles of up to 8 and 16 rows, and more
    than one row tile (8 x 4 = 32 rows)."""
    _check(_case(q_heads=q_heads, kv_heads=kv_heads, queries=queries, contexts=(4, 100, 530)))


@pytest.mark.parametrize("dim", [64, 256])
@pytest.mark.parametrize("fp8", [None, "tensor", "token"])
def test_paged_decode_head_dims(dim, fp8):
    _check(_case(dim=dim, fp8=fp8, contexts=(3, 257, 900)), tolerance=2e-2)


@pytest.mark.parametrize("block_size", [64, 128])
def test_paged_decode_block_sizes_and_shared_pages(block_size):
    _check(_case(block_size=block_size, contexts=(200, 300, 1), shared=True))


@pytest.mark.parametrize("window", [1, 16, 100])
@pytest.mark.parametrize("queries", [1, 2])
@pytest.mark.parametrize("fp8", [None, "token"])
def test_paged_decode_sliding_window(window, queries, fp8):
    tolerance = 1e-2 if fp8 is None else 2e-2
    case = _case(queries=queries, contexts=(5, 130, 2000), fp8=fp8)
    _check(case, tolerance=tolerance, sliding_window=window, max_context=2000)


@pytest.mark.parametrize("fp8", [None, "token"])
def test_paged_decode_soft_cap(fp8):
    case = _case(fp8=fp8, contexts=(20, 700, 64))
    q = case[0]
    case = (q * 8, *case[1:])  # logits large enough for the cap to matter
    _check(case, tolerance=2e-2, soft_cap=5.0, scale=0.1)


@pytest.mark.parametrize("q_heads", [8, 32])
def test_paged_decode_fp8_tiny_spread_value_scales(q_heads):
    """Per-token value scales all below f16's smallest normal and spread over 2^24 (each token's values times
    2^-(16 + 24u)), each sequence's first page of scale 0 and the larger half negative (the bytes negated): P carries
    them in f16, the rows' maxima shifted by their log2 (both score layouts)."""
    q, k_cache, v_cache, tables, lens, scales = _case(fp8="token", q_heads=q_heads, kv_heads=2, contexts=(9, 300, 1200))
    g = torch.Generator(device="cuda").manual_seed(1)
    v_scale = scales["v_scale"]
    factors = torch.exp2(-16.0 - 24.0 * torch.rand(v_scale.shape, device="cuda", generator=g))
    factors[tables[:, 0].long()] = 0.0
    v_scale = v_scale * factors
    negative = v_scale > v_scale.median()
    v_scale[negative] = -v_scale[negative]
    v_bytes = v_cache.view(torch.uint8)
    v_bytes[negative] ^= 0x80
    scales = dict(scales, v_scale=v_scale)
    _check((q, k_cache, v_cache, tables, lens, scales), tolerance=2e-2)


def test_paged_decode_large_values_fp8_queries():
    """fp8 keys take f16 queries scaled per row by a power of two: rows with values far outside f16's range stay
    exact."""
    q, k_cache, v_cache, tables, lens, scales = _case(fp8="tensor", contexts=(40, 90, 7))
    q = (q.float() * 1e6).to(torch.bfloat16)
    _check((q, k_cache, v_cache, tables, lens, scales), tolerance=2e-2, scale=1e-7)


def test_paged_decode_reuses_plan_and_new_lengths():
    """A second call with other context lengths (same shapes) reuses the plan and is right: nothing about the lengths
    is baked into the plan."""
    case = _case(contexts=(100, 200, 300))
    _check(case, max_context=4096)
    q, k_cache, v_cache, tables, lens, scales = case
    lens2 = torch.tensor((33, 1, 299), dtype=torch.int32, device="cuda")
    _check((q, k_cache, v_cache, tables, lens2, scales), max_context=4096)


def test_paged_decode_cuda_graph():
    """Captured once, replayed with new queries and context lengths."""
    from flydsl.kernels.attention import paged_decode
    from flydsl.kernels.attention.reference import paged_decode_reference

    q, k_cache, v_cache, tables, lens, _ = _case(contexts=(100, 500, 1500))
    out = torch.empty_like(q)
    paged_decode(q, k_cache, v_cache, tables, lens, out=out, max_context=1600)  # the plan, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode(q, k_cache, v_cache, tables, lens, out=out, max_context=1600)
    for lengths in ((1, 2, 3), (1500, 16, 1400)):
        q.copy_(torch.randn_like(q))
        lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_reference(q, k_cache, v_cache, tables, lens)
        assert _relative_error(out, ref) < 1e-2
