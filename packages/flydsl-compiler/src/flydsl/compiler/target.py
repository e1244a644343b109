"""Compilation targets. A target backend declares its pipeline as named stages."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Stage", "Target", "SM90A", "SM80"]

# The last stage writes an ISA artifact instead of IR.
ISA_STAGE = "ptx"

# Shared memory one block may use (the opt-in maximum of CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), by chip
# without its "a" suffix (CUDA C Programming Guide, "Compute Capabilities"); 48 KiB, every GPU's default, elsewhere.
_SHARED_BYTES_PER_BLOCK = {
    "sm_70": 96 * 1024,
    "sm_72": 96 * 1024,
    "sm_75": 64 * 1024,
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_87": 163 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
    "sm_100": 227 * 1024,
    "sm_120": 99 * 1024,
}


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: ``passes`` is a pass pipeline anchored on ``builtin.module``."""

    name: str
    passes: str
    description: str


@dataclass(frozen=True)
class Target:
    """An NVIDIA GPU: ``chip`` like ``sm_90a``; ``ptx_version`` as PTX ISA major*10+minor (80 = 8.0)."""

    chip: str = "sm_90a"
    ptx_version: int = 80
    opt_level: int = 3

    def __post_init__(self):
        if not re.fullmatch(r"sm_\d{2,3}a?", self.chip):
            raise ValueError(f"Target.chip: expected a name like 'sm_90a' or 'sm_80', got {self.chip!r}")
        if not 60 <= self.ptx_version <= 99:
            raise ValueError(f"Target.ptx_version: expected 60..99 (e.g. 80 for PTX ISA 8.0), got {self.ptx_version}")
        if self.opt_level not in (0, 1, 2, 3):
            raise ValueError(f"Target.opt_level: expected 0..3, got {self.opt_level}")

    @property
    def shared_bytes_per_block(self) -> int:
        """The most shared memory one block of a kernel compiled for this chip may use."""
        return _SHARED_BYTES_PER_BLOCK.get(self.chip.removesuffix("a"), 48 * 1024)

    @property
    def arch(self) -> str:
        """The ``-arch`` argument of ptxas."""
        return self.chip

    @property
    def attribute(self) -> str:
        """The ``#nvvm.target`` attribute that ``gpu.module`` ops are compiled for."""
        return f'#nvvm.target<O = {self.opt_level}, chip = "{self.chip}", features = "+ptx{self.ptx_version}">'

    def stages(self) -> tuple[Stage, ...]:
        """Fly lowering -> GPU to NVVM/LLVM -> PTX (cubin comes after, from ptxas or the driver)."""
        to_llvm = ",".join(
            [
                "convert-nvgpu-to-nvvm",
                "expand-strided-metadata",
                "convert-scf-to-cf",
                "convert-gpu-to-nvvm",
                "convert-nvvm-to-llvm",
                "convert-arith-to-llvm",
                "convert-index-to-llvm",
                "canonicalize",
                "cse",
            ]
        )
        return (
            Stage("fly", "gpu.module(fly-lower-smem,fly-lower-tensors,fly-lower-layouts)", "Fly ops to llvm/arith"),
            Stage("llvm", f"gpu.module({to_llvm}),convert-cf-to-llvm,reconcile-unrealized-casts", "GPU to NVVM/LLVM"),
            Stage(ISA_STAGE, "gpu-module-to-binary{format=isa}", "LLVM NVPTX backend, in process"),
        )


SM90A = Target("sm_90a")
SM80 = Target("sm_80")
