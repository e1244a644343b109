"""Operand tiles: how A and B travel from global memory into a pipeline slot of shared memory, and the TMA producer.

Operands are (MN, K) views, as wgmma reads them: A (M, K) and B (N, K). Each is "K"-major (K contiguous: A
row-major, B an ``nn.Linear`` weight's ``W.t()``) or "MN"-major (MN contiguous: the transpose of a row-major
(K, MN) tensor). TMA copies boxes whose rows hold 128 bytes at most (the widest swizzle), so a K-major tile arrives
as boxes of (rows, 64 elements of K) and an MN-major one as boxes of (tile_k, 64 elements of MN). A third kind,
"prepared", is fp8 weights laid out ahead of time by :func:`~flydsl.kernels.gemm.prepared.prepare_weight` as
(K / 128, N, 128) panels: such a tile arrives as the same K-major boxes, each a contiguous piece of a 3-D view.

Device side (in kernels): :func:`operand_layout` (the slots' shared-memory layout), :class:`OperandTiles` (one
operand's slots and the TMA loads filling one of them), :class:`Producer` and :func:`produce` (the producer thread's
loads of a work unit). Host side (no GPU needed): :class:`MatrixSpec` (a tensor's geometry), :func:`tma_copy_kind` /
:func:`copy_for_tma` (operands TMA cannot read as they are are first copied into aligned rows), :func:`operand_view`
(an operand's :class:`TmaView`: matrix, strides, box, major) and :func:`tma_tile` (its ``fx.TmaTile``, cached).
"""

from __future__ import annotations

from typing import NamedTuple

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.compiler.args import torch_dtype_name
from flydsl.kernels.gemm.block_scales import load_step_scales

__all__ = [
    "OPERAND_BYTES",
    "SWIZZLE_BYTES",
    "MatrixSpec",
    "OperandTiles",
    "Producer",
    "TmaView",
    "allocate_operand",
    "copy_for_tma",
    "operand_box",
    "operand_layout",
    "operand_view",
    "prepared_view",
    "produce",
    "tma_copied",
    "tma_copy_kind",
    "tma_tile",
]

SWIZZLE_BYTES = 128  # the widest swizzle; a TMA box row holds 128 bytes (64 bf16, 128 fp8) at most
OPERAND_BYTES = {"bf16": 2, "f16": 2, "f8E4M3FN": 1, "f8E5M2": 1}  # the element types the GEMMs multiply


def operand_layout(rows: int, tile_k: int, stages: int, major: str, element_bytes: int = 2):
    """Shared memory for one operand, as an (MN, K, stage) layout TMA fills box by box and wgmma reads:

    * K-major: boxes of (rows, 64) along K, each 128-byte rows under the 128B swizzle (the wgmma K-major atom);
    * prepared: as K-major (the boxes come from K panels of prepared weights);
    * MN-major: boxes of (tile_k, 64) of the (K, MN) tensor, one per 64 rows of MN."""
    row = SWIZZLE_BYTES // element_bytes  # elements of one swizzled row
    swizzle = fl.Swizzle(3, 4 - (element_bytes.bit_length() - 1), 3)
    box = rows * row if major != "MN" else tile_k * row
    if major != "MN":
        inner = fl.Layout((rows, (row, tile_k // row), stages), (row, (1, box), rows * tile_k))
    else:
        inner = fl.Layout(((row, rows // row), tile_k, stages), ((1, box), row, rows * tile_k))
    return fl.ComposedLayout(swizzle, 0, inner)


def operand_box(rows: int, tile_k: int, major: str, parts: int = 1, element_bytes: int = 2) -> tuple:
    """The TMA box of an operand whose (rows, tile_k) tile is loaded in ``parts`` parts along MN (the CTAs of a
    cluster sharing it): (rows / parts, 64) of the (MN, K) matrix when K-major, (tile_k, 64) of the (K, MN) matrix
    when MN-major (64: the elements of a 128-byte row, for 16-bit elements); prepared weights: (rows / parts, 128) of
    their (K / 128, N, 128) panels seen as one (K / 128 * N, 128) matrix (:func:`prepared_view`)."""
    row = SWIZZLE_BYTES // element_bytes
    return (rows // parts, row) if major in ("K", "prepared") else (tile_k, row)


class OperandTiles(NamedTuple):
    """One operand's pipeline slots in shared memory, ``(rows, tile_k, stages)`` (:func:`operand_layout`), and the TMA
    descriptor ``desc`` that fills them: ``rows`` is the tile's extent along MN (``tile_m`` for A, ``tile_n`` for
    B); ``parts``: the CTAs of a cluster sharing each tile (each loads ``rows / parts`` rows of it, multicast to
    all); ``sources``: K-major tiles gathered from that many row blocks of the matrix, ``source_rows`` apart (a
    kernel integer): the gated GEMM's tile of gate rows then the matching up rows (shared by a cluster of as many
    CTAs, each loads one block); prepared weights: ``source_rows`` the rows of one panel (N)."""

    desc: object  # fx.TmaDescriptor
    tiles: object  # (rows, tile_k, stages) in shared memory
    rows: int
    tile_k: int
    major: str
    parts: int = 1
    sources: int = 1
    source_rows: object = 0

    @property
    def tile_rows(self) -> int:
        """The rows of the matrix one tile index advances by: ``rows``, or one source block's."""
        return self.rows // self.sources

    def load(self, stage, mn0, k0, barrier, part=0) -> None:
        """The TMA loads of part ``part`` (this CTA's rank along the sharing cluster) of the (rows, tile_k) tile at
        (mn0, k0) into slot ``stage``, completing on ``barrier``; with several parts, each is multicast to the
        ``parts`` CTAs of the cluster (one part: the whole tile, ``part`` ignored)."""
        desc, parts = self.desc, self.parts
        row = SWIZZLE_BYTES // desc.element_bytes
        slot = self.tiles[None, None, stage]  # (rows, tile_k)
        mask = None if parts == 1 else (1 << parts) - 1
        part = part if parts > 1 else 0
        part_rows = self.rows // parts
        if self.sources > 1:  # one box of (rows / sources, 64) per source block and 64 columns of K
            block = self.rows // self.sources
            blocks = [part] if parts > 1 else list(range(self.sources))  # shared: this CTA's block (parts == sources)
            for kb in fx.range_constexpr(self.tile_k // row):
                for i in blocks:
                    target = fx.local_tile(slot[None, (None, kb)], (block, row), (i, 0))
                    desc.load(target, (mn0 + i * self.source_rows, k0 + kb * row), barrier, multicast_mask=mask)
        elif self.major == "K":  # one box of (part_rows, 64) per 64 columns of K
            for kb in fx.range_constexpr(self.tile_k // row):
                target = fx.local_tile(slot[None, (None, kb)], (part_rows, row), (part, 0))  # (part_rows, 64)
                desc.load(target, (mn0 + part * part_rows, k0 + kb * row), barrier, multicast_mask=mask)
        elif self.major == "prepared":  # one box of (part_rows, 128) per 128 columns of K: contiguous in a panel
            for kb in fx.range_constexpr(self.tile_k // row):
                target = fx.local_tile(slot[None, (None, kb)], (part_rows, row), (part, 0))  # (part_rows, 128)
                panel_row = (k0 // row + kb) * self.source_rows + mn0 + part * part_rows
                desc.load(target, (panel_row, 0), barrier, multicast_mask=mask)
        else:  # one box of (tile_k, 64) of the (K, MN) tensor per 64 rows of MN
            for mb in fx.range_constexpr(part_rows // row):
                box = part * (part_rows // row) + mb
                desc.load(slot[(None, box), None], (k0, mn0 + box * row), barrier, multicast_mask=mask)


def allocate_operand(
    smem, name: str, desc, rows: int, tile_k: int, stages: int, major: str, parts: int = 1, sources=(1, 0)
):
    """:class:`OperandTiles` of ``stages`` slots in ``smem`` (1024-byte aligned: the 128B swizzle's atom) for the
    operand ``name`` read through ``desc``, after checking that ``desc`` copies the boxes the slots expect;
    ``sources``: (``sources``, ``source_rows``) of the tiles (K-major, not shared by a cluster); prepared weights:
    (1, N), the rows of one panel."""
    element_bytes = desc.element_bytes
    row = SWIZZLE_BYTES // element_bytes
    if major == "MN" and (rows // parts) % row:
        raise ValueError(f"gemm_ws {name}: MN-major parts of {rows // parts} rows; expected multiples of {row}")
    if major == "prepared" and element_bytes != 1:
        raise ValueError(f"gemm_ws {name}: prepared weights are fp8, got {desc.dtype}")
    if sources[0] > 1 and (major != "K" or parts not in (1, sources[0]) or rows % (8 * sources[0])):
        raise ValueError(
            f"gemm_ws {name}: tiles from {sources[0]} row blocks are K-major, of 8-row blocks, each CTA of a cluster"
            " sharing them loading one block"
        )
    box = operand_box(rows, tile_k, major, max(parts, sources[0]), element_bytes)
    if desc.box != box or desc.swizzle != SWIZZLE_BYTES:
        raise ValueError(f"gemm_ws {name}: expected TMA boxes of {box} with a 128B swizzle, got {desc.box}")
    layout = operand_layout(rows, tile_k, stages, major, element_bytes)
    tiles = smem.allocate(desc.dtype, layout, alignment=1024)
    return OperandTiles(desc, tiles, rows, tile_k, major, parts, *sources)


class Producer(NamedTuple):
    """The producer thread's view of the pipeline: the ``fx.TmaPipeline``, the operands' slots, and this CTA's
    ``rank`` in its cluster (which part of each shared tile it loads)."""

    pipe: object
    a: OperandTiles
    b: OperandTiles
    rank: object = 0


def produce(producer: Producer, state, work, scales=None):
    """The producer thread's TMA loads of one work unit (a :class:`~flydsl.kernels.gemm.schedulers.WorkUnit`): for
    each K step in ``[work.k_begin, work.k_end)``, a free slot is acquired and both operands' tiles of this CTA's
    output tile (their shared parts, with a cluster) are loaded into it. Block-scaled (``scales``: the
    :class:`~flydsl.kernels.gemm.block_scales.StagedScales`), the step's scales too
    (:func:`~flydsl.kernels.gemm.block_scales.load_step_scales`), and the thread arrives once its ``cp.async`` copies
    of them have landed. Returns the pipeline state past the unit."""
    pipe, a, b, rank = producer
    for kt in range(work.k_begin, work.k_end):
        bar = pipe.full[state.index]
        k0 = kt * a.tile_k
        a_at, b_at = work.tile_m * a.rows, work.b_row0 + work.tile_n * b.tile_rows
        pipe.producer_acquire(state)
        a.load(state.index, a_at, k0, bar, rank)
        b.load(state.index, b_at, k0, bar, rank)
        if fx.const_expr(scales is not None):
            load_step_scales(scales, state.index, work, kt, b, bar)
            bar.arrive_on_cp_async()
        state = state.advance()
    return state


# --- host side -----------------------------------------------------------------------------------------------------


class MatrixSpec(NamedTuple):
    """A tensor's geometry as a launch plan needs it, without memory: ``shape``, ``strides`` (elements), ``dtype``
    (an MLIR name: "bf16", "f16", "f32") and whether its data is 16-byte ``aligned``. Hashable: plans are cached on
    it."""

    shape: tuple
    strides: tuple
    dtype: str
    aligned: bool = True

    @classmethod
    def of(cls, t, name: str = "tensor") -> MatrixSpec:
        """The geometry of a torch tensor ``t``."""
        return cls(tuple(t.shape), t.stride(), torch_dtype_name(t.dtype, name), t.data_ptr() % 16 == 0)

    @classmethod
    def dense(cls, shape, dtype: str) -> MatrixSpec:
        """A row-major tensor at an aligned address (what an allocator gives)."""
        strides, step = [], 1
        for extent in reversed(shape):
            strides.append(step)
            step *= extent
        return cls(tuple(shape), tuple(reversed(strides)), dtype, True)

    def transposed(self) -> MatrixSpec:
        return MatrixSpec(self.shape[::-1], self.strides[::-1], self.dtype, self.aligned)

    def tensor_spec(self):
        """The ``flyc.TensorSpec`` of this geometry (for compiling without a GPU)."""
        import flydsl.compiler as flyc

        return flyc.TensorSpec(self.shape, self.dtype, self.strides, aligned=self.aligned)


def tma_copy_kind(matrix: MatrixSpec) -> str | None:
    """How an operand must be copied before TMA can read it: None (as it is: one unit stride, the other a multiple of
    16 bytes with no overlap of rows, so no broadcast stride 0; a 16-byte aligned start), "columns" (column-major:
    the columns padded to 16 bytes) or "rows" (any other: the rows padded to 16 bytes). Odd K, odd M/N of
    MN-major operands and arbitrary strides then work, at the cost of one copy of that operand."""
    (rows, cols), (row_stride, col_stride) = matrix.shape, matrix.strides
    step = 16 // OPERAND_BYTES[matrix.dtype]
    if matrix.aligned and (
        (col_stride == 1 and row_stride % step == 0 and row_stride >= cols)
        or (row_stride == 1 and col_stride % step == 0 and col_stride >= rows)
    ):
        return None
    return "columns" if row_stride == 1 and col_stride != 1 else "rows"


def tma_copied(matrix: MatrixSpec, kind: str | None) -> MatrixSpec:
    """The geometry of ``matrix`` after :func:`copy_for_tma` with ``kind``."""
    if kind is None:
        return matrix
    if kind == "columns":
        return tma_copied(matrix.transposed(), "rows").transposed()
    step = 16 // OPERAND_BYTES[matrix.dtype]
    rows, cols = matrix.shape
    return MatrixSpec((rows, cols), (-(-cols // step) * step, 1), matrix.dtype, True)


def copy_for_tma(t, kind: str | None):
    """``t`` (a torch tensor) as :func:`tma_copy_kind` says: itself, or a copy whose rows (or columns) are padded to
    16 bytes, the padding outside the view (TMA reads zeros past a view's extent, so K tails need no zero fill)."""
    if kind is None:
        return t
    if kind == "columns":
        return copy_for_tma(t.t(), "rows").t()
    rows, cols = t.shape
    step = 16 // t.element_size()
    padded = t.new_empty((rows, -(-cols // step) * step))
    padded[:, :cols] = t
    return padded[:, :cols]


class TmaView(NamedTuple):
    """An operand as TMA reads it: the ``matrix`` (2-D extents; prepared weights' panels one after another) with
    ``strides`` (the last one 1), copied in boxes of ``box`` with a ``swizzle`` of that many bytes (operands: 128;
    a block-scaled GEMM's A scales: none); ``major``: "K" (the (MN, K) matrix), "MN" (the (K, MN) one) or
    "prepared" (the (K / 128 * N, 128) rows of the panels)."""

    matrix: tuple
    strides: tuple
    dtype: str
    box: tuple
    major: str
    swizzle: int = SWIZZLE_BYTES

    def spec_tile(self, aligned: bool = True):
        """Its ``fx.TmaTile`` over a ``flyc.TensorSpec`` (for compiling without a GPU; it cannot launch)."""
        import flydsl.compiler as flyc

        spec = flyc.TensorSpec(self.matrix, self.dtype, self.strides, aligned=aligned)
        return fx.TmaTile(spec, self.box, self.swizzle)


def operand_view(matrix: MatrixSpec, mn_dim: int, rows: int, tile_k: int, name: str) -> TmaView:
    """The :class:`TmaView` of an operand whose MN extent is dimension ``mn_dim`` of ``matrix`` (A: 0, B: 1), in boxes
    of :func:`operand_box` (``rows``: the rows of MN each CTA loads). K-major (K contiguous) as the (MN, K) matrix,
    MN-major as the (K, MN) matrix. Errors name the operand: a matrix with no unit stride, or one TMA cannot read
    (strides not multiples of 16 bytes, an unaligned start, extents of 2^31 or more)."""
    shape, strides, k_dim = matrix.shape, matrix.strides, 1 - mn_dim
    element_bytes = OPERAND_BYTES.get(matrix.dtype, 2)
    if strides[k_dim] == 1:
        view = TmaView((shape[mn_dim], shape[k_dim]), (strides[mn_dim], 1), matrix.dtype, (), "K")
    elif strides[mn_dim] == 1:
        view = TmaView((shape[k_dim], shape[mn_dim]), (strides[k_dim], 1), matrix.dtype, (), "MN")
    else:
        raise ValueError(f"gemm {name}: expected a row- or column-major matrix, got strides {strides}")
    view = view._replace(box=operand_box(rows, tile_k, view.major, element_bytes=element_bytes))
    return _checked(view, matrix.aligned, name)


def prepared_view(panels: MatrixSpec, rows: int, name: str = "b") -> TmaView:
    """The :class:`TmaView` of prepared fp8 weights (``panels``: their contiguous (K / 128, N, 128) panels' geometry,
    from :func:`~flydsl.kernels.gemm.prepared.prepare_weight`) as one (K / 128 * N, 128) matrix, in boxes of ``rows``
    rows of one panel: a 2-D copy, which ran 1-5% faster than the same boxes through a 3-D descriptor (on an H100,
    docs/kernels-zoo.md#prepared-weights). A box past a panel's N rows reads the next panel's first rows into tile
    rows past N, whose output columns are never stored (past the last panel TMA fills zeros)."""
    (panel_count, n, width), strides = panels.shape, panels.strides
    if strides != (n * width, width, 1):
        raise ValueError(f"gemm {name}: expected contiguous prepared panels, got strides {strides}")
    view = TmaView((panel_count * n, width), (width, 1), panels.dtype, (), "prepared")
    view = view._replace(box=operand_box(rows, 0, "prepared", element_bytes=OPERAND_BYTES[panels.dtype]))
    return _checked(view, panels.aligned, name)


def _checked(view: TmaView, aligned: bool, name: str) -> TmaView:
    try:  # TmaTile's own checks, on an address of the same alignment
        fx.TmaTile.of_memory(0 if aligned else 2, view.matrix, view.strides, view.dtype, view.box, view.swizzle)
    except ValueError as error:
        raise ValueError(f"gemm {name}: {error}") from None
    return view


_TILES: dict[tuple, fx.TmaTile] = {}  # (address, TmaView) -> its TmaTile (addresses only: no tensor kept alive)
_TILES_LIMIT = 512


def tma_tile(t, view: TmaView) -> fx.TmaTile:
    """The ``fx.TmaTile`` of torch tensor ``t`` seen as ``view`` (from :func:`operand_view` of its geometry), cached
    per address and view: a call with the same operands builds no views and checks nothing twice."""
    pointer = t.data_ptr()
    key = (pointer, view)
    tile = _TILES.get(key)
    if tile is None:
        geometry = (view.matrix, view.strides, view.dtype, view.box, view.swizzle)
        tile = fx.TmaTile.of_memory(pointer, *geometry, device=t.get_device())
        if len(_TILES) >= _TILES_LIMIT:
            _TILES.pop(next(iter(_TILES)))
        _TILES[key] = tile
    return tile
