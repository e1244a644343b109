"""NVIDIA intrinsics for kernels: thin wrappers over ``mlir.dialects.nvvm`` (inline PTX only where MLIR 22 has no op).

Values in and out are FlyDSL numerics and :class:`~flydsl.expr.vector.Vector` values; fragments of warp-wide
instructions (``ldmatrix``, ``mma_sync``) are ``Int32``/``Float32`` vectors, so they can be carried through loops.
Instructions that take an address accept a raw ``!llvm.ptr`` value or a ``Tensor`` (the address of its element at
``coord``, see :func:`address`: a ``fly.element_address``, so any Fly tensor works, ``fx.SmemAllocator`` buffers
included).

Every function links its section of the PTX ISA (https://docs.nvidia.com/cuda/parallel-thread-execution/). The
modules: ``convert`` (special functions, conversions), ``warp`` (warp- and CTA-level instructions, matrix
fragments), ``memory`` (loads, stores, flags, asynchronous copies, fences).
"""

from flydsl.expr.nvvm._common import address, byte_offset
from flydsl.expr.nvvm.convert import (
    cvt_e4m3x4_to_f16x2,
    cvt_f32x2_to_fp8x2,
    cvt_fp8x2_to_f32x2,
    ex2_approx,
    pack_f32x2,
    prmt,
    rcp_approx,
    unpack_e4m3x4,
)
from flydsl.expr.nvvm.memory import (
    atom_add_acq_rel,
    atom_add_relaxed,
    cp_async,
    cp_async_bulk,
    cp_async_commit_group,
    cp_async_wait_group,
    create_policy,
    fence_proxy_async,
    ld_acquire,
    ld_global,
    ld_global_nc,
    ld_shared,
    prefetch_l2_bulk,
    red_add_release,
    red_max_relaxed,
    st_global,
)
from flydsl.expr.nvvm.warp import (
    barrier,
    barrier_arrive,
    elect_sync,
    globaltimer,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    ldmatrix,
    mma_sync,
    movmatrix_trans,
    setmaxnreg,
    shfl_sync,
    stmatrix,
    trap,
    vote_sync,
)

__all__ = [
    "ex2_approx",
    "rcp_approx",
    "cvt_f32x2_to_fp8x2",
    "red_max_relaxed",
    "cvt_fp8x2_to_f32x2",
    "cvt_e4m3x4_to_f16x2",
    "unpack_e4m3x4",
    "pack_f32x2",
    "prmt",
    "shfl_sync",
    "elect_sync",
    "globaltimer",
    "setmaxnreg",
    "barrier",
    "barrier_arrive",
    "ldmatrix",
    "stmatrix",
    "cp_async",
    "cp_async_commit_group",
    "cp_async_wait_group",
    "ld_global_nc",
    "ld_global",
    "ld_shared",
    "st_global",
    "create_policy",
    "atom_add_acq_rel",
    "atom_add_relaxed",
    "ld_acquire",
    "red_add_release",
    "mma_sync",
    "movmatrix_trans",
    "address",
    "byte_offset",
    "fence_proxy_async",
    "griddepcontrol_wait",
    "griddepcontrol_launch_dependents",
    "trap",
    "vote_sync",
    "cp_async_bulk",
    "prefetch_l2_bulk",
]
