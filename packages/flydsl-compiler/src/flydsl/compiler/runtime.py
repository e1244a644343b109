"""Loading compiled modules and launching their kernels through the native CUDA launcher.

The launcher lives in the native extension ``_runtime``: it is the one launch path of FlyDSL. Importing this
module works without a GPU; ``is_available()`` says whether one can be used.
"""

from __future__ import annotations

from flydsl.compiler._native import launcher as _rt
from flydsl.compiler.compiled import CompiledModule

__all__ = [
    "CudaError",
    "DeviceBuffer",
    "LoadedModule",
    "TensorMap",
    "is_available",
    "require_gpu",
    "device_count",
    "device_name",
    "device_attribute",
    "driver_version",
    "synchronize",
    "load",
    "origin",
]

CudaError = _rt.CudaError
DeviceBuffer = _rt.DeviceBuffer
TensorMap = _rt.TensorMap
device_attribute = _rt.device_attribute
driver_version = _rt.driver_version
is_available = _rt.is_available
device_count = _rt.device_count
device_name = _rt.device_name
synchronize = _rt.synchronize


def require_gpu(what: str, lower: str) -> None:
    """Raises where no GPU can be used, saying that ``what`` compiles but cannot load or launch here, and how to
    compile without a GPU (``lower``: the call that does); the driver's own error would not say."""
    if not is_available():
        raise RuntimeError(
            f"{what}: no usable NVIDIA GPU here (no CUDA driver or device), so it can be compiled but not loaded or"
            " launched (flyc.compile and launch do both). To compile without a GPU, describe each tensor with"
            f" flyc.TensorSpec(shape, dtype) and call {lower}: it returns the PTX, the cubin and the launch signature"
        )


class LoadedModule:
    """A compiled module loaded on the current CUDA context; ``launch`` runs one of its kernels."""

    def __init__(self, compiled: CompiledModule):
        self.compiled = compiled
        self._module = _rt.Module(compiled.image)
        # Per kernel, what every launch needs: looked up once here, not on each launch.
        self._kernels = {
            name: (self._module.function(name), signature, compiled.shared_bytes.get(name, 0))
            for name, signature in compiled.kernels.items()
        }
        if compiled.cache_key is not None:
            for function, _, _ in self._kernels.values():
                _ORIGINS[function.handle] = compiled.cache_key

    def function(self, kernel: str):
        """The native function handle of ``kernel`` (register count, launch)."""
        return self._entry(kernel)[0]

    def _entry(self, kernel: str):
        try:
            return self._kernels[kernel]
        except KeyError:
            known = sorted(self._kernels)
            raise KeyError(f"kernel {kernel!r} is not in module '{self.compiled.name}'; it has {known}") from None

    def launch(self, kernel: str, grid, block, *args, shared_mem: int | None = None, stream=0, cluster=None) -> None:
        """Launches ``kernel`` on ``grid`` x ``block`` with ``args`` (pointers: ints, DeviceBuffers, torch tensors).

        ``shared_mem`` defaults to what the kernel's ``fly.alloc_smem`` buffers need; ``grid``, ``block`` and
        ``cluster`` are an int or 1-3 ints, checked natively along with the arguments.
        """
        function, signature, needed = self._entry(kernel)
        if shared_mem is None:
            shared_mem = needed
        elif shared_mem < needed:
            raise ValueError(
                f"shared_mem: kernel {kernel!r} needs at least {needed} bytes of dynamic shared memory for its"
                f" fly.alloc_smem buffers, got {shared_mem}"
            )
        function.launch(grid, block, signature, args, shared_mem, stream, cluster)


def load(compiled: CompiledModule) -> LoadedModule:
    """Loads ``compiled`` (its cubin, else its PTX) on the current CUDA context."""
    return LoadedModule(compiled)


_ORIGINS: dict[int, str] = {}  # a loaded kernel's CUfunction -> the disk-cache entry of its module


def origin(function) -> str | None:
    """The disk-cache entry of the module ``function`` (a loaded kernel's ``Function``) was loaded from, or None."""
    return _ORIGINS.get(function.handle)
