"""Loading compiled modules and launching their kernels through the native CUDA launcher.

The launcher lives in the native extension (``_fly.runtime``): it is the one launch path of FlyDSL. Importing this
module works without a GPU; ``is_available()`` says whether one can be used.
"""

from __future__ import annotations

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
            known = sorted(self._functions)
            raise KeyError(f"kernel {kernel!r} is not in module '{self.compiled.name}'; it has {known}") from None

    def launch(self, kernel: str, grid, block, *args, shared_mem: int = 0, stream: int = 0, cluster=None) -> None:
        """Launches ``kernel`` on ``grid`` x ``block`` with ``args`` (pointers: ints, DeviceBuffers, torch tensors)."""
        function = self.function(kernel)
        # grid/block/cluster: an int or 1-3 ints; checked natively along with the arguments.
        function.launch(grid, block, self.compiled.kernels[kernel], args, shared_mem, stream, cluster)


def load(compiled: CompiledModule) -> LoadedModule:
    """Loads ``compiled`` (its cubin, else its PTX) on the current CUDA context."""
    return LoadedModule(compiled)
