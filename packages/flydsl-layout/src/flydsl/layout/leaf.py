"""Leaves of IntTuples: static Python ints and dynamic integer-like values.

The algebra runs unchanged on two kinds of leaf:

* **static** leaves are Python ``int`` (arbitrary size: strides past 2**63 are fine);
* **dynamic** leaves are any other object implementing the *integer-like protocol* below. The FlyDSL
  compiler passes its IR values (which emit MLIR ``arith`` ops when combined) through the same code at
  trace time; the tests pass a symbolic integer that records expressions.

The integer-like protocol
-------------------------
A dynamic leaf ``x`` must provide, with ints and with other dynamic leaves on either side:

=====================================  ======================================================
``x + y``, ``x - y``, ``x * y``        arithmetic, returning a leaf (``__radd__`` etc. too)
``x // y``, ``x % y``                  floor division and remainder of non-negative values
``x == y``, ``x < y``                  may return a *dynamic* boolean; the algebra never
                                       branches on it (it only returns it to the caller)
``x.fly_max(y)``, ``x.fly_min(y)``     maximum / minimum (used by :func:`leaf_max` / :func:`leaf_min`,
                                       because the builtins ``max``/``min`` call ``bool()``)
``x.divisibility`` (optional)          a positive int known to divide the value (default 1); read
                                       by :func:`known_divisor` to prove divisibility, e.g. that a
                                       dynamic row length keeps a 16-byte vector aligned
``&``, ``^``, ``>>``, ``<<``           (only to apply a :class:`Swizzle` to a dynamic offset)
=====================================  ======================================================

Dynamic shapes are assumed to be positive. Static-ness is queried with :func:`is_static` (a leaf is
static iff it is a Python ``int``): the compiler folds constants to ints before they reach the algebra.

The algebra never calls ``int()``, ``bool()``, ``operator.index()`` or the ``max``/``min`` builtins on
a dynamic leaf, and never compares one inside an ``if``. Where a decision depends on a value (does 128
divide M? is this stride equal to that product?) it asks :func:`divides` / :func:`provably_equal`,
which answer True, False or None ("cannot tell"); an operation that cannot tell raises a
:class:`LayoutError` naming the operation and the dynamic leaf. Arithmetic goes through
:func:`add` / :func:`mul` / ... which fold the trivial cases (``x * 1``, ``x + 0``, ``x * 0``) so that
no useless op is emitted and a zero stride stays a static ``0``.
"""

from __future__ import annotations

__all__ = [
    "LayoutError",
    "MAX_DEPTH",
    "check_leaf",
    "is_static_leaf",
    "known_divisor",
    "add",
    "sub",
    "mul",
    "floordiv",
    "mod",
    "ceil_div_leaf",
    "leaf_max",
    "leaf_min",
    "divides",
    "provably_equal",
    "decide",
    "require_static",
    "leaf_str",
    "ScaledBasis",
    "is_basis",
    "as_coord",
]


class LayoutError(ValueError):
    """An inadmissible layout operation: the message names the operation, the condition and the modes."""


MAX_DEPTH = 64  # deepest IntTuple nesting accepted (CuTe's layouts nest a few levels; this bounds the recursions)

_BOUND = {0: "a non-negative", 1: "a positive"}


def check_leaf(x, op: str, what: str, low=None, none: bool = False, basis: bool = False):
    """Return ``x`` if it is an admissible leaf, else raise a LayoutError naming ``op`` and ``what``: a Python int
    (``bool`` refused; at least ``low`` when given: 0 or 1) or a dynamic leaf (an object whose type implements the
    integer-like protocol, recognised by ``fly_max``); with ``none`` also None (a slicing coordinate), with
    ``basis`` also a :class:`ScaledBasis` (a stride).

    >>> check_leaf(4, "f", "n", low=1)
    4
    >>> check_leaf(2.5, "f", "n")
    Traceback (most recent call last):
    ...
    flydsl.layout.leaf.LayoutError: f: n must be an int or a dynamic integer-like leaf, got 2.5 (float)
    """
    if type(x) is int:
        if low is not None and x < low:
            raise LayoutError(f"{op}: {what} must be {_BOUND[low]} int, got {x}")
        return x
    if (none and x is None) or (basis and isinstance(x, ScaledBasis)) or hasattr(type(x), "fly_max"):
        return x
    expected = f"{_BOUND.get(low, 'an')} int or a dynamic integer-like leaf"
    raise LayoutError(f"{op}: {what} must be {expected}, got {x!r} ({type(x).__name__})")


def is_static_leaf(x) -> bool:
    """True for a Python int (a static leaf), False for a dynamic integer-like value."""
    return isinstance(x, int)


def known_divisor(x) -> int:
    """A non-negative int known to divide ``x``: ``abs(x)`` for an int (0 divides only 0), else ``x.divisibility``."""
    if type(x) is int:
        return abs(x)
    return getattr(check_leaf(x, "known_divisor", "x"), "divisibility", 1)


def _both_int(a, b) -> bool:
    return type(a) is int and type(b) is int


def _is(x, value) -> bool:
    return type(x) is int and x == value


def add(a, b):
    """``a + b``, folding ``+ 0``; basis elements add into a coordinate (see :class:`ScaledBasis`)."""
    if _both_int(a, b):
        return a + b
    if _is(a, 0) or _is(b, 0):
        return b if _is(a, 0) else a
    if isinstance(a, _Coord) or isinstance(b, _Coord):
        return _Coord.of(a).plus(_Coord.of(b))
    return a + b


def sub(a, b):
    """``a - b``, folding ``- 0``."""
    if _both_int(a, b):
        return a - b
    return a if _is(b, 0) else a - b


def mul(a, b):
    """``a * b``, folding ``* 1`` and ``* 0`` (a zero stride times a dynamic shape stays a static 0); a leaf times
    a basis element scales it: ``mul(4, E(0)) == 4@0``."""
    if _both_int(a, b):
        return a * b
    if _is(a, 0) or _is(b, 0):
        return 0
    if _is(a, 1) or _is(b, 1):
        return b if _is(a, 1) else a
    if isinstance(b, ScaledBasis):
        if isinstance(a, _Coord):
            raise LayoutError(f"mul: cannot multiply the basis element {b} by another")
        return ScaledBasis(mul(a, b.value), b.mode)
    if isinstance(a, ScaledBasis):
        return mul(b, a)
    return a * b


def floordiv(a, b):
    """``a // b``, folding ``// 1``, ``0 //`` and ``x // x``."""
    if _both_int(a, b):
        return a // b
    if a is b:
        return 1
    if _is(b, 1) or _is(a, 0):
        return a
    return a // b


def mod(a, b):
    """``a % b``, folding ``% 1``, ``0 %`` and ``x % x``."""
    if _both_int(a, b):
        return a % b
    if _is(b, 1) or _is(a, 0) or a is b:
        return 0
    return a % b


def ceil_div_leaf(a, b):
    """``ceil(a / b)`` for a positive divisor, as ``(a + b - 1) // b`` on dynamic leaves."""
    if type(a) is int and type(b) is int:
        return -(-a // b)
    if type(b) is int and b == 1:
        return a
    return floordiv(add(a, sub(b, 1)), b)


def _dyn_pair(a, b):
    return (a, b) if not isinstance(a, int) else (b, a)


def leaf_max(a, b):
    """``max(a, b)`` without ``bool()`` on dynamic leaves (calls ``x.fly_max``)."""
    if type(a) is int and type(b) is int:
        return a if a >= b else b
    x, y = _dyn_pair(check_leaf(a, "leaf_max", "a"), check_leaf(b, "leaf_max", "b"))
    return x.fly_max(y)


def leaf_min(a, b):
    """``min(a, b)`` without ``bool()`` on dynamic leaves (calls ``x.fly_min``)."""
    if type(a) is int and type(b) is int:
        return a if a <= b else b
    x, y = _dyn_pair(check_leaf(a, "leaf_min", "a"), check_leaf(b, "leaf_min", "b"))
    return x.fly_min(y)


def divides(p, q):
    """Whether ``p`` divides ``q``: True or False when provable, None when a dynamic leaf hides the answer."""
    if isinstance(p, int):
        if isinstance(q, int):
            return q == 0 if p == 0 else q % p == 0
        if p in (1, -1) or (p != 0 and known_divisor(q) % p == 0):
            return True
        return None
    if p is q or (isinstance(q, int) and q == 0):
        return True
    return None


def provably_equal(a, b):
    """Whether ``a == b``: True or False when provable (ints, basis elements, or the very same dynamic object), else
    None. A basis element is never equal to an int (its value is never 0)."""
    if a is b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, ScaledBasis) or isinstance(b, ScaledBasis):
        if not (isinstance(a, ScaledBasis) and isinstance(b, ScaledBasis)):
            return False if isinstance(a, int) or isinstance(b, int) else None
        return provably_equal(a.value, b.value) if a.mode == b.mode else False
    return None


def decide(answer, op: str, what: str, *leaves):
    """Return a provable ``answer`` (True/False); raise a LayoutError naming ``op`` and the dynamic leaves if None."""
    if answer is None:
        dyn = ", ".join(repr(x) for x in leaves if not isinstance(x, int))
        if any(isinstance(x, ScaledBasis) for x in leaves):
            raise LayoutError(f"{op}: cannot decide {what} with basis element {dyn}: this needs integer offsets")
        raise LayoutError(f"{op}: cannot decide {what} with dynamic leaf {dyn}; this needs static values")
    return answer


def require_static(x, op: str, what: str = "value"):
    """Return ``x`` if it is a static int, else raise a LayoutError naming ``op`` and the dynamic leaf."""
    if isinstance(x, ScaledBasis):
        raise LayoutError(f"{op}: needs an integer {what}, got the basis element {x!r} (a coordinate stride)")
    if not isinstance(x, int):
        raise LayoutError(f"{op}: needs a static {what}, got dynamic leaf {x!r}")
    return x


def leaf_str(x) -> str:
    """CuTe notation of one leaf: the int, ``?`` for a dynamic leaf, ``_`` for None (a slicing coordinate),
    ``v@i@j`` for a :class:`ScaledBasis`."""
    if isinstance(x, int):
        return str(x)
    if isinstance(x, ScaledBasis):
        return repr(x)
    return "_" if x is None else "?"


class ScaledBasis:
    """CuTe's ``ScaledBasis`` ``value@mode``: ``value`` times the unit vector of coordinate mode ``mode`` (a path of
    mode indices, outermost first, so ``1@1@0`` is mode 0 of mode 1). As a stride it makes a layout whose values
    are coordinates (CuTe's ``E<i>``, used by :func:`flydsl.layout.make_identity_layout`): leaves times a basis
    element scale it, basis elements of different modes add into a coordinate, and
    :func:`flydsl.layout.crd2idx` returns that coordinate as a plain (nested) tuple.

    >>> e0, e1 = ScaledBasis(1, 0), ScaledBasis(1, 1)
    >>> e0, mul(4, e1), as_coord(add(mul(3, e0), mul(4, e1))), as_coord(mul(2, ScaledBasis(1, (1, 0))))
    (1@0, 4@1, (3, 4), (0, (2,)))
    """

    __slots__ = ("value", "mode")

    def __init__(self, value, mode):
        self.value = check_leaf(value, "ScaledBasis", "value")
        self.mode = mode if isinstance(mode, tuple) else (mode,)
        if not all(type(i) is int and i >= 0 for i in self.mode):
            raise LayoutError(f"ScaledBasis: mode must be a path of non-negative ints, got {mode!r}")

    def __mul__(self, other):
        return mul(other, self)

    __rmul__ = __mul__

    def __add__(self, other):
        return add(_Coord.of(self), other)

    __radd__ = __add__

    def __eq__(self, other):
        return (
            isinstance(other, ScaledBasis)
            and self.mode == other.mode
            and provably_equal(self.value, other.value) is True
        )

    def __hash__(self):
        v = self.value if isinstance(self.value, int) else id(self.value)
        return hash(("ScaledBasis", v, self.mode))

    def __repr__(self):
        return leaf_str(self.value) + "".join(f"@{i}" for i in self.mode)


def is_basis(x) -> bool:
    """True for a :class:`ScaledBasis` leaf."""
    return isinstance(x, ScaledBasis)


class _Coord:
    """A sum of basis elements (CuTe's ArithTuple) while :func:`add` accumulates; :func:`as_coord` makes it a tuple."""

    __slots__ = ("terms",)

    def __init__(self, terms):
        self.terms = terms  # {mode path: value}

    @staticmethod
    def of(x):
        if isinstance(x, _Coord):
            return x
        if isinstance(x, ScaledBasis):
            return _Coord({x.mode: x.value})
        raise LayoutError(f"add: cannot add the integer offset {leaf_str(x)} to a coordinate (a basis-stride value)")

    def plus(self, other):
        terms = dict(self.terms)
        for m, v in other.terms.items():
            terms[m] = add(terms[m], v) if m in terms else v
        return _Coord(terms)

    def __add__(self, other):
        return add(self, other)

    __radd__ = __add__


def _build(terms, depth):
    # Nested tuple of the values at paths extending the current one (terms keyed by the remaining path).
    size = 1 + max(m[0] for m in terms)
    parts = []
    for i in range(size):
        sub = {m[1:]: v for m, v in terms.items() if m[0] == i}
        if not sub:
            parts.append(0)
        elif () in sub:
            if len(sub) > 1:
                raise LayoutError("as_coord: a coordinate mode is both a leaf and a tuple")
            parts.append(sub[()])
        else:
            parts.append(_build(sub, depth + 1))
    return tuple(parts)


def as_coord(x, modes=()):
    """A value of a layout as the caller sees it: an int stays an int, a basis element or a sum of them becomes
    the coordinate tuple it stands for, with 0 in the missing modes and in each mode path of ``modes``:
    ``as_coord(ScaledBasis(3, 1)) == (0, 3)``, ``as_coord(0, [(0,), (1,)]) == (0, 0)``."""
    if not isinstance(x, (ScaledBasis, _Coord)) and not modes:
        return check_leaf(x, "as_coord", "value")
    terms = {m: 0 for m in modes}
    for m, v in _Coord.of(x).terms.items() if not _is(x, 0) else ():
        terms[m] = add(terms[m], v) if m in terms else v
    return _build(terms, 0)
