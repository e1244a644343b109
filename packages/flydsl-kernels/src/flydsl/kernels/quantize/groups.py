"""The per-group fp8 quantizer's kernel (DeepSeek-V3's 1 x 128 activation scales): each 128-wide group of a row gets
its own scale, in one fused pass (one read of x, one write of the fp8 values and of the scales).

A group is one 16-byte chunk per thread of ``128 / vec`` threads (16 of a 16-bit dtype, 32 of float32): each thread
loads its chunk, the group's amax is a butterfly max over those threads' shuffles, each thread casts its own values
and stores them, and the group's first thread writes the scale. The groups of all rows are numbered row-major
(``row * ceil(N / 128) + group``); a CTA takes ``teams * unroll`` consecutive ones, ``teams`` at a step (consecutive
threads on consecutive 16 bytes: coalesced), all its loads issued before the first reduction (``unroll`` 16-byte
loads in flight per thread). The chunk accesses are the row kernels' (:mod:`flydsl.kernels.rows.tiles`, one chunk
per thread: a thread's place in its row is its chunk's index there), predicated past N and past the last row.
"""

from __future__ import annotations

from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.lazy import lazy_import
from flydsl.expr import arith, gpu
from flydsl.kernels.quantize.kernels import FP8_MAX, TINY
from flydsl.kernels.rows.layout import ROW_BYTES, RowConfig
from flydsl.kernels.rows.reduce import thread_reduce
from flydsl.kernels.rows.tiles import RowPosition, load_row_raw, store_row_fp8, widen

ir = lazy_import("mlir.ir")

__all__ = [
    "GROUP",
    "SMALLEST_NORMAL",
    "GroupConfig",
    "group_config",
    "group_scale",
    "power_of_two_up",
    "quantize_groups_kernel",
]

GROUP = 128  # columns per scale: the block-scaled GEMM's K block
SMALLEST_NORMAL = 2.0**-126  # a power-of-two scale of zeros divides by this instead: zeros stay zeros


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """The per-group kernel's compile-time choices, validated when built: ``dtype`` of x ("f32", "f16", "bf16"),
    ``even`` (N % vec == 0: whole-chunk predicates and 16-byte accesses), ``fmt`` ("e4m3" or "e5m2"),
    ``power_of_two`` (scales rounded up to powers of two), ``block`` threads per CTA and ``unroll`` groups per
    thread."""

    dtype: str
    even: bool
    fmt: str = "e4m3"
    power_of_two: bool = False
    block: int = 256
    unroll: int = 4

    def __post_init__(self):
        if self.dtype not in ROW_BYTES or self.fmt not in FP8_MAX:
            raise ValueError(f"GroupConfig: dtype must be f32, f16 or bf16 and fmt e4m3 or e5m2, got {self}")
        if self.block % 32 or not 32 <= self.block <= 1024 or not 1 <= self.unroll <= 16:
            raise ValueError(f"GroupConfig: block must be a multiple of 32 up to 1024 and unroll 1..16, got {self}")

    @property
    def vec(self) -> int:
        """Elements per 16-byte chunk (one per thread per group)."""
        return 16 // ROW_BYTES[self.dtype]

    @property
    def lanes(self) -> int:
        """Threads per group (a power of two up to a warp: the butterfly's width)."""
        return GROUP // self.vec

    @property
    def teams(self) -> int:
        """Groups a CTA works on at each step."""
        return self.block // self.lanes

    @property
    def groups_per_cta(self) -> int:
        return self.teams * self.unroll

    @property
    def row_layout(self) -> RowConfig:
        """The row kernels' layout of one chunk per thread (the loads and stores of :mod:`flydsl.kernels.rows`)."""
        return RowConfig(
            dtype=self.dtype,
            vec=self.vec,
            chunks=1,
            threads_per_row=self.lanes,
            rows_per_cta=self.teams,
            cluster=1,
            even=self.even,
        )

    def grid(self, rows: int, n: int) -> int:
        return -(-rows * -(-n // GROUP) // self.groups_per_cta)


def group_config(n: int, dtype: str, fmt: str = "e4m3", power_of_two: bool = False) -> GroupConfig:
    """The configuration for rows of ``n`` elements of ``dtype``: 256 threads, 4 groups each (64 bytes of loads in
    flight per thread)."""
    return GroupConfig(dtype=dtype, even=n % (16 // ROW_BYTES[dtype]) == 0, fmt=fmt, power_of_two=power_of_two)


def power_of_two_up(scale):
    """The smallest power of two >= ``scale`` (a non-negative Float32): its exponent bumped where any mantissa bit
    is set (UE8M0 scales); 0 stays 0, a subnormal becomes 2^-126, infinity and NaN stay."""
    i32 = ir.IntegerType.get_signless(32)
    bits = arith.bitcast(i32, scale)
    rounded = arith.bitcast(ir.F32Type.get(), (bits + 0x7FFFFF) & fx.Int32(-0x800000))
    return arith.select(scale != scale, scale, rounded)


def group_scale(values, cfg: GroupConfig):
    """``(scale, inverse)`` of a group from this thread's ``values`` (Float32, zeros past N): ``amax * (1 /
    fp8_max)`` and the factor the values are cast with, ``fp8_max / max(amax, TINY)`` (a group of zeros: scale 0
    and a finite factor, so zeros stay zeros; NaN in the group: both NaN); with ``cfg.power_of_two`` the scale
    rounded up to a power of two and its exact inverse."""
    magnitudes = [arith.maximum(v, 0.0 - v) for v in values]  # |v|, NaN kept
    amax = gpu.warp_reduce(thread_reduce(magnitudes, "max"), "max", width=cfg.lanes)
    fp8_max = FP8_MAX[cfg.fmt]
    scale = amax * (1.0 / fp8_max)  # as the row kernel's (and torch's amax / fp8_max on CUDA)
    if fx.const_expr(cfg.power_of_two):
        scale = power_of_two_up(scale)
        return scale, 1.0 / arith.maximum(scale, SMALLEST_NORMAL)  # exact: a power of two's inverse
    return scale, fp8_max / arith.maximum(amax, TINY)


@flyc.kernel
def quantize_groups_kernel(x: fx.Tensor, out: fx.Tensor, scales: fx.Tensor, cfg: fx.Constexpr[GroupConfig]):
    """``out`` (rows, N) bytes (the fp8 tensor viewed as uint8) of ``x`` (rows, N) float32/f16/bf16, cast per
    128-wide group with ``scales[row, group]`` (a float32 (rows, ceil(N / 128)) tensor of any strides: written
    through them)."""
    flyc.set_kernel_attributes(threads=cfg.block)
    rows, n = x.shape
    groups = ((n + (GROUP - 1)) // GROUP).to(fx.Int32)  # 32-bit divisions below (the plan checks the count)
    layout = cfg.row_layout
    tid = gpu.thread_idx.x
    lane = tid % cfg.lanes
    team = tid // cfg.lanes
    first = gpu.block_idx.x * cfg.groups_per_cta + team
    places, columns = [], []
    for u in fx.range_constexpr(cfg.unroll):
        task = first + u * cfg.teams  # (rows x groups) row-major: past the last row when past the end
        row = task // groups
        group = task - row * groups
        leader = (lane == 0) & (row < rows)
        places.append(
            RowPosition(tid=tid, lane=group * cfg.lanes + lane, row_in_cta=team, rank=0, row=row, leader=leader)
        )
        columns.append(group)
    loaded = [load_row_raw(layout, x, pos, n, rows)[0] for pos in places]  # (vec,) each, all loads issued first
    for pos, group, chunk in zip(places, columns, loaded, strict=True):
        values = widen([chunk])
        scale, inverse = group_scale(values, cfg)
        store_row_fp8(layout, out, pos, n, rows, [v * inverse for v in values], cfg.fmt)
        if pos.leader:
            scales[pos.row, group] = scale
