"""Swizzles, composed layouts and TV layouts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import ComposedLayout, Layout, Swizzle

from .layout_strategies import compact_layouts

SW128 = fl.tile_to_shape(fl.make_composed_layout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1))), (128, 64))


def test_swizzle_examples():
    sw = Swizzle(3, 4, 3)
    assert repr(sw) == "Sw<3,4,3>" and sw.yyy_mask == 0b1110000000 and sw.zzz_mask == 0b1110000
    assert [sw(x) for x in (0, 16, 128, 144, 1024)] == [0, 16, 144, 128, 1024]
    assert Swizzle(2, 0, -2)(0b0011) == 0b1111 and fl.make_swizzle(3, 4, 3) == sw and hash(sw) == hash(Swizzle(3, 4, 3))
    with pytest.raises(fl.LayoutError, match="shift"):
        Swizzle(3, 0, 2)


@given(st.integers(0, 3), st.integers(0, 4), st.integers(-5, 5))
def test_swizzle_is_an_involution(bits, base, shift):
    if abs(shift) < bits:
        return
    sw = Swizzle(bits, base, shift)
    n = 1 << (bits + base + abs(shift) + 1)
    assert all(sw(sw(x)) == x for x in range(n))
    assert sorted(sw(x) for x in range(n)) == list(range(n))


def test_composed_layout_algebra():
    assert repr(SW128) == "Sw<3,3,3> o 0 o (128,64):(64,1)" and fl.size(SW128) == 128 * 64 and fl.rank(SW128) == 2
    inner = Layout((128, 64), (64, 1))
    assert all(SW128(m, n) == Swizzle(3, 3, 3)(inner(m, n)) for m in range(0, 128, 7) for n in range(64))
    # Each row of 8 16-byte chunks (8 bf16 each) is permuted: no two rows of 8 share a bank group.
    assert len({SW128(m, 0) // 8 % 8 for m in range(8)}) == 8
    Z = fl.zipped_divide(SW128, (16, 16))
    assert Z == ComposedLayout(Swizzle(3, 3, 3), 0, fl.zipped_divide(inner, (16, 16)))
    assert fl.composition(SW128, (16, None)) == ComposedLayout(Swizzle(3, 3, 3), 0, Layout((16, 64), (64, 1)))
    assert fl.coalesce(SW128) == SW128 and fl.coalesce(fl.select(SW128, 1, 0)).inner == Layout(8192, 1)
    assert fl.logical_product(SW128, Layout(2)).inner == fl.logical_product(inner, Layout(2))
    sub = SW128(None, 5)
    assert sub == fl.slice_((None, 5), SW128) and all(sub(m) == SW128(m, 5) for m in range(128))
    assert fl.slice_and_offset((3, None), SW128)[1] == 0
    assert SW128[1] == ComposedLayout(Swizzle(3, 3, 3), 0, Layout(64, 1)) and len(SW128) == 2
    assert fl.select(SW128, 1, 0).inner == Layout((64, 128), (1, 64))
    assert fl.composition(Swizzle(1, 0, 1), Layout((2, 2), (2, 1))) == fl.make_composed_layout(
        Swizzle(1, 0, 1), 0, Layout((2, 2), (2, 1))
    )
    # A layout after a swizzled layout (once refused, now CuTe's composition(Layout, ComposedLayout)): 8:1 extends
    # to the identity, so the swizzle passes through unchanged; a bare swizzle on the right is still refused.
    assert fl.composition(Layout(8), SW128) == SW128
    with pytest.raises(fl.LayoutError, match="after a bare swizzle"):
        fl.composition(Layout(8), Swizzle(3, 3, 3))
    with pytest.raises(fl.LayoutError, match="neither a swizzle nor a layout"):
        ComposedLayout(3, 0, Layout(4))


@given(compact_layouts(max_size=64), st.sampled_from([(1, 0, 1), (2, 1, 2), (1, 2, 3)]), st.integers(0, 16))
def test_composed_composition_and_slicing_agree_pointwise(L, params, offset):
    C = ComposedLayout(Swizzle(*params), offset, L)
    B = Layout(fl.size(L))
    R = fl.composition(C, B)
    assert all(R(i) == C(B(i)) for i in range(fl.size(B)))
    if fl.rank(L) > 1:
        coord = (None,) + tuple(0 for _ in range(fl.rank(L) - 1))
        S = C(coord)
        assert all(S((i,)) == C((i,) + coord[1:]) for i in range(fl.size(L[0])))


def test_make_layout_tv_examples():
    tiler, tv = fl.make_layout_tv(Layout((4, 2), (2, 1)), Layout((1, 2), (2, 1)))
    assert tiler == (4, 4) and tv == Layout(((2, 4), 2), ((8, 1), 4))
    tiler, tv = fl.make_layout_tv(Layout((32, 4), (4, 1)), Layout((4, 1)))
    assert tiler == (128, 4) and tv == Layout(((4, 32), 4), ((128, 4), 1))


@given(compact_layouts(max_leaves=2, max_size=16), compact_layouts(max_leaves=2, max_size=8))
def test_make_layout_tv_inverts_the_raked_product(thr, val):
    if fl.rank(thr) != fl.rank(val):
        return
    tiler, tv = fl.make_layout_tv(thr, val)
    mn = fl.raked_product(thr, val)
    nt, nv = fl.size(thr), fl.size(val)
    assert tiler == fl.product_each(mn.shape) and fl.size(tv) == nt * nv
    # Each (thread, value) lands on its own cell of the tile, and the tile is covered.
    assert all(mn(tv(t, v)) == t + nt * v for t in range(nt) for v in range(nv))
    assert sorted(tv(k) for k in range(nt * nv)) == list(range(fl.size(tiler)))
