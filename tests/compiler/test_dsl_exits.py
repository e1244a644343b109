"""Early exits in kernels and their helpers (flydsl.compiler.ast_escapes): a return that ends a branch, a continue and
a break under dynamic conditions fold into branches and flags; the folded code runs as Python ran the original on
trace-time values. What stays refused: test_dsl_user_errors.py."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

from .test_dsl_control_flow import _trace


def test_an_early_return_under_a_dynamic_condition_guards_the_rest_of_the_kernel():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = gpu.thread_idx.x
        if i >= n:  # the bounds guard: the rest becomes the else of an scf.if
            return
        x[i] = x[i] * 2.0

    text = _trace(k, "Int32")
    assert text.count("scf.if") == 1 and text.index("} else {") < text.index("fly.store"), text


def _sign(v):
    if v > 0.0:
        return fx.Float32(1.0)
    if v < 0.0:
        return fx.Float32(-1.0)
    return fx.Float32(0.0)


def test_returns_of_values_on_every_path_become_the_results_of_nested_branches():
    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = _sign(x[1])

    text = _trace(k)
    assert text.count("scf.if") == 2 and len(re.findall(r"scf.if .* -> \(f32\)", text)) == 2, text


def test_a_continue_in_a_loop_that_stays_python_guards_the_rest_of_its_body():
    @flyc.kernel
    def k(x: fx.Tensor):
        for i in fx.range_constexpr(3):
            if x[i] > 0.0:
                continue
            x[i] = 1.0

    text = _trace(k)
    assert text.count("scf.if") == 3 and "scf.for" not in text, text


def _python_exits(a: int, b: int):
    for i in [1, 2, 3]:
        if i == a:
            continue
        if i == b:
            return -i
    if a > b:
        if a > 2 * b:
            return a
        return b
    elif a == b:
        return None
    return a + b


def _python_tails(a: int, b: int):
    if a > b:
        if a > 2 * b:
            return a, 1
        a = a - b
    else:
        return b, 2
    if a == 1:
        return a, 3
    return a + b, 4


def test_folded_exits_run_as_python_would_on_trace_time_values():
    from mlir import ir

    from flydsl.compiler.ast_rewrite import rewrite_function

    with ir.Context():  # (each statement runs at its MLIR location)
        for function in (_python_exits, _python_tails):
            folded = rewrite_function(function)
            for a in range(-2, 6):
                for b in range(-2, 6):
                    assert folded(a, b) == function(a, b), (function.__name__, a, b)


def _breaking_kernel(which: str):
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        if fx.const_expr(which == "dynamic range"):
            for i in range(n):
                if x[i] > 0.0:
                    break
                x[i] = 1.0
        elif fx.const_expr(which == "while"):
            i = fx.Int32(0)
            while i < n:
                if x[i] > 0.0:  # the condition reads x[i]: not evaluated again once broken (an scf.if)
                    break
                i = i + 1
            x[0] = i.to(fx.Float32)
        elif fx.const_expr(which == "continue"):
            for i in range(n):  # no break: an scf.while all the same (a range loop with exits is one while)
                if x[i] > 0.0:
                    continue
                x[i] = 1.0
        elif fx.const_expr(which == "static range"):
            for i in range(4):  # Python until the break is dynamic, an scf.while from there
                if x[i] > 0.0:
                    break
                x[i] = 1.0
        else:
            for i in fx.range_constexpr(3):  # unrolled: the iterations after a dynamic break under scf.if
                if x[i] > 0.0:
                    break
                if x[i] < -1.0:
                    continue
                x[i] = 1.0

    return k


@pytest.mark.parametrize(
    "which, whiles, ifs",
    [("dynamic range", 1, 2), ("continue", 1, 1), ("while", 1, 2), ("static range", 1, 4), ("constexpr range", 0, 8)],
)
def test_loop_exits_under_dynamic_conditions_are_folded(which, whiles, ifs):
    text = _trace(_breaking_kernel(which), "Int32")
    assert _loops_and_branches(text) == (whiles, ifs, 0), text


def _loops_and_branches(text: str) -> tuple[int, int, int]:
    """The traced text's scf.while, scf.if and scf.for ops."""
    return text.count("scf.while"), text.count("scf.if"), text.count("scf.for")


def test_a_bool_a_dynamic_branch_sets_becomes_a_boolean():
    @flyc.kernel
    def k(x: fx.Tensor):
        found = False
        if x[0] > 0.0:
            found = True
        if found:
            x[1] = 2.0

    text = _trace(k)
    assert text.count("scf.if") == 2 and re.search(r"scf.if .* -> \(i1\)", text), text


def _python_breaks(n: int, m: int):
    seen = []
    for i in range(1, n, 2):
        if i == m:
            break
        if i == 3:
            continue
        seen.append(i)
    j = 0
    while j < n:
        j += 1
        if j * j > m:
            break
    for k in [5, 4, 3, 2]:
        if k == m:
            continue
        if k < n:
            break
        seen.append(-k)
    for c in range(n):
        if c % 3 == m % 3:
            continue
        seen.append(10 * c)
    while j < 2 * n:
        j += 1
        if j % 2:
            continue
        seen.append(j)
    for a in range(n, 0, -1):
        for b in range(a):
            if b == m:
                break
        else:
            seen.append(100 + a)
        if a == m:
            break
    return seen, i if n > 1 else None, j, k, a if n > 0 else None


def test_folded_breaks_run_as_python_would_on_trace_time_values():
    from mlir import ir

    from flydsl.compiler.ast_rewrite import rewrite_function

    folded = rewrite_function(_python_breaks)
    with ir.Context():
        for n in range(0, 8):
            for m in range(-1, 8):
                assert folded(n, m) == _python_breaks(n, m), (n, m)


def _stepped(step):
    for i in range(0, 4, step):
        if i == 2:
            break
    return i


def test_a_folded_range_checks_its_bounds_as_range_does():
    from mlir import ir

    from flydsl.compiler.ast_rewrite import rewrite_function

    folded = rewrite_function(_stepped)
    with ir.Context():
        assert folded(1) == _stepped(1) == 2 and folded(3) == _stepped(3) == 3
        with pytest.raises(ValueError, match="must not be zero"):
            folded(0)
        with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
            folded(0.5)


def _python_loop_returns(n: int, m: int, seen: list):
    """Bare returns in loops (nested, while, continues and breaks beside them): Python's answers are the reference."""
    for i in range(n):
        for j in range(i):
            if j == m:
                seen.append(("inner", i, j))
                return
            if j == 1:
                continue
            seen.append(j)
        if i * i > 3 * m + 1:
            break
    k = 0
    while k < n:
        k += 1
        if k == m + 2:
            return
        seen.append(-k)
    for c in [3, 2, 1]:
        if c == m:
            return
    seen.append("end")


class _Context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _python_nest_left_as_written(n: int, m: int, seen: list):
    """A return in a ``with`` keeps its loop nest as written, the inner loop's return included."""
    for i in range(n):
        for j in range(i):
            if j == m:
                return
            seen.append(j)
        with _Context():
            if i == m + 3:
                return
        seen.append(-i)
    seen.append("end")


@pytest.mark.parametrize("function", [_python_loop_returns, _python_nest_left_as_written])
def test_returns_in_loops_run_as_python_would_on_trace_time_values(function):
    from mlir import ir

    from flydsl.compiler.ast_rewrite import rewrite_function

    folded = rewrite_function(function)
    with ir.Context():
        for n in range(0, 7):
            for m in range(-1, 6):
                ours, theirs = [], []
                assert folded(n, m, ours) is None and function(n, m, theirs) is None
                assert ours == theirs, (n, m)


def test_a_return_in_a_loop_under_a_dynamic_condition_becomes_a_break_and_a_guard():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        for i in range(n):
            for j in fx.range_constexpr(2):
                if x[i * 2 + j] < 0.0:  # the kernel ends here: both loops stop, the store after them is skipped
                    return
                x[i * 2 + j] = 1.0
        x[0] = 3.0

    text = _trace(k, "Int32")
    # one scf.while (the dynamic range), its two unrolled inner bodies under their scf.ifs, the guard after the loop
    assert text.count("scf.while") == 1 and "scf.for" not in text, text
    last_store = text.rindex("fly.store")
    assert text.rindex("scf.if") < last_store and text.rindex("} else {") < last_store, text


def _else_kernel(which: str):
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        if fx.const_expr(which == "dynamic range"):
            for i in range(n):
                if x[i] > 0.0:
                    break
                x[i] = 1.0
            else:  # runs unless the break did: a flag the break clears, carried by the scf.while
                x[0] = 2.0
        elif fx.const_expr(which == "while"):
            i = fx.Int32(0)
            while i < n:
                if x[i] > 0.0:
                    break
                i = i + 1
            else:
                x[0] = 3.0
        elif fx.const_expr(which == "constexpr range"):
            for i in fx.range_constexpr(3):
                if x[i] > 0.0:
                    break
                x[i] = 1.0
            else:
                x[0] = 2.0
        elif fx.const_expr(which == "return"):
            for i in fx.range_constexpr(2):
                if x[i] > 0.0:
                    return
                x[i] = 1.0
            else:
                x[0] = 2.0
            x[1] = 5.0
        else:  # nested: the inner else runs per outer iteration, the outer one once
            for a in range(n):
                for b in range(n):
                    if x[b] > x[a]:
                        break
                else:
                    x[a] = 0.0
                if x[a] < -5.0:
                    break
            else:
                x[0] = 1.0

    return k


@pytest.mark.parametrize(
    "which, whiles, ifs",
    [("dynamic range", 1, 3), ("while", 1, 3), ("constexpr range", 0, 6), ("return", 0, 4), ("nested", 2, 6)],
)
def test_loops_with_an_else_fold_their_breaks_into_a_flag(which, whiles, ifs):
    text = _trace(_else_kernel(which), "Int32")
    assert _loops_and_branches(text) == (whiles, ifs, 0), text
    assert text.rindex("fly.store") > text.rindex("scf.if"), text  # the else's store, under the flag's scf.if


def _python_else(n: int, m: int):
    seen = []
    for a in range(n):
        for b in range(a):
            if b == m:
                break
        else:  # an inner else whose own break leaves the outer loop
            seen.append(100 + a)
            if a == m + 1:
                break
        if a == 2 * m:
            break
    else:
        seen.append(-1)
    j = 0
    while j < n:
        j += 1
        if j == m:
            break
    else:
        seen.append(-2)
    for c in [1, 2]:  # no break: the else always runs
        seen.append(c)
    else:
        seen.append(-3)
    for d in range(n):
        if d == m:
            return seen, d  # a return in a loop with an else
    else:
        seen.append(-4)
    return seen, None


def test_loops_with_an_else_run_as_python_would_on_trace_time_values():
    from mlir import ir

    from flydsl.compiler.ast_rewrite import rewrite_function

    with ir.Context():
        folded = rewrite_function(_python_else)
        for n in range(-1, 7):
            for m in range(-1, 7):
                assert folded(n, m) == _python_else(n, m), (n, m)
