"""A row kernel's memory accesses, device side: this thread's place in its row (:func:`row_position`), its chunks of
a row loaded into registers as float32 (:func:`load_row`; 16-byte accesses, predicated tails) or kept in their
dtype (:func:`load_row_raw`, :func:`widen`), of a 1-D weight or bias laid out like the rows
(:func:`load_vector_chunk`), and the row written back (:func:`store_row`). The layout is :class:`RowConfig`'s
(:mod:`flydsl.kernels.rows.layout`)."""

from __future__ import annotations

from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import cluster, gpu, nvvm, vector
from flydsl.kernels.rows.layout import HINTS, RowConfig

_llvm = lazy_import("mlir.dialects.llvm")

__all__ = [
    "RowPosition",
    "row_position",
    "row_at",
    "chunk_index",
    "fill_buffer",
    "load_row",
    "load_row_raw",
    "widen",
    "row_masks",
    "load_vector",
    "load_vector_chunk",
    "load_vector_chunk_raw",
    "load_vector_chunks_raw",
    "load_vector_row",
    "vector_chunk",
    "store_row",
    "store_row_fp8",
    "segment_chunks",
    "segment_count",
    "rounded",
    "pinned",
    "inverse_n",
]


class RowPosition(NamedTuple):
    """This thread's row and place in it (:func:`row_position`)."""

    tid: object  # thread index in the CTA
    lane: object  # thread index within the row's threads of this CTA
    row_in_cta: object
    rank: object  # CTA rank in the cluster or team (0 without one)
    row: object  # the row (Int32)
    leader: object  # the one thread that writes per-row results


def row_position(cfg: RowConfig):
    """This thread's row and place in it: ``row`` (Int32), ``lane`` (thread index within the row's threads of this
    CTA), ``rank`` (CTA rank in the cluster; 0 without one), ``row_in_cta``, ``leader`` (the one thread that writes
    per-row results)."""
    # The block size as .reqntid: ptxas keeps registers within what cfg.block threads can have (64 each at 1024)
    # instead of the kernel failing at launch.
    flyc.set_kernel_attributes(threads=cfg.block)
    tid = gpu.thread_idx.x
    lane = tid % cfg.threads_per_row
    row_in_cta = tid // cfg.threads_per_row
    if fx.const_expr(cfg.team):  # consecutive CTAs of the grid
        rank = gpu.block_idx.x % cfg.cluster
        group = gpu.block_idx.x // cfg.cluster
        leader = (lane == 0) & (rank == 0)
    elif fx.const_expr(cfg.cluster > 1):
        rank = cluster.block_rank()
        group = gpu.block_idx.x // cfg.cluster
        leader = (lane == 0) & (rank == 0)
    else:
        rank = 0
        group = gpu.block_idx.x
        leader = lane == 0
    row = group * cfg.rows_per_cta + row_in_cta
    return RowPosition(tid=tid, lane=lane, row_in_cta=row_in_cta, rank=rank, row=row, leader=leader)


def row_at(pos: RowPosition, row) -> RowPosition:
    """``pos`` at another row (same thread, same place in the row)."""
    return pos._replace(row=row)


def _hint_qualifiers(hint: str | None) -> dict:
    """The keyword arguments of fx.nvvm.ld_global / st_global for a CacheHints value (policies created here: the
    compiler merges the identical ``createpolicy``)."""
    if hint is None:
        return {}
    qualifiers = dict(HINTS[hint])
    if "policy" in qualifiers:
        qualifiers["policy"] = nvvm.create_policy(qualifiers["policy"])
    return qualifiers


def chunk_index(cfg: RowConfig, pos, j: int):
    """The row chunk (``vec`` elements from column ``vec *`` it) that is this thread's ``j``-th."""
    return (j * cfg.cluster + pos.rank) * cfg.threads_per_row + pos.lane


def fill_buffer(cls, fill):
    raw, buffer = vector.register_buffer(cls)
    _llvm.store(cls(fill).value, raw, alignment=buffer.base_alignment)
    return raw, buffer


def _read_buffer(cls, raw, buffer):
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


def _chunk_list(cfg: RowConfig, chunks) -> tuple:
    return tuple(chunks) if chunks is not None else tuple(range(cfg.chunks))  # a Python tuple: unrolled at trace


def _chunk_masks(cfg: RowConfig, col, n, row_ok):
    """In-range Booleans of a chunk's elements (one per chunk when ``cfg.even``, repeated ``vec`` times)."""
    if fx.const_expr(cfg.even):
        return [row_ok & (col < n)] * cfg.vec
    return [row_ok & (col + e < n) for e in range(cfg.vec)]


def _load_chunk_raw(cfg: RowConfig, view, col, n, row_ok, fill, hint=None):
    """The ``vec`` elements of a chunk view as one vector of its dtype, ``fill`` where out of range; ``hint``: a
    :class:`CacheHints` value for the 16-byte load (its address must be 16-byte aligned: the caller checks)."""
    cls = vector.vector_class(view.dtype, cfg.vec)
    # (hinted: 16-byte chunks only; float32 weights of 16-bit rows take 32 bytes a chunk)
    if fx.const_expr(cfg.even and hint is not None and view.dtype.width * cfg.vec == 128):
        fill_words = cls(fill).bitcast(fx.Int32)
        words = nvvm.ld_global(view, predicate=row_ok & (col < n), fill=fill_words, **_hint_qualifiers(hint))
        return words.bitcast(view.dtype)
    raw, buffer = fill_buffer(cls, fill)
    if fx.const_expr(cfg.even):
        fx.copy(view, buffer, predicate=row_ok & (col < n))
    else:
        for e in fx.range_constexpr(cfg.vec):
            ok = row_ok & (col + e < n)
            fx.copy(fx.local_tile(view, (1,), (e,)), fx.local_tile(buffer, (1,), (e,)), predicate=ok)
    return _read_buffer(cls, raw, buffer)


def segment_count(cfg: RowConfig, n):
    """Segments of a row of ``n`` elements (a kernel integer) walked ``cfg.chunks`` chunks per thread at a time: a
    looped kernel's trip count."""
    step = cfg.vec * cfg.chunks * cfg.threads_per_row * cfg.cluster
    return (n + (step - 1)) // step


def segment_chunks(cfg: RowConfig, s) -> list:
    """This thread's chunks of segment ``s`` (a kernel integer: a dynamic loop's index), as the ``chunks`` argument
    of :func:`load_row` / :func:`store_row`: a segment is ``cfg.chunks * threads_per_row`` consecutive chunks, so that
    a looped kernel keeps one segment in registers and its accesses stay coalesced."""
    return [s * cfg.chunks + j for j in range(cfg.chunks)]


def load_row_raw(cfg: RowConfig, t, pos, n, rows, fill=0.0, chunks=None):
    """As :func:`load_row`, but one vector of ``t``'s dtype per chunk (16 bytes: 4 registers whatever the dtype),
    for a kernel that loads the next row while it works on this one; :func:`widen` converts them."""
    row_ok = pos.row < rows
    loaded = []
    for j in _chunk_list(cfg, chunks):
        c = chunk_index(cfg, pos, j)
        view = fx.local_tile(t, (1, cfg.vec), (pos.row, c))[0, None]  # (vec,): 16 contiguous bytes
        loaded.append(_load_chunk_raw(cfg, view, c * cfg.vec, n, row_ok, fill, cfg.hints.rows))
    return loaded


def widen(loaded):
    """Chunks from :func:`load_row_raw` as Float32 scalars."""
    values = []
    for v in loaded:
        wide = v.to(fx.Float32)
        values += [wide[e] for e in range(len(v))]
    return values


def row_masks(cfg: RowConfig, pos, n, rows, chunks=None):
    """The masks :func:`load_row` returns (Booleans: in range) for row ``pos.row``."""
    row_ok = pos.row < rows
    masks = []
    for j in _chunk_list(cfg, chunks):
        masks += _chunk_masks(cfg, chunk_index(cfg, pos, j) * cfg.vec, n, row_ok)
    return masks


def load_row(cfg: RowConfig, t, pos, n, rows, fill=0.0, chunks=None):
    """This thread's elements of row ``pos.row`` of the 2-D tensor ``t`` (``chunks * vec`` Float32 scalars, ``fill``
    where past N or past the last row) and their masks (Booleans: in range). ``chunks``: which of the thread's
    chunks (a range; default all), for kernels that walk a row in segments."""
    return widen(load_row_raw(cfg, t, pos, n, rows, fill, chunks)), row_masks(cfg, pos, n, rows, chunks)


def load_vector_chunk_raw(cfg: RowConfig, w, pos, n, j: int, fill=0.0):
    """As :func:`load_vector_chunk`, but one vector of ``w``'s dtype (:func:`widen` converts it): a kernel that
    loads a chunk early holds it in half the registers (16-bit types)."""
    c = chunk_index(cfg, pos, j)
    view = fx.local_tile(w, (cfg.vec,), (c,))
    return _load_chunk_raw(cfg, view, c * cfg.vec, n, pos.lane >= 0, fill, cfg.hints.vectors)


def load_vector_chunk(cfg: RowConfig, w, pos, n, j: int, fill=0.0):
    """This thread's chunk ``j`` of a 1-D (N,) tensor (weights, bias), laid out like the rows: ``vec`` Float32."""
    return widen([load_vector_chunk_raw(cfg, w, pos, n, j, fill)])


def load_vector_chunks_raw(cfg: RowConfig, w, pos, n):
    """All of this thread's chunks of a 1-D (N,) tensor as :func:`load_vector_chunk_raw` gives them, for a kernel that
    keeps them in registers in their dtype and widens each where it is used (:func:`vector_chunk`)."""
    return [load_vector_chunk_raw(cfg, w, pos, n, j) for j in range(cfg.chunks)]


def vector_chunk(cfg: RowConfig, w, pos, n, j: int, kept=None):
    """Chunk ``j`` of a 1-D (N,) tensor as Float32: widened from ``kept`` (:func:`load_vector_chunks_raw`), or loaded
    now when ``kept`` is None. The kept chunk is pinned (:func:`flydsl.expr.vector.pin`) where it is widened: kept
    across a loop, its widening would otherwise be hoisted out of it, and the wide values spill."""
    if kept is None:
        return load_vector_chunk(cfg, w, pos, n, j)
    return widen([vector.pin(kept[j])])


def load_vector_row(cfg: RowConfig, w, pos, n, fill=0.0):
    """This thread's elements of a 1-D (N,) tensor, all chunks."""
    values = []
    for j in fx.range_constexpr(cfg.chunks):
        values += load_vector_chunk(cfg, w, pos, n, j, fill)
    return values


def store_row(cfg: RowConfig, t, pos, n, rows, values, chunks=None) -> None:
    """Writes this thread's ``values`` (Float32 scalars, as from :func:`load_row`) into row ``pos.row`` of ``t``,
    converted to its dtype; nothing past N or past the last row. ``values`` may be a function of the chunk index
    giving that chunk's ``vec`` values: computed just before the chunk's store, which keeps what it loads (weights)
    out of the registers of the other chunks; ``cfg.store_group`` chunks at a time, all computed before their
    stores (the compilers do not move a load past a store to a pointer that may alias it: one chunk at a time, a
    thread waits for each chunk's loads in turn). ``chunks``: which of the thread's chunks (as in
    :func:`load_row`; ``values`` then holds those chunks' values, in order)."""
    row_ok = pos.row < rows
    wide = vector.vector_class(fx.Float32, cfg.vec)
    listed = list(enumerate(_chunk_list(cfg, chunks)))
    for first in fx.range_constexpr(0, len(listed), cfg.store_group):
        group = listed[first : first + cfg.store_group]
        cols = [chunk_index(cfg, pos, j) for _, j in group]
        views = [fx.local_tile(t, (1, cfg.vec), (pos.row, c))[0, None] for c in cols]
        parts = [values(j) if callable(values) else values[k * cfg.vec : (k + 1) * cfg.vec] for k, j in group]
        for c, view, part in zip(cols, views, parts, strict=True):
            chunk = vector.from_elements(wide.mlir_type(), part)
            _store_chunk(cfg, view, chunk.to(t.dtype), c * cfg.vec, n, row_ok)


def store_row_fp8(cfg: RowConfig, t, pos, n, rows, values, fmt: str = "e4m3") -> None:
    """As :func:`store_row`, into ``t`` (rows, N) of bytes: an fp8 tensor viewed as uint8 (memory holds no fp8
    type), each chunk's ``vec`` Float32 ``values`` converted in pairs by ``cvt.rn.satfinite`` (``fmt`` "e4m3" or
    "e5m2": out-of-range values saturate to the largest finite one, NaN stays NaN) and stored as ``vec`` bytes."""
    row_ok = pos.row < rows
    pairs = vector.vector_class(fx.Int16, cfg.vec // 2)
    for k, j in enumerate(_chunk_list(cfg, None)):
        c = chunk_index(cfg, pos, j)
        view = fx.local_tile(t, (1, cfg.vec), (pos.row, c))[0, None]  # (vec,) bytes
        part = values[k * cfg.vec : (k + 1) * cfg.vec]
        packed = [
            fx.Int16(nvvm.cvt_f32x2_to_fp8x2(part[2 * i + 1], part[2 * i], fmt).value) for i in range(cfg.vec // 2)
        ]
        chunk = vector.from_elements(pairs.mlir_type(), packed).bitcast(t.dtype)
        _store_chunk(cfg, view, chunk, c * cfg.vec, n, row_ok)


def _store_chunk(cfg: RowConfig, view, chunk, col, n, row_ok) -> None:
    """A chunk (a vector of the view's dtype) into its view, nothing out of range; hinted as ``cfg.hints.out``."""
    if fx.const_expr(cfg.even and cfg.hints.out is not None):
        words = chunk.bitcast(fx.Int32)
        nvvm.st_global(view, words, predicate=row_ok & (col < n), **_hint_qualifiers(cfg.hints.out))
    else:
        raw, buffer = vector.register_buffer(type(chunk))
        _llvm.store(chunk.value, raw, alignment=buffer.base_alignment)
        if fx.const_expr(cfg.even):
            fx.copy(buffer, view, predicate=row_ok & (col < n))
        else:
            for e in fx.range_constexpr(cfg.vec):
                ok = row_ok & (col + e < n)
                fx.copy(fx.local_tile(buffer, (1,), (e,)), fx.local_tile(view, (1,), (e,)), predicate=ok)


def load_vector(view, count: int):
    """``count`` contiguous elements of a view (shared memory) as one vector of its dtype."""
    cls = vector.vector_class(view.dtype, count)
    raw, buffer = vector.register_buffer(cls)
    fx.copy(view, buffer)
    return cls(_llvm.load(cls.mlir_type(), raw, alignment=buffer.base_alignment))


def pinned(values):
    """Float32 scalars pinned where they are computed (:func:`flydsl.expr.vector.pin`)."""
    wide = vector.vector_class(fx.Float32, len(values))
    held = vector.pin(vector.from_elements(wide.mlir_type(), values))
    return [held[e] for e in range(len(values))]


def inverse_n(n):
    """``1 / n`` as Float32: a constant where the row length is compiled in (``flyc.mark_static``: no register)."""
    return fx.Float32(1.0 / n) if isinstance(n, int) else 1.0 / n.to(fx.Float32)


def rounded(values, dtype):
    """Values rounded to ``dtype`` and back (what a tensor of that dtype holds)."""
    if fx.const_expr(dtype is fx.Float32):
        return values
    return [v.to(dtype).to(fx.Float32) for v in values]
