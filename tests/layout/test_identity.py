"""Identity layouts and scaled-basis strides (CuTe's E<i>, printed 1@0): layouts whose values are coordinates."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import LayoutError
from flydsl.layout.int_tuple import leaves

from .layout_strategies import compact_layouts, int_tuples


def test_identity_values_and_printing():
    ident = fl.make_identity_layout((4, 8))
    assert str(ident) == "(4,8):(1@0,1@1)"
    assert ident(5) == (1, 1)
    assert ident(2, 7) == (2, 7)
    assert ident(0) == (0, 0)
    assert fl.make_identity_layout(8) == fl.Layout(8, 1)  # a leaf shape: the index itself
    nested = fl.make_identity_layout(((2, 3), 4))
    assert str(nested) == "((2,3),4):((1@0@0,1@0@1),1@1)"
    assert nested(5) == ((1, 2), 0)
    assert fl.E(1, 0) == fl.ScaledBasis(1, (1, 0)) and repr(fl.E(1, 0)) == "1@1@0"
    assert fl.make_basis_like((4, 8)) == (fl.E(0), fl.E(1))


@given(int_tuples(max_leaves=4).filter(lambda s: fl.size(s) <= 256))
def test_identity_maps_index_to_its_coordinate(shape):
    ident = fl.make_identity_layout(shape)
    for i in range(fl.size(shape)):
        assert ident(i) == fl.idx2crd(i, shape)


@given(int_tuples(max_leaves=4).filter(lambda s: fl.size(s) <= 256))
def test_identity_parses_and_hashes(shape):
    ident = fl.make_identity_layout(shape)
    again = fl.parse_layout(str(ident))
    assert again == ident and hash(again) == hash(ident)
    assert fl.is_static(ident)


@given(st.sampled_from([(4, 8), (12, 10), (16, 6), (8, 8)]), st.sampled_from([(2, 2), (4, 2), (2, 4), (4, None)]))
def test_divided_identity_gives_global_coordinates(shape, tile):
    """zipped_divide of the identity: element i of tile t is at the coordinate where the compact layout puts it."""
    assume(all(t is None or s % t == 0 for s, t in zip(shape, tile, strict=True)))
    ident = fl.make_identity_layout(shape)
    data = fl.Layout(shape)  # compact column-major: offset -> coordinate is idx2crd
    for divide in (fl.zipped_divide, fl.logical_divide):
        coords, offsets = divide(ident, tile), divide(data, tile)
        assert coords.shape == offsets.shape
        for i in range(fl.size(coords)):
            assert coords(i) == fl.idx2crd(offsets(i), shape)


def test_tail_tiles_show_out_of_bounds_coordinates():
    """A tile that does not divide the shape: the last tile's coordinates run past the shape (to be predicated)."""
    m, n = 10, 6
    tiled = fl.zipped_divide(fl.make_identity_layout((m, n)), (4, 3))
    assert fl.size(tiled, mode=[1]) == 3 * 2
    seen = set()
    for t in range(fl.size(tiled, mode=[1])):
        for i in range(fl.size(tiled, mode=[0])):
            row, col = tiled(i, t)
            seen.add((row, col))
            assert col < n and row < 12
    inside = {c for c in seen if c[0] < m}
    assert inside == {(r, c) for r in range(m) for c in range(n)}
    assert {c for c in seen if c[0] >= m} == {(r, c) for r in (10, 11) for c in range(n)}


@given(compact_layouts(max_leaves=3, max_size=64), st.data())
def test_composition_with_identity_is_pointwise(b, data):
    """identity(S) o B evaluates to the coordinates of B's offsets in S (for size(B) > 1: a size-1 result is 1:0)."""
    assume(fl.size(b) > 1)
    shape = data.draw(st.sampled_from([(fl.size(b),), (2, fl.size(b) // 2) if fl.size(b) % 2 == 0 else (fl.size(b),)]))
    ident = fl.make_identity_layout(shape)
    try:
        r = fl.composition(ident, b)
    except LayoutError:  # the modes of an identity never coalesce: (2,3):(1@0,1@1) o 3:1 crosses mode 0
        assert len(shape) == 2
        return
    for i in range(fl.size(b)):
        # The result's strides may name fewer trailing modes than S (e.g. 2:1@0 from (2,1)): pad with zeros.
        value = r(i)
        assert value + (0,) * (len(shape) - len(value)) == ident(b(i)) == fl.idx2crd(b(i), shape)


def test_algebra_on_basis_strides():
    ident = fl.make_identity_layout((4, 8))
    assert fl.coalesce(ident) == ident  # 4@0 is not 1@1: nothing merges
    assert str(fl.composition(ident, fl.Layout((2, 4), (4, 1)))) == "(2,4):(1@1,1@0)"
    assert str(fl.logical_divide(ident, (2, 4))) == "((2,2),(4,2)):((1@0,2@0),(1@1,4@1))"
    sliced = ident(None, 3)
    assert str(sliced) == "(4):(1@0)"
    with pytest.raises(LayoutError, match="basis strides"):
        fl.cosize(ident)
    with pytest.raises(LayoutError):
        fl.complement(ident)
    assert "(3,7)" in fl.layout_table(ident)
    assert all(isinstance(d, fl.ScaledBasis) for d in leaves(fl.zipped_divide(ident, (2, 2)).stride))
