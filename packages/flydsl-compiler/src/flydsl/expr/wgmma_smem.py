"""The shared-memory side of Hopper's warpgroup MMA: layout atoms for wgmma operands and the 64-bit matrix
descriptors that point wgmma at them, both derived from ``flydsl.layout`` layouts and checked element by element.
:mod:`flydsl.expr.wgmma` (the MMA atoms) re-exports everything public here; its docstring shows the whole flow.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-shared-memory-layout
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Int64, Numeric, as_numeric
from flydsl.expr.nvvm import address
from flydsl.expr.tensor import Tensor

ir = lazy_import("mlir.ir")
_arith = lazy_import("mlir.dialects.arith")
_llvm = lazy_import("mlir.dialects.llvm")

__all__ = [
    "SWIZZLES",
    "layout_atom",
    "smem_layout",
    "smem_alignment",
    "DescriptorFormat",
    "descriptor_format",
    "MatrixDescriptor",
    "make_descriptor",
]

_CORE_BYTES = 16  # a core matrix row: 16 contiguous bytes
SWIZZLES = (0, 32, 64, 128)  # bytes of one swizzled row; 0 is no swizzle (PTX "interleave": 8 x 16-byte cores)
_SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}  # Swizzle<bits, 4, 3> on byte offsets
_MODE_FIELD = {0: 0, 128: 1, 64: 2, 32: 3}  # descriptor bits 62-63
_FIELD_LIMIT = 1 << 18  # the 14-bit fields hold (bytes & 0x3FFFF) >> 4
_ADDRESS_MASK = 0x3FFFF
_MAJORS = ("K", "MN")

# --- element types ------------------------------------------------------------------------------------------------


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
    sw, _, inner = _swizzle_of(layout)  # the offset (often a run-time stage) does not change the fields
    key = (sw, inner, dtype, tuple(shape), tuple(origin), major)
    try:
        return _descriptor_format(*key)  # every compile of a GEMM checks the same sub-tiles again
    except TypeError:  # an unhashable layout: check it every time
        return _descriptor_format.__wrapped__(*key)


@functools.lru_cache(maxsize=4096)
def _descriptor_format(sw, inner, dtype, shape, origin, major) -> DescriptorFormat:
    layout = _fl.ComposedLayout(sw, 0, inner)  # for the messages
    e = _element_bytes(dtype, "descriptor_format")
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
    # A layout's offset is the sum of its modes' offsets: b(m, k) = rows[m] + cols[k] (bytes from the origin), so
    # mn + kk evaluations prove all mn * kk elements below (each crd2idx of a nested layout costs ~20 us of a compile).
    (shape_m, shape_k), (stride_m, stride_k) = inner.shape, inner.stride
    row0, col0 = _fl.crd2idx(o_m, shape_m, stride_m), _fl.crd2idx(o_k, shape_k, stride_k)

    def row(m):
        return (_fl.crd2idx(o_m + m, shape_m, stride_m) - row0) * e

    def col(k):
        return (_fl.crd2idx(o_k + k, shape_k, stride_k) - col0) * e

    def b(m, k):
        return row(m) + col(k)

    rows, cols = [row(m) for m in range(mn)], [col(k) for k in range(kk)]

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
    # canonical(m, k) = canonical(m, 0) + canonical(0, k) as well, both 0 at (0, 0): the offsets agree everywhere
    # exactly when they agree along the first column and along the first row.
    wrong = [(m, 0) for m in range(mn) if rows[m] != canonical(m, 0)]
    wrong += [(0, k) for k in range(kk) if cols[k] != canonical(0, k)]
    if wrong:
        m, k = wrong[0]
        raise ValueError(
            f"descriptor_format: {what} is not a layout wgmma can read: element ({m}, {k}) is at byte"
            f" {rows[m] + cols[k]}, the canonical layout (LBO={lbo}, SBO={sbo}) puts it at {canonical(m, k)}; build"
            " shared tiles with wgmma.smem_layout"
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
        start = _fl.crd2idx((mn, k), inner.shape, inner.stride) * fmt.element_bytes
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
    origin = _fl.crd2idx((0, 0), inner.shape, inner.stride)
    if isinstance(offset, int):
        if offset + origin:
            start = _arith.addi(start, _i64((offset + origin) * e))
    else:
        start = _arith.addi(start, (as_numeric(offset).to(Int64) * e + origin * e).value)
    field = _arith.shrui(_arith.andi(start, _i64(_ADDRESS_MASK)), _i64(4))
    value = Int64(_arith.ori(field, _i64(fmt.high_bits)))
    return MatrixDescriptor(value, fmt, tensor, (0, 0), origin * e)
