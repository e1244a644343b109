"""Trace-time helpers behind the rewritten ``for``/``if``/``while`` of kernels (see :mod:`ast_rewrite`).

Each helper looks at its condition or bounds: Python values run the body as plain Python; FlyDSL values build
``scf.for`` / ``scf.if`` / ``scf.while``. The names a body assigns come in with their current values and go out
with their new ones. A name that holds a FlyDSL numeric before the statement is carried through it (a loop-carried
value, or a result of the ``scf.if``); a name first bound inside a dynamic body stays inside it.
"""

from __future__ import annotations

import types

from mlir import ir
from mlir.dialects import scf

from flydsl.expr.numeric import Boolean, Index, Integer, Numeric, as_numeric

__all__ = ["UNDEFINED", "lookup", "call", "at_line", "for_range", "for_range_explicit", "if_else", "while_loop"]


_INTERNAL_MODULES = ("flydsl.compiler", "flydsl.expr", "flydsl.layout", "mlir")
_rewritten_helpers: dict = {}


def call(function, *args, **kwargs):
    """A call from a kernel: user functions run rewritten (their control flow traced like the kernel's), anything
    else (FlyDSL's own functions, builtins, classes, methods) runs as it is."""
    if type(function) is types.FunctionType and not getattr(function, "__fly_rewritten__", False):
        if not (function.__module__ or "").startswith(_INTERNAL_MODULES):
            rewritten = _rewritten_helpers.get(function)
            if rewritten is None:
                from flydsl.compiler.ast_rewrite import RewriteError, rewrite_function

                try:
                    rewritten = rewrite_function(function)
                except (RewriteError, SyntaxError):  # a lambda, or no source: run it as it is
                    rewritten = function
                _rewritten_helpers[function] = rewritten
            function = rewritten
    return function(*args, **kwargs)


def at_line(filename: str, line: int) -> ir.Location:
    """The MLIR location of a kernel statement (entered around it by the rewritten code)."""
    return ir.Location.file(filename, line, 0)


class _Undefined:
    def __repr__(self):
        return "<unbound>"


UNDEFINED = _Undefined()


class ScopedValue:
    """Stands for a name bound only inside a dynamic loop or branch: any use after it says so."""

    def __init__(self, name: str, where: str):
        self._message = (
            f"'{name}' was bound only inside a {where} traced as MLIR control flow, so it has no value after it;"
            f" assign it a FlyDSL value before the {where} to carry it out"
        )

    def __getattr__(self, attribute):
        raise NameError(self._message)

    def __repr__(self):
        return f"<{self._message}>"

    def _fail(self, *args, **kwargs):
        raise NameError(self._message)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __bool__ = __call__ = __getitem__ = _fail
    __fly_fail__ = _fail
    __truediv__ = __floordiv__ = __mod__ = __lt__ = __le__ = __gt__ = __ge__ = __index__ = __int__ = _fail


def lookup(local_vars: dict, name: str):
    return local_vars.get(name, UNDEFINED)


def _is_dynamic(value) -> bool:
    return isinstance(value, (Numeric, ir.Value))


def _as_index(value) -> ir.Value:
    if isinstance(value, int):
        return Index(value).value
    number = as_numeric(value)
    if not isinstance(number, Integer):
        raise TypeError(f"range bounds must be integers, got {type(number).__name__}")
    return number.to(Index).value


def _carried(names, values) -> list[int]:
    return [i for i, v in enumerate(values) if isinstance(v, Numeric)]


def _checked(name: str, before, after, where: str):
    """``after`` converted to ``before``'s type, or a clear error naming the variable."""
    if isinstance(after, Numeric) and type(after) is type(before):
        return after
    if isinstance(after, (int, float, bool)) and not isinstance(after, Numeric):
        return type(before)(after)
    raise TypeError(
        f"'{name}' is a {type(before).__name__} before the {where} but becomes "
        f"{type(after).__name__ if isinstance(after, Numeric) else repr(after)} inside it; a value carried through"
        f" MLIR control flow keeps its type (convert with .to({type(before).__name__}))"
    )


def _unchanged_or_error(names, before, after, carried, where: str):
    """Names that are not carried must not be rebound by a dynamic body (their new value would be lost)."""
    results = []
    for i, name in enumerate(names):
        if i in carried:
            continue
        if before[i] is UNDEFINED:
            results.append((i, ScopedValue(name, where)))
        elif after[i] is not before[i]:
            raise TypeError(
                f"'{name}' holds {before[i]!r} (not a FlyDSL value) before the {where} and is rebound inside it;"
                f" only FlyDSL numeric values can be updated by MLIR control flow (make it e.g. fx.Int32(...)"
                f" before the {where}, or use range_constexpr / const_expr for trace-time control flow)"
            )
        else:
            results.append((i, before[i]))
    return results


def for_range(range_args: tuple, body, names: tuple, values: tuple):
    """``for i in range(...)`` in a kernel: an ``scf.for``, static bounds included (the body is traced once, not
    unrolled; ``range_constexpr`` unrolls at trace time)."""
    if not range_args or len(range_args) > 3:
        raise TypeError(f"range expected 1 to 3 arguments, got {len(range_args)}")
    start, stop, step = (0, range_args[0], 1) if len(range_args) == 1 else (*range_args, 1)[:3]
    induction_type = next((type(a) for a in (stop, start) if isinstance(a, Integer)), Index)
    carried = _carried(names, values)
    loop = scf.ForOp(_as_index(start), _as_index(stop), _as_index(step), [values[i].value for i in carried])
    with ir.InsertionPoint(loop.body):
        inputs = list(values)
        for position, i in enumerate(carried):
            inputs[i] = type(values[i])(loop.inner_iter_args[position], divisibility=1)
        induction = Index(loop.induction_variable)
        outputs = body(induction.to(induction_type), *inputs)
        yielded = [_checked(names[i], values[i], outputs[i], "loop").value for i in carried]
        scf.YieldOp(yielded)
    results = list(values)
    for position, i in enumerate(carried):
        results[i] = type(values[i])(loop.results[position])
    for i, value in _unchanged_or_error(names, values, outputs, carried, "loop"):
        results[i] = value
    return tuple(results)


def for_range_explicit(range_args: tuple, init, body):
    """The seed's ``for iv, state in range(a, b, s, init=[...]): ... results = yield [...]``: an ``scf.for`` whose
    loop-carried values are ``init``; returns the final values as a list."""
    start, stop, step = (0, range_args[0], 1) if len(range_args) == 1 else (*range_args, 1)[:3]
    inits = [as_numeric(v) for v in init]
    loop = scf.ForOp(_as_index(start), _as_index(stop), _as_index(step), [v.value for v in inits])
    induction_type = next((type(a) for a in (stop, start) if isinstance(a, Integer)), Index)
    with ir.InsertionPoint(loop.body):
        state = [type(v)(arg) for v, arg in zip(inits, loop.inner_iter_args, strict=True)]
        outputs = body(Index(loop.induction_variable).to(induction_type), state)
        if len(outputs) != len(inits):
            raise TypeError(f"the loop yields {len(outputs)} values but init has {len(inits)}")
        scf.YieldOp(
            [_checked(f"state[{k}]", v, o, "loop").value for k, (v, o) in enumerate(zip(inits, outputs, strict=True))]
        )
    return [type(v)(r) for v, r in zip(inits, loop.results, strict=True)]


def if_else(condition, then_fn, else_fn, names: tuple, values: tuple):
    """``if``/``else``: plain Python for a Python condition; an ``scf.if`` for a dynamic one, whose results are the
    names that hold FlyDSL values of one type after both branches."""
    if not _is_dynamic(condition):
        return tuple((then_fn if condition else else_fn)(*values))
    condition = as_numeric(condition)
    if not isinstance(condition, Boolean):
        condition = condition != 0
    # Trace both branches into a result-less scf.if, then rebuild it with the result types found.
    draft = scf.IfOp(condition.value, [], has_else=True)
    branches = []
    for block, fn in ((draft.then_block, then_fn), (draft.else_block, else_fn)):
        with ir.InsertionPoint(block):
            branches.append(list(fn(*values)))
    then_out, else_out = branches
    result_names = []
    for i, name in enumerate(names):
        a, b = then_out[i], else_out[i]
        if isinstance(a, Numeric) and isinstance(b, Numeric):
            if type(a) is not type(b):
                raise TypeError(
                    f"'{name}' is a {type(a).__name__} after the `if` branch but a {type(b).__name__} after the"
                    " `else` branch; both must have one type (convert one with .to())"
                )
            result_names.append(i)
    final = scf.IfOp(condition.value, [then_out[i].type for i in result_names], has_else=True)
    for source, target, outputs in (
        (draft.then_block, final.then_block, then_out),
        (draft.else_block, final.else_block, else_out),
    ):
        for op in list(source.operations):
            op.detach_from_parent()
            ir.InsertionPoint(target).insert(op)
        with ir.InsertionPoint(target):
            scf.YieldOp([outputs[i].value for i in result_names])
    draft.operation.erase()

    results = list(values)
    for position, i in enumerate(result_names):
        results[i] = type(then_out[i])(final.results[position])
    for i, name in enumerate(names):
        if i in result_names:
            continue
        a, b = then_out[i], else_out[i]
        if values[i] is UNDEFINED or isinstance(a, Numeric) or isinstance(b, Numeric):
            if a is values[i] and b is values[i]:
                continue
            results[i] = ScopedValue(name, "branch") if values[i] is UNDEFINED or a is not b else a
        elif a is not values[i] or b is not values[i]:
            raise TypeError(
                f"'{name}' is rebound in a branch of an `if` on a dynamic condition but holds {a!r} / {b!r}, not a"
                " FlyDSL value; only FlyDSL values can flow out of MLIR control flow (use const_expr for a"
                " trace-time condition)"
            )
    return tuple(results)


def while_loop(cond_fn, body_fn, names: tuple, values: tuple):
    """``while``: a Python loop while the condition is a Python value; an ``scf.while`` once it is dynamic."""
    current = list(values)
    condition = cond_fn(*current)
    while not _is_dynamic(condition):
        if not condition:
            return tuple(current)
        current = list(body_fn(*current))
        condition = cond_fn(*current)
    carried = _carried(names, current)
    types = [current[i].type for i in carried]
    loop = scf.WhileOp(types, [current[i].value for i in carried])
    before = loop.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        inputs = list(current)
        for position, i in enumerate(carried):
            inputs[i] = type(current[i])(before.arguments[position])
        condition = as_numeric(cond_fn(*inputs))
        if not isinstance(condition, Boolean):
            condition = condition != 0
        scf.ConditionOp(condition.value, [before.arguments[p] for p in range(len(carried))])
    after = loop.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        inputs = list(current)
        for position, i in enumerate(carried):
            inputs[i] = type(current[i])(after.arguments[position])
        outputs = body_fn(*inputs)
        scf.YieldOp([_checked(names[i], current[i], outputs[i], "loop").value for i in carried])
    results = list(current)
    for position, i in enumerate(carried):
        results[i] = type(current[i])(loop.results[position])
    for i, value in _unchanged_or_error(names, current, outputs, carried, "loop"):
        results[i] = value
    return tuple(results)
