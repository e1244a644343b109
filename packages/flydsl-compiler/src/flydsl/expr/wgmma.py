"""Hopper warpgroup MMA (``wgmma.mma_async``, sm_90a): shared-memory layouts, matrix descriptors, MMA atoms.

Both operands are (MN, K) views, as in CuTe: A is (M, K), B is (N, K), whichever of the two modes is contiguous in
memory (the operand's *major*). One instruction computes ``D (64 x N, fp32) = A (64 x K) @ B^T (K x N) [+ D]`` for
a warpgroup of 128 threads, with K = 16 (bf16/f16) or 32 (e4m3/e5m2); B comes from shared memory through a 64-bit
*matrix descriptor*, A from shared memory too (SS) or from registers (RS).

Layouts::

    atom = wgmma.layout_atom(fx.BFloat16, "K", 128)       # Sw<3,3,3> o 0 o (8,64):(64,1), 8 rows of 128 bytes
    s_a = wgmma.smem_layout(fx.BFloat16, (128, 64, 3), "K", 128)   # tile_to_shape of the atom: (M, K, stages)
    buf = smem.allocate(fx.BFloat16, s_a, alignment=wgmma.smem_alignment(s_a, fx.BFloat16))

Descriptors are derived from the layout of a shared-memory Tensor (:func:`make_descriptor`): the swizzle mode from
its swizzle, the leading/stride byte offsets by evaluating the layout, and every element of the instruction's
sub-tile is checked against the canonical layout those fields describe, so a layout wgmma cannot read is reported
at trace time. The MMA::

    atom = wgmma.MmaAtom(fx.BFloat16, n=128)               # m64n128k16, f32 += bf16 * bf16
    acc = atom.make_accumulator()                          # Float32 x 64 per thread (a Vector: loop-carried)
    acc = wgmma.fence(acc)
    a, b = wgmma.make_descriptor(s_a_stage, atom.a_shape), wgmma.make_descriptor(s_b_stage, atom.b_shape)
    for ks in fx.range_constexpr(4):
        acc = atom(a.at(0, ks * 16), b.at(0, ks * 16), acc, accumulate=(ks > 0) | keep)   # runtime flag
    wgmma.commit_group()
    acc = wgmma.wait_group(0, acc)
    atom.store_accumulator(acc, c_tile)                    # c_tile: a (64, N) view; converts to its dtype

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith as _arith
from mlir.dialects import llvm as _llvm
from mlir.dialects import nvvm as _nvvm
from mlir.dialects import vector as _vector

import flydsl.layout as _fl
from flydsl.expr.numeric import (
    BFloat16,
    Boolean,
    Float,
    Float8E4M3FN,
    Float8E5M2,
    Float16,
    Float32,
    Int32,
    Int64,
    Integer,
    Numeric,
    as_numeric,
)
from flydsl.expr.nvvm import address
from flydsl.expr.tensor import Tensor, local_tile
from flydsl.expr.vector import Vector, vector_class
from flydsl.expr.vector import store as _vector_store
from flydsl.layout.leaf import add as _leaf_add

__all__ = [
    "SWIZZLES",
    "layout_atom",
    "smem_layout",
    "smem_alignment",
    "DescriptorFormat",
    "descriptor_format",
    "MatrixDescriptor",
    "make_descriptor",
    "MmaAtom",
    "TiledMma",
    "fence",
    "commit_group",
    "wait_group",
    "fence_operands",
]

WARPGROUP_THREADS = 128
ATOM_M = 64
_K_BYTES = 32  # every wgmma reads 32 bytes of K per row: k16 for 16-bit types, k32 for 8-bit ones
_CORE_BYTES = 16  # a core matrix row: 16 contiguous bytes
SWIZZLES = (0, 32, 64, 128)  # bytes of one swizzled row; 0 is no swizzle (PTX "interleave": 8 x 16-byte cores)
_SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}  # Swizzle<bits, 4, 3> on byte offsets
_MODE_FIELD = {0: 0, 128: 1, 64: 2, 32: 3}  # descriptor bits 62-63
_FIELD_LIMIT = 1 << 18  # the 14-bit fields hold (bytes & 0x3FFFF) >> 4
_ADDRESS_MASK = 0x3FFFF
_MAJORS = ("K", "MN")


# --- element types ------------------------------------------------------------------------------------------------

_PTX_TYPES = {BFloat16: "bf16", Float16: "f16", Float8E4M3FN: "e4m3", Float8E5M2: "e5m2"}


def _element_bytes(dtype, what: str) -> int:
    width = getattr(dtype, "width", None)
    if not isinstance(dtype, type) or not issubclass(dtype, Numeric) or width not in (8, 16):
        raise TypeError(f"{what}: wgmma operands are 16-bit or 8-bit elements, got {dtype!r}")
    return width // 8


def _check_major(major: str, what: str) -> str:
    if major not in _MAJORS:
        raise ValueError(f"{what}: major must be 'K' or 'MN', got {major!r}")
    return major


# --- shared-memory layout atoms -------------------------------------------------------------------------------------


@functools.cache
def layout_atom(dtype, major: str = "K", swizzle: int = 128) -> _fl.ComposedLayout:
    """The smallest (MN, K) shared-memory layout of ``dtype`` elements that wgmma reads with ``swizzle`` (CuTe's
    ``GMMA::Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom``): 8 rows of ``swizzle`` bytes (16 bytes without swizzle)
    along the major mode, under ``Swizzle<bits, 4, 3>`` in bytes, recast to elements.

    >>> layout_atom(fx.BFloat16, "K", 128)        # 8 rows of 64 bf16; 16-byte chunks xor-ed with the row
    Sw<3,3,3> o 0 o (8,64):(64,1)
    >>> layout_atom(fx.BFloat16, "MN", 32)        # 8 K-rows of 16 contiguous M/N elements
    Sw<1,3,3> o 0 o (16,8):(1,16)
    """
    _check_major(major, "layout_atom")
    if swizzle not in _SWIZZLE_BITS:
        raise ValueError(f"layout_atom: swizzle must be one of {SWIZZLES} (bytes; 0 = none), got {swizzle!r}")
    element_bits = 8 * _element_bytes(dtype, "layout_atom")
    bits = _SWIZZLE_BITS[swizzle]
    row = _CORE_BYTES << bits
    rows = _fl.Layout((8, row), (row, 1)) if major == "K" else _fl.Layout((row, 8), (1, row))
    return _fl.recast_layout(element_bits, 8, _fl.ComposedLayout(_fl.Swizzle(bits, 4, 3), 0, rows))


def smem_layout(dtype, shape, major: str = "K", swizzle: int = 128, order=None) -> _fl.ComposedLayout:
    """``tile_to_shape`` of :func:`layout_atom` to ``shape`` = (MN, K) or (MN, K, stages); the atoms repeat along MN
    first, then K, then stages (``order`` as in ``flydsl.layout.tile_to_shape`` to choose otherwise).

    >>> smem_layout(fx.BFloat16, (128, 64, 2), "K", 128)
    Sw<3,3,3> o 0 o (128,64,2):(64,1,8192)
    """
    atom = layout_atom(dtype, major, swizzle)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if len(shape) not in (2, 3) or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"smem_layout: shape must be (MN, K) or (MN, K, stages) of positive ints, got {shape}")
    atom_shape = _fl.product_each(atom.shape)
    if shape[0] % atom_shape[0] or shape[1] % atom_shape[1]:
        raise ValueError(
            f"smem_layout: the {major}-major {swizzle or 'unswizzled'}{'B' if swizzle else ''} atom of"
            f" {dtype.__name__} covers {atom_shape}; shape {shape[:2]} is not a multiple of it"
        )
    return _fl.tile_to_shape(atom, shape, order)


def _swizzle_of(layout):
    """(swizzle, offset, inner) of a plain or swizzled layout."""
    if isinstance(layout, _fl.ComposedLayout):
        if not isinstance(layout.outer, _fl.Swizzle):
            raise ValueError(f"wgmma: a composed layout needs a swizzle as its outer function, got {layout}")
        return layout.outer, layout.offset, layout.inner
    if isinstance(layout, _fl.Layout):
        return _fl.Swizzle(0, 4, 3), 0, layout
    raise TypeError(f"wgmma: expected a flydsl.layout Layout or ComposedLayout, got {layout!r}")


def _byte_swizzle(sw: _fl.Swizzle, element_bytes: int, what: str) -> int:
    """The swizzle mode (0, 32, 64, 128) of ``sw`` acting on offsets of ``element_bytes``-byte elements."""
    if sw.bits == 0:
        return 0
    base = sw.base + element_bytes.bit_length() - 1
    if sw.bits > 3 or base != 4 or sw.shift != 3:
        in_bytes = f"Sw<{sw.bits},{base},{sw.shift}>"
        raise ValueError(
            f"{what}: swizzle {sw} on {8 * element_bytes}-bit elements is {in_bytes} on byte offsets; wgmma reads"
            " Sw<1,4,3> (32B), Sw<2,4,3> (64B), Sw<3,4,3> (128B) or no swizzle (use wgmma.layout_atom/smem_layout)"
        )
    return 16 << sw.bits


def smem_alignment(layout, dtype) -> int:
    """The byte alignment a shared buffer with ``layout`` needs: the swizzle's repeat (256, 512 or 1024 bytes: the
    hardware swizzles absolute addresses), else 128. Pass it to ``SmemAllocator.allocate(..., alignment=)``."""
    sw, _, _ = _swizzle_of(layout)
    swizzle = _byte_swizzle(sw, _element_bytes(dtype, "smem_alignment"), "smem_alignment")
    return max(128, 8 * swizzle)


# --- matrix descriptors ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DescriptorFormat:
    """The static fields of a wgmma matrix descriptor: the operand's major, swizzle (bytes; 0 = none) and its
    leading/stride dimension byte offsets (``None``: not used by this operand shape, encoded as 1 as the PTX ISA
    assumes), for an operand of ``shape`` = (MN, K) elements of ``element_bytes`` bytes.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor
    """

    major: str
    swizzle: int
    lbo: int | None
    sbo: int | None
    shape: tuple[int, int]
    element_bytes: int

    @property
    def high_bits(self) -> int:
        """Every field but the start address: LBO >> 4 in bits 16-29, SBO >> 4 in 32-45, base offset 0 in 49-51 (the
        buffer is aligned to the swizzle's repeat), swizzle mode in 62-63 (0 none, 1 128B, 2 64B, 3 32B)."""
        lbo = 1 if self.lbo is None else self.lbo >> 4
        sbo = 1 if self.sbo is None else self.sbo >> 4
        return (lbo << 16) | (sbo << 32) | (_MODE_FIELD[self.swizzle] << 62)

    def encode(self, start_address: int) -> int:
        """The 64-bit descriptor of the operand at shared address ``start_address`` (bytes)."""
        return ((start_address & _ADDRESS_MASK) >> 4) | self.high_bits

    @property
    def transposed(self) -> int:
        """wgmma's ``imm-trans`` operand: 1 for MN-major."""
        return int(self.major == "MN")


def _evaluate(inner: _fl.Layout, m: int, k: int) -> int:
    return _fl.crd2idx((m, k), inner.shape, inner.stride)


def descriptor_format(layout, dtype, shape, origin=(0, 0), major: str | None = None) -> DescriptorFormat:
    """The descriptor fields for the (MN, K) = ``shape`` sub-tile at ``origin`` of a static (MN, K) ``layout`` of
    ``dtype`` elements, or a ValueError saying why wgmma cannot read it.

    The swizzle mode comes from the layout's swizzle (in bytes). With ``e``-byte elements, ``b(m, k)`` the byte
    offset of element (m, k) relative to the origin, ``W`` the swizzle width (16 without swizzle) and ``T = 16 / e``:

    * K-major: ``b(m, k) = (m % 8) * W + (m // 8) * SBO + kb`` with ``kb = k * e`` (< 32); without swizzle the two
      16-byte halves of ``kb`` are ``LBO`` apart: ``+ (kb % 16) + (kb // 16) * LBO``. SBO = ``b(8, 0)``,
      LBO = ``b(0, T)`` (unused with a swizzle).
    * MN-major (16-bit only): with ``mb = m * e``, no swizzle: ``(mb % 16) + (k % 8) * 16 + (mb // 16) * SBO +
      (k // 8) * LBO``; swizzled: ``(mb % W) + (k % 8) * W + (mb // W) * LBO + (k // 8) * SBO``.

    Every element of the sub-tile is checked against that formula."""
    e = _element_bytes(dtype, "descriptor_format")
    sw, _, inner = _swizzle_of(layout)
    swizzle = _byte_swizzle(sw, e, "descriptor_format")
    mn, kk = shape
    if _fl.rank(inner) != 2 or not _fl.is_static(inner):
        raise ValueError(f"descriptor_format: expected a static (MN, K) layout, got {inner}")
    o_m, o_k = origin
    extent = _fl.product_each(inner.shape)
    if o_m + mn > extent[0] or o_k + kk > extent[1]:
        raise ValueError(
            f"descriptor_format: the {mn}x{kk} sub-tile at {origin} does not fit the (MN, K) = {extent} layout"
        )
    base = _evaluate(inner, o_m, o_k)

    def b(m, k):
        return (_evaluate(inner, o_m + m, o_k + k) - base) * e

    if major is None:
        if b(0, 1) == e:
            major = "K"
        elif b(1, 0) == e:
            major = "MN"
        else:
            raise ValueError(
                f"descriptor_format: neither K nor MN is contiguous in {layout} (steps of {b(1, 0)} and {b(0, 1)}"
                " bytes): wgmma reads 16-byte rows of one of them"
            )
    _check_major(major, "descriptor_format")
    if major == "MN" and e == 1:
        raise ValueError("descriptor_format: wgmma reads 8-bit operands K-major only (imm-trans needs 16-bit types)")
    width = swizzle or _CORE_BYTES
    chunk = _CORE_BYTES // e
    lbo = sbo = None
    if major == "K":
        sbo = b(8, 0) if mn > 8 else None
        if not swizzle:
            lbo = b(0, chunk)

        def canonical(m, k):
            kb = k * e
            along_k = kb if swizzle else kb % 16 + (kb // 16) * lbo
            return (m % 8) * width + (m // 8) * (sbo or 0) + along_k

    elif not swizzle:
        sbo = b(chunk, 0) if mn > chunk else None
        lbo = b(0, 8)

        def canonical(m, k):
            mb = m * e
            return mb % 16 + (k % 8) * 16 + (mb // 16) * (sbo or 0) + (k // 8) * lbo

    else:
        lbo = b(width // e, 0) if mn * e > width else None
        sbo = b(0, 8)

        def canonical(m, k):
            mb = m * e
            return mb % width + (k % 8) * width + (mb // width) * (lbo or 0) + (k // 8) * sbo

    what = f"the {mn}x{kk} sub-tile at {origin} of {layout} ({dtype.__name__}, {major}-major, swizzle {swizzle})"
    for name, value in (("LBO", lbo), ("SBO", sbo)):
        if value is not None and (value % 16 or not 0 <= value < _FIELD_LIMIT):
            raise ValueError(f"descriptor_format: {what}: {name} = {value} bytes is not a multiple of 16 in [0, 2^18)")
    for m in range(mn):
        for k in range(kk):
            got, expected = b(m, k), canonical(m, k)
            if got != expected:
                raise ValueError(
                    f"descriptor_format: {what} is not a layout wgmma can read: element ({m}, {k}) is at byte {got},"
                    f" the canonical layout (LBO={lbo}, SBO={sbo}) puts it at {expected}; build shared tiles with"
                    " wgmma.smem_layout"
                )
    return DescriptorFormat(major, swizzle, lbo, sbo, (mn, kk), e)


def _i64(value: int) -> ir.Value:
    """An i64 constant of these 64 bits (values from 2^63 up are written as negative numbers)."""
    value = value - (1 << 64) if value >= 1 << 63 else value
    return _arith.ConstantOp(ir.IntegerType.get_signless(64), value).result


class MatrixDescriptor:
    """A wgmma matrix descriptor (an ``Int64`` in ``value``) for the sub-tile at ``origin`` of a shared Tensor;
    :meth:`at` moves it to another sub-tile (e.g. the next K step) with one 64-bit add."""

    __slots__ = ("value", "format", "tensor", "origin", "_start")

    def __init__(self, value: Int64, fmt: DescriptorFormat, tensor: Tensor, origin=(0, 0), start=0):
        self.value, self.format, self.tensor, self.origin, self._start = value, fmt, tensor, origin, start

    def __repr__(self):
        return f"MatrixDescriptor({self.format}, origin={self.origin})"

    def at(self, mn: int, k: int) -> MatrixDescriptor:
        """The descriptor of the same-shaped sub-tile at (``mn``, ``k``) of the tensor (static offsets)."""
        if not isinstance(mn, int) or not isinstance(k, int):
            raise TypeError(f"MatrixDescriptor.at: offsets must be Python ints, got ({mn!r}, {k!r})")
        if (mn, k) == self.origin:
            return self
        fmt = descriptor_format(self.tensor.layout, self.tensor.dtype, self.format.shape, (mn, k), self.format.major)
        if fmt != self.format:
            raise ValueError(
                f"MatrixDescriptor.at({mn}, {k}): the sub-tile there has descriptor fields {fmt}, not {self.format}"
            )
        _, _, inner = _swizzle_of(self.tensor.layout)
        start = _evaluate(inner, mn, k) * fmt.element_bytes
        delta = start - self._start
        if delta % 16:
            raise ValueError(f"MatrixDescriptor.at({mn}, {k}): the sub-tile starts {delta} bytes away, not 16-aligned")
        value = Int64(_arith.addi(self.value.value, _i64(delta >> 4))) if delta else self.value
        return MatrixDescriptor(value, fmt, self.tensor, (mn, k), start)


def _divisor(x) -> int:
    if isinstance(x, int):
        return abs(x) if x else 1 << 30
    return max(1, _fl.known_divisor(x))


def make_descriptor(tensor: Tensor, shape, major: str | None = None) -> MatrixDescriptor:
    """The matrix descriptor of the (MN, K) = ``shape`` sub-tile at the origin of a shared-memory ``tensor`` view
    (rank 2: (MN, K); its layout static, its offset may be dynamic, e.g. a pipeline stage). Raises before anything
    runs when wgmma cannot read the layout or the buffer is not aligned to the swizzle's repeat."""
    if not isinstance(tensor, Tensor) or tensor.space != "shared":
        raise TypeError(f"make_descriptor: expected a shared-memory fx.Tensor, got {tensor!r}")
    fmt = descriptor_format(tensor.layout, tensor.dtype, tuple(shape), (0, 0), major)
    e = fmt.element_bytes
    required = 8 * fmt.swizzle if fmt.swizzle else _CORE_BYTES
    if tensor.alignment < required:
        raise ValueError(
            f"make_descriptor: the {fmt.swizzle}B-swizzled buffer must start on a {required}-byte boundary (the"
            f" hardware swizzles absolute addresses); this view is only known {tensor.alignment}-byte aligned:"
            " allocate it with alignment=wgmma.smem_alignment(layout, dtype)"
        )
    _, offset, inner = _swizzle_of(tensor.layout)
    if _divisor(offset) * e % _CORE_BYTES:
        raise ValueError(f"make_descriptor: the view's offset {offset} ({e}-byte elements) is not 16-byte aligned")
    # The start address is the unswizzled address of the origin, base + (offset + inner(0, 0)) elements: the hardware
    # applies the swizzle to the absolute addresses it computes from there, as the layout does to offsets.
    base = Tensor(
        tensor.pointer,
        _fl.Layout(1, 0),
        tensor.dtype,
        space="shared",
        alignment=tensor.base_alignment,
        offset=tensor.offset,
    )
    start = _llvm.ptrtoint(ir.IntegerType.get_signless(64), address(base))
    origin = _evaluate(inner, 0, 0)
    if isinstance(offset, int):
        if offset + origin:
            start = _arith.addi(start, _i64((offset + origin) * e))
    else:
        start = _arith.addi(start, (as_numeric(offset).to(Int64) * e + origin * e).value)
    field = _arith.shrui(_arith.andi(start, _i64(_ADDRESS_MASK)), _i64(4))
    value = Int64(_arith.ori(field, _i64(fmt.high_bits)))
    return MatrixDescriptor(value, fmt, tensor, (0, 0), origin * e)


# --- synchronization ------------------------------------------------------------------------------------------------


def _accumulator_values(acc) -> list[ir.Value]:
    if not isinstance(acc, Vector) or acc.element is not Float32:
        raise TypeError(f"wgmma: accumulators are Float32 vectors, got {type(acc).__name__}")
    return [_vector.extract(acc.value, [], [i]) for i in range(acc.length)]


def _from_fields(cls: type[Vector], result, count: int) -> Vector:
    f32 = Float32.mlir_type()
    fields = [result] if count == 1 else [_llvm.extractvalue(f32, result, [i]) for i in range(count)]
    return cls(_vector.from_elements(cls.mlir_type(), fields))


def _struct(count: int) -> ir.Type:
    return Float32.mlir_type() if count == 1 else ir.Type.parse(f"!llvm.struct<({', '.join(['f32'] * count)})>")


def _pass_through(acc: Vector) -> Vector:
    values = _accumulator_values(acc)
    count = len(values)
    constraints = ",".join(["=f"] * count + [str(i) for i in range(count)])
    result = _llvm.inline_asm(_struct(count), values, "", constraints, has_side_effects=True)
    return _from_fields(type(acc), result, count)


def fence_operands(accumulators):
    """Pins accumulator registers at this point of the program (an empty ``asm volatile`` that reads and writes
    them), so that the compiler moves no access to them across wgmma's fence / wait. Takes and returns a Vector or a
    list of them."""
    if accumulators is None:
        return None
    if isinstance(accumulators, (list, tuple)):
        return [_pass_through(acc) for acc in accumulators]
    return _pass_through(accumulators)


def fence(accumulators=None):
    """``wgmma.fence.sync.aligned``: orders this warpgroup's earlier register writes (accumulators, A fragments)
    before the next ``wgmma.mma_async``; needed before the first MMA and whenever registers it reads were written.
    Returns ``accumulators`` pinned after the fence's predecessors (see :func:`fence_operands`).

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-fence
    """
    accumulators = fence_operands(accumulators)
    _nvvm.wgmma_fence_aligned()
    return accumulators


def commit_group() -> None:
    """``wgmma.commit_group.sync.aligned``: closes the group of the warpgroup's wgmma issued since the last commit.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group
    """
    _nvvm.wgmma_commit_group_sync_aligned()


def wait_group(n: int = 0, accumulators=None):
    """``wgmma.wait_group.sync.aligned n``: waits until at most ``n`` groups are pending; the accumulators of the
    completed groups (and the shared memory they read) may be used after it. Returns ``accumulators`` pinned after
    the wait, which is how the compiler learns that reading them must come later.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group
    """
    if not isinstance(n, int) or not 0 <= n <= 7:
        raise ValueError(f"wait_group: n must be an int in 0..7, got {n!r}")
    _nvvm.wgmma_wait_group_sync_aligned(n)
    return fence_operands(accumulators)


# --- the MMA atom ---------------------------------------------------------------------------------------------------


def _flag(accumulate) -> ir.Value:
    """wgmma's scale-d as an i32 (non-zero: D += A B): a Python bool, a Boolean or an integer."""
    i32 = ir.IntegerType.get_signless(32)
    if isinstance(accumulate, bool):
        return _arith.ConstantOp(i32, int(accumulate)).result
    value = as_numeric(accumulate)
    if isinstance(value, Boolean):
        return _arith.extui(i32, value.value)
    if isinstance(value, Integer) and not isinstance(value, Vector):
        return value.to(Int32).value
    raise TypeError(f"wgmma accumulate: expected a bool, a Boolean or an integer, got {type(value).__name__}")


def _thread_value_offsets(layout_tv: _fl.Layout, rows: int, threads: int, values: int):
    """(rows/cols of each value, rows/cols of each thread) of a TV layout over a column-major (rows, cols) tile,
    checked to add without carry, so that (row, col) = thread part + value part."""
    thread_mode, value_mode = layout_tv[0], layout_tv[1]
    value_rc = [divmod(value_mode(v), rows)[::-1] for v in range(values)]
    thread_rc = [divmod(thread_mode(t), rows)[::-1] for t in range(threads)]
    if max(r for r, _ in value_rc) + max(r for r, _ in thread_rc) >= rows:
        raise ValueError(f"{layout_tv}: thread and value rows overlap; cannot split the coordinates")
    return value_rc, thread_rc


class MmaAtom:
    """One ``wgmma.mma_async.sync.aligned.m64nNkK`` for a warpgroup: fp32 accumulators, A and B of ``dtype``
    (``b_dtype`` may differ for fp8: e4m3 x e5m2), K = 32 bytes (16 for bf16/f16, 32 for e4m3/e5m2), N a
    multiple of 8 in 8..256. ``a_from_registers``: A comes from registers (RS; see :meth:`load_a`) instead of a
    shared-memory descriptor (SS).

    Per thread (t = thread index in the warpgroup): the accumulator is a ``Float32 x N/2`` Vector laid out by
    :attr:`accumulator_layout`; in warp ``w = t // 32``, lane ``l``: element ``i`` is row
    ``16 w + l // 4 + 8 ((i // 2) % 2)``, column ``8 (i // 4) + 2 (l % 4) + i % 2``.

    PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async
    """

    def __init__(self, dtype, n: int, *, b_dtype=None, a_from_registers: bool = False):
        b_dtype = dtype if b_dtype is None else b_dtype
        for name, t in (("dtype", dtype), ("b_dtype", b_dtype)):
            if t not in _PTX_TYPES:
                raise TypeError(
                    f"MmaAtom {name}: expected fx.BFloat16, fx.Float16, fx.Float8E4M3FN or Float8E5M2, got {t!r}"
                )
        if (dtype.width == 16 or b_dtype.width == 16) and dtype is not b_dtype:
            raise TypeError(f"MmaAtom: 16-bit A and B must have one type, got {dtype.__name__} and {b_dtype.__name__}")
        if not isinstance(n, int) or n % 8 or not 8 <= n <= 256:
            raise ValueError(f"MmaAtom n: expected a multiple of 8 in 8..256, got {n!r}")
        self.dtype, self.b_dtype, self.n = dtype, b_dtype, n
        self.k = _K_BYTES // (dtype.width // 8)
        self.a_from_registers = bool(a_from_registers)

    def __repr__(self):
        source = "RS" if self.a_from_registers else "SS"
        return f"MmaAtom(m64n{self.n}k{self.k}.f32.{_PTX_TYPES[self.dtype]}.{_PTX_TYPES[self.b_dtype]}, {source})"

    @property
    def shape_mnk(self) -> tuple[int, int, int]:
        return ATOM_M, self.n, self.k

    @property
    def a_shape(self) -> tuple[int, int]:
        """(M, K) of the A operand."""
        return ATOM_M, self.k

    @property
    def b_shape(self) -> tuple[int, int]:
        """(N, K) of the B operand."""
        return self.n, self.k

    @property
    def accumulator_type(self) -> type[Vector]:
        return vector_class(Float32, self.n // 2)

    @property
    def accumulator_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset ``row + 64 col`` in the 64 x N tile. Threads (4, 8, 4): the lane's
        column pair, the lane's row, the warp (16 rows); values (2, 2, N/8): the column in the pair, row + 8, the
        8-column block."""
        col = ATOM_M  # offset of one column
        return _fl.Layout(((4, 8, 4), (2, 2, self.n // 8)), ((2 * col, 1, 16), (col, 8, 8 * col)))

    @property
    def a_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset in the 64 x K tile of the A register fragment (RS): as the
        accumulator of an m64nK MMA for 16-bit types (pairs of columns); for 8-bit types, runs of 4 columns."""
        col = ATOM_M
        per_register = 4 // (self.dtype.width // 8)  # elements of a 32-bit register, along K
        return _fl.Layout(
            ((4, 8, 4), (per_register, 2, 2)),
            ((per_register * col, 1, 16), (col, 8, 4 * per_register * col)),
        )

    def make_accumulator(self, value=0.0) -> Vector:
        """A ``Float32 x N/2`` accumulator filled with ``value`` (a Python number or a Float32)."""
        cls = self.accumulator_type
        if isinstance(value, (int, float)):
            return cls(float(value))
        scalar = as_numeric(value, Float32)
        if type(scalar) is not Float32:
            raise TypeError(f"make_accumulator: expected a Float32, got {type(scalar).__name__}")
        return cls(_vector.broadcast(cls.mlir_type(), scalar.value))

    # --- register fragments ---------------------------------------------------------------------------------------
    @functools.cached_property
    def _a_split(self):
        return _thread_value_offsets(self.a_layout, ATOM_M, WARPGROUP_THREADS, 4 * 32 // self.dtype.width)

    @functools.cached_property
    def _acc_split(self):
        return _thread_value_offsets(self.accumulator_layout, ATOM_M, WARPGROUP_THREADS, self.n // 2)

    @staticmethod
    def _thread_origin(layout_tv, split, thread):
        """(row, col) of this thread's value 0, known to be multiples of what every thread's are."""
        index = _warpgroup_thread(thread)
        offset = _fl.crd2idx(index, layout_tv[0].shape, layout_tv[0].stride)
        row, col = offset % ATOM_M, offset // ATOM_M
        if isinstance(row, int):
            return row, col
        _, thread_rc = split
        row_divisor = functools.reduce(math.gcd, (r for r, _ in thread_rc), 0) or 1 << 30
        col_divisor = functools.reduce(math.gcd, (c for _, c in thread_rc), 0) or 1 << 30
        return type(row)(row.value, divisibility=row_divisor), type(col)(col.value, divisibility=col_divisor)

    def load_a(self, tensor: Tensor, thread=None) -> Vector:
        """This thread's A fragment (RS) of the (64, K) view ``tensor`` (any memory; 8-bit data as Uint8 or fp8
        elements), as the ``Int32 x 4`` wgmma takes."""
        if not isinstance(tensor, Tensor) or tensor.dtype.width != self.dtype.width:
            raise TypeError(f"load_a: expected a Tensor of {self.dtype.width}-bit elements, got {tensor!r}")
        row0, col0 = self._thread_origin(self.a_layout, self._a_split, thread)
        value_rc, _ = self._a_split
        elements = [tensor[_coordinate(tensor, row0 + r, col0 + c)] for r, c in value_rc]
        storage = tensor.dtype
        cls = vector_class(storage, len(elements))
        packed = cls(_vector.from_elements(cls.mlir_type(), [x.value for x in elements]))
        return packed.bitcast(Int32)

    def store_accumulator(self, acc: Vector, tensor: Tensor, thread=None) -> None:
        """Writes this thread's part of the accumulator to the (64, N) view ``tensor`` (e.g. a ``local_tile`` of C
        in global memory), converted to the tensor's float type (Float32, BFloat16, Float16)."""
        if type(acc) is not self.accumulator_type:
            raise TypeError(f"store_accumulator: expected a {self.accumulator_type.__name__}, got {type(acc).__name__}")
        if not isinstance(tensor, Tensor) or not issubclass(tensor.dtype, Float):
            raise TypeError(f"store_accumulator: expected a Tensor of floats, got {tensor!r}")
        values = acc.to(tensor.dtype) if tensor.dtype is not Float32 else acc
        row0, col0 = self._thread_origin(self.accumulator_layout, self._acc_split, thread)
        value_rc, _ = self._acc_split
        plain = _coordinate(tensor, 0, 0) == (0, 0)
        v = 0
        while v < len(value_rc):
            r, c = value_rc[v]
            run = 2 if plain and v + 1 < len(value_rc) and value_rc[v + 1] == (r, c + 1) else 1
            if run == 1:
                tensor[_coordinate(tensor, row0 + r, col0 + c)] = values[v]
            else:  # two adjacent columns: one access as wide as the layout and the alignment allow
                offset = _fl.crd2idx((row0 + r, col0 + c), tensor.layout)
                pair = Tensor(
                    tensor.pointer,
                    _fl.Layout(2, _fl.get(tensor.layout, 1).stride),
                    tensor.dtype,
                    space=tensor.space,
                    alignment=tensor.base_alignment,
                    offset=_leaf_add(tensor.offset, offset),
                )
                two = vector_class(tensor.dtype, 2)  # (no extract_strided_slice: not lowered to LLVM here)
                _vector_store(two(_vector.from_elements(two.mlir_type(), [values[v].value, values[v + 1].value])), pair)
            v += run

    def load_accumulator(self, tensor: Tensor, thread=None) -> Vector:
        """This thread's part of the (64, N) view ``tensor`` as an accumulator (e.g. C of ``D = A B + C``)."""
        row0, col0 = self._thread_origin(self.accumulator_layout, self._acc_split, thread)
        value_rc, _ = self._acc_split
        elements = [as_numeric(tensor[_coordinate(tensor, row0 + r, col0 + c)]).to(Float32).value for r, c in value_rc]
        cls = self.accumulator_type
        return cls(_vector.from_elements(cls.mlir_type(), elements))

    # --- the instruction ------------------------------------------------------------------------------------------
    def _check_descriptor(self, desc, shape, dtype, what: str) -> DescriptorFormat:
        if not isinstance(desc, MatrixDescriptor):
            raise TypeError(f"{self!r} {what}: expected a MatrixDescriptor (wgmma.make_descriptor), got {desc!r}")
        fmt = desc.format
        if fmt.shape != shape:
            raise ValueError(
                f"{self!r} {what}: the descriptor describes a {fmt.shape} operand, this atom reads {shape}"
            )
        if fmt.element_bytes != dtype.width // 8:
            raise TypeError(
                f"{self!r} {what}: {8 * fmt.element_bytes}-bit elements in shared memory, expected {dtype.width}"
            )
        return fmt

    def _a_registers(self, a) -> list[ir.Value]:
        if isinstance(a, Vector) and a.element is not Int32 and a.width == 128:
            a = a.bitcast(Int32)
        if not isinstance(a, Vector) or a.element is not Int32 or a.length != 4:
            raise TypeError(f"{self!r} a: expected the A register fragment as an Int32x4 (load_a), got {a!r}")
        return [_vector.extract(a.value, [], [i]) for i in range(4)]

    def __call__(self, a, b, acc: Vector, accumulate=True) -> Vector:
        """Issues ``D = A B^T (+ D if accumulate)`` and returns D (valid after :func:`wait_group`). ``a``: a
        MatrixDescriptor of A (64, K) or, with ``a_from_registers``, an ``Int32x4`` fragment; ``b``: a
        MatrixDescriptor of B (N, K); ``accumulate``: a Python bool or a kernel Boolean/integer (wgmma's scale-d
        predicate, set at run time)."""
        b_fmt = self._check_descriptor(b, self.b_shape, self.b_dtype, "b")
        if type(acc) is not self.accumulator_type:
            raise TypeError(f"{self!r} acc: expected a {self.accumulator_type.__name__}, got {type(acc).__name__}")
        count = self.n // 2
        sixteen_bit = self.dtype.width == 16
        if self.a_from_registers:
            a_operands = self._a_registers(a)
            a_text = "{" + ", ".join(f"${count + i}" for i in range(4)) + "}"
            a_constraints = ["r"] * 4
            trans = f", {b_fmt.transposed}" if sixteen_bit else ""
        else:
            a_fmt = self._check_descriptor(a, self.a_shape, self.dtype, "a")
            if not sixteen_bit and (a_fmt.major, b_fmt.major) != ("K", "K"):
                raise ValueError(f"{self!r}: 8-bit operands must be K-major")
            a_operands = [a.value.value]
            a_text = f"${count}"
            a_constraints = ["l"]
            trans = f", {a_fmt.transposed}, {b_fmt.transposed}" if sixteen_bit else ""
        if not sixteen_bit and b_fmt.major != "K":
            raise ValueError(f"{self!r}: 8-bit operands must be K-major")
        b_index = count + len(a_operands)
        flag_index = b_index + 1
        d_text = "{" + ", ".join(f"${i}" for i in range(count)) + "}"
        types = f"f32.{_PTX_TYPES[self.dtype]}.{_PTX_TYPES[self.b_dtype]}"
        instruction = f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}.{types}"
        text = (
            "{\n.reg .pred p;\n"
            f"setp.ne.b32 p, ${flag_index}, 0;\n"
            f"{instruction} {d_text}, {a_text}, ${b_index}, p, 1, 1{trans};\n"
            "}"
        )
        constraints = ",".join(["=f"] * count + a_constraints + ["l", "r"] + [str(i) for i in range(count)])
        operands = a_operands + [b.value.value, _flag(accumulate)] + _accumulator_values(acc)
        result = _llvm.inline_asm(_struct(count), operands, text, constraints, has_side_effects=True)
        return _from_fields(self.accumulator_type, result, count)


def _coordinate(tensor: Tensor, row, col):
    """(row, col) of a 2-D view as a coordinate its layout takes: a linear (column-major) index for nested modes."""
    shape = tensor.layout.shape
    if isinstance(shape, tuple) and len(shape) == 2 and not any(isinstance(s, tuple) for s in shape):
        return row, col
    return row + _fl.size(tensor.layout[0]) * col


def _warpgroup_thread(thread):
    if thread is None:
        from flydsl.expr import gpu

        thread = gpu.thread_idx.x
    return thread % WARPGROUP_THREADS if not isinstance(thread, int) else thread % WARPGROUP_THREADS


# --- tiled MMA ------------------------------------------------------------------------------------------------------


class TiledMma:
    """Atoms over a (``tile_m``, ``tile_n``) block tile: ``warpgroups_m`` warpgroups stacked along M, each repeating
    the atom ``tile_m / (64 warpgroups_m)`` times along M and ``tile_n / N`` times along N (one accumulator Vector
    per repeat, in the list order ``mi * repeats_n + ni``). A and B are shared (tile_m, K) and (tile_n, K) views;
    ``K`` is any multiple of the atom's K (one instruction per K step).

    >>> mma = TiledMma(MmaAtom(fx.BFloat16, 128), tile_m=128, warpgroups_m=2)   # 256 threads, 128 x 128
    """

    def __init__(self, atom: MmaAtom, tile_m: int = ATOM_M, tile_n: int | None = None, warpgroups_m: int = 1):
        if not isinstance(atom, MmaAtom):
            raise TypeError(f"TiledMma: expected an MmaAtom, got {atom!r}")
        tile_n = atom.n if tile_n is None else tile_n
        if warpgroups_m < 1 or tile_m % (ATOM_M * warpgroups_m) or tile_n % atom.n:
            raise ValueError(
                f"TiledMma: tile ({tile_m}, {tile_n}) must split into {warpgroups_m} warpgroup(s) of 64-row atoms"
                f" along M and {atom.n}-column atoms along N"
            )
        self.atom, self.tile_m, self.tile_n, self.warpgroups_m = atom, tile_m, tile_n, warpgroups_m
        self.rows_per_warpgroup = tile_m // warpgroups_m
        self.repeats = (self.rows_per_warpgroup // ATOM_M, tile_n // atom.n)

    def __repr__(self):
        return f"TiledMma({self.atom!r}, tile=({self.tile_m}, {self.tile_n}), warpgroups_m={self.warpgroups_m})"

    @property
    def threads(self) -> int:
        return WARPGROUP_THREADS * self.warpgroups_m

    @property
    def accumulator_layout(self) -> _fl.Layout:
        """(thread, value) -> column-major offset ``row + tile_m col`` in the block tile, over all threads and all
        accumulators of a thread (values: the atom's, then the M repeats, then the N repeats)."""
        col = self.tile_m
        rm, rn = self.repeats
        thread = ((4, 8, 4, self.warpgroups_m), (2 * col, 1, 16, self.rows_per_warpgroup))
        value = ((2, 2, self.atom.n // 8, rm, rn), (col, 8, 8 * col, ATOM_M, self.atom.n * col))
        return _fl.Layout((thread[0], value[0]), (thread[1], value[1]))

    def make_accumulators(self, value=0.0) -> list[Vector]:
        return [self.atom.make_accumulator(value) for _ in range(self.repeats[0] * self.repeats[1])]

    def _warpgroup(self, warpgroup):
        if warpgroup is not None:
            return warpgroup
        if self.warpgroups_m == 1:
            return 0
        from flydsl.expr import gpu

        return gpu.thread_idx.x // WARPGROUP_THREADS

    def mma(self, a, b: Tensor, accumulators: list, accumulate=True, warpgroup=None) -> list[Vector]:
        """Every K step of the tile: ``accumulators[mi * rn + ni] (+)= A_mi B_ni^T``; ``accumulate`` applies to the
        first K step (later steps always accumulate). ``a``: the shared (tile_m, K) Tensor, or (RS) a list of
        ``Int32x4`` fragments indexed ``ks * repeats_m + mi`` for this warpgroup; ``b``: the shared (tile_n, K)
        Tensor. ``warpgroup``: this thread's warpgroup (default: thread_idx.x // 128)."""
        atom, (rm, rn) = self.atom, self.repeats
        if len(accumulators) != rm * rn:
            raise ValueError(f"{self!r}: expected {rm * rn} accumulators, got {len(accumulators)}")
        k_extent = _fl.size(b.layout[1])
        if not isinstance(k_extent, int) or k_extent % atom.k:
            raise ValueError(f"{self!r}: the K extent of B ({k_extent}) is not a multiple of {atom.k}")
        k_steps = k_extent // atom.k
        b_desc = make_descriptor(b, atom.b_shape)
        if atom.a_from_registers:
            if len(a) != k_steps * rm:
                raise ValueError(f"{self!r}: expected {k_steps * rm} A fragments (K steps x M repeats), got {len(a)}")
            a_desc = None
        else:
            rows = (self.rows_per_warpgroup, k_extent)
            a_mine = local_tile(a, rows, (self._warpgroup(warpgroup), 0)) if self.warpgroups_m > 1 else a
            a_desc = make_descriptor(a_mine, atom.a_shape)
        accumulators = list(accumulators)
        for ks in range(k_steps):
            for mi in range(rm):
                a_op = a[ks * rm + mi] if a_desc is None else a_desc.at(mi * ATOM_M, ks * atom.k)
                for ni in range(rn):
                    i = mi * rn + ni
                    flag = accumulate if ks == 0 else True
                    accumulators[i] = atom(a_op, b_desc.at(ni * atom.n, ks * atom.k), accumulators[i], flag)
        return accumulators

    def store_accumulators(self, accumulators: list, tensor: Tensor, warpgroup=None, thread=None) -> None:
        """Writes every accumulator of this thread into the (tile_m, tile_n) view ``tensor`` (converted to its
        float type)."""
        rm, rn = self.repeats
        first_block = self._warpgroup(warpgroup) * rm  # this warpgroup's first 64-row block
        for mi in range(rm):
            for ni in range(rn):
                sub = local_tile(tensor, (ATOM_M, self.atom.n), (first_block + mi, ni))  # (64, N)
                self.atom.store_accumulator(accumulators[mi * rn + ni], sub, thread)
