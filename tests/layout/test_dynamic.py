"""The algebra on dynamic leaves: a symbolic integer that records expressions and never becomes an int.

Every symbolic result is checked by substituting values and comparing with the static computation.
"""

import pytest

import flydsl.layout as fl
from flydsl.layout import Layout

from .layout_symbolic import Sym, ev

ENVS = [{"M": 256, "N": 128, "i": 5, "j": 3, "bx": 1, "by": 0}, {"M": 384, "N": 192, "i": 77, "j": 9, "bx": 2, "by": 2}]


def matrix():
    M, N = Sym("M", divisibility=128), Sym("N", divisibility=64)
    return M, N, Layout((M, N), (1, M))


def static(env):
    return Layout((env["M"], env["N"]), (1, env["M"]))


def test_symbol_never_becomes_an_int():
    M = Sym("M")
    for convert in (bool, int, lambda x: [0][x], lambda x: max(x, 1)):
        with pytest.raises(TypeError):
            convert(M)


def test_coordinates_size_cosize():
    M, N, L = matrix()
    i, j = Sym("i"), Sym("j")
    for env in ENVS:
        S = static(env)
        assert ev(fl.size(L), env) == fl.size(S) and ev(fl.cosize(L), env) == fl.cosize(S)
        assert ev(L(i, j), env) == S(env["i"], env["j"]) and ev(fl.crd2idx((i, 2), L), env) == S(env["i"], 2)
        assert ev(fl.idx2crd(i * 7 + j, L), env) == fl.idx2crd(env["i"] * 7 + env["j"], S)
        assert ev(fl.idx2crd(i, (M, N)), env) == fl.idx2crd(env["i"], (env["M"], env["N"]))
        assert ev(L(i), env) == S(env["i"])
    assert repr(L) == "(?,?):(1,?)" and fl.rank(L) == 2 and not fl.is_static(L) and fl.is_static(Layout((2, 3)))
    assert fl.product_each(((M, 2), N))[0].divisibility == 256


def test_seed_idx2crd_with_a_dynamic_thread_index():
    tid = Sym("tid")
    wave, lane = fl.idx2crd(tid, fl.make_layout((4, 64), (64, 1)))
    for t in (0, 63, 64, 200, 255):
        assert (ev(wave, {"tid": t}), ev(lane, {"tid": t})) == (t // 64, t % 64)


def test_local_tile_style_divides():
    M, N, L = matrix()
    bx, by = Sym("bx"), Sym("by")
    zipped = fl.zipped_divide(L, (128, 64))
    tile = zipped((None, None), (bx, by))  # local_tile: tile (bx, by) of the matrix
    for env in ENVS:
        S = static(env)
        assert ev(fl.logical_divide(L, (128, 64)), env) == fl.logical_divide(S, (128, 64))
        assert ev(zipped, env) == fl.zipped_divide(S, (128, 64))
        assert ev(fl.tiled_divide(L, (128, 64)), env) == fl.tiled_divide(S, (128, 64))
        assert ev(fl.flat_divide(L, (128, 64)), env) == fl.flat_divide(S, (128, 64))
        expect, offset = fl.slice_and_offset(((None, None), (env["bx"], env["by"])), fl.zipped_divide(S, (128, 64)))
        assert ev(tile, env) == expect
        assert ev(fl.slice_and_offset(((None, None), (bx, by)), zipped)[1], env) == offset
        assert ev(fl.composition(L, (Layout(32, 2), None)), env) == fl.composition(S, (Layout(32, 2), None))
        assert ev(fl.coalesce(L), env) == fl.coalesce(S)
        assert ev(fl.logical_divide(L, Layout(128)), env) == fl.logical_divide(S, Layout(128))
    assert repr(fl.coalesce(L)) == "?:1"


def test_divisibility_proves_what_static_values_would():
    M, N, _ = matrix()
    row_major = Layout((M, 8), (8, 1))
    # M is a multiple of 128, so a 16-element tile stays inside mode 0.
    R = fl.composition(row_major, Layout(16, 1))
    assert repr(R) == "16:8"
    # Vector width: a column-major (M,N) tile is contiguous in runs of at least divisibility(M) = 128.
    A = Layout((M, N), (1, M))
    assert fl.max_common_vector(A, A) == 128 * 64
    B = Layout((M, N), (N, 1))
    assert fl.max_common_vector(B, B) == 64
    tiled = fl.tile_to_shape(Layout((8, 64), (64, 1)), (M, 64))  # 8 divides M: provable from its divisibility
    for env in ENVS:
        assert ev(tiled, env) == fl.tile_to_shape(Layout((8, 64), (64, 1)), (env["M"], 64))


def test_swizzle_on_a_dynamic_offset():
    sw = fl.Swizzle(3, 4, 3)
    C = fl.make_composed_layout(sw, 0, Layout((8, 64), (64, 1)))
    i = Sym("i")
    value = C(i, 3)
    for k in range(8):
        assert ev(value, {"i": k}) == C(k, 3)


def test_operations_that_need_static_values_say_so():
    M, N = Sym("M"), Sym("N")
    with pytest.raises(
        fl.LayoutError,
        match=r"composition: cannot decide shape divisibility: .* crosses mode 0 \(M:8\) .* dynamic leaf M",
    ):
        fl.composition(Layout((M, 8), (8, 1)), Layout(16, 1))
    with pytest.raises(fl.LayoutError, match=r"complement: needs a static stride, got dynamic leaf N"):
        fl.complement(Layout((4, 8), (N, 1)))
    with pytest.raises(fl.LayoutError, match=r"elem_less: needs a static value, got dynamic leaf M"):
        fl.elem_less((M, 2), (4, 4))
    with pytest.raises(fl.LayoutError, match=r"tile_to_shape: cannot decide that block mode 8 divides target mode M"):
        fl.tile_to_shape(Layout((8, 64), (64, 1)), (M, 64))
    with pytest.raises(fl.LayoutError, match="draw: needs a static layout"):
        fl.draw(Layout((M, 4)))
    with pytest.raises(fl.LayoutError, match=r"make_ordered_layout: needs a static order"):
        fl.make_ordered_layout((4, 4), (M, 1))
    with pytest.raises(fl.LayoutError, match=r"composition: cannot decide that modes of B do not carry"):
        fl.composition(Layout((Sym("K", divisibility=4), 4), (1, 1000)), Layout((4, 2), (1, 2)))
    with pytest.raises(fl.LayoutError, match=r"upcast: cannot decide that 2 divides the stride"):
        fl.recast_layout(32, 16, Layout((4, 4), (M, 1)))
