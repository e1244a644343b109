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

from . import int_tuple as it
from .algebra import downcast, upcast
from .composition import composition
from .layout import Layout, as_layout, cosize, slice_and_offset
from .leaf import (
    LayoutError,
    add,
    ceil_div_leaf,
    check_leaf,
    divides,
    floordiv,
    is_static_leaf,
    mul,
    provably_equal,
    require_static,
)

_MAX_CHECKED_BITS = 16  # Layout o Swizzle checks the swizzle's block of 2**top offsets one by one
_OFFSET_BITS = 62  # the highest bit a swizzle may reach, as the Fly dialect's #fly.swizzle verifier

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
        if not all(type(v) is int for v in (bits, base, shift)):
            raise LayoutError(f"Swizzle: bits, base and shift must be ints, got ({bits!r},{base!r},{shift!r})")
        if bits < 0 or base < 0 or abs(shift) < bits or bits + base + abs(shift) > _OFFSET_BITS:
            raise LayoutError(
                f"Swizzle: needs bits >= 0, base >= 0, |shift| >= bits and bits + base + |shift| <= {_OFFSET_BITS} "
                f"(the offset bits a swizzle may reach), got ({bits},{base},{shift})"
            )
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
        return ComposedLayout(self, 0, as_layout(rhs, "composition", "rhs"))

    @property
    def block(self) -> int:
        """The size of the aligned blocks of offsets that the swizzle permutes among themselves."""
        return 1 << (self.yyy_mask | self.zzz_mask).bit_length()

    def _scaled(self, n: int, up: bool):
        # The same swizzle in units of n-times wider (up) or narrower elements; n a power of two.
        if n < 1 or n & (n - 1):
            raise LayoutError(f"{'upcast' if up else 'downcast'}: {self} needs a power-of-two factor, got {n}")
        k = n.bit_length() - 1
        if not up:
            return Swizzle(self.bits, self.base + k, self.shift)
        if self.bits and self.base < k:
            raise LayoutError(f"upcast: {self} permutes elements inside one {n}-times wider element (base {self.base})")
        return Swizzle(self.bits, max(self.base - k, 0), self.shift)

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
        self.outer = outer
        self.offset = check_leaf(offset, "ComposedLayout", "offset")
        self.inner = as_layout(inner, "ComposedLayout", "inner")

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

    def _fly_scale(self, n, up):
        # upcast/downcast (and so recast_layout): outer, offset and inner each in the new units (CuTe's rule).
        if not isinstance(self.outer, Swizzle):
            raise LayoutError(f"{'upcast' if up else 'downcast'}: {self} has a layout, not a swizzle, as outer")
        if up:
            ok = divides(n, self.offset)
            if ok is not True:
                raise LayoutError(f"upcast: offset {self.offset} of {self} is not (provably) a multiple of {n}")
            offset = floordiv(self.offset, n)
        else:
            offset = mul(self.offset, n)
        scale = upcast if up else downcast
        return ComposedLayout(self.outer._scaled(n, up), offset, scale(self.inner, n))

    def _fly_cosize(self):
        # An upper bound that is exact when the inner image fills whole swizzle blocks (tiles of a swizzle atom):
        # the swizzle keeps every offset inside its aligned block, so offsets stay below the rounded-up extent.
        if not isinstance(self.outer, Swizzle):
            raise LayoutError(f"cosize: {self} has a layout, not a swizzle, as outer")
        extent = add(self.offset, cosize(self.inner))
        block = self.outer.block
        return mul(ceil_div_leaf(extent, block), block)

    def _fly_precompose(self, lhs):
        """``lhs o self`` for a plain layout ``lhs`` (CuTe's ``composition(Layout, ComposedLayout)``): the swizzle is
        carried through ``lhs`` as ``Sw' o 0 o (lhs o inner)``, returned only when ``lhs o Sw == Sw' o lhs`` is proven
        on the offsets that ``inner`` reaches; otherwise a LayoutError says why."""
        where = f"composition: {lhs} o {self}"
        if not provably_equal(self.offset, 0):
            raise LayoutError(f"{where}: needs offset 0 (as CuTe), got {self.offset}")
        if not isinstance(self.outer, Swizzle):
            raise LayoutError(f"{where}: only a swizzle can be carried through a layout")
        sw = self.outer
        if sw.bits == 0:
            return composition(lhs, self.inner)
        top = (sw.yyy_mask | sw.zzz_mask).bit_length()
        if top > _MAX_CHECKED_BITS:
            raise LayoutError(f"{where}: {sw} spans 2**{top} offsets, more than this check enumerates")
        reach = require_static(cosize(self.inner), "composition", "cosize of the swizzled inner layout")
        rows = -(-reach // (1 << top))
        # lhs(x) == lo(x mod 2**top) + hi(x >> top), with lo additive over bits: proven by this composition.
        bits = Layout((2,) * top + (rows,), tuple(1 << j for j in range(top)) + (1 << top,))
        try:
            split = composition(lhs, bits)
        except LayoutError as err:
            raise LayoutError(f"{where}: {lhs} does not split into bits below 2**{top}: {err}") from None
        lo = [split(1 << j) for j in range(top)]
        if not all(type(v) is int and v > 0 and v & (v - 1) == 0 for v in lo):
            raise LayoutError(f"{where}: {lhs} does not map the swizzle's bits to single bits: {lo}")
        y_mask = sum(lo[j] for j in range(top) if sw.yyy_mask >> j & 1)
        z_mask = sum(lo[j] for j in range(top) if sw.zzz_mask >> j & 1)
        new = _swizzle_from_masks(y_mask, z_mask)
        if new is None:
            raise LayoutError(f"{where}: {lhs} maps the swizzle's bits to {y_mask:#x}/{z_mask:#x}, not a swizzle")
        for d in it.leaves(_mode_stride(split, top)):
            if divides(new.block, d) is not True:
                raise LayoutError(f"{where}: the rows of {lhs} (stride {d}) are not multiples of {new.block}")

        def low(x):
            return sum(lo[j] for j in range(top) if x >> j & 1)

        if any(low(sw(x)) != new(low(x)) for x in range(1 << top)):
            raise LayoutError(f"{where}: {lhs} o {sw} is not {new} o {lhs}")
        return ComposedLayout(new, 0, composition(lhs, self.inner))

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


def _mode_stride(layout, mode):
    """The stride of top-level mode ``mode``."""
    return layout[mode].stride


def _swizzle_from_masks(y_mask: int, z_mask: int):
    # The Swizzle whose read bits are y_mask and flipped bits z_mask (each a run of ones), or None.
    bits = bin(z_mask).count("1")
    if bits != bin(y_mask).count("1") or bits == 0:
        return None
    y_low, z_low = (y_mask & -y_mask).bit_length() - 1, (z_mask & -z_mask).bit_length() - 1
    base, shift = min(y_low, z_low), y_low - z_low
    if abs(shift) < bits:
        return None
    sw = Swizzle(bits, base, shift)
    return sw if (sw.yyy_mask, sw.zzz_mask) == (y_mask, z_mask) else None


def make_swizzle(bits: int, base: int, shift: int) -> Swizzle:
    """CuTe DSL's ``make_swizzle(b, m, s)``: ``Swizzle(b, m, s)``; ``make_swizzle(3, 4, 3)`` is ``Sw<3,4,3>``."""
    return Swizzle(bits, base, shift)


def make_composed_layout(outer, offset, inner) -> ComposedLayout:
    """``ComposedLayout(outer, offset, inner)`` (CuTe DSL's ``make_composed_layout(inner, offset, outer)``, same order).

    >>> make_composed_layout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    Sw<3,3,3> o 0 o (8,64):(64,1)
    """
    return ComposedLayout(outer, offset, inner)
