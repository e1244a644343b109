"""The GEMM epilogue: what happens to the fp32 accumulators between the last MMA and C.

An :class:`Epilogue` describes it (a kernel's ``Constexpr``): the accumulators are multiplied by each of its float32
``scales`` (:class:`Scale`: one value, one per row, per column, per group of rows or columns, or per 2-D block of
C), then ``+ bias`` (one value per column), then the activation, all in float32, then converted to C's dtype and
stored: from registers (bounds-checked only where a tile crosses C's edge) or, with ``store="tma"``, through
shared-memory staging boxes and TMA stores. The tensors it reads travel as :class:`EpilogueTensors`.

    epilogue = Epilogue(scales=(Scale(rows=1), Scale(columns=1)), bias=True, activation="silu")
    # out[r, c] = silu(acc[r, c] * scale_a[r] * scale_b[c] + bias[c])

In kernels: :func:`apply_epilogue` (one element at a known (row, column): the reduction and skinny kernels),
:func:`store_accumulators` (a consumer warpgroup's wgmma accumulators of one tile), :func:`tma_store_staging` and
:func:`finish_stores` (the TMA store's staging boxes, and the wait for its last stores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import flydsl.expr as fx
from flydsl.expr import arith, nvvm, vector, wgmma
from flydsl.kernels.gemm.config import STAGING_BOX
from flydsl.kernels.validation import GEMM_ACTIVATIONS

__all__ = [
    "ACTIVATIONS",
    "Epilogue",
    "EpilogueTensors",
    "Scale",
    "TileStore",
    "apply_epilogue",
    "finish_stores",
    "staging_wait",
    "store_accumulators",
    "tma_store_staging",
]

ACTIVATIONS = GEMM_ACTIVATIONS  # (the validation layer checks the entry points' activation against it)
_SQRT_HALF = 0.7071067811865476


@dataclass(frozen=True, kw_only=True)
class Scale:
    """How a float32 scale tensor maps onto C: element (r, c) of C is multiplied by ``scale[r // rows]`` (``columns``
    None: a (ceil(M / rows),) tensor; ``rows=1``: one scale per row, e.g. fp8 activations' per-token scales),
    ``scale[c // columns]`` (``rows`` None: (ceil(N / columns),); ``columns=1``: per output channel),
    ``scale[r // rows, c // columns]`` (both: a 2-D tensor of blocks) or ``scale[0]`` (neither: one value, a
    (1,)-element tensor). ``experts`` (with ``columns=1`` only): a grouped GEMM's per-channel weight scales, one per
    row of its stacked experts' weights ((E * N,): ``scale[b_row0 + B row of c]``, the tile's expert's rows)."""

    rows: int | None = None
    columns: int | None = None
    experts: bool = False

    def __post_init__(self):
        for name, group in (("rows", self.rows), ("columns", self.columns)):
            if group is not None and (not isinstance(group, int) or group < 1):
                raise ValueError(f"{self}: {name} must be None or a positive int")
        if self.experts and (self.columns != 1 or self.rows is not None):
            raise ValueError(f"{self}: experts' scales are one per weight row: columns=1, no rows")

    @property
    def granularity(self) -> str:
        """ "tensor", "row", "column" or "block" (rows and columns both grouped)."""
        if self.rows is None:
            return "tensor" if self.columns is None else "column"
        return "row" if self.columns is None else "block"

    def shape(self, m: int, n: int) -> tuple:
        """The scale tensor's shape for an (m, n) output."""
        extents = [-(-m // self.rows)] if self.rows is not None else []
        extents += [-(-n // self.columns)] if self.columns is not None else []
        return tuple(extents) or (1,)

    def value(self, scale, row, col):
        """This scale's float32 value for element (``row``, ``col``) of C (kernel integers inside C)."""
        r = row if self.rows == 1 else row // self.rows if self.rows is not None else None
        c = col if self.columns == 1 else col // self.columns if self.columns is not None else None
        if r is None:
            return (scale[0] if c is None else scale[c]).to(fx.Float32)
        return (scale[r] if c is None else scale[r, c]).to(fx.Float32)


@dataclass(frozen=True, kw_only=True)
class Epilogue:
    """``C = activation(acc * scales... + bias)`` in float32, then stored in C's dtype: ``scales`` a tuple of
    :class:`Scale` (each multiplies, in order), ``bias`` whether a (N,) bias is added (in its own dtype, converted
    to float32), ``activation`` one of :data:`ACTIVATIONS` (gelu as torch's default, with erf), ``store`` "registers"
    or "tma" (through shared memory and TMA stores: 16-bit C with 16-byte aligned rows).

    ``gate`` (an activation): the gated linear unit of a mixture of experts' first stage. Each tile's left half of
    columns is the gate, its right half the matching up columns (B's tiles are loaded that way:
    :class:`~flydsl.kernels.gemm.operands.OperandTiles` ``sources``), and C gets ``gate(left) * right``: tile ``tn``
    stores columns ``[tn * tile_n / 2, (tn + 1) * tile_n / 2)`` of C. Scales apply to both halves before the gate;
    it takes no bias or other activation."""

    bias: bool = False
    activation: str | None = None
    scales: tuple = ()
    store: str = "registers"
    gate: str | None = None

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"{self}: activation must be one of {ACTIVATIONS}")
        if self.gate is not None and (self.gate not in ACTIVATIONS or self.bias or self.activation):
            raise ValueError(f"{self}: a gate is one of {ACTIVATIONS}, without bias or another activation")
        if not isinstance(self.scales, tuple) or not all(isinstance(s, Scale) for s in self.scales):
            raise ValueError(f"{self}: scales must be a tuple of Scale")
        if self.store not in ("registers", "tma"):
            raise ValueError(f"{self}: store must be 'registers' or 'tma'")

    @property
    def identity(self) -> bool:
        """No scale, bias, activation or gate: the accumulators are only converted."""
        return not self.scales and not self.bias and self.activation is None and self.gate is None

    def width(self, tile_n: int) -> int:
        """The columns of C one tile of ``tile_n`` accumulator columns stores."""
        return tile_n // 2 if self.gate is not None else tile_n


class EpilogueTensors(NamedTuple):
    """The tensors an :class:`Epilogue` reads in a kernel: ``bias`` ((N,), or None without one) and one float32
    tensor per entry of ``Epilogue.scales``, in order."""

    bias: object = None
    scales: tuple = ()


def apply_epilogue(x, epilogue: Epilogue, tensors: EpilogueTensors, row, col):
    """The epilogue of one fp32 accumulator element at (``row``, ``col``) of C, inside C: its scales, ``+ bias[col]``,
    then the activation."""
    for scale, scale_tensor in zip(epilogue.scales, tensors.scales, strict=True):
        x = x * scale.value(scale_tensor, row, col)
    if fx.const_expr(epilogue.bias):
        x = x + tensors.bias[col].to(fx.Float32)
    return _activate(x, epilogue.activation)


def _activate(x, activation):
    """One of ACTIVATIONS on an fp32 value (gelu as torch's default, with erf)."""
    if fx.const_expr(activation == "relu"):
        x = arith.maximum(x, fx.Float32(0.0))
    if fx.const_expr(activation == "gelu"):
        x = x * 0.5 * (fx.math.erf(x * _SQRT_HALF) + 1.0)
    if fx.const_expr(activation == "silu"):
        x = x / (fx.math.exp(-x) + 1.0)
    return x


class TileStore(NamedTuple):
    """Where and how a consumer warpgroup stores its tiles: C, the :class:`Epilogue` and its tensors, the
    configuration (tile shape, schedule, staging boxes) and, with the TMA store, ``tma``: (C's descriptor in
    (64, 64) boxes, the consumers' staging boxes) from :func:`tma_store_staging`."""

    c: object
    epilogue: Epilogue
    tensors: EpilogueTensors
    cfg: object  # GemmConfig
    tma: tuple | None = None


def _scaled(x, store: TileStore, loaded: dict, row_of, col, key, b_col=None):
    """``x`` (element ``key`` = (p, e) of a block) times each of the epilogue's scales; each scale value is loaded
    once per block for the elements it is the same for (known when traced: a thread's two row halves share rows
    grouped by a multiple of 16, its element pair columns grouped by an even count) at a row and column clamped
    into C (values past C's edges are computed but never stored); experts' scales at ``b_col`` (the pair's row of
    the stacked weights) clamped into the scale tensor."""
    p, e = key
    for i, (scale, scale_tensor) in enumerate(zip(store.epilogue.scales, store.tensors.scales, strict=True)):
        row_key = None if scale.rows is None or scale.rows % 16 == 0 else p % 2
        col_key = None if scale.columns is None else (p // 2 if scale.columns % 2 == 0 else (p // 2, e))
        found = loaded.get((i, row_key, col_key))
        if found is None:
            row = None if scale.rows is None else arith.minimum(row_of(p), store.c.shape[0].to(fx.Int32) - 1)
            if fx.const_expr(scale.experts):
                column = arith.minimum(b_col + e, scale_tensor.shape.to(fx.Int32) - 1)  # (a 1-D shape: its extent)
            else:
                column = None if scale.columns is None else arith.minimum(col + e, store.c.shape[1].to(fx.Int32) - 1)
            found = loaded[(i, row_key, col_key)] = scale.value(scale_tensor, row, column)
        x = x * found
    return x


def _finished_tile(acc, store: TileStore, block, col0, lane, warp, b_row0=0):
    """This thread's values of accumulator block ``mi`` of a consumer's tile (``block``: (row0, mi); rows from
    ``row0 + 64 mi``, columns from ``col0``) through the epilogue, in C's dtype: computed once, however they are
    stored, as a Vector. wgmma's layout: element ``2p + e`` lies in row ``16 warp + lane // 4 + 8 (p % 2)`` and
    column ``8 (p // 2) + 2 (lane % 4) + e`` of the block. Each bias element is read once per thread, at a column
    clamped into the tensor (values past N are computed but never stored). ``b_row0``: the first row of the
    stacked weights a grouped GEMM's tile reads (its experts' scales are indexed by those rows)."""
    c, epilogue, tensors, n = store.c, store.epilogue, store.tensors, store.cfg.tile_n
    if fx.const_expr(epilogue.identity):
        return acc.to(c.dtype)

    def row_of(p):  # (computed only for scales that vary by row)
        row0, mi = block
        return row0 + 64 * mi + 16 * warp + lane // 4 + 8 * (p % 2)

    if fx.const_expr(epilogue.gate is not None):
        return _gated_tile(acc, store, row_of, col0, lane, b_row0)
    bias = tensors.bias if epilogue.bias else None
    last = c.shape[1].to(fx.Int32) - 1
    loaded: dict = {}  # the scale values of this block (see _scaled)
    by_expert = any(scale.experts for scale in epilogue.scales)

    values = []
    for p in fx.range_constexpr(n // 4):
        col = col0 + 8 * (p // 2) + 2 * (lane % 4)
        if fx.const_expr(p % 2 == 0 and bias is not None):  # rows r and r + 8 share their two columns
            pair = [bias[arith.minimum(col + e, last)].to(fx.Float32) for e in (0, 1)]
        for e in fx.range_constexpr(2):
            x = acc[2 * p + e]
            if fx.const_expr(epilogue.scales):
                x = _scaled(x, store, loaded, row_of, col, (p, e), b_row0 + col if by_expert else None)
            x = x if bias is None else x + pair[e]
            values.append(_activate(x, epilogue.activation).to(c.dtype))
    return vector.from_elements(vector.vector_class(c.dtype, len(values)), values)


def _gated_tile(acc, store: TileStore, row_of, col0, lane, b_row0):
    """``gate(left) * right`` of a tile's accumulators whose left n / 2 columns are the gate and right n / 2 the up
    projection, laid out as the accumulators of an n / 2 wide tile (:func:`_store_tile` stores them; ``col0``: its
    first column of C). Column c and c + n / 2 lie in one thread: element pair ``p`` and ``p + n / 8`` (the pairs
    step 8 columns every 2). With scales (fp8), each half is scaled first: the up rows of C's column c are the
    stacked weights' rows I = C's width after its gate row."""
    epilogue, dtype = store.epilogue, store.c.dtype
    half = store.cfg.tile_n // 8  # element pairs per half tile
    inter = store.c.shape[1].to(fx.Int32) if epilogue.scales else None
    gate_scales, up_scales = {}, {}  # (see _scaled: the two halves' values apart)
    values = []
    for p in fx.range_constexpr(half):
        col = col0 + 8 * (p // 2) + 2 * (lane % 4)
        for e in fx.range_constexpr(2):
            gate, up = acc[2 * p + e], acc[2 * (p + half) + e]
            if fx.const_expr(epilogue.scales):
                gate = _scaled(gate, store, gate_scales, row_of, col, (p, e), b_row0 + col)
                up = _scaled(up, store, up_scales, row_of, col, (p, e), b_row0 + inter + col)
            values.append((_activate(gate, epilogue.gate) * up).to(dtype))
    return vector.from_elements(vector.vector_class(dtype, len(values)), values)


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


def store_accumulators(store: TileStore, accs, tm, tn, consumer, lane, warp, b_row0=0):
    """Stores consumer warpgroup ``consumer``'s accumulators (one per 64-row block) of tile (tm, tn) into C through
    the epilogue: from registers, bounds-checked only where the tile crosses C's edge, or through shared memory and
    TMA stores (``store.tma``). ``lane``, ``warp``: this thread's lane and warp in its warpgroup."""
    c, cfg = store.c, store.cfg
    rows = cfg.consumer_rows
    width = store.epilogue.width(cfg.tile_n)
    row0 = tm * cfg.tile_m + (0 if cfg.schedule == "pingpong" else consumer * rows)
    col0 = tn * width
    inside = (row0 + rows <= c.shape[0].to(fx.Int32)) & (col0 + width <= c.shape[1].to(fx.Int32))
    finished = [_finished_tile(accs[mi], store, (row0, mi), col0, lane, warp, b_row0) for mi in range(rows // 64)]
    if fx.const_expr(store.epilogue.identity):
        # Converted (and packed, for 16-bit C) all at once, right after the MMAs' wait, so that ptxas keeps every
        # wgmma pipelined (docs/tuning/gemm.md#pinned-epilogue); with a bias or an activation they stay unpinned.
        finished = wgmma.fence_operands(finished)
    for mi in fx.range_constexpr(rows // 64):
        r0 = row0 + 64 * mi
        values = finished[mi]
        if fx.const_expr(store.tma is not None):
            _store_tile_tma(values, store, (r0, col0), (mi, rows // 64), consumer, lane, warp)
        else:
            if inside:
                _store_tile(values, c, r0, col0, True, lane, warp, width)
            else:
                _store_tile(values, c, r0, col0, False, lane, warp, width)


# The TMA-store epilogue (docs/tuning/gemm.md#tma-store): a tile written into shared memory leaves through TMA while
# the consumers go on with the next tile's MMAs; TMA also clips the tile at C's edges. Each consumer stages its tile's
# 64 x 64 parts in a ring of 128B-swizzled boxes (cfg.store_boxes): with two, alternately; with one, each part waits
# for the previous part's store to have read it (16 KB more for stages); with four, a 128 x 128 consumer tile is
# staged whole and its parts wait for none of this tile's stores.
_STAGING_COLUMNS = STAGING_BOX[1]


def staging_wait(part: int, parts: int, boxes: int = 2) -> int:
    """The bulk groups that may still be pending when part ``part`` of a consumer tile's ``parts`` 64-column parts
    (its 64-row blocks' parts in order), which the TMA-store epilogue stores tile after tile (part ``p`` through box
    ``p % boxes``), rewrites its box: the groups committed since that box's last store, at most ``boxes - 1`` (one
    box: none). Where ``parts`` is not a multiple of ``boxes``, an early part's box was last used by one of the
    previous tile's late parts: fewer groups since."""
    return min(boxes - 1, (parts - 1 - part) % boxes + part)  # (no loops: traced in the kernel)


def tma_store_staging(smem, c, c_store, cfg) -> tuple:
    """The TMA store's ``(c_store, staging boxes)`` for :class:`TileStore`: ``cfg.store_boxes`` (64, 64) boxes per
    consumer in ``smem``, after checking that ``c_store`` is C's descriptor in such boxes."""
    if cfg.tile_n % STAGING_BOX[1]:  # (a gated tile's half too: the grouped plan checks it)
        raise ValueError(f"gemm_ws: the TMA-store epilogue takes tile_n in 64-column parts, got {cfg.tile_n}")
    if c_store.box != STAGING_BOX or c_store.dtype is not c.dtype:
        raise ValueError("gemm_ws c_store: expected C's descriptor in boxes of (64, 64)")
    return c_store, c_store.allocate(smem, cfg.store_boxes * cfg.consumers)


def finish_stores(store: TileStore, tid) -> None:
    """At a consumer's end: with the TMA store, one thread of the warpgroup waits until its last stores have written
    C (the CTA must not exit while they read its shared memory)."""
    if fx.const_expr(store.tma is not None):
        if tid % 128 == 0:
            fx.tma.wait_group(0)


def _store_tile_tma(values, store: TileStore, origin, block, consumer, lane, warp):
    """Stores this thread's finished 16-bit values of one 64 x width block (:func:`_finished_tile`; ``block``: its
    index and the count of the consumer's blocks) at ``origin`` (row, column) through the consumer's staging boxes:
    per 64-column part, ``stmatrix`` (4 x4 per warp: its 16 rows x 8-column blocks) into a box whose previous TMA
    store has read it, a proxy fence and the warpgroup's barrier, then one thread's TMA store (its bulk group)."""
    (c_store, staging), c, boxes = store.tma, store.c, store.cfg.store_boxes
    (row0, col0), (index, blocks) = origin, block
    n = store.epilogue.width(store.cfg.tile_n)
    parts = n // _STAGING_COLUMNS
    t = lane + 32 * warp
    for part in fx.range_constexpr(parts):
        stored = index * parts + part  # the part's place among the consumer tile's stores
        box = staging[None, None, boxes * consumer + stored % boxes]  # (64, 64), 128B-swizzled
        wait = staging_wait(stored, blocks * parts, boxes)
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
