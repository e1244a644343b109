"""Loading compiled modules and launching their kernels through the native CUDA launcher.

The launcher lives in the native extension (``_fly.runtime``): it is the one launch path of FlyDSL. Importing this
module works without a GPU; ``is_available()`` says whether one can be used.
"""

from __future__ import annotations

from collections.abc import Sequence

from flydsl.compiler._native import native
from flydsl.compiler.pipeline import CompiledModule

__all__ = ["CudaError", "DeviceBuffer", "LoadedModule", "is_available", "device_count", "device_name", "synchronize"]

_rt = native.runtime
CudaError = _rt.CudaError
DeviceBuffer = _rt.DeviceBuffer
is_available = _rt.is_available
device_count = _rt.device_count
device_name = _rt.device_name
synchronize = _rt.synchronize


def _dim3(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) for d in dims):
        raise ValueError(f"{what}: expected an int or 1 to 3 ints, got {value!r}")
    return dims + (1,) * (3 - len(dims))


class LoadedModule:
    """A compiled module loaded on the current CUDA context; ``launch`` runs one of its kernels."""

    def __init__(self, compiled: CompiledModule):
        self.compiled = compiled
        self._module = _rt.Module(compiled.image)
        self._functions = {name: self._module.function(name) for name in compiled.kernels}

    def function(self, kernel: str):
        """The native function handle of ``kernel`` (register count, launch)."""
        try:
            return self._functions[kernel]
        except KeyError:
            raise KeyError(f"kernel {kernel!r} is not in module '{self.compiled.name}'; it has {sorted(self._functions)}")

    def launch(self, kernel: str, grid, block, *args, shared_mem: int = 0, stream: int = 0, cluster=None) -> None:
        """Launches ``kernel`` on ``grid`` x ``block`` with ``args`` (pointers: ints, DeviceBuffers, torch tensors)."""
        function = self.function(kernel)
        function.launch(
            _dim3(grid, "grid"),
            _dim3(block, "block"),
            self.compiled.kernels[kernel],
            args,
            shared_mem,
            stream,
            None if cluster is None else _dim3(cluster, "cluster"),
        )


def load(compiled: CompiledModule) -> LoadedModule:
    """Loads ``compiled`` (its cubin, else its PTX) on the current CUDA context."""
    return LoadedModule(compiled)
