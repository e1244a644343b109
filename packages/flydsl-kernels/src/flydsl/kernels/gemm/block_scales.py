"""How a block-scaled fp8 GEMM's scales reach its promoting consumers: as factors in the pipeline's slots.

The scales are float32, one per row of A and 128-wide block of K (``a_scales`` (M, ceil(K / 128)), any strides:
row-major as users hold them, or M-major as :func:`~flydsl.kernels.quantize.quantize_fp8` writes them) and one per
128 x 128 block of B (``b_scales`` (ceil(N / 128), ceil(K / 128))). Each pipeline slot holds, besides its operand
tiles, the promotion factors of its K step, one per row of the tile (tiles are at most 128 wide and divide 128, so
one B scale covers the tile)::

    slot s:  [ a[row0 + 0, kb] * b[column_block, kb]  ...  a[row0 + tile_m - 1, kb] * b[column_block, kb] ]

The producer's warp fills them (:func:`load_step_scales`, :func:`store_step_factors`): each lane loads its rows' A
scales and the B scale before waiting for the slot to be free (the wait hides the loads' latency), stores the
products once it is, and arrives on the slot's ``full`` barrier (which counts those 32 arrivals beside the TMA bytes
and lane 0's arrival that arms them). A consumer that waited for the slot reads its rows' factors
(:func:`step_factors`) right after issuing the step's MMAs and uses them only in the promotion, after the MMAs are
done. Measured at 4096 x 7168 x 16384 against alternatives (docs/tuning/blockscale.md): the consumers loading the
scales from global memory cost 15% (ptxas places the first use of a loaded value among the next MMAs, which then
wait out an L2 round trip), reading the raw scales from the slot and multiplying them 8-10% (the products' shared
memory loads, slow while wgmma streams its operands, sit on the promotion's path).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
from flydsl.expr import arith

__all__ = [
    "BLOCK",
    "SCALE_PRODUCERS",
    "StagedScales",
    "allocate_scales",
    "load_step_scales",
    "slot_bytes",
    "step_factors",
    "store_step_factors",
]

BLOCK = 128  # the scale blocks: 1 x 128 of A (per row), 128 x 128 of B
SCALE_PRODUCERS = 32  # the producer warp's lanes: each arrives on a slot's full barrier once it stored its factors


def slot_bytes(tile_m: int) -> int:
    """The shared memory one pipeline slot's factors take: one float32 per row of the tile."""
    return tile_m * 4


class StagedScales(NamedTuple):
    """The scales in global memory (``a``, ``b``) and the factors per slot in shared memory (``slots``: (tile_m,
    stages) float32)."""

    a: object
    b: object
    slots: object
    tile_m: int


def allocate_scales(smem, a_scales, b_scales, tile_m: int, stages: int) -> StagedScales:
    """The factors' slots in ``smem`` for a pipeline of ``stages`` slots and tiles of ``tile_m`` rows."""
    return StagedScales(a_scales, b_scales, smem.allocate(fx.Float32, (tile_m, stages), alignment=16), tile_m)


def load_step_scales(scales: StagedScales, work, kt, tile_n: int, lane) -> list:
    """One producer lane's scales of K step ``kt`` of a work unit, loaded into registers: the A scales of rows
    ``lane, lane + 32, ...`` of the tile (rows past M read row M - 1: their outputs are never stored), then the
    tile's B scale."""
    a, b, _, tile_m = scales
    last_row = a.shape[0].to(fx.Int32) - 1
    row0 = work.tile_m * tile_m + lane
    rows = [arith.minimum(row0 + 32 * i, last_row) for i in range(tile_m // 32)]
    return [a[row, kt].to(fx.Float32) for row in rows] + [b[work.tile_n * tile_n // BLOCK, kt].to(fx.Float32)]


def store_step_factors(scales: StagedScales, stage, loaded: list, lane) -> None:
    """Stores one lane's factors (its rows' A scales times the B scale, :func:`load_step_scales`) into slot
    ``stage``; the lane then arrives on the slot's ``full`` barrier (release: the consumers see the stores)."""
    for i, a_scale in enumerate(loaded[:-1]):
        scales.slots[32 * i + lane, stage] = a_scale * loaded[-1]


def step_factors(scales: StagedScales, stage, rows: list) -> list:
    """The promotion factors of the K step in slot ``stage`` for ``rows`` (the tile's rows this thread holds, from
    0): read after waiting for the slot, before releasing it."""
    return [scales.slots[row, stage] for row in rows]
