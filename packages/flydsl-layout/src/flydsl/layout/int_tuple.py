"""IntTuples: a leaf (an int or a dynamic integer-like value, see :mod:`flydsl.layout.leaf`) or a tuple of IntTuples.

Every function here is one structural recursion written with :func:`fold` (bottom-up over one tree) or
:func:`transform` (leaf-wise over several trees of one shape). Those two helpers are the only places that
tell a tuple from a leaf; ``None`` (CuTe's underscore in a coordinate) is a leaf to them.

>>> prefix_product((2, (3, 4)))
(1, (2, 6))
"""

from __future__ import annotations

from .leaf import (
    MAX_DEPTH,
    LayoutError,
    ScaledBasis,
    add,
    ceil_div_leaf,
    check_leaf,
    divides,
    floordiv,
    is_static_leaf,
    leaf_str,
    mul,
    require_static,
)

__all__ = [
    "check_int_tuple",
    "is_tuple",
    "fold",
    "transform",
    "leaves",
    "flatten",
    "unflatten",
    "rank",
    "depth",
    "product",
    "product_each",
    "inner_product",
    "prefix_product",
    "compact_strides",
    "shape_div",
    "ceil_div",
    "congruent",
    "weakly_congruent",
    "elem_less",
    "is_static",
    "tuple_str",
    "tree_key",
]


def check_int_tuple(x, op: str, what: str, low=None, none: bool = False, basis: bool = False):
    """Return ``x`` if it is an IntTuple of admissible leaves (see :func:`~flydsl.layout.leaf.check_leaf` for ``low``,
    ``none`` and ``basis``) nested at most ``MAX_DEPTH`` deep; else raise a LayoutError naming ``op`` and ``what``.
    The public functions call it on what they are given; the algebra's own intermediate results skip it.

    >>> check_int_tuple((4, (2, 8)), "f", "shape", low=1)
    (4, (2, 8))
    """
    if type(x) is tuple:
        for c in x:  # a flat tuple of ints in range: the common case, one pass without recursion
            if type(c) is not int or (low is not None and c < low):
                break
        else:
            return x
    elif type(x) is int and (low is None or x >= low):
        return x
    _check_node(x, op, what, low, none, basis, 0)
    return x


def _check_node(x, op, what, low, none, basis, level):
    if type(x) is not tuple:
        check_leaf(x, op, f"{what} leaf" if level else what, low, none, basis)
        return
    if level == MAX_DEPTH:
        raise LayoutError(f"{op}: {what} is nested deeper than the depth limit of {MAX_DEPTH} levels")
    for c in x:
        _check_node(c, op, what, low, none, basis, level + 1)


def is_tuple(x) -> bool:
    """True for a tuple (an inner node of an IntTuple). ``is_tuple((4, 8))`` is True, ``is_tuple(4)`` False."""
    return isinstance(x, tuple)


def fold(x, leaf, node):
    """The structural recursion: ``leaf(x)`` at a leaf (int, dynamic value or None), ``node(results)`` at a tuple.

    >>> fold((2, (3, 4)), lambda v: v, sum)
    9
    """
    if isinstance(x, tuple):
        return node(tuple(fold(c, leaf, node) for c in x))
    return leaf(x)


def transform(fn, x, *ys, op: str = "transform"):
    """Apply ``fn(leaf_of_x, part_of_y, ...)`` at each leaf of ``x``; each ``y`` has ``x``'s tuple structure down to
    ``x``'s leaves (below them it may be deeper: ``y`` weakly congruent). The result has ``x``'s structure.

    >>> transform(lambda a, b: a * b, (2, (3, 4)), (5, (6, 7)))
    (10, (18, 28))
    """
    if isinstance(x, tuple):
        for y in ys:
            if not isinstance(y, tuple) or len(y) != len(x):
                raise LayoutError(f"{op}: {tuple_str(y)} does not have the structure of {tuple_str(x)}")
        return tuple(transform(fn, *parts, op=op) for parts in zip(x, *ys, strict=True))
    return fn(x, *ys)


def leaves(x, op: str = "leaves") -> tuple:
    """The leaves of ``x`` in order, always as a tuple: ``leaves(((2, 4), 8)) == (2, 4, 8)``, ``leaves(4) == (4,)``.
    Nesting deeper than ``MAX_DEPTH`` raises a LayoutError naming ``op``."""
    if not isinstance(x, tuple):
        return (x,)
    for c in x:
        if isinstance(c, tuple):
            out = []
            _collect(x, out, op, 1)
            return tuple(out)
    return x  # already flat: the common case, without the recursion


def _collect(x, out, op, level):
    if level > MAX_DEPTH:
        raise LayoutError(f"{op}: the IntTuple is nested deeper than the depth limit of {MAX_DEPTH} levels")
    for c in x:
        if isinstance(c, tuple):
            _collect(c, out, op, level + 1)
        else:
            out.append(c)


def flatten(x):
    """CuTe ``flatten``: the leaves of a tuple as a flat tuple; a leaf stays a leaf.

    >>> flatten(((2, 4), (8,)))
    (2, 4, 8)
    """
    check_int_tuple(x, "flatten", "x", none=True, basis=True)
    return leaves(x) if isinstance(x, tuple) else x


def unflatten(flat, profile):
    """Rebuild ``profile``'s tuple structure from the flat sequence ``flat`` (inverse of :func:`leaves`).

    >>> unflatten([1, 2, 3], ((0, 0), 0))
    ((1, 2), 3)
    """
    if isinstance(profile, tuple) and isinstance(flat, (list, tuple)) and len(flat) == len(profile):
        for c in profile:
            if isinstance(c, tuple):
                break
        else:
            return tuple(flat)  # a flat profile: the common case
    it = iter(flat)
    return _rebuild(profile, it)


def _rebuild(profile, it):
    if isinstance(profile, tuple):
        return tuple([_rebuild(c, it) for c in profile])
    return next(it)


def rank(x) -> int:
    """Number of top-level modes: ``rank((2, (3, 4))) == 2``, ``rank(7) == 1``."""
    return len(x) if isinstance(x, tuple) else 1


def depth(x) -> int:
    """Nesting depth: ``depth(7) == 0``, ``depth((2, 3)) == 1``, ``depth((2, (3, 4))) == 2``."""
    return fold(x, lambda _: 0, lambda parts: 1 + max(parts, default=0))


def product(x):
    """Product of all leaves (CuTe ``size`` of a shape): ``product(((2, 4), 8)) == 64``; ``product(()) == 1``."""
    if type(x) is int:
        return x
    if isinstance(x, tuple):
        result = 1
        for v in leaves(x, "product"):  # each leaf checked where it is not an int: the int path stays plain
            result = (
                result * v if type(result) is int and type(v) is int else mul(result, check_leaf(v, "product", "x"))
            )
        return result
    return check_leaf(x, "product", "x")


def product_each(x):
    """Product of each top-level mode: ``product_each(((2, 4), (3, 5))) == (8, 15)``; a leaf stays itself."""
    return tuple(product(m) for m in check_int_tuple(x, "product_each", "x")) if isinstance(x, tuple) else x


def inner_product(a, b):
    """Sum of leaf-wise products of congruent IntTuples: ``inner_product((2, (3, 4)), (1, (10, 100))) == 432``."""
    check_int_tuple(a, "inner_product", "a")
    check_int_tuple(b, "inner_product", "b")
    total = 0
    for p in leaves(transform(mul, a, b, op="inner_product")):
        total = add(total, p)
    return total


def prefix_product(x, init=1):
    """Exclusive prefix product with ``x``'s structure (the compact column-major strides of shape ``x``).

    >>> prefix_product(((2, 4), 8))
    ((1, 2), 8)
    """
    check_int_tuple(x, "prefix_product", "x")
    return compact_strides(x, check_leaf(init, "prefix_product", "init"))


def compact_strides(x, init=1):
    """:func:`prefix_product` without checking the arguments (for shapes already checked)."""
    running = [init]

    def step(v):
        out = running[0]
        running[0] = mul(out, v)
        return out

    return _scan(x, step)


def _scan(x, step):
    # Left-to-right scan of the leaves with a stateful step, keeping x's structure.
    return unflatten([step(v) for v in leaves(x)], x)


def _divide_leaves(a, b, leaf_div, op):
    # CuTe's fold for tuple a and leaf b: each leaf of a is divided by what is left of b, and b by that leaf.
    if isinstance(b, tuple):
        if isinstance(a, tuple):
            padded = b + (1,) * (len(a) - len(b)) if len(b) <= len(a) else None
            if padded is None:
                raise LayoutError(f"{op}: rank of {tuple_str(b)} exceeds rank of {tuple_str(a)}")
            return tuple(_divide_leaves(x, y, leaf_div, op) for x, y in zip(a, padded, strict=True))
        b = product(b)
    rest = [b]

    def step(v):
        out = leaf_div(v, rest[0])
        rest[0] = leaf_div(rest[0], v)
        return out

    return _scan(a, step)


def _shape_div_leaf(a, b):
    if is_static_leaf(a) and is_static_leaf(b):
        if b != 0 and a % b == 0:
            return a // b
        if a != 0 and b % a == 0:
            return 1
        raise LayoutError(f"shape_div: neither of {a} and {b} divides the other")
    if divides(b, a):
        return floordiv(a, b)
    # a divides b (result 1) or cannot tell: under CuTe's precondition ceil_div is exact in both cases.
    return ceil_div_leaf(a, b)


def shape_div(a, b):
    """CuTe ``shape_div``: ``a / b`` where ``b`` divides ``a``, 1 where ``a`` divides ``b``, folded over tuples.

    >>> shape_div((4, 8), 8)
    (1, 4)
    """
    check_int_tuple(a, "shape_div", "a", low=1)
    check_int_tuple(b, "shape_div", "b", low=1)
    return _divide_leaves(a, b, _shape_div_leaf, "shape_div")


def ceil_div(a, b):
    """CuTe ``ceil_div``, folded over tuples like :func:`shape_div`: ``ceil_div((3, 5), 4) == (1, 3)``."""
    check_int_tuple(a, "ceil_div", "a", low=0)
    check_int_tuple(b, "ceil_div", "b", low=1)
    return _divide_leaves(a, b, ceil_div_leaf, "ceil_div")


def congruent(a, b) -> bool:
    """Same tuple structure: ``congruent((2, (3, 4)), (1, (5, 6)))`` is True, ``congruent((2, 3), 6)`` False."""
    check_int_tuple(a, "congruent", "a", none=True, basis=True)
    check_int_tuple(b, "congruent", "b", none=True, basis=True)
    return _same_structure(a, b)


def _same_structure(a, b) -> bool:
    if isinstance(a, tuple) != isinstance(b, tuple):
        return False
    if not isinstance(a, tuple):
        return True
    return len(a) == len(b) and all(_same_structure(x, y) for x, y in zip(a, b, strict=True))


def weakly_congruent(a, b) -> bool:
    """``a``'s structure is a coarsening of ``b``'s (a leaf of ``a`` may stand for a tuple of ``b``).

    >>> weakly_congruent((2, 3), ((1, 2), 3)), weakly_congruent(((1, 2), 3), (2, 3))
    (True, False)
    """
    check_int_tuple(a, "weakly_congruent", "a", none=True, basis=True)
    check_int_tuple(b, "weakly_congruent", "b", none=True, basis=True)
    return _coarsens(a, b)


def _coarsens(a, b) -> bool:
    if not isinstance(a, tuple):
        return True
    if not isinstance(b, tuple) or len(a) != len(b):
        return False
    return all(_coarsens(x, y) for x, y in zip(a, b, strict=True))


def elem_less(a, b) -> bool:
    """CuTe ``elem_less``: every leaf of ``a`` is less than its counterpart in ``b`` (``b`` may have more modes).

    >>> elem_less((1, (2, 3)), (2, (3, 4), 5)), elem_less((1, 4), (2, 4))
    (True, False)
    """
    check_int_tuple(a, "elem_less", "a")
    check_int_tuple(b, "elem_less", "b")
    return _elem_less(a, b)


def _elem_less(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) <= len(b) and all(_elem_less(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, tuple) or isinstance(b, tuple):
        raise LayoutError(f"elem_less: {tuple_str(a)} and {tuple_str(b)} are not congruent")
    return require_static(a, "elem_less") < require_static(b, "elem_less")


def _static_value(v) -> bool:
    return is_static_leaf(v) or (isinstance(v, ScaledBasis) and is_static_leaf(v.value))


def is_static(x) -> bool:
    """True when every leaf is a Python int (or a basis element with an int value): ``is_static((2, (3, 4)))``."""
    return all(_static_value(v) for v in leaves(x))


def tuple_str(x) -> str:
    """CuTe notation of an IntTuple: ``tuple_str((2, (3, None))) == "(2,(3,_))"``; dynamic leaves print as ``?``."""
    return fold(x, leaf_str, lambda parts: "(" + ",".join(parts) + ")")


def tree_key(x):
    """A hashable key equal for structurally identical IntTuples; a dynamic leaf stands for itself (its identity)."""
    return fold(x, lambda v: v if v is None or _static_value(v) else ("?", id(v)), lambda parts: parts)
