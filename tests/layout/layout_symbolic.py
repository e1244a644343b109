"""A symbolic integer for testing the algebra on dynamic leaves.

``Sym`` records an expression tree, never silently becomes an int (``bool``, ``int``, ``index`` raise),
and can be evaluated with an environment to compare a symbolic result with the static one.
"""

import math
import operator

from flydsl.layout import ComposedLayout, Layout

_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "%": operator.mod,
    "&": operator.and_,
    "^": operator.xor,
    ">>": operator.rshift,
    "<<": operator.lshift,
    "==": operator.eq,
    "<": operator.lt,
    "max": max,
    "min": min,
}


class Sym:
    """An integer-like leaf: a variable or an operation on leaves; ``ops`` counts the operations built."""

    ops = 0

    def __init__(self, name=None, divisibility=1, op=None, args=()):
        self.name, self.op, self.args, self.divisibility = name, op, args, divisibility
        if op is not None:
            Sym.ops += 1

    def _make(self, op, a, b):
        div = 1
        if op == "*":
            div = _div(a) * _div(b)
        elif op in "+-":
            div = math.gcd(_div(a), _div(b))
        return Sym(op=op, args=(a, b), divisibility=div)

    def __add__(self, o):
        return self._make("+", self, o)

    def __radd__(self, o):
        return self._make("+", o, self)

    def __sub__(self, o):
        return self._make("-", self, o)

    def __rsub__(self, o):
        return self._make("-", o, self)

    def __mul__(self, o):
        return self._make("*", self, o)

    def __rmul__(self, o):
        return self._make("*", o, self)

    def __floordiv__(self, o):
        return self._make("//", self, o)

    def __rfloordiv__(self, o):
        return self._make("//", o, self)

    def __mod__(self, o):
        return self._make("%", self, o)

    def __rmod__(self, o):
        return self._make("%", o, self)

    def __and__(self, o):
        return self._make("&", self, o)

    def __xor__(self, o):
        return self._make("^", self, o)

    def __rxor__(self, o):
        return self._make("^", o, self)

    def __rshift__(self, o):
        return self._make(">>", self, o)

    def __lshift__(self, o):
        return self._make("<<", self, o)

    def __eq__(self, o):
        return self._make("==", self, o)

    def __lt__(self, o):
        return self._make("<", self, o)

    __hash__ = object.__hash__

    def fly_max(self, o):
        return self._make("max", self, o)

    def fly_min(self, o):
        return self._make("min", self, o)

    def __bool__(self):
        raise TypeError(f"bool() of symbolic {self!r}")

    def __int__(self):
        raise TypeError(f"int() of symbolic {self!r}")

    def __index__(self):
        raise TypeError(f"index() of symbolic {self!r}")

    def __repr__(self):
        if self.op is None:
            return self.name
        a, b = self.args
        return f"{self.op}({a!r}, {b!r})" if self.op in ("max", "min") else f"({a!r} {self.op} {b!r})"

    def evaluate(self, env):
        if self.op is None:
            return env[self.name]
        a, b = (ev(x, env) for x in self.args)
        return _OPS[self.op](a, b)


def _div(x):
    return abs(x) if isinstance(x, int) else x.divisibility


def ev(x, env):
    """Substitute ``env`` into a leaf, an IntTuple, a Layout or a ComposedLayout."""
    if isinstance(x, Sym):
        return x.evaluate(env)
    if isinstance(x, tuple):
        return tuple(ev(v, env) for v in x)
    if isinstance(x, Layout):
        return Layout(ev(x.shape, env), ev(x.stride, env))
    if isinstance(x, ComposedLayout):
        return ComposedLayout(x.outer, ev(x.offset, env), ev(x.inner, env))
    return x
