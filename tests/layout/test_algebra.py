"""Complement, inverses, nullspace, common vectors and recasting, through their defining identities."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout
from flydsl.layout.int_tuple import leaves

from .layout_strategies import compact_layouts, injective_layouts, layouts


def test_cute_examples():
    assert fl.complement(Layout(4, 1), 24) == Layout(6, 4)
    assert fl.complement(Layout(6, 4), 24) == Layout(4, 1)
    assert fl.complement(Layout((4, 6), (1, 4)), 24) == Layout(1, 0)
    assert fl.complement(Layout((2, 2), (1, 6)), 24) == Layout((3, 2), (2, 12))
    assert fl.complement(Layout((2, 4), (8, 1))) == Layout(2, 4)  # default cotarget: cosize 12
    assert fl.complement(Layout(4, 2)) == Layout(2, 1)
    assert fl.right_inverse(Layout((4, 8), (8, 1))) == Layout((8, 4), (4, 1))
    assert fl.right_inverse(Layout((2, 4), (4, 1))) == Layout((4, 2), (2, 1))
    assert fl.right_inverse(Layout(4, 2)) == Layout(1, 0)
    assert fl.left_inverse(Layout(4, 2)) == Layout((2, 4), (4, 1))
    assert fl.nullspace(Layout((2, 4, 3), (1, 0, 2))) == Layout(4, 2)
    assert fl.nullspace(Layout((4, 8), (1, 4))) == Layout(1, 0)
    assert fl.max_common_vector(Layout((8, 8), (1, 8)), Layout((8, 8), (1, 8))) == 64
    assert fl.max_common_vector(Layout((4, 8), (1, 4)), Layout((4, 8), (1, 8))) == 4
    assert fl.max_common_vector(Layout((4, 8), (8, 1)), Layout((4, 8), (1, 4))) == 1
    assert fl.recast_layout(32, 16, Layout((8, 4), (1, 8))) == Layout((4, 4), (1, 4))
    assert fl.recast_layout(8, 16, Layout((4, 4), (1, 4))) == Layout((8, 4), (1, 8))
    assert fl.recast_layout(16, 16, Layout(4, 3)) == Layout(4, 3)
    assert fl.recast_layout(24, 16, Layout(12, 1)) == Layout(8, 1)  # 12 x 16 bits = 8 x 24 bits: up 3, down 2


def test_errors():
    with pytest.raises(fl.LayoutError, match="overlaps the smaller modes"):
        fl.complement(Layout((2, 2), (1, 1)), 8)
    with pytest.raises(fl.LayoutError, match="stride 3 of mode 2:3 is not a multiple of 2"):
        fl.complement(Layout((2, 2), (1, 3)), 12)
    with pytest.raises(fl.LayoutError, match="negative stride"):
        fl.complement(Layout((2, 2), (1, -2)))
    with pytest.raises(fl.LayoutError, match="not injective: mode 4:0"):
        fl.left_inverse(Layout((2, 4), (1, 0)))
    with pytest.raises(fl.LayoutError, match="shape_div"):
        fl.recast_layout(64, 16, Layout(6, 1))


@given(layouts(), st.sampled_from([1, 8, 24, 64, 300]))
def test_complement_disjoint_ordered_and_covering(L, extra):
    M = fl.cosize(L) + extra
    try:
        C = fl.complement(L, M)
    except fl.LayoutError:
        return
    image = {L(i) for i in range(fl.size(L))}
    cimage = [C(i) for i in range(fl.size(C))]
    assert image & set(cimage) == {0}  # disjoint
    strides = fl.flatten(C.stride) if isinstance(C.stride, tuple) else (C.stride,)
    shapes = fl.flatten(C.shape) if isinstance(C.shape, tuple) else (C.shape,)
    assert list(strides) == sorted(strides)  # ordered
    assert all(a * b <= c for a, b, c in zip(shapes, strides, strides[1:], strict=False))
    both = fl.make_layout(fl.filter(L), C)
    values = [both(i) for i in range(fl.size(both))]
    assert len(set(values)) == len(values)  # (L, C) injective after dropping L's broadcast modes
    assert fl.size(fl.filter(L)) * fl.size(C) >= M  # covers the cotarget


@given(compact_layouts())
def test_complement_of_compact_layout_fills_the_cotarget(L):
    C = fl.complement(L, 4 * fl.size(L))
    assert C == Layout(4, fl.size(L))


@given(layouts())
def test_right_inverse(L):
    R = fl.right_inverse(L)
    assert all(L(R(i)) == i for i in range(fl.size(R)))
    # Offsets 0 .. size(R)-1 are all reached; if offset 1 is reached, the inverse is not trivial.
    reached = {L(i) for i in range(fl.size(L))}
    assert set(range(fl.size(R))) <= reached
    assert fl.size(R) > 1 or 1 not in reached or not any(d == 1 for d in fl.flatten((L.stride,)))


@given(injective_layouts())
def test_left_inverse(L):
    R = fl.left_inverse(L)
    assert all(R(L(i)) == i for i in range(fl.size(L)))


@given(compact_layouts())
def test_inverses_of_bijections_agree(L):
    R, Li = fl.right_inverse(L), fl.left_inverse(L)
    assert fl.size(R) == fl.size(L)
    assert all(R(i) == Li(i) for i in range(fl.size(L)))


@given(layouts())
def test_nullspace(L):
    N = fl.nullspace(L)
    assert all(L(N(i)) == 0 for i in range(fl.size(N)))
    zeros = sum(1 for i in range(fl.size(L)) if L(i) == 0)
    assert fl.size(N) <= zeros


@given(layouts(), layouts())
def test_max_common_layout(a, b):
    R = fl.max_common_layout(a, b)
    for i in range(fl.size(R)):
        assert a(R(i)) == i and b(R(i)) == i
    assert fl.max_common_vector(a, b) == fl.size(R)


@given(compact_layouts(), st.sampled_from([2, 4]))
def test_recast_round_trip_and_meaning(L, n):
    down = fl.recast_layout(8, 8 * n, L)
    assert fl.recast_layout(8 * n, 8, down) == L
    # Narrower elements: element k of the new layout is byte k % n of element k // n when mode 0 is stride 1.
    strides = leaves(L.stride)
    if strides[0] == 1 and strides.count(1) == 1:
        assert all(down(k) == L(k // n) * n + k % n for k in range(fl.size(down)))
