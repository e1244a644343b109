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
from flydsl.compiler.context import make_context
from flydsl.compiler.errors import CompilationError, FlyError, PerformanceWarning, ToolchainError
from flydsl.compiler.jit import CompiledKernel, JitFunction, compile, jit
from flydsl.compiler.kernel import KernelCall, KernelFunction, kernel
from flydsl.compiler.pipeline import CompiledModule, compile_mlir
from flydsl.compiler.target import SM80, SM90A, Stage, Target
from flydsl.compiler.toolchain import assemble_ptx, find_ptxas

__version__ = "0.1.0"

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
