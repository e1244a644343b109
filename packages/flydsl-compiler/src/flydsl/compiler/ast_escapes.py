"""Early exits folded into branches, before a kernel's control flow is rewritten (see :mod:`ast_rewrite`).

MLIR's ``scf.if`` has no early exit, so a ``return`` under a condition known only when the kernel runs cannot be
traced as it is written. The most common guard, ``if i >= n: return`` and the rest of the body after it, says the
same as ``if i >= n: pass`` / ``else: <the rest>``, which can. This pass rewrites the statements that way before
:mod:`ast_rewrite` sees them, and the same for ``continue`` in loops that stay Python (``range_constexpr`` and loops
over other iterables):

- the statements after an ``if`` one of whose branches always ends in the exit move into its other branch;
- where every exit of the function (or loop body) now ends a branch, the exits become plain ends of those branches:
  a bare ``return`` (or ``continue``) goes, and ``return value`` on every path becomes ``_fly_returned = value`` with
  one ``return _fly_returned`` at the end (a value of each branch of a traced ``scf.if``, so their types must agree).

Python runs the folded statements exactly as the original ones, so trace-time conditions behave as before. Exits
left elsewhere (inside loops, ``with`` or ``try``) are not folded, and a dynamic condition over them still raises the
error that says what to do.
"""

from __future__ import annotations

import ast

RESULT = "_fly_returned"  # (not "__fly_": those names are never carried out of a branch)


def fold_returns(function: ast.FunctionDef) -> None:
    """``function``'s body with its early returns folded into branches (in place), where every return can be."""
    if _count(function.body, (ast.Yield, ast.YieldFrom, ast.Await), loops_too=True):
        return
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


class FoldContinues(ast.NodeTransformer):
    """``continue`` folded into branches in the loops that stay Python (``range`` loops are traced whole, so
    folding theirs would turn an unrolled loop into an ``scf.for``)."""

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        iterator = node.iter
        is_range = isinstance(iterator, ast.Call) and (
            (isinstance(iterator.func, ast.Name) and iterator.func.id == "range")
            or (isinstance(iterator.func, ast.Attribute) and iterator.func.attr == "range")
        )
        if not is_range and not node.orelse:
            body = _merge_tails(node.body, ast.Continue)
            continues = _count(body, ast.Continue, loops_too=False)
            if continues and continues == _tail_count(body, ast.Continue):
                body = _strip_tails(body, ast.Continue, lambda c: None)
            node.body = body
        return node


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
    """The statements with each tail exit replaced by ``replace(exit)`` (a statement, or None: dropped)."""
    if not statements:
        return statements
    *head, last = statements
    if isinstance(last, exit_type):
        replacement = replace(last)
        out = [*head, replacement] if replacement is not None else head
        return out or [ast.copy_location(ast.Pass(), last)]
    if isinstance(last, ast.If):
        last.body = _strip_tails(last.body, exit_type, replace)
        last.orelse = _strip_tails(last.orelse, exit_type, replace) if last.orelse else last.orelse
    return statements


def _count(statements: list[ast.stmt], kinds, loops_too: bool) -> int:
    """How many nodes of ``kinds`` the statements hold, not in nested functions or classes (nor in nested
    loops unless ``loops_too``: a ``continue`` there belongs to that loop)."""

    def visit(node) -> int:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return 0
        if not loops_too and isinstance(node, (ast.For, ast.While)):
            return 0
        return isinstance(node, kinds) + sum(visit(child) for child in ast.iter_child_nodes(node))

    return sum(visit(statement) for statement in statements)


def _is_none(value: ast.expr | None) -> bool:
    return value is None or (isinstance(value, ast.Constant) and value.value is None)
