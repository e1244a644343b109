"""Swizzles and composed layouts.

``Swizzle(bits, base, shift)`` permutes offsets by xor-ing ``bits`` bits taken ``shift`` places above bit
``base`` into the bits at ``base`` (CuTe's ``Swizzle<B, M, S>``), so that the rows of a shared-memory tile
land in different banks. ``ComposedLayout(outer, offset, inner)`` is the function
``c -> outer(offset + inner(c))``: typically a swizzle after a plain layout.

CuTe DSL names the two functions the other way round (its ``inner`` is the swizzle); the positional order
``(swizzle, offset, layout)`` is the same, so ``make_composed_layout(sw, 0, L)`` means the same in both.

The algebra on a composed layout acts on its inner layout and keeps the outer function: composition with
a layout or tiler, coalesce/filter, the divides and products, ``tile_to_shape``, mode selection, and
slicing (the slice's offset moves inside, since a swizzle does not commute with adding an offset).
"""

from __future__ import annotations

from .composition import composition
from .layout import Layout, as_layout, slice_and_offset
from .leaf import LayoutError, add, is_static_leaf

__all__ = ["Swizzle", "ComposedLayout", "make_swizzle", "make_composed_layout"]


class Swizzle:
    """CuTe ``Swizzle<bits, base, shift>``: ``f(x) = x ^ ((x & yyy) >> shift)`` where ``yyy`` holds ``bits`` ones
    starting at bit ``base + shift`` (a negative ``shift`` moves the bits up instead).

    >>> sw = Swizzle(3, 4, 3)
    >>> sw, [sw(x) for x in (0, 16, 128, 144, 1024)]
    (Sw<3,4,3>, [0, 16, 144, 128, 1024])
    """

    __slots__ = ("bits", "base", "shift")

    def __init__(self, bits: int, base: int, shift: int):
        if bits < 0 or base < 0 or abs(shift) < bits:
            raise LayoutError(f"Swizzle: needs bits >= 0, base >= 0 and |shift| >= bits, got ({bits},{base},{shift})")
        self.bits, self.base, self.shift = bits, base, shift

    @property
    def yyy_mask(self) -> int:
        """The bits that are read (moved by ``shift`` onto :attr:`zzz_mask`)."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The bits that are flipped."""
        return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

    def __call__(self, offset):
        """Swizzle one offset (an int, or a dynamic leaf supporting ``& ^ >> <<``)."""
        moved = offset & self.yyy_mask
        moved = moved >> self.shift if self.shift >= 0 else moved << -self.shift
        return offset ^ moved

    def _fly_static(self) -> bool:
        return True

    def _fly_compose(self, rhs):
        if rhs is None:
            return self
        if not isinstance(rhs, (Layout, int)):
            raise LayoutError(f"composition: {self} o {rhs}: a swizzle composes with a layout or an int")
        return ComposedLayout(self, 0, as_layout(rhs))

    def __eq__(self, other):
        return isinstance(other, Swizzle) and (self.bits, self.base, self.shift) == (
            other.bits,
            other.base,
            other.shift,
        )

    def __hash__(self):
        return hash(("Swizzle", self.bits, self.base, self.shift))

    def __repr__(self):
        return f"Sw<{self.bits},{self.base},{self.shift}>"


class ComposedLayout:
    """``c -> outer(offset + inner(c))``; ``outer`` is a :class:`Swizzle` or a Layout, ``inner`` a Layout.

    >>> C = ComposedLayout(Swizzle(1, 0, 1), 0, Layout((2, 2), (2, 1)))
    >>> C, [C(i) for i in range(4)]
    (Sw<1,0,1> o 0 o (2,2):(2,1), [0, 3, 1, 2])
    """

    __slots__ = ("outer", "offset", "inner")

    def __init__(self, outer, offset, inner):
        if not callable(outer):
            raise LayoutError(f"ComposedLayout: outer {outer!r} is neither a swizzle nor a layout")
        self.outer, self.offset, self.inner = outer, offset, as_layout(inner)

    @property
    def shape(self):
        """The shape of the inner layout (the domain of the composed function)."""
        return self.inner.shape

    def __call__(self, *coord):
        """Evaluate, or slice when the coordinate holds None."""
        c = coord[0] if len(coord) == 1 else coord
        value = self.inner(c)
        if isinstance(value, Layout):
            return self._fly_slice(c)[0]
        return self.outer(add(self.offset, value))

    def __getitem__(self, i):
        return ComposedLayout(self.outer, self.offset, self.inner[i])

    def __len__(self):
        return len(self.inner)

    def _fly_static(self) -> bool:
        outer = getattr(self.outer, "_fly_static", None)
        return is_static_leaf(self.offset) and self.inner._fly_static() and outer is not None and outer()

    def _fly_lift(self, fn):
        return ComposedLayout(self.outer, self.offset, fn(self.inner))

    def _fly_compose(self, rhs):
        return ComposedLayout(self.outer, self.offset, composition(self.inner, rhs))

    def _fly_slice(self, coord):
        sub, off = slice_and_offset(coord, self.inner)
        return ComposedLayout(self.outer, add(self.offset, off), sub), 0

    def _key(self):
        offset = self.offset if is_static_leaf(self.offset) else id(self.offset)
        return (self.outer, offset, self.inner)

    def __eq__(self, other):
        return isinstance(other, ComposedLayout) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        offset = self.offset if is_static_leaf(self.offset) else "?"
        return f"{self.outer!r} o {offset} o {self.inner!r}"

    __str__ = __repr__


def make_swizzle(bits: int, base: int, shift: int) -> Swizzle:
    """CuTe DSL's ``make_swizzle(b, m, s)``: ``Swizzle(b, m, s)``; ``make_swizzle(3, 4, 3)`` is ``Sw<3,4,3>``."""
    return Swizzle(bits, base, shift)


def make_composed_layout(outer, offset, inner) -> ComposedLayout:
    """``ComposedLayout(outer, offset, inner)`` (CuTe DSL's ``make_composed_layout(inner, offset, outer)``, same order).

    >>> make_composed_layout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    Sw<3,3,3> o 0 o (8,64):(64,1)
    """
    return ComposedLayout(outer, offset, inner)
