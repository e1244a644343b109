"""Mistakes in kernels raise at the user's line, saying what is wrong: objects that are not kernel values in
conditions and comparisons (which Python would answer at trace time, tracing nothing), `break` under dynamic
control flow, malformed `range(..., init=)` loops (RewriteError with the file and line)."""

from __future__ import annotations

import contextlib

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.ast_rewrite import RewriteError
from flydsl.expr import gpu

from .fakes import FakeGpuTensor

VECTOR = FakeGpuTensor((64,))


def _line_of(kernel, offset: int) -> int:
    """The file line ``offset`` lines below the kernel's decorator."""
    return kernel.__wrapped__.__code__.co_firstlineno + offset


def _raised_at(info) -> int:
    """The file line of the last frame of a raised error's traceback (pytest counts from 0)."""
    return info.traceback[-1].lineno + 1


def test_an_uncalled_lane_id_in_a_condition_raises_at_its_line():
    @flyc.kernel
    def k(x: fx.Tensor):
        lane = gpu.lane_id
        if lane == 0:  # before: always False, so the store was silently dropped
            x[gpu.thread_idx.x] = 1.0

    with pytest.raises(TypeError, match=r"`lane == 0` compares the function flydsl\.expr\.gpu\.lane_id") as info:
        k.lower(VECTOR)
    assert "call it: flydsl.expr.gpu.lane_id(...)" in str(info.value)
    assert _raised_at(info) == _line_of(k, 3)


def test_numbers_compared_with_non_values_raise():
    @flyc.kernel
    def triple(x: fx.Tensor):
        if gpu.thread_idx != 0:  # the triple, not its .x
            x[0] = 1.0

    @flyc.kernel
    def reflected(x: fx.Tensor):
        if 0 == gpu.warp_idx:
            x[0] = 1.0

    with pytest.raises(TypeError, match=r"`gpu\.thread_idx != 0` compares gpu\.thread_idx \(its components are \.x"):
        triple.lower(VECTOR)
    with pytest.raises(TypeError, match=r"`0 == gpu\.warp_idx` compares the function .*warp_idx"):
        reflected.lower(VECTOR)


def test_non_values_as_truth_values_raise():
    @flyc.kernel
    def bare(x: fx.Tensor):
        if gpu.lane_id:  # before: always True
            x[0] = 1.0

    @flyc.kernel
    def negated(x: fx.Tensor):
        x[0] = fx.Float32(2.0) if not gpu.lane_id else fx.Float32(1.0)

    @flyc.kernel
    def joined(x: fx.Tensor, n: fx.Constexpr[int]):
        if n > 2 and gpu.warp_idx:
            x[0] = 1.0

    with pytest.raises(TypeError, match=r"`gpu\.lane_id` is the function .*lane_id .*takes it for True") as info:
        bare.lower(VECTOR)
    assert _raised_at(info) == _line_of(bare, 2)
    with pytest.raises(TypeError, match=r"`gpu\.lane_id` is the function"):
        negated.lower(VECTOR)
    with pytest.raises(TypeError, match=r"`gpu\.warp_idx` is the function"):
        joined.lower(VECTOR, 4)


def test_comparisons_of_trace_time_values_and_kernel_values_still_work():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Constexpr[int], mode: fx.Constexpr[str]):
        lane = gpu.lane_id()
        if n == 4 and mode != "slow" and x.dtype == fx.Float32 and not n == 5:
            if lane == 0:
                x[lane] = 1.0
        if x.dtype != fx.Float32 or n == None:  # noqa: E711 - None compared on purpose: still Python's answer
            x[1] = 2.0

    text = k.trace(k.specialize([VECTOR, 4, "fast"]).key)
    assert text.count("fly.store") == 1 and "arith.cmpi eq" in text


def test_a_name_bound_only_inside_traced_control_flow_says_so_when_compared():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        for i in range(n):
            last = i
        if last == 3:
            x[0] = 1.0

    with pytest.raises(NameError, match="'last' was bound only inside a loop"):
        k.lower(VECTOR, 4)


@flyc.kernel
def _break_in_a_while(x: fx.Tensor, n: fx.Int32):
    i = fx.Int32(0)
    while i < n:  # a loop that returns a value too is left as written: its break cannot be traced
        i = i + 1
        if x[i] > 0.0:
            break
        if x[i] < -1.0:
            return i


@flyc.kernel
def _continue_in_a_loop(x: fx.Tensor):
    for i in range(4):
        with contextlib.nullcontext():  # (an exit inside a `with` is not folded)
            if x[i] > 0.0:
                continue
        x[i] = 1.0


@flyc.kernel
def _return_in_a_loop(x: fx.Tensor):
    for i in fx.range_constexpr(2):
        with contextlib.nullcontext():  # (an exit inside a `with` is not folded)
            if x[i] > 0.0:
                return
        x[i] = 1.0


@pytest.mark.parametrize(
    "kernel, escape, offset",
    [(_break_in_a_while, "break", 3), (_continue_in_a_loop, "continue", 4), (_return_in_a_loop, "return", 4)],
)
def test_escapes_under_dynamic_conditions_say_what_to_do(kernel, escape, offset):
    arguments = [VECTOR, 4][: len(kernel.params)]
    with pytest.raises(TypeError, match=f"`{escape}` under a condition known only when the kernel runs") as info:
        kernel.lower(*arguments)
    assert "done = fx.Boolean(False)" in str(info.value)  # and what to do instead
    assert _raised_at(info) == _line_of(kernel, offset)


def test_rewrite_errors_name_the_file_and_line():
    @flyc.kernel
    def k(x: fx.Tensor):
        acc = fx.Float32(0.0)
        for i, state in range(0, 4, init=[acc]):
            x[i] = state[0]

    with pytest.raises(RewriteError, match="must end with `results = yield") as info:
        k.lower(VECTOR)
    line = _line_of(k, 3)
    assert info.value.filename == __file__ and info.value.lineno == line
    assert str(info.value).startswith(f"{__file__}:{line}: ")
    assert "for i, state in range(0, 4, init=[acc]):" in info.value.text


def _helper_with_a_bad_loop(x):
    for i in range(2, init=[x[0]]):  # not `for iv, state in ...`
        x[i] = 1.0


def test_rewrite_errors_of_helpers_are_not_swallowed():
    @flyc.kernel
    def k(x: fx.Tensor):
        _helper_with_a_bad_loop(x)

    with pytest.raises(RewriteError, match="take `for iv, state in") as info:
        k.lower(VECTOR)
    assert info.value.lineno == _helper_with_a_bad_loop.__code__.co_firstlineno + 1
