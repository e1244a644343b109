"""FlyDSL compiler: Fly MLIR dialect, lowering to PTX, and the CUDA launcher.

import flydsl.compiler as flyc
compiled = flyc.compile_mlir(mlir_text)            # PTX in process (+ cubin when ptxas is found)
if flyc.runtime.is_available():
    module = flyc.runtime.load(compiled)
    module.launch("kernel", grid, block, *args)
cfg = flyc.autotune.choose("op", key, configs, run)  # timed once per key, the winner kept on disk (flyc.autotune)
"""

from flydsl.compiler import autotune, runtime
from flydsl.compiler.args import TensorSpec, mark_static
from flydsl.compiler.attributes import KernelAttributes, set_kernel_attributes
from flydsl.compiler.compiled import CompiledModule
from flydsl.compiler.errors import CompilationError, FlyError, PerformanceWarning, ToolchainError
from flydsl.compiler.jit import CompiledKernel, JitFunction, compile, jit
from flydsl.compiler.kernel import KernelCall, KernelFunction, kernel
from flydsl.compiler.target import SM80, SM90A, Stage, Target
from flydsl.compiler.toolchain import assemble_ptx, find_ptxas

__version__ = "0.1.0"

# Imported on first use: the MLIR pipeline and context are the trace and compile path; a process that launches only
# kernels the disk cache holds never imports them (issue 31's cold start).
_LAZY = {"compile_mlir": "flydsl.compiler.pipeline", "make_context": "flydsl.compiler.context"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flydsl.compiler' has no attribute {name!r}")


__all__ = [
    "CompiledKernel",
    "TensorSpec",
    "autotune",
    "mark_static",
    "JitFunction",
    "KernelCall",
    "KernelFunction",
    "KernelAttributes",
    "set_kernel_attributes",
    "compile",
    "jit",
    "kernel",
    "CompilationError",
    "CompiledModule",
    "FlyError",
    "PerformanceWarning",
    "SM80",
    "SM90A",
    "Stage",
    "Target",
    "ToolchainError",
    "assemble_ptx",
    "compile_mlir",
    "find_ptxas",
    "make_context",
    "runtime",
]
