"""Paged-attention decode: the kernels behind :func:`flydsl.kernels.attention.paged_decode`.

One CTA takes one sequence ``b``, one KV head and a range of its context (a *split*); its warps take 16-token chunks
of that range in turn (warp ``w``: chunks ``w, w + warps, ...``). For every chunk a warp runs, on the tensor cores
(``mma.sync`` m16n8k16, float32 accumulators):

* ``S = Q K^T``: Q is the 16-row A operand (the KV head's ``group * queries`` query rows; rows past them zero) and
  the chunk's keys the 8-column B operand (two n8 tiles). The head dimension is the MMAs' K, and its order does not
  matter to a dot product: each lane loads 16 contiguous bytes of a key row, and Q's fragments are loaded in the same
  permuted order (as the skinny GEMM does, :mod:`flydsl.kernels.gemm.skinny`). So keys go from global memory to
  registers with 16-byte loads, no shared memory.
* An online softmax in base 2 per query row (running maximum and sum, rows in the lanes that hold them).
* ``O^T += V^T P^T``: the head dimension is the M of the MMA (16-row tiles, permuted: lane ``l`` holds rows of its
  own ``D / 8`` contiguous values), the tokens its K, the query rows its N (8 per tile). The C fragments of ``S``
  are exactly the B fragments of ``P^T`` (query row ``l // 4``, tokens ``2 (l % 4) + {0, 1, 8, 9}``), so P never
  leaves registers; a lane loads its 4 tokens' ``D / 8`` values with 16-byte loads and pairs them across tokens with
  byte permutes (``prmt``).

fp8 (e4m3) caches: keys are widened to f16 (``cvt.rn.f16x2.e4m3x2``, exact) and Q is rounded to f16 after scaling
each row by a power of two that puts its largest value near 2^13 (no overflow, no subnormals; the factor comes off in
the logits' scale). Values are widened to f16 like keys and P is rounded to f16. One value scale per tensor
multiplies the output; a scale per token must ride on P (the sum over tokens cannot factor it out), and P times a
small scale would fall into f16's subnormals: the running maximum is taken over the logits plus log2 of their
tokens' value scales, so that the largest ``P * scale`` of a row is near 1 (the sums, of P alone, stay float32).
Key scales multiply the logits (per tensor: folded into the softmax scale).

The next chunk's loads (and its page's number, and the one after's) are issued before the current chunk's MMAs.
At the end the warps' partial results meet in shared memory; with one split the CTA writes the output, otherwise
each split's normalized output and its (max, sum) go to float32 partials, which the split that finishes last on
its (sequence, KV head) merges into the output, or past ``MERGE_FANIN`` splits a merge kernel launched after this
one as a dependent (:mod:`.merge`).
"""

from __future__ import annotations

from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, gpu, nvvm, vector
from flydsl.expr.vector import Vector
from flydsl.kernels.attention.chunk import ACC, CHUNK, W2, W4, chunk_step
from flydsl.kernels.attention.merge import MERGE_FANIN, NO_MAX, merge_if_last, merge_splits_kernel, merge_warps

__all__ = [
    "CHUNK",
    "MERGE_FANIN",
    "DecodeConfig",
    "argument_specs",
    "merge_splits_kernel",
    "merge_warps",
    "paged_decode_kernel",
]

_KV_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1}


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """What a decode kernel is compiled for: ``head_dim`` D (64, 128, 256), ``kv`` the caches' element type ("bf16",
    "f16" or "e4m3"), ``q`` the queries' ("bf16", "f16"), ``group`` query heads per KV head, ``queries`` query tokens
    per sequence (1..4), ``k_scale``/``v_scale`` None or "tensor" or "token" (fp8 only), ``window``/``soft_cap``
    whether a sliding window or logit soft-capping applies, ``split`` whether the CTAs write partials for
    the last split's merge, ``warps`` per CTA, ``prefetch`` how many chunks ahead of the one in the math a warp's
    loads are issued (0: none; registers for ``prefetch + 1`` chunks), ``ctas_per_sm`` the CTAs an SM must hold
    (registers capped to fit them), ``merge`` who merges a split context's partials: ``"last"`` the split that
    finishes last (up to ``MERGE_FANIN`` splits), ``"kernel"`` :func:`~.merge.merge_splits_kernel`, launched next as
    a dependent; ``block_size`` the caches' tokens per block (a multiple of 16; compiled in, so that a token's block
    and its place in it are a shift and a mask, not a division)."""

    head_dim: int
    kv: str
    q: str
    group: int
    queries: int = 1
    k_scale: str | None = None
    v_scale: str | None = None
    window: bool = False
    soft_cap: bool = False
    split: bool = False
    warps: int = 4
    prefetch: int = 1
    ctas_per_sm: int = 2
    merge: str = "last"
    block_size: int = 16

    def __post_init__(self):
        if self.head_dim not in (64, 128, 256) or self.kv not in _KV_BYTES or self.q not in ("bf16", "f16"):
            raise ValueError(f"{self}: head_dim 64/128/256, kv bf16/f16/e4m3 and q bf16/f16")
        if self.kv != "e4m3" and (self.kv != self.q or self.k_scale or self.v_scale):
            raise ValueError(f"{self}: 16-bit caches hold the queries' dtype and take no scales")
        if self.kv == "e4m3" and (self.k_scale not in ("tensor", "token") or self.v_scale not in ("tensor", "token")):
            raise ValueError(f"{self}: fp8 caches need k_scale and v_scale, 'tensor' or 'token'")
        if not 1 <= self.group <= 64 or not 1 <= self.queries <= 4 or self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self}: group 1..64, queries 1..4, warps 1/2/4/8/16")
        if self.prefetch not in (0, 1, 2) or not 1 <= self.ctas_per_sm * self.warps <= 64:
            raise ValueError(f"{self}: prefetch 0..2 chunks, ctas_per_sm * warps 1..64")
        if self.merge not in ("kernel", "last"):
            raise ValueError(f"{self}: merge 'kernel' (a dependent launch) or 'last' (the last split)")
        if self.block_size < CHUNK or self.block_size % CHUNK:
            raise ValueError(f"{self}: block_size a multiple of {CHUNK}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows(self) -> int:
        """Query rows of one KV head: its query heads times the query tokens (row ``i * group + j``)."""
        return self.group * self.queries

    @property
    def row_tiles(self) -> int:
        """16-row tiles of query rows: one per CTA (each reads the KV head's cache)."""
        return -(-self.rows // 16)

    @property
    def narrow(self) -> bool:
        """At most 8 query rows: the scores are computed as ``S^T = K Q^T`` (:mod:`.chunk`)."""
        return self.rows <= 8

    @property
    def p_tiles(self) -> int:
        """n8 tiles of query rows in the P V MMAs: 2 where a row tile holds more than 8 rows."""
        return 2 if min(self.rows, 16) > 8 else 1

    @property
    def rescale_slack(self) -> float | None:
        """How far (base 2) a row's chunk maximum may pass its running maximum before the running maximum moves and
        the accumulators are rescaled (:mod:`.chunk`): P then stays below 2^slack (f16's range holds it). None
        (rescale every chunk) for D = 256, whose 128 accumulator registers leave no room for the branch."""
        return None if self.head_dim == 256 else 8.0

    @property
    def kv_bytes(self) -> int:
        return _KV_BYTES[self.kv]

    @property
    def key_chunk(self) -> int:
        """Elements of a key row per 16-byte load."""
        return 16 // self.kv_bytes

    def mma_dtype(self, what: str):
        """The MMAs' operand type: f16 for fp8 caches (keys and values widened exactly), else the cache's."""
        if self.kv == "e4m3":
            return fx.Float16
        return fx.BFloat16 if self.kv == "bf16" else fx.Float16


# --- loads ----------------------------------------------------------------------------------------------------------


def _page_of(cfg: DecodeConfig, table_row, token, width):
    """The cache block holding ``token``: its entry in the sequence's block-table row (``table_row``: the address of
    its first entry), the index clamped to the table's ``width`` (not to the sequence's blocks, so that this load need
    not wait for the context length; a token past the context reads some entry and loads nothing from it)."""
    index = arith.minimum(token // cfg.block_size, width - 1)
    return nvvm.ld_global(nvvm.byte_offset(table_row, index * 4), nbytes=4)[0]


def _load_chunk(cfg: DecodeConfig, caches, hkv, chunk, page, end, lane_g, lane_c):
    """One chunk's words for this lane: key rows ``chunk + g`` and ``chunk + 8 + g`` (``D / 4`` elements each, 16
    bytes at a time from ``c``'s place), the value rows of tokens ``chunk + 2c + {0, 1, 8, 9}`` (this lane's ``D / 8``
    values), and for per-token scales those 4 tokens' key and value scales. Tokens at or past ``end`` load zeros.
    Each load's address comes from its coordinate: one base per cache and chunk with 32-bit lane offsets took fewer
    instructions but ptxas then issued the loads later in the loop (fp8 per token 6% slower on an H100,
    docs/tuning/attention.md#instructions)."""
    k_cache, v_cache, k_scales, v_scales = caches
    offset = chunk % cfg.block_size
    keys, k_token_scales, v_token_scales = [], [], []
    for half in fx.range_constexpr(2):
        inside = chunk + 8 * half + lane_g < end
        for u in fx.range_constexpr(cfg.head_dim // (4 * cfg.key_chunk)):
            col = cfg.key_chunk * (lane_c + 4 * u)
            keys.append(nvvm.ld_global(k_cache, (page, offset + 8 * half + lane_g, hkv, col), 16, predicate=inside))
        if fx.const_expr(cfg.narrow):  # scores and P per token g, g + 8
            _token_scales(cfg, caches, (page, offset + 8 * half + lane_g, hkv), inside, k_token_scales, v_token_scales)
    values = []
    value_bytes = cfg.head_dim // 8 * cfg.kv_bytes
    for token in (2 * lane_c, 2 * lane_c + 1, 2 * lane_c + 8, 2 * lane_c + 9):
        inside = chunk + token < end
        words = []
        for part in fx.range_constexpr(max(1, value_bytes // 16)):
            col = lane_g * (cfg.head_dim // 8) + part * (16 // cfg.kv_bytes)
            loaded = nvvm.ld_global(v_cache, (page, offset + token, hkv, col), min(16, value_bytes), predicate=inside)
            words += [loaded[i] for i in range(len(loaded))]
        values.append(words)
        if fx.const_expr(not cfg.narrow):  # scores and P per token 2c + {0, 1, 8, 9}
            _token_scales(cfg, caches, (page, offset + token, hkv), inside, k_token_scales, v_token_scales)
    return [keys, values] + [scales for scales in (k_token_scales, v_token_scales) if scales]  # no empty lists


def _token_scales(cfg: DecodeConfig, caches, coord, inside, k_token_scales, v_token_scales):
    """Appends the token's key and value scales where they are per token: 0 where ``inside`` is false (then nothing
    is read: the page may be any table entry)."""
    for kind, scales, taken in ((cfg.k_scale, caches[2], k_token_scales), (cfg.v_scale, caches[3], v_token_scales)):
        if fx.const_expr(kind == "token"):
            taken.append(arith.bitcast(fx.Float32.mlir_type(), nvvm.ld_global(scales, coord, 4, predicate=inside)[0]))


def _load_queries(cfg: DecodeConfig, q, b, hkv, tile, lane_g, lane_c):
    """The A fragments of ``Q`` (one ``Int32x4`` per k16 step of D), in the keys' permuted order: step ``(u, w)``
    takes elements ``key_chunk * (c + 4u) + 4w + {0, 1}`` (registers 0, 1: rows g, g + 8) and ``+ {2, 3}``
    (registers 2, 3). For fp8 keys each row is scaled by a power of two and rounded to f16; returns the fragments
    and the two rows' factors (1 otherwise)."""
    rows = []
    for half in fx.range_constexpr(2):
        r = tile * 16 + 8 * half + lane_g
        inside = r < cfg.rows
        r = arith.minimum(r, cfg.rows - 1)
        query, head = r // cfg.group, hkv * cfg.group + r % cfg.group
        words = []
        for u in fx.range_constexpr(cfg.head_dim // (4 * cfg.key_chunk)):
            for w in fx.range_constexpr(cfg.key_chunk // 4):
                col = cfg.key_chunk * (lane_c + 4 * u) + 4 * w
                words.append(nvvm.ld_global(q, (b, query, head, col), 8, predicate=inside))
        rows.append(words)
    factors = [fx.Float32(1.0), fx.Float32(1.0)]
    if fx.const_expr(cfg.kv == "e4m3" and cfg.q == "bf16"):
        for half in fx.range_constexpr(2):
            widened = [words.bitcast(fx.BFloat16).to(fx.Float32) for words in rows[half]]
            amax = fx.Float32(0.0)
            for v in widened:
                for i in fx.range_constexpr(4):
                    amax = arith.maximum(amax, arith.maximum(v[i], 0.0 - v[i]))
            for offset in (1, 2):
                amax = arith.maximum(amax, nvvm.shfl_sync(amax, offset, "bfly"))
            factors[half] = _power_of_two_below(amax)
            rows[half] = [(v * factors[half]).to(fx.Float16).bitcast(fx.Int32) for v in widened]
    fragments = []
    for step in fx.range_constexpr(cfg.head_dim // 16):
        low, high = rows[0][step], rows[1][step]
        if fx.const_expr(cfg.narrow):  # B fragment of Q^T: query row g
            fragments.append(vector.from_elements(W2, [low[0], low[1]]))
        else:
            fragments.append(vector.from_elements(W4, [low[0], high[0], low[1], high[1]]))
    return fragments, factors


def _power_of_two_below(amax):
    """``2^(13 - floor(log2(amax)))``: the factor that brings ``amax`` into [2^13, 2^14) (exponent arithmetic on the
    bits; 1 for 0, clamped to the normal range)."""
    exponent = (arith.bitcast(fx.Int32.mlir_type(), amax) >> 23) & 0xFF
    biased = arith.minimum(arith.maximum(127 + 13 + 127 - exponent, 1), 254)
    factor = arith.bitcast(fx.Float32.mlir_type(), biased << 23)
    return arith.select(amax > 0.0, factor, fx.Float32(1.0))


# --- the kernel ------------------------------------------------------------------------------------------------------


@flyc.kernel(target=flyc.Target("sm_90a", ptx_version=84))  # PTX ISA 8.4: cvt.rn.f16x2.e4m3x2 takes .b16
def paged_decode_kernel(
    q: fx.Tensor,
    k_cache: fx.Tensor,
    v_cache: fx.Tensor,
    block_tables: fx.Tensor,
    context_lens: fx.Tensor,
    k_scales: fx.Tensor,
    v_scales: fx.Tensor,
    out: fx.Tensor,
    partial_out: fx.Tensor,
    partial_stats: fx.Tensor,
    counters: fx.Tensor,
    softmax_scale: fx.Float32,
    soft_cap: fx.Float32,
    window: fx.Int32,
    split_tokens: fx.Int32,
    cfg: fx.Constexpr[DecodeConfig],
):
    """Grid ``(splits, kv_heads * row_tiles, batch)``. ``q``/``out`` (B, Q, Hq, D); caches (blocks, block_size,
    Hkv, D) (fp8 as bytes); ``block_tables`` (B, max_blocks) and ``context_lens`` (B,) int32; scales float32, (1,) per
    tensor or (blocks, block_size, Hkv) per token (unread otherwise); with ``cfg.split``: ``partial_out`` (B, Q, Hq,
    splits, D) and ``partial_stats`` (B, Q, Hq, splits, 2) float32 (row maximum in base 2, sum), merged into
    ``out`` by the split that finishes last (``cfg.merge == "last"``; ``counters``: int32 zeros, one per (b, KV
    head, row tile), which every launch leaves zero) or by :func:`~.merge.merge_splits_kernel`, which this kernel
    lets start at once (``"kernel"``).
    ``window`` > 0: each query sees its last ``window`` positions; ``split_tokens``: a split's tokens (a multiple of
    16); ``softmax_scale`` multiplies ``q . k``; ``soft_cap`` > 0 caps the logits (``cfg.soft_cap``)."""
    flyc.set_kernel_attributes(threads=cfg.threads, min_blocks_per_sm=cfg.ctas_per_sm)
    if fx.const_expr(cfg.split and cfg.merge == "kernel"):
        nvvm.griddepcontrol_launch_dependents()  # the merge kernel's CTAs may start now and wait for the partials
    split, b = gpu.block_idx.x, gpu.block_idx.z
    hkv, tile = gpu.block_idx.y // cfg.row_tiles, gpu.block_idx.y % cfg.row_tiles
    tid = gpu.thread_idx.x
    warp, lane = tid // 32, tid % 32
    lane_g, lane_c = lane // 4, lane % 4
    context = context_lens[b]

    # The positions the split covers: from the first any query sees (16-aligned) on, split_tokens per split.
    first = fx.Int32(0)
    if fx.const_expr(cfg.window):
        first = arith.maximum(context - (cfg.queries - 1) - window, 0)
    begin = (first // CHUNK) * CHUNK + split * split_tokens
    end = arith.minimum(begin + split_tokens, context)
    chunks = arith.maximum((end - begin + (CHUNK - 1)) // CHUNK, 0)
    steps = arith.maximum((chunks - warp + (cfg.warps - 1)) // cfg.warps, 0)

    queries, factors = _load_queries(cfg, q, b, hkv, tile, lane_g, lane_c)
    scale = softmax_scale
    if fx.const_expr(cfg.k_scale == "tensor"):
        scale = scale * k_scales[0]
    cap = soft_cap
    scale_rows, lows, highs = _lane_rows(cfg, scale, factors, (context, begin, end, window), tile, lane_g, lane_c)
    caches = (k_cache, v_cache, k_scales, v_scales)

    state = [[fx.Float32(NO_MAX)] * 2, [fx.Float32(0.0)] * 2, [ACC(0.0)] * (cfg.head_dim // 16 * cfg.p_tiles)]
    stride = CHUNK * cfg.warps
    chunk = begin + CHUNK * warp
    table_row, width = nvvm.address(block_tables, (b, 0)), block_tables.shape[1].to(fx.Int32)
    consts = (scale_rows, cap, lows, highs, lane_g, lane_c)
    if fx.const_expr(cfg.prefetch):
        # The loads of the chunk `prefetch` ahead are issued before this chunk's math (its page's number one chunk
        # earlier still); the loaded chunks rotate through registers.
        ahead = cfg.prefetch
        loaded = []
        for i in fx.range_constexpr(ahead):
            page = _page_of(cfg, table_row, chunk + i * stride, width)
            loaded.append(_load_chunk(cfg, caches, hkv, chunk + i * stride, page, end, lane_g, lane_c))
        next_page = _page_of(cfg, table_row, chunk + ahead * stride, width)
        for _step in range(steps):
            upcoming = _load_chunk(cfg, caches, hkv, chunk + ahead * stride, next_page, end, lane_g, lane_c)
            next_page = _page_of(cfg, table_row, chunk + (ahead + 1) * stride, width)
            state = chunk_step(cfg, state, loaded[0], queries, chunk, consts)
            loaded = loaded[1:] + [upcoming]
            chunk = chunk + stride
    else:
        for _step in range(steps):
            page = _page_of(cfg, table_row, chunk, width)
            loaded = _load_chunk(cfg, caches, hkv, chunk, page, end, lane_g, lane_c)
            state = chunk_step(cfg, state, loaded, queries, chunk, consts)
            chunk = chunk + stride
    place = (b, hkv, tile, split)
    _finish(cfg, state, out, partial_out, partial_stats, v_scales, place, tid)
    if fx.const_expr(cfg.split and cfg.merge == "last"):
        span = (context, (first // CHUNK) * CHUNK, split_tokens)
        merge_if_last(cfg, out, partial_out, partial_stats, counters, v_scales, place, tid, span)


def argument_specs(cfg: DecodeConfig, *, batch=2, blocks=64, kv_heads=1, splits=3, max_blocks=16) -> list:
    """``paged_decode_kernel``'s arguments for ``cfg`` as ``TensorSpec``s and values: what its ``lower()`` takes to
    give the PTX (and, with ptxas, the cubin) without a GPU, for caches of ``blocks`` pages of ``kv_heads`` heads."""
    d, heads, spec = cfg.head_dim, kv_heads * cfg.group, flyc.TensorSpec
    cache = spec((blocks, cfg.block_size, kv_heads, d), "u8" if cfg.kv == "e4m3" else cfg.kv)
    per_token = (blocks, cfg.block_size, kv_heads)
    rows = (batch, cfg.queries, heads)
    return [
        spec((*rows, d), cfg.q), cache, cache, spec((batch, max_blocks), "i32"), spec((batch,), "i32"),
        spec(per_token if cfg.k_scale == "token" else (1,), "f32"),
        spec(per_token if cfg.v_scale == "token" else (1,), "f32"),
        spec((*rows, d), cfg.q), spec((*rows, splits, d), "f32"), spec((*rows, splits, 2), "f32"), spec((1024,), "i32"),
        0.08, 30.0, 0, 256, cfg,
    ]  # fmt: skip


def _lane_rows(cfg: DecodeConfig, scale, factors, span, tile, lane_g, lane_c):
    """For the lane's two rows (g and g + 8 of the row tile; narrow: 2c and 2c + 1): the logits' scale (``scale``
    over the row's power-of-two factor, ``factors`` as :func:`_load_queries` returns them) and the positions it sees,
    ``[lows, highs)``: query i = row // group sits at position ``context - queries + i`` and sees up to there, within
    the split's ``[begin, end)`` (and the window from its own position). ``span``: ``(context, begin, end, window)``."""
    context, begin, end, window = span
    lane_rows = [2 * lane_c + j for j in range(2)] if cfg.narrow else [tile * 16 + 8 * h + lane_g for h in range(2)]
    lows, highs = [], []
    for half in fx.range_constexpr(2):
        row = arith.minimum(lane_rows[half], cfg.rows - 1)
        own = context - cfg.queries + 1 + row // cfg.group  # past the query's own position
        highs.append(arith.minimum(own, end))
        lows.append(arith.maximum(own - window, begin) if cfg.window else begin)
    if fx.const_expr(cfg.narrow and cfg.kv == "e4m3" and cfg.q == "bf16"):  # row g's factor, from a lane of row g
        factors = [nvvm.shfl_sync(factors[0], row * 4) for row in lane_rows]
    return [scale / f for f in factors], lows, highs  # natural-log logits (capped before the change to base 2)


def _row_totals(cfg: DecodeConfig, row_max, row_sum, lane_g, lane_c):
    """Per lane row (g and g + 8 of the tile; narrow: 2c and 2c + 1): ``(row, max, sum, writes)``, the sum over the
    row's lanes (those of one g; narrow: of one c), ``writes`` true in one of them."""
    totals = []
    for half in fx.range_constexpr(2):
        total = row_sum[half]
        for offset in (4, 8, 16) if cfg.narrow else (1, 2):
            total = total + nvvm.shfl_sync(total, offset, "bfly")
        if fx.const_expr(cfg.narrow):
            totals.append((2 * lane_c + half, row_max[half], total, lane_g == 0))
        else:
            totals.append((8 * half + lane_g, row_max[half], total, lane_c == 0))
    return totals


def _finish(cfg, state, out, partial_out, partial_stats, v_scales, place, tid):
    """The warps' partial results merged in shared memory, then written: the output (one split) or the split's
    normalized output and (max, sum) statistics."""
    b, hkv, tile, split = place
    row_max, row_sum, acc = state
    warp, lane = tid // 32, tid % 32
    lane_g, lane_c = lane // 4, lane % 4
    d = cfg.head_dim
    smem = fx.SmemAllocator()
    tiles = d // 16 * cfg.p_tiles
    # accumulators as (warp, tile, element, lane): lanes contiguous, conflict-free stores
    partial = smem.allocate(fx.Float32, fl.Layout((cfg.warps, tiles, 4, 32), (tiles * 128, 128, 32, 1)))
    stats = smem.allocate(fx.Float32, fl.Layout((cfg.warps, 2, 16), (32, 16, 1)))
    for t in fx.range_constexpr(tiles):
        for e in fx.range_constexpr(4):
            partial[warp, t, e, lane] = acc[t][e]
    for row, top, total, writes in _row_totals(cfg, row_max, row_sum, lane_g, lane_c):
        if writes:
            stats[warp, 0, row] = top
            stats[warp, 1, row] = total
    gpu.barrier()
    # Thread i takes (row, 8 values) items i, i + threads, ...: rows of this tile, values 8 at a time.
    rows_here = min(16, cfg.rows)
    items = rows_here * (d // 8)
    v_factor = fx.Float32(1.0)
    if fx.const_expr(cfg.v_scale == "tensor"):
        v_factor = v_scales[0]
    for rep in fx.range_constexpr(-(-items // cfg.threads)):
        item = arith.minimum(tid + rep * cfg.threads, items - 1)
        r, part = item // (d // 8), item % (d // 8)
        top = fx.Float32(NO_MAX)
        for w in fx.range_constexpr(cfg.warps):
            top = arith.maximum(top, stats[w, 0, r])
        weights, total = [], fx.Float32(0.0)
        for w in fx.range_constexpr(cfg.warps):
            weight = nvvm.ex2_approx(stats[w, 0, r] - top, ftz=True)
            weights.append(weight)
            total = total + weight * stats[w, 1, r]
        inverse = arith.select(total > 0.0, 1.0 / total, fx.Float32(0.0))
        # value k of row r: head-dim index 8 part + k, held by lane g = (8 part + k) // (d / 8) as its value
        # (8 part + k) % (d / 8) = 2 tile + (element >> 1); column r: p tile r // 8, lane c = (r % 8) // 2
        values = []
        for k in fx.range_constexpr(8):
            dim = 8 * part + k
            src_g, own = dim // (d // 8), dim % (d // 8)
            t = (own // 2) * cfg.p_tiles + r // 8
            e = (own % 2) * 2 + r % 2
            src_lane = src_g * 4 + (r % 8) // 2
            v = fx.Float32(0.0)
            for w in fx.range_constexpr(cfg.warps):
                v = v + weights[w] * partial[w, t, e, src_lane]
            values.append(v * inverse)
        global_row = tile * 16 + r
        query, head = global_row // cfg.group, hkv * cfg.group + global_row % cfg.group
        keep = (tid + rep * cfg.threads < items) & (global_row < cfg.rows)
        if fx.const_expr(cfg.split):
            if keep:  # two 16-byte stores, not eight scalar ones: fewer writes for the merge's release to wait on
                vector.store(
                    vector.from_elements(Vector.of(fx.Float32, 8), values),
                    partial_out,
                    (b, query, head, split, 8 * part),
                )
                if part == 0:
                    partial_stats[b, query, head, split, 0] = top
                    partial_stats[b, query, head, split, 1] = total
        else:
            if keep:
                row_values = vector.from_elements(Vector.of(fx.Float32, 8), [v * v_factor for v in values])
                vector.store(row_values.to(out.dtype), out, (b, query, head, 8 * part))
