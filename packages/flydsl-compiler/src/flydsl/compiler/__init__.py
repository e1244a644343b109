"""FlyDSL compiler: Fly MLIR dialect, lowering to PTX, and the CUDA launcher.

import flydsl.compiler as flyc
compiled = flyc.compile_mlir(mlir_text)            # PTX in process (+ cubin when ptxas is found)
if flyc.runtime.is_available():
    module = flyc.runtime.load(compiled)
    module.launch("kernel", grid, block, *args)
cfg = flyc.autotune.choose("op", key, configs, run)  # timed once per key, the winner kept on disk (flyc.autotune)
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# Every name is imported on first use (PEP 562): a process that launches only what the disk cache holds imports the
# launcher and the cache, never the tracer, the DSL or the MLIR pipeline (issue 31's cold start). Name -> module, or
# (module, attribute).
_LAZY = {
    **{name: f"flydsl.compiler.{name}" for name in ("autotune", "cache", "runtime", "settings", "toolchain")},
    **{name: ("flydsl.compiler.args", name) for name in ("TensorSpec", "mark_static")},
    **{name: ("flydsl.compiler.attributes", name) for name in ("KernelAttributes", "set_kernel_attributes")},
    "CompiledModule": ("flydsl.compiler.compiled", "CompiledModule"),
    **{
        name: ("flydsl.compiler.errors", name)
        for name in ("CompilationError", "FlyError", "PerformanceWarning", "ToolchainError")
    },
    **{name: ("flydsl.compiler.jit", name) for name in ("CompiledKernel", "JitFunction", "compile", "jit")},
    **{name: ("flydsl.compiler.kernel", name) for name in ("KernelCall", "KernelFunction", "kernel")},
    **{name: ("flydsl.compiler.target", name) for name in ("SM80", "SM90A", "Stage", "Target")},
    **{name: ("flydsl.compiler.toolchain", name) for name in ("assemble_ptx", "find_ptxas")},
    "compile_mlir": ("flydsl.compiler.pipeline", "compile_mlir"),
    "make_context": ("flydsl.compiler.context", "make_context"),
}


class _Package(types.ModuleType):
    """This package's module: its submodules ``kernel`` and ``jit`` share their names with the decorators it exports,
    and an import of either submodule (which sets the package's attribute of that name) must not hide the decorator;
    the submodules stay reachable through ``sys.modules`` and ``from flydsl.compiler.kernel import ...``."""

    def __setattr__(self, name, value):
        if name in ("kernel", "jit") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'flydsl.compiler' has no attribute {name!r}")
    if isinstance(where, str):
        value = importlib.import_module(where)
    else:
        value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})


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
