"""Float32 torch references of MoE routing, for tests and benchmarks: :func:`topk_route_reference` and
:func:`align_tokens_reference`, with the tie and ordering rules of :func:`flydsl.kernels.moe.topk_route` and
:func:`flydsl.kernels.moe.align_tokens`. Plain torch on any device, written for clarity, not speed.

Scores are ranked by :func:`order_keys`: an integer per float32 score whose order is the score's, every NaN above
+inf (``torch.topk``'s order) and -0 equal to +0; equal keys rank the lower expert (or group) first.
"""

from __future__ import annotations

__all__ = ["order_keys", "key_values", "topk_route_reference", "align_tokens_reference"]

LOWEST = -(1 << 31)  # below every score's key: experts of the groups not kept
_NAN_KEY = (1 << 31) - 1


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
