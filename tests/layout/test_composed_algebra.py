"""Composed (swizzled) layouts: recast_layout/upcast/downcast, cosize, and a plain layout composed after them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout, LayoutError, Swizzle

from .layout_strategies import compact_layouts


def _sw128():
    atom = fl.make_composed_layout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    return fl.tile_to_shape(atom, (128, 64))


def _elements(composed):
    return [composed(i) for i in range(fl.size(composed))]


def test_recast_of_a_swizzled_tile_moves_whole_vectors():
    sw = _sw128()  # bf16
    wide = fl.recast_layout(32, 16, sw)
    assert str(wide) == "Sw<3,2,3> o 0 o (128,32):(32,1)"
    assert str(fl.recast_layout(128, 16, sw)) == "Sw<3,0,3> o 0 o (128,8):(8,1)"
    assert str(fl.recast_layout(8, 16, sw)) == "Sw<3,4,3> o 0 o (128,128):(128,1)"
    # Element pair (2j, 2j+1) of a row lands where wide element j does, times 2.
    for r in range(0, 128, 7):
        for j in range(32):
            assert sw(r, 2 * j) == 2 * wide(r, j) and sw(r, 2 * j + 1) == 2 * wide(r, j) + 1
    narrow = fl.recast_layout(8, 16, sw)
    for r in range(0, 128, 5):
        for c in range(64):
            assert narrow(r, 2 * c) == 2 * sw(r, c)
    assert fl.recast_layout(16, 16, sw) is sw


def test_recast_refusals():
    with pytest.raises(LayoutError, match="inside one"):
        fl.recast_layout(256, 16, _sw128())  # 16 bf16 per element: the swizzle permutes inside it
    with pytest.raises(LayoutError, match="power-of-two"):
        fl.upcast(_sw128(), 3)
    with pytest.raises(LayoutError, match="multiple"):
        fl.upcast(fl.make_composed_layout(Swizzle(1, 2, 2), 3, Layout(16)), 2)


@given(
    st.sampled_from([Swizzle(3, 3, 3), Swizzle(2, 4, 3), Swizzle(1, 0, 1), Swizzle(2, 1, -2)]),
    compact_layouts(max_leaves=3, max_size=128),
    st.sampled_from([0, 64]),
)
def test_cosize_of_swizzled_layouts_bounds_every_offset(sw, inner, offset):
    composed = fl.make_composed_layout(sw, offset, inner)
    bound = fl.cosize(composed)
    assert max(_elements(composed)) < bound
    assert bound % sw.block == 0 and bound - sw.block <= offset + fl.cosize(inner) - 1


def test_cosize_of_a_partial_swizzled_tile_counts_the_swizzled_columns():
    part = fl.composition(_sw128(), (64, 32))  # columns 0..31 of 64 swizzle into 0..63
    assert fl.cosize(part.inner) == 4064
    assert fl.cosize(part) == max(_elements(part)) + 1 == 4096
    assert fl.cosize(_sw128()) == 8192


SWIZZLES = [Swizzle(2, 0, 2), Swizzle(3, 3, 3), Swizzle(1, 1, 2), Swizzle(2, 2, -2)]
OUTERS = [
    Layout((4, 4), (4, 1)),
    Layout((4, 8), (8, 1)),
    Layout(64, 2),
    Layout((2, 8), (8, 1)),
    Layout((3, 8), (8, 1)),
    Layout((8, 8, 8), (64, 1, 8)),
    Layout((2, 2, 16), (1, 64, 2)),
]


@given(st.sampled_from(SWIZZLES), st.sampled_from(OUTERS), compact_layouts(max_leaves=3, max_size=64))
def test_layout_after_swizzle_is_right_or_refused(sw, lhs, inner):
    """composition(L, Sw o 0 o I) (CuTe's composition(Layout, ComposedLayout)): when returned it is L(Sw(I(i)))."""
    composed = fl.make_composed_layout(sw, 0, inner)
    try:
        result = fl.composition(lhs, composed)
    except LayoutError:
        return
    assert fl.size(result) == fl.size(inner)
    for i in range(fl.size(inner)):
        assert result(i) == lhs(composed(i))


def test_layout_after_swizzle_examples():
    composed = fl.make_composed_layout(Swizzle(2, 0, 2), 0, Layout((4, 4), (4, 1)))
    transposed = fl.composition(Layout((4, 4), (4, 1)), composed)
    assert str(transposed) == "Sw<2,0,-2> o 0 o (4,4):(1,4)"
    assert str(fl.composition(Layout(16, 2), composed)) == "Sw<2,1,2> o 0 o (4,4):(8,2)"
    with pytest.raises(LayoutError, match="not a swizzle"):
        fl.composition(Layout((2, 8), (8, 1)), composed)
    with pytest.raises(LayoutError, match="offset 0"):
        fl.composition(Layout(64), fl.make_composed_layout(Swizzle(2, 0, 2), 4, Layout(16)))
    with pytest.raises(LayoutError, match="bare swizzle"):
        fl.composition(Layout(64), Swizzle(2, 0, 2))
