"""How a block-scaled fp8 GEMM's scales reach its promoting consumers: through the pipeline's slots, beside A and B.

The scales are float32, one per row of A and 128-wide block of K (``a_scales`` (M, ceil(K / 128)), any strides:
row-major as users hold them, or M-major as :func:`~flydsl.kernels.quantize.quantize_fp8` writes them) and one per
128 x 128 block of B (``b_scales`` (ceil(N / 128), ceil(K / 128))). Each pipeline slot holds, besides its operand
tiles, the scales of its K step: the ``tile_m`` A scales of the tile's rows and the B scales of the tile's blocks of
columns::

    slot s:  [ a[row0 + 0, kb] ... a[row0 + tile_m - 1, kb] | b[column_block, kb] ... | pad ]   (tile_m + 4 floats)

A tile 64 or 128 wide lies in one block of columns: one B scale. A 192-wide tile straddles two
(:func:`b_scale_blocks`): ``b[n0 // 128, kb]`` and the next block's, and where the second begins depends on the
tile: 128 columns in for the even tiles (n0 = 384 j), 64 for the odd ones (n0 = 384 j + 192). A gated grouped GEMM's
tile (a mixture of experts' first stage) takes its B rows from two blocks, the gate rows and the up rows: it holds
two B scales, ``b[gate_block, kb]`` and ``b[up_block, kb]``, each for its half of the columns.

The producer's warp fills them (:func:`copy_step_scales`): while its lane 0 issues the slot's TMA loads, each lane
copies its rows' scales with 4-byte ``cp.async`` and arrives on the slot's ``full`` barrier once they have landed
(the barrier counts those 32 arrivals beside the TMA bytes and lane 0's arrival that arms them), so a consumer that
waited for the slot reads them from shared memory (:func:`step_factors`), once the pair's first MMAs are done. Why
so, and what loading them in the consumers or multiplying them in the producer cost: docs/tuning/blockscale.md
(#scales-in-slots, #when-consumers-read).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, nvvm

__all__ = [
    "BLOCK",
    "SCALE_PRODUCERS",
    "StagedScales",
    "allocate_scales",
    "b_scale_blocks",
    "tile_takes_blocks",
    "copy_step_scales",
    "slot_bytes",
    "step_factors",
]

BLOCK = 128  # the scale blocks: 1 x 128 of A (per row), 128 x 128 of B
SCALE_PRODUCERS = 32  # the producer warp's lanes: each arrives on a slot's full barrier once its copies landed


def slot_bytes(tile_m: int) -> int:
    """The shared memory one pipeline slot's scales take: ``tile_m`` A scales and up to 4 B scales (one per source
    block of the tile's B rows), padded to 16 bytes."""
    return (tile_m + 4) * 4


class StagedScales(NamedTuple):
    """The scales in global memory (``a``, ``b``) and their copies per slot in shared memory (``slots``:
    (tile_m + 4, stages) float32, the B scale at row ``tile_m``)."""

    a: object
    b: object
    slots: object
    tile_m: int


def allocate_scales(smem, a_scales, b_scales, tile_m: int, stages: int) -> StagedScales:
    """The scales' slots in ``smem`` for a pipeline of ``stages`` slots and tiles of ``tile_m`` rows."""
    layout = fl.Layout((tile_m + 4, stages), (1, tile_m + 4))
    return StagedScales(a_scales, b_scales, smem.allocate(fx.Float32, layout, alignment=16), tile_m)


def tile_takes_blocks(tile_n: int, sources: int = 1, grouped: bool = False, consumer_rows: int = 64) -> bool:
    """Whether tiles ``tile_n`` wide (of ``sources`` blocks of B rows: a gated tile's two) line up with the blocks of
    128 B rows: each source's rows dividing 128 (one B scale per source and step), or, dense and not gated, 192 wide
    (two B scales per step, :func:`b_scale_blocks`) with 64 rows per consumer (``consumer_rows``: the sums of 128
    rows beside a block's parts fill a consumer's registers at 128 columns)."""
    if tile_n == BLOCK + BLOCK // 2:
        return sources == 1 and not grouped and consumer_rows == 64
    return tile_n <= BLOCK and BLOCK % (tile_n // sources) == 0


def b_scale_blocks(tile_rows: int, sources: int) -> int:
    """The B scales a pipeline slot holds per K step for tiles of ``tile_rows`` B rows from each of ``sources`` blocks
    of rows: one per source block of a tile at most 128 wide (the gated tile's gate and up rows: one each), two for a
    192-wide tile (it straddles two blocks of 128)."""
    if sources > 1 or tile_rows <= BLOCK:
        return sources
    return 2


def copy_step_scales(scales: StagedScales, stage, work, kt, b_tiles, lane) -> None:
    """One lane's copies of K step ``kt``'s scales of a work unit into slot ``stage`` (once it is free): the A scales
    of rows ``lane, lane + 32, ...`` of the tile (rows past M read row M - 1: their outputs are never stored) and,
    lane ``i`` < :func:`b_scale_blocks`, the B scale of the tile's ``i``-th block of rows: of its ``i``-th source
    block (one, or a gated tile's gate rows and its up rows: :class:`~flydsl.kernels.gemm.operands.OperandTiles`),
    or of the ``i``-th block of 128 rows a 192-wide tile touches (past B's last block: the last one, whose columns are
    never stored), from the tile's first row of B (past ``work.b_row0``: a grouped GEMM's expert, whose rows start a
    block). The caller then has the lane arrive on the slot's ``full`` barrier with ``arrive_on_cp_async`` (counted
    once the copies have landed)."""
    a, b, slots, tile_m = scales
    last_row = a.shape[0].to(fx.Int32) - 1
    row0 = work.tile_m * tile_m
    for i in fx.range_constexpr(tile_m // 32):
        row = 32 * i + lane
        nvvm.cp_async(slots, a, 4, dst_coord=(row, stage), src_coord=(arith.minimum(row0 + row, last_row), kt))
    sources = b_tiles.sources
    for i in fx.range_constexpr(b_scale_blocks(b_tiles.tile_rows, sources)):
        if lane == i:
            b_row = work.tile_n * b_tiles.tile_rows
            if fx.const_expr(sources > 1):
                b_row = b_row + i * b_tiles.source_rows
            if fx.const_expr(not isinstance(work.b_row0, int)):
                b_row = b_row + work.b_row0
            block = b_row // BLOCK
            if fx.const_expr(sources == 1 and i > 0):  # the straddling tile's next block, within B
                block = arith.minimum(block + i, b.shape[0].to(fx.Int32) - 1)
            nvvm.cp_async(slots, b, 4, dst_coord=(tile_m + i, stage), src_coord=(block, kt))


def step_factors(scales: StagedScales, stage, rows: list, sources: int = 1, straddle=None) -> list:
    """The promotion factors of the K step in slot ``stage`` (read after waiting for it, before releasing it): for
    each of ``rows`` (the tile's rows this thread holds, from 0), ``a[row, kb] * b[block, kb]`` for each of the
    tile's ``sources`` blocks of B rows (a list per row). A 192-wide tile (``straddle``: whether its second block
    begins 128 columns in, a kernel Boolean) gets three factors per row, one per 64 columns: the first block's, the
    middle 64 columns' (the first block's or the second's) and the second block's."""
    slots = scales.slots
    if straddle is None:
        b_scales = [slots[scales.tile_m + i, stage] for i in range(sources)]
    else:
        first, second = slots[scales.tile_m, stage], slots[scales.tile_m + 1, stage]
        b_scales = [first, arith.select(straddle, first, second), second]
    return [[slots[row, stage] * b_scale for b_scale in b_scales] for row in rows]
