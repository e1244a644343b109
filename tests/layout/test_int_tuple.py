"""IntTuple helpers: worked examples and structural properties."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout.int_tuple import fold, leaves, transform, unflatten

from .layout_strategies import int_tuples, stride_leaf


def test_worked_examples():
    assert fl.is_tuple((1,)) and not fl.is_tuple(1)
    assert fl.flatten(((2, 4), (8,))) == (2, 4, 8) and fl.flatten(7) == 7
    assert fl.rank((2, (3, 4))) == 2 and fl.rank(7) == 1
    assert fl.depth(7) == 0 and fl.depth((2, 3)) == 1 and fl.depth((2, (3, 4))) == 2
    assert fl.size(((2, 4), 8)) == fl.product(((2, 4), 8)) == 64 and fl.product(()) == 1
    assert fl.product_each(((2, 4), (3, 5))) == (8, 15)
    assert fl.inner_product((2, (3, 4)), (1, (10, 100))) == 432
    assert fl.prefix_product(((2, 4), 8)) == ((1, 2), 8)
    assert fl.prefix_product((2, (3, 4)), 5) == (5, (10, 30))
    assert fl.shape_div((4, 8), 8) == (1, 4) and fl.shape_div((6, 2), 3) == (2, 2)
    assert fl.shape_div(2, 8) == 1 and fl.shape_div(12, (2, 3)) == 2
    assert fl.ceil_div((3, 5), 4) == (1, 3) and fl.ceil_div(7, 2) == 4 and fl.ceil_div((8, 9), (4, 2)) == (2, 5)
    assert fl.congruent((2, (3, 4)), (1, (5, 6))) and not fl.congruent((2, 3), 6)
    assert fl.weakly_congruent((2, 3), ((1, 2), 3)) and not fl.weakly_congruent(((1, 2), 3), (2, 3))
    assert fl.elem_less((1, (2, 3)), (2, (3, 4), 5)) and not fl.elem_less((1, 4), (2, 4))
    assert not fl.elem_less((1, 2, 3), (2, 3))


def test_errors():
    with pytest.raises(fl.LayoutError, match="shape_div: neither of 3 and 4"):
        fl.shape_div(3, 4)
    with pytest.raises(fl.LayoutError, match="rank of"):
        fl.ceil_div((4,), (2, 2))
    with pytest.raises(fl.LayoutError, match="elem_less"):
        fl.elem_less((1, 2), 3)
    with pytest.raises(fl.LayoutError, match="does not have the structure"):
        fl.inner_product((1, 2), (1, 2, 3))


@given(int_tuples())
def test_flatten_unflatten_round_trip(t):
    flat = leaves(t)
    assert unflatten(flat, t) == t
    assert fl.product(t) == fl.product(flat)
    assert fl.rank(fl.flatten(t)) == len(flat)


@given(int_tuples())
def test_prefix_product_is_compact_column_major(t):
    strides = leaves(fl.prefix_product(t))
    flat = leaves(t)
    running = 1
    for s, d in zip(flat, strides, strict=True):
        assert d == running
        running *= s
    # The compact layout it defines is a bijection onto [0, size).
    lay = fl.Layout(t)
    assert sorted(lay(i) for i in range(fl.size(t))) == list(range(fl.size(t)))


@given(int_tuples(), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
def test_shape_div_ceil_div(t, d):
    n = fl.product(t)
    assert fl.ceil_div(n, d) == -(-n // d)
    c = fl.ceil_div(t, d)
    assert fl.congruent(c, t)
    try:
        q = fl.shape_div(t, d)
    except fl.LayoutError:
        return
    # Where shape_div is defined (each step divides one way), it agrees with ceil_div and is exact.
    assert q == c
    assert fl.product(q) * d == n or n % d != 0


@given(int_tuples(), int_tuples(stride_leaf))
def test_congruence(a, b):
    assert fl.congruent(a, a) and fl.weakly_congruent(a, a)
    assert fl.congruent(a, b) == (fold(a, lambda _: 0, lambda p: p) == fold(b, lambda _: 0, lambda p: p))
    assert fl.weakly_congruent(fl.product(a), b)
    doubled = transform(lambda x: 2 * x, a)
    assert fl.congruent(doubled, a) and fl.inner_product(a, doubled) == 2 * sum(x * x for x in leaves(a))
