"""Hypothesis strategies for nested, non-compact layouts with stride-0 and size-1 modes."""

from hypothesis import strategies as st

from flydsl.layout import Layout, size
from flydsl.layout.int_tuple import leaves, unflatten

shape_leaf = st.sampled_from([1, 1, 2, 2, 2, 3, 4, 4, 6, 8])
stride_leaf = st.sampled_from([0, 1, 1, 2, 3, 4, 6, 8, 12, 16, 32])


def int_tuples(leaf=shape_leaf, max_leaves=4):
    """Nested tuples of leaves (depth up to 3), or a single leaf."""
    return st.recursive(leaf, lambda kids: st.lists(kids, min_size=1, max_size=3).map(tuple), max_leaves=max_leaves)


@st.composite
def layouts(draw, max_leaves=4, max_size=256, strides=stride_leaf):
    """Any layout: nested shape, arbitrary non-negative strides (stride 0, size-1 modes, gaps, overlaps)."""
    shape = draw(int_tuples(max_leaves=max_leaves).filter(lambda s: size(s) <= max_size))
    stride = unflatten([draw(strides) for _ in leaves(shape)], shape)
    return Layout(shape, stride)


@st.composite
def compact_layouts(draw, max_leaves=4, max_size=256):
    """Bijective layouts onto [0, size): a nested shape with compact strides in a random order."""
    from flydsl.layout import make_ordered_layout

    shape = draw(int_tuples(max_leaves=max_leaves).filter(lambda s: size(s) <= max_size))
    n = len(leaves(shape))
    order = draw(st.permutations(range(n)))
    return make_ordered_layout(shape, unflatten(order, shape))


@st.composite
def injective_layouts(draw, max_leaves=4):
    """Injective layouts whose modes nest by divisibility, with gaps: a compact layout with every stride scaled."""
    base = draw(compact_layouts(max_leaves=max_leaves))
    shapes, strides = leaves(base.shape), leaves(base.stride)
    k = draw(st.sampled_from([1, 1, 2, 3]))
    gap = draw(st.sampled_from([1, 2]))
    # Scale strides by k, then widen the largest mode's stride by gap: still injective and divisible.
    top = max(range(len(strides)), key=lambda i: strides[i])
    new = [d * k * (gap if i == top else 1) for i, d in enumerate(strides)]
    return Layout(base.shape, unflatten(new, base.shape)) if len(shapes) else base


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]
