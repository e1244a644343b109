"""Tracebacks that point at the user's code: ``user_traceback(tb)`` drops FlyDSL's and MLIR's own frames.

(MLIR locations of the user's lines come from the AST rewrite, see :mod:`ast_rewrite`.)
"""

from __future__ import annotations

import linecache
import os
import sys
import types
import warnings

import mlir

__all__ = ["user_traceback", "is_internal_file", "user_source_line", "warn_at_user_code"]

_INTERNAL_ROOTS = tuple(
    os.path.dirname(os.path.abspath(path))
    for path in (
        __file__,  # flydsl/compiler
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "expr", "__init__.py"),
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "layout", "__init__.py"),
    )
) + tuple(
    os.path.abspath(path) + os.sep for path in mlir.__path__  # a namespace package: importing it loads no library
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


def user_source_line() -> str | None:
    """The source line of the innermost caller outside FlyDSL and MLIR (the kernel statement being traced), stripped;
    None when there is none or its file cannot be read."""
    frame = sys._getframe(1)
    while frame is not None and is_internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() or None


def warn_at_user_code(message: str, category: type[Warning] = UserWarning) -> None:
    """Warns, attributed to the first caller outside FlyDSL (the user's line that compiled or launched a kernel,
    however deep in FlyDSL the warning arose)."""
    frame, level = sys._getframe(1), 2  # level 2: this function's caller
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "flydsl":
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
