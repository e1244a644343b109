"""MLIR contexts that know the Fly dialect and passes."""

from __future__ import annotations

from mlir import ir

from flydsl.compiler import dialects as _dialects  # noqa: F401  (registers the op-builder search prefix)
from flydsl.compiler._native import native

__all__ = ["make_context"]

native.register_passes()


def make_context() -> ir.Context:
    """A new ``mlir.ir.Context`` with the upstream dialects and the Fly dialect loaded."""
    context = ir.Context()
    native.register_dialect(context)
    return context
