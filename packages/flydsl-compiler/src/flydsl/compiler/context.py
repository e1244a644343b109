"""MLIR contexts that know the Fly dialect and passes."""

from __future__ import annotations

import importlib
import threading

from flydsl.compiler._native import dialect_extension
from flydsl.compiler.lazy import lazy_import

ir = lazy_import("mlir.ir")

__all__ = ["make_context"]


_lock = threading.Lock()
_native = None  # the dialect extension, once set up


def _dialect():
    """The dialect extension, its passes registered and the op builders' search prefix set, once, on the first
    context (threads making their first contexts at once wait for it): importing this module loads no MLIR library."""
    global _native
    if _native is None:
        with _lock:
            if _native is None:
                importlib.import_module("flydsl.compiler.dialects")  # registers the op-builder search prefix
                native = dialect_extension()
                native.register_passes()
                _native = native
    return _native


def make_context() -> ir.Context:
    """A new ``mlir.ir.Context`` with the upstream dialects and the Fly dialect loaded."""
    context = ir.Context()
    _dialect().register_dialect(context)
    return context
