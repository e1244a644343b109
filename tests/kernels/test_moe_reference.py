"""The float32 torch references of the fused MoE layer (CPU only): the staged computation (align, gather, per-block
gated GEMMs, combine through inverse positions) equals the dense definition, which equals a per-token loop; the
inverse positions against a direct search."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flydsl.kernels.moe.reference import (  # noqa: E402
    align_tokens_reference,
    fused_moe_reference,
    inverse_positions,
    staged_moe_reference,
)

HIDDEN, INTER = 24, 16


def _operands(tokens, experts, k, kind, *, seed=0, dtype=torch.float32):
    """x, w1, w2, topk_weights, topk_ids with ids of the given kind."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g, dtype=dtype)
    w1 = torch.randn(experts, 2 * INTER, HIDDEN, generator=g, dtype=dtype) / HIDDEN**0.5
    w2 = torch.randn(experts, HIDDEN, INTER, generator=g, dtype=dtype) / INTER**0.5
    weights = torch.rand(tokens, k, generator=g, dtype=torch.float32)
    # distinct experts per token (as top-k gives), then reshaped by kind
    rows = [torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]
    ids = (torch.stack(rows) if rows else torch.zeros(0, k)).to(torch.int32)
    if kind == "empty experts":
        ids = ids % max(experts // 2, 1)  # the upper experts get nothing (ids may repeat within a token)
    elif kind == "one expert":
        ids.fill_(experts - 1)
    elif kind == "dropped":
        ids[torch.rand(tokens, k, generator=g) < 0.3] = -1
        ids[0, 0] = experts  # out of range: dropped too
        ids[-1, -1] = -(1 << 20)
    return x, w1, w2, weights, ids


def _per_token(x, w1, w2, weights, ids):
    """The definition, one (token, slot) at a time, in float64."""
    experts, inter = w1.shape[0], w1.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            if not 0 <= e < experts:
                continue
            w = w1[e].double()
            h = torch.nn.functional.silu(w[:inter] @ x[t].double()) * (w[inter:] @ x[t].double())
            out[t] += float(weights[t, s]) * (w2[e].double() @ h)
    return out


KINDS = ["random", "empty experts", "one expert", "dropped"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_m", [1, 4, 16])
@pytest.mark.parametrize("experts,k", [(1, 1), (3, 1), (3, 2), (3, 3), (8, 2), (8, 3)])
@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_staged_is_dense(tokens, experts, k, block_m, kind):
    x, w1, w2, weights, ids = _operands(tokens, experts, k, kind, seed=tokens * 100 + experts * 10 + k)
    dense = fused_moe_reference(x, w1, w2, weights, ids)
    staged = staged_moe_reference(x, w1, w2, weights, ids, block_m=block_m)
    assert dense.dtype == staged.dtype == torch.float32
    assert dense.shape == staged.shape == (tokens, HIDDEN)
    torch.testing.assert_close(staged, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens,experts,k", [(1, 1, 1), (5, 3, 2), (13, 8, 3)])
def test_dense_is_the_per_token_loop(tokens, experts, k, kind):
    x, w1, w2, weights, ids = _operands(tokens, experts, k, kind, seed=7, dtype=torch.float64)
    dense = fused_moe_reference(x, w1, w2, weights, ids.long())
    torch.testing.assert_close(dense.double(), _per_token(x, w1, w2, weights, ids), rtol=1e-5, atol=1e-5)


def test_dropped_tokens_and_empty_input_give_zeros():
    x, w1, w2, weights, ids = _operands(4, 3, 2, "random")
    ids[1] = -1
    ids[2] = 3
    for out in (fused_moe_reference(x, w1, w2, weights, ids), staged_moe_reference(x, w1, w2, weights, ids)):
        assert out[1:3].eq(0).all() and not out[0].eq(0).all()
    x, w1, w2, weights, ids = _operands(0, 3, 2, "random")
    assert staged_moe_reference(x, w1, w2, weights, ids, block_m=4).shape == (0, HIDDEN)
    assert fused_moe_reference(x, w1, w2, weights, ids).shape == (0, HIDDEN)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens,experts,k,block_m", [(1, 1, 1, 1), (9, 3, 2, 4), (30, 8, 3, 16)])
def test_inverse_positions_is_the_search(tokens, experts, k, block_m, kind):
    _, _, _, _, ids = _operands(tokens, experts, k, kind, seed=3)
    sorted_ids, _, _ = align_tokens_reference(ids, experts, block_m)
    count = tokens * k
    inverse = inverse_positions(sorted_ids, count)
    assert inverse.dtype == torch.int64 and inverse.shape == (count,)
    listed = sorted_ids.tolist()
    flat = ids.reshape(-1).tolist()
    for i in range(count):
        expected = listed.index(i) if 0 <= flat[i] < experts else -1
        assert listed.count(i) == (expected >= 0)
        assert int(inverse[i]) == expected
