"""``@jit`` host functions and ``compile``.

A ``@jit`` function runs as Python: it reads shapes, computes launch parameters and launches kernels
(``my_kernel(...).launch(...)``), each compiled on first use and cached. ``compile(fn, *example_args)`` compiles
ahead of the first real call.
"""

from __future__ import annotations

import functools

from flydsl.compiler.kernel import KernelFunction, register_loaded

__all__ = ["jit", "JitFunction", "compile", "CompiledKernel"]


class JitFunction:
    """A host function that launches kernels."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def jit(fn):
    """Decorates a host function that launches kernels (it runs as plain Python)."""
    return JitFunction(fn)


class CompiledKernel:
    """A kernel compiled for one specialization; calling it launches with the least host work: arguments are
    checked against that specialization (a different one raises instead of recompiling)."""

    def __init__(self, kernel: KernelFunction, example_args: tuple, example_kwargs: dict):
        self.kernel = kernel
        spec = kernel.specialize(kernel._bind(example_args, example_kwargs))
        self.key = spec.key
        self._loaded = loaded = kernel.loaded(spec)
        # Its own native dispatcher, holding this specialization only: others take the Python path (and raise).
        self._dispatcher = kernel.new_dispatcher()
        register_loaded(self._dispatcher, spec.key, loaded)
        self._dispatch = self._dispatcher.launch
        self._arity = len(kernel.params)

    def __call__(self, *args, grid, block, smem: int | None = None, stream=None, cluster=None, **kwargs):
        if not kwargs and len(args) == self._arity and self._dispatch(args, grid, block, smem, stream, cluster):
            return
        spec = self.kernel.specialize(self.kernel._bind(args, kwargs))
        if spec.key != self.key:
            raise TypeError(
                f"kernel '{self.kernel.name}' was compiled for {self.key}; these arguments need {spec.key}"
                " (call the kernel itself to compile other specializations)"
            )
        self.kernel.launch_specialized(self._loaded, spec, grid, block, smem, stream, cluster)


def compile(fn, *example_args, **example_kwargs):  # noqa: A001 - the public name of CuTe DSL and the seed
    """``compile(kernel, *args)`` compiles a kernel for these arguments' specialization and returns a
    :class:`CompiledKernel`; ``compile(jit_fn, *args)`` runs the host function once (launching its kernels, so
    compiling each) and returns it."""
    if isinstance(fn, KernelFunction):
        return CompiledKernel(fn, example_args, example_kwargs)
    if isinstance(fn, JitFunction):
        fn(*example_args, **example_kwargs)
        return fn
    raise TypeError(f"compile: expected a @flyc.kernel or @flyc.jit function, got {fn!r}")
