"""Float32 torch references of MoE, for tests and benchmarks: routing (:func:`topk_route_reference` and
:func:`align_tokens_reference`, with the tie and ordering rules of :func:`flydsl.kernels.moe.topk_route` and
:func:`flydsl.kernels.moe.align_tokens`) and the experts' gated MLP (:func:`fused_moe_reference`, the dense
definition, and :func:`staged_moe_reference`, the same result computed the way the two-stage kernels compute it:
gather by ``sorted_ids``, per-block GEMMs, combine through :func:`inverse_positions`). Plain torch on any device,
written for clarity, not speed.

Scores are ranked by :func:`order_keys`: an integer per float32 score whose order is the score's, every NaN above
+inf (``torch.topk``'s order) and -0 equal to +0; equal keys rank the lower expert (or group) first.
"""

from __future__ import annotations

__all__ = [
    "order_keys",
    "key_values",
    "topk_route_reference",
    "align_tokens_reference",
    "ACTIVATIONS",
    "fused_moe_reference",
    "staged_moe_reference",
    "inverse_positions",
    "dequantize_experts",
]

LOWEST = -(1 << 31)  # below every score's key: experts of the groups not kept
_NAN_KEY = (1 << 31) - 1
ACTIVATIONS = ("silu",)  # the gate's activation: act(gate) * up


def order_keys(scores):
    """int64 keys of float32 ``scores`` whose order is theirs (the kernel's ``order_key``): the bits of a
    non-negative float, those of a negative one with all but the sign flipped; NaN -> 2^31 - 1, -0 -> 0."""
    import torch

    bits = scores.float().contiguous().view(torch.int32).long()
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    keys = torch.where(scores.isnan(), torch.full_like(keys, _NAN_KEY), keys)
    return torch.where(scores == 0, torch.zeros_like(keys), keys)


def key_values(keys):
    """The float32 scores of :func:`order_keys` keys."""
    import torch

    bits = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    return bits.to(torch.int32).view(torch.float32)


def _best(keys, count: int):
    """The indices of the ``count`` highest keys along the last dim, highest first, on equal keys the lower index
    first (one sort of distinct composite keys: the rule does not depend on the sort's stability)."""
    import torch

    extent = keys.shape[-1]
    index = torch.arange(extent, device=keys.device)
    composite = keys * (1 << 10) + (extent - 1 - index)  # extent <= 1024: the index never reaches the key's bits
    return torch.sort(composite, dim=-1, descending=True).indices[..., :count]


def topk_route_reference(
    router_logits,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    bias=None,
    num_groups: int | None = None,
    top_groups: int | None = None,
):
    """``(weights float32 (T, k), ids int32 (T, k))`` of ``router_logits`` (T, E) by the definition of
    :func:`flydsl.kernels.moe.topk_route`: scores ``softmax(logits)`` or ``sigmoid(logits)`` in float32; choice
    scores with ``bias`` added; grouped, each group's score the sum of its two highest choice scores and the
    experts outside the ``top_groups`` best groups left out; the ``top_k`` best experts by choice score (ties: the
    lower expert, the lower group), their weights the unbiased scores, divided by their sum with ``renormalize``."""
    import torch

    x = router_logits.float()
    tokens, experts = x.shape
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    choice = scores if bias is None else scores + bias.to(device=x.device, dtype=torch.float32)
    keys = order_keys(choice)
    if num_groups is not None and num_groups > 1:
        size = experts // num_groups
        top_two = torch.topk(keys.view(tokens, num_groups, size), 2, dim=-1).values  # (T, G, 2): values only
        group_keys = order_keys(key_values(top_two[..., 0]) + key_values(top_two[..., 1]))
        kept = torch.zeros(tokens, num_groups, dtype=torch.bool, device=x.device)
        kept.scatter_(1, _best(group_keys, top_groups), True)
        keys = torch.where(kept.repeat_interleave(size, dim=1), keys, torch.full_like(keys, LOWEST))
    ids = _best(keys, top_k)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def align_tokens_reference(topk_ids, num_experts: int, block_m: int):
    """``(sorted_ids, expert_of_block, padded_count)`` int32 of ``topk_ids`` (T, k) by the definition of
    :func:`flydsl.kernels.moe.align_tokens`: the flattened indices of the ids in ``[0, num_experts)`` grouped by
    expert in expert order, increasing within an expert, each expert's run padded to a multiple of ``block_m`` with
    the sentinel T * k (as every position past the padded total), each block's expert (-1 past the total) and the
    padded total."""
    import torch

    from flydsl.kernels.moe.api import align_capacity

    device = topk_ids.device
    ids = topk_ids.reshape(-1).long()
    count = ids.numel()
    capacity = align_capacity(count, num_experts, block_m)
    kept = (ids >= 0) & (ids < num_experts)
    index = torch.arange(count, device=device)[kept]
    expert = ids[kept]
    order = torch.sort(expert * max(count, 1) + index).indices  # by expert, then index: distinct keys
    index, expert = index[order], expert[order]
    counts = torch.bincount(expert, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    firsts = torch.cumsum(counts, 0) - counts  # each expert's first place among the kept ids
    places = starts[expert] + torch.arange(index.numel(), device=device) - firsts[expert]
    sorted_ids = torch.full((capacity,), count, dtype=torch.int32, device=device)
    sorted_ids[places] = index.to(torch.int32)
    total = int(padded.sum())
    expert_of_block = torch.full((capacity // block_m,), -1, dtype=torch.int32, device=device)
    expert_of_block[: total // block_m] = torch.repeat_interleave(
        torch.arange(num_experts, device=device, dtype=torch.int32), padded // block_m
    )
    padded_count = torch.tensor([total], dtype=torch.int32, device=device)
    return sorted_ids, expert_of_block, padded_count


# --- the experts ----------------------------------------------------------------------------------------------------


def _activation(who: str, activation):
    import torch

    if activation not in ACTIVATIONS:
        raise ValueError(f"{who}: activation: expected one of {ACTIVATIONS}, got {activation!r}")
    return torch.nn.functional.silu


def _check_experts(who: str, x, w1, w2, topk_weights, topk_ids):
    """``(T, H, E, I, k)`` of the MoE operands' shapes, checked."""
    if x.dim() != 2:
        raise ValueError(f"{who}: x: expected a 2-D tensor (T, H), got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    if w1.dim() != 3 or w1.shape[1] % 2 or w1.shape[2] != hidden:
        raise ValueError(f"{who}: w1: expected (E, 2I, H) with H = {hidden}, got shape {tuple(w1.shape)}")
    experts, inter = w1.shape[0], w1.shape[1] // 2
    if tuple(w2.shape) != (experts, hidden, inter):
        raise ValueError(f"{who}: w2: expected (E, H, I) = {(experts, hidden, inter)}, got shape {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(f"{who}: topk_ids: expected (T, k) with T = {tokens}, got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"{who}: topk_weights: expected topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}"
        )
    return tokens, hidden, experts, inter, topk_ids.shape[1]


def fused_moe_reference(x, w1, w2, topk_weights, topk_ids, *, activation: str = "silu"):
    """float32 ``(T, H)``: the fused MoE layer by its definition, ``out[t] = sum_s topk_weights[t, s] *
    (w2[e] @ (act(w1[e][:I] @ x[t]) * (w1[e][I:] @ x[t])))`` with ``e = topk_ids[t, s]``, over the slots whose id
    is in ``[0, E)`` (the others are dropped: expert parallelism's convention). ``x`` (T, H); ``w1`` (E, 2I, H),
    gate rows ``[0, I)`` then up rows ``[I, 2I)`` (``nn.Linear``'s orientation); ``w2`` (E, H, I);
    ``topk_weights`` (T, k); ``topk_ids`` (T, k) int. Float32 throughout, one expert at a time."""
    import torch

    who = "flydsl.kernels.moe.reference.fused_moe_reference"
    act = _activation(who, activation)
    tokens, hidden, experts, inter, _ = _check_experts(who, x, w1, w2, topk_weights, topk_ids)
    x, weights, ids = x.float(), topk_weights.float(), topk_ids.long()
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    for e in range(experts):
        rows, slots = (ids == e).nonzero(as_tuple=True)  # a token routed to e twice counts twice
        if rows.numel() == 0:
            continue
        gate_up = x.index_select(0, rows) @ w1[e].float().t()
        h = act(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, rows, (h @ w2[e].float().t()) * weights[rows, slots, None])
    return out


def dequantize_experts(w, scale, granularity: str):
    """float32 ``(E, N, K)``: fp8 experts' weights ``w`` times their float32 ``scale`` (``fused_moe``'s
    ``granularity``): "tensor" (E,) one per expert, "channel" (E, N) one per expert and output row, "block" (E,
    ceil(N / 128), ceil(K / 128)) one per expert and 128 x 128 block (partial blocks at the edges)."""
    experts, rows, cols = w.shape
    w = w.float()
    if granularity == "tensor":
        return w * scale.float().view(experts, 1, 1)
    if granularity == "channel":
        return w * scale.float().view(experts, rows, 1)
    if granularity == "block":
        block = 128
        full = scale.float().repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)
        return w * full[:, :rows, :cols]
    raise ValueError(f"dequantize_experts: granularity: expected 'tensor', 'channel' or 'block', got {granularity!r}")


def inverse_positions(sorted_ids, count: int):
    """int64 ``(count,)``: the position in ``sorted_ids`` (:func:`align_tokens_reference`'s) of each flat index
    ``t * k + s`` below ``count`` (T * k), -1 for the indices not placed (dropped ids). The combine reads each
    token's rows through it; the sentinel ``count`` marks padding and is not an index."""
    import torch

    flat = sorted_ids.long()
    placed = (flat >= 0) & (flat < count)
    inverse = torch.full((count,), -1, dtype=torch.int64, device=sorted_ids.device)
    inverse[flat[placed]] = torch.arange(flat.numel(), device=sorted_ids.device)[placed]
    return inverse


def staged_moe_reference(x, w1, w2, topk_weights, topk_ids, *, block_m: int = 64, activation: str = "silu"):
    """float32 ``(T, H)``: :func:`fused_moe_reference`'s result computed the way the two-stage kernels compute it:
    :func:`align_tokens_reference` in blocks of ``block_m``; A ``(capacity, H)`` the rows of ``x`` gathered by
    ``sorted_ids // k`` (a zero row for the sentinel); for each block below ``padded_count``, with ``e`` its expert,
    ``h = act(A_j @ w1[e][:I].T) * (A_j @ w1[e][I:].T)`` (stage 1) and ``y_j = h @ w2[e].T`` (stage 2), rows in sorted
    order; then the combine, each token's valid slots in order 0..k-1: ``out[t] = sum_s topk_weights[t, s] *
    y[inverse[t * k + s]]`` (:func:`inverse_positions`). Float32 throughout."""
    import torch

    who = "flydsl.kernels.moe.reference.staged_moe_reference"
    act = _activation(who, activation)
    tokens, hidden, experts, inter, k = _check_experts(who, x, w1, w2, topk_weights, topk_ids)
    sorted_ids, expert_of_block, padded_count = align_tokens_reference(topk_ids, experts, block_m)
    count = tokens * k
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    if count == 0:
        return out
    # the sentinel T * k gathers row T: the zero row appended
    padded_x = torch.cat([x.float(), x.new_zeros(1, hidden, dtype=torch.float32)])
    a = padded_x.index_select(0, sorted_ids.long() // k)
    y = torch.zeros(sorted_ids.numel(), hidden, dtype=torch.float32, device=x.device)
    for j in range(int(padded_count[0]) // block_m):
        e = int(expert_of_block[j])
        rows = slice(j * block_m, (j + 1) * block_m)
        gate_up = a[rows] @ w1[e].float().t()
        y[rows] = (act(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].float().t()
    inverse = inverse_positions(sorted_ids, count).view(tokens, k)
    weights = topk_weights.float()
    for s in range(k):  # slot order: the combine kernel's, deterministic
        placed = inverse[:, s] >= 0
        rows = y.index_select(0, inverse[:, s].clamp(min=0)) * weights[:, s, None]
        out += torch.where(placed[:, None], rows, torch.zeros_like(rows))
    return out
