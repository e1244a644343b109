"""Layouts built from a shape: compact with strides in a given order (:func:`make_ordered_layout`), and the identity
layout (:func:`make_identity_layout`, strides :func:`make_basis_like`) that maps each coordinate to itself."""

from __future__ import annotations

from . import int_tuple as it
from .layout import Layout
from .leaf import LayoutError, ScaledBasis, is_static_leaf, mul, require_static

__all__ = ["make_ordered_layout", "make_basis_like", "make_identity_layout"]


def make_ordered_layout(shape, order) -> Layout:
    """Compact layout whose strides grow in the order given by ``order`` (each of ``0..n-1`` once, one per leaf).

    >>> make_ordered_layout((4, 8, 2), (1, 0, 2))
    (4,8,2):(8,1,32)
    """
    it.check_int_tuple(shape, "make_ordered_layout", "shape", low=1)
    if is_static_leaf(order) and it.is_tuple(shape):
        order = tuple(range(it.rank(shape))) if order == 0 else order
    it.check_int_tuple(order, "make_ordered_layout", "order")
    shapes, orders = it.leaves(shape), it.leaves(order)
    if sorted(require_static(o, "make_ordered_layout", "order") for o in orders) != list(range(len(shapes))):
        raise LayoutError(
            f"make_ordered_layout: order must hold each of 0..{len(shapes) - 1} once, one per leaf of shape "
            f"{it.tuple_str(shape)}, got {it.tuple_str(order)}"
        )
    ranked = sorted(range(len(shapes)), key=lambda i: orders[i])
    strides = [0] * len(shapes)
    running = 1
    for i in ranked:
        strides[i] = running
        running = mul(running, shapes[i])
    return Layout(shape, it.unflatten(strides, shape))


def make_basis_like(shape):
    """CuTe's ``make_basis_like``: the basis element ``1@path`` at each leaf of ``shape`` (a leaf shape gets ``1``).

    >>> make_basis_like((4, (2, 3)))
    (1@0, (1@1@0, 1@1@1))
    """
    it.check_int_tuple(shape, "make_basis_like", "shape", low=1)

    def walk(x, path):
        if isinstance(x, tuple):
            return tuple(walk(c, path + (i,)) for i, c in enumerate(x))
        return ScaledBasis(1, path) if path else 1

    return walk(shape, ())


def make_identity_layout(shape) -> Layout:
    """CuTe's ``make_identity_layout``: the layout ``shape:make_basis_like(shape)`` that maps each coordinate (or
    index) to the coordinate itself. Divide it like the data to get each tile element's global coordinate, e.g.
    to predicate the tail tiles: ``zipped_divide(make_identity_layout((M, N)), tile)(i, t)``. A value lists the
    modes that the strides name (0 where a coordinate has nothing), so a layout derived from the identity that
    never moves along a trailing mode, e.g. ``2:1@0``, gives the shorter coordinate ``(i,)``.

    >>> I = make_identity_layout((4, 8))
    >>> I, I(5), I(2, 7)
    ((4,8):(1@0,1@1), (1, 1), (2, 7))
    """
    it.check_int_tuple(shape, "make_identity_layout", "shape", low=1)
    return Layout(shape, make_basis_like(shape))
