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
from flydsl.kernels.attention import checks
from flydsl.kernels.memory import held, torch_empty_like, torch_new_empty
from flydsl.kernels.plans import Plans, ScratchPlan, signature

__all__ = ["paged_decode", "decode_plan_config"]

_WHO = "flydsl.kernels.attention.paged_decode"
_PLANS = Plans(_WHO, replay=True)
_CHUNK = 16
_MERGE = None  # who merges the splits: None by their count; "kernel" or "last" for every count (A/B timing, tests)
_PREFETCH = None  # chunks a warp loads ahead: None by D (0 for D 256, else 1); 0..2 for every plan (A/B timing, tests)
_MAX_SPLITS = 256
# The least cache bytes (K and V of one KV head) a split reads: fewer, larger splits where filling every resident CTA
# would leave each warp a chunk or two (docs/tuning/attention.md#splits). 0: no floor (32 and 64 KB timed 0.78-1.02x
# of none on the H200 at 690a143).
_MIN_SPLIT_BYTES = 0
# CTAs of 4 warps an SM holds per (D, fp8 cache, at most 8 query rows): as many as fit their registers without spills
# (registers capped to fit: 128 per thread at 4; docs/tuning/attention.md#occupancy); more than 8 rows take twice the
# accumulators.
_CTAS_PER_SM = {(64, False, True): 4, (64, True, True): 4, (64, False, False): 2, (64, True, False): 2,
                (128, False, True): 2, (128, True, True): 4, (128, False, False): 2, (128, True, False): 2}  # fmt: skip


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
    result = plan(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, out)
    return out if out is not None else result[0]


def _make_plan(
    q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, out, max_context
):
    """Validates a call and returns the function that runs calls like it (:mod:`flydsl.kernels.plans`): the tensors'
    devices, strides and addresses here, their shapes and dtypes in :func:`~.checks.check_paged_decode` (shared with
    the torch op's fake implementation)."""
    q_t, k_t, v_t, tables, lens = (
        check.describe(_WHO, name, t)
        for name, t in (
            ("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
            ("context_lens", context_lens),
        )
    )  # fmt: skip
    check.same_device(_WHO, q_t, ("k_cache", k_t), ("v_cache", v_t), ("block_tables", tables), ("context_lens", lens))
    named_scales = (("k_scale", k_scale), ("v_scale", v_scale))
    scales = [s if s is None or isinstance(s, (int, float)) else check.describe(_WHO, n, s) for n, s in named_scales]
    tensors = [(n, s) for (n, _), s in zip(named_scales, scales, strict=True) if not isinstance(s, (int, float))]
    check.same_device(_WHO, q_t, *tensors)  # (None: absent, skipped)
    shape = checks.check_paged_decode(
        _WHO, q_t, k_t, v_t, tables, lens, scale, *scales, sliding_window, soft_cap, max_context
    )
    if q_t.strides[-1] != 1 or any(s % 4 for s in q_t.strides[:-1]) or q_t.pointer % 8:
        raise ValueError(
            f"{_WHO}: q: expected unit stride on D, other strides multiples of 4 elements and an 8-byte aligned"
            f" address (8-byte loads), got strides {tuple(q_t.strides)}"
        )
    for name, c in (("k_cache", k_t), ("v_cache", v_t)):
        width = check.element_bytes(c.dtype)
        if c.strides[3] != 1 or any(s * width % 16 for s in c.strides[:3]) or c.pointer % 16:
            raise ValueError(
                f"{_WHO}: {name}: expected unit stride on D, other strides multiples of 16 bytes and a 16-byte aligned"
                f" address (16-byte loads), got strides {tuple(c.strides)}"
            )
    if tables.strides[1] != 1:
        raise ValueError(f"{_WHO}: block_tables: expected unit stride on its last dim, got {tuple(tables.strides)}")
    for name, info, kind in zip(("k_scale", "v_scale"), scales, (shape.k_scale, shape.v_scale), strict=True):
        if kind == "token" and info.strides[2] != 1 and shape.kv_heads > 1:
            raise ValueError(f"{_WHO}: {name}: expected unit stride on the head dim, got strides {tuple(info.strides)}")
    if max_context is None:
        max_context = tables.shape[1] * shape.block_size  # the table's capacity
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
        batch=shape.batch,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        dim=shape.dim,
        queries=shape.queries,
        q_dtype=q_t.dtype,
        kv_dtype="e4m3" if shape.fp8 else k_t.dtype,
        k_scale=shape.k_scale,
        v_scale=shape.v_scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap is not None,
        max_context=max_context,
        sms=_sm_count(q_t.device),
        block_size=shape.block_size,
    )
    numbers = [s if isinstance(s, (int, float)) else None for s in (k_scale, v_scale)]  # per-tensor scales as floats
    scale = 1.0 / math.sqrt(shape.dim) if scale is None else float(scale)
    plan = _Plan(
        cfg, splits, split_tokens, scale, float(soft_cap or 0.0), sliding_window or 0, shape.fp8, q_t.device, *numbers
    )
    plan.given = (
        out is not None,
        k_scale is not None and numbers[0] is None,
        v_scale is not None and numbers[1] is None,
    )
    words = shape.batch * shape.kv_heads * cfg.row_tiles
    return ScratchPlan(plan.scratch, plan.launch, plan.made(q, words, numbers))


def _sm_count(device: int) -> int:
    from flydsl.kernels.device import sm_count

    return sm_count(device)


def decode_plan_config(
    *, batch, heads, kv_heads, dim, queries, q_dtype, kv_dtype, k_scale, v_scale, sliding_window, soft_cap,
    max_context, sms, warps=4, prefetch=None, ctas_per_sm=None, ctas=None, merge=None, block_size=16,
    min_split_bytes=None,
):  # fmt: skip
    """``(DecodeConfig, splits, split_tokens)`` for a call: the context (or the window's span) cut into splits so
    that the grid fills the GPU's resident CTAs once (``ctas``; default ``sms`` times the CTAs an SM holds,
    ``ctas_per_sm``), each warp at least one chunk of 16 tokens, each split at least ``min_split_bytes`` of K and V
    (default ``_MIN_SPLIT_BYTES``), at most 256 splits; with more than one split, the
    last to finish merges them, or past ``MERGE_FANIN`` splits a dependent merge kernel (``merge``: that choice,
    ``"last"`` or ``"kernel"``, for any count; docs/tuning/attention.md#merge)."""
    decode = _decode()
    group = heads // kv_heads
    span = max_context if sliding_window is None else min(max_context, sliding_window + queries - 1 + _CHUNK)
    chunks = -(-span // _CHUNK)
    if prefetch is None:
        prefetch = _PREFETCH if _PREFETCH is not None else 0 if dim == 256 else 1  # two chunks of D = 256 spill
    if ctas_per_sm is None:
        ctas_per_sm = _CTAS_PER_SM.get((dim, kv_dtype == "e4m3", group * queries <= 8), 2)
    cfg = decode.DecodeConfig(
        head_dim=dim, kv=kv_dtype, q=q_dtype, group=group, queries=queries, k_scale=k_scale, v_scale=v_scale,
        window=sliding_window is not None, soft_cap=soft_cap, warps=warps, prefetch=prefetch, ctas_per_sm=ctas_per_sm,
        block_size=block_size,
    )  # fmt: skip
    base = batch * kv_heads * cfg.row_tiles
    if ctas is None:
        ctas = sms * cfg.ctas_per_sm
    if min_split_bytes is None:
        min_split_bytes = _MIN_SPLIT_BYTES
    token_bytes = 2 * dim * (1 if kv_dtype == "e4m3" else 2) + 4 * ((k_scale == "token") + (v_scale == "token"))
    least = chunks // max(1, -(-min_split_bytes // (_CHUNK * token_bytes)))  # splits holding the floor's chunks
    splits = max(1, min(-(-chunks // warps), round(ctas / base), _MAX_SPLITS, least))
    split_tokens = -(-chunks // splits) * _CHUNK
    splits = -(-span // split_tokens)
    merge = merge or _MERGE or ("kernel" if splits > decode.MERGE_FANIN else "last")
    return dataclasses.replace(cfg, split=splits > 1, merge=merge), splits, split_tokens


_COUNTER_WORDS = 1024  # the merge counters held per stream: at least this many (grown for larger batches)


class _Plan:
    """A validated call's launch: the decode kernel, its splits merged by the last one of each KV head or by the
    merge kernel after it."""

    def __init__(self, cfg, splits, split_tokens, scale, soft_cap, window, fp8, device, k_value, v_value):
        import torch

        self.cfg, self.splits, self.split_tokens = cfg, splits, split_tokens
        self.merge_warps = _decode().merge_warps(cfg.head_dim, splits)  # the merge kernel's CTA, if it runs
        self.scale, self.soft_cap, self.window, self.fp8 = scale, soft_cap, window, fp8
        where = torch.device("cuda", device)
        self.unused = torch.zeros(1, dtype=torch.float32, device=where)  # stands for absent scales and partials
        self.k_value = None if k_value is None else torch.full((1,), float(k_value), device=where)
        self.v_value = None if v_value is None else torch.full((1,), float(v_value), device=where)
        self.given = (False, False, False)  # out, k_scale, v_scale given as tensors: arguments, not scratch

    def scratch(self, q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, out) -> tuple:
        """A call's memory: the output (allocated where not given), the splits' partials (``unused`` without
        splits), the merge counters of the stream, the scales the kernel reads where not given as tensors (kept per
        number, or ``unused``)."""
        import torch

        cfg = self.cfg
        batch, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
        queries = 1 if q.dim() == 3 else q.shape[1]
        if cfg.split:
            partial_out = torch_new_empty(q, (batch, queries, heads, self.splits, dim), torch.float32)
            partial_stats = torch_new_empty(q, (batch, queries, heads, self.splits, 2), torch.float32)
        else:
            partial_out = partial_stats = self.unused
        kv_heads = k_cache.shape[2]
        words = batch * kv_heads * cfg.row_tiles  # a counter per (sequence, KV head, row tile)
        counters = held(q, "paged_decode.counters", max(words, _COUNTER_WORDS), torch.int32)
        memory = [partial_out, partial_stats, counters]
        if out is None:
            memory.insert(0, torch_empty_like(q) if q.is_contiguous() else torch.empty_like(q))
        for value, given in ((self.k_value, self.given[1]), (self.v_value, self.given[2])):
            if not given:
                memory.append(self.unused if value is None else value)
        return tuple(memory)

    def made(self, q, words: int, numbers) -> tuple | None:
        """How a replay makes :meth:`scratch`'s memory itself (``ScratchPlan.made``): the output and the partials
        fresh, the counters and the stand-in for absent scales and partials held per stream (``unused``: never
        read); None where a scale is a number (a tensor this plan holds) or q is strided (the output keeps its
        strides)."""
        import torch

        if any(n is not None for n in numbers) or (not self.given[0] and not q.is_contiguous()):
            return None
        unused = (0, (1,), torch.float32, "paged_decode.unused")
        batch, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
        queries = 1 if q.dim() == 3 else q.shape[1]
        partials = (batch, queries, heads, self.splits)
        made = (
            [(0, (*partials, dim), torch.float32), (0, (*partials, 2), torch.float32)]
            if self.cfg.split
            else [unused] * 2
        )
        made.append((0, (max(words, _COUNTER_WORDS),), torch.int32, "paged_decode.counters"))
        if not self.given[0]:
            made.insert(0, (0, None, None))
        made += [unused for given in self.given[1:] if not given]
        return tuple(made)

    def launch(self, q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, given_out, *memory) -> None:
        """The decode kernel on a call's tensors and :meth:`scratch`'s memory."""
        import torch

        decode, cfg = _decode(), self.cfg
        memory = list(memory)
        out = given_out if self.given[0] else memory.pop(0)
        partial_out, partial_stats, counters, *scales = memory
        k_scales = k_scale if self.given[1] else scales.pop(0)
        v_scales = v_scale if self.given[2] else scales.pop(0)
        q4 = q if q.dim() == 4 else q.unsqueeze(1)
        out4 = out if out.dim() == 4 else out.unsqueeze(1)
        if self.fp8:
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        if cfg.k_scale == "tensor":
            k_scales = k_scales.reshape(1)
        if cfg.v_scale == "tensor":
            v_scales = v_scales.reshape(1)
        if not cfg.split:
            partial_out, partial_stats = partial_out.view(1, 1, 1, 1, 1), partial_stats.view(1, 1, 1, 1, 1)
        batch = q4.shape[0]
        kv_heads = k_cache.shape[2]
        decode.paged_decode_kernel(
            q4, k_cache, v_cache, block_tables, context_lens, k_scales, v_scales, out4, partial_out, partial_stats,
            counters, self.scale, self.soft_cap, self.window, self.split_tokens, cfg,
        ).launch(grid=(self.splits, kv_heads * cfg.row_tiles, batch), block=cfg.threads)  # fmt: skip
        if cfg.split and cfg.merge == "kernel":
            warps, tensor_scale = self.merge_warps, cfg.v_scale == "tensor"
            decode.merge_splits_kernel(
                partial_out, partial_stats, out4, v_scales, cfg.head_dim, warps, tensor_scale
            ).launch(grid=(out4.shape[0] * out4.shape[1] * out4.shape[2],), block=32 * warps)
