"""Modules bound now and imported on first use: MLIR's Python bindings (and the libraries they load, ~100 ms) are needed
to trace and compile, never to launch a kernel that the disk cache holds."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

__all__ = ["LazyModule", "lazy_import"]

# One lock for every first import: threads that trace their first kernels at once wait for one import instead of
# seeing a half-executed module (importlib.util.LazyLoader's failure before Python 3.12.3: "module 'mlir.ir' has
# no attribute 'Context'").
_lock = threading.RLock()


class LazyModule(types.ModuleType):
    """Stands for the module ``__name__`` until an attribute is read from it; then imports it (once, under a lock)
    and takes a copy of its namespace, so that later reads are plain attribute reads. ``sys.modules`` holds the real
    module, as any import does."""

    def __getattr__(self, name: str):  # only for what the namespace does not hold: before the import, or never
        with _lock:
            namespace = self.__dict__
            module = namespace.get("_lazy_module")
            if module is None:
                module = importlib.import_module(self.__name__)
                namespace.update((key, value) for key, value in vars(module).items() if key != "__name__")
                namespace["_lazy_module"] = module
        return getattr(module, name)  # (the module's own __getattr__, if it has one, answers the rest)


def lazy_import(name: str) -> types.ModuleType:
    """The module ``name``, imported on its first attribute access (:class:`LazyModule`); the module itself where it
    is imported already. A module that does not exist raises ``ModuleNotFoundError`` now (its parent packages are
    imported to find it)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return LazyModule(name)
