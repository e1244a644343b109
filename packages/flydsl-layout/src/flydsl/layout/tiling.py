"""Divides and products, built from composition and complement.

* ``logical_divide(A, T) = composition(A, make_layout(T, complement(T, size(A))))``: mode 0 walks one tile,
  mode 1 walks the tiles. A tiler tuple divides mode by mode.
* ``logical_product(A, B) = make_layout(A, composition(complement(A, size(A) * cosize(B)), B))``: mode 0 is
  ``A``, mode 1 repeats it as ``B`` says.

The zipped / tiled / flat variants only regroup the modes of the logical result, through one helper
(:func:`_regroup`): zipped ``((tiles), (rests))``, tiled ``((tiles), rest0, rest1, ...)``, flat
``(tile0, tile1, ..., rest0, rest1, ...)``.
"""

from __future__ import annotations

from . import int_tuple as it
from .algebra import complement
from .composition import coalesce, composition
from .constructors import make_ordered_layout
from .layout import (
    Layout,
    append,
    as_layout,
    cosize,
    get,
    make_layout,
    rank,
    size,
)
from .leaf import LayoutError, decide, divides
from .memo import lift_composed, static_cache

__all__ = [
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "zipped_product",
    "tiled_product",
    "flat_product",
    "blocked_product",
    "raked_product",
    "tile_to_shape",
]


def _by_mode(op, target, tiler):
    # Apply a binary op mode by mode for a tiler tuple (None keeps the mode), returning the list of results.
    if len(tiler) > rank(target):
        raise LayoutError(f"{op.__name__}: tiler has {len(tiler)} modes but {target} has rank {rank(target)}")
    return [get(target, i) if t is None else op(get(target, i), t) for i, t in enumerate(tiler)]


def _rest_modes(target, tiler):
    return [get(target, i) for i in range(len(tiler), rank(target))]


def _tiled(op, leaf_op, target, tiler):
    # The logical divide/product dispatch: None keeps the layout, a tiler tuple applies op mode by mode (the modes
    # it does not cover stay), a layout or shape goes to leaf_op(target, tiler_layout).
    target = as_layout(target, op.__name__, "target")
    if tiler is None:
        return target
    if isinstance(tiler, tuple):
        return make_layout(*_by_mode(op, target, tiler), *_rest_modes(target, tiler))
    return leaf_op(target, as_layout(tiler, op.__name__, "tiler"))


@static_cache
@lift_composed
def logical_divide(target, tiler) -> Layout:
    """Split ``target`` into (tile, rest): ``R(i, j)`` is element ``i`` of tile ``j``.

    >>> logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2))
    ((2,2),(2,3)):((4,1),(2,8))
    >>> logical_divide(Layout((9, (4, 8)), (59, (13, 1))), (Layout(3, 3), Layout((2, 4), (1, 8))))
    ((3,3),((2,4),(2,2))):((177,59),((13,2),(26,1)))
    """
    return _tiled(logical_divide, _divide, target, tiler)


def _divide(target, tiler):
    return composition(target, make_layout(tiler, complement(tiler, size(target))))


@static_cache
@lift_composed
def logical_product(block, tiler) -> Layout:
    """``(block, tiler-many copies of block)``: mode 0 is ``block``, mode 1 lays out the copies as ``tiler`` says.

    >>> logical_product(Layout((2, 2), (4, 1)), Layout(6, 1))
    ((2,2),(2,3)):((4,1),(2,8))
    """
    return _tiled(logical_product, _product, block, tiler)


def _product(block, tiler):
    return make_layout(block, composition(complement(block, size(block) * cosize(tiler)), tiler))


def _split(op, target, tiler):
    # The logical result as two layouts (tiles, rests), with the modes a tiler tuple leaves alone in the rests.
    target = as_layout(target, op.__name__, "target")
    if not isinstance(tiler, tuple):
        result = op(target, tiler)
        return get(result, 0), get(result, 1)
    modes = _by_mode(op, target, tiler)
    pairs = [(m, Layout(1, 0)) if t is None else (get(m, 0), get(m, 1)) for m, t in zip(modes, tiler, strict=True)]
    return make_layout(*(p[0] for p in pairs)), make_layout(*(p[1] for p in pairs), *_rest_modes(target, tiler))


def _regroup(op, target, tiler, style):
    tiles, rests = _split(op, target, tiler)
    if style == "zipped":
        return make_layout(tiles, rests)
    if style == "tiled":
        return make_layout(tiles, *rests)
    return make_layout(*tiles, *rests)


@static_cache
@lift_composed
def zipped_divide(target, tiler) -> Layout:
    """``((tile modes), (rest modes))``: mode 0 indexes inside a tile, mode 1 picks the tile.

    >>> zipped_divide(Layout((8, 6), (6, 1)), (4, 3))
    ((4,3),(2,2)):((6,1),(24,3))
    """
    return _regroup(logical_divide, target, tiler, "zipped")


@static_cache
@lift_composed
def tiled_divide(target, tiler) -> Layout:
    """``((tile modes), rest0, rest1, ...)``.

    >>> tiled_divide(Layout((8, 6), (6, 1)), (4, 3))
    ((4,3),2,2):((6,1),24,3)
    """
    return _regroup(logical_divide, target, tiler, "tiled")


@static_cache
@lift_composed
def flat_divide(target, tiler) -> Layout:
    """``(tile0, tile1, ..., rest0, rest1, ...)``.

    >>> flat_divide(Layout((8, 6), (6, 1)), (4, 3))
    (4,3,2,2):(6,1,24,3)
    """
    return _regroup(logical_divide, target, tiler, "flat")


@static_cache
@lift_composed
def zipped_product(block, tiler) -> Layout:
    """``((block modes), (repeat modes))`` of the by-mode logical product.

    >>> zipped_product(Layout((2, 2), (1, 2)), (3, 4))
    ((2,2),(3,(2,2))):((1,2),(2,(1,4)))
    """
    return _regroup(logical_product, block, tiler, "zipped")


@static_cache
@lift_composed
def tiled_product(block, tiler) -> Layout:
    """``((block modes), repeat0, repeat1, ...)``.

    >>> tiled_product(Layout((2, 2), (1, 2)), (3, 4))
    ((2,2),3,(2,2)):((1,2),2,(1,4))
    """
    return _regroup(logical_product, block, tiler, "tiled")


@static_cache
@lift_composed
def flat_product(block, tiler) -> Layout:
    """``(block0, block1, ..., repeat0, repeat1, ...)``.

    >>> flat_product(Layout((2, 2), (1, 2)), (3, 4))
    (2,2,3,(2,2)):(1,2,2,(1,4))
    """
    return _regroup(logical_product, block, tiler, "flat")


def _zip_product(block, tiler, block_first):
    # Rank-1 operands become 1-tuples so that mode i of the repeats is the image of tiler mode i as a whole.
    name = "blocked_product" if block_first else "raked_product"
    block, tiler = as_layout(block, name, "block"), as_layout(tiler, name, "tiler")
    block, tiler = (x if it.is_tuple(x.shape) else make_layout(x) for x in (block, tiler))
    r = max(rank(block), rank(tiler))
    pad = Layout(1, 0)
    block = append(block, pad, up_to_rank=r) if rank(block) < r else block
    tiler = append(tiler, pad, up_to_rank=r) if rank(tiler) < r else tiler
    repeats = get(logical_product(block, tiler), 1)
    pairs = [(get(block, i), get(repeats, i)) for i in range(r)]
    return make_layout(*(make_layout(*(p if block_first else p[::-1])) for p in pairs))


@static_cache
@lift_composed
def blocked_product(block, tiler) -> Layout:
    """Mode ``i`` is ``(block_i, repeat_i)``: whole blocks laid side by side as ``tiler`` says.

    >>> blocked_product(Layout((2, 2), (1, 2)), Layout((2, 3), (3, 1)))
    ((2,2),(2,3)):((1,12),(2,4))
    """
    return _zip_product(block, tiler, True)


@static_cache
@lift_composed
def raked_product(block, tiler) -> Layout:
    """Mode ``i`` is ``(repeat_i, block_i)``: the blocks' elements interleaved (raked) across the repeats.

    >>> raked_product(Layout((2, 2), (1, 2)), Layout((2, 3), (3, 1)))
    ((2,2),(3,2)):((12,1),(4,2))
    """
    return _zip_product(block, tiler, False)


@static_cache
@lift_composed
def tile_to_shape(block, trg_shape, order=None) -> Layout:
    """Repeat ``block`` (blocked product) until it covers ``trg_shape``; the repeats are ordered by ``order``
    (default column-major). Each mode of the block must divide the matching target mode.

    >>> tile_to_shape(Layout((2, 2), (1, 2)), (4, 6))
    ((2,2),(2,3)):((1,4),(2,8))
    """
    block = as_layout(block, "tile_to_shape", "block")
    it.check_int_tuple(trg_shape, "tile_to_shape", "trg_shape", low=1)
    if not isinstance(trg_shape, tuple):
        return get(tile_to_shape(make_layout(block), (trg_shape,), order), 0)
    if not isinstance(block.shape, tuple):
        block = make_layout(block)  # a leaf shape is one mode: 4:1 as (4):(1)
    r = len(trg_shape)
    if rank(block) > r:
        raise LayoutError(f"tile_to_shape: {block} has more modes than the target shape {it.tuple_str(trg_shape)}")
    block = append(block, Layout(1, 0), up_to_rank=r) if rank(block) < r else block
    block_shape, target = it.product_each(block.shape), it.product_each(trg_shape)
    for b, t in zip(block_shape, target, strict=True):
        if not decide(divides(b, t), "tile_to_shape", f"that block mode {b} divides target mode {t}", b, t):
            raise LayoutError(f"tile_to_shape: block {block} mode of size {b} does not divide target mode {t}")
    reps = it.ceil_div(target, block_shape)
    repeat = make_layout(reps) if order is None else make_ordered_layout(reps, order)
    return coalesce(blocked_product(block, repeat), reps)
