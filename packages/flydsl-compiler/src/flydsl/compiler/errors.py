"""Exceptions raised by the compiler."""

from __future__ import annotations

__all__ = [
    "FlyError",
    "CompilationError",
    "PerformanceWarning",
    "ToolchainError",
    "format_mlir_error",
    "location_text",
]


class FlyError(Exception):
    """Base class of FlyDSL compiler errors."""


class CompilationError(FlyError):
    """A compile stage failed; ``stage`` names it and ``diagnostics`` holds MLIR's messages."""

    def __init__(self, stage: str, diagnostics: str):
        self.stage = stage
        self.diagnostics = diagnostics
        super().__init__(f"stage '{stage}' failed:\n{diagnostics}")


class ToolchainError(FlyError):
    """An external tool (ptxas) is missing or failed."""


class PerformanceWarning(UserWarning):
    """A kernel compiled, but a tool reported that it will run slower than its code asks for (ptxas's "Potential
    Performance Loss" notes, e.g. C7514: every ``wgmma`` of the kernel serialized). ``warnings.simplefilter("error",
    PerformanceWarning)`` turns them into errors, as this repository's tests do (tests/conftest.py)."""


def location_text(location, filename: str = "<input>") -> str:
    """``file:line:col`` of an ``mlir.ir.Location`` (MLIR calls a buffer parsed from a string "-")."""
    text = str(location).removeprefix("loc(").removesuffix(")")
    return text.replace('"-"', filename, 1).replace('"', "")


def format_mlir_error(error, filename: str = "<input>") -> str:
    """``file:line:col: error: message`` lines (with notes) for an ``mlir.ir.MLIRError``."""

    def where(location) -> str:
        return location_text(location, filename)

    lines = []
    for diagnostic in error.error_diagnostics:
        lines.append(f"{where(diagnostic.location)}: error: {diagnostic.message}")
        lines.extend(f"{where(note.location)}: note: {note.message}" for note in diagnostic.notes)
    return "\n".join(lines) or str(error)
