"""Softmax over rows (:mod:`.api`: the public functions; :mod:`.kernels`: the kernels and their launch). The package
``flydsl.kernels`` re-exports :func:`softmax`, which then shadows this subpackage's name there: import its modules by
their full name (``from flydsl.kernels.softmax.kernels import ...``)."""

from flydsl.kernels.softmax.api import softmax, softmax_backward

__all__ = ["softmax", "softmax_backward"]
