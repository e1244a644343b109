"""Layouts in kernels: ``flydsl.layout`` with FlyDSL integers as dynamic leaves.

The algebra is the one of ``flydsl.layout``; leaves that are kernel values (``Int32``, ``Index``...) emit ``arith``
ops when the algebra combines them. Constants fold to Python ints first, so static parts stay static.
"""

from __future__ import annotations

import flydsl.layout as _fl
from flydsl.expr.numeric import Index, Integer, Numeric, as_numeric

__all__ = ["make_layout", "idx2crd", "crd2idx", "get", "size", "cosize", "rank", "static_leaf"]


def static_leaf(x):
    """A Python int for constants (ints, constant-valued numerics); other integers as they are."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return x
    number = as_numeric(x)
    constant = number.constant_value()
    if isinstance(constant, int) and isinstance(number, Integer):
        return constant
    if not isinstance(number, Integer):
        raise TypeError(f"layout leaves must be integers, got {type(number).__name__}")
    return number


def _leaves(tuple_):
    if isinstance(tuple_, (tuple, list)):
        return tuple(_leaves(t) for t in tuple_)
    return static_leaf(tuple_)


def make_layout(shape, stride=None) -> _fl.Layout:
    """``make_layout((4, 64), (64, 1))``; leaves may be kernel integers. Default stride: compact column-major."""
    if isinstance(shape, _fl.Layout):
        return shape
    return _fl.make_layout(_leaves(shape), None if stride is None else _leaves(stride))


def idx2crd(index, layout_or_shape):
    """The coordinate of a linear index (the seed's ``fx.idx2crd(tid, layout)``)."""
    shape = layout_or_shape.shape if isinstance(layout_or_shape, _fl.Layout) else _leaves(layout_or_shape)
    return _fl.idx2crd(static_leaf(index), shape)


def crd2idx(coord, layout) -> Numeric | int:
    """The offset of a coordinate: ``layout(coord)``."""
    return _fl.crd2idx(_leaves(coord), layout)


def get(tuple_, *indices):
    """A (nested) mode of an IntTuple or layout: ``get(coord, 0)``, ``get(layout, 1, 0)``."""
    return _fl.get(tuple_, *indices)


def size(x):
    return _fl.size(x)


def cosize(layout):
    return _fl.cosize(layout)


def rank(x) -> int:
    return _fl.rank(x)


def as_index(x) -> Numeric:
    """An ``Index`` for an int or kernel integer (what Fly ops take)."""
    if isinstance(x, int):
        return Index(x)
    return as_numeric(x).to(Index)
