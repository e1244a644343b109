"""Layout construction, coordinates, mode selection and slicing."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout
from flydsl.layout.int_tuple import fold, leaves, unflatten

from .layout_strategies import compact_layouts, layouts


def test_construction_and_notation():
    L = Layout((4, 8), (8, 1))
    assert repr(L) == str(L) == "(4,8):(8,1)" and L.shape == (4, 8) and L.stride == (8, 1)
    assert fl.make_layout((4, 8)) == Layout((4, 8), (1, 4)) == fl.make_layout((4, 8), (1, 4))
    assert fl.make_layout((4, 8), stride=(8, 1)) == L
    assert fl.make_layout(Layout(4, 2), Layout(8, 1)) == Layout((4, 8), (2, 1))
    assert repr(Layout(((2, 4), 8), ((1, 16), 2))) == "((2,4),8):((1,16),2)"
    assert fl.make_ordered_layout((4, 8, 2), (1, 0, 2)) == Layout((4, 8, 2), (8, 1, 32))
    assert fl.make_ordered_layout(((2, 2), 4), ((2, 0), 1)) == Layout(((2, 2), 4), ((8, 1), 2))
    assert Layout([4, 8], [1, 4]) == Layout((4, 8), (1, 4))
    assert hash(Layout((4, 8))) == hash(Layout((4, 8), (1, 4))) and Layout(4) != Layout((4,))


def test_construction_errors():
    with pytest.raises(fl.LayoutError, match="not congruent"):
        Layout((4, 8), 1)
    with pytest.raises(fl.LayoutError, match="positive"):
        Layout((4, 0))
    with pytest.raises(fl.LayoutError, match="order must hold each of 0..1 once"):
        fl.make_ordered_layout((4, 8), (0, 1, 2))
    with pytest.raises(fl.LayoutError, match="stride cannot be given"):
        fl.make_layout(Layout(4), stride=1)
    with pytest.raises(fl.LayoutError, match="does not fit shape"):
        fl.crd2idx((1, 2, 3), Layout((4, 8)))
    with pytest.raises(fl.LayoutError, match="is a slice"):
        fl.crd2idx((1, None), Layout((4, 8)))


def test_coordinates_worked_examples():
    L = Layout((4, 8), (8, 1))
    assert L(1, 2) == L((1, 2)) == 10 and L(9) == 10
    assert fl.crd2idx((1, 2), L) == 10 and fl.crd2idx(5, (2, 4), (4, 1)) == 6 and fl.crd2idx((1, 1), (4, 8)) == 5
    assert fl.idx2crd(13, (4, 8)) == (1, 3)
    assert fl.idx2crd(70, Layout((4, 64), (64, 1))) == (1, 6)  # the seed's wave/lane split
    assert fl.crd2crd((1, 2), (4, 8), (8, 4)) == (1, 1)
    assert fl.idx2crd(13, ((2, 2), 8)) == ((1, 0), 3)
    assert fl.idx2crd((5, 3), ((2, 4), 8)) == ((1, 2), 3)
    # Beyond its size a layout extends its last mode.
    assert Layout((2, 3), (1, 2))(8) == 8 and Layout((2, 2), (1, 10))(5) == 21


@given(layouts())
def test_index_and_coordinate_agree(L):
    n = fl.size(L)
    for i in range(n):
        c = fl.idx2crd(i, L.shape)
        assert fl.crd2idx(c, L.shape) == i
        assert L(i) == L(c) == fl.crd2idx(c, L)
        assert fl.crd2crd(c, L.shape, fl.flatten(L.shape)) == fl.idx2crd(i, fl.flatten(L.shape))
    assert fl.cosize(L) == max(L(i) for i in range(n)) + 1


@given(compact_layouts())
def test_idx2crd_inverts_compact_layouts(L):
    for i in range(fl.size(L)):
        assert L(fl.idx2crd(i, L)) == i


@given(layouts())
def test_modes_and_structure(L):
    assert fl.size(L) == fl.product(L.shape) and fl.rank(L) == fl.rank(L.shape) == len(L)
    assert fl.depth(L) == fl.depth(L.shape)
    modes = list(L)
    assert fl.make_layout(*modes) == L or not isinstance(L.shape, tuple)
    for i, m in enumerate(modes):
        assert fl.get(L, i) == L[i] == m and fl.size(L, mode=[i]) == fl.size(m)
    r = fl.rank(L)
    assert fl.select(L, *reversed(range(r))) == fl.make_layout(*reversed(modes)) or r == 1
    assert fl.take(L, 0, r) == fl.make_layout(*modes) or r == 1
    g = fl.group(L, 0, r)
    assert fl.rank(g) == 1 and all(g((c,)) == L(c) for c in [fl.idx2crd(i, L.shape) for i in range(fl.size(L))])
    padded = fl.append(L, Layout(1, 0), up_to_rank=r + 2)
    assert fl.rank(padded) == r + 2 and all(padded(i) == L(i) for i in range(fl.size(L)))
    front = fl.prepend(L, Layout(2, 0))
    assert all(front(2 * i + 1) == L(i) for i in range(fl.size(L)))


def test_mode_selection_examples():
    L = Layout(((2, 4), 8), ((1, 16), 2))
    assert fl.get(L, 0, 1) == fl.get(L, mode=[0, 1]) == Layout(4, 16)
    assert fl.get(((2, 4), 8), 0, 0) == 2
    assert fl.select(Layout((2, 3, 4), (1, 2, 6)), 2, 0) == Layout((4, 2), (6, 1))
    assert fl.select((2, 3, 4), mode=[1]) == (3,)
    assert fl.take(Layout((2, 3, 4), (1, 2, 6)), 1, 3) == Layout((3, 4), (2, 6))
    assert fl.group(Layout((2, 3, 4), (1, 2, 6)), 0, 2) == fl.group_modes(Layout((2, 3, 4), (1, 2, 6)), 0, 2)
    assert fl.group((2, 3, 4), 1, 3) == (2, (3, 4))
    assert fl.append(Layout(4, 1), Layout(2, 4)) == Layout((4, 2), (1, 4))
    assert fl.prepend((3, 4), 2) == (2, 3, 4)
    with pytest.raises(fl.LayoutError, match="out of range"):
        fl.get(L, 2)
    with pytest.raises(fl.LayoutError, match="out of range"):
        fl.get(Layout(4, 1), 1)
    with pytest.raises(fl.LayoutError, match="extended by a layout"):
        fl.append(L, 3)


def test_slicing_examples():
    L = Layout((4, 8), (8, 1))
    assert fl.slice_((None, 2), L) == Layout((4,), (8,)) == L(None, 2) == fl.slice_(L, (None, 2))
    assert fl.slice_and_offset((None, 2), L) == (Layout((4,), (8,)), 2)
    assert fl.dice((None, 2), L) == Layout((8,), (1,))
    N = Layout(((2, 3), (4, 5)), ((1, 2), (6, 24)))
    # CuTe splices the kept modes of a sub-coordinate (lslice + tuple_cat): (2,(4,5)), not ((2),(4,5)).
    assert fl.slice_(((None, 1), None), N) == Layout((2, (4, 5)), (1, (6, 24)))
    assert fl.slice_((1, None), N) == Layout(((4, 5),), ((6, 24),))
    assert fl.dice(((None, 1), None), N) == Layout((3,), (2,))  # spliced likewise
    assert fl.slice_(None, L) == L and fl.slice_(3, L) == Layout((), ())
    with pytest.raises(fl.LayoutError, match="does not fit"):
        fl.slice_((None, 1, 2), L)


@st.composite
def layout_and_slice(draw):
    L = draw(layouts())
    coord = fl.idx2crd(draw(st.integers(0, fl.size(L) - 1)), L.shape)
    sliced = fold(coord, lambda c: None if draw(st.booleans()) else c, lambda p: p)
    return L, coord, sliced


@given(layout_and_slice())
def test_slice_plus_offset_is_the_layout(case):
    L, coord, sliced = case
    sub, off = fl.slice_and_offset(sliced, L)
    kept = [c for c, s in zip(leaves(coord), leaves(sliced), strict=True) if s is None]
    # The kept leaves, in order, are the coordinate of the slice; the slice plus its offset is the layout.
    assert sub(unflatten(kept, sub.shape)) + off == L(coord)
    assert fl.slice_(sliced, L) == sub
    if any(c is None for c in leaves(sliced)):
        assert L(sliced) == sub
    diced = fl.dice(sliced, L)
    assert fl.size(sub) * fl.size(diced) == fl.size(L)
    assert leaves(diced.shape) == tuple(
        s for s, c in zip(leaves(L.shape), leaves(sliced), strict=True) if c is not None
    )


def test_big_integers():
    big = 2**70
    L = Layout((4, 8), (2**31 + 1, big))
    assert L(3, 7) == 3 * (2**31 + 1) + 7 * big
    assert fl.cosize(L) == L(3, 7) + 1
    assert fl.idx2crd(L(2, 5), Layout((4, 8), (1, 2**64))) == (L(2, 5) % 4, 0)
    R = fl.composition(Layout((2**33, 4), (1, 2**63)), Layout((8, 4), (2**32, 2**33)))
    assert all(R(i) == Layout((2**33, 4), (1, 2**63))(Layout((8, 4), (2**32, 2**33))(i)) for i in range(32))
    assert fl.complement(Layout(4, 2**40), 2**45) == Layout((2**40, 8), (1, 2**42))
    assert fl.right_inverse(Layout((2**32, 2), (2, 1))) == Layout((2, 2**32), (2**32, 1))
