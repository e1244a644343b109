"""Trace-time helpers behind the rewritten ``for``/``if``/``while`` of kernels (see :mod:`ast_rewrite`).

Each helper looks at its condition or bounds: Python values run the body as plain Python; FlyDSL values build
``scf.for`` / ``scf.if`` / ``scf.while``. The names a body assigns come in with their current values and go out
with their new ones. A name that holds a FlyDSL numeric before the statement is carried through it (a loop-carried
value, or a result of the ``scf.if``); a name first bound inside a dynamic body stays inside it.

Besides numerics, lists and tuples of carried values (e.g. a list of accumulator vectors) and objects that follow
the carried-value protocol are carried, leaf by leaf:

    class PipelineState:
        def __fly_values__(self) -> list: ...               # the values to carry (numerics or carried values)
        def __fly_rebuild__(self, values: list): ...        # a new object of the same kind from new values
"""

from __future__ import annotations

import types

from flydsl.compiler.lazy import lazy_import
from flydsl.compiler.trace_checks import equal, not_equal, trace_time_condition, trace_time_range, truth
from flydsl.expr.numeric import Boolean, Index, Integer, Numeric, as_numeric

ir = lazy_import("mlir.ir")
scf = lazy_import("mlir.dialects.scf")

__all__ = [
    "UNDEFINED",
    "lookup",
    "call",
    "call_method",
    "at_line",
    "for_range",
    "for_range_explicit",
    "if_else",
    "while_loop",
    "unless",
    "stopped",
    "running",
    "range_start",
    "in_range",
    "equal",
    "not_equal",
    "truth",
    "trace_time_range",
    "trace_time_condition",
]


_INTERNAL_MODULES = ("flydsl.compiler", "flydsl.expr", "flydsl.layout", "mlir")
_rewritten_helpers: dict = {}


def call(function, *args, **kwargs):
    """A call by name from a kernel: user functions run rewritten (their control flow traced like the kernel's), and
    so do the ``__init__`` of the user classes it constructs (:func:`_constructed`); anything else (FlyDSL's own
    functions, builtins) runs as it is."""
    if type(function) is types.FunctionType:
        function = _traced(function)
    elif type(function) is type:
        return _constructed(function, args, kwargs)
    return function(*args, **kwargs)


def call_method(function, *args, **kwargs):
    """A call of an attribute from a kernel (``x.name(...)``): user methods run rewritten like functions called by
    name, and classes are constructed as :func:`call` constructs them; a module's functions and everything else run
    as they are."""
    if type(function) is types.MethodType and type(function.__func__) is types.FunctionType:
        traced = _traced(function.__func__)
        if traced is not function.__func__:
            function = types.MethodType(traced, function.__self__)
    elif type(function) is type:
        return _constructed(function, args, kwargs)
    return function(*args, **kwargs)


def _constructed(cls: type, args: tuple, kwargs: dict):
    """``cls(*args, **kwargs)`` with its ``__init__`` rewritten, where construction is only ``object.__new__`` and a
    Python ``__init__`` (no metaclass, no ``__new__`` of its own); otherwise as it is."""
    init = cls.__init__
    if cls.__new__ is not object.__new__ or type(init) is not types.FunctionType:
        return cls(*args, **kwargs)
    traced = _traced(init)
    if traced is init:
        return cls(*args, **kwargs)
    instance = object.__new__(cls)
    traced(instance, *args, **kwargs)
    return instance


def _traced(function: types.FunctionType) -> types.FunctionType:
    """``function`` rewritten (once per function), or itself where it is FlyDSL's own or has no source to rewrite."""
    if getattr(function, "__fly_rewritten__", False) or (function.__module__ or "").startswith(_INTERNAL_MODULES):
        return function
    rewritten = _rewritten_helpers.get(function)
    if rewritten is None:
        from flydsl.compiler.ast_rewrite import RewriteError, _Untraceable, rewrite_function

        try:
            rewritten = rewrite_function(function)
        except _Untraceable:  # no source, or a lambda's: run it as it is
            rewritten = function
        except RewriteError:  # the helper's own mistake: say so
            raise
        except SyntaxError:  # a lambda's line does not parse alone: run it as it is
            rewritten = function
        _rewritten_helpers[function] = rewritten
    return rewritten


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


def _leaves(value) -> list[Numeric] | None:
    """The numerics a carried value consists of, in order; None when the value is not carried (Python values)."""
    if isinstance(value, Numeric):
        return [value]
    if hasattr(type(value), "__fly_values__"):
        parts = [_leaves(part) for part in value.__fly_values__()]
    elif isinstance(value, (list, tuple)) and value:
        parts = [_leaves(part) for part in value]
    else:
        return None
    if any(part is None for part in parts):
        return None
    return [leaf for part in parts for leaf in part]


def _rebuild(template, values):
    """``template`` with its leaves replaced by the ``ir.Value``s taken from the iterator ``values``."""
    if isinstance(template, Numeric):
        return type(template)(next(values))  # divisibility facts do not survive a loop or branch
    if hasattr(type(template), "__fly_values__"):
        return template.__fly_rebuild__([_rebuild(part, values) for part in template.__fly_values__()])
    return type(template)(_rebuild(part, values) for part in template)


def _with_carried(values, carried, ir_values) -> list:
    """``values`` with each carried one rebuilt, in order, from ``ir_values`` (block arguments or op results)."""
    rebuilt, leaves = list(values), iter(ir_values)
    for i in carried:
        rebuilt[i] = _rebuild(values[i], leaves)
    return rebuilt


def _yield_carried(names, values, outputs, carried, where: str) -> list:
    """The body's ``outputs`` with each carried value in its incoming shape and types; yields their leaves."""
    outputs = list(outputs)
    for i in carried:
        outputs[i] = _coerced(names[i], values[i], outputs[i], where)
    scf.YieldOp(_flat_values(carried, outputs))
    return outputs


def _carried(names, values) -> list[int]:
    return [i for i, v in enumerate(values) if _leaves(v) is not None]


def _flat_values(carried, values) -> list[ir.Value]:
    return [leaf.value for i in carried for leaf in _leaves(values[i])]


def _coerced(name: str, before, after, where: str):
    """``after`` in the shape and leaf types of the carried value ``before``, or a clear error naming it."""
    if isinstance(before, Numeric):
        return _checked(name, before, after, where)
    if hasattr(type(before), "__fly_values__"):
        if type(after) is not type(before):
            raise TypeError(f"'{name}' is a {type(before).__name__} before the {where} but {after!r} inside it")
        parts = zip(before.__fly_values__(), after.__fly_values__(), strict=True)
        return after.__fly_rebuild__([_coerced(f"{name}.{k}", b, a, where) for k, (b, a) in enumerate(parts)])
    if not isinstance(after, (list, tuple)) or len(after) != len(before):
        raise TypeError(
            f"'{name}' holds {len(before)} carried values before the {where} but {after!r} inside it; a list carried"
            " through MLIR control flow keeps its length"
        )
    pairs = enumerate(zip(before, after, strict=True))
    return type(before)(_coerced(f"{name}[{k}]", b, a, where) for k, (b, a) in pairs)


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


def _structure(value):
    """What must agree between the two branches of an ``if`` for a value to flow out: shape and leaf types."""
    if isinstance(value, Numeric):
        return type(value)
    parts = value.__fly_values__() if hasattr(type(value), "__fly_values__") else value
    return (type(value), tuple(_structure(part) for part in parts))


def _describe(value) -> str:
    if isinstance(value, Numeric):
        return f"a {type(value).__name__}"
    return f"a {type(value).__name__} of {len(_leaves(value))} values"


def _unbound(value) -> bool:
    """Whether a name has no value to carry into control flow: unbound, or bound only inside earlier traced control
    flow (a second loop may reuse the first loop's local names)."""
    return value is UNDEFINED or isinstance(value, ScopedValue)


def _unchanged_or_error(names, before, after, carried, where: str):
    """Names that are not carried must not be rebound by a dynamic body (their new value would be lost)."""
    results = []
    for i, name in enumerate(names):
        if i in carried:
            continue
        if _unbound(before[i]):
            results.append((i, ScopedValue(name, where)))
        elif after[i] is not before[i]:
            raise TypeError(
                f"'{name}' holds {before[i]!r} (not a FlyDSL value) before the {where} and is rebound inside it;"
                " only FlyDSL values (numerics, lists of them, carried objects) are updated by MLIR control flow"
                f" (make it e.g. fx.Int32(...) before the {where}, or use range_constexpr / const_expr for trace-time"
                " control flow)"
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
    loop = scf.ForOp(_as_index(start), _as_index(stop), _as_index(step), _flat_values(carried, values))
    with ir.InsertionPoint(loop.body):
        inputs = _with_carried(values, carried, loop.inner_iter_args)
        induction = Index(loop.induction_variable)
        outputs = _yield_carried(names, values, body(induction.to(induction_type), *inputs), carried, "loop")
    results = _with_carried(values, carried, loop.results)
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
    for i in range(len(names)):  # Python scalars beside a numeric, or bools set by a branch, become numerics
        then_out[i], else_out[i] = _lifted(values[i], then_out[i], else_out[i])
    result_names = []
    for i, name in enumerate(names):
        a, b = then_out[i], else_out[i]
        if _leaves(a) is not None and _leaves(b) is not None:
            if _structure(a) != _structure(b):
                raise TypeError(
                    f"'{name}' is {_describe(a)} after the `if` branch but {_describe(b)} after the `else` branch;"
                    " both must have one type (convert one with .to())"
                )
            result_names.append(i)
    flat_then = _flat_values(result_names, then_out)
    final = scf.IfOp(condition.value, [value.type for value in flat_then], has_else=True)
    for source, target, outputs in (
        (draft.then_block, final.then_block, then_out),
        (draft.else_block, final.else_block, else_out),
    ):
        for op in list(source.operations):
            op.detach_from_parent()
            ir.InsertionPoint(target).insert(op)
        with ir.InsertionPoint(target):
            scf.YieldOp(_flat_values(result_names, outputs))
    draft.operation.erase()

    rebuilt = _with_carried(then_out, result_names, final.results)
    results = [rebuilt[i] if i in result_names else value for i, value in enumerate(values)]
    for i, name in enumerate(names):
        if i in result_names:
            continue
        a, b = then_out[i], else_out[i]
        if _unbound(values[i]) or _leaves(a) is not None or _leaves(b) is not None:
            if a is values[i] and b is values[i]:
                continue
            results[i] = ScopedValue(name, "branch") if _unbound(values[i]) or a is not b else a
        elif a is not values[i] or b is not values[i]:
            raise TypeError(
                f"'{name}' is rebound in a branch of an `if` on a dynamic condition but holds {a!r} / {b!r}, not a"
                " FlyDSL value; only FlyDSL values can flow out of MLIR control flow (use const_expr for a"
                " trace-time condition)"
            )
    return tuple(results)


def _lifted(before, a, b) -> tuple:
    """A branch result pair ``(a, b)`` that can flow out of an ``scf.if``: a Python scalar beside a numeric converted
    to its type (as a loop converts what it carries), and Python bools one branch set (``found = True``) made
    Booleans; anything else as it is."""
    scalars = (bool, int, float)
    if isinstance(a, Numeric) and type(b) in scalars:
        return a, type(a)(b)
    if isinstance(b, Numeric) and type(a) in scalars:
        return type(b)(a), b
    if type(a) is bool and type(b) is bool and (a is not before or b is not before):
        return Boolean(a), Boolean(b)
    return a, b


def unless(flag, condition_fn):
    """``not flag and condition_fn()`` with Python's short circuit: the condition of a loop whose ``break`` was folded
    into ``flag`` (:mod:`ast_escapes`). A dynamic flag evaluates the condition in an ``scf.if``, so that a loop
    condition reading memory is not evaluated once the loop has broken."""
    if not _is_dynamic(flag):
        return False if flag else condition_fn()
    flag = as_numeric(flag)
    branch = scf.IfOp((~flag).value, [ir.IntegerType.get_signless(1)], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        condition = condition_fn()
        condition = as_numeric(condition) if _is_dynamic(condition) else Boolean(bool(condition))
        scf.YieldOp([(condition if isinstance(condition, Boolean) else condition != 0).value])
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([Boolean(False).value])
    return Boolean(branch.results[0])


def stopped(flag) -> bool:
    """Whether a loop over a Python iterable whose ``break`` was folded into ``flag`` stops now (a Python flag that
    is set; a dynamic one runs the remaining iterations under :func:`running`)."""
    return not _is_dynamic(flag) and bool(flag)


def running(flag):
    """``not flag``: the condition of the rest of such a loop's iterations (a Boolean where the flag is dynamic)."""
    return ~as_numeric(flag) if _is_dynamic(flag) else not flag


def range_start(start, stop, step):
    """The first value of a ``range`` loop whose exits were folded (:mod:`ast_escapes`): ``start`` as it is where
    both bounds are Python ints, else of the induction variable's type (as ``for_range`` gives it). Bounds are
    checked as ``range`` checks them."""
    for bound in (start, stop, step):
        if not _is_dynamic(bound) and not isinstance(bound, int):
            raise TypeError(f"'{type(bound).__name__}' object cannot be interpreted as an integer (a range bound)")
    if not _is_dynamic(step) and step == 0:
        raise ValueError("range() arg 3 must not be zero")
    if not _is_dynamic(start) and not _is_dynamic(stop):
        return start
    induction_type = next((type(a) for a in (stop, start) if isinstance(a, Integer)), Index)
    return as_numeric(start).to(induction_type) if _is_dynamic(start) else induction_type(start)


def in_range(value, stop, step):
    """Whether a ``range`` loop whose ``break`` was folded runs another iteration (a dynamic step is taken as
    positive, as ``scf.for`` takes it)."""
    return value > stop if not _is_dynamic(step) and step < 0 else value < stop


def while_loop(cond_fn, body_fn, names: tuple, values: tuple, lift: tuple = ()):
    """``while``: a Python loop while the condition is a Python value; an ``scf.while`` once it is dynamic. The names
    in ``lift`` (a folded ``break``'s flag and induction variable: :mod:`ast_escapes`) holding Python values then
    become numerics (bool: Boolean, int: Index), so that the loop carries them."""
    current = list(values)
    condition = cond_fn(*current)
    while not _is_dynamic(condition):
        if not condition:
            return tuple(current)
        current = list(body_fn(*current))
        condition = cond_fn(*current)
    for i, name in enumerate(names):
        if name in lift and type(current[i]) in (bool, int):
            current[i] = (Boolean if type(current[i]) is bool else Index)(current[i])
    carried = _carried(names, current)
    initial = _flat_values(carried, current)
    types = [value.type for value in initial]
    loop = scf.WhileOp(types, initial)
    before = loop.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        condition = as_numeric(cond_fn(*_with_carried(current, carried, before.arguments)))
        if not isinstance(condition, Boolean):
            condition = condition != 0
        scf.ConditionOp(condition.value, list(before.arguments))
    after = loop.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        inputs = _with_carried(current, carried, after.arguments)
        outputs = _yield_carried(names, current, body_fn(*inputs), carried, "loop")
    results = _with_carried(current, carried, loop.results)
    for i, value in _unchanged_or_error(names, current, outputs, carried, "loop"):
        results[i] = value
    return tuple(results)
