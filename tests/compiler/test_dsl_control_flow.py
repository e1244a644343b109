"""Python control flow in kernels: what becomes scf.for / scf.if / scf.while, what stays Python, and the errors."""

from __future__ import annotations

import functools
import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu

from .fakes import FakeGpuTensor

ONE_VECTOR = (("f32", 1, (1,), True),)


def _trace(kernel, *extra_key) -> str:
    return kernel.trace(ONE_VECTOR + tuple(extra_key))


def test_for_over_a_dynamic_range_carries_the_values_it_updates():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        total = fx.Float32(0.0)
        count = fx.Int32(0)
        for i in range(n):
            total = total + x[i]
            count += 1
        x[0] = total / count.to(fx.Float32)

    text = _trace(k, "Int32")
    assert re.search(r"scf.for .* iter_args\(.*, .*\) -> \(f32, i32\)", text)
    assert text.count("scf.yield") == 1


def test_static_range_is_still_a_loop_and_range_constexpr_unrolls():
    @flyc.kernel
    def looped(x: fx.Tensor):
        for i in range(4):
            x[i] = x[i] * 2.0

    @flyc.kernel
    def unrolled(x: fx.Tensor):
        for i in fx.range_constexpr(4):
            x[i] = x[i] * 2.0

    assert "scf.for" in _trace(looped) and _trace(looped).count("fly.store") == 1
    assert "scf.for" not in _trace(unrolled) and _trace(unrolled).count("fly.store") == 4


def test_if_on_a_dynamic_condition_yields_the_values_both_branches_assign():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = gpu.thread_idx.x
        if i < n:
            v = x[i]
        else:
            v = fx.Float32(-1.0)
        x[0] = v

    text = _trace(k, "Int32")
    assert re.search(r"%\S+ = scf.if .* -> \(f32\)", text)
    assert text.count("scf.yield") == 2


def test_if_on_a_python_condition_is_resolved_at_trace_time():
    @flyc.kernel
    def k(x: fx.Tensor, flag: fx.Constexpr[bool]):
        if flag:
            x[0] = fx.Float32(1.0)
        else:
            x[0] = fx.Float32(2.0)

    text = k.trace(ONE_VECTOR + (("constexpr", "bool", True),))
    assert "scf.if" not in text and "1.000000e+00" in text and "2.000000e+00" not in text


def test_elif_chains_nest():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = gpu.thread_idx.x
        y = fx.Float32(0.0)
        if i < n:
            y = fx.Float32(1.0)
        elif i < n * 2:
            y = fx.Float32(2.0)
        x[i] = y

    assert _trace(k, "Int32").count("scf.if") == 2


def test_while_on_a_dynamic_condition():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = fx.Int32(1)
        while i < n:
            i = i * 2
        x[0] = i.to(fx.Float32)

    text = _trace(k, "Int32")
    assert "scf.while" in text and "scf.condition" in text


def test_seed_explicit_loop_with_init_and_yield():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        start, stop, step = fx.Index(0), n.to(fx.Index), fx.Index(1)
        for iv, state in range(start, stop, step, init=[fx.Float32(0.0), fx.Float32(1.0)]):
            s, p = state
            value = x[iv]
            results = yield [s + value, p * value]
        x[0] = results[0] + results[1]

    text = _trace(k, "Int32")
    assert re.search(r"scf.for .* -> \(f32, f32\)", text)


def test_helpers_called_from_kernels_are_inlined():
    def square(v):
        return v * v

    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = square(x[1])

    text = _trace(k)
    assert "func.call" not in text and "arith.mulf" in text


def test_ops_carry_the_users_file_and_line():
    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = x[1] + x[2]

    line = k.fn.__code__.co_firstlineno + 2
    assert re.search(rf'loc\(".*test_dsl_control_flow.py":{line}:0\)', _trace(k))


def test_a_loop_carried_value_keeps_its_type():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        acc = fx.Int32(0)
        for i in range(n):
            acc = x[i]
        x[0] = acc.to(fx.Float32)

    with pytest.raises(TypeError, match="'acc' is a Int32 before the loop but becomes Float32 inside it"):
        _trace(k, "Int32")


def test_a_python_value_rebound_in_a_dynamic_loop_is_refused():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        acc = 0
        for i in range(n):
            acc = acc + x[i]
        x[0] = acc

    with pytest.raises(TypeError, match=r"'acc' holds 0 \(not a FlyDSL value\) before the loop"):
        _trace(k, "Int32")


def test_a_name_bound_only_inside_a_dynamic_loop_says_so_when_used_after():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        for i in range(n):
            last = x[i]
        x[0] = last

    with pytest.raises(NameError, match="'last' was bound only inside a loop traced as MLIR control flow"):
        _trace(k, "Int32")


def test_a_second_loop_reuses_the_local_names_of_the_first():
    """Names bound only inside one dynamic loop (or branch) are that body's locals: a later loop or branch may bind
    them again; reading one there before binding it still says where it came from."""

    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        acc = fx.Float32(0.0)
        for i in range(n):
            v, _ = x[i], 0
            acc = acc + v
        for j in range(n):
            v, _ = x[j] * acc, 1
            x[j] = v
        if gpu.thread_idx.x < n:
            v = x[0]
            x[1] = v

    ir_text = _trace(k, "Int32")
    assert ir_text.count("scf.for") == 2 and "scf.if" in ir_text

    @flyc.kernel
    def reads_first(x: fx.Tensor, n: fx.Int32):
        for i in range(n):
            v = x[i]
        for j in range(n):
            x[j] = v

    with pytest.raises(NameError, match="'v' was bound only inside a loop traced as MLIR control flow"):
        _trace(reads_first, "Int32")


def test_branches_must_agree_on_types():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        if gpu.thread_idx.x < n:
            v = fx.Float32(1.0)
        else:
            v = fx.Int32(1)
        x[0] = v

    with pytest.raises(TypeError, match="'v' is a Float32 after the `if` branch but a Int32 after the `else`"):
        _trace(k, "Int32")


def test_dynamic_conditions_cannot_use_python_boolean_operators():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = gpu.thread_idx.x
        if i < n and i > 0:
            x[i] = x[i]

    with pytest.raises(TypeError, match="cannot be used as a Python bool") as info:
        _trace(k, "Int32")
    assert info.traceback[-1].name == "k"  # the user's frame, not FlyDSL's


class _Clamp:
    def __init__(self, limit):
        self.limit = limit

    def apply(self, v):
        if v > self.limit:  # a method's condition on a kernel value: traced as the kernel's are
            v = self.limit
        return v

    @classmethod
    def unit(cls, v):
        return cls(fx.Float32(1.0)).apply(v)

    @property
    def doubled_if_positive(self):
        if self.limit > 0.0:  # a property runs as it is (no call names it): refused with guidance
            return self.limit * 2.0
        return self.limit


class _Bounded:
    def __init__(self, v, limit):
        if v > limit:  # a constructor's condition on a kernel value: traced too
            v = limit
        self.v = v


class _BoundedTwice(_Bounded):
    def __init__(self, v):
        super().__init__(v, fx.Float32(2.0))
        super().__init__(self.v, fx.Float32(1.0))


class _ClampTwice(_Clamp):
    def apply(self, v):
        for _ in range(2):  # an scf.for: its body a nested function of the rewritten method
            v = super().apply(v)  # zero-argument super() there too
        return v


def _methods_kernel(which: str):
    @flyc.kernel
    def k(x: fx.Tensor):
        if fx.const_expr(which == "method"):
            x[0] = _Clamp(fx.Float32(1.0)).apply(x[1])
        elif fx.const_expr(which == "classmethod"):
            x[0] = _Clamp.unit(x[1])
        elif fx.const_expr(which == "super"):
            x[0] = _ClampTwice(fx.Float32(1.0)).apply(x[1])
        elif fx.const_expr(which == "constructor"):
            x[0] = _Bounded(x[1], fx.Float32(1.0)).v
        elif fx.const_expr(which == "super constructor"):
            x[0] = _BoundedTwice(x[1]).v
        else:
            x[0] = _Clamp(x[1]).doubled_if_positive

    return k


@pytest.mark.parametrize(
    "which, branches", [("method", 1), ("classmethod", 1), ("super", 1), ("constructor", 1), ("super constructor", 2)]
)
def test_methods_and_constructors_called_from_a_kernel_are_traced_like_functions(which, branches):
    text = _trace(_methods_kernel(which))
    assert text.count("scf.if") == branches and text.count("scf.for") == (which == "super"), text
    assert re.search(r'loc\(".*test_dsl_control_flow.py":\d+:0\)', text)


def test_a_property_with_a_dynamic_condition_is_told_to_become_a_method():
    with pytest.raises(TypeError, match="nor in properties or operators .* a method called by name"):
        _trace(_methods_kernel("property"))  # (the same condition in a method: traced, as above)


def test_tracebacks_through_loops_and_branches_show_their_first_line():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        if n > 0:
            for i in range(n):
                x[i] = x[i] + [1.0, 2.0][i]  # a Python list indexed by a kernel value
                x[i] = x[i] * 2.0

    with pytest.raises(TypeError, match="is not a Python int") as info:
        _trace(k, "Int32")
    first = k.__wrapped__.__code__.co_firstlineno  # the decorator's line (pytest's entry lines are 0-based)
    user = [(entry.name, entry.lineno + 1 - first) for entry in info.traceback if str(entry.path) == __file__]
    # Lines after the decorator: k's frame at its `if` (2), the branch's at its `for` (3), the loop body's at the
    # failing statement (4); not at the blocks' last lines.
    assert user[-3:] == [("k", 2), (user[-2][0], 3), (user[-1][0], 4)], user
    assert user[-2][0].startswith("__fly_then") and user[-1][0].startswith("__fly_for")


def test_a_break_that_cannot_be_folded_in_a_dynamic_loop_is_refused_with_guidance():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        for i in range(n):
            if i > 3:
                break
            if x[i] > 0.0:  # (a return of a value in the loop too: left as written)
                return i

    with pytest.raises(TypeError, match=r"`break` in a `for` over a range known only when the kernel runs") as info:
        _trace(k, "Int32")
    assert "fx.range_constexpr" in str(info.value) and "done = fx.Boolean(False)" in str(info.value)
    loop_line = k.__wrapped__.__code__.co_firstlineno + 2
    assert f"line {loop_line}:" in str(info.value) and info.traceback[-1].lineno + 1 == loop_line


def test_a_traced_kernel_gets_its_launch_signature():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        x[0] = x[1]

    module = k.lower(FakeGpuTensor((4,)), 1)
    assert module.kernels == {"k": "pli"}  # x: pointer and extent; n: i32


def _clamp_to(v, limit):
    if v > limit:  # a helper's own condition on a kernel value: traced as scf.if too
        v = limit
    return v


def test_helpers_with_control_flow_are_rewritten_when_called():
    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = _clamp_to(x[1], fx.Float32(1.0))

    text = _trace(k)
    assert "scf.if" in text and re.search(r'loc\(".*test_dsl_control_flow.py":\d+:0\)', text)


UNROLL = 1  # a module constant a helper reads at trace time (tuning scripts set such constants)


def _repeated(x):
    for _ in fx.range_constexpr(UNROLL):
        x = x + fx.Float32(1.0)
    return x


def test_a_rewritten_helper_reads_its_modules_globals_as_they_are_now(monkeypatch):
    """A helper is rewritten once per process; the globals it reads are its module's own, not a copy taken then."""

    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = _repeated(x[1])

    assert _trace(k).count("arith.addf") == 1
    monkeypatch.setitem(globals(), "UNROLL", 3)
    assert _trace(k).count("arith.addf") == 3


class _RunningMax:
    """A value carried by the protocol: two numerics behind one object (like a pipeline state)."""

    def __init__(self, best, where):
        self.best, self.where = best, where

    def __fly_values__(self):
        return [self.best, self.where]

    def __fly_rebuild__(self, values):
        return _RunningMax(*values)


def test_lists_of_values_are_carried_leaf_by_leaf_through_loops_and_branches():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        sums = [fx.Float32(0.0), fx.Float32(0.0), fx.Float32(0.0)]
        for i in range(n):
            sums = [s + x[i] for s in sums]
            sums[1] = sums[1] * 2.0  # in-place updates are carried too
        if n > 4:
            sums = [s * 0.5 for s in sums]
        x[0] = sums[0] + sums[1] + sums[2]

    text = _trace(k, "Int32")
    assert re.search(r"scf.for .* iter_args\(.*, .*, .*\) -> \(f32, f32, f32\)", text)
    assert re.search(r"scf.if .* -> \(f32, f32, f32\)", text)


def test_objects_following_the_carried_value_protocol_are_carried():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        state = _RunningMax(fx.Float32(-1.0), fx.Int32(-1))
        for i in range(n):
            if x[i] > state.best:
                state = _RunningMax(x[i], i.to(fx.Int32))
        x[0] = state.best
        x[1] = state.where.to(fx.Float32)

    text = _trace(k, "Int32")
    assert re.search(r"scf.for .* -> \(f32, i32\)", text)
    assert re.search(r"scf.if .* -> \(f32, i32\)", text)


def test_a_carried_list_keeps_its_length():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        sums = [fx.Float32(0.0), fx.Float32(0.0)]
        for i in range(n):
            sums = [sums[0] + x[i]]
        x[0] = sums[0]

    with pytest.raises(TypeError, match="'sums' holds 2 carried values before the loop"):
        _trace(k, "Int32")


def _apply(function, v):
    return function(v)


def test_a_nested_helper_whose_closure_is_not_yet_filled_is_rewritten_over_its_own_cells():
    @flyc.kernel
    def k(x: fx.Tensor):
        if fx.const_expr(False):
            offset = fx.Float32(1.0)  # bound on no path taken: shifted's cell stays empty

        def shifted(v):
            if fx.const_expr(False):
                return v + offset
            if v > 0.0:  # traced: shifted is rewritten when _apply calls it
                v = v * 2.0
            return v

        x[0] = _apply(shifted, x[1])

    assert _trace(k).count("scf.if") == 1


def _logged(method):
    @functools.wraps(method)
    def wrapper(self, *args):
        return method(self, *args)

    return wrapper


class _Scaled:
    @_logged
    def apply(self, v):  # decorated: the wrapper is rewritten from its own source, the method as it calls it
        if v > 0.0:
            v = v * 2.0
        return v


def test_a_decorated_method_runs_through_its_wrapper():
    @flyc.kernel
    def k(x: fx.Tensor):
        x[0] = _Scaled().apply(x[1])

    assert _trace(k).count("scf.if") == 1


def _margin_text(n):
    text = """a string continued
at the left margin"""  # (the text scan ends the block here: the tokenizer's block is read instead)
    if n > 1:
        return text.upper()
    return text


@functools.lru_cache(
    maxsize=8,
)
def _decorated_over_lines(n):
    return n + 1


def _one_line(n): return n * 2  # fmt: skip  # noqa: E704


@pytest.mark.parametrize("function", [_margin_text, _decorated_over_lines.__wrapped__, _one_line])
def test_a_function_is_read_whole_however_its_lines_are_laid_out(function):
    import ast
    import textwrap

    from mlir import ir

    from flydsl.compiler.ast_rewrite import _source_of, rewrite_function

    scanned, _ = _source_of(function)
    if function is _margin_text:  # the text scan stops inside the string: the tokenizer's block is read instead
        with pytest.raises(SyntaxError):
            ast.parse(textwrap.dedent("".join(scanned)))
    with ir.Context():
        assert [rewrite_function(function)(n) for n in range(4)] == [function(n) for n in range(4)]
