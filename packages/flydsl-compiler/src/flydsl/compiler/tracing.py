"""Tracebacks that point at the user's code: ``user_traceback(tb)`` drops FlyDSL's and MLIR's own frames.

(MLIR locations of the user's lines come from the AST rewrite, see :mod:`ast_rewrite`.)
"""

from __future__ import annotations

import os
import types

from mlir import ir

__all__ = ["user_traceback", "is_internal_file"]

_INTERNAL_ROOTS = tuple(
    os.path.dirname(os.path.abspath(path))
    for path in (
        __file__,  # flydsl/compiler
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "expr", "__init__.py"),
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "layout", "__init__.py"),
        ir.__file__,  # mlir
    )
)


def is_internal_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_INTERNAL_ROOTS) or filename.startswith("<frozen")


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without FlyDSL's and MLIR's frames (the last frame stays when every frame is internal)."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    kept = [f for f in frames if not is_internal_file(f.tb_frame.f_code.co_filename)] or frames[-1:]
    result = None
    for frame in reversed(kept):
        result = types.TracebackType(result, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return result
