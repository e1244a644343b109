"""Inadmissible input: every public function of flydsl.layout refuses it with a LayoutError, never another exception,
a value, or a hang.

Each case is one kind of bad argument (zero, negative, float, string, bool, None, too deep, too large, mismatched
rank). Run as a script to print the totals by outcome (each case under a 10-second alarm):

    python -m tests.layout.test_refusals
"""

import signal
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flydsl.layout as fl
from flydsl.layout import Layout, LayoutError

from .layout_strategies import int_tuples, layouts

L = Layout((4, 8), (1, 4))
SW = fl.Swizzle(3, 4, 3)


def _deep(n, leaf=2):
    x = leaf
    for _ in range(n):
        x = (x,)
    return x


DEEP = _deep(5000)
DEEP_TEXT = "(" * 5000 + "4" + ")" * 5000
HUGE = Layout((2**40, 2))

# (name, thunk): each thunk must raise LayoutError.
CASES = [
    # construction
    ("Layout zero shape", lambda: Layout(0)),
    ("Layout negative shape", lambda: Layout(-4)),
    ("Layout zero shape leaf", lambda: Layout((4, 0))),
    ("Layout float shape", lambda: Layout(4.0)),
    ("Layout float shape leaf", lambda: Layout((4.0, 8))),
    ("Layout string shape", lambda: Layout("4")),
    ("Layout bool shape", lambda: Layout(True)),
    ("Layout bool shape leaf", lambda: Layout((4, True))),
    ("Layout None shape", lambda: Layout(None)),
    ("Layout None shape leaf", lambda: Layout((4, None))),
    ("Layout float stride", lambda: Layout((4, 8), (1, 4.0))),
    ("Layout string stride", lambda: Layout((4, 8), (1, "a"))),
    ("Layout bool stride", lambda: Layout((4, 8), (1, True))),
    ("Layout None stride", lambda: Layout((4, 8), (1, None))),
    ("Layout mismatched rank", lambda: Layout((4, 8), (1,))),
    ("Layout too deep", lambda: Layout(DEEP)),
    ("Layout too deep stride", lambda: Layout(_deep(5000, 4), _deep(5000, 1))),
    ("make_layout mismatched rank", lambda: fl.make_layout((4, 8), (1, 2, 3))),
    ("make_layout float", lambda: fl.make_layout(4.0)),
    ("make_ordered_layout order out of range", lambda: fl.make_ordered_layout((4, 8), (0, 5))),
    ("make_ordered_layout negative order", lambda: fl.make_ordered_layout((4, 8), (0, -1))),
    ("make_ordered_layout repeated order", lambda: fl.make_ordered_layout((4, 8), (1, 1))),
    ("make_ordered_layout float order", lambda: fl.make_ordered_layout((4, 8), (0.0, 1))),
    ("make_ordered_layout mismatched rank", lambda: fl.make_ordered_layout((4, 8), (0,))),
    ("make_ordered_layout zero shape", lambda: fl.make_ordered_layout((4, 0), (0, 1))),
    ("make_identity_layout zero", lambda: fl.make_identity_layout(0)),
    ("make_identity_layout string leaf", lambda: fl.make_identity_layout((4, "a"))),
    ("make_basis_like float", lambda: fl.make_basis_like(2.5)),
    ("make_basis_like too deep", lambda: fl.make_basis_like(DEEP)),
    ("ScaledBasis float value", lambda: fl.ScaledBasis(2.5, 0)),
    ("ScaledBasis negative mode", lambda: fl.E(-1)),
    ("as_coord string", lambda: fl.as_coord("x")),
    # coordinates
    ("crd2idx mismatched rank", lambda: fl.crd2idx((1, 2), (4,))),
    ("crd2idx float", lambda: fl.crd2idx(1.5, L)),
    ("crd2idx string", lambda: fl.crd2idx("a", L)),
    ("crd2idx bool", lambda: fl.crd2idx(True, L)),
    ("crd2idx negative", lambda: fl.crd2idx(-1, L)),
    ("crd2idx float shape", lambda: fl.crd2idx(1, (4.0, 8))),
    ("crd2idx too deep", lambda: fl.crd2idx(DEEP, DEEP)),
    ("idx2crd zero shape", lambda: fl.idx2crd(3, (0, 8))),
    ("idx2crd float index", lambda: fl.idx2crd(3.0, (4, 8))),
    ("idx2crd negative index", lambda: fl.idx2crd(-1, (4, 8))),
    ("idx2crd mismatched rank", lambda: fl.idx2crd((1, 2), (4,))),
    ("crd2crd zero shape", lambda: fl.crd2crd((1, 2), (4, 8), (8, 0))),
    ("layout call float", lambda: L(1.5)),
    ("layout call mismatched rank", lambda: L(1, 2, 3)),
    ("layout call string", lambda: L("x")),
    # IntTuples
    ("flatten float", lambda: fl.flatten(4.0)),
    ("flatten too deep", lambda: fl.flatten(DEEP)),
    ("product float leaf", lambda: fl.product((4, 2.0))),
    ("product string", lambda: fl.product("ab")),
    ("product too deep", lambda: fl.product(DEEP)),
    ("product_each string leaf", lambda: fl.product_each((4, "a"))),
    ("inner_product mismatched rank", lambda: fl.inner_product((2, 3), (1,))),
    ("inner_product float", lambda: fl.inner_product((2, 3.0), (1, 2))),
    ("prefix_product string", lambda: fl.prefix_product((2, "a"))),
    ("shape_div zero", lambda: fl.shape_div(6, 0)),
    ("shape_div negative", lambda: fl.shape_div(6, -2)),
    ("shape_div float", lambda: fl.shape_div(6.0, 2)),
    ("shape_div mismatched rank", lambda: fl.shape_div((4, 8), (2, 2, 2))),
    ("ceil_div zero", lambda: fl.ceil_div(6, 0)),
    ("ceil_div negative", lambda: fl.ceil_div(6, -1)),
    ("ceil_div string", lambda: fl.ceil_div("6", 2)),
    ("congruent float", lambda: fl.congruent((2.5,), (1,))),
    ("weakly_congruent string", lambda: fl.weakly_congruent(("a",), (1,))),
    ("elem_less float", lambda: fl.elem_less(1.5, 2)),
    ("elem_less mismatched rank", lambda: fl.elem_less((1, 2), 3)),
    ("is_static float", lambda: fl.is_static(4.0)),
    ("rank string", lambda: fl.rank("abc")),
    ("depth float", lambda: fl.depth((4.0,))),
    ("depth too deep", lambda: fl.depth(DEEP)),
    ("size string leaf", lambda: fl.size((4, "a"))),
    ("known_divisor float", lambda: fl.known_divisor(4.0)),
    ("leaf_max float", lambda: fl.leaf_max(1.5, 2)),
    ("leaf_min string", lambda: fl.leaf_min("a", 1)),
    # structure
    ("cosize mode out of range", lambda: fl.cosize(L, mode=[5])),
    ("get out of range", lambda: fl.get(L, 5)),
    ("get float mode", lambda: fl.get(L, 1.5)),
    ("get string mode", lambda: fl.get(L, "a")),
    ("select out of range", lambda: fl.select(L, 3)),
    ("take end past rank", lambda: fl.take(L, 0, 3)),
    ("take begin after end", lambda: fl.take(L, 2, 1)),
    ("take float", lambda: fl.take(L, 0.5, 1)),
    ("group end past rank", lambda: fl.group(L, 1, 5)),
    ("group begin after end", lambda: fl.group(L, 2, 1)),
    ("append negative rank", lambda: fl.append(L, Layout(2, 1), up_to_rank=-1)),
    ("append float leaf", lambda: fl.append((4, 8), 2.5)),
    ("prepend string", lambda: fl.prepend(L, "x")),
    ("slice_ coordinate out of range", lambda: fl.slice_((None, 9), L)),
    ("slice_ negative coordinate", lambda: fl.slice_((None, -1), L)),
    ("slice_ float coordinate", lambda: fl.slice_((None, 1.5), L)),
    ("slice_ mismatched rank", lambda: fl.slice_((None, 1, 2), L)),
    ("dice coordinate out of range", lambda: fl.dice((None, 9), L)),
    ("slice_and_offset coordinate out of range", lambda: fl.slice_and_offset((None, 9), L)),
    # algebra
    ("coalesce profile too long", lambda: fl.coalesce(L, (0, 0, 0))),
    ("coalesce float", lambda: fl.coalesce(4.0)),
    ("filter string", lambda: fl.filter("x")),
    ("filter_zeros float", lambda: fl.filter_zeros(2.5)),
    ("composition string", lambda: fl.composition(L, "abc")),
    ("composition float", lambda: fl.composition(L, 2.5)),
    ("composition zero", lambda: fl.composition(L, 0)),
    ("composition negative", lambda: fl.composition(L, -4)),
    ("composition bool", lambda: fl.composition(L, True)),
    ("composition tiler too long", lambda: fl.composition(L, (4, 8, 2))),
    ("composition string layout", lambda: fl.composition("abc", L)),
    ("complement zero", lambda: fl.complement(L, 0)),
    ("complement negative", lambda: fl.complement(L, -5)),
    ("complement float", lambda: fl.complement(L, 2.5)),
    ("complement string", lambda: fl.complement(L, "x")),
    ("right_inverse float", lambda: fl.right_inverse(4.0)),
    ("left_inverse string", lambda: fl.left_inverse("x")),
    ("nullspace string", lambda: fl.nullspace("x")),
    ("max_common_layout string", lambda: fl.max_common_layout(L, "x")),
    ("max_common_vector float", lambda: fl.max_common_vector(L, 2.5)),
    ("upcast zero", lambda: fl.upcast(L, 0)),
    ("upcast negative", lambda: fl.upcast(L, -2)),
    ("upcast float", lambda: fl.upcast(L, 2.0)),
    ("downcast zero", lambda: fl.downcast(L, 0)),
    ("downcast bool", lambda: fl.downcast(L, True)),
    ("recast_layout zero new bits", lambda: fl.recast_layout(0, 16, L)),
    ("recast_layout zero old bits", lambda: fl.recast_layout(16, 0, L)),
    ("recast_layout negative bits", lambda: fl.recast_layout(-8, 16, L)),
    ("recast_layout float bits", lambda: fl.recast_layout(16.0, 8, L)),
    # divides and products
    ("logical_divide zero", lambda: fl.logical_divide(L, 0)),
    ("logical_divide tiler too long", lambda: fl.logical_divide(L, (4, 8, 2))),
    ("logical_divide float", lambda: fl.logical_divide(L, 2.5)),
    ("logical_divide zero tiler mode", lambda: fl.logical_divide(L, (0, 4))),
    ("zipped_divide string", lambda: fl.zipped_divide(L, "ab")),
    ("tiled_divide negative", lambda: fl.tiled_divide(L, -2)),
    ("flat_divide float tiler mode", lambda: fl.flat_divide(L, (4.0, 2))),
    ("logical_product zero", lambda: fl.logical_product(L, 0)),
    ("zipped_product zero tiler mode", lambda: fl.zipped_product(L, (2, 0))),
    ("tiled_product float", lambda: fl.tiled_product(L, 2.5)),
    ("flat_product string", lambda: fl.flat_product(L, "x")),
    ("blocked_product float", lambda: fl.blocked_product(L, 3.0)),
    ("raked_product negative", lambda: fl.raked_product(L, -1)),
    ("tile_to_shape zero target", lambda: fl.tile_to_shape(L, (0, 8))),
    ("tile_to_shape float target", lambda: fl.tile_to_shape(L, (32, 8.0))),
    ("tile_to_shape mismatched rank", lambda: fl.tile_to_shape(L, (32,))),
    ("tile_to_shape order out of range", lambda: fl.tile_to_shape(L, (32, 8), (0, 5))),
    ("tile_to_shape not dividing", lambda: fl.tile_to_shape(L, (6, 8))),
    # swizzles, TV layouts
    ("Swizzle negative bits", lambda: fl.Swizzle(-1, 4, 3)),
    ("Swizzle negative base", lambda: fl.Swizzle(3, -1, 3)),
    ("Swizzle shift below bits", lambda: fl.Swizzle(3, 4, 2)),
    ("Swizzle float bits", lambda: fl.Swizzle(3.0, 4, 3)),
    ("Swizzle string bits", lambda: fl.Swizzle("3", 4, 3)),
    ("Swizzle bool bits", lambda: fl.make_swizzle(True, 4, 3)),
    ("Swizzle too large", lambda: fl.Swizzle(2**40, 0, 2**40)),
    ("ComposedLayout string inner", lambda: fl.make_composed_layout(SW, 0, "x")),
    ("ComposedLayout float offset", lambda: fl.make_composed_layout(SW, 2.5, L)),
    ("ComposedLayout outer not callable", lambda: fl.make_composed_layout(5, 0, L)),
    ("make_layout_tv string values", lambda: fl.make_layout_tv(Layout((4, 2)), "x")),
    ("make_layout_tv float values", lambda: fl.make_layout_tv(Layout((4, 2)), 2.5)),
    ("make_layout_tv zero threads", lambda: fl.make_layout_tv(0, Layout(2))),
    # text and pictures
    ("parse_layout unbalanced", lambda: fl.parse_layout("(4,8):(1,4")),
    ("parse_layout too deep", lambda: fl.parse_layout(DEEP_TEXT)),
    ("parse_layout zero shape", lambda: fl.parse_layout("(4,0):(1,4)")),
    ("parse_layout mismatched rank", lambda: fl.parse_layout("(4,8):(1,2,3)")),
    ("parse_layout not text", lambda: fl.parse_layout(4)),
    ("parse_layout garbage", lambda: fl.parse_layout("abc")),
    ("parse_int_tuple None", lambda: fl.parse_int_tuple(None)),
    ("parse_int_tuple too deep", lambda: fl.parse_int_tuple(DEEP_TEXT)),
    ("layout_table too large", lambda: fl.layout_table(HUGE)),
    ("layout_table rank 3", lambda: fl.layout_table(Layout((4, 8, 2)))),
    ("layout_table string", lambda: fl.layout_table("x")),
    ("draw too large", lambda: fl.draw(HUGE)),
    ("draw zero cell", lambda: fl.draw(L, cell=0)),
    ("draw float cell", lambda: fl.draw(L, cell=2.5)),
    ("draw zero element_bytes", lambda: fl.draw(L, element_bytes=0)),
    ("print_layout too large", lambda: fl.print_layout(HUGE)),
]


@pytest.mark.parametrize("name, thunk", CASES, ids=[c[0] for c in CASES])
def test_refused_with_layout_error(name, thunk):
    with pytest.raises(LayoutError):
        thunk()


def test_case_names_unique():
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "thunk, words",
    [
        (lambda: Layout((4.0, 8)), ["Layout", "shape", "4.0", "int"]),
        (lambda: fl.complement(L, 0), ["complement", "cotarget", "positive"]),
        (lambda: fl.upcast(L, 0), ["upcast", "n", "positive"]),
        (lambda: Layout(DEEP), ["Layout", "shape", "depth", "64"]),
        (lambda: fl.parse_layout(DEEP_TEXT), ["parse", "depth", "64"]),
        (lambda: fl.slice_((None, 9), L), ["slice_", "coordinate", "9", "8"]),
        (lambda: fl.layout_table(HUGE), ["layout_table", "cells", "16384"]),
    ],
)
def test_message_names_function_argument_and_expectation(thunk, words):
    with pytest.raises(LayoutError) as err:
        thunk()
    for word in words:
        assert word in str(err.value)


def test_tile_to_shape_leaf_shape_block():
    # A rank-1 block with a leaf shape and a one-mode target (was: TypeError 'int' object is not iterable).
    tiled = fl.tile_to_shape(Layout(4, 1), (32,))
    assert fl.size(tiled) == 32 and fl.rank(tiled) == 1
    assert [tiled(i) for i in range(32)] == [fl.tile_to_shape(Layout((4,), (1,)), (32,))(i) for i in range(32)]
    assert [tiled(i) for i in range(32)] == list(range(32))


def test_limits_admit_what_they_name():
    # Depth 64 and a 16384-cell table are still accepted; one more level or cell is not.
    assert fl.depth(Layout(_deep(64))) == 64
    assert fl.parse_layout("(" * 64 + "4" + ")" * 64) == Layout(_deep(64, 4))
    assert fl.layout_table(Layout((128, 128))).count("|") == 128 * 129
    with pytest.raises(LayoutError):
        fl.depth(Layout(_deep(65)))
    with pytest.raises(LayoutError):
        fl.parse_layout("(" * 65 + "4" + ")" * 65)
    with pytest.raises(LayoutError):
        fl.layout_table(Layout((16385,)))
    assert fl.Swizzle(20, 20, 22).bits == 20  # reaches bit 62, the Fly dialect's limit
    with pytest.raises(LayoutError):
        fl.Swizzle(20, 20, 23)


_BAD_LEAVES = st.sampled_from([0.0, 2.5, "4", b"4", True, False, 1j, {4}, {}, object()])


@given(layouts())
def test_valid_layouts_are_admitted(layout):
    # Every layout the strategies build survives reconstruction and the basic maps.
    again = Layout(layout.shape, layout.stride)
    assert again == layout
    assert [again(i) for i in range(fl.size(again))] == [layout(i) for i in range(fl.size(layout))]
    fl.coalesce(again)
    fl.filter(again)


@given(int_tuples(), st.data())
def test_bad_leaf_anywhere_is_refused(shape, data):
    # Replace one leaf of a valid shape by a non-integer: the shape, as a layout's shape or stride, is refused.
    flat = list(fl.flatten(shape)) if fl.is_tuple(shape) else [shape]
    k = data.draw(st.integers(0, len(flat) - 1))
    flat[k] = data.draw(_BAD_LEAVES)
    bad = fl.int_tuple.unflatten(flat, shape) if fl.is_tuple(shape) else flat[0]
    with pytest.raises(LayoutError):
        Layout(bad)
    with pytest.raises(LayoutError):
        Layout(shape, bad)
    with pytest.raises(LayoutError):
        fl.product(bad)


def _probe():
    # Totals by outcome: refused (LayoutError), returned a value, raised another exception, or ran past 10 s.
    def alarm(signum, frame):
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    totals = {"LayoutError": [], "returned": [], "other": [], "timeout": []}
    for name, thunk in CASES:
        signal.alarm(10)
        try:
            thunk()
            totals["returned"].append(name)
        except LayoutError:
            totals["LayoutError"].append(name)
        except TimeoutError:
            totals["timeout"].append(name)
        except Exception as e:  # noqa: BLE001 - the probe counts every other exception
            totals["other"].append(f"{name}: {type(e).__name__}")
        finally:
            signal.alarm(0)
    for outcome, names in totals.items():
        print(f"{outcome}: {len(names)}")
        for n in names if outcome != "LayoutError" else ():
            print(f"    {n}")
    print(f"total: {len(CASES)}")
    return 0 if len(totals["LayoutError"]) == len(CASES) else 1


if __name__ == "__main__":
    sys.exit(_probe())
