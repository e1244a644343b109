"""Divides and products, checked against their definitions through composition and complement."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout

from .layout_strategies import compact_layouts, divisors, layouts


def test_cute_examples():
    assert fl.logical_divide(Layout((4, 2, 3), (2, 1, 8)), Layout(4, 2)) == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
    A = Layout((9, (4, 8)), (59, (13, 1)))
    T = (Layout(3, 3), Layout((2, 4), (1, 8)))
    assert fl.logical_divide(A, T) == Layout(((3, 3), ((2, 4), (2, 2))), ((177, 59), ((13, 2), (26, 1))))
    assert fl.zipped_divide(A, T) == Layout(((3, (2, 4)), (3, (2, 2))), ((177, (13, 2)), (59, (26, 1))))
    assert fl.tiled_divide(A, T) == Layout(((3, (2, 4)), 3, (2, 2)), ((177, (13, 2)), 59, (26, 1)))
    assert fl.flat_divide(A, T) == Layout((3, (2, 4), 3, (2, 2)), (177, (13, 2), 59, (26, 1)))
    assert fl.logical_product(Layout((2, 2), (4, 1)), Layout(6, 1)) == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
    assert fl.logical_product(Layout((2, 2), (4, 1)), Layout((4, 2), (2, 1))) == Layout(
        ((2, 2), (4, 2)), ((4, 1), (8, 2))
    )
    assert fl.blocked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))) == Layout(
        ((2, 3), (5, 4)), ((5, 10), (1, 30))
    )
    assert fl.raked_product(Layout((2, 5), (5, 1)), Layout((3, 4), (1, 3))) == Layout(
        ((3, 2), (4, 5)), ((10, 5), (30, 1))
    )
    assert fl.zipped_divide(Layout((8192, 8192), (8192, 1)), (128, 64)) == Layout(
        ((128, 64), (64, 128)), ((8192, 1), (1048576, 64))
    )
    assert fl.tile_to_shape(Layout((2, 2), (1, 2)), (4, 6)) == Layout(((2, 2), (2, 3)), ((1, 4), (2, 8)))
    assert fl.tile_to_shape(Layout((8, 64), (64, 1)), (128, 64)) == Layout((128, 64), (64, 1))
    assert fl.tile_to_shape(Layout(4, 1), 12) == Layout(12, 1)
    assert fl.tile_to_shape(Layout((2, 2)), (4, 4), (1, 0)) == Layout(((2, 2), 4), ((1, 8), 2))


def test_errors():
    with pytest.raises(fl.LayoutError, match="tiler has 3 modes"):
        fl.logical_divide(Layout((4, 8)), (2, 2, 2))
    with pytest.raises(fl.LayoutError, match="does not divide target mode 6"):
        fl.tile_to_shape(Layout((4, 4)), (8, 6))
    with pytest.raises(fl.LayoutError, match="more modes than the target"):
        fl.tile_to_shape(Layout((4, 4, 2)), (8, 8))
    with pytest.raises(fl.LayoutError, match="composition: .* stride divisibility fails"):
        fl.logical_divide(Layout((6, 4), (4, 1)), Layout(4, 1))  # the rest mode 6:4 crosses 6 without dividing it


@st.composite
def layout_and_tile(draw):
    A = draw(layouts(max_size=128))
    n = fl.size(A)
    d = draw(st.sampled_from(divisors(n)))
    k = draw(st.sampled_from(divisors(n // d)))
    return A, Layout(d, k)


@given(layout_and_tile())
def test_logical_divide_is_composition_with_complement(case):
    A, T = case
    try:
        R = fl.logical_divide(A, T)
    except fl.LayoutError:
        return
    C = fl.complement(T, fl.size(A))
    assert fl.size(R) == fl.size(T) * fl.size(C) and fl.rank(R) == 2
    for j in range(fl.size(C)):
        for i in range(fl.size(T)):
            assert R(i, j) == A(T(i) + C(j))
    # zipped / tiled / flat regroup the same function of the index.
    for variant in (fl.zipped_divide, fl.tiled_divide, fl.flat_divide):
        V = variant(A, T)
        assert all(V(k) == R(k) for k in range(fl.size(R)))


@given(compact_layouts(max_size=64), st.data())
def test_by_mode_divide_tiles_every_mode(A, data):
    tiler = tuple(None if data.draw(st.booleans()) else data.draw(st.sampled_from(divisors(fl.size(m)))) for m in A)
    try:
        L = fl.logical_divide(A, tiler)
    except fl.LayoutError:
        return
    Z, T, F = fl.zipped_divide(A, tiler), fl.tiled_divide(A, tiler), fl.flat_divide(A, tiler)
    for i, t in enumerate(tiler):
        assert L[i] == (A[i] if t is None else fl.logical_divide(A[i], t))
    # Same set of offsets, tile by tile: zipped mode 0 is one tile, and tiled/flat only regroup zipped.
    assert sorted(Z(k) for k in range(fl.size(Z))) == sorted(A(k) for k in range(fl.size(A)))
    assert all(T(k) == Z(k) == F(k) for k in range(fl.size(Z)))
    tile = Z[0]
    assert fl.size(tile) == fl.product(tuple(fl.size(m) if t is None else t for m, t in zip(A, tiler, strict=True)))


@st.composite
def block_and_tiler(draw):
    block = draw(layouts(max_leaves=3, max_size=16))
    tiler = draw(compact_layouts(max_leaves=2, max_size=12))
    return block, tiler


@given(block_and_tiler())
def test_logical_product_definition(case):
    A, B = case
    try:
        P = fl.logical_product(A, B)
    except fl.LayoutError:
        return
    C = fl.complement(A, fl.size(A) * fl.cosize(B))
    assert P[0] == A and fl.size(P) == fl.size(A) * fl.size(B)
    for j in range(fl.size(B)):
        assert all(P(i, j) == A(i) + C(B(j)) for i in range(fl.size(A)))
    for variant in (fl.zipped_product, fl.tiled_product, fl.flat_product):
        V = variant(A, B)
        assert all(V(k) == P(k) for k in range(fl.size(P)))


@given(block_and_tiler())
def test_blocked_and_raked_products_regroup_the_logical_product(case):
    A, B = case
    r = max(fl.rank(A), fl.rank(B))
    Ap = fl.append(A, Layout(1, 0), r) if fl.rank(A) < r else A
    Bp = fl.append(B, Layout(1, 0), r) if fl.rank(B) < r else B
    try:
        P = fl.logical_product(Ap, Bp)
    except fl.LayoutError:
        return
    blocked, raked = fl.blocked_product(A, B), fl.raked_product(A, B)
    for a in range(fl.size(Ap)):
        for b in range(fl.size(Bp)):
            ca, cb = fl.idx2crd(a, fl.product_each(Ap.shape)), fl.idx2crd(b, fl.product_each(Bp.shape))
            ca, cb = (c if isinstance(c, tuple) else (c,) for c in (ca, cb))
            assert blocked(tuple(zip(ca, cb, strict=True))) == P(a, b)
            assert raked(tuple(zip(cb, ca, strict=True))) == P(a, b)


@given(compact_layouts(max_leaves=3, max_size=16), st.sampled_from([(1, 1), (2, 3), (4, 1), (1, 2)]))
def test_tile_to_shape(block, reps):
    block2 = fl.append(block, Layout(1, 0), 2) if fl.rank(block) < 2 else fl.group(block, 1, fl.rank(block))
    bshape = fl.product_each(block2.shape)
    target = (bshape[0] * reps[0], bshape[1] * reps[1])
    R = fl.tile_to_shape(block2, target)
    assert fl.product_each(R.shape) == target
    # The first tile is the block itself, and the whole is a bijection onto [0, size).
    for i in range(bshape[0]):
        for j in range(bshape[1]):
            assert R(i, j) == block2(i, j)
    assert sorted(R(k) for k in range(fl.size(R))) == list(range(fl.size(R)))
