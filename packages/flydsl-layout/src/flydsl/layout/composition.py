"""Coalesce, filter and composition.

``composition(A, B)`` is the layout ``R`` with ``R(i) == A(B(i))`` for every ``i < size(B)`` and
``size(R) == size(B)``, where ``A`` is evaluated beyond its size by extending its last mode. Each leaf mode
``s:d`` of ``B`` is walked through the modes of ``coalesce(A)`` like CuTe does, and the result is returned
only when it is provably right; otherwise a :class:`LayoutError` says which condition failed on which modes:

* a leaf that crosses a mode of ``A`` must have a stride that divides that mode's shape, and the remaining
  shape must be divisible by what the mode takes (CuTe's stride and shape divisibility conditions); a leaf
  whose offsets stay inside one mode needs neither (so ``(6,8):(8,1) o 2:4 == 2:32``);
* two leaves of ``B`` that land in the same mode of ``A`` must not carry into each other: their largest
  offsets in that mode must sum to less than its shape (CuTe does not check this and returns a wrong
  layout for ``(4,4):(1,10) o (4,2):(1,2)``).

With dynamic leaves the same conditions must be provable (see :mod:`flydsl.layout.leaf`); a rank-1 ``A``
is linear and needs none, which covers by-mode tiling of any dynamic layout.
"""

from __future__ import annotations

from . import int_tuple as it
from .layout import Layout, as_layout, get, make_layout, rank
from .leaf import (
    LayoutError,
    decide,
    divides,
    floordiv,
    is_static_leaf,
    known_divisor,
    mul,
    provably_equal,
    sub,
)
from .memo import lift_composed, static_cache

__all__ = ["coalesce", "filter_zeros", "filter_layout", "composition", "flat_modes", "from_modes", "less"]


def flat_modes(layout: Layout, keep_last: bool = False):
    """Coalesced leaf modes of ``layout`` as two lists (shapes, strides): size-1 modes dropped, neighbours
    ``s0:d0, s1:d1`` merged where ``d1 == s0*d0`` provably; an empty result is ``[1], [0]``. With ``keep_last``
    the last leaf is kept even when its size is 1, so that the layout extended beyond its size by its last
    mode is unchanged (``1:1`` extends to the identity, ``1:0`` to zero)."""
    shapes, strides = [], []
    ss, ds = it.leaves(layout.shape), it.leaves(layout.stride)
    last = len(ss) - 1
    if _all_int(ss) and _all_int(ds):
        # All leaves static: plain int arithmetic, no protocol dispatch per leaf.
        for k in range(last + 1):
            s, d = ss[k], ds[k]
            if s == 1 and not (keep_last and k == last):
                continue
            if shapes and shapes[-1] * strides[-1] == d:
                shapes[-1] *= s
                continue
            shapes.append(s)
            strides.append(d)
        return (shapes, strides) if shapes else ([1], [0])
    pairs = list(zip(ss, ds, strict=True))
    for k, (s, d) in enumerate(pairs):
        if provably_equal(s, 1) and not (keep_last and k == len(pairs) - 1):
            continue
        if shapes and provably_equal(mul(shapes[-1], strides[-1]), d):
            shapes[-1] = mul(shapes[-1], s)
            continue
        shapes.append(s)
        strides.append(d)
    return (shapes, strides) if shapes else ([1], [0])


def from_modes(shapes, strides) -> Layout:
    """The layout with these flat modes: a leaf shape for one mode, a tuple for several."""
    if len(shapes) == 1:
        return Layout.trusted(shapes[0], strides[0])
    return Layout.trusted(tuple(shapes), tuple(strides))


@static_cache
@lift_composed
def coalesce(layout, profile=None) -> Layout:
    """Same function on ``[0, size)`` with the fewest modes; with a tuple ``profile`` each top-level mode is
    coalesced on its own (by-mode), keeping the rank.

    >>> coalesce(Layout((2, (1, 6)), (1, (6, 2)))), coalesce(Layout((2, 4, 3), (1, 2, 8)), (0, 0, 0))
    (12:1, (2,4,3):(1,2,8))
    """
    layout = as_layout(layout, "coalesce")
    if it.is_tuple(profile):
        if len(profile) > rank(layout):
            raise LayoutError(f"coalesce: profile {it.tuple_str(profile)} has more modes than {layout}")
        modes = [coalesce(get(layout, i), p) for i, p in enumerate(profile)]
        return make_layout(*modes, *(get(layout, i) for i in range(len(profile), rank(layout))))
    return from_modes(*flat_modes(layout))


@static_cache
@lift_composed
def filter_zeros(layout) -> Layout:
    """Replace the shape of every mode with stride (provably) 0 by 1, keeping the structure.

    >>> filter_zeros(Layout((4, (2, 3)), (1, (0, 4))))
    (4,(1,3)):(1,(0,4))
    """
    layout = as_layout(layout, "filter_zeros")
    shape = it.transform(lambda s, d: 1 if provably_equal(d, 0) else s, layout.shape, layout.stride)
    return Layout(shape, layout.stride)


@static_cache
@lift_composed
def filter_layout(layout) -> Layout:
    """CuTe ``filter`` (exported as ``flydsl.layout.filter``): drop stride-0 and size-1 modes, then coalesce.

    >>> filter_layout(Layout((4, 2, 3), (1, 0, 8)))
    (4,3):(1,8)
    """
    return coalesce(filter_zeros(as_layout(layout, "filter")))


def less(x, y):
    """Whether ``x < y``: True/False when provable, None otherwise (a dynamic ``y`` is at least its divisor)."""
    if is_static_leaf(x):
        if is_static_leaf(y):
            return x < y
        if x < known_divisor(y):
            return True
    return None


def _compose_leaf(a, e, s, d, where):
    """Compose the coalesced flat layout ``a:e`` with one leaf mode ``s:d``.
    Returns (shapes, strides, usage) where usage lists (k, largest offset inside mode k) for the finite modes."""
    if provably_equal(s, 1):
        return [1], [0], []
    if provably_equal(d, 0):
        return [s], [0], []
    if is_static_leaf(d) and d < 0:
        raise LayoutError(f"composition: {where}: B's mode {s}:{d} has a negative stride")
    shapes, strides, usage = [], [], []
    for k in range(len(a) - 1):
        ak, ek = a[k], e[k]
        if divides(ak, d):  # every offset is a multiple of this mode's shape: it never moves here
            d = floordiv(d, ak)
            continue
        span = mul(sub(s, 1), d)
        if less(span, ak):  # every offset stays inside this mode
            shapes.append(s)
            strides.append(mul(d, ek))
            usage.append((k, span))
            return shapes, strides, usage
        ok = divides(d, ak)
        if ok is not True:
            mode = f"B's mode {s}:{d} crosses mode {k} ({ak}:{ek}) of coalesced A"
            decide(ok, "composition", f"stride divisibility: {mode}", d, ak)
            raise LayoutError(f"composition: {where}: stride divisibility fails: {mode} and {d} does not divide {ak}")
        m = floordiv(ak, d)
        ok = divides(m, s)
        if ok is not True:
            mode = f"B's mode {s}:{d} crosses mode {k} ({ak}:{ek}) of coalesced A"
            decide(ok, "composition", f"shape divisibility: {mode}", m, s)
            raise LayoutError(f"composition: {where}: shape divisibility fails: {mode} and {m} does not divide {s}")
        shapes.append(m)
        strides.append(mul(d, ek))
        usage.append((k, mul(sub(m, 1), d)))
        s, d = floordiv(s, m), 1
        if provably_equal(s, 1):
            return shapes, strides, usage
    shapes.append(s)
    strides.append(mul(d, e[-1]))
    return shapes, strides, usage


def _check_no_carry(a, usages, where):
    # Leaves of B that share a finite mode of A must not carry into the next mode when their offsets add up.
    spans = {}
    for usage in usages:
        for k, span in usage:
            spans.setdefault(k, []).append(span)
    for k, parts in spans.items():
        if len(parts) < 2:
            continue
        total = 0
        for p in parts:
            total = total + p if is_static_leaf(p) and is_static_leaf(total) else None
            if total is None:
                break
        ok = less(total, a[k]) if total is not None else None
        what = f"that modes of B do not carry within mode {k} (shape {a[k]}) of coalesced A"
        if not decide(ok, "composition", what, a[k], *parts):
            raise LayoutError(
                f"composition: {where}: modes of B overlap inside mode {k} (shape {a[k]}) of coalesced A: "
                f"their offsets there reach {total} >= {a[k]}, so A(B(i)) is not the sum over B's modes"
            )


@static_cache
def composition(lhs, rhs):
    """CuTe composition ``lhs o rhs``: ``R(i) == lhs(rhs(i))`` for ``i < size(rhs)``, with ``size(R) == size(rhs)``.
    ``rhs`` is a layout, an int ``n`` (the layout ``n:1``), or a tiler tuple of layouts / ints / None applied to
    the modes of ``lhs`` one by one (None keeps the mode).

    >>> composition(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))
    ((2,2),3):((24,2),8)
    >>> composition(Layout((12, 8), (8, 1)), (4, None))
    (4,8):(8,1)
    """
    compose = getattr(lhs, "_fly_compose", None)
    if compose is not None:
        return compose(rhs)
    lhs = as_layout(lhs, "composition", "lhs")
    if rhs is None:
        return lhs
    if isinstance(rhs, tuple):
        if len(rhs) > rank(lhs):
            raise LayoutError(f"composition: tiler {_tiler_str(rhs)} has more modes than {lhs}")
        modes = [composition(get(lhs, i), t) for i, t in enumerate(rhs)]
        return make_layout(*modes, *(get(lhs, i) for i in range(len(rhs), rank(lhs))))
    if not isinstance(rhs, Layout):
        precompose = getattr(rhs, "_fly_precompose", None)
        if precompose is not None:
            return precompose(lhs)
        if hasattr(rhs, "_fly_lift") or hasattr(rhs, "_fly_compose"):
            raise LayoutError(
                f"composition: a layout composed after a bare swizzle ({lhs} o {rhs}) is not supported; "
                "compose with the swizzled layout Sw o 0 o L instead"
            )
        rhs = as_layout(rhs, "composition", "rhs")
    a, e = flat_modes(lhs, keep_last=True)
    rs, rd = it.leaves(rhs.shape), it.leaves(rhs.stride)
    if _all_int(a) and _all_int(e) and _all_int(rs) and _all_int(rd):
        flat = _compose_static(a, e, rs, rd)
        if flat is not None:  # else a condition fails: the general path below says which
            return Layout.trusted(it.unflatten(flat[0], rhs.shape), it.unflatten(flat[1], rhs.shape))
    where = _Where(lhs, rhs)  # formatted only in an error message
    results = [
        _compose_leaf(a, e, s, d, where) for s, d in zip(it.leaves(rhs.shape), it.leaves(rhs.stride), strict=True)
    ]
    _check_no_carry(a, [r[2] for r in results], where)
    shape = it.unflatten([r[0][0] if len(r[0]) == 1 else tuple(r[0]) for r in results], rhs.shape)
    stride = it.unflatten([r[1][0] if len(r[1]) == 1 else tuple(r[1]) for r in results], rhs.shape)
    return Layout.trusted(shape, stride)


def _all_int(values) -> bool:
    for v in values:
        if type(v) is not int:
            return False
    return True


def _compose_static(a, e, rs, rd):
    """The composition of the coalesced static ``a:e`` with the static leaves ``rs:rd`` in plain int arithmetic
    (the same walk as :func:`_compose_leaf` and the same checks as :func:`_check_no_carry`): the flat result shapes
    and strides, one entry per leaf of B, or None when any condition fails (the general path then raises)."""
    out_shapes, out_strides = [], []
    spans = {}
    last = len(a) - 1
    for s, d in zip(rs, rd, strict=True):
        if s == 1:
            out_shapes.append(1)
            out_strides.append(0)
            continue
        if d == 0:
            out_shapes.append(s)
            out_strides.append(0)
            continue
        if d < 0:
            return None
        shapes, strides = [], []
        for k in range(last):
            ak = a[k]
            if d % ak == 0:
                d //= ak
                continue
            span = (s - 1) * d
            if span < ak:
                shapes.append(s)
                strides.append(d * e[k])
                spans.setdefault(k, []).append(span)
                s = 1
                break
            if ak % d:
                return None
            m = ak // d
            if s % m:
                return None
            shapes.append(m)
            strides.append(d * e[k])
            spans.setdefault(k, []).append((m - 1) * d)
            s, d = s // m, 1
            if s == 1:
                break
        else:
            shapes.append(s)
            strides.append(d * e[last])
        if len(shapes) == 1:
            out_shapes.append(shapes[0])
            out_strides.append(strides[0])
        else:
            out_shapes.append(tuple(shapes))
            out_strides.append(tuple(strides))
    for k, parts in spans.items():
        if len(parts) > 1 and sum(parts) >= a[k]:
            return None
    return out_shapes, out_strides


class _Where:
    __slots__ = ("lhs", "rhs")

    def __init__(self, lhs, rhs):
        self.lhs, self.rhs = lhs, rhs

    def __str__(self):
        return f"{self.lhs} o {self.rhs}"


def _tiler_str(tiler):
    return "(" + ",".join("_" if t is None else str(t) for t in tiler) + ")"
