"""topk_route and align_tokens on the GPU against the float32 torch references (flydsl.kernels.moe.reference), whose
tie and ordering rules are the kernels'. Outputs start as garbage: blocks of their sizes are filled with 0x5A bytes
and freed just before each call, so torch's caching allocator hands them back (best effort), and an entry the kernels
leave unwritten shows.

Exact comparisons need inputs on which the kernel's float32 scores and torch's (exp and sums computed differently,
a few ulps apart) rank the same way:

* logits on a grid of 1/16 in [-8, 8): distinct logits give scores far apart (softmax: a factor e^(1/16); sigmoid:
  2e-5 at least), equal logits give equal scores in both, so ties are exact; half the rows repeat their largest
  logit at the last expert (the lower expert must win), others have whole runs of equal logits;
* DeepSeek-V3's grouped top-k with logits 0 or 20 (sigmoid exactly 0.5 or 1.0 in any implementation) and a bias on a
  grid of 1/16: every score, biased score, group sum and weight is exact, the bias decides and ties abound.

Realistic inputs (normal logits and biases) are compared exactly on the rows whose decisions are not near-ties (every
gap between the ranked scores that matters above 1e-5 in float64: at least 95% of them; bfloat16 logits tie often), and
every row is checked for distinct experts of the kept groups.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flydsl.kernels.moe import align_capacity, align_tokens, topk_route  # noqa: E402
from flydsl.kernels.moe.reference import align_tokens_reference, topk_route_reference  # noqa: E402

DEVICE = "cuda"
POISON = 0x5A  # int32 0x5A5A5A5A: no expert, no index, no weight
TOKENS = [1, 7, 1000, 70000]
DEEPSEEK_V3 = dict(scoring="sigmoid", num_groups=8, top_groups=4)


def _generator(seed: int):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _poison(*nbytes: int) -> None:
    """Blocks of these sizes filled with POISON and freed: the next allocations of those sizes get them back."""
    blocks = [torch.full((max(n, 1),), POISON, dtype=torch.uint8, device=DEVICE) for n in nbytes]
    torch.cuda.synchronize()
    del blocks


def _grid_logits(tokens, experts, dtype, generator, ties=True):
    """Logits on the 1/16 grid in [-8, 8) (exact in bfloat16 and float16); with ``ties``, the even rows repeat their
    largest logit at the last expert and every fifth row is a run of one value over its first half."""
    x = torch.randint(-128, 128, (tokens, experts), device=DEVICE, generator=generator).float() / 16
    if ties and experts > 1:
        x[::2, -1] = x[::2].max(dim=-1).values
        x[::5, : max(2, experts // 2)] = x[::5, :1]
    return x.to(dtype)


def _route(logits, top_k, bias=None, **options):
    """The kernel's (weights, ids) on poisoned outputs and the reference's."""
    expected = topk_route_reference(logits, top_k, bias=bias, **options)
    tokens = logits.shape[0]
    _poison(tokens * top_k * 4, tokens * top_k * 4)
    got = topk_route(logits, top_k, bias=bias, **options)
    torch.cuda.synchronize()
    weights, ids = got
    assert weights.shape == ids.shape == (tokens, top_k)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    return got, expected


def _assert_same_route(got, expected, exact_weights=False):
    (weights, ids), (ref_weights, ref_ids) = got, expected
    mismatch = (ids != ref_ids).any(dim=-1).nonzero()
    assert (
        mismatch.numel() == 0
    ), f"rows {mismatch[:8, 0].tolist()}: {ids[mismatch[:4, 0]]} != {ref_ids[mismatch[:4, 0]]}"
    if exact_weights:
        assert torch.equal(weights, ref_weights)
    else:
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("experts", [8, 60, 128, 256])
@pytest.mark.parametrize("top_k", [1, 2, 8])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_topk_route_matches_the_reference(tokens, experts, top_k, scoring):
    generator = _generator(tokens + experts * 7 + top_k)
    logits = _grid_logits(tokens, experts, torch.float32, generator)
    got, expected = _route(logits, top_k, scoring=scoring, renormalize=top_k > 1)
    _assert_same_route(got, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (60, 4), (61, 3), (160, 6), (256, 8), (384, 8), (512, 16)])
def test_topk_route_reads_16_bit_logits_and_every_layout(dtype, experts, top_k):
    """16-bit logits (bf16 rows of 120 bytes: scalar loads), the ragged layout (61), 12 and 16 experts a lane."""
    generator = _generator(experts + top_k)
    logits = _grid_logits(1000, experts, dtype, generator)
    for scoring in ("softmax", "sigmoid"):
        got, expected = _route(logits, top_k, scoring=scoring)
        _assert_same_route(got, expected)


def test_topk_route_reads_strided_rows_and_one_expert():
    generator = _generator(5)
    wide = _grid_logits(777, 300, torch.float32, generator)
    got, expected = _route(wide[:, 10:266], 8)  # rows 300 apart
    _assert_same_route(got, expected)
    got, expected = _route(wide[:, :1], 1)  # E = 1: weight 1 (renormalized)
    _assert_same_route(got, expected, exact_weights=True)
    assert (got[1] == 0).all() and (got[0] == 1).all()


def _deepseek_exact(tokens, experts, generator):
    """Logits 0 or 20 (sigmoid 0.5 or 1.0 exactly) and a bias on the grid of 1/16 in [-0.5, 0.5)."""
    logits = torch.randint(0, 2, (tokens, experts), device=DEVICE, generator=generator).float() * 20
    bias = torch.randint(-8, 8, (experts,), device=DEVICE, generator=generator).float() / 16
    return logits, bias


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_v3_grouped_topk_is_exact(tokens, dtype):
    """E 256 in 8 groups, the best 4 kept, k 8, sigmoid + bias: ids and weights bit for bit."""
    generator = _generator(tokens)
    logits, bias = _deepseek_exact(tokens, 256, generator)
    got, expected = _route(logits.to(dtype), 8, bias=bias, **DEEPSEEK_V3)
    _assert_same_route(got, expected, exact_weights=True)
    groups = got[1].long() // 32
    assert all(len(set(row)) <= 4 for row in groups[:200].tolist())


@pytest.mark.parametrize(
    "experts,top_k,options",
    [
        (160, 6, dict(scoring="sigmoid", num_groups=8, top_groups=3)),  # DeepSeek-V2's shape: 5 experts a lane
        (64, 4, dict(scoring="sigmoid", num_groups=4, top_groups=2, renormalize=False)),  # two tokens a warp
        (96, 5, dict(scoring="sigmoid", num_groups=3, top_groups=1)),  # 12 of 16 lanes hold experts
        (128, 8, dict(scoring="sigmoid")),  # the bias alone
    ],
)
def test_grouped_and_biased_layouts_are_exact(experts, top_k, options):
    generator = _generator(experts)
    logits, bias = _deepseek_exact(5000, experts, generator)
    got, expected = _route(logits, top_k, bias=bias, **options)
    _assert_same_route(got, expected, exact_weights=True)


def _decisive(logits, top_k, tol=1e-5, *, scoring="softmax", bias=None, num_groups=None, top_groups=None, **_):
    """The rows whose choices no rounding can change: in float64 from the reference's float32 scores, the kept
    groups' margin over the others and every gap between the k + 1 best candidates' scores above ``tol``."""
    x = logits.float()
    scores = (torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)).double()
    choice = scores if bias is None else scores + bias.double()
    tokens, experts = x.shape
    decisive = torch.ones(tokens, dtype=torch.bool, device=x.device)
    if num_groups and num_groups > 1:
        sums = choice.view(tokens, num_groups, -1).topk(2, dim=-1).values.sum(-1)
        ranked = sums.sort(dim=-1, descending=True)
        if top_groups < num_groups:
            decisive &= ranked.values[:, top_groups - 1] - ranked.values[:, top_groups] > tol
        kept = torch.zeros_like(sums, dtype=torch.bool).scatter_(1, ranked.indices[:, :top_groups], True)
        choice = choice.masked_fill(~kept.repeat_interleave(experts // num_groups, dim=1), float("-inf"))
    best = choice.topk(min(top_k + 1, experts), dim=-1).values
    gaps = best[:, :-1] - best[:, 1:]
    return decisive & (gaps.isinf() | (gaps > tol)).all(dim=-1)


@pytest.mark.parametrize(
    "experts,top_k,options",
    [
        (256, 8, DEEPSEEK_V3),
        (256, 8, dict(scoring="softmax", num_groups=8, top_groups=4)),
        (128, 4, dict(scoring="softmax")),  # softmax + bias
        (60, 4, dict(scoring="sigmoid", renormalize=False)),
    ],
)
def test_realistic_logits_agree_where_decisions_are_not_near_ties(experts, top_k, options):
    generator = _generator(experts + top_k)
    logits = (torch.randn(70000, experts, device=DEVICE, generator=generator) * 2).to(torch.bfloat16)
    bias = torch.randn(experts, device=DEVICE, generator=generator) * 0.05
    (weights, ids), (ref_weights, ref_ids) = _route(logits, top_k, bias=bias, **options)
    decisive = _decisive(logits, top_k, bias=bias, **options)
    assert decisive.float().mean() > 0.95
    assert torch.equal(ids[decisive], ref_ids[decisive])
    torch.testing.assert_close(weights[decisive], ref_weights[decisive], rtol=1e-5, atol=1e-7)
    ordered = ids.long().sort(dim=-1).values
    assert ((ordered[:, 1:] != ordered[:, :-1]).all() if top_k > 1 else True) and (ids >= 0).all()
    assert (ids < experts).all()
    if options.get("num_groups"):
        groups = (ids.long() // (experts // options["num_groups"])).sort(dim=-1).values
        distinct = 1 + (groups[:, 1:] != groups[:, :-1]).sum(-1)
        assert (distinct <= options["top_groups"]).all()


def test_topk_route_without_tokens():
    weights, ids = topk_route(torch.zeros(0, 64, device=DEVICE), 4)
    assert weights.shape == ids.shape == (0, 4) and ids.dtype == torch.int32


def test_topk_route_is_captured_in_a_cuda_graph(graphed):
    generator = _generator(11)
    logits, bias = _deepseek_exact(333, 256, generator)
    graph, (weights, ids) = graphed(lambda: topk_route(logits, 8, bias=bias, **DEEPSEEK_V3))
    for seed in range(3):
        new_logits, new_bias = _deepseek_exact(333, 256, _generator(100 + seed))
        logits.copy_(new_logits)
        bias.copy_(new_bias)
        graph.replay()
        torch.cuda.synchronize()
        expected = topk_route_reference(logits, 8, bias=bias, **DEEPSEEK_V3)
        _assert_same_route((weights, ids), expected, exact_weights=True)


# --- align_tokens ---------------------------------------------------------------------------------------------------


def _align(topk_ids, experts, block_m):
    """The kernels' outputs (poisoned first), checked equal to the reference's."""
    expected = align_tokens_reference(topk_ids, experts, block_m)
    capacity = align_capacity(topk_ids.numel(), experts, block_m)
    _poison(capacity * 4, capacity // block_m * 4, 4)
    got = align_tokens(topk_ids, experts, block_m)
    torch.cuda.synchronize()
    names = ("sorted_ids", "expert_of_block", "padded_count")
    for name, g, e in zip(names, got, expected, strict=True):
        assert g.dtype == torch.int32 and g.shape == e.shape, name
        if not torch.equal(g, e):
            wrong = (g != e).nonzero()[:8, 0].tolist()
            pytest.fail(f"{name}: differs at {wrong}: {g[wrong].tolist()} != {e[wrong].tolist()}")
    return got


def _routed_ids(tokens, top_k, experts, generator, dtype=torch.int32):
    """Distinct experts per token, as topk_route gives them."""
    return (
        torch.rand(tokens, experts, device=DEVICE, generator=generator)
        .argsort(dim=-1)[:, :top_k]
        .to(dtype)
        .contiguous()
    )


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("experts", [8, 60, 128, 256])
@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_align_tokens_matches_the_reference(tokens, experts, top_k):
    generator = _generator(tokens * 3 + experts + top_k)
    ids = _routed_ids(tokens, top_k, experts, generator)
    for block_m in (16, 64) if tokens < 70000 else (128,):
        _align(ids, experts, block_m)


@pytest.mark.parametrize(
    "tokens,top_k,experts,block_m,dtype",
    [
        (1024, 8, 256, 64, torch.int32),  # 8192 ids: the one-CTA kernel's most
        (1025, 8, 256, 64, torch.int64),  # 8200: the three kernels, 5 chunks
        (400_000, 8, 256, 128, torch.int32),  # 3.2M ids: 256 chunks
        (300_000, 8, 512, 16, torch.int64),  # E 512: 128 chunks of 2048 ids a warp
        (50_000, 4, 1, 7, torch.int32),
        (3, 2, 512, 1, torch.int32),
    ],
)
def test_align_tokens_at_every_size(tokens, top_k, experts, block_m, dtype):
    generator = _generator(tokens + experts)
    ids = torch.randint(0, experts, (tokens, top_k), device=DEVICE, generator=generator, dtype=dtype)
    _align(ids, experts, block_m)


@pytest.mark.parametrize("tokens", [7, 1000, 70000])
def test_align_tokens_with_empty_and_hot_experts(tokens):
    """Experts 0, 3, 6... only (the others empty), then 90% of the ids on expert 5, then all of them on one."""
    generator = _generator(tokens)
    ids = _routed_ids(tokens, 8, 128, generator)
    _align((ids % 43) * 3, 128, 32)
    hot = ids.clone()
    hot[torch.rand(ids.shape, device=DEVICE, generator=generator) < 0.9] = 5
    _align(hot, 128, 32)
    _align(torch.full_like(ids, 127), 128, 32)
    _align(torch.zeros_like(ids), 128, 1)


@pytest.mark.parametrize("tokens", [7, 1000, 70000])
def test_align_tokens_drops_ids_outside_the_experts(tokens):
    """Expert parallelism: -1 for the tokens another rank serves, ids past E, and int64 ids whose low 32 bits are an
    expert (dropped, not wrapped)."""
    generator = _generator(tokens + 1)
    ids = _routed_ids(tokens, 8, 256, generator, torch.int64)
    ids[ids >= 64] = -1  # this rank serves experts 0..63 of 256
    _align(ids.to(torch.int32), 64, 16)
    ids[::3, 0] = 64
    ids[1::5, 1] = (1 << 32) + 2
    ids[2::7, 2] = -(1 << 40)
    _align(ids, 64, 16)
    _align(torch.full_like(ids, -1), 64, 16)  # nothing routed here: no blocks


def test_align_tokens_without_ids():
    sorted_ids, expert_of_block, padded_count = _align(torch.zeros(0, 8, dtype=torch.int32, device=DEVICE), 16, 4)
    assert (sorted_ids == 0).all() and (expert_of_block == -1).all() and padded_count.item() == 0


def test_align_tokens_is_deterministic():
    generator = _generator(9)
    ids = _routed_ids(70000, 8, 256, generator)
    first = align_tokens(ids, 256, 64)
    for _ in range(3):
        again = align_tokens(ids, 256, 64)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("tokens", [100, 70000])  # one launch; three
def test_align_tokens_is_captured_in_a_cuda_graph(graphed, tokens):
    generator = _generator(tokens)
    ids = _routed_ids(tokens, 8, 256, generator)
    graph, outputs = graphed(lambda: align_tokens(ids, 256, 64))
    for seed in range(3):
        new = _routed_ids(tokens, 8, 256, _generator(tokens + seed + 1))
        if seed == 1:
            new[new >= 100] = -1  # fewer ids placed: a shorter padded total
        if seed == 2:
            new.fill_(200)
        ids.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        expected = align_tokens_reference(ids, 256, 64)
        assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))


def test_route_then_align():
    """topk_route's ids into align_tokens: every (token, slot) once, under its expert's blocks."""
    generator = _generator(21)
    logits = _grid_logits(3000, 256, torch.bfloat16, generator)
    bias = torch.randint(-8, 8, (256,), device=DEVICE, generator=generator).float() / 16
    weights, ids = topk_route(logits, 8, bias=bias, **DEEPSEEK_V3)
    sorted_ids, expert_of_block, padded_count = align_tokens(ids, 256, 64)
    total = padded_count.item()
    placed = sorted_ids[:total]
    real = placed < ids.numel()
    assert torch.equal(placed[real].sort().values, torch.arange(ids.numel(), device=DEVICE, dtype=torch.int32))
    block_of = torch.arange(total, device=DEVICE) // 64
    assert torch.equal(expert_of_block[block_of][real], ids.view(-1)[placed[real].long()])
    assert (sorted_ids[total:] == ids.numel()).all() and (expert_of_block[total // 64 :] == -1).all()
