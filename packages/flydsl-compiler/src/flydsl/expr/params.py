"""Annotations of kernel parameters besides ``Tensor`` and the numeric types.

``n: Constexpr[int]`` is a trace-time value: part of the cache key, a Python value inside the kernel, not passed at
launch. ``stream: Stream`` takes the CUDA stream of the launch (an int handle, or an object with ``cuda_stream``).
"""

from __future__ import annotations

__all__ = ["Constexpr", "Stream", "const_expr", "range_constexpr"]


class _ConstexprAlias:
    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"Constexpr[{getattr(self.kind, '__name__', self.kind)}]"


class Constexpr:
    """``Constexpr[int]``: a value fixed when the kernel is traced."""

    def __class_getitem__(cls, kind):
        return _ConstexprAlias(kind)


class Stream:
    """The launch's CUDA stream (default: the current stream of the tensors' framework, else the legacy stream)."""


def const_expr(value):
    """Marks a condition as a trace-time value: ``if const_expr(n > 4):`` stays a Python ``if``."""
    return value


def range_constexpr(*args):
    """``range`` unrolled at trace time (the loop body is traced once per iteration)."""
    return range(*args)


def is_constexpr(annotation) -> bool:
    return annotation is Constexpr or isinstance(annotation, _ConstexprAlias)
