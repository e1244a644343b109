"""The GEMM epilogue (:mod:`flydsl.kernels.gemm`'s kernels): a consumer warpgroup's fp32 accumulators through
``+ bias`` and the activation, converted to C's dtype and stored, from registers (bounds-checked where a tile crosses
C's edge) or through shared-memory staging boxes and TMA stores."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import arith, nvvm, vector, wgmma
from flydsl.kernels.gemm_config import STAGING_BOX, staging_wait

__all__ = ["ACTIVATIONS", "apply_epilogue", "store_accumulators"]

ACTIVATIONS = (None, "relu", "gelu", "silu")
_SQRT_HALF = 0.7071067811865476


def apply_epilogue(x, bias, col, activation):
    """The epilogue of one fp32 accumulator element of column ``col``: ``+ bias[col]``, then the activation."""
    if fx.const_expr(bias is not None):
        x = x + bias[col].to(fx.Float32)
    return _activate(x, activation)


def _activate(x, activation):
    """One of ACTIVATIONS on an fp32 value (gelu as torch's default, with erf)."""
    if fx.const_expr(activation == "relu"):
        x = arith.maximum(x, fx.Float32(0.0))
    if fx.const_expr(activation == "gelu"):
        x = x * 0.5 * (fx.math.erf(x * _SQRT_HALF) + 1.0)
    if fx.const_expr(activation == "silu"):
        x = x / (fx.math.exp(-x) + 1.0)
    return x


def _finished_tile(acc, c, bias, activation, col0, lane, n: int):
    """This thread's values of one 64 x n accumulator block (wgmma's layout: element ``2p + e`` lies in column
    ``col0 + 8 (p // 2) + 2 (lane % 4) + e``) through the epilogue, in C's dtype: computed once, however they are
    stored, as a Vector. Each bias element is read once per thread, at a column clamped into the tensor (values past
    N are computed but never stored)."""
    if fx.const_expr(bias is None and activation is None):
        return acc.to(c.dtype)
    last = c.shape[1].to(fx.Int32) - 1
    values = []
    for p in fx.range_constexpr(n // 4):
        col = col0 + 8 * (p // 2) + 2 * (lane % 4)
        if fx.const_expr(p % 2 == 0 and bias is not None):  # rows r and r + 8 share their two columns
            pair = [bias[arith.minimum(col + e, last)].to(fx.Float32) for e in (0, 1)]
        for e in fx.range_constexpr(2):
            x = acc[2 * p + e] if bias is None else acc[2 * p + e] + pair[e]
            values.append(_activate(x, activation).to(c.dtype))
    return vector.from_elements(vector.vector_class(c.dtype, len(values)), values)


def _store_tile(values, c, row0, col0, full: bool, lane, warp, n: int):
    """Stores this thread's finished values of one 64 x n block (:func:`_finished_tile`) into C at (row0, col0);
    ``full``: the block lies inside C, no bounds checks."""
    m_extent = c.shape[0].to(fx.Int32)
    n_extent = c.shape[1].to(fx.Int32)
    for p in fx.range_constexpr(n // 4):
        row = row0 + 16 * warp + lane // 4 + 8 * (p % 2)
        col = col0 + 8 * (p // 2) + 2 * (lane % 4)
        first, second = values[2 * p], values[2 * p + 1]
        if fx.const_expr(full):  # one 2-element store where C's rows are aligned for it (col is even)
            vector.store(vector.from_elements(vector.vector_class(c.dtype, 2), [first, second]), c, (row, col))
        else:  # each element only where it lies inside C
            if row < m_extent:
                if col < n_extent:
                    c[row, col] = first
                if col + 1 < n_extent:
                    c[row, col + 1] = second


def store_accumulators(accs, c, bias, activation, cfg, tm, tn, consumer, lane, warp, tma=None):
    """Stores a consumer's accumulators of tile (tm, tn) into C through the epilogue: from registers, bounds-checked
    only where the tile crosses C's edge, or with ``tma`` (C's descriptor and the consumers' staging boxes)
    through shared memory and TMA stores."""
    rows = cfg.consumer_rows
    row0 = tm * cfg.tile_m + (0 if cfg.schedule == "pingpong" else consumer * rows)
    col0 = tn * cfg.tile_n
    inside = (row0 + rows <= c.shape[0].to(fx.Int32)) & (col0 + cfg.tile_n <= c.shape[1].to(fx.Int32))
    finished = [_finished_tile(accs[mi], c, bias, activation, col0, lane, cfg.tile_n) for mi in range(rows // 64)]
    if fx.const_expr(bias is None and activation is None):
        # Converted (and packed, for 16-bit C) all at once, right after the MMAs' wait. Where LLVM sinks some of the
        # conversions into a later block (past a bounds check, or a TMA store's branch), ptxas serializes every
        # wgmma of the kernel (C7514 "non wgmma instructions reading accumulator registers"): it did for tile widths
        # that are not a power of two, 128 x 192 included (ncu: 74% tensor-pipe activity against cuBLAS's 86%). With
        # a bias or an activation the values stay unpinned: computed all at once they spill, and ptxas kept those
        # epilogues' wgmma pipelined.
        finished = wgmma.fence_operands(finished)
    for mi in fx.range_constexpr(rows // 64):
        r0 = row0 + 64 * mi
        values = finished[mi]
        if fx.const_expr(tma is not None):
            _store_tile_tma(values, c, *tma, cfg.store_boxes, r0, col0, consumer, lane, warp, cfg.tile_n)
        else:
            if inside:
                _store_tile(values, c, r0, col0, True, lane, warp, cfg.tile_n)
            else:
                _store_tile(values, c, r0, col0, False, lane, warp, cfg.tile_n)


# The TMA-store epilogue: all CTAs reach their epilogues together, and 132 CTAs storing 64 KB tiles from registers
# wait for HBM (ncu on the H200: 76% tensor-pipe activity at 2048x4096x4096 against cuBLAS's 88%). Written into
# shared memory instead, a tile leaves through TMA while the consumers go on with the next tile's MMAs; TMA also
# clips the tile at C's edges. Each consumer stages 64 x 64 parts in two 128B-swizzled boxes, alternately (or in one,
# each part waiting for the previous part's store to have read it: cfg.store_boxes = 1 leaves 16 KB more for stages).
_STAGING_COLUMNS = STAGING_BOX[1]


def _store_tile_tma(values, c, c_store, staging, boxes: int, row0, col0, consumer, lane, warp, n: int):
    """Stores this thread's finished 16-bit values of one 64 x n block (:func:`_finished_tile`) at (row0, col0)
    through the consumer's ``boxes`` staging boxes: per 64-column part, ``stmatrix`` (4 x4 per warp: its 16 rows x
    8-column blocks) into a box whose previous TMA store has read it, a proxy fence and the warpgroup's barrier,
    then one thread's TMA store (its bulk group)."""
    t = lane + 32 * warp
    for part in fx.range_constexpr(n // _STAGING_COLUMNS):
        box = staging[None, None, boxes * consumer + part % boxes]
        wait = staging_wait(part, n // _STAGING_COLUMNS, boxes)
        if t == 0:
            fx.tma.wait_group(wait, read=True)  # the box's last store has read it
        nvvm.barrier(1 + consumer, 128)
        for q in fx.range_constexpr(_STAGING_COLUMNS // 16):  # column blocks 2q and 2q + 1, each in two row halves
            matrices = [(2 * q + i // 2, i % 2) for i in range(4)]  # (8-column block, row half) of matrix i
            elements = []
            for block, half in matrices:
                p = 2 * (_STAGING_COLUMNS // 8 * part + block) + half  # wgmma's value pair of that block and half
                elements += [values[2 * p], values[2 * p + 1]]
            block, half = 2 * q + lane // 16, (lane // 8) % 2  # the matrix whose row this lane addresses
            where = (16 * warp + 8 * half + lane % 8, 8 * block)
            nvvm.stmatrix(box, vector.from_elements(vector.vector_class(c.dtype, 8), elements), where)
        nvvm.fence_proxy_async("shared")
        nvvm.barrier(1 + consumer, 128)
        if t == 0:
            c_store.store(box, (row0, col0 + _STAGING_COLUMNS * part))
            fx.tma.commit_group()
