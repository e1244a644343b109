"""Float32 torch references of paged attention, for tests and benchmarks: :func:`gather_kv` reads one sequence's keys
and values out of a paged cache (dequantized where scales are given), :func:`paged_decode_reference` attends to them
one sequence at a time. Plain torch on any device, written for clarity, not speed.

    out = paged_decode_reference(q, k_cache, v_cache, block_tables, context_lens)   # q (B, Hq, D) or (B, Q, Hq, D)

The cache layout is :func:`flydsl.kernels.attention.cache.write_kv`'s: (num_blocks, block_size, Hkv, D), position p
of sequence b at block ``block_tables[b, p // block_size]``, row ``p % block_size``.
"""

from __future__ import annotations

import math

__all__ = ["gather_kv", "paged_decode_reference"]

_WHO = "flydsl.kernels.attention.paged_decode_reference"


def _dequantize(values, scale, blocks, rows):
    """``values`` (ctx, Hkv, D) float32 times its scale: none, one (a number or a one-element tensor), or one per
    (token, head) from a (num_blocks, block_size, Hkv) tensor at the same blocks and rows."""
    if scale is None:
        return values
    if isinstance(scale, (int, float)):
        return values * float(scale)
    scale = scale.to(device=values.device, dtype=values.dtype)
    if scale.dim() == 3:
        return values * scale[blocks, rows][..., None]
    return values * scale.reshape(())


def gather_kv(k_cache, v_cache, block_tables, context_lens, b: int, *, k_scale=None, v_scale=None):
    """Sequence ``b``'s keys and values, ``(ctx, Hkv, D)`` float32 each (ctx = ``context_lens[b]``), in position order:
    position p from block ``block_tables[b, p // block_size]``, row ``p % block_size``; fp8 caches dequantized with
    ``k_scale`` / ``v_scale`` (per tensor: a float or a one-element tensor; per (token, head): (num_blocks, block_size,
    Hkv) float32)."""
    import torch

    ctx = int(context_lens[b])
    block_size = k_cache.shape[1]
    positions = torch.arange(ctx, device=k_cache.device)
    blocks = block_tables[b].to(k_cache.device).long()[positions // block_size]
    rows = positions % block_size
    k = _dequantize(_rows(k_cache, blocks, rows), k_scale, blocks, rows)
    v = _dequantize(_rows(v_cache, blocks, rows), v_scale, blocks, rows)
    return k, v


def _rows(cache, blocks, rows):
    """``cache[blocks, rows]`` as float32, gathered as bytes (indexing fp8 tensors is not on every device)."""
    import torch

    return cache.view(torch.uint8)[blocks, rows].view(cache.dtype).float()


def paged_decode_reference(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    *,
    scale=None,
    k_scale=None,
    v_scale=None,
    sliding_window=None,
    soft_cap=None,
):
    """Attention of ``q`` over a paged KV cache, float32, of q's shape. ``q``: (B, Hq, D) (one query per sequence) or
    (B, Q, Hq, D): the sequence's last Q positions, query i at position ``p = ctx - Q + i`` seeing keys at positions
    ``<= p`` (and with ``sliding_window`` W only those ``> p - W``: the last W keys, its own included). Caches
    (num_blocks, block_size, Hkv, D) bf16/fp16/float8_e4m3fn; ``block_tables`` (B, max_blocks) and ``context_lens``
    (B,) (each >= Q) int32; Hq a multiple of Hkv (query head h reads kv head ``h // (Hq // Hkv)``). Logits are
    ``q . k * scale`` (default ``1 / sqrt(D)``), then ``soft_cap * tanh(logits / soft_cap)`` with ``soft_cap``;
    fp8 caches are dequantized as :func:`gather_kv` does."""
    import torch

    single = q.dim() == 3
    queries = q[:, None] if single else q
    if queries.dim() != 4:
        raise ValueError(f"{_WHO}: q: expected (B, Hq, D) or (B, Q, Hq, D), got shape {tuple(q.shape)}")
    batch, count, q_heads, dim = queries.shape
    kv_heads = k_cache.shape[2]
    if q_heads % kv_heads or tuple(k_cache.shape[3:]) != (dim,):
        raise ValueError(
            f"{_WHO}: k_cache: expected (num_blocks, block_size, Hkv, {dim}) with Hkv dividing Hq = {q_heads}, got"
            f" shape {tuple(k_cache.shape)}"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{_WHO}: sliding_window: expected a positive number of keys, got {sliding_window!r}")
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    out = torch.zeros(queries.shape, dtype=torch.float32, device=q.device)
    for b in range(batch):
        ctx = int(context_lens[b])
        if ctx < count:
            raise ValueError(f"{_WHO}: context_lens: sequence {b} has {ctx} positions, fewer than Q = {count} queries")
        k, v = gather_kv(k_cache, v_cache, block_tables, context_lens, b, k_scale=k_scale, v_scale=v_scale)
        k = k.to(q.device).repeat_interleave(q_heads // kv_heads, dim=1)  # (ctx, Hq, D)
        v = v.to(q.device).repeat_interleave(q_heads // kv_heads, dim=1)
        logits = torch.einsum("qhd,khd->hqk", queries[b].float(), k) * scale
        if soft_cap is not None:
            logits = soft_cap * torch.tanh(logits / soft_cap)
        position = torch.arange(ctx - count, ctx, device=q.device)[:, None]  # each query's own
        key = torch.arange(ctx, device=q.device)[None, :]
        seen = key <= position
        if sliding_window is not None:
            seen &= key > position - sliding_window
        probabilities = torch.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1)
        out[b] = torch.einsum("hqk,khd->qhd", probabilities, v)
    return out[:, 0] if single else out
