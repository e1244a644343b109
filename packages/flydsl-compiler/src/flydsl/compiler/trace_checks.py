"""Checks the rewritten kernel code makes where Python would answer without looking at kernel values (see
:mod:`ast_rewrite`): a number compared with a function is False, a function as a condition is True, so an uncalled
``gpu.lane_id`` would silently trace nothing; and statements that stay Python because their body holds ``break``,
``continue`` or ``return`` need a range or condition known at trace time. Each raises at the user's line, saying
what to do (the rewritten code calls them as ``__fly_cf.equal(...)``..., re-exported by :mod:`control_flow`).
"""

from __future__ import annotations

import functools
import types

from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Numeric

ir = lazy_import("mlir.ir")

__all__ = ["equal", "not_equal", "truth", "trace_time_range", "trace_time_condition"]

_NOT_VALUES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, functools.partial)


def _not_a_value(value) -> str | None:
    """How to name ``value`` in an error if it is no kernel value at all (a function, method or module), else None."""
    fail = getattr(type(value), "__fly_fail__", None)
    if fail is not None:
        fail(value)  # a name bound only inside earlier traced control flow says so
    if isinstance(value, _NOT_VALUES):
        kind = "module" if isinstance(value, types.ModuleType) else "function"
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)
        module = getattr(value, "__module__", None)
        full = f"{module}.{name}" if module and kind == "function" else name
        hint = f" (call it: {full}(...))" if kind == "function" else ""
        return f"the {kind} {full}{hint}"
    return None


def _number_like(value) -> bool:
    return isinstance(value, (int, float, Numeric, ir.Value))


def _compared_by_identity(a, b) -> str | None:
    """The name of the operand that makes ``a == b`` Python's identity fallback between a number and an object that
    is not one (always False: nothing of the kernel is compared), else None."""
    for number, other in ((a, b), (b, a)):
        if not _number_like(number) or _number_like(other) or other is None:
            continue
        named = _not_a_value(other)
        if named is not None:
            return named
        if type(other).__eq__ is object.__eq__:
            return f"{other!r} (a {type(other).__name__}, which has no numeric value)"
    return None


def _refuse_comparison(a, b, text: str, result: bool) -> None:
    for operand in (a, b):
        _not_a_value(operand)  # a scoped name raises its own error
    named = _compared_by_identity(a, b)
    if named is not None:
        raise TypeError(
            f"`{text}` compares {named} with a number: it is not a kernel value, so Python answers {result} at trace"
            " time and the kernel never compares anything"
        )


def equal(a, b, text: str):
    """``a == b`` in a kernel: as Python, but a number compared with a function or another non-value raises."""
    result = a == b
    if isinstance(result, bool):
        _refuse_comparison(a, b, text, result)
    return result


def not_equal(a, b, text: str):
    """``a != b`` in a kernel (see :func:`equal`)."""
    result = a != b
    if isinstance(result, bool):
        _refuse_comparison(a, b, text, result)
    return result


def truth(value, text: str):
    """A condition, or an operand of ``and`` / ``or`` / ``not``, in a kernel: passed through, unless Python would take
    a function or module for True without anything being traced."""
    named = _not_a_value(value)
    if named is not None:
        raise TypeError(
            f"`{text}` is {named}, not a kernel value: as a condition Python takes it for True at trace time and the"
            " kernel never tests anything"
        )
    return value


_ESCAPE_ADVICE = (
    "MLIR's scf.for / scf.if / scf.while have no early exit, and this `{escape}` could not be folded into branches"
    " (only exits that end a branch are: not one inside a `with`/`try` or followed by code, nor, for a `return` of"
    " a value, inside a loop). Keep the statement's control flow static (bounds and"
    " conditions known at trace time: Python ints, Constexpr values, fx.range_constexpr, fx.const_expr), or trace it"
    " without `{escape}`: carry a flag (`done = fx.Boolean(False)` before the loop, `done = done | cond` in it) and"
    " guard the rest of the body with `if ~done:`, or use a `while` loop whose condition says when to stop"
)


def trace_time_range(bounds: tuple, escape: str, line: int):
    """The ``range`` of a ``for`` whose body holds ``escape`` (``break``, ``continue``, ``return``): the loop stays a
    Python loop, so its bounds must be known at trace time."""
    dynamic = [b for b in bounds if _is_dynamic(b)]
    if dynamic:
        raise TypeError(
            f"line {line}: `{escape}` in a `for` over a range known only when the kernel runs is not supported: "
            + _ESCAPE_ADVICE.format(escape=escape)
        )
    return range(*bounds)


def trace_time_condition(condition, escape: str, line: int):
    """The condition of an ``if`` / ``while`` whose body holds ``escape``: it stays Python, so the condition must be
    known at trace time."""
    if _is_dynamic(condition):
        raise TypeError(
            f"line {line}: `{escape}` under a condition known only when the kernel runs is not supported: "
            + _ESCAPE_ADVICE.format(escape=escape)
        )
    return truth(condition, "the condition")


def _is_dynamic(value) -> bool:
    return isinstance(value, (Numeric, ir.Value))
