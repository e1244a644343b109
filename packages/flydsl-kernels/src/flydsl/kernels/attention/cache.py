"""``write_kv``: new keys and values written into a paged KV cache (vLLM's ``reshape_and_cache``), copied into a 16-bit
cache or cast to fp8 e4m3 with a per-tensor or a per-(token, head) scale.

    write_kv(k, v, k_cache, v_cache, slot_mapping)                              # bf16/fp16 caches: copies
    write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=0.05, v_scale=0.02)  # fp8: the cache holds k / 0.05
    write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=ks, v_scale=vs)      # fp8, ks and vs float32 (num_blocks,
                                                                                # block_size, Hkv): scales written

Token ``t`` goes to cache row ``slot_mapping[t]`` (block ``slot // block_size``, row ``slot % block_size``); a negative
slot skips the token (vLLM's padding), and so does a slot past the cache (a bad slot is never a wild write).

The kernel: a (token, head) row of D elements belongs to a team of ``lanes`` threads (a power of two up to a warp),
each with ``D / (vec * lanes)`` 16-byte chunks of it (vec = 8 elements; 16 for an fp8 cache, so that a thread's
output is one 16-byte store: two 16-byte loads in, one out). The same thread does the same for the value row: one
launch writes both caches, because a decode step writes a few tokens (the cost is the launch, not the bytes) and the
key and value rows share their slot (read once) and their position in the grid. A per-(token, head) scale is the
row's amax over D (a butterfly over the team's lanes) times ``1 / 448``, written by the team's first lane. Rows past
the last (the last CTA's tail) load the last row and store nothing. Cache offsets are 64-bit (the slot is widened
before it meets the row stride: caches may hold more than 2^31 elements); slot_mapping is read only by the kernel,
so calls can be captured in CUDA graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import arith, gpu, nvvm, vector
from flydsl.kernels import validation as check
from flydsl.kernels.plans import Plans, signature
from flydsl.kernels.rows.reduce import thread_reduce
from flydsl.kernels.rows.tiles import fill_buffer

__all__ = ["FP8_MAX", "MAX_HEAD_DIM", "WriteKVConfig", "write_kv", "write_kv_kernel"]

FP8_MAX = 448.0  # e4m3's largest finite value
MAX_HEAD_DIM = 1024  # a thread keeps its chunks of a key and a value row in registers
_SOURCE_DTYPES = ("bf16", "f16")
_CACHE_DTYPES = ("bf16", "f16", "f8E4M3FN")
_SCALE_KINDS = (None, "value", "tensor", "token")
_WRITE_KV = Plans("flydsl.kernels.attention.write_kv", replay=True)


@dataclass(frozen=True, kw_only=True)
class WriteKVConfig:
    """The kernel's compile-time choices: ``head_dim`` D (a multiple of 8), ``cache`` ("bf16", "f16" or "fp8"),
    ``k_scale`` / ``v_scale`` (None for a 16-bit cache; for fp8 "value": a float argument, "tensor": a one-element
    tensor, "token": per (token, head), computed and written) and ``block`` threads per CTA."""

    head_dim: int
    cache: str
    k_scale: str | None = None
    v_scale: str | None = None
    block: int = 128

    def __post_init__(self):
        if self.head_dim % 8 or not 8 <= self.head_dim <= MAX_HEAD_DIM or self.cache not in ("bf16", "f16", "fp8"):
            raise ValueError(
                f"WriteKVConfig: head_dim must be a multiple of 8 up to {MAX_HEAD_DIM} and cache bf16, f16 or fp8,"
                f" got {self}"
            )
        scaled = (self.k_scale, self.v_scale)
        if any(s not in _SCALE_KINDS for s in scaled) or (None in scaled) != (self.cache != "fp8"):
            raise ValueError(
                f"WriteKVConfig: an fp8 cache needs scale kinds (value, tensor, token), others none, got {self}"
            )
        if self.block % 32 or not 32 <= self.block <= 1024:
            raise ValueError(f"WriteKVConfig: block must be a multiple of 32 up to 1024, got {self}")

    @property
    def vec(self) -> int:
        """Elements per chunk: 16 bytes of the input, or of an fp8 cache where D allows."""
        return 16 if self.cache == "fp8" and self.head_dim % 16 == 0 else 8

    @property
    def chunks(self) -> int:
        """Chunks per row."""
        return self.head_dim // self.vec

    @property
    def lanes(self) -> int:
        """Threads per row: the chunks rounded up to a power of two (the butterfly's width), at most a warp."""
        return min(32, 1 << (self.chunks - 1).bit_length())

    @property
    def per_thread(self) -> int:
        """Chunks per thread and row (chunk ``j * lanes + lane``)."""
        return -(-self.chunks // self.lanes)

    @property
    def ragged(self) -> bool:
        """Whether the last of a thread's chunks may be past the row (D / vec not a multiple of the lanes)."""
        return self.per_thread * self.lanes != self.chunks

    @property
    def teams(self) -> int:
        """Rows per CTA."""
        return self.block // self.lanes

    def grid(self, rows: int) -> int:
        return -(-rows // self.teams)


def _load_chunks(cfg: WriteKVConfig, src, token, head, lane):
    """This thread's chunks of row (token, head) of ``src`` (T, Hkv, D): vectors of its dtype, zeros past D."""
    chunks = []
    for j in fx.range_constexpr(cfg.per_thread):
        c = j * cfg.lanes + lane
        view = fx.local_tile(src, (1, 1, cfg.vec), (token, head, c))[0, 0, None]
        if fx.const_expr(cfg.ragged and j == cfg.per_thread - 1):
            cls = vector.vector_class(src.dtype, cfg.vec)
            _, buffer = fill_buffer(cls, 0.0)
            fx.copy(view, buffer, predicate=c < cfg.chunks)
            chunks.append(vector.load(buffer))
        else:
            chunks.append(vector.load(view))
    return chunks


def _row_scale(cfg: WriteKVConfig, kind: str, wide, scales, scale_value, slot, head, lane, ok):
    """The divisor of an fp8 row: the scale argument, the one-element tensor's, or the row's ``amax * (1 / 448)``
    (written to ``scales[slot, head]`` by the team's first lane; a row of zeros gets 0 and divides by 1)."""
    if fx.const_expr(kind == "value"):
        return scale_value
    if fx.const_expr(kind == "tensor"):
        return scales[0]
    magnitudes = [arith.maximum(x, 0.0 - x) for chunk in wide for x in chunk]  # |x|, NaN kept
    amax = gpu.warp_reduce(thread_reduce(magnitudes, "max"), "max", width=cfg.lanes)
    scale = amax * (1.0 / FP8_MAX)
    if ok & (lane == 0):
        scales[slot, head] = scale
    return arith.select(scale == 0.0, fx.Float32(1.0), scale)


def _store_chunks(cfg: WriteKVConfig, cache, chunks, slot, head, lane, ok):
    """This thread's chunks (vectors of the cache's element type) into cache row (slot, head), where ``ok``."""
    for j, chunk in enumerate(chunks):
        c = j * cfg.lanes + lane
        view = fx.local_tile(cache, (1, 1, len(chunk)), (slot, head, c))[0, 0, None]
        _, buffer = vector.register_buffer(type(chunk))
        vector.store(chunk, buffer)
        if fx.const_expr(cfg.ragged and j == cfg.per_thread - 1):
            fx.copy(buffer, view, predicate=ok & (c < cfg.chunks))
        else:
            fx.copy(buffer, view, predicate=ok)


def _write_row(cfg: WriteKVConfig, kind, cache, chunks, scales, scale_value, slot, head, lane, ok):
    """One row (key or value) into its cache: copied (converted between 16-bit types), or divided by its scale and
    cast to e4m3 (``cvt.rn.satfinite``: saturated to +-448, NaN kept)."""
    if fx.const_expr(kind is None):
        if fx.const_expr(chunks[0].element is not cache.dtype):
            chunks = [chunk.to(fx.Float32).to(cache.dtype) for chunk in chunks]
        _store_chunks(cfg, cache, chunks, slot, head, lane, ok)
    else:
        wide = [chunk.to(fx.Float32) for chunk in chunks]
        divisor = _row_scale(cfg, kind, wide, scales, scale_value, slot, head, lane, ok)
        pairs = vector.vector_class(fx.Int16, cfg.vec // 2)
        packed = []
        for chunk in wide:
            q = chunk / divisor  # a true division: value / scale
            halves = [fx.Int16(nvvm.cvt_f32x2_to_fp8x2(q[2 * i + 1], q[2 * i]).value) for i in range(cfg.vec // 2)]
            packed.append(vector.from_elements(pairs.mlir_type(), halves).bitcast(fx.Int64))
        _store_chunks(cfg, cache, packed, slot, head, lane, ok)


@flyc.kernel
def write_kv_kernel(
    k: fx.Tensor,
    v: fx.Tensor,
    k_cache: fx.Tensor,
    v_cache: fx.Tensor,
    slot_mapping: fx.Tensor,
    k_scales: fx.Tensor,
    v_scales: fx.Tensor,
    k_scale_value: fx.Float32,
    v_scale_value: fx.Float32,
    cfg: fx.Constexpr[WriteKVConfig],
):
    """``k``, ``v`` (T, Hkv, D) 16-bit rows into ``k_cache``, ``v_cache`` (slots, Hkv, D) (fp8: (slots, Hkv, D / 8)
    int64 words, so that a chunk of 8 bytes is one store whatever D's alignment; 16 bytes where D allows) at
    ``slot_mapping[t]`` (T,) int32/int64. Scales per ``cfg``: ``*_scales`` (1,) float32 ("tensor"), (slots, Hkv)
    float32 ("token", written), else unread; ``*_scale_value`` ("value")."""
    flyc.set_kernel_attributes(threads=cfg.block)
    tokens, heads, _ = k.shape
    tokens, heads = tokens.to(fx.Int32), heads.to(fx.Int32)  # T * Hkv < 2^31: checked by write_kv
    rows = tokens * heads
    tid = gpu.thread_idx.x
    lane = tid % cfg.lanes
    row = gpu.block_idx.x * cfg.teams + tid // cfg.lanes
    valid = row < rows
    row = arith.select(valid, row, rows - 1)  # the tail loads the last row (every lane joins the butterfly)
    token = row // heads
    head = row - token * heads
    slot = slot_mapping[token].to(fx.Int64)  # 64 bits before it meets the cache's row stride
    ok = valid & (slot >= 0) & (slot < k_cache.shape[0].to(fx.Int64))
    k_chunks = _load_chunks(cfg, k, token, head, lane)
    v_chunks = _load_chunks(cfg, v, token, head, lane)
    _write_row(cfg, cfg.k_scale, k_cache, k_chunks, k_scales, k_scale_value, slot, head, lane, ok)
    _write_row(cfg, cfg.v_scale, v_cache, v_chunks, v_scales, v_scale_value, slot, head, lane, ok)


# --- the entry point ------------------------------------------------------------------------------------------------


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None) -> None:
    """Writes ``k``, ``v`` (T, Hkv, D) bf16/fp16 (unit stride on D, any other strides; D a multiple of 8 up to 1024)
    into the paged caches ``k_cache``, ``v_cache`` (num_blocks, block_size, Hkv, D) (contiguous; bf16, fp16 or
    float8_e4m3fn; one dtype for both) at the rows ``slot_mapping`` (T,) int32/int64 names: token t at block
    ``slot // block_size``, row ``slot % block_size``; negative slots (and slots past the cache) are skipped. A 16-bit
    cache gets the values (converted where its dtype differs); an fp8 cache needs ``k_scale`` and ``v_scale``, each
    either per tensor (a positive float or a one-element float32 tensor: the cache holds ``value / scale`` saturated
    to +-448) or per (token, head) (a contiguous float32 (num_blocks, block_size, Hkv) tensor: each row's scale
    ``amax / 448`` over D is computed, written there at the slot, and the row stored as ``value / scale``; a row of
    zeros gets scale 0 and zeros). One launch; arguments checked before it (errors name the argument); the slots
    are never read on the host (CUDA-graph capturable)."""
    key = signature(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    plan = _WRITE_KV.get(key)
    if plan is None:
        plan = _WRITE_KV.add(key, _plan(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale))
    plan(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def _plan(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    """The launch of a call of this signature, checked: a function of the call's arguments."""
    cfg, rows = check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if rows == 0:
        return lambda *args: None
    import torch

    heads, dim = k_cache.shape[2:]
    fp8 = cfg.cache == "fp8"
    kernel, launch = write_kv_kernel, dict(grid=cfg.grid(rows), block=cfg.block)
    values = [float(s) if _is_number(s) else 1.0 for s in (k_scale, v_scale)]  # fixed: the key holds them

    def flat(cache):  # (slots, Hkv, D) or fp8 (slots, Hkv, D / 8) words: the slot is the row index
        return cache.view(torch.int64).view(-1, heads, dim // 8) if fp8 else cache.view(-1, heads, dim)

    def scales(kind, scale, slot_mapping):
        if kind == "token":
            return scale.view(-1, heads)
        return scale.reshape(1) if kind == "tensor" else slot_mapping  # unread: any tensor

    def run(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
        k_scales = scales(cfg.k_scale, k_scale, slot_mapping)
        v_scales = scales(cfg.v_scale, v_scale, slot_mapping)
        args = (k, v, flat(k_cache), flat(v_cache), slot_mapping, k_scales, v_scales, *values, cfg)
        kernel(*args).launch(**launch)

    return run


def _is_number(scale) -> bool:
    return isinstance(scale, (int, float)) and not isinstance(scale, bool)


def check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> tuple[WriteKVConfig, int]:
    """``write_kv``'s arguments checked (tensors read for their shapes, dtypes, strides, devices and addresses only:
    torch tensors, other GPU arrays or ``flyc.TensorSpec``); returns the kernel's configuration and the row count
    T * Hkv. Errors name the argument."""
    who = _WRITE_KV.name
    ki = check.describe(who, "k", k)
    if len(ki.shape) != 3:
        raise ValueError(f"{who}: k: expected a 3-D tensor (T, Hkv, D), got shape {tuple(ki.shape)}")
    check.check_dtype(who, "k", ki.dtype, _SOURCE_DTYPES)
    tokens, heads, dim = ki.shape
    if dim % 8 or not 8 <= dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"{who}: k: head size D = {dim}: expected a multiple of 8 (16-byte accesses) from 8 to {MAX_HEAD_DIM}"
        )
    vi = check.describe(who, "v", v)
    check.check_like(who, "v", vi.shape, vi.dtype, ki.shape, ki.dtype, "k")
    for name, t in (("k", ki), ("v", vi)):
        if t.strides[2] != 1:
            raise ValueError(f"{who}: {name}: expected unit stride on D, got strides {tuple(t.strides)}")
    kc = check.describe(who, "k_cache", k_cache)
    if len(kc.shape) != 4 or tuple(kc.shape[2:]) != (heads, dim):
        raise ValueError(
            f"{who}: k_cache: expected shape (num_blocks, block_size, {heads}, {dim}) (Hkv and D: k's), got"
            f" {tuple(kc.shape)}"
        )
    check.check_dtype(who, "k_cache", kc.dtype, _CACHE_DTYPES)
    vc = check.describe(who, "v_cache", v_cache)
    check.check_like(who, "v_cache", vc.shape, vc.dtype, kc.shape, kc.dtype, "k_cache")
    for name, t in (("k_cache", kc), ("v_cache", vc)):
        if not _contiguous(t):
            raise ValueError(f"{who}: {name}: expected a contiguous cache, got strides {tuple(t.strides)}")
    sm = check.describe(who, "slot_mapping", slot_mapping)
    if sm.dtype not in ("i32", "i64", "int32", "int64"):  # TensorSpec names, torch names
        raise TypeError(f"{who}: slot_mapping: expected int32 or int64, got {check.dtype_names((sm.dtype,))}")
    if tuple(sm.shape) != (tokens,):
        raise ValueError(
            f"{who}: slot_mapping: expected shape ({tokens},) (one slot per token of k), got {tuple(sm.shape)}"
        )
    if tokens * heads >= 1 << 31:
        raise ValueError(f"{who}: k: expected fewer than 2^31 (token, head) rows, got {tokens} x {heads}")
    fp8 = kc.dtype == "f8E4M3FN"
    (k_kind, ks), (v_kind, vs) = (
        _check_scale(who, name, s, kc, fp8) for name, s in (("k_scale", k_scale), ("v_scale", v_scale))
    )
    check.same_device(
        who, ki, ("v", vi), ("k_cache", kc), ("v_cache", vc), ("slot_mapping", sm), ("k_scale", ks), ("v_scale", vs)
    )
    # Written memory apart from everything else it could overlap: the caches and the per-token scales.
    check.not_aliased(who, "v_cache", vc, ("k_cache", kc))
    if k_kind == "token":
        check.not_aliased(who, "k_scale", ks, ("k_cache", kc), ("v_cache", vc))
    if v_kind == "token":
        check.not_aliased(
            who, "v_scale", vs, ("k_cache", kc), ("v_cache", vc), ("k_scale", ks if k_kind == "token" else None)
        )
    cache = {"bf16": "bf16", "f16": "f16", "f8E4M3FN": "fp8"}[kc.dtype]
    return WriteKVConfig(head_dim=dim, cache=cache, k_scale=k_kind, v_scale=v_kind), tokens * heads


def _check_scale(who: str, name: str, scale, cache: check.TensorInfo, fp8: bool):
    """``(kind, TensorInfo or None)`` of a scale argument: None for a 16-bit cache; for fp8 "value" (a positive
    finite number), "tensor" (one float32 element) or "token" (a contiguous float32 (num_blocks, block_size, Hkv))."""
    per_token = tuple(cache.shape[:3])
    if not fp8:
        if scale is not None:
            raise ValueError(f"{who}: {name}: a 16-bit cache holds the values themselves: expected None, got a scale")
        return None, None
    if scale is None:
        raise ValueError(
            f"{who}: {name}: an fp8 cache needs a scale: a float, a one-element float32 tensor or a float32"
            f" {per_token} tensor (per token and head)"
        )
    if _is_number(scale):
        if not (0 < scale < math.inf):
            raise ValueError(f"{who}: {name}: expected a positive finite scale, got {scale!r}")
        return "value", None
    info = check.describe(who, name, scale)
    check.check_dtype(who, name, info.dtype, ("f32",))
    shape = tuple(info.shape)
    if shape == per_token:
        if not _contiguous(info):
            raise ValueError(f"{who}: {name}: expected contiguous per-token scales, got strides {tuple(info.strides)}")
        return "token", info
    if math.prod(shape) == 1:
        return "tensor", info
    raise ValueError(
        f"{who}: {name}: expected one float32 scale (one element) or one per token and head, shape {per_token}, got"
        f" shape {shape}"
    )


def _contiguous(t: check.TensorInfo) -> bool:
    """Row-major without gaps (extents of 1 may have any stride)."""
    step = 1
    for extent, stride in zip(reversed(t.shape), reversed(t.strides), strict=True):
        if extent != 1 and stride != step:
            return False
        step *= extent
    return True
