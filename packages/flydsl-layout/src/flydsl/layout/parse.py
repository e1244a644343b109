"""Parse CuTe notation: ``"((2,4),8):((1,16),2)"``, ``"Sw<3,4,3> o 0 o (8,64):(64,1)"``, IntTuples ``"(4,(2,?))"``.

A basis-element stride is written ``1@0`` (``value@mode@submode...``, CuTe's ``E<0>``), as printed.
A ``?`` is a dynamic leaf: it needs a ``leaf`` factory, called as ``leaf(k)`` for the ``k``-th ``?`` (from 0),
that returns the dynamic value to put there.
"""

from __future__ import annotations

import re

from .layout import Layout
from .leaf import MAX_DEPTH, LayoutError, ScaledBasis
from .swizzle import ComposedLayout, Swizzle

__all__ = ["parse_int_tuple", "parse_layout"]

_TOKEN = re.compile(r"\s*(-?\d+|[?_(),:<>@]|Sw|o)")


def _tokens(text: str):
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LayoutError(f"parse: unexpected {text[pos:].strip()[:12]!r} at column {pos} of {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text, leaf):
        if not isinstance(text, str):
            raise LayoutError(f"parse: needs the text of a layout or IntTuple (a str), got {text!r}")
        self.text, self.toks, self.i, self.leaf, self.dyn = text, _tokens(text), 0, leaf, 0
        self.level = 0  # how many parentheses are open

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise LayoutError(f"parse: expected {expected or 'more'} at token {self.i} of {self.text!r}, got {tok!r}")
        self.i += 1
        return tok

    def int_tuple(self):
        tok = self.take()
        if tok == "(":
            self.level += 1
            if self.level > MAX_DEPTH:
                raise LayoutError(f"parse: {self.text[:20]!r}... is nested deeper than the depth limit of {MAX_DEPTH}")
            parts = [] if self.peek() == ")" else [self.int_tuple()]
            while self.peek() == ",":
                self.take(",")
                if self.peek() != ")":
                    parts.append(self.int_tuple())
            self.take(")")
            self.level -= 1
            return tuple(parts)
        if tok == "?":
            if self.leaf is None:
                raise LayoutError(f"parse: {self.text!r} has a dynamic leaf '?' but no leaf factory was given")
            self.dyn += 1
            return self.basis(self.leaf(self.dyn - 1))
        if tok == "_":
            return None
        if tok.lstrip("-").isdigit():
            return self.basis(int(tok))
        raise LayoutError(f"parse: unexpected {tok!r} in {self.text!r}")

    def basis(self, value):
        # ``value@i@j``: a scaled basis element (CuTe's E<i,j> times value).
        path = []
        while self.peek() == "@":
            self.take("@")
            tok = self.take()
            if not tok.isdigit():
                raise LayoutError(f"parse: expected a mode index after '@' in {self.text!r}, got {tok!r}")
            path.append(int(tok))
        return ScaledBasis(value, tuple(path)) if path else value

    def layout(self):
        if self.peek() == "Sw":
            self.take("Sw")
            self.take("<")
            b = self.int_tuple()
            self.take(",")
            m = self.int_tuple()
            self.take(",")
            s = self.int_tuple()
            self.take(">")
            self.take("o")
            offset = self.int_tuple()
            self.take("o")
            return ComposedLayout(Swizzle(b, m, s), offset, self.plain_layout())
        return self.plain_layout()

    def plain_layout(self):
        shape = self.int_tuple()
        if self.peek() != ":":  # a shape alone, as Layout(shape): compact column-major strides
            return Layout(shape)
        self.take(":")
        return Layout(shape, self.int_tuple())

    def done(self, value):
        if self.peek() is not None:
            raise LayoutError(f"parse: trailing {self.peek()!r} in {self.text!r}")
        return value


def parse_int_tuple(text: str, leaf=None):
    """Parse an IntTuple: ``parse_int_tuple("(4,(2,3))") == (4, (2, 3))``; ``_`` is None (a slicing coordinate)."""
    p = _Parser(text, leaf)
    return p.done(p.int_tuple())


def parse_layout(text: str, leaf=None):
    """Parse a layout (or a swizzled ``Sw<b,m,s> o offset o layout``) from CuTe notation; a shape without
    ``:stride`` is ``Layout(shape)`` (compact, column-major).

    >>> parse_layout("((2,4),8):((1,16),2)"), parse_layout("(4,8):(1@0,1@1)")(5), parse_layout("(4,8)")
    (((2,4),8):((1,16),2), (1, 1), (4,8):(1,4))
    """
    p = _Parser(text, leaf)
    return p.done(p.layout())
