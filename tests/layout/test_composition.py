"""Coalesce, filter and composition: R(i) == A(B(i)) for every i < size(B), or a LayoutError."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout
from flydsl.layout.int_tuple import leaves

from .layout_strategies import compact_layouts, divisors, layouts


def assert_composes(A, B, R):
    assert fl.size(R) == fl.size(B)
    for i in range(fl.size(B)):
        assert R(i) == A(B(i)), f"{A} o {B} = {R} differs at {i}"


def test_cute_examples():
    # CuTe's layout algebra documentation and tests.
    A, B = Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1))
    assert fl.composition(A, B) == Layout(((2, 2), 3), ((24, 2), 8))
    assert fl.composition(Layout(20, 2), Layout((5, 4), (4, 1))) == Layout((5, 4), (8, 2))
    assert fl.composition(Layout((10, 2), (16, 4)), Layout((5, 4), (1, 5))) == Layout((5, (2, 2)), (16, (80, 4)))
    assert fl.composition(Layout((12, (4, 8)), (59, (13, 1))), (Layout(3, 4), Layout(8, 2))) == Layout(
        (3, (2, 4)), (236, (26, 1))
    )
    assert fl.composition(Layout((12, 8), (8, 1)), (4, None)) == Layout((4, 8), (8, 1))
    assert fl.composition(Layout(4, 1), Layout(8, 1)) == Layout(8, 1)  # A extended by its last mode
    assert fl.composition(Layout(4, 2), 3) == Layout(3, 2)
    assert fl.composition(Layout((4, 8), (8, 1)), None) == Layout((4, 8), (8, 1))
    # Inside one mode no divisibility is needed.
    assert fl.composition(Layout((6, 8), (8, 1)), Layout(2, 4)) == Layout(2, 32)


@pytest.mark.parametrize(
    "A, B, message",
    [
        # pycute truncates this one to size 3.
        (Layout((3, 3, 1), (3, 1, 9)), Layout(4, 1), "shape divisibility fails: B's mode 4:1 crosses mode 0"),
        # CuTe DSL returns a wrong layout for this one.
        (Layout((6, 8), (8, 1)), Layout((4, 6), (0, 4)), "stride divisibility fails: B's mode 6:4 crosses mode 0"),
        # CuTe C++ returns (4,2):(1,2), wrong at (3,1): the two modes of B carry into each other.
        (Layout((4, 4), (1, 10)), Layout((4, 2), (1, 2)), "modes of B overlap inside mode 0"),
        (Layout((4, 4), (1, 10)), Layout(2, -1), "negative stride"),
        (Layout((4, 8)), (Layout(2), Layout(2), Layout(2)), "tiler .* has more modes"),
    ],
)
def test_inadmissible(A, B, message):
    with pytest.raises(fl.LayoutError, match=message):
        fl.composition(A, B)


@given(layouts(), layouts(max_leaves=3, max_size=64))
def test_composition_is_right_or_raises(A, B):
    try:
        R = fl.composition(A, B)
    except fl.LayoutError:
        return
    assert_composes(A, B, R)
    assert fl.congruent(fl.product_each(R.shape), fl.product_each(B.shape)) or fl.rank(B) == 1


@given(layouts())
def test_composition_with_its_own_size_never_fails(A):
    n = fl.size(A)
    assert_composes(A, Layout(n), fl.composition(A, Layout(n)))
    assert_composes(A, Layout(2 * n, 1), fl.composition(A, 2 * n))


@st.composite
def compact_and_tile(draw):
    A = draw(compact_layouts())
    n, flat = fl.size(A), leaves(A.shape)
    j = draw(st.integers(0, len(flat)))
    p = fl.product(flat[:j]) * draw(st.sampled_from(divisors(flat[j]) if j < len(flat) else [1]))
    # B splits A's index space at a (sub)mode boundary: CuTe-admissible for any mode order of A.
    return A, Layout((p, n // p), (1, p))


@given(compact_and_tile())
def test_admissible_tiles_compose(case):
    A, B = case
    assert_composes(A, B, fl.composition(A, B))


@given(layouts(), st.sampled_from([1, 2, 3, 4]))
def test_by_mode_composition(A, n):
    tiler = tuple(None if i % 2 else Layout(1, 0) if n == 3 else n for i in range(fl.rank(A)))
    try:
        R = fl.composition(A, tiler)
    except fl.LayoutError:
        return
    assert fl.rank(R) == fl.rank(A)
    for i, t in enumerate(tiler):
        assert R[i] == (A[i] if t is None else fl.composition(A[i], t))


@given(layouts())
def test_coalesce_keeps_the_function(L):
    C = fl.coalesce(L)
    assert fl.size(C) == fl.size(L) and fl.depth(C) <= 1
    assert all(C(i) == L(i) for i in range(fl.size(L)))
    # No two neighbouring modes could merge, and no size-1 mode is left (unless the result is 1:0).
    shapes, strides = fl.flatten(C.shape), fl.flatten(C.stride)
    if isinstance(shapes, tuple):
        assert all(s != 1 for s in shapes)
        assert all(shapes[i] * strides[i] != strides[i + 1] for i in range(len(shapes) - 1))
    assert fl.coalesce(C) == C


@given(layouts())
def test_coalesce_by_mode(L):
    profile = tuple(0 for _ in range(fl.rank(L))) if isinstance(L.shape, tuple) else 0
    C = fl.coalesce(L, profile)
    assert fl.rank(C) == fl.rank(L) or profile == 0
    assert all(C(fl.idx2crd(i, fl.product_each(L.shape))) == L(fl.idx2crd(i, L.shape)) for i in range(fl.size(L)))


@given(layouts())
def test_filter(L):
    F, Z = fl.filter(L), fl.filter_zeros(L)
    assert fl.congruent(Z.shape, L.shape) and Z.stride == L.stride
    assert fl.size(F) == fl.size(fl.filter(Z)) and F == fl.filter_layout(L)
    image = {L(i) for i in range(fl.size(L))}
    assert {F(i) for i in range(fl.size(F))} == image
    assert {Z(i) for i in range(fl.size(Z))} == image
    assert all(d != 0 for d in ([F.stride] if isinstance(F.stride, int) else F.stride)) or F == Layout(1, 0)


def test_coalesce_filter_examples():
    assert fl.coalesce(Layout((2, (1, 6)), (1, (6, 2)))) == Layout(12, 1)
    assert fl.coalesce(Layout((2, 4, 3), (1, 2, 8)), (0, 0, 0)) == Layout((2, 4, 3), (1, 2, 8))
    assert fl.coalesce(Layout(((2, 4), 3), ((1, 2), 8)), (0, 0)) == Layout((8, 3), (1, 8))
    assert fl.coalesce(Layout((1, 1), (3, 5))) == Layout(1, 0)
    assert fl.filter_zeros(Layout((4, (2, 3)), (1, (0, 4)))) == Layout((4, (1, 3)), (1, (0, 4)))
    assert fl.filter(Layout((4, 2, 3), (1, 0, 8))) == Layout((4, 3), (1, 8))
    with pytest.raises(fl.LayoutError, match="profile"):
        fl.coalesce(Layout((2, 4)), (0, 0, 0))


@given(layouts(), layouts(max_leaves=3, max_size=64))
def test_static_fast_paths_agree_with_the_general_path(a, b):
    """composition and complement take an int-only fast path for static layouts; the general (protocol) path must
    give the same layout, or the same error."""
    import importlib
    from unittest import mock

    algebra = importlib.import_module("flydsl.layout.algebra")
    comp_module = importlib.import_module("flydsl.layout.composition")

    def both(fn, *args):
        outcomes = []
        for patch in (False, True):
            fl.clear_caches()
            try:
                if patch:
                    with (
                        mock.patch.object(comp_module, "_compose_static", lambda *a: None),
                        mock.patch.object(algebra, "_complement_static", lambda *a: None),
                    ):
                        outcomes.append(fn(*args))
                else:
                    outcomes.append(fn(*args))
            except fl.LayoutError as err:
                outcomes.append(type(err))
        assert outcomes[0] == outcomes[1]

    both(fl.composition, a, b)
    both(fl.complement, a, 4 * fl.cosize(a))
