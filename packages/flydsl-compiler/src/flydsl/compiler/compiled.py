"""What a compile produces (:class:`CompiledModule`), apart from the pipeline that makes it: the kernel cache and the
runtime load modules from disk without importing the MLIR pipeline (a cached kernel's launch needs none of it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flydsl.compiler.target import Target

__all__ = ["CompiledModule"]


@dataclass(frozen=True)
class CompiledModule:
    """The result of a compile: PTX, the cubin when ptxas ran, each kernel's launch signature and the dynamic
    shared memory its ``fly.alloc_smem`` buffers need (a launch's default)."""

    name: str
    target: Target
    ptx: str
    cubin: bytes | None
    kernels: dict[str, str]
    shared_bytes: dict[str, int] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict, repr=False)
    # The block and cluster shapes compiled into each kernel (``.reqntid``, ``.reqnctapercluster``; None where
    # free), from ``@kernel(...)`` or ``set_kernel_attributes``: launches with others are refused.
    launch_shapes: dict[str, tuple] = field(default_factory=dict)
    # ptxas's "Potential Performance Loss" notes (warned as PerformanceWarning when compiled, and again when the
    # module comes back from the disk cache).
    performance_notes: tuple[str, ...] = ()
    # The disk-cache entry it was read from or written to (None: not cached on disk); runtime.origin() names it for
    # each loaded kernel, so that a launch plan kept on disk can load the module again (flydsl.kernels.plan_cache).
    cache_key: str | None = field(default=None, compare=False, repr=False)

    @property
    def image(self) -> bytes:
        """What the driver loads: the cubin, else the PTX (JIT-compiled by the driver)."""
        return self.cubin if self.cubin is not None else self.ptx.encode()
