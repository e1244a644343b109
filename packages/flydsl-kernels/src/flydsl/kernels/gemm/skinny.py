"""Skinny GEMM: ``out = activation(a @ b + bias)`` for M <= 16 rows of activations, streaming the weights.

At M <= 16 a GEMM is a read of the weights: ``N * K * 2`` bytes against ``2 * M * N * K`` flops. The kernel
streams them from global memory straight into registers with 16-byte loads (no shared memory, no TMA) and feeds
``mma.sync`` m16n8k16 with the activations as the 16-row operand (rows >= M are copies of row M - 1 whose results
are never stored) and the weights as the 8-column operand.

Fragments come from plain 16-byte loads: the K sum does not depend on its order, so K is permuted identically for
both operands. Lane ``l`` (``t = l % 4``, ``q = l // 4``) loads ``w[n0 + q][k0 + 8t .. k0 + 8t + 7]`` and
``a[q][k0 + 8t ..]`` (and ``a[q + 8][..]`` when M > 8): the words 0, 1 of each load are its fragment registers of
a first k16 MMA, the words 2, 3 those of a second, so 4 lanes x 8 elements cover 32 values of K per load.

Work: a CTA owns ``8 * groups * warps_n`` weight rows and a range of K. Each warp owns ``groups`` n8 MMA tiles
(sharing its A fragments); ``warps_n`` warps side by side along N read the same activations (L1 hits for all but
one), and the ``warps / warps_n`` warps of each column take turns along K (each ``unroll`` loads of 32 K values
per row and step, all issued before the MMAs; ``pipelined``: the next step's loads are issued before this step's
MMAs) and sum their fp32 accumulators through shared memory. With ``splits`` > 1 the K range is cut over that
many CTAs, which write fp32 partials that :func:`flydsl.kernels.gemm.split_k_reduce` sums through the epilogue
(for shapes with too few weight rows to fill the GPU otherwise).

Prepared fp8 weights (:mod:`~flydsl.kernels.gemm.prepared`: (K / 128, N, 128) panels) are read in the same order,
the 8 rows of a warp load in one contiguous kilobyte. fp8 operands (the ``_scaled`` kernel: PTX ISA 8.4) take the
same loads, 16 values each, as the fragments of m16n8k32 MMAs, with their float32 scales in the epilogue. The grouped
kernels of a mixture of experts' decode (:mod:`~flydsl.kernels.gemm.skinny_grouped`) are built from this module's
loads, MMAs and K-warp sum.

Weights are read with ``ld.global.nc.L1::no_allocate`` (read once: they should not evict the activations from L1;
with ``.L2::256B`` prefetches); activations with ``ld.global.nc`` (re-read by every CTA: from L2, or L1). 16-byte
loads need K a multiple of 8 and 16-byte aligned rows; otherwise the kernel reads elements one by one (correct,
slower). Why it is shaped so: docs/tuning/gemm.md#skinny.

    from flydsl.kernels.gemm import skinny_gemm
    y = skinny_gemm(x, w.t())          # x (M <= 16, K), w (N, K) nn.Linear weights: y = x @ w.T
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, cluster, gpu, nvvm, vector
from flydsl.expr.vector import Vector
from flydsl.kernels.gemm.epilogue import Epilogue, EpilogueTensors, apply_epilogue

__all__ = [
    "MAX_M",
    "SkinnyConfig",
    "SkinnyVariant",
    "choose_skinny_config",
    "skinny_gemm_kernel",
    "skinny_gemm_scaled_kernel",
]

MAX_M = 16  # rows of one m16n8k16 MMA
_ACC = Vector.of(fx.Float32, 4)
_WORDS = Vector.of(fx.Int32, 4)


@dataclass(frozen=True, kw_only=True)
class SkinnyConfig:
    """``groups`` n8 tiles (8 weight rows each) per warp, ``warps`` warps per CTA, ``unroll`` 16-byte loads per
    weight row per warp and step (32 K values each), ``splits`` CTAs splitting K; checked when built. The defaults
    are :func:`choose_skinny_config`'s for M <= 8."""

    groups: int = 2
    warps: int = 8
    unroll: int = 4
    splits: int = 1
    prefetch: int | None = 256  # L2 prefetch size (bytes) of the weight loads, or None
    pipelined: bool = True  # registers for two steps: the next step's loads are in flight during the MMAs
    min_blocks: int | None = None  # CTAs per SM to fit (caps registers; None: ptxas decides)
    warps_n: int = 1  # warps side by side along N (each its own groups; they share activation loads through L1)
    # fp8 weights with 16-bit activations: a step's MMAs start once all its activations have landed (_landed), so
    # that ptxas issues their loads together rather than each chunk's by its MMAs (one L2 round trip per chunk)
    landed: bool = False
    # CTAs of a cluster (along x) sharing the weight rows and splitting their K range, summed through distributed
    # shared memory by the cluster's first CTA: twice the CTAs for the same rows (a wave's tail spread thinner) with
    # no second launch (the plain kernels; not with splits)
    cluster_k: int = 1

    def __post_init__(self):
        if self.groups not in (1, 2, 4, 8) or self.warps not in (1, 2, 4, 8, 16) or self.unroll not in (1, 2, 4, 8):
            raise ValueError(f"{self}: groups 1/2/4/8, warps 1/2/4/8/16 and unroll 1/2/4/8")
        if not isinstance(self.splits, int) or not 1 <= self.splits <= 64:
            raise ValueError(f"{self}: splits must be an int in 1..64")
        if self.warps_n not in (1, 2, 4) or self.warps % self.warps_n:
            raise ValueError(f"{self}: warps_n must be 1, 2 or 4 and divide warps")
        if self.prefetch not in (None, 64, 128, 256):
            raise ValueError(f"{self}: prefetch must be None, 64, 128 or 256")
        # (clusters of 4 measured correct back to back and under compute-sanitizer, but failed with an unspecified
        # launch failure between do_bench's L2 flushes at 1 x 7168 x 2048 on an H100: not understood, not offered)
        if self.cluster_k not in (1, 2) or (self.cluster_k > 1 and self.splits > 1):
            raise ValueError(f"{self}: cluster_k must be 1 or 2, and 1 where K is split over launches (splits)")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows(self) -> int:
        """Weight rows (output columns) per CTA."""
        return 8 * self.groups * self.warps_n

    @property
    def warps_k(self) -> int:
        """Warps splitting K (those of one column of warps along N)."""
        return self.warps // self.warps_n

    @property
    def step(self) -> int:
        """K values of 16-bit operands a CTA consumes per step (all its warps)."""
        return self.k_step(2)

    def k_step(self, element_bytes: int) -> int:
        """K values a CTA consumes per step for operands of ``element_bytes`` (fp8: twice as many as 16-bit)."""
        return 4 * (16 // element_bytes) * self.unroll * self.warps_k


class SkinnyVariant(NamedTuple):
    """What :func:`skinny_gemm_kernel` is specialized on besides its configuration: ``vector_loads`` (rows 16-byte
    aligned and K % 8 == 0: 16-byte loads), the :class:`~flydsl.kernels.gemm.epilogue.Epilogue` (no scales, stored
    from registers), ``two_halves`` (M > 8: rows 8..15 of the MMA are loaded, else zeros) and ``prepared`` (``w`` is
    prepared fp8 weights, the (K / 128, N, 128) panels of :mod:`~flydsl.kernels.gemm.prepared`)."""

    vector_loads: bool
    epilogue: Epilogue
    two_halves: bool
    prepared: bool = False


def _load_words(
    t, row, k, k_extent, vec: bool, masked: bool, l1, prefetch=None, prepared: bool = False, coherent: bool = False
):
    """This lane's 16 bytes ``t[row, k ..]`` (8 16-bit or 16 fp8 elements) as 4 words; zeros where past
    ``k_extent`` when ``masked``. fp8 operands take 16-byte loads only (``vec``: memory holds no fp8 scalars).
    ``prepared``: ``t`` is prepared weights' panels, element (row, k) at ``t[k // 128, row, k % 128]``.
    ``coherent``: ``t`` is written by other CTAs of the same launch, read through L2 (``ld.global.cg``, not the
    non-coherent path, which holds only data read-only for the kernel's lifetime)."""
    if fx.const_expr(vec):
        at = lambda k: (k // 128, row, k % 128) if fx.const_expr(prepared) else (row, k)  # noqa: E731

        def load(coord):
            if fx.const_expr(coherent):
                return nvvm.ld_global(t, coord, 16, cop="cg")
            return nvvm.ld_global_nc(t, coord, 16, l1=l1, prefetch=prefetch)

        if fx.const_expr(masked):  # chunks are whole (K a multiple of a chunk): in or out together; row start when out
            inside = k < k_extent
            return arith.select(inside, load(at(arith.select(inside, k, 0))), _WORDS(0))
        return load(at(k))
    elements = []
    for j in fx.range_constexpr(8):  # unaligned rows: one element at a time, each masked
        inside = k + j < k_extent
        value = t[row, arith.select(inside, k + j, 0)]
        elements.append(arith.select(inside, value, t.dtype(0.0)))
    return vector.from_elements(vector.vector_class(t.dtype, 8), elements).bitcast(fx.Int32)


class _WarpStreams(NamedTuple):
    """What a warp's loads read: ``a`` and ``w``, its weight rows (``rows_w``: one per group) and activation rows
    (``row_a0``: q, ``row_a1``: q + 8, clamped into M), K's extent, the configuration, this lane's 8-element chunk
    of K (``lane_t``: lane % 4), and the variant's ``vec`` and ``two_halves``."""

    a: object
    w: object
    rows_w: list
    row_a0: object
    row_a1: object
    k_extent: object
    cfg: SkinnyConfig
    lane_t: object
    vec: bool
    two_halves: bool
    prepared: bool
    block_scales: object = None  # fp8 weights' (rows / 128, ceil(K / 128)) scales, or None
    coherent: bool = False  # the activations are written by other CTAs of the launch (:func:`_load_words`)


def _loads(streams: _WarpStreams, kbase, masked: bool):
    """A warp's loads of one step: ``unroll`` chunks of 4 lanes' 16 bytes of K (32 16-bit or 64 fp8 values) from
    ``kbase``, for each the ``groups`` weight words, then the activation words (rows q and q + 8; zeros for the latter
    when M <= 8). fp8 weights with 16-bit activations (:func:`_wide`): the weight words only (the activations:
    :func:`_activation_loads`)."""
    a, w, rows_w, row_a0, row_a1, k_extent, cfg, lane_t, vec, two_halves, prepared = streams[:11]
    chunk = 16 // (w.dtype.width // 8)  # elements of one lane's 16 bytes
    wide = _wide(a, w)
    words = []
    for u in fx.range_constexpr(cfg.unroll):
        k = kbase + 4 * chunk * u + chunk * lane_t
        for g in fx.range_constexpr(cfg.groups):
            load = _load_words(w, rows_w[g], k, k_extent, vec, masked, "no_allocate", cfg.prefetch, prepared)
            words.append(load)
        if fx.const_expr(not wide):  # (wide: the activations are loaded as the MMAs take them)
            coherent = streams.coherent
            words.append(_load_words(a, row_a0, k, k_extent, vec, masked, None, coherent=coherent))
            words.append(
                _load_words(a, row_a1, k, k_extent, vec, masked, None, coherent=coherent) if two_halves else _WORDS(0)
            )
    return words


def _activation_loads(streams: _WarpStreams, kbase, masked: bool, u: int) -> list:
    """fp8 weights with 16-bit activations: chunk ``u``'s activation words of a step from ``kbase`` (the 16 values of
    K of the lane's weight load: two loads per row, rows q and q + 8; K a multiple of 16, so k + 8 is inside where k
    is), as 8 words per row."""
    a, k_extent, lane_t = streams.a, streams.k_extent, streams.lane_t
    k = kbase + 64 * u + 16 * lane_t
    rows = []
    for row in (streams.row_a0, streams.row_a1):
        loads = [
            _load_words(a, row, k + half, k_extent, True, masked, None, coherent=streams.coherent) for half in (0, 8)
        ]
        rows.append([load[j] for load in loads for j in range(4)])
    return rows


_SCALE_BLOCK = 128  # fp8 block scales' rows and K values


def _wide(a, w) -> bool:
    """fp8 weights with 16-bit activations (weight-only fp8): 16 weights per load, converted to 16-bit in registers."""
    return w.dtype.width == 8 and a.dtype.width == 16


def _chunks_per_block(cfg: SkinnyConfig) -> int:
    """Chunks (64 fp8 values of K per row: 4 lanes' loads) per 128-wide K block of the block scales; a step's K range
    starts on a block (its chunks come in pairs) unless ``unroll`` is 1 (then each chunk is half a block's)."""
    return 2 if cfg.unroll > 1 else 1


def _mmas(words, accs, cfg, dtype):
    """The MMAs of one step's words (from :func:`_loads`): two MMAs per chunk and group (k16; k32 for fp8: the
    fragments' registers hold 4 elements, the same lanes and rows)."""
    accs = list(accs)
    per_chunk = cfg.groups + 2
    for u in fx.range_constexpr(cfg.unroll):
        low, high = words[u * per_chunk + cfg.groups], words[u * per_chunk + cfg.groups + 1]
        for s in fx.range_constexpr(2):  # words 2s, 2s+1 of every load: one k16 MMA
            frag_a = vector.from_elements(_WORDS, [low[2 * s], high[2 * s], low[2 * s + 1], high[2 * s + 1]])
            for g in fx.range_constexpr(cfg.groups):
                b_words = words[u * per_chunk + g]
                frag_b = vector.from_elements(Vector.of(fx.Int32, 2), [b_words[2 * s], b_words[2 * s + 1]])
                accs[g] = nvvm.mma_sync(frag_a, frag_b, accs[g], dtype=dtype)
    return accs


def _landed(word, others):
    """``word``, unchanged, but as a value that exists only once every word of ``others`` has arrived, so that the
    loads of ``others`` are issued before whatever takes the result: ``word + (sum of others) * outside``, where
    ``outside`` (``blockIdx.z >= gridDim.z``) is 0 in every launch but not known to be by LLVM or ptxas (identities
    such as ``umin(w, w | x) = w`` are folded away, and a xor of equal loads cancels)."""
    chain = others[0]
    for other in others[1:]:
        chain = chain + other
    outside = arith.select(gpu.block_idx.z >= gpu.grid_dim.z, fx.Int32(1), fx.Int32(0))
    return word + chain * outside


def _mmas_wide(words, accs, streams: _WarpStreams, kbase, masked: bool, dtype, block: bool):
    """:func:`_mmas` for fp8 weights with 16-bit activations (``words`` from :func:`_loads` at ``kbase``; each chunk's
    activations loaded here, as its MMAs take them: :func:`_activation_loads`, from L1 or L2, so that only the
    weights are held for the next step): each weight word j (e4m3 values 4j .. 4j + 3 of the lane's 16 of K) becomes
    two 16-bit words (exactly: ``nvvm.unpack_e4m3x4``), the B fragment registers of the same K values as the A
    fragment's activation words 2j, 2j + 1 (of the row's two loads, 8 words): words 2s, 2s + 1 make k16 MMA s, four
    MMAs per load and group, K permuted alike for both operands. ``block``: each K block's MMAs go to accumulators of
    their own, added to the sums times the block's scale (one fp32 multiply-add each: the products are exact, so
    the scaled sums round in fp32 only)."""
    cfg = streams.cfg
    accs = list(accs)
    per_block = _chunks_per_block(cfg)
    at, parts, scales = 0, None, None
    # every chunk's activations issued before the step's first MMA: one L2 round trip per step, not one per chunk
    activations = [_activation_loads(streams, kbase, masked, u) for u in range(cfg.unroll)]
    if fx.const_expr(cfg.landed):
        first = activations[0][0]
        first[0] = _landed(first[0], [row[j] for rows in activations for row in rows for j in (0, 4)])
    for u in fx.range_constexpr(cfg.unroll):
        weights = words[at : at + cfg.groups]
        low, high = activations[u]  # rows q and q + 8: K 16t .. 16t + 15
        at += cfg.groups
        if fx.const_expr(block and u % per_block == 0):  # a K block's first chunk: its scales (a group's 8 rows lie
            table = streams.block_scales  # in one 128-row block), in flight during the block's MMAs
            k_block = arith.minimum((kbase + 64 * u) // _SCALE_BLOCK, table.shape[1].to(fx.Int32) - 1)
            scales = [table[streams.rows_w[g] // _SCALE_BLOCK, k_block] for g in range(cfg.groups)]
            parts = [_ACC(0.0)] * cfg.groups
        frags_a = [
            vector.from_elements(_WORDS, [low[2 * s], high[2 * s], low[2 * s + 1], high[2 * s + 1]]) for s in range(4)
        ]
        sums = parts if block else accs
        for g in fx.range_constexpr(cfg.groups):  # (a group's words converted as its MMAs take them)
            frag_b = [half for j in range(4) for half in nvvm.unpack_e4m3x4(weights[g][j], dtype)]  # K 16t .. +15
            for s in fx.range_constexpr(4):  # 16-bit words 2s, 2s + 1: K 4s .. 4s + 3 of the lane's 16
                pair = vector.from_elements(Vector.of(fx.Int32, 2), frag_b[2 * s : 2 * s + 2])
                sums[g] = nvvm.mma_sync(frags_a[s], pair, sums[g], dtype=dtype)
        if fx.const_expr(block and u % per_block == per_block - 1):
            for g in fx.range_constexpr(cfg.groups):
                accs[g] = vector.from_elements(_ACC, [accs[g][e] + parts[g][e] * scales[g] for e in range(4)])
    return accs


@flyc.kernel(dependent_launch=True)
def skinny_gemm_kernel(
    a: fx.Tensor, w: fx.Tensor, c: fx.Tensor, bias: fx.Tensor, cfg: fx.Constexpr, variant: fx.Constexpr
):
    """``c = epilogue(a @ w^T)`` for a (M <= 16, K) and w (N, K), both K-contiguous (or w prepared weights' panels);
    ``variant`` a :class:`SkinnyVariant`. With ``cfg.splits`` > 1, ``c`` is the (splits * M, N) fp32 partials (no
    epilogue: ``bias`` unread; :func:`~flydsl.kernels.gemm.partials.split_k_reduce` applies it)."""
    epilogue = variant.epilogue
    if epilogue.scales or epilogue.store != "registers":
        raise ValueError(f"skinny_gemm_kernel: expected an epilogue without scales, stored from registers: {epilogue}")
    _skinny_gemm(a, w, c, EpilogueTensors(bias=bias if epilogue.bias else None), cfg, variant)


@flyc.kernel(dependent_launch=True, target=flyc.Target("sm_90a", ptx_version=84))  # PTX ISA 8.4: mma.sync on fp8
def skinny_gemm_scaled_kernel(
    a: fx.Tensor,
    w: fx.Tensor,
    c: fx.Tensor,
    bias: fx.Tensor,
    scale_0: fx.Tensor,
    scale_1: fx.Tensor,
    cfg: fx.Constexpr,
    variant: fx.Constexpr,
):
    """:func:`skinny_gemm_kernel` with one or two float32 scales in the epilogue (``variant.epilogue.scales``: e.g.
    fp8's per-token and per-channel scales), no split K (``cfg.splits == 1``): ``a`` and ``w`` may be fp8 (one
    dtype, 16-byte loads)."""
    epilogue = variant.epilogue
    if not 1 <= len(epilogue.scales) <= 2 or epilogue.store != "registers" or cfg.splits != 1:
        raise ValueError(f"skinny_gemm_scaled_kernel: expected one or two scales and no split K: {epilogue}, {cfg}")
    scales = (scale_0, scale_1)[: len(epilogue.scales)]
    _skinny_gemm(a, w, c, EpilogueTensors(bias if epilogue.bias else None, scales), cfg, variant)


def _skinny_gemm(a, w, c, tensors: EpilogueTensors, cfg: SkinnyConfig, variant: SkinnyVariant) -> None:
    """The skinny kernels' body (their docstrings)."""
    vec, epilogue, two_halves, prepared = variant
    if prepared and not vec:
        raise ValueError(f"skinny kernel: prepared weights take 16-byte loads, got {variant}")
    tid, warp_n, warp_kk, lane, lane_t, lane_q = _kernel_start(cfg)
    m_extent = a.shape[0].to(fx.Int32)
    n_extent = c.shape[1].to(fx.Int32)
    k_extent = a.shape[1].to(fx.Int32)
    rank = gpu.block_idx.x % cfg.cluster_k  # this CTA's part of the tile's K (a cluster along x: its rank)
    n0 = gpu.block_idx.x // cfg.cluster_k * cfg.rows
    # Rows past N read row N - 1 and rows past M row M - 1: their results land in columns / rows never stored.
    first_row = n0 + warp_n * (8 * cfg.groups) + lane_q
    rows_w = [arith.minimum(first_row + 8 * g, n_extent - 1) for g in range(cfg.groups)]
    row_a0 = arith.minimum(lane_q, m_extent - 1)
    row_a1 = arith.minimum(lane_q + 8, m_extent - 1)

    step = cfg.k_step(w.dtype.width // 8)
    steps = (k_extent + (step - 1)) // step
    full = k_extent // step  # steps with no K tail
    parts, part = (cfg.cluster_k, rank) if cfg.cluster_k > 1 else (cfg.splits, gpu.block_idx.y)
    if fx.const_expr(parts == 1):
        begin, end = fx.Int32(0), steps
    else:
        per_part = (steps + (parts - 1)) // parts
        begin = arith.minimum(part * per_part, steps)
        end = arith.minimum(begin + per_part, steps)
    full_end = arith.maximum(arith.minimum(end, full), begin)  # an empty split (begin == end) has no tail step
    accs = [_ACC(0.0)] * cfg.groups
    warp_k = warp_kk * (step // cfg.warps_k)
    # Launched as a dependent (programmatic dependent launch), the kernel may start before the previous one ends:
    # nothing is read before the wait (every load's row depends on its zero, so that none moves above it), nor is c
    # written (docs/tuning/gemm.md#skinny-dependent-launch).
    after_wait = nvvm.griddepcontrol_wait()
    row_a0, row_a1 = row_a0 + after_wait, row_a1 + after_wait
    rows_w = [row + after_wait for row in rows_w]
    streams = _WarpStreams(a, w, rows_w, row_a0, row_a1, k_extent, cfg, lane_t, vec, two_halves, prepared)
    if fx.const_expr(cfg.pipelined):  # the next step's loads are issued before this step's MMAs
        if begin < full_end:
            words = _loads(streams, begin * step + warp_k, False)
            for it in range(begin + 1, full_end):
                upcoming = _loads(streams, it * step + warp_k, False)
                accs = _mmas(words, accs, cfg, a.dtype)
                words = upcoming
            accs = _mmas(words, accs, cfg, a.dtype)
    else:
        for it in range(begin, full_end):
            words = _loads(streams, it * step + warp_k, False)
            accs = _mmas(words, accs, cfg, a.dtype)
    if full_end < end:  # the step with the K tail (the last one)
        words = _loads(streams, full_end * step + warp_k, True)
        accs = _mmas(words, accs, cfg, a.dtype)

    partial = _warp_partials(accs, cfg, warp_kk, warp_n, lane, rank)
    # Thread i sums output elements i, i + threads, ... of the CTA's 16 x rows block (row-major over the block).
    for rep in fx.range_constexpr(-(-16 * cfg.rows // cfg.threads)):
        index = arith.minimum(tid + rep * cfg.threads, 16 * cfg.rows - 1)  # threads past the block repeat its end
        row, col = index // cfg.rows, index % cfg.rows
        out_col = n0 + col
        total = _warp_total(partial, cfg, row, col)
        if (tid + rep * cfg.threads < 16 * cfg.rows) & (row < m_extent) & (out_col < n_extent) & (rank == 0):
            if fx.const_expr(cfg.splits == 1):
                c[row, out_col] = apply_epilogue(total, epilogue, tensors, row, out_col).to(c.dtype)
            else:
                c[gpu.block_idx.y * m_extent + row, out_col] = total


def _kernel_start(cfg: SkinnyConfig, trigger: bool = True) -> tuple:
    """A skinny kernel's attributes (threads, CTAs per SM) and (``trigger``) its dependents' launch (the next kernel
    may take SMs as this grid's last CTAs start; else the caller triggers it); returns the thread's ``(tid, warp_n,
    warp_kk, lane, lane_t, lane_q)``: its column of warps along N, its warp along K, its lane and the lane's
    (``lane % 4``, ``lane // 4``)."""
    cluster = (cfg.cluster_k, 1, 1) if cfg.cluster_k > 1 else None
    flyc.set_kernel_attributes(threads=cfg.threads, min_blocks_per_sm=cfg.min_blocks, cluster=cluster)
    if fx.const_expr(trigger):
        nvvm.griddepcontrol_launch_dependents()
    tid = gpu.thread_idx.x
    warp, lane = tid // 32, tid % 32
    return tid, warp % cfg.warps_n, warp // cfg.warps_n, lane, lane % 4, lane // 4


def _warp_partials(accs, cfg: SkinnyConfig, warp_kk, warp_n, lane, rank=None):
    """The K-warps' accumulators in shared memory, (K-warp, n8 tile of the CTA, element, lane), lanes contiguous (no
    bank conflicts), after the CTA's barrier. With ``cfg.cluster_k`` > 1, every CTA of the cluster (``rank``) writes
    its K-warps' into the first CTA's, after them in K-warp order, and the barrier is the cluster's."""
    smem = fx.SmemAllocator()
    tiles = cfg.groups * cfg.warps_n
    slots = cfg.warps_k * cfg.cluster_k
    partial = smem.allocate(fx.Float32, fl.Layout((slots, tiles, 4, 32), (tiles * 128, 128, 32, 1)))
    for g in fx.range_constexpr(cfg.groups):
        for e in fx.range_constexpr(4):
            where = (warp_kk, warp_n * cfg.groups + g, e, lane)
            if fx.const_expr(cfg.cluster_k == 1):
                partial[where] = accs[g][e]
            else:
                cluster.store_peer(accs[g][e], partial, 0, coord=(rank * cfg.warps_k + warp_kk, *where[1:]))
    if fx.const_expr(cfg.cluster_k == 1):
        gpu.barrier()
    else:  # (the other CTAs may exit after it: nothing reads their shared memory)
        cluster.sync()
    return partial


def _warp_total(partial, cfg: SkinnyConfig, row, col):
    """Element (row, col) of the CTA's 16 x rows block: the sum of its K-warps' accumulators (mma.sync's layout:
    row r, column 8g + j in lane 4 (r % 8) + j // 2, element 2 (r // 8) + j % 2 of n8 tile g)."""
    g, within = col // 8, col % 8
    source_lane = (row % 8) * 4 + within // 2
    element = (row // 8) * 2 + within % 2
    total = partial[0, g, element, source_lane]
    for v in fx.range_constexpr(1, cfg.warps_k * cfg.cluster_k):
        total = total + partial[v, g, element, source_lane]
    return total


@functools.cache
def choose_skinny_config(m: int, n: int, k: int, sms: int, element_bytes: int = 2) -> SkinnyConfig:
    """M <= 8: 16 weight rows per CTA, 8 warps, 4 loads per row and step, double-buffered, 256-byte L2 prefetches.
    M > 8 loads two activation rows per lane: 32 weight rows per CTA and 2 loads per step where that still gives
    every SM a CTA, else the default at 2 CTAs per SM where there are more CTAs than SMs. K is split over CTAs only
    when fewer than half the SMs would have a CTA (docs/tuning/gemm.md#skinny). ``k`` counts 16-bit values (an fp8 K
    is passed halved). fp8 (``element_bytes`` 1), measured apart: rows of at most 2 KB take steps of 512 bytes (4
    warps, 2 loads: whole steps, more of them in flight), 32 rows per CTA only where that leaves 2 CTAs per SM;
    longer rows take one n8 tile (8 weight rows) per CTA, 4 warps x 4 loads for M <= 8 and 8 warps x 2 loads above
    (every configuration timed on issue 32's ten (N, K) at M 1 and 16 on an H100: 3% faster geomean than 2-4 tiles
    per warp, up to 12%, e.g. 16 x 18432 x 7168; docs/tuning/gemm.md#skinny)."""
    cfg = SkinnyConfig()
    if element_bytes == 1 and k <= 1024:
        cfg = SkinnyConfig(groups=4 if m > 8 and -(-n // 32) >= 2 * sms else 2, warps=4, unroll=2)
    elif element_bytes == 1:
        cfg = SkinnyConfig(groups=1, warps=4, unroll=4) if m <= 8 else SkinnyConfig(groups=1, warps=8, unroll=2)
    elif m > 8 and -(-n // 32) >= sms:
        cfg = SkinnyConfig(groups=4, unroll=2)
    elif m > 8 and -(-n // cfg.rows) > sms:
        cfg = SkinnyConfig(min_blocks=2)
    ctas = -(-n // cfg.rows)
    if element_bytes == 1 and sms // 2 <= ctas < 2 * sms and k >= 2 * cfg.step:
        # fewer CTAs than two per SM: clusters of 2 split each tile's K (e.g. 1536 x 7168: 192 CTAs, 1.45 per SM)
        return dataclasses.replace(cfg, cluster_k=2)
    splits = 1
    while ctas * splits < sms // 2 and splits * 2 * cfg.step <= k and splits < 16:
        splits *= 2
    return dataclasses.replace(cfg, splits=splits)
