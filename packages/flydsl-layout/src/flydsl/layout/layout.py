"""The Layout: a pair of congruent IntTuples (shape, stride) mapping coordinates to offsets.

``Layout((4, 8), (1, 4))`` is CuTe's ``(4,8):(1,4)``: coordinate ``(i, j)`` maps to ``i*1 + j*4``, and the
index ``k`` (the colexicographic position of a coordinate) to ``L(k)``. This module holds construction,
coordinate maps and mode selection / slicing; the algebra lives in :mod:`composition`, :mod:`algebra`
and :mod:`tiling`.
"""

from __future__ import annotations

from . import int_tuple as it
from .leaf import (
    LayoutError,
    add,
    as_coord,
    check_leaf,
    floordiv,
    is_basis,
    mod,
    mul,
    sub,
)

__all__ = [
    "Layout",
    "as_layout",
    "make_layout",
    "crd2idx",
    "idx2crd",
    "crd2crd",
    "is_static",
    "size",
    "cosize",
    "rank",
    "depth",
    "get",
    "select",
    "take",
    "group",
    "group_modes",
    "append",
    "prepend",
    "slice_",
    "slice_and_offset",
    "dice",
]


class Layout:
    """A CuTe layout ``shape:stride``; ``stride`` defaults to the compact column-major strides of ``shape``.

    >>> L = Layout((4, 8), (8, 1))
    >>> L, L(1, 2), L(9), L.shape, L.stride
    ((4,8):(8,1), 10, 10, (4, 8), (8, 1))
    """

    __slots__ = ("_shape", "_stride", "_key", "_static")

    def __init__(self, shape, stride=None):
        if isinstance(shape, list):
            shape = tuple(shape)
        it.check_int_tuple(shape, "Layout", "shape", low=1)
        if stride is None:
            stride = it.compact_strides(shape)
        else:
            if isinstance(stride, list):
                stride = tuple(stride)
            if not _stride_fits(stride, shape):
                it.check_int_tuple(stride, "Layout", "stride", basis=True)  # bounded, before printing it
                raise LayoutError(
                    f"Layout: stride {it.tuple_str(stride)} is not congruent with shape {it.tuple_str(shape)}"
                )
        self._shape = shape
        self._stride = stride
        self._key = self._static = None

    @classmethod
    def trusted(cls, shape, stride) -> Layout:
        """Build without validation, for the algebra's own results (congruent and positive by construction)."""
        self = object.__new__(cls)
        self._shape, self._stride, self._key, self._static = shape, stride, None, None
        return self

    @property
    def shape(self):
        """The shape IntTuple."""
        return self._shape

    @property
    def stride(self):
        """The stride IntTuple (congruent with the shape)."""
        return self._stride

    def __call__(self, *coord):
        """Evaluate: ``L(i)``, ``L(i, j)`` or ``L((i, j))``; a coordinate holding None slices (see :func:`slice_`)."""
        c = coord[0] if len(coord) == 1 else coord
        it.check_int_tuple(c, "Layout", "coordinate", low=0, none=True)
        if any(v is None for v in it.leaves(c)):
            return slice_(c, self)
        return _offset(c, self._shape, self._stride)

    def __getitem__(self, i):
        """Mode ``i`` as a Layout (CuTe ``layout<i>``); a rank-1 layout with a leaf shape is its own mode 0."""
        return get(self, i)

    def __len__(self):
        return it.rank(self._shape)

    def __iter__(self):
        return (get(self, i) for i in range(len(self)))

    def _fly_static(self) -> bool:
        """Whether every leaf is static (computed once: a layout is immutable)."""
        if self._static is None:
            self._static = it.is_static(self._shape) and it.is_static(self._stride)
        return self._static

    def _identity(self):
        if self._key is None:
            self._key = (it.tree_key(self._shape), it.tree_key(self._stride))
        return self._key

    def __eq__(self, other):
        """Structural equality of shape and stride (dynamic leaves compare by identity, never emitting ops)."""
        return isinstance(other, Layout) and self._identity() == other._identity()

    def __hash__(self):
        return hash(self._identity())

    def __repr__(self):
        return f"{it.tuple_str(self._shape)}:{it.tuple_str(self._stride)}"

    __str__ = __repr__


def _stride_fits(d, s) -> bool:
    # Walk a stride along its (checked) shape: each leaf checked, False where the two are not congruent.
    if type(s) is tuple:
        if type(d) is not tuple or len(d) != len(s):
            return False
        for a, b in zip(d, s, strict=True):
            if type(a) is not int or type(b) is tuple:  # a flat pair of int tuples needs no recursion
                return all(_stride_fits(a, b) for a, b in zip(d, s, strict=True))
        return True
    if type(d) is tuple:
        return False
    check_leaf(d, "Layout", "stride", basis=True)
    return True


def as_layout(x, op: str = "as_layout", what: str = "layout") -> Layout:
    """A Layout from a Layout, or from a shape IntTuple (compact column-major); ``as_layout(4) == 4:1``. Anything else
    is refused with a LayoutError naming ``op`` and ``what``."""
    if isinstance(x, Layout):
        return x
    if isinstance(x, list):
        x = tuple(x)
    try:
        it.check_int_tuple(x, op, what, low=1)
    except LayoutError as err:
        raise LayoutError(f"{err} (a layout, or a shape of positive ints)") from None
    return Layout.trusted(x, it.compact_strides(x))


def make_layout(*args, stride=None) -> Layout:
    """``make_layout(shape, stride=None)``, or ``make_layout(L0, L1, ...)`` whose modes are the given layouts.

    >>> make_layout((4, 8)), make_layout(Layout(4, 2), Layout(8, 1))
    ((4,8):(1,4), (4,8):(2,1))
    """
    if args and all(type(a) is Layout or isinstance(a, Layout) for a in args):
        if stride is not None:
            raise LayoutError("make_layout: a stride cannot be given with layout modes")
        return Layout.trusted(tuple([a._shape for a in args]), tuple([a._stride for a in args]))
    if len(args) == 2 and stride is None:
        args, stride = args[:1], args[1]
    if len(args) != 1:
        raise TypeError("make_layout(shape, stride=None) or make_layout(layout, layout, ...)")
    return Layout(args[0], stride)


def _crd2idx(c, s, d):
    if isinstance(c, tuple):
        if not isinstance(s, tuple) or len(c) != len(s):
            raise LayoutError(f"crd2idx: coordinate {it.tuple_str(c)} does not fit shape {it.tuple_str(s)}")
        total = 0
        for ci, si, di in zip(c, s, d, strict=True):
            total = add(total, _crd2idx(ci, si, di))
        return total
    if c is None:
        raise LayoutError("crd2idx: a coordinate holding None is a slice; use slice_ or slice_and_offset")
    if isinstance(s, tuple):
        # An integer coordinate into a tuple shape: colexicographic, the last mode takes the rest.
        total = 0
        for si, di in zip(s[:-1], d[:-1], strict=True):
            n = it.product(si)
            total = add(total, _crd2idx(mod(c, n), si, di))
            c = floordiv(c, n)
        return add(total, _crd2idx(c, s[-1], d[-1])) if s else total
    return mul(c, d)


def crd2idx(coord, layout_or_shape, stride=None):
    """Offset of ``coord`` under a layout, or under ``(shape, stride)`` (default stride: compact column-major).
    An integer coordinate is first unfolded colexicographically; the last mode is unbounded.

    >>> crd2idx((1, 2), Layout((4, 8), (8, 1))), crd2idx(5, (2, 4), (4, 1))
    (10, 6)
    """
    it.check_int_tuple(coord, "crd2idx", "coordinate", low=0, none=True)  # None: _crd2idx says to slice
    if isinstance(layout_or_shape, Layout):
        shape, stride = layout_or_shape.shape, layout_or_shape.stride
    else:
        shape = it.check_int_tuple(layout_or_shape, "crd2idx", "shape", low=1)
        if stride is None:
            stride = it.compact_strides(shape)
        else:
            it.check_int_tuple(stride, "crd2idx", "stride", basis=True)
    return _offset(coord, shape, stride)


def _offset(coord, shape, stride):
    # crd2idx of checked arguments.
    value = _crd2idx(coord, shape, stride)
    if (type(value) is int and value != 0) or not any(is_basis(d) for d in it.leaves(stride)):
        return value
    # A coordinate: every mode that a basis stride names is present, with 0 where this coordinate has nothing.
    return as_coord(value, [d.mode for d in it.leaves(stride) if is_basis(d)])


def idx2crd(index, layout_or_shape):
    """The coordinate of ``index``: for a shape, its colexicographic coordinate; for a layout, ``(index // d) % s``
    at each leaf (CuTe's ``idx2crd(idx, shape, stride)``), which inverts a compact layout.

    >>> idx2crd(13, (4, 8)), idx2crd(70, Layout((4, 64), (64, 1)))
    ((1, 3), (1, 6))
    """
    it.check_int_tuple(index, "idx2crd", "index", low=0)
    if not isinstance(layout_or_shape, Layout):
        it.check_int_tuple(layout_or_shape, "idx2crd", "shape", low=1)
    if isinstance(index, tuple):
        if isinstance(layout_or_shape, Layout):
            pairs = it.transform(
                lambda i, s, d: idx2crd(i, Layout(s, d)), index, *_parts(layout_or_shape), op="idx2crd"
            )
            return pairs
        return it.transform(idx2crd, index, layout_or_shape, op="idx2crd")
    if isinstance(layout_or_shape, Layout):
        shape, stride = layout_or_shape.shape, layout_or_shape.stride
    else:
        shape, stride = layout_or_shape, it.compact_strides(layout_or_shape)
    return it.transform(lambda s, d: mod(floordiv(index, d), s), shape, stride, op="idx2crd")


def _parts(layout):
    return layout.shape, layout.stride


def crd2crd(coord, src_shape, dst_shape):
    """Convert a coordinate of ``src_shape`` to the coordinate of the same index in ``dst_shape``.

    >>> crd2crd((1, 2), (4, 8), (8, 4))
    (1, 1)
    """
    return idx2crd(crd2idx(coord, src_shape), dst_shape)


def is_static(x) -> bool:
    """True when every leaf of an IntTuple or of a layout's shape and stride is a Python int."""
    if isinstance(x, Layout):
        return it.is_static(x.shape) and it.is_static(x.stride)
    inner = getattr(x, "inner", None)
    if inner is not None:
        return is_static(inner)
    return it.is_static(it.check_int_tuple(x, "is_static", "x", none=True, basis=True))


def _modes(mode):
    if mode is None:
        return ()
    return tuple(mode) if isinstance(mode, (list, tuple)) else (mode,)


def _get_one(x, i):
    if type(i) is not int:
        raise LayoutError(f"get: a mode index must be an int, got {i!r}")
    if isinstance(x, tuple):
        if not -len(x) <= i < len(x):
            raise LayoutError(f"get: mode {i} out of range for {it.tuple_str(x)} of rank {len(x)}")
        return x[i]
    if i not in (0, -1):
        raise LayoutError(f"get: mode {i} out of range for the rank-1 leaf {it.tuple_str(x)}")
    return x


def _apply(op, x, *parts):
    # Run a tuple operation on an IntTuple, or on a layout's shape and stride in parallel.
    lift = getattr(x, "_fly_lift", None)
    if lift is not None:
        return lift(lambda inner: _apply(op, inner, *parts))
    if isinstance(x, Layout):
        # The same structural op on congruent shape and stride keeps them congruent: no need to validate again.
        parts = [as_layout(p) for p in parts]
        return Layout.trusted(op(x.shape, *(p.shape for p in parts)), op(x.stride, *(p.stride for p in parts)))
    return op(x, *parts)


def get(x, *modes, mode=None):
    """The (nested) mode ``x[i][j]...`` of a layout or IntTuple: ``get(L, 0, 1)`` or ``get(L, mode=[0, 1])``.

    >>> get(Layout(((2, 4), 8), ((1, 16), 2)), 0, 1)
    4:16
    """
    if mode is None and len(modes) == 1 and type(x) is Layout and type(modes[0]) is int:
        shape, i = x._shape, modes[0]
        if type(shape) is tuple and -len(shape) <= i < len(shape):  # the common case, without _apply
            return Layout.trusted(shape[i], x._stride[i])
    path = modes if mode is None else _modes(mode)
    if len(path) == 1 and isinstance(path[0], (list, tuple)):
        path = tuple(path[0])

    def walk(t):
        for i in path:
            t = _get_one(t, i)
        return t

    return _apply(walk, x)


def select(x, *modes, mode=None):
    """The layout (or IntTuple) made of the listed top-level modes, in that order.

    >>> select(Layout((2, 3, 4), (1, 2, 6)), 2, 0)
    (4,2):(6,1)
    """
    picks = modes if mode is None else _modes(mode)
    if len(picks) == 1 and isinstance(picks[0], (list, tuple)):
        picks = tuple(picks[0])
    return _apply(lambda t: tuple(_get_one(t, i) for i in picks), x)


def _as_tuple(t):
    return t if isinstance(t, tuple) else (t,)


def _check_modes(op, t, begin, end):
    # The mode range [begin, end) of the tuple t: 0 <= begin <= end <= rank.
    if type(begin) is not int or type(end) is not int or not 0 <= begin <= end <= len(t):
        raise LayoutError(f"{op}: needs ints 0 <= begin <= end <= rank {len(t)}, got begin={begin!r}, end={end!r}")


def take(x, begin, end):
    """Modes ``[begin, end)`` as a layout (or IntTuple): ``take((2,3,4):(1,2,6), 1, 3) == (3,4):(2,6)``."""

    def op(t):
        t = _as_tuple(t)
        _check_modes("take", t, begin, end)
        return t[begin:end]

    return _apply(op, x)


def group(x, begin, end):
    """Group modes ``[begin, end)`` into one mode (CuTe ``group_modes``).

    >>> group(Layout((2, 3, 4), (1, 2, 6)), 0, 2)
    ((2,3),4):((1,2),6)
    """

    def op(t):
        t = _as_tuple(t)
        stop = len(t) if end is None else end
        _check_modes("group", t, begin, stop)
        return t[:begin] + (t[begin:stop],) + t[stop:]

    return _apply(op, x)


group_modes = group


def _extend(x, elem, up_to_rank, at_end):
    name = "append" if at_end else "prepend"

    def op(t, e):
        t = _as_tuple(t)
        if up_to_rank is not None and (type(up_to_rank) is not int or up_to_rank < len(t)):
            raise LayoutError(f"{name}: up_to_rank must be an int >= the rank {len(t)}, got {up_to_rank!r}")
        count = 1 if up_to_rank is None else up_to_rank - len(t)
        return t + (e,) * count if at_end else (e,) * count + t

    if isinstance(x, Layout) and not isinstance(elem, Layout):
        raise LayoutError(f"{name}: a layout is extended by a layout, got {elem!r}")
    if not isinstance(x, Layout) and not hasattr(x, "_fly_lift"):
        it.check_int_tuple(x, name, "x", none=True, basis=True)
        it.check_int_tuple(elem, name, "elem", none=True, basis=True)
    return _apply(op, x, elem)


def append(x, elem, up_to_rank=None):
    """Append ``elem`` as a last mode (repeated up to rank ``up_to_rank`` if given).

    >>> append(Layout(4, 1), Layout(1, 0), up_to_rank=3)
    (4,1,1):(1,0,0)
    """
    return _extend(x, elem, up_to_rank, True)


def prepend(x, elem, up_to_rank=None):
    """Prepend ``elem`` as a first mode: ``prepend(4:1, 2:4) == (2,4):(4,1)``."""
    return _extend(x, elem, up_to_rank, False)


def _filter_modes(coord, t, keep_leaf):
    # CuTe's filter_tuple/lift_slice: the kept parts of t, spliced into one tuple per tuple of coord.
    if isinstance(coord, tuple):
        if not isinstance(t, tuple) or len(t) != len(coord):
            raise LayoutError(f"slice: coordinate {it.tuple_str(coord)} does not fit {it.tuple_str(t)}")
        kept = []
        for c, x in zip(coord, t, strict=True):
            part = _filter_modes(c, x, keep_leaf)
            if isinstance(c, tuple):
                kept.extend(part)  # CuTe's lslice: a sub-tuple's kept modes are spliced in, not nested
            elif keep_leaf(c):
                kept.append(part)
        return tuple(kept)
    return t if keep_leaf(coord) else ()


def _check_coord(op, coord, shape):
    # A slicing coordinate: ints and None, each int inside its mode (0 <= c < the mode's size, where static).
    it.check_int_tuple(coord, op, "coordinate", low=0, none=True)
    _inside(op, coord, shape)


def _inside(op, c, s):
    if isinstance(c, tuple):
        if isinstance(s, tuple) and len(s) == len(c):  # else the slice itself reports the mismatch
            for ci, si in zip(c, s, strict=True):
                _inside(op, ci, si)
    elif type(c) is int:
        n = it.product(s)
        if type(n) is int and c >= n:
            raise LayoutError(f"{op}: coordinate {c} is outside its mode {it.tuple_str(s)} of size {n}")


def _slice_or_dice(coord, x, keep_leaf, op):
    if isinstance(coord, Layout) and not isinstance(x, Layout):
        coord, x = x, coord  # CuTe DSL's argument order slice_(layout, coord)
    if not isinstance(x, Layout):
        it.check_int_tuple(x, op, "x", none=True, basis=True)
    _check_coord(op, coord, x.shape if isinstance(x, Layout) else x)
    return _apply(lambda t: _filter_modes(coord, t, keep_leaf), x)


def slice_(coord, x):
    """Keep the modes where ``coord`` is None (CuTe's underscore), drop the others. CuTe DSL's order
    ``slice_(layout, coord)`` is accepted too.

    >>> slice_((None, 2), Layout((4, 8), (8, 1)))
    (4):(8)
    """
    if hasattr(coord, "_fly_slice"):
        coord, x = x, coord
    if hasattr(x, "_fly_slice"):
        return x._fly_slice(coord)[0]
    return _slice_or_dice(coord, x, lambda c: c is None, "slice_")


def slice_and_offset(coord, layout):
    """``(slice_(coord, layout), layout(coord with None as 0))``: the sub-layout and where it starts.

    >>> slice_and_offset((None, 2), Layout((4, 8), (8, 1)))
    ((4):(8), 2)
    """
    slicer = getattr(layout, "_fly_slice", None)
    if slicer is not None:
        return slicer(coord)
    _check_coord("slice_and_offset", coord, as_layout(layout, "slice_and_offset").shape)
    zeroed = it.fold(coord, lambda c: 0 if c is None else c, lambda parts: parts)
    return slice_(coord, layout), crd2idx(zeroed, layout)


def dice(coord, x):
    """Keep the modes where ``coord`` is an integer, drop those where it is None (the complement of slice_).

    >>> dice((None, 2), Layout((4, 8), (8, 1)))
    (8):(1)
    """
    return _slice_or_dice(coord, x, lambda c: c is not None, "dice")


def _sub(x, mode):
    return get(x, mode=mode) if _modes(mode) else x


def size(x, mode=()):
    """Number of coordinates of a layout (product of its shape) or product of an IntTuple; ``mode`` selects a
    sub-mode first (CuTe DSL's ``size(a, mode=[i, j])``).

    >>> size(Layout(((2, 4), 8))), size(Layout(((2, 4), 8)), mode=[0])
    (64, 8)
    """
    x = _sub(x, mode)
    if isinstance(x, Layout):
        return it.product(x.shape)
    inner = getattr(x, "inner", None)
    return size(inner) if inner is not None else it.product(it.check_int_tuple(x, "size", "x"))


def cosize(layout, mode=()):
    """One past the largest offset: ``L(size(L) - 1) + 1`` (for non-negative strides).

    >>> cosize(Layout((4, 8), (1, 8)))
    60
    """
    layout = _sub(layout, mode)
    cosize_of = getattr(layout, "_fly_cosize", None)
    if cosize_of is not None:
        return cosize_of()
    layout = as_layout(layout, "cosize")
    if any(is_basis(d) for d in it.leaves(layout.stride)):
        raise LayoutError(f"cosize: {layout} has basis strides: its values are coordinates, not offsets")
    last = it.fold(layout.shape, lambda s: sub(s, 1), lambda parts: parts)
    return add(_offset(last, layout.shape, layout.stride), 1)


def rank(x, mode=()) -> int:
    """Number of top-level modes of a layout or IntTuple: ``rank((4,8):(1,4)) == 2``."""
    x = _sub(x, mode)
    return it.rank(_shape_of(x, "rank"))


def depth(x, mode=()) -> int:
    """Nesting depth of a layout's shape or of an IntTuple: ``depth(((2,4),8):((1,16),2)) == 2``."""
    x = _sub(x, mode)
    return it.depth(_shape_of(x, "depth"))


def _shape_of(x, op):
    # A layout's (or composed layout's) shape, or x itself checked as an IntTuple.
    shape = getattr(x, "shape", None)
    return it.check_int_tuple(x, op, "x", none=True, basis=True) if shape is None else shape
