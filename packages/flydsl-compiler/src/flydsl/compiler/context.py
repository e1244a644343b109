"""MLIR contexts that know the Fly dialect and passes."""

from __future__ import annotations

import functools
import importlib

from flydsl.compiler._native import dialect_extension
from flydsl.compiler.lazy import lazy_import

ir = lazy_import("mlir.ir")

__all__ = ["make_context"]


@functools.cache
def _dialect():
    """The dialect extension, its passes registered and the op builders' search prefix set, on the first context:
    importing this module loads no MLIR library."""
    importlib.import_module("flydsl.compiler.dialects")  # registers the op-builder search prefix
    native = dialect_extension()
    native.register_passes()
    return native


def make_context() -> ir.Context:
    """A new ``mlir.ir.Context`` with the upstream dialects and the Fly dialect loaded."""
    context = ir.Context()
    _dialect().register_dialect(context)
    return context
