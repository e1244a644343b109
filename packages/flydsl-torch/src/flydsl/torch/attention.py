"""``torch.ops.flydsl.paged_decode`` (functional and ``_out``) and ``torch.ops.flydsl.write_kv`` (a mutating op: it
writes the caches, and per-token scales, it is given): :mod:`flydsl.kernels.attention` as torch custom ops, registered
on ``import flydsl.torch`` like :mod:`flydsl.torch.ops`' (whose helpers these use). fp8 scales are tensors in the
ops' schemas: a one-element float32 tensor per tensor, or (num_blocks, block_size, Hkv) per token and head."""

from __future__ import annotations

from flydsl.kernels import validation as check
from flydsl.kernels.attention import checks as _attention_checks  # paged_decode's metadata checks (no compiler)
from flydsl.torch._mutating import register_mutating_op
from flydsl.torch._registry import register_op
from flydsl.torch.ops import _check_like, _dtype, _like
from torch import Tensor

__all__ = ["paged_decode", "write_kv"]

# paged_decode's metadata checks are flydsl.kernels.attention.checks' (the kernels' own, on shapes and dtypes);
# write_kv's live here (flydsl.kernels.attention.cache checks real CUDA tensors and loads the compiler), its scales'
# through the same scale_kind.

_FP8_CACHE = _attention_checks.FP8_CACHE


def _check_paged_decode(
    q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale, sliding_window, soft_cap, max_context
) -> None:
    """flydsl.kernels.attention's own shape and dtype checks, on the tensors' metadata."""

    def meta(t):
        return None if t is None else _attention_checks.Meta(tuple(t.shape), _dtype(t))

    _attention_checks.check_paged_decode(
        "flydsl.paged_decode", meta(q), meta(k_cache), meta(v_cache), meta(block_tables), meta(context_lens), scale,
        meta(k_scale), meta(v_scale), sliding_window, soft_cap, max_context,
    )  # fmt: skip


@register_op("paged_decode", outputs=lambda q, *rest: (_like(q),), check=_check_paged_decode)
def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    max_context: int | None = None,
    *,
    out: Tensor,
) -> None:
    """Attention of a decode step over a paged KV cache (flydsl.kernels.attention.paged_decode): ``q`` (B, Hq, D) or
    (B, Q, Hq, D) bf16/fp16 (D 64, 128 or 256; Q 1..4), caches (num_blocks, block_size, Hkv, D) in q's dtype or
    float8_e4m3fn, ``block_tables`` int32 (B, max_blocks), ``context_lens`` int32 (B,). fp8 caches need ``k_scale``
    and ``v_scale`` as tensors (the op's schema takes no float for them): a one-element float32 tensor (per tensor)
    or a float32 (num_blocks, block_size, Hkv) tensor (per token and head); 16-bit caches take None. ``out``: q's
    shape and dtype. ``max_context`` bounds the context lengths (default: the block table's capacity): the call
    reads ``context_lens`` on the GPU only, so it can be captured in a CUDA graph and replayed with other lengths."""
    from flydsl.kernels.attention import paged_decode as kernel

    if q.shape[0] == 0:
        return
    kernel(
        q, k_cache, v_cache, block_tables, context_lens, scale=scale, k_scale=k_scale, v_scale=v_scale,
        sliding_window=sliding_window, soft_cap=soft_cap, out=out, max_context=max_context,
    )  # fmt: skip


_WRITE_KV_SOURCES = ("bf16", "f16")
_WRITE_KV_CACHES = ("bf16", "f16", _FP8_CACHE)
_WRITE_KV_MAX_HEAD_DIM = 1024  # flydsl.kernels.attention.cache.MAX_HEAD_DIM (that module loads the compiler)


def _check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    who = "flydsl.write_kv"
    if k.dim() != 3:
        raise ValueError(f"{who}: k: expected a 3-D tensor (T, Hkv, D), got shape {tuple(k.shape)}")
    check.check_dtype(who, "k", _dtype(k), _WRITE_KV_SOURCES)
    tokens, heads, dim = k.shape
    if dim % 8 or not 8 <= dim <= _WRITE_KV_MAX_HEAD_DIM:
        raise ValueError(f"{who}: k: expected a head size D that is a multiple of 8 up to 1024, got {dim}")
    _check_like("write_kv", "v", v, k, "k")
    if k_cache.dim() != 4 or tuple(k_cache.shape[2:]) != (heads, dim):
        raise ValueError(
            f"{who}: k_cache: expected shape (num_blocks, block_size, {heads}, {dim}) (Hkv and D: k's), got"
            f" {tuple(k_cache.shape)}"
        )
    check.check_dtype(who, "k_cache", _dtype(k_cache), _WRITE_KV_CACHES)
    _check_like("write_kv", "v_cache", v_cache, k_cache, "k_cache")
    check.check_dtype(who, "slot_mapping", _dtype(slot_mapping), ("int32", "int64"))
    if tuple(slot_mapping.shape) != (tokens,):
        raise ValueError(
            f"{who}: slot_mapping: expected shape ({tokens},) (one slot per token of k), got"
            f" {tuple(slot_mapping.shape)}"
        )
    fp8 = _dtype(k_cache) == _FP8_CACHE
    for name, scale, cache in (("k_scale", k_scale, k_cache), ("v_scale", v_scale, v_cache)):
        scale = None if scale is None else _attention_checks.Meta(tuple(scale.shape), _dtype(scale))
        _attention_checks.scale_kind(who, name, scale, _attention_checks.Meta(tuple(cache.shape), _dtype(cache)), fp8)


@register_mutating_op("write_kv", mutates=("k_cache", "v_cache", "k_scale", "v_scale"), check=_check_write_kv)
def write_kv(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    """The new tokens' keys and values into the paged caches (flydsl.kernels.attention.write_kv, in place): ``k``,
    ``v`` (T, Hkv, D) bf16/fp16 at the rows ``slot_mapping`` (T,) int32/int64 names (negative slots skipped) of
    ``k_cache``, ``v_cache`` (num_blocks, block_size, Hkv, D) contiguous, bf16, fp16 or float8_e4m3fn. fp8 caches need
    ``k_scale`` and ``v_scale`` as tensors: one-element float32 (per tensor: read) or contiguous float32
    (num_blocks, block_size, Hkv) (per token and head: each row's scale computed and written at its slot)."""
    from flydsl.kernels.attention import write_kv as kernel

    kernel(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
