"""Exceptions raised by the compiler."""

from __future__ import annotations

__all__ = ["FlyError", "CompilationError", "ToolchainError"]


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
