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
]


class LayoutError(ValueError):
    """An inadmissible layout operation: the message names the operation, the condition and the modes."""


def is_static_leaf(x) -> bool:
    """True for a Python int (a static leaf), False for a dynamic integer-like value."""
    return isinstance(x, int)


def known_divisor(x) -> int:
    """A non-negative int known to divide ``x``: ``abs(x)`` for an int (0 divides only 0), else ``x.divisibility``."""
    if isinstance(x, int):
        return abs(x)
    return getattr(x, "divisibility", 1)


def _both_int(a, b) -> bool:
    return type(a) is int and type(b) is int


def _is(x, value) -> bool:
    return type(x) is int and x == value


def add(a, b):
    """``a + b``, folding ``+ 0``."""
    if _both_int(a, b):
        return a + b
    if _is(a, 0) or _is(b, 0):
        return b if _is(a, 0) else a
    return a + b


def sub(a, b):
    """``a - b``, folding ``- 0``."""
    if _both_int(a, b):
        return a - b
    return a if _is(b, 0) else a - b


def mul(a, b):
    """``a * b``, folding ``* 1`` and ``* 0`` (a zero stride times a dynamic shape stays a static 0)."""
    if _both_int(a, b):
        return a * b
    if _is(a, 0) or _is(b, 0):
        return 0
    if _is(a, 1) or _is(b, 1):
        return b if _is(a, 1) else a
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
    if isinstance(a, int) and isinstance(b, int):
        return a if a >= b else b
    x, y = _dyn_pair(a, b)
    return x.fly_max(y)


def leaf_min(a, b):
    """``min(a, b)`` without ``bool()`` on dynamic leaves (calls ``x.fly_min``)."""
    if isinstance(a, int) and isinstance(b, int):
        return a if a <= b else b
    x, y = _dyn_pair(a, b)
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
    """Whether ``a == b``: True or False when provable (ints, or the very same dynamic object), else None."""
    if a is b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return None


def decide(answer, op: str, what: str, *leaves):
    """Return a provable ``answer`` (True/False); raise a LayoutError naming ``op`` and the dynamic leaves if None."""
    if answer is None:
        dyn = ", ".join(repr(x) for x in leaves if not isinstance(x, int))
        raise LayoutError(f"{op}: cannot decide {what} with dynamic leaf {dyn}; this needs static values")
    return answer


def require_static(x, op: str, what: str = "value"):
    """Return ``x`` if it is a static int, else raise a LayoutError naming ``op`` and the dynamic leaf."""
    if not isinstance(x, int):
        raise LayoutError(f"{op}: needs a static {what}, got dynamic leaf {x!r}")
    return x


def leaf_str(x) -> str:
    """CuTe notation of one leaf: the int, ``?`` for a dynamic leaf, ``_`` for None (a slicing coordinate)."""
    if isinstance(x, int):
        return str(x)
    return "_" if x is None else "?"
