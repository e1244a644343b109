"""Modules bound now and loaded on first use: MLIR's Python bindings (and the libraries they load, ~100 ms) are needed
to trace and compile, never to launch a kernel that the disk cache holds."""

from __future__ import annotations

import importlib.util
import sys
import types

__all__ = ["lazy_import"]


def lazy_import(name: str) -> types.ModuleType:
    """The module ``name``, imported on its first attribute access (``importlib.util.LazyLoader``); the module itself
    where it is imported already. Its parent packages are imported now."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:  # as the import statement does: `import mlir.ir` then finds `mlir.ir`
        setattr(sys.modules[parent], child, module)
    return module
