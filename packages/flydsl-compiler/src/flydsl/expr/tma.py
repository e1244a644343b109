"""TMA (Hopper's Tensor Memory Accelerator): boxes of a global tensor copied to and from shared memory by a single
thread, a load completing on an :class:`~flydsl.expr.mbarrier.Mbarrier`.

On the host, a :class:`TmaTile` says what a kernel copies: boxes of ``box`` elements (in the tensor's dimension
order; the last dimension is the contiguous one) of a tensor, landing in shared memory with a ``swizzle`` of 0, 32,
64 or 128 bytes. It is passed to a kernel parameter annotated ``fx.TmaDescriptor``: the launcher passes the 128-byte
descriptor by value (a ``__grid_constant__``), encoded once per tensor geometry and cached. In the kernel, the
descriptor knows the shared-memory layout of its box, ``desc.smem_layout`` (a ``flydsl.layout`` swizzled layout:
index it like any tensor), and copies with ``desc.load`` / ``desc.store``::

    @flyc.kernel
    def k(a: fx.TmaDescriptor, ...):
        smem = fx.SmemAllocator()
        tiles = a.allocate(smem, stages=2)                       # (box..., stages), swizzled
        full = fx.mbarrier.allocate(smem, 2)
        ...
        if is_producer_thread:
            full[s].arrive_expect_tx(a.box_bytes)
            a.load(tiles[None, None, s], (row, col), full[s])    # coordinates of the box's first element
        full[s].wait(phase)

    k(fx.TmaTile(x, box=(128, 64), swizzle=128), ...).launch(...)

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-bulk-tensor
and https://docs.nvidia.com/cuda/parallel-thread-execution/#tensor-swizzling-modes
"""

from __future__ import annotations

import math
from collections import OrderedDict

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.numeric import Int16, Int32, Int64, Numeric, as_integer
from flydsl.expr.nvvm import address
from flydsl.expr.tensor import Tensor

ir = lazy_import("mlir.ir")
_llvm = lazy_import("mlir.dialects.llvm")
_nvvm = lazy_import("mlir.dialects.nvvm")

__all__ = ["TmaTile", "TmaDescriptor", "swizzle_layout", "commit_group", "wait_group"]

SWIZZLE_BYTES = (0, 32, 64, 128)
# What the descriptor's dtype is called by cuTensorMapEncodeTiled: TMA moves bytes, so 8-bit floats travel as u8.
_ENCODE_DTYPES = {
    "f16": "f16",
    "bf16": "bf16",
    "f32": "f32",
    "f64": "f64",
    "i8": "u8",
    "i16": "u16",
    "i32": "i32",
    "i64": "i64",
    "f8E4M3FN": "u8",
    "f8E5M2": "u8",
}
_MAX_BOX = 256  # per dimension (PTX ISA: boxDim <= 256)
_ENCODED: OrderedDict = OrderedDict()  # geometry -> TensorMap; bounded: a map holds only an address, no tensor
_ENCODED_LIMIT = 1024


def swizzle_layout(dtype_bytes: int, swizzle: int, box: tuple[int, ...], stages: int | None = None):
    """The shared-memory layout TMA writes a ``box`` to (row-major: the last dimension contiguous), as a
    ``flydsl.layout`` layout over elements of ``dtype_bytes`` bytes; with ``stages`` (an int, 1 included), a last
    mode of that many boxes, each starting at a multiple of the swizzle's repeat so that every one has the same
    pattern.

    TMA swizzles XOR the 16-byte chunk index within a row of ``swizzle`` bytes with the row index modulo
    ``swizzle / 16``: in CuTe's notation ``Swizzle<B, 4, 3>`` over byte addresses (B = 1, 2, 3 for 32, 64, 128
    bytes), repeating every ``swizzle * 8`` bytes."""
    if swizzle not in SWIZZLE_BYTES:
        raise ValueError(f"swizzle: expected one of {SWIZZLE_BYTES} (bytes), got {swizzle!r}")
    if stages is not None and (not isinstance(stages, int) or stages < 1):
        raise ValueError(f"stages: expected a positive int (or None for one box without a stage mode), got {stages!r}")
    strides, step = [], 1
    for extent in reversed(box):
        strides.append(step)
        step *= extent
    box_elements = step
    shape, stride = tuple(box), tuple(reversed(strides))
    if stages is not None:
        repeat = max(swizzle * 8, 128) // dtype_bytes  # elements between equally swizzled stage starts
        shape, stride = shape + (stages,), stride + (-(-box_elements // repeat) * repeat,)
    inner = _fl.Layout(shape, stride)
    if swizzle == 0:
        return inner
    element_shift = int(math.log2(dtype_bytes))
    return _fl.ComposedLayout(_fl.Swizzle(int(math.log2(swizzle // 16)), 4 - element_shift, 3), 0, inner)


class TmaTile:
    """A host argument for an ``fx.TmaDescriptor`` kernel parameter: ``tensor`` (torch, ``__cuda_array_interface__``,
    DLPack or ``flyc.TensorSpec``, with a contiguous last dimension) copied in boxes of ``box`` elements.

    ``swizzle``: 0, 32, 64 or 128 bytes (a swizzled box row holds at most ``swizzle`` bytes); ``l2_promotion``: 0,
    64, 128 or 256 bytes; ``oob_nan``: out-of-bounds elements of a load read as NaN instead of 0 (floats only).
    Checked here, before any launch; the 128-byte descriptor is encoded on first use and cached per geometry."""

    __slots__ = ("source", "described", "dtype", "shape", "strides", "pointer", "box", "swizzle", "l2_promotion")
    __slots__ += ("oob_nan", "_map", "_key")

    def __init__(self, tensor, box, swizzle: int = 128, *, l2_promotion: int = 128, oob_nan: bool = False):
        from flydsl.compiler.args import TensorSpec, describe_tensor

        self._setup(describe_tensor(tensor, "tensor"), box, swizzle, l2_promotion, oob_nan)
        self.source = tensor
        self._map = None if isinstance(tensor, TensorSpec) else False  # False: not encoded yet

    @classmethod
    def of_memory(
        cls, pointer: int, shape, strides, dtype: str, box, swizzle: int = 128, *, device: int = 0, l2_promotion=128
    ):
        """A tile of raw device memory (``strides`` in elements, ``dtype`` an MLIR name such as ``"bf16"``) that
        holds no tensor object: what a library caches per operand geometry without keeping tensors alive."""
        from flydsl.compiler.args import TensorArg

        tile = cls.__new__(cls)
        described = TensorArg(pointer, tuple(shape), tuple(strides), dtype, device, None)
        tile._setup(described, box, swizzle, l2_promotion, False)
        tile.source, tile._map = None, False
        return tile

    def _setup(self, described, box, swizzle, l2_promotion, oob_nan) -> None:
        self.described = described
        self.dtype, self.shape, self.strides, self.pointer = (
            described.dtype,
            tuple(described.shape),
            tuple(described.strides),
            described.pointer,
        )
        self.box = tuple(box) if isinstance(box, (tuple, list)) else (box,)
        self.swizzle, self.l2_promotion, self.oob_nan = swizzle, l2_promotion, bool(oob_nan)
        self._check()
        # What a kernel is specialized on (the launch paths read it: kernel.py and the native dispatcher).
        self._key = ("tma", self.dtype, len(self.shape), self.box, self.swizzle)
        _register_with_dispatcher()

    def _check(self) -> None:
        if self.dtype not in _ENCODE_DTYPES:
            raise TypeError(f"TmaTile tensor: unsupported element type {self.dtype}")
        rank, element_bytes = len(self.shape), self.described.element_bytes
        if not 1 <= rank <= 5:
            raise ValueError(f"TmaTile tensor: TMA copies tensors of rank 1 to 5, got shape {self.shape}")
        if self.strides[-1] != 1 and self.shape[-1] != 1:
            raise ValueError(
                f"TmaTile tensor: the last dimension must be contiguous (stride 1), got strides {self.strides}"
            )
        for d, (extent, stride) in enumerate(zip(self.shape[:-1], self.strides[:-1], strict=True)):
            if (stride * element_bytes) % 16 and extent > 1:
                raise ValueError(
                    f"TmaTile tensor: stride {stride} of dimension {d} is not a multiple of 16 bytes"
                    f" ({16 // element_bytes} {self.dtype} elements), which TMA requires"
                )
        if any(extent >= 1 << 31 for extent in self.shape):
            raise ValueError(f"TmaTile tensor: TMA coordinates are 32-bit: every extent must be < 2^31 ({self.shape})")
        if self.pointer % 16:
            raise ValueError("TmaTile tensor: the data pointer must be 16-byte aligned")
        if len(self.box) != rank or not all(isinstance(b, int) and 1 <= b <= _MAX_BOX for b in self.box):
            raise ValueError(f"TmaTile box: expected {rank} ints in 1..{_MAX_BOX}, got {self.box}")
        if self.swizzle not in SWIZZLE_BYTES:
            raise ValueError(f"TmaTile swizzle: expected one of {SWIZZLE_BYTES} (bytes), got {self.swizzle!r}")
        row_bytes = self.box[-1] * element_bytes
        if row_bytes % 16:
            raise ValueError(f"TmaTile box: a box row must be a multiple of 16 bytes, got {row_bytes} ({self.box})")
        if self.swizzle and row_bytes > self.swizzle:
            raise ValueError(
                f"TmaTile box: a box row of {row_bytes} bytes does not fit a {self.swizzle}-byte swizzle (box"
                f" {self.box}); use a narrower box (at most {self.swizzle // element_bytes} elements) and several loads"
            )
        if self.l2_promotion not in (0, 64, 128, 256):
            raise ValueError(f"TmaTile l2_promotion: expected 0, 64, 128 or 256 (bytes), got {self.l2_promotion!r}")

    def key(self) -> tuple:
        """What a kernel is specialized on: element type, rank, box, swizzle (the tensor's extents are dynamic)."""
        return self._key

    @property
    def tensor_map(self):
        """The encoded descriptor (``runtime.TensorMap``), from the cache when this geometry was seen."""
        if self._map is None:
            raise ValueError("TmaTile: a TensorSpec has no memory to describe: compile with it, launch with a tensor")
        if self._map is False:
            self._map = _encode(self)
        return self._map

    def __repr__(self):
        return f"TmaTile({self.dtype}{list(self.shape)}, box={self.box}, swizzle={self.swizzle})"


_registered = False


def _register_with_dispatcher() -> None:
    """Tells the native dispatcher (once) which type TmaTile arguments have, so that it launches them natively."""
    global _registered
    if not _registered:
        from flydsl.compiler._native import launcher

        launcher._register_tma_tile_type(TmaTile)
        _registered = True


def _encode(tile: TmaTile):
    from flydsl.compiler._native import launcher

    element_bytes = tile.described.element_bytes
    geometry = (tile.pointer, tile.shape, tile.strides, tile.dtype, tile.box, tile.swizzle, tile.l2_promotion)
    geometry += (tile.oob_nan,)
    found = _ENCODED.get(geometry)
    if found is not None:
        _ENCODED.move_to_end(geometry)
        return found
    tensor_map = launcher.TensorMap.encode_tiled(
        _ENCODE_DTYPES[tile.dtype],
        tile.pointer,  # an int: the cache must not keep tensors alive
        list(reversed(tile.shape)),  # innermost first
        [s * element_bytes for s in reversed(tile.strides[:-1])],
        list(reversed(tile.box)),
        swizzle=tile.swizzle,
        l2_promotion=tile.l2_promotion,
        oob_fill_nan=tile.oob_nan,
    )
    _ENCODED[geometry] = tensor_map
    if len(_ENCODED) > _ENCODED_LIMIT:
        _ENCODED.popitem(last=False)
    return tensor_map


class TmaDescriptor:
    """A TMA descriptor in a kernel (a parameter annotated ``fx.TmaDescriptor``): what it copies is known at
    compile time (element type, box, swizzle); the global extents arrive at launch (``shape``, Index values)."""

    def __init__(self, pointer: ir.Value, dtype: type[Numeric], box: tuple[int, ...], swizzle: int, shape: tuple):
        self.pointer, self.dtype, self.box, self.swizzle, self.shape = pointer, dtype, box, swizzle, shape

    @property
    def element_bytes(self) -> int:
        return max(1, self.dtype.width // 8)

    @property
    def box_bytes(self) -> int:
        """Bytes one load brings: what the mbarrier it completes on must expect."""
        return math.prod(self.box) * self.element_bytes

    @property
    def smem_alignment(self) -> int:
        """The alignment a box's shared-memory destination needs: the swizzle's repeat (128 bytes at least)."""
        return max(self.swizzle * 8, 128)

    @property
    def smem_layout(self):
        """The shared-memory layout of one box, as TMA writes it."""
        return swizzle_layout(self.element_bytes, self.swizzle, self.box)

    def stages_layout(self, stages: int):
        """``stages`` boxes: the box's modes, then the stage."""
        return swizzle_layout(self.element_bytes, self.swizzle, self.box, stages)

    def allocate(self, smem, stages: int | None = None) -> Tensor:
        """Shared memory for one box (its layout), or for ``stages`` boxes (a last mode of ``stages``, one included:
        code that indexes the stage holds for any count), aligned as TMA needs."""
        layout = self.smem_layout if stages is None else self.stages_layout(stages)
        return smem.allocate(self.dtype, layout, alignment=self.smem_alignment)

    def prefetch(self) -> None:
        """Brings the descriptor into the cache ahead of the first copy (``prefetch.tensormap``)."""
        _nvvm.PrefetchOp(self.pointer, tensormap=True)

    def _coordinates(self, coord) -> list[ir.Value]:
        coord = coord if isinstance(coord, (tuple, list)) else (coord,)
        if len(coord) != len(self.box):
            raise ValueError(f"TMA coordinate {coord}: expected {len(self.box)} (one per dimension of the tensor)")
        # TMA counts dimensions innermost first.
        return [as_integer(c, Int32, "TMA coordinate").value for c in reversed(coord)]

    def _box_address(self, tile: Tensor, what: str) -> ir.Value:
        if not isinstance(tile, Tensor) or tile.space != "shared":
            raise TypeError(f"{what}: expected a shared-memory fx.Tensor, got {tile!r}")
        if tile.dtype is not self.dtype:
            raise TypeError(
                f"{what}: the descriptor copies {self.dtype.__name__}, the tile holds {tile.dtype.__name__}"
            )
        if isinstance(tile.offset, int) and tile.alignment < 128:
            raise ValueError(f"{what}: TMA needs a 128-byte aligned shared-memory tile, this one is {tile.alignment}")
        return address(tile)

    def load(self, tile: Tensor, coord, barrier, *, multicast_mask=None, cache_hint=None) -> None:
        """Copies the box whose first element is at ``coord`` (element coordinates, one per dimension; out-of-bounds
        parts read as zero) into ``tile``; ``barrier`` (an ``Mbarrier``) counts its bytes. One thread issues it.
        ``multicast_mask`` (an Int16 bit per CTA of the cluster) writes the box into every CTA named, at the same
        shared-memory offset, completing on each one's barrier at the same offset."""
        destination = _llvm.addrspacecast(ir.Type.parse("!llvm.ptr<7>"), self._box_address(tile, "TMA load tile"))
        mask = None if multicast_mask is None else as_integer(multicast_mask, Int16, "multicast_mask").value
        hint = None if cache_hint is None else as_integer(cache_hint, Int64, "cache_hint").value
        _nvvm.CpAsyncBulkTensorGlobalToSharedClusterOp(
            destination,
            self.pointer,
            self._coordinates(coord),
            barrier.address,
            [],
            multicastMask=mask,
            l2CacheHint=hint,
        )

    def store(self, tile: Tensor, coord) -> None:
        """Copies ``tile`` to the box at ``coord`` (out-of-bounds parts are not written). One thread issues it, after
        ``fx.nvvm.fence_proxy_async()`` in every thread that wrote ``tile`` and a barrier; ``commit_group()`` and
        ``wait_group(0, read=True)`` say when ``tile`` may be written again."""
        _nvvm.CpAsyncBulkTensorSharedCTAToGlobalOp(
            self.pointer, self._box_address(tile, "TMA store tile"), self._coordinates(coord)
        )


def commit_group() -> None:
    """Closes the bulk async-group of this thread's TMA stores issued so far (``cp.async.bulk.commit_group``)."""
    _nvvm.CpAsyncBulkCommitGroupOp()


def wait_group(pending: int = 0, read: bool = False) -> None:
    """Waits until at most ``pending`` of this thread's bulk async-groups are outstanding; ``read=True`` only
    until their shared-memory sources have been read (the tiles may be reused; the global writes may be in flight)."""
    _nvvm.CpAsyncBulkWaitGroupOp(pending, read=True if read else None)
