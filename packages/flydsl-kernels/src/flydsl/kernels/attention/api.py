"""``paged_decode``: attention of a decode step over a paged KV cache (vLLM's and FlashInfer's layout), bf16/fp16 or
fp8 (e4m3) caches, validated before anything is launched, without host synchronisation (CUDA-graph capturable).

    from flydsl.kernels.attention import paged_decode, write_kv
    write_kv(k, v, k_cache, v_cache, slot_mapping)                     # the new tokens' keys and values
    out = paged_decode(q, k_cache, v_cache, block_tables, context_lens)  # q (B, Hq, D) -> out (B, Hq, D)

The kernels and their layout of the work: :mod:`flydsl.kernels.attention.decode`; the picture: docs/attention.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from flydsl.kernels import validation as check
from flydsl.kernels.memory import per_stream
from flydsl.kernels.plans import Plans, signature
from flydsl.kernels.validation import TensorInfo

__all__ = ["paged_decode", "decode_plan_config"]

_WHO = "flydsl.kernels.attention.paged_decode"
_PLANS = Plans(_WHO)
_Q_DTYPES = ("bf16", "f16")
_HEAD_DIMS = (64, 128, 256)
_MAX_QUERIES = 4
_CHUNK = 16
_MAX_SPLITS = 256  # two levels of merging, at most MERGE_FANIN (16) partials per merging CTA and row
# CTAs of 4 warps an SM holds (registers capped to fit: 128 per thread at 4), by (D, fp8 cache)
_CTAS_PER_SM = {(64, False): 4, (64, True): 4, (128, False): 2, (128, True): 4, (256, False): 2, (256, True): 2}


@functools.cache
def _decode():
    from flydsl.kernels.attention import decode

    return decode


def paged_decode(
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
    out=None,
    max_context=None,
):
    """Attention of ``q`` over each sequence's cached keys and values.

    * ``q``: (B, Hq, D) or (B, Q, Hq, D) bf16/fp16 with Q = 1..4 query tokens per sequence (speculative decoding: query
      ``i`` sits at position ``context_len - Q + i`` and sees the keys up to its own position); D 64, 128 or 256.
    * ``k_cache``, ``v_cache``: (num_blocks, block_size, Hkv, D), q's dtype or ``torch.float8_e4m3fn``, unit stride on
      D; ``block_size`` a multiple of 16; Hq a multiple of Hkv (grouped-query attention: head h reads KV head
      ``h // (Hq / Hkv)``).
    * fp8 caches take ``k_scale`` and ``v_scale`` (the cache holds ``value / scale``): a float or a one-element
      float32 tensor (per tensor), or a float32 (num_blocks, block_size, Hkv) tensor (per token and head).
    * ``block_tables`` int32 (B, max_blocks): the cache blocks of each sequence in order; ``context_lens`` int32 (B,):
      its cached tokens (at least Q), the new ones included.
    * ``scale``: multiplies ``q . k`` (default ``1 / sqrt(D)``); ``soft_cap`` c > 0: logits ``c * tanh(logit / c)``;
      ``sliding_window`` W >= 1: each query sees its last W positions (itself included).
    * ``max_context``: the longest context a call will see (default: the block table's capacity, ``max_blocks *
      block_size``). The grid is sized from it, never from ``context_lens``' values, so the call can be captured in a
      CUDA graph and replayed with other context lengths up to it; a tighter bound splits long contexts better.

    Returns ``out`` (q's shape and dtype; written in place when given)."""
    key = signature(
        q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, out,
        max_context,
    )  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.add(
            key,
            _make_plan(
                q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap,
                out, max_context,
            ),
        )  # fmt: skip
    return plan(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, out)


def _scale_kind(name: str, scale, cache: TensorInfo, fp8: bool, device: int):
    """``None``, ``"tensor"`` or ``"token"`` for a cache's scale argument, checked."""
    if not fp8:
        if scale is not None:
            raise ValueError(f"{_WHO}: {name}: scales apply to fp8 caches only; this cache is {cache.dtype}")
        return None
    if scale is None:
        raise ValueError(f"{_WHO}: {name}: an fp8 cache needs its scale (a float, or a float32 tensor)")
    if isinstance(scale, (int, float)):
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"{_WHO}: {name}: expected a positive finite scale, got {scale}")
        return "tensor"
    info = check.describe(_WHO, name, scale)
    check.check_dtype(_WHO, name, info.dtype, ("f32",))
    check.same_device(_WHO, cache, (name, info))
    blocks, block_size, heads = cache.shape[:3]
    if math.prod(info.shape) == 1:
        return "tensor"
    if tuple(info.shape) != (blocks, block_size, heads):
        raise ValueError(
            f"{_WHO}: {name}: expected one float32 scale or one per token and head, shape {(blocks, block_size, heads)}"
            f" (the cache's first three dims), got {tuple(info.shape)}"
        )
    if info.strides[2] != 1 and heads > 1:
        raise ValueError(f"{_WHO}: {name}: expected unit stride on the head dim, got strides {tuple(info.strides)}")
    return "token"


def _make_plan(
    q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, out, max_context
):
    """Validates a call and returns the function that runs calls like it (:mod:`flydsl.kernels.plans`)."""
    q_t = check.describe(_WHO, "q", q)
    if len(q_t.shape) not in (3, 4):
        raise ValueError(f"{_WHO}: q: expected (B, Hq, D) or (B, Q, Hq, D), got shape {tuple(q_t.shape)}")
    check.check_dtype(_WHO, "q", q_t.dtype, _Q_DTYPES)
    batch, heads, dim = q_t.shape[0], q_t.shape[-2], q_t.shape[-1]
    queries = q_t.shape[1] if len(q_t.shape) == 4 else 1
    if dim not in _HEAD_DIMS:
        raise ValueError(f"{_WHO}: q: expected a head dim D of 64, 128 or 256, got {dim}")
    if not 1 <= queries <= _MAX_QUERIES:
        raise ValueError(f"{_WHO}: q: expected 1..{_MAX_QUERIES} query tokens per sequence, got {queries}")
    if q_t.strides[-1] != 1 or any(s % 4 for s in q_t.strides[:-1]) or q_t.pointer % 8:
        raise ValueError(
            f"{_WHO}: q: expected unit stride on D, other strides multiples of 4 elements and an 8-byte aligned"
            f" address (8-byte loads), got strides {tuple(q_t.strides)}"
        )
    caches = []
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        c = check.describe(_WHO, name, cache)
        check.same_device(_WHO, q_t, (name, c))
        if len(c.shape) != 4 or c.shape[3] != dim:
            raise ValueError(
                f"{_WHO}: {name}: expected (num_blocks, block_size, Hkv, D) with q's D {dim}, got {tuple(c.shape)}"
            )
        check.check_dtype(_WHO, name, c.dtype, (q_t.dtype, "f8E4M3FN"), like="q")
        width = check.element_bytes(c.dtype)
        if c.strides[3] != 1 or any(s * width % 16 for s in c.strides[:3]) or c.pointer % 16:
            raise ValueError(
                f"{_WHO}: {name}: expected unit stride on D, other strides multiples of 16 bytes and a 16-byte aligned"
                f" address (16-byte loads), got strides {tuple(c.strides)}"
            )
        caches.append(c)
    k_t, v_t = caches
    if tuple(k_t.shape) != tuple(v_t.shape) or k_t.dtype != v_t.dtype:
        raise ValueError(
            f"{_WHO}: v_cache: expected k_cache's shape {tuple(k_t.shape)} and dtype {k_t.dtype}, got"
            f" {tuple(v_t.shape)} {v_t.dtype}"
        )
    blocks, block_size, kv_heads = k_t.shape[:3]
    if block_size % _CHUNK or block_size == 0:
        raise ValueError(f"{_WHO}: k_cache: expected a block_size that is a multiple of 16, got {block_size}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"{_WHO}: q: expected a head count Hq that is a multiple of the caches' Hkv {kv_heads}, got {heads}"
        )
    tables = check.describe(_WHO, "block_tables", block_tables)
    lens = check.describe(_WHO, "context_lens", context_lens)
    check.same_device(_WHO, q_t, ("block_tables", tables), ("context_lens", lens))
    check.check_dtype(_WHO, "block_tables", tables.dtype, ("int32",))
    check.check_dtype(_WHO, "context_lens", lens.dtype, ("int32",))
    if len(tables.shape) != 2 or tables.shape[0] != batch or tables.strides[1] != 1:
        raise ValueError(
            f"{_WHO}: block_tables: expected (B, max_blocks) int32 with B = {batch} and unit stride on its last dim,"
            f" got shape {tuple(tables.shape)}"
        )
    if tuple(lens.shape) != (batch,):
        raise ValueError(f"{_WHO}: context_lens: expected shape ({batch},), got {tuple(lens.shape)}")
    fp8 = k_t.dtype == "f8E4M3FN"
    k_kind = _scale_kind("k_scale", k_scale, k_t, fp8, q_t.device)
    v_kind = _scale_kind("v_scale", v_scale, v_t, fp8, q_t.device)
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{_WHO}: scale: expected a finite float, got {scale!r}")
    if soft_cap is not None and (not isinstance(soft_cap, (int, float)) or not soft_cap > 0 or math.isinf(soft_cap)):
        raise ValueError(f"{_WHO}: soft_cap: expected a positive finite float or None, got {soft_cap!r}")
    if sliding_window is not None and (type(sliding_window) is not int or sliding_window < 1):
        raise ValueError(f"{_WHO}: sliding_window: expected an int >= 1 or None, got {sliding_window!r}")
    capacity = tables.shape[1] * block_size
    if max_context is None:
        max_context = capacity
    if type(max_context) is not int or max_context < 1:
        raise ValueError(f"{_WHO}: max_context: expected an int >= 1, got {max_context!r}")
    if out is not None:
        o = check.describe(_WHO, "out", out)
        check.same_device(_WHO, q_t, ("out", o))
        check.check_like(_WHO, "out", o.shape, o.dtype, q_t.shape, q_t.dtype, "q")
        if o.strides[-1] != 1 or any(s % 8 for s in o.strides[:-1]) or o.pointer % 16:
            raise ValueError(
                f"{_WHO}: out: expected unit stride on D, other strides multiples of 8 elements and a 16-byte aligned"
                f" address (16-byte stores), got strides {tuple(o.strides)}"
            )
    cfg, splits, split_tokens = decode_plan_config(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        queries=queries,
        q_dtype=q_t.dtype,
        kv_dtype="e4m3" if fp8 else k_t.dtype,
        k_scale=k_kind,
        v_scale=v_kind,
        sliding_window=sliding_window,
        soft_cap=soft_cap is not None,
        max_context=max_context,
        sms=_sm_count(q_t.device),
    )
    return _Plan(
        cfg, splits, split_tokens, float(scale), float(soft_cap or 0.0), sliding_window or 0, fp8, q_t.device,
        k_scale if k_kind == "tensor" and isinstance(k_scale, (int, float)) else None,
        v_scale if v_kind == "tensor" and isinstance(v_scale, (int, float)) else None,
    )  # fmt: skip


def _sm_count(device: int) -> int:
    from flydsl.kernels.device import sm_count

    return sm_count(device)


def decode_plan_config(
    *, batch, heads, kv_heads, dim, queries, q_dtype, kv_dtype, k_scale, v_scale, sliding_window, soft_cap,
    max_context, sms, warps=4, prefetch=None, ctas_per_sm=None, ctas=None,
):  # fmt: skip
    """``(DecodeConfig, splits, split_tokens)`` for a call: the context (or the window's span) cut into splits so
    that the grid fills the GPU's resident CTAs once (``ctas``; default ``sms`` times the CTAs an SM holds,
    ``ctas_per_sm``), each warp at least one chunk of 16 tokens, at most 256 splits; with more than one split, the
    last to finish merges them (in two levels past ``MERGE_FANIN``: docs/tuning/attention.md#merge)."""
    decode = _decode()
    group = heads // kv_heads
    span = max_context if sliding_window is None else min(max_context, sliding_window + queries - 1 + _CHUNK)
    chunks = -(-span // _CHUNK)
    if prefetch is None:
        prefetch = 0 if dim == 256 else 1  # two chunks of D = 256 spill
    if ctas_per_sm is None:
        ctas_per_sm = _CTAS_PER_SM.get((dim, kv_dtype == "e4m3"), 2)
    cfg = decode.DecodeConfig(
        head_dim=dim, kv=kv_dtype, q=q_dtype, group=group, queries=queries, k_scale=k_scale, v_scale=v_scale,
        window=sliding_window is not None, soft_cap=soft_cap, warps=warps, prefetch=prefetch, ctas_per_sm=ctas_per_sm,
    )  # fmt: skip
    base = batch * kv_heads * cfg.row_tiles
    if ctas is None:
        ctas = sms * cfg.ctas_per_sm
    splits = max(1, min(-(-chunks // warps), round(ctas / base), _MAX_SPLITS))
    split_tokens = -(-chunks // splits) * _CHUNK
    splits = -(-span // split_tokens)
    levels = 2 if splits > decode.MERGE_FANIN else 1
    return dataclasses.replace(cfg, split=splits > 1, merge_levels=levels), splits, split_tokens


_COUNTERS: dict = {}  # (device, stream) -> int32 zeros: the splits' arrival counters (each launch leaves them zero)


def _counters_of(words: int, device):
    """How :func:`~flydsl.kernels.memory.per_stream` makes a stream's counters: zeros, at least ``words``."""

    def make(held):
        import torch

        return torch.zeros(max(words, 1024), dtype=torch.int32, device=device)

    return make


class _Plan:
    """A validated call's launch: the decode kernel (its splits merged by the last one of each KV head)."""

    def __init__(self, cfg, splits, split_tokens, scale, soft_cap, window, fp8, device, k_value, v_value):
        import torch

        self.cfg, self.splits, self.split_tokens = cfg, splits, split_tokens
        self.groups = -(-splits // _decode().MERGE_FANIN) if cfg.merge_levels == 2 else 0
        self.scale, self.soft_cap, self.window, self.fp8 = scale, soft_cap, window, fp8
        where = torch.device("cuda", device)
        self.unused = torch.zeros(1, dtype=torch.float32, device=where)  # stands for absent scales and partials
        self.k_value = None if k_value is None else torch.full((1,), float(k_value), device=where)
        self.v_value = None if v_value is None else torch.full((1,), float(v_value), device=where)

    def __call__(self, q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, out):
        import torch

        decode, cfg = _decode(), self.cfg
        if out is None:
            out = torch.empty_like(q)
        q4 = q if q.dim() == 4 else q.unsqueeze(1)
        out4 = out if out.dim() == 4 else out.unsqueeze(1)
        if self.fp8:
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_scales = self.k_value if self.k_value is not None else (self.unused if k_scale is None else k_scale)
        v_scales = self.v_value if self.v_value is not None else (self.unused if v_scale is None else v_scale)
        if cfg.k_scale == "tensor":
            k_scales = k_scales.reshape(1)
        if cfg.v_scale == "tensor":
            v_scales = v_scales.reshape(1)
        batch, queries, heads, dim = q4.shape
        if cfg.split:
            slots = self.splits + self.groups  # the splits', then (two levels) the groups' merges
            partial_out = torch.empty(batch, queries, heads, slots, dim, dtype=torch.float32, device=q.device)
            partial_stats = torch.empty(batch, queries, heads, slots, 2, dtype=torch.float32, device=q.device)
        else:
            partial_out = partial_stats = self.unused.view(1, 1, 1, 1, 1)
        kv_heads = k_cache.shape[2]
        words = batch * kv_heads * cfg.row_tiles * (1 + self.groups)  # a counter per unit, and per unit and group
        counters = per_stream(_COUNTERS, q, _counters_of(words, q.device), fits=lambda held: held.numel() >= words)
        decode.paged_decode_kernel(
            q4, k_cache, v_cache, block_tables, context_lens, k_scales, v_scales, out4, partial_out, partial_stats,
            counters, self.scale, self.soft_cap, self.window, self.split_tokens, cfg,
        ).launch(grid=(self.splits, kv_heads * cfg.row_tiles, batch), block=cfg.threads)  # fmt: skip
        return out
