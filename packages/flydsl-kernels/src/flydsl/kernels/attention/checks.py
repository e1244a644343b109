"""``paged_decode``'s argument checks that need only shapes, dtypes and numbers: run by
:func:`flydsl.kernels.attention.paged_decode` on a call's tensors (after their device, strides and addresses are
read) and by ``torch.ops.flydsl.paged_decode``'s fake implementation, so that eager calls, fake tensors and compiled
graphs give the same errors. Tensors come as anything with ``shape`` and ``dtype`` in
:mod:`flydsl.kernels.validation`'s names (``"bf16"``): a ``TensorInfo``, or a :class:`Meta`. No compiler import.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from flydsl.kernels import validation as check

__all__ = [
    "BLOCK_MULTIPLE",
    "FP8_CACHE",
    "HEAD_DIMS",
    "MAX_QUERIES",
    "Q_DTYPES",
    "DecodeShape",
    "Meta",
    "check_paged_decode",
    "scale_kind",
]

Q_DTYPES = ("bf16", "f16")
HEAD_DIMS = (64, 128, 256)
MAX_QUERIES = 4
BLOCK_MULTIPLE = 16  # a cache block holds whole 16-token chunks
FP8_CACHE = "f8E4M3FN"


class Meta(NamedTuple):
    """A tensor's shape and dtype (our name), as the checks read it."""

    shape: tuple
    dtype: str


class DecodeShape(NamedTuple):
    """What the checks found: batch, query tokens per sequence, query heads, head dim, KV heads, block size, whether
    the caches are fp8, and each cache's scale kind (None, "tensor" or "token")."""

    batch: int
    queries: int
    heads: int
    dim: int
    kv_heads: int
    block_size: int
    fp8: bool
    k_scale: str | None
    v_scale: str | None


def scale_kind(who: str, name: str, scale, cache, fp8: bool):
    """A cache's scale argument checked (paged_decode's and write_kv's): None (16-bit caches), ``"tensor"`` (a
    positive finite number or a one-element float32 tensor) or ``"token"`` (a float32 (num_blocks, block_size, Hkv)
    tensor)."""
    per_token = tuple(cache.shape[:3])
    if not fp8:
        if scale is not None:
            raise ValueError(
                f"{who}: {name}: scales apply to fp8 caches only; this cache is {check.dtype_names((cache.dtype,))}:"
                " pass None"
            )
        return None
    if scale is None:
        raise ValueError(
            f"{who}: {name}: an fp8 cache needs its scale: a one-element float32 tensor (per tensor) or a float32"
            f" {per_token} tensor (per token and head)"
        )
    if isinstance(scale, (int, float)):
        if not 0 < scale < math.inf:
            raise ValueError(f"{who}: {name}: expected a positive finite scale, got {scale!r}")
        return "tensor"
    check.check_dtype(who, name, scale.dtype, ("f32",))
    if math.prod(scale.shape) == 1:
        return "tensor"
    if tuple(scale.shape) != per_token:
        raise ValueError(
            f"{who}: {name}: expected one float32 scale (one element) or one per token and head, shape {per_token}"
            f" (the cache's first three dims), got shape {tuple(scale.shape)}"
        )
    return "token"


def _positive(who: str, name: str, value, *, kind: str) -> None:
    """None, or a positive int (``kind`` "int") or positive finite number ("float")."""
    if value is None:
        return
    whole = not isinstance(value, bool) and isinstance(value, int)
    if not (whole and value >= 1 if kind == "int" else isinstance(value, (int, float)) and 0 < value < math.inf):
        expected = "an int >= 1" if kind == "int" else "a positive finite float"
        raise ValueError(f"{who}: {name}: expected {expected} or None, got {value!r}")


def check_paged_decode(
    who, q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, max_context
) -> DecodeShape:
    """Checks ``paged_decode``'s arguments by their shapes, dtypes and values (errors name ``who`` and the argument);
    returns the call's :class:`DecodeShape`. Scales: None, a number, or a tensor's :class:`Meta`."""
    if len(q.shape) not in (3, 4):
        raise ValueError(f"{who}: q: expected (B, Hq, D) or (B, Q, Hq, D), got shape {tuple(q.shape)}")
    check.check_dtype(who, "q", q.dtype, Q_DTYPES)
    batch, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
    queries = q.shape[1] if len(q.shape) == 4 else 1
    if dim not in HEAD_DIMS:
        raise ValueError(f"{who}: q: expected a head dim D of {', '.join(map(str, HEAD_DIMS))}, got {dim}")
    if not 1 <= queries <= MAX_QUERIES:
        raise ValueError(f"{who}: q: expected 1..{MAX_QUERIES} query tokens per sequence, got {queries}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if len(cache.shape) != 4 or cache.shape[3] != dim:
            raise ValueError(
                f"{who}: {name}: expected (num_blocks, block_size, Hkv, D) with q's D {dim}, got {tuple(cache.shape)}"
            )
        check.check_dtype(who, name, cache.dtype, (q.dtype, FP8_CACHE), like="q")
    check.check_like(who, "v_cache", v_cache.shape, v_cache.dtype, k_cache.shape, k_cache.dtype, "k_cache")
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if block_size == 0 or block_size % BLOCK_MULTIPLE:
        raise ValueError(
            f"{who}: k_cache: expected a block_size that is a multiple of {BLOCK_MULTIPLE}, got {block_size}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"{who}: q: expected a head count Hq that is a multiple of the caches' Hkv {kv_heads}, got {heads}"
        )
    check.check_dtype(who, "block_tables", block_tables.dtype, ("int32",))
    if len(block_tables.shape) != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"{who}: block_tables: expected shape ({batch}, max_blocks), got {tuple(block_tables.shape)}")
    check.check_dtype(who, "context_lens", context_lens.dtype, ("int32",))
    if tuple(context_lens.shape) != (batch,):
        raise ValueError(f"{who}: context_lens: expected shape ({batch},), got {tuple(context_lens.shape)}")
    fp8 = k_cache.dtype == FP8_CACHE
    k_kind = scale_kind(who, "k_scale", k_scale, k_cache, fp8)
    v_kind = scale_kind(who, "v_scale", v_scale, v_cache, fp8)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"{who}: scale: expected a finite float or None, got {scale!r}")
    _positive(who, "soft_cap", soft_cap, kind="float")
    _positive(who, "sliding_window", sliding_window, kind="int")
    _positive(who, "max_context", max_context, kind="int")
    return DecodeShape(batch, queries, heads, dim, kv_heads, block_size, fp8, k_kind, v_kind)
