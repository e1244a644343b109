"""Complement, inverses, nullspace, common vectors and recasting.

``complement(A, M)`` is the ordered layout ``C`` of the offsets in ``[0, M)`` that ``A`` does not reach: its
strides grow, its image meets ``A``'s only at 0, and ``make_layout(A, C)`` is injective. ``right_inverse(L)``
is the largest compact ``R`` with ``L(R(i)) == i``; ``left_inverse(L)`` has ``R(L(i)) == i`` for an
injective ``L``.
"""

from __future__ import annotations

import math

from . import int_tuple as it
from .composition import _all_int, coalesce, composition, flat_modes, from_modes, less
from .layout import Layout, as_layout, cosize, make_layout, size
from .leaf import (
    LayoutError,
    ceil_div_leaf,
    decide,
    divides,
    floordiv,
    known_divisor,
    mul,
    provably_equal,
    require_static,
)
from .memo import static_cache

__all__ = [
    "complement",
    "right_inverse",
    "left_inverse",
    "nullspace",
    "max_common_layout",
    "max_common_vector",
    "upcast",
    "downcast",
    "recast_layout",
]


def _reaching_modes(layout, op):
    # Coalesced modes with a non-zero stride, sorted by stride (static strides needed to sort several).
    shapes, strides = flat_modes(layout)
    modes = [(s, d) for s, d in zip(shapes, strides, strict=True) if not provably_equal(d, 0)]
    if len(modes) > 1:
        for s, d in modes:
            if require_static(d, op, "stride") < 0:
                raise LayoutError(f"{op}: mode {s}:{d} of {layout} has a negative stride")
        modes.sort(key=lambda m: m[1])
    return modes


@static_cache
def complement(layout, cotarget=None) -> Layout:
    """The ordered layout of the offsets in ``[0, cotarget)`` not reached by ``layout`` (default cotarget:
    ``cosize(layout)``; a shape stands for its size).

    >>> complement(Layout(4, 1), 24), complement(Layout((2, 2), (1, 6)), 24)
    (6:4, (3,2):(2,12))
    """
    layout = as_layout(layout, "complement")
    if cotarget is None:
        cotarget = cosize(layout)
    else:
        cotarget = it.product(it.check_int_tuple(cotarget, "complement", "cotarget", low=1))
    if type(cotarget) is int:
        fast = _complement_static(layout, cotarget)
        if fast is not None:
            return fast
    shapes, strides = [], []
    cur = 1
    for s, d in _reaching_modes(layout, "complement"):
        if less(d, cur):
            raise LayoutError(f"complement: mode {s}:{d} overlaps the smaller modes (extent {cur}) of {layout}")
        ok = divides(cur, d)
        if ok is None:
            what = f"that stride {d} is a multiple of {cur} (the extent of the smaller modes) in {layout}"
            decide(ok, "complement", what, cur, d)
        if not ok:
            raise LayoutError(f"complement: stride {d} of mode {s}:{d} is not a multiple of {cur} in {layout}")
        gap = floordiv(d, cur)
        if not provably_equal(gap, 1):
            shapes.append(gap)
            strides.append(cur)
        cur = mul(s, d)
    shapes.append(ceil_div_leaf(cotarget, cur))
    strides.append(cur)
    return coalesce(from_modes(shapes, strides))


def _complement_static(layout, cotarget):
    # complement in plain int arithmetic; None (the general path then decides or raises) unless every stride is a
    # non-negative int and the modes nest (each stride a multiple of the extent of the smaller modes).
    shapes, strides = flat_modes(layout)
    if not (_all_int(shapes) and _all_int(strides)):
        return None
    modes = sorted((d, s) for s, d in zip(shapes, strides, strict=True) if d != 0)
    out_shapes, out_strides = [], []
    cur = 1
    for d, s in modes:
        if d < cur or d % cur:
            return None
        if d != cur:
            out_shapes.append(d // cur)
            out_strides.append(cur)
        cur = s * d
    out_shapes.append(-(-cotarget // cur))
    out_strides.append(cur)
    return from_modes(*flat_modes(from_modes(out_shapes, out_strides)))


def _domain_modes(layout):
    # Coalesced modes with the index (domain) position each one starts at.
    shapes, strides = flat_modes(layout)
    starts = it.leaves(it.compact_strides(tuple(shapes)))
    return list(zip(shapes, strides, starts, strict=True))


@static_cache
def right_inverse(layout) -> Layout:
    """The largest compact ``R`` with ``layout(R(i)) == i`` for ``i < size(R)`` (``1:0`` if offset 1 is never hit).

    >>> right_inverse(Layout((4, 8), (8, 1)))
    (8,4):(4,1)
    """
    modes = _domain_modes(as_layout(layout, "right_inverse"))
    shapes, strides = [], []
    cur = 1
    while True:
        found = next((m for m in modes if provably_equal(m[1], cur)), None)
        if found is None:
            break
        shapes.append(found[0])
        strides.append(found[2])
        cur = mul(found[0], found[1])
        modes = [m for m in modes if m is not found]
    return coalesce(from_modes(shapes, strides)) if shapes else Layout(1, 0)


@static_cache
def left_inverse(layout) -> Layout:
    """A layout ``R`` with ``R(layout(i)) == i`` for ``i < size(layout)``; ``layout`` must be injective with modes
    that nest by divisibility (CuTe's condition).

    >>> left_inverse(Layout((4, 8), (8, 1)))
    (8,4):(4,1)
    """
    layout = as_layout(layout, "left_inverse")
    shapes, strides = flat_modes(layout)
    for s, d in zip(shapes, strides, strict=True):
        if provably_equal(d, 0) and not provably_equal(s, 1):
            raise LayoutError(f"left_inverse: {layout} is not injective: mode {s}:0 maps {s} indices to one offset")
    return right_inverse(make_layout(layout, complement(layout)))


def nullspace(layout) -> Layout:
    """The layout of the indices that ``layout`` sends to offset 0 (its stride-0 modes, in index space).

    >>> nullspace(Layout((2, 4, 3), (1, 0, 2)))
    4:2
    """
    kept = [(s, start) for s, d, start in _domain_modes(as_layout(layout, "nullspace")) if provably_equal(d, 0)]
    if not kept or all(provably_equal(s, 1) for s, _ in kept):
        return Layout(1, 0)
    return from_modes([s for s, _ in kept], [start for _, start in kept])


def max_common_layout(a, b) -> Layout:
    """The largest layout ``R`` into the index space of ``b`` with ``a(R(i)) == b(R(i)) == i``: the elements that
    are contiguous in both layouts (for vectorized copies). A dynamic contiguous extent counts for its divisor.

    >>> max_common_layout(Layout((4, 8), (1, 4)), Layout((4, 8), (1, 8)))
    4:1
    """
    a, b = as_layout(a, "max_common_layout", "a"), as_layout(b, "max_common_layout", "b")
    inv_b = right_inverse(b)
    try:
        common = coalesce(composition(a, inv_b))
    except LayoutError:
        return Layout(1, 0)
    shapes, strides = flat_modes(common)
    if not provably_equal(strides[0], 1):
        return Layout(1, 0)
    n = known_divisor(shapes[0])
    while n > 1:  # a dynamic extent may not fit inv_b provably: shrink by prime factors until it does
        try:
            return coalesce(composition(inv_b, Layout(n)))
        except LayoutError:
            n //= next(p for p in range(2, n + 1) if n % p == 0)
    return Layout(1, 0)


def max_common_vector(a, b) -> int:
    """``size(max_common_layout(a, b))``: how many elements can move as one vector between ``a`` and ``b``.

    >>> max_common_vector(Layout((8, 8), (1, 8)), Layout((8, 8), (1, 8)))
    64
    """
    return size(max_common_layout(a, b))


def _scale_leaf(s, d, n, up):
    if provably_equal(d, 0):
        return s, d
    if not up:
        return (mul(s, n), d) if provably_equal(d, 1) or provably_equal(d, -1) else (s, mul(d, n))
    if isinstance(d, int):
        sign = -1 if d < 0 else 1
        return it.shape_div(s, it.shape_div(n, abs(d))), sign * it.shape_div(abs(d), n)
    if not decide(divides(n, d), "upcast", f"that {n} divides the stride", d):
        raise LayoutError(f"upcast: {n} does not divide the stride {d}")
    return s, floordiv(d, n)


def _scale(layout, n, up):
    op = "upcast" if up else "downcast"
    if type(n) is not int or n < 1:
        raise LayoutError(f"{op}: n must be a positive int, got {n!r}")
    scale = getattr(layout, "_fly_scale", None)
    if scale is not None:
        return scale(n, up)
    layout = as_layout(layout, op)
    pairs = [_scale_leaf(s, d, n, up) for s, d in zip(it.leaves(layout.shape), it.leaves(layout.stride), strict=True)]
    return Layout(it.unflatten([p[0] for p in pairs], layout.shape), it.unflatten([p[1] for p in pairs], layout.shape))


def upcast(layout, n: int) -> Layout:
    """Layout in units of an ``n`` times wider element: stride-1 modes shrink by ``n``, other strides divide.

    >>> upcast(Layout((8, 4), (1, 8)), 2)
    (4,4):(1,4)
    """
    return _scale(layout, n, True)


def downcast(layout, n: int) -> Layout:
    """Layout in units of an ``n`` times narrower element: stride-1 modes grow by ``n``, other strides multiply.

    >>> downcast(Layout((4, 4), (1, 4)), 2)
    (8,4):(1,8)
    """
    return _scale(layout, n, False)


def recast_layout(new_type_bits: int, old_type_bits: int, src_layout) -> Layout:
    """The layout of the same memory seen as elements of ``new_type_bits`` instead of ``old_type_bits`` bits.

    >>> recast_layout(32, 16, Layout((8, 4), (1, 8))), recast_layout(8, 16, Layout((4, 4), (1, 4)))
    ((4,4):(1,4), (8,4):(1,8))
    """
    for what, bits in (("new_type_bits", new_type_bits), ("old_type_bits", old_type_bits)):
        if type(bits) is not int or bits < 1:
            raise LayoutError(f"recast_layout: {what} must be a positive int, got {bits!r}")
    g = math.gcd(new_type_bits, old_type_bits)
    up, down = new_type_bits // g, old_type_bits // g
    layout = src_layout if up == 1 else upcast(src_layout, up)
    return layout if down == 1 else downcast(layout, down)
