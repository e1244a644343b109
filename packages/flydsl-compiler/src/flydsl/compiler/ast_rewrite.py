"""Rewrites a kernel's Python control flow so that conditions and bounds known only at run time become ``scf`` ops.

Every ``for ... in range(...)``, ``if`` and ``while`` becomes a call to a helper in
:mod:`flydsl.compiler.control_flow` that receives the statement's body as a nested function. The helper decides at
trace time: Python values run the body as Python would (so static conditions cost nothing and behave exactly like
Python), FlyDSL values build ``scf.for`` / ``scf.if`` / ``scf.while``. The names a body assigns are passed in and
returned, which is how loop-carried and branch-result values are found without annotations.

Left as plain Python: ``range_constexpr`` loops, ``if const_expr(...)``, loops over anything but ``range``, and
statements whose body holds ``return``, ``break``, ``continue`` or ``yield`` (their condition must then be a
trace-time value; a dynamic one raises a clear error) once :mod:`ast_escapes` has folded the returns and continues
that end branches into ``else`` branches. The seed's explicit form
``for iv, state in range(a, b, s, init=[...]): ... results = yield [...]`` is rewritten too.

Line numbers and the file name are kept, so tracebacks point at the user's source; and every other statement runs
inside ``with __fly_cf.at_line(file, line):``, so the ops it builds carry the user's ``file:line`` as their MLIR
location (diagnostics of later stages point there too).
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import linecache
import textwrap
import types

from flydsl.compiler.ast_escapes import HELPERS, FoldLoopExits, fold_returns, listed, unfold_loop_else

__all__ = ["rewrite_function", "RewriteError"]


class RewriteError(SyntaxError):
    """A kernel uses a Python construct that cannot be traced; the message says which, ``filename`` and ``lineno``
    say where (the line in the file, as a SyntaxError's)."""

    def __init__(self, message: str, filename: str | None = None, line: int | None = None, text: str | None = None):
        where = f"{filename}:{line}: " if filename is not None else ""
        super().__init__(where + message, (filename, line, None, text))


class _Untraceable(RewriteError):
    """A function FlyDSL cannot read the definition of (no source, a lambda): called from a kernel, it runs as is."""


def _assigned_names(statements: list[ast.stmt]) -> list[str]:
    """Names bound by the statements, in first-binding order, not looking into nested functions or classes."""
    names: dict[str, None] = {}

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in statements:
        visit(statement)
    return [name for name in names if not name.startswith("__fly_")]


def _escape(statements: list[ast.stmt]) -> str | None:
    """The keyword of the first ``return``/``yield`` (at any depth) or ``break``/``continue`` that is not inside a loop
    of the statements' own, or None. (In a loop's body such a break leaves that loop; in an ``if``'s body it leaves an
    enclosing loop: either way the body cannot become a nested function.)"""

    def visit(node, in_inner_loop: bool) -> str | None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return None
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
            return "return" if isinstance(node, ast.Return) else "yield"
        if isinstance(node, (ast.Break, ast.Continue)) and not in_inner_loop:
            return "break" if isinstance(node, ast.Break) else "continue"
        inner = in_inner_loop or isinstance(node, (ast.For, ast.While))
        return next(filter(None, (visit(child, inner) for child in ast.iter_child_nodes(node))), None)

    return next(filter(None, (visit(statement, False) for statement in statements)), None)


def _arguments(names) -> ast.arguments:
    return ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=n) for n in names], kwonlyargs=[], kw_defaults=[], defaults=[]
    )


def _is_call_to(node: ast.expr, name: str) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == name) or (isinstance(func, ast.Attribute) and func.attr == name)


_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_STATEMENT_KINDS = (ast.stmt, ast.ExceptHandler, ast.match_case)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, filename: str, file_lines: list[str]):
        self._ids = itertools.count()
        self._filename, self._file_lines = filename, file_lines

    def _error(self, node: ast.AST, message: str) -> RewriteError:
        """An error at ``node``'s line of the file (``file_lines``: the file's lines up to the function's end)."""
        text = self._file_lines[node.lineno - 1].strip() if node.lineno <= len(self._file_lines) else None
        return RewriteError(message, self._filename, node.lineno, text)

    def _checked(self, test: ast.expr) -> ast.expr:
        """``__fly_cf.truth(test, "test")``: a condition that refuses objects which are not values."""
        call = ast.Call(func=self._helper("truth"), args=[test, ast.Constant(ast.unparse(test))], keywords=[])
        return ast.copy_location(call, test)

    def _trace_time(self, helper: str, value: ast.expr, escape: str, node: ast.AST) -> ast.expr:
        """``__fly_cf.<helper>(value, escape, line)``: the value of a statement holding ``escape``, which must be
        known at trace time (the helper says what to do otherwise)."""
        line = ast.Constant(node.lineno)
        return ast.copy_location(
            ast.Call(func=self._helper(helper), args=[value, ast.Constant(escape), line], keywords=[]), value
        )

    def generic_visit(self, node):
        # Only statements hold the loops and branches rewritten here: expressions (most of a tree) are not walked.
        for field in _STATEMENT_FIELDS:
            items = getattr(node, field, None)
            if isinstance(items, list) and items and isinstance(items[0], _STATEMENT_KINDS):
                visited = []
                for item in items:
                    result = self.visit(item)
                    if result is not None:
                        visited.extend(result if isinstance(result, list) else [result])
                setattr(node, field, visited)
        return node

    def visit(self, node):
        result = super().visit(node)
        # Generated statements take the position of the statement they replace (errors and locations point there).
        for statement in result if isinstance(result, list) else [result]:
            if statement is not node and isinstance(statement, ast.stmt):
                _locate_tree(statement, node)
        return result

    def _fresh(self, kind: str, node: ast.AST) -> str:
        return f"__fly_{kind}_{node.lineno}_{next(self._ids)}"

    @staticmethod
    def _helper(name: str) -> ast.expr:
        return ast.Attribute(value=ast.Name(id=HELPERS, ctx=ast.Load()), attr=name, ctx=ast.Load())

    @staticmethod
    def _names_tuple(names: list[str]) -> ast.expr:
        return ast.Tuple(elts=[ast.Constant(value=n) for n in names], ctx=ast.Load())

    def _current_values(self, names: list[str]) -> ast.expr:
        # __fly_cf.lookup(locals(), name) gives the value, or the UNDEFINED marker when the name is unbound.
        return ast.Tuple(
            elts=[
                ast.Call(
                    func=self._helper("lookup"),
                    args=[ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[]), ast.Constant(n)],
                    keywords=[],
                )
                for n in names
            ],
            ctx=ast.Load(),
        )

    def _function(self, name: str, params: list[str], body: list[ast.stmt], returns: list[str]) -> ast.FunctionDef:
        statements = list(body) + [
            ast.Return(value=ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in returns], ctx=ast.Load()))
        ]
        return ast.FunctionDef(
            name=name,
            args=_arguments(params),
            body=statements,
            decorator_list=[],
            returns=None,
            type_params=[],
        )

    def _assign_back(self, names: list[str], call: ast.expr) -> ast.stmt:
        if not names:
            return ast.Expr(value=call)
        target = ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store()) for n in names], ctx=ast.Store())
        return ast.Assign(targets=[target], value=call)

    # --- for ------------------------------------------------------------------------------------------------------
    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        if not (isinstance(node.iter, ast.Call) and _is_call_to(node.iter, "range")) or node.orelse:
            return node
        init = next((k for k in node.iter.keywords if k.arg == "init"), None)
        if init is not None:
            return self._explicit_for(node, init)
        escape = _escape(node.body)
        if escape is not None:  # a Python loop, whose range must be known at trace time
            bounds = ast.Tuple(elts=node.iter.args, ctx=ast.Load())
            node.iter = self._trace_time("trace_time_range", ast.copy_location(bounds, node.iter), escape, node)
            return node
        if not isinstance(node.target, ast.Name):
            return node
        names = [n for n in _assigned_names(node.body) if n != node.target.id]
        body = self._function(self._fresh("for", node), [node.target.id, *names], node.body, names)
        call = ast.Call(
            func=self._helper("for_range"),
            args=[
                ast.Tuple(elts=node.iter.args, ctx=ast.Load()),
                ast.Name(id=body.name, ctx=ast.Load()),
                self._names_tuple(names),
                self._current_values(names),
            ],
            keywords=[],
        )
        return [body, self._assign_back(names, call)]

    def _explicit_for(self, node: ast.For, init: ast.keyword):
        """``for iv, state in range(a, b, s, init=[...]): ...; results = yield [...]`` (the seed's form)."""
        target = node.target
        if not (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts)
        ):
            raise self._error(node, "`range(..., init=...)` loops take `for iv, state in ...`")
        yields = [
            (i, s)
            for i, s in enumerate(node.body)
            if isinstance(s, ast.Assign) and isinstance(s.value, ast.Yield) and len(s.targets) == 1
        ]
        if len(yields) != 1 or yields[0][0] != len(node.body) - 1:
            raise self._error(node, "a `range(..., init=...)` loop body must end with `results = yield [...]`")
        position, statement = yields[0]
        body_statements = node.body[:position] + [ast.Return(value=statement.value.value)]
        body = ast.FunctionDef(
            name=self._fresh("for", node),
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg=e.id) for e in target.elts],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=body_statements,
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        call = ast.Call(
            func=self._helper("for_range_explicit"),
            args=[ast.Tuple(elts=node.iter.args, ctx=ast.Load()), init.value, ast.Name(id=body.name, ctx=ast.Load())],
            keywords=[],
        )
        return [body, ast.Assign(targets=statement.targets, value=call)]

    # --- if -------------------------------------------------------------------------------------------------------
    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        if _is_call_to(node.test, "const_expr"):
            return node
        escape = _escape(node.body + node.orelse)
        if escape is not None:  # a Python `if`, whose condition must be known at trace time
            node.test = self._trace_time("trace_time_condition", node.test, escape, node)
            return node
        names = _assigned_names(node.body + node.orelse)
        then_fn = self._function(self._fresh("then", node), names, node.body, names)
        else_fn = self._function(self._fresh("else", node), names, node.orelse or [ast.Pass()], names)
        call = ast.Call(
            func=self._helper("if_else"),
            args=[
                self._checked(node.test),
                ast.Name(id=then_fn.name, ctx=ast.Load()),
                ast.Name(id=else_fn.name, ctx=ast.Load()),
                self._names_tuple(names),
                self._current_values(names),
            ],
            keywords=[],
        )
        return [then_fn, else_fn, self._assign_back(names, call)]

    # --- while ----------------------------------------------------------------------------------------------------
    def visit_While(self, node: ast.While):
        self.generic_visit(node)
        escape = _escape(node.body)
        if escape is not None:
            node.test = self._trace_time("trace_time_condition", node.test, escape, node)
        if node.orelse or escape is not None:
            return node
        names = _assigned_names(node.body)
        cond_fn = ast.FunctionDef(
            name=self._fresh("cond", node),
            args=ast.arguments(
                posonlyargs=[], args=[ast.arg(arg=n) for n in names], kwonlyargs=[], kw_defaults=[], defaults=[]
            ),
            body=[ast.Return(value=self._checked(node.test))],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        body_fn = self._function(self._fresh("while", node), names, node.body, names)
        lift = getattr(node, "_fly_lift", ())  # (a folded break's names: ast_escapes.FoldLoopExits)
        call = ast.Call(
            func=self._helper("while_loop"),
            args=[
                ast.Name(id=cond_fn.name, ctx=ast.Load()),
                ast.Name(id=body_fn.name, ctx=ast.Load()),
                self._names_tuple(names),
                self._current_values(names),
            ],
            keywords=[ast.keyword(arg="lift", value=self._names_tuple(list(lift)))] if lift else [],
        )
        return [cond_fn, body_fn, self._assign_back(names, call)]


def _locate_tree(tree: ast.AST, origin: ast.AST) -> None:
    """Gives ``origin``'s first line to every node of ``tree`` that has no position yet (only that line: a
    traceback through the generated call then shows the ``for``/``if``/``while`` line, not the block's last one,
    with its keyword underlined)."""
    keyword = {ast.For: 3, ast.If: 2, ast.While: 5}.get(type(origin), 1)
    for node in ast.walk(tree):
        if "lineno" in node._attributes and not hasattr(node, "lineno"):
            node.lineno, node.col_offset = origin.lineno, origin.col_offset
            node.end_lineno, node.end_col_offset = origin.lineno, origin.col_offset + keyword


class _ExplicitSuper(ast.NodeTransformer):
    """``super()`` -> ``super(__class__, self)`` in a method: its loops' and branches' bodies become nested functions,
    where the zero-argument form would find neither."""

    def __init__(self, first: str):
        self.first = first

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args and not node.keywords:
            node.args = [
                ast.copy_location(ast.Name(id="__class__", ctx=ast.Load()), node),
                ast.copy_location(ast.Name(id=self.first, ctx=ast.Load()), node),
            ]
        return node


class _CallRouter(ast.NodeTransformer):
    """``helper(...)`` -> ``__fly_cf.call(helper, ...)`` and ``x.method(...)`` -> ``__fly_cf.call_method(x.method,
    ...)``: user functions a kernel calls by name, and methods, get the same rewrite when they are called (so a
    helper's own ``if``/``for`` on kernel values becomes ``scf`` too)."""

    _KEEP = {"range", "range_constexpr", "const_expr", "locals", "isinstance", "len", "print", "super"}

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self._KEEP and not func.id.startswith("__fly_"):
            helper = "call"
        elif isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == HELPERS):
            helper = "call_method"
        else:
            return node
        routed = ast.Call(
            func=ast.Attribute(value=ast.Name(id=HELPERS, ctx=ast.Load()), attr=helper, ctx=ast.Load()),
            args=[func, *node.args],
            keywords=node.keywords,
        )
        return ast.copy_location(routed, node)


class _ValueChecks(ast.NodeTransformer):
    """Routes what Python would answer without looking at kernel values through helpers that refuse objects which are
    not values (an uncalled ``gpu.lane_id``): ``a == b`` / ``a != b`` -> ``__fly_cf.equal(a, b, "a == b")``, and the
    operands of ``and`` / ``or`` / ``not`` and conditional expressions -> ``__fly_cf.truth(x, "x")``."""

    @staticmethod
    def _call(name: str, args: list[ast.expr], node: ast.AST) -> ast.expr:
        helper = ast.Attribute(value=ast.Name(id=HELPERS, ctx=ast.Load()), attr=name, ctx=ast.Load())
        return ast.copy_location(ast.Call(func=helper, args=args, keywords=[]), node)

    def _truth(self, node: ast.expr, text: str) -> ast.expr:
        return self._call("truth", [node, ast.Constant(text)], node)

    # Each text is taken before the children are visited: the user's expression, not its rewrite.
    def visit_Compare(self, node: ast.Compare):
        text = ast.unparse(node)
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        name = "equal" if isinstance(node.ops[0], ast.Eq) else "not_equal"
        return self._call(name, [node.left, node.comparators[0], ast.Constant(text)], node)

    def visit_BoolOp(self, node: ast.BoolOp):
        texts = [ast.unparse(value) for value in node.values]
        self.generic_visit(node)
        node.values = [self._truth(value, text) for value, text in zip(node.values, texts, strict=True)]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp):
        text = ast.unparse(node.operand)
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._truth(node.operand, text)
        return node

    def visit_IfExp(self, node: ast.IfExp):
        text = ast.unparse(node.test)
        self.generic_visit(node)
        node.test = self._truth(node.test, text)
        return node


class _Expressions(_ValueChecks, _CallRouter):
    """Both expression rewrites in one walk of the tree (their visitors are of different node kinds, and each takes
    its text before its children are visited, so the result is the same as two walks')."""


_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.If, ast.With, ast.Try)


class _Locator(ast.NodeTransformer):
    """Wraps each simple statement in ``with __fly_cf.at_line(file, line):``."""

    def __init__(self, filename: str):
        self.filename = filename

    def _wrap_body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        wrapped = []
        for statement in body:
            self.visit(statement)
            if isinstance(statement, _COMPOUND) or isinstance(statement, (ast.Global, ast.Nonlocal, ast.Pass)):
                wrapped.append(statement)
                continue
            helpers = ast.Name(id=HELPERS, ctx=ast.Load())
            function = ast.Attribute(value=helpers, attr="at_line", ctx=ast.Load())
            arguments = [ast.Constant(self.filename), ast.Constant(statement.lineno)]
            location = ast.Call(func=function, args=arguments, keywords=[])
            block = ast.With(items=[ast.withitem(context_expr=location)], body=[statement])
            for node in (helpers, function, *arguments, location, block):  # at the statement's position
                ast.copy_location(node, statement)
            wrapped.append(block)
        return wrapped

    def generic_visit(self, node):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                setattr(node, field, self._wrap_body(statements))
        for child in ast.iter_child_nodes(node):  # (expressions hold no statements: only these can)
            if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                self.visit(child)
        return node


@functools.cache
def _rewrite_code(code: types.CodeType, source: str, filename: str, first_line: int):
    # Parsed below first_line - 1 empty lines, so that every node has its line in the file from the start (moving the
    # tree's lines afterwards walks it each time: a third of the rewrite's time).
    tree = ast.parse("\n" * (first_line - 1) + source)
    function = tree.body[0]
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise _Untraceable("expected a function definition", filename, first_line)
    function.decorator_list = []
    # (the exits' passes only where the source names them: most functions have a last `return` at most)
    if "else" in source and ("for" in source or "while" in source):
        function.body = unfold_loop_else(function.body)
    loop_returns = False
    if source.count("return") > 1 or (source.count("return") == 1 and not isinstance(function.body[-1], ast.Return)):
        loop_returns = fold_returns(function)
    if loop_returns or "break" in source or "continue" in source:
        exits = FoldLoopExits()
        function.body = [s for item in function.body for s in listed(exits.visit(item))]
    lines = [""] * (first_line - 1) + source.splitlines()
    function.body = [_Rewriter(filename, lines).visit(s) for s in function.body]
    function.body = [s for item in function.body for s in listed(item)]
    expressions = _Expressions()
    function.body = [expressions.visit(s) for s in function.body]
    # Statement positions must be final (the control-flow rewrite adds functions) before they get locations.
    ast.fix_missing_locations(function)
    _Locator(filename).generic_visit(function)
    # A factory whose parameters are the original free variables, so that they stay free in the rewritten code (its
    # code object is taken out of the factory and given the original cells: rewrite_function).
    freevars = list(code.co_freevars)
    if "__class__" in freevars and function.args.args:  # a method calling super() (its bodies now functions)
        _ExplicitSuper(function.args.args[0].arg).visit(function)
    factory = ast.FunctionDef(
        name="__fly_factory",
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg=v) for v in freevars], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=[function, ast.Return(value=ast.Name(id=function.name, ctx=ast.Load()))],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    for node in (factory, *factory.args.args, factory.body[1], factory.body[1].value):  # at the function's line
        ast.copy_location(node, function)
    return compile(ast.Module(body=[factory], type_ignores=[]), filename, "exec")


def _source_of(fn: types.FunctionType) -> tuple[list[str], int]:
    """The lines of ``fn``'s own code (a wrapper's, not the function it wraps) and the first one's number: its file's
    lines from ``co_firstlineno`` to the end of the block (``inspect.getsourcelines`` without its search of every
    module for the file's: most of its time)."""
    code = fn.__code__
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    if not lines or code.co_firstlineno > len(lines):
        raise _Untraceable(f"cannot read the source of {fn.__qualname__} to trace it (no lines of {code.co_filename})")
    return _indented_block(lines, code.co_firstlineno - 1, code.co_name), code.co_firstlineno


def _indented_block(lines: list[str], start: int, name: str) -> list[str] | None:
    """The lines of the definition of ``name`` starting at ``lines[start]`` (its decorators, then ``def``), up to the
    first code line indented no deeper than the ``def``: a scan of the text instead of ``inspect.getblock``'s
    tokenizer (a fifth of a rewrite's time); None where the first ``def`` is not ``name``'s (a lambda). A string or
    bracket continued at the left margin ends it early; the parse of the lines then fails and
    :func:`rewrite_function` reads the block with the tokenizer."""
    at = start
    while at < len(lines) and not lines[at].lstrip().startswith(("def ", "async def ")):
        at += 1
    named = lines[at].lstrip().removeprefix("async ").removeprefix("def ") if at < len(lines) else ""
    if not (named.startswith(name) and named[len(name) :].lstrip().startswith(("(", "["))):
        return None
    indent = len(lines[at]) - len(lines[at].lstrip())
    end = at + 1
    while end < len(lines):
        text = lines[end]
        stripped = text.strip()
        if stripped and not stripped.startswith("#") and len(text) - len(text.lstrip()) <= indent:
            break
        end += 1
    return lines[start:end]


def rewrite_function(fn: types.FunctionType) -> types.FunctionType:
    """The same function with its control flow routed through the tracing helpers (cached per code object)."""
    source_lines, first_line = _source_of(fn)
    filename = fn.__code__.co_filename
    try:
        if source_lines is None:
            raise SyntaxError("no definition found by the scan")
        code = _rewrite_code(fn.__code__, textwrap.dedent("".join(source_lines)), filename, first_line)
    except SyntaxError as error:  # the scan cut a string or bracket short (or found no def): the tokenizer's block
        if isinstance(error, RewriteError):
            raise
        block = inspect.getblock(linecache.getlines(filename, fn.__globals__)[first_line - 1 :])
        code = _rewrite_code(fn.__code__, textwrap.dedent("".join(block)), filename, first_line)
    from flydsl.compiler import control_flow

    # fn's own module namespace, live (a copy would freeze the module's globals at the first trace: a tuning constant
    # set later, or a helper rebound, would not be seen), with the helpers' dunder name added to it: the one trace of
    # the rewrite left in a module that a kernel called into.
    namespace = fn.__globals__
    if namespace.get(HELPERS) is not control_flow:
        namespace[HELPERS] = control_flow
    # The rewritten code object, made a function over fn's own closure cells (live, and possibly still empty: a
    # nested helper naming a variable its enclosing function binds later or on one path only).
    (factory,) = (c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == "__fly_factory")
    inner = [c for c in factory.co_consts if isinstance(c, types.CodeType) and c.co_name == fn.__code__.co_name]
    if len(inner) != 1:  # the source read is not this code's (a wrapper whose source is another function's)
        raise _Untraceable(f"the source read for {fn.__qualname__} is not its code's")
    (inner,) = inner
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    closure = tuple(cells.get(name) or types.CellType() for name in inner.co_freevars)
    rewritten = types.FunctionType(inner, namespace, fn.__name__, fn.__defaults__, closure)
    rewritten.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    rewritten.__annotations__ = dict(fn.__annotations__)
    rewritten.__qualname__ = fn.__qualname__
    rewritten.__wrapped__ = fn
    rewritten.__fly_rewritten__ = True
    return rewritten
