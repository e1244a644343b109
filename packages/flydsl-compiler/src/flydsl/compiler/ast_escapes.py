"""Early exits folded into branches, before a kernel's control flow is rewritten (see :mod:`ast_rewrite`).

MLIR's ``scf`` ops have no early exit, so a ``return``, ``break`` or ``continue`` under a condition known only when the
kernel runs cannot be traced as it is written. The most common guard, ``if i >= n: return`` and the rest of the body
after it, says the same as ``if i >= n: pass`` / ``else: <the rest>``, which can. This pass rewrites the statements
that way before :mod:`ast_rewrite` sees them:

- the statements after an ``if`` one of whose branches always ends in the exit move into its other branch;
- where every exit of the function (or loop body) now ends a branch, the exits become plain ends of those branches:
  a bare ``return`` or a ``continue`` goes, ``return value`` on every path becomes ``_fly_returned = value`` with
  one ``return _fly_returned`` at the end (a value of each branch of a traced ``scf.if``, so their types must agree),
  and a ``break`` sets a flag that its loop tests (:class:`FoldLoopExits`).

A bare ``return`` inside loops first becomes a flag and a ``break`` out of each loop (:class:`FoldLoopReturns`), the
outermost followed by ``if flag: return``, which then folds like any early return.

A loop's ``else:`` first becomes a flag that the loop's own ``break`` s clear and an ``if`` after the loop
(:func:`unfold_loop_else`), so that the loop folds like any other.

Python runs the folded statements exactly as the original ones, so trace-time conditions behave as before. Exits
left elsewhere (a ``return`` of a value inside a loop, exits in ``with`` or ``try``) are not folded, and a dynamic
condition over them still raises the error that says what to do.
"""

from __future__ import annotations

import ast
import copy
import itertools

HELPERS = "__fly_cf"  # the name the rewritten code calls its helpers (flydsl.compiler.control_flow) through
RESULT = "_fly_returned"  # (not "__fly_": those names are never carried out of a branch)
RETURNING = "_fly_returning"  # set where a return in a loop became a break (FoldLoopReturns)
COMPLETED = "_fly_completed"  # a loop's else flag: cleared by the loop's own breaks (unfold_loop_else)


def unfold_loop_else(statements: list[ast.stmt]) -> list[ast.stmt]:
    """``statements`` with each loop's ``else:`` (inner loops first) moved after the loop: where the loop has
    ``break`` s of its own, under ``if {COMPLETED}_n:``, a flag set before the loop and cleared before each of those
    breaks (Python's rule: the ``else:`` runs unless a ``break`` ended the loop); else unconditionally. Nested
    functions and classes are left to their own rewrite."""
    ids = itertools.count()

    def unfold(statements: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for statement in statements:
            if not isinstance(statement, _SCOPES):
                for block in _blocks(statement):
                    block[:] = unfold(block)
            if not isinstance(statement, (ast.For, ast.While)) or not statement.orelse:
                out.append(statement)
                continue
            orelse, statement.orelse = statement.orelse, []
            flag = f"{COMPLETED}_{next(ids)}"
            body = _cleared_before_breaks(statement.body, flag)
            if body is None:  # no break of its own: the else always runs
                out += [statement, *orelse]
                continue
            statement.body = body
            (after,) = _template(f"if {flag}:\n    pass", orelse[0])
            after.body = orelse
            out += [*_template(f"{flag} = True", statement), statement, after]
        return out

    return unfold(statements)


def _cleared_before_breaks(statements: list[ast.stmt], flag: str) -> list[ast.stmt] | None:
    """``statements`` (a loop's body) with ``{flag} = False`` before each ``break`` of that loop (not of loops or
    functions inside it), or None where it has none."""
    found = False

    def clear(statements: list[ast.stmt]) -> list[ast.stmt]:
        nonlocal found
        out = []
        for statement in statements:
            if isinstance(statement, ast.Break):
                found = True
                out += _template(f"{flag} = False", statement)
            elif not isinstance(statement, _SCOPES_AND_LOOPS):
                for block in _blocks(statement):
                    block[:] = clear(block)
            out.append(statement)
        return out

    cleared = clear(statements)
    return cleared if found else None


def fold_returns(function: ast.FunctionDef) -> bool:
    """``function``'s body with its early returns folded into branches (in place), where every return can be;
    whether a ``return`` in a loop became a ``break`` (:class:`FoldLoopReturns`: the loops' exits are to be folded)."""
    if _count(function.body, (ast.Yield, ast.YieldFrom, ast.Await), loops_too=True):
        return False
    loops = FoldLoopReturns()
    function.body = loops.statements(function.body)
    if loops.folded:
        function.body = [*_template(f"{RETURNING} = False", function.body[0]), *function.body]
    _fold_returns(function)
    return loops.folded


def _fold_returns(function: ast.FunctionDef) -> None:
    body = _merge_tails(function.body, ast.Return)
    returns = _count(body, ast.Return, loops_too=True)
    if returns == 0 or returns != _tail_count(body, ast.Return):
        function.body = body
        return
    valued = [r for r in _tails(body, ast.Return) if not _is_none(r.value)]
    if not valued:  # every return is bare: each branch just ends
        function.body = _strip_tails(body, ast.Return, lambda r: None)
    elif len(valued) == returns and _always_ends(body, ast.Return):
        assign = lambda r: ast.copy_location(  # noqa: E731
            ast.Assign(targets=[ast.copy_location(ast.Name(id=RESULT, ctx=ast.Store()), r)], value=r.value), r
        )
        body = _strip_tails(body, ast.Return, assign)
        result = ast.Return(value=ast.Name(id=RESULT, ctx=ast.Load()))
        function.body = [*body, ast.copy_location(result, function.body[-1])]
    else:  # some paths return a value, some None: left as written
        function.body = body


class FoldLoopReturns:
    """Bare ``return`` s that end branches of a loop's body become ``{RETURNING} = True`` and a ``break``, and the loop
    is followed by ``if {RETURNING}: return`` (``break`` where the loop is in another one, which is then followed by the
    same), so that :func:`fold_returns` and :class:`FoldLoopExits` fold them. A loop nest is folded whole or left as
    written: loops with an ``else:`` (which :func:`unfold_loop_else` removes first), a ``return`` of a value (whose type
    a dynamic loop could not carry before it is known) or one that does not end a branch (in a ``with`` or ``try``) keep
    the nest as it was. Only statements are visited (a return is one), not nested functions or classes (their returns
    are their own)."""

    def __init__(self):
        self.folded = False
        self._depth = 0

    def statements(self, statements: list[ast.stmt]) -> list[ast.stmt]:
        return [s for item in statements for s in listed(self._statement(item))]

    def _statement(self, node: ast.stmt):
        if isinstance(node, (ast.For, ast.While)):
            return self._loop(node)
        if not isinstance(node, _SCOPES):
            for block in _blocks(node):
                block[:] = self.statements(block)
        return node

    def _loop(self, node: ast.While | ast.For):
        returns = [r for r in _walk(node.body, _SCOPES, statements_only=True) if isinstance(r, ast.Return)]
        if not returns or node.orelse or not all(_is_none(r.value) for r in returns):
            return node
        outermost = copy.deepcopy(node) if self._depth == 0 else None  # what a nest that cannot fold stays
        self._depth += 1
        node.body = self.statements(node.body)
        self._depth -= 1
        direct = _count(node.body, ast.Return, loops_too=False)
        body = _merge_tails(node.body, ast.Return)
        if direct != _tail_count(body, ast.Return):
            return outermost or node  # (an inner loop's: the outermost finds its return and stays as written)
        node.body = _strip_tails(body, ast.Return, lambda r: _template(f"{RETURNING} = True\nbreak", r))
        if outermost is not None:
            if _count(node.body, ast.Return, loops_too=True):  # an inner loop could not fold
                return outermost
            self.folded = True
        return [node, _template(f"if {RETURNING}:\n    {'break' if self._depth else 'return'}", node)[0]]


class FoldLoopExits(ast.NodeTransformer):
    """Loops whose ``break``s and ``continue``s all end branches, rewritten so that they can be traced: a
    ``continue`` ends its branch (the rest of the body is the other branch), a ``break`` sets a flag that the loop
    tests. A ``while`` runs while ``unless(flag, condition)``; a ``range`` loop becomes a ``while`` over an induction
    variable of its own (Python while its bounds and exits are known at trace time, as the loop was; an
    ``scf.while`` from the first dynamic one, where an ``scf.for`` could not stop early); a loop over anything else
    stays Python and runs the rest of its iterations under ``if ~flag`` once the flag is dynamic. Python runs the
    rewritten loops exactly as the original ones."""

    def __init__(self):
        self._ids = itertools.count()

    def _folded(self, node: ast.While | ast.For) -> tuple[str, tuple | None]:
        """The loop's break flag and :func:`_folded_loop_body` of it (None for a loop with an ``else:``), after its
        inner loops."""
        self.generic_visit(node)
        flag = self._name("broken", node)
        return flag, None if node.orelse else _folded_loop_body(node.body, flag)

    def visit_While(self, node: ast.While):
        flag, folded = self._folded(node)
        if folded is None:
            return node
        node.body, breaks = folded
        if not breaks:  # continues only: they end their branches now
            return node
        (loop,) = _template(f"while {HELPERS}.unless({flag}, lambda: TEST):\n    pass", node, TEST=node.test)
        loop.body, loop._fly_lift = node.body, (flag, *_returning(node.body))
        return [*_template(f"{flag} = False", node), loop]

    def visit_For(self, node: ast.For):
        flag, folded = self._folded(node)
        if folded is None:
            return node
        body, breaks = folded
        iterator = node.iter
        is_range = (
            isinstance(iterator, ast.Call)
            and _named(iterator.func, "range")
            and not iterator.keywords
            and 1 <= len(iterator.args) <= 3
        )
        if is_range and isinstance(node.target, ast.Name):
            start, stop, step = (self._name(n, node) for n in ("start", "stop", "step"))
            value = self._name("next", node)
            args = iterator.args
            bounds = [ast.Constant(0), args[0], ast.Constant(1)] if len(args) == 1 else [*args, ast.Constant(1)][:3]
            test = f"{HELPERS}.in_range({value}, {stop}, {step})"
            test = f"{HELPERS}.unless({flag}, lambda: {test})" if breaks else test
            statements = _template(
                f"{flag} = False\n{start}, {stop}, {step} = BOUNDS\n"
                f"{value} = {HELPERS}.range_start({start}, {stop}, {step})\n"
                f"while {test}:\n    {node.target.id} = {value}\n    {value} = {value} + {step}",
                node,
                BOUNDS=ast.Tuple(elts=bounds, ctx=ast.Load()),
            )
            loop = statements[-1]
            loop.body, loop._fly_lift = [*loop.body, *body], (flag, value, node.target.id, *_returning(body))
            return statements if breaks else statements[1:]
        if not breaks:  # continues only, in a loop that stays Python: they end their branches now (no flag)
            node.body = body
            return node
        statements = _template(
            f"{flag} = False\nfor TARGET in ITER:\n    if {HELPERS}.running({flag}):\n        pass\n"
            f"    if {HELPERS}.stopped({flag}):\n        break",
            node,
            TARGET=node.target,
            ITER=iterator,
        )
        statements[-1].body[0].body = body
        return statements

    def _name(self, kind: str, node: ast.AST) -> str:
        return f"_fly_{kind}_{node.lineno}_{next(self._ids)}"


def _folded_loop_body(body: list[ast.stmt], flag: str) -> tuple[list[ast.stmt], bool] | None:
    """A loop body whose ``break``s set ``flag`` and whose ``continue``s end their branches, and whether it breaks;
    None where it has no exit or one that does not end a branch (or a ``return``/``yield``: left as written)."""
    breaks = _count(body, ast.Break, loops_too=False) > 0
    if not breaks and not _count(body, ast.Continue, loops_too=False):
        return None
    if _count(body, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await), loops_too=True):
        return None
    exits = (ast.Break, ast.Continue)
    body = _merge_tails(body, exits)
    if _count(body, exits, loops_too=False) != _tail_count(body, exits):
        return None

    def replace(exit_statement):
        if isinstance(exit_statement, ast.Continue):
            return None
        return _template(f"{flag} = True", exit_statement)[0]

    return _strip_tails(body, exits, replace), breaks


def _returning(body: list[ast.stmt]) -> tuple[str, ...]:
    """The flags a loop body sets that a dynamic loop is to carry as Booleans: (RETURNING,) where it sets it (a return
    made a break: :class:`FoldLoopReturns`), and the ``else:`` flags (:func:`unfold_loop_else`) that this loop's own
    breaks clear (not those of loops inside it)."""

    def assigned(skipped, value=None):
        for statement in _walk(body, skipped, statements_only=True):
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                if value is None or (isinstance(statement.value, ast.Constant) and statement.value.value is value):
                    yield statement.targets[0].id

    returning = (RETURNING,) if RETURNING in set(assigned(_SCOPES)) else ()
    cleared = (name for name in assigned(_SCOPES_AND_LOOPS, False) if name.startswith(COMPLETED))
    return returning + tuple(dict.fromkeys(cleared))


def listed(result) -> list:
    """A transformer's result for a statement as a list of statements (it may return one or several)."""
    return result if isinstance(result, list) else [result]


def _walk(statements: list[ast.stmt], skipped: tuple, statements_only: bool = False):
    """The nodes of the statements (``statements_only``: the statements, their expressions not walked), not inside
    nodes of the ``skipped`` types."""
    stack = list(statements)
    while stack:
        node = stack.pop()
        if isinstance(node, skipped):
            continue
        yield node
        if statements_only:
            for block in _blocks(node):
                stack.extend(block)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _blocks(node: ast.AST):
    """The statement lists of a compound statement (bodies, else branches, handlers', cases')."""
    for _, value in ast.iter_fields(node):
        if isinstance(value, list) and value:
            if isinstance(value[0], ast.stmt):
                yield value
            elif isinstance(value[0], (ast.excepthandler, ast.match_case)):
                yield from (item.body for item in value)


def _template(source: str, origin: ast.AST, **holes) -> list[ast.stmt]:
    """The statements of ``source`` at ``origin``'s position, each name in ``holes`` replaced by its node."""

    class Fill(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name):
            return holes.get(name.id, name)

    statements = [Fill().visit(statement) for statement in ast.parse(source).body]
    filled = {id(node) for hole in holes.values() for node in ast.walk(hole)}
    for statement in statements:
        for node in ast.walk(statement):
            if id(node) not in filled and "lineno" in node._attributes:
                ast.copy_location(node, origin)
    return statements


def _named(function: ast.expr, name: str) -> bool:
    """Whether a call's function is ``name`` or an attribute ``name`` (``range``, ``fx.range``: as ast_rewrite reads
    them)."""
    return (isinstance(function, ast.Name) and function.id == name) or (
        isinstance(function, ast.Attribute) and function.attr == name
    )


def _always_ends(statements: list[ast.stmt], exit_type: type) -> bool:
    """Every path through the statements ends in an ``exit_type`` statement (through nested ``if``s)."""
    if not statements:
        return False
    last = statements[-1]
    if isinstance(last, exit_type):
        return True
    return isinstance(last, ast.If) and _always_ends(last.body, exit_type) and _always_ends(last.orelse, exit_type)


def _merge_tails(statements: list[ast.stmt], exit_type: type) -> list[ast.stmt]:
    """The statements with those after an ``if`` whose branch always exits moved into its other branch (deepest
    first, so nested guards fold too)."""
    out: list[ast.stmt] = []
    for position, statement in enumerate(statements):
        out.append(statement)
        if not isinstance(statement, ast.If):
            continue
        rest = statements[position + 1 :]
        if rest and _always_ends(statement.body, exit_type):
            statement.orelse = [*statement.orelse, *rest]
        elif rest and statement.orelse and _always_ends(statement.orelse, exit_type):
            statement.body = [*statement.body, *rest]
        else:
            rest = []
        statement.body = _merge_tails(statement.body, exit_type)
        statement.orelse = _merge_tails(statement.orelse, exit_type)
        if rest:
            break
    return out


def _tails(statements: list[ast.stmt], exit_type: type) -> list[ast.stmt]:
    """The exits that end a branch of the statements (the last statement, through nested ``if``s)."""
    if not statements:
        return []
    last = statements[-1]
    if isinstance(last, exit_type):
        return [last]
    if isinstance(last, ast.If):
        return _tails(last.body, exit_type) + _tails(last.orelse, exit_type)
    return []


def _tail_count(statements: list[ast.stmt], exit_type: type) -> int:
    return len(_tails(statements, exit_type))


def _strip_tails(statements: list[ast.stmt], exit_type: type, replace) -> list[ast.stmt]:
    """The statements with each tail exit replaced by ``replace(exit)`` (statements, or None: dropped)."""
    if not statements:
        return statements
    *head, last = statements
    if isinstance(last, exit_type):
        replacement = replace(last)
        out = [*head, *listed(replacement)] if replacement is not None else head
        return out or [ast.copy_location(ast.Pass(), last)]
    if isinstance(last, ast.If):
        last.body = _strip_tails(last.body, exit_type, replace)
        last.orelse = _strip_tails(last.orelse, exit_type, replace) if last.orelse else last.orelse
    return statements


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SCOPES_AND_LOOPS = (*_SCOPES, ast.For, ast.While)


def _count(statements: list[ast.stmt], kinds, loops_too: bool) -> int:
    """How many nodes of ``kinds`` the statements hold, not in nested functions or classes (nor in nested loops
    unless ``loops_too``: a ``continue`` there belongs to that loop)."""
    statements_only = all(issubclass(kind, ast.stmt) for kind in (kinds if isinstance(kinds, tuple) else (kinds,)))
    skipped = _SCOPES if loops_too else _SCOPES_AND_LOOPS
    return sum(isinstance(node, kinds) for node in _walk(statements, skipped, statements_only))


def _is_none(value: ast.expr | None) -> bool:
    return value is None or (isinstance(value, ast.Constant) and value.value is None)
