"""Tensors in kernels: a typed pointer, an element offset and a layout, with element access, views and copies.

A ``Tensor`` is also the annotation of a kernel parameter that takes any GPU tensor (torch, cupy, anything with
``__cuda_array_interface__``). Views (slicing with ``None``, ``local_tile``, ``local_partition``) are computed with
``flydsl.layout`` on the Python side and cost no IR; element access and ``copy`` emit Fly ops, whose lowering proves
how wide each access can be from the layouts.
"""

from __future__ import annotations

import flydsl.layout as _fl
from flydsl.compiler.lazy import lazy_import
from flydsl.expr.layout import as_index, make_layout, static_leaf
from flydsl.expr.numeric import Boolean, Index, Integer, Numeric, Uint8, as_numeric
from flydsl.layout.int_tuple import fold as _fold
from flydsl.layout.int_tuple import leaves as _leaves
from flydsl.layout.leaf import add as _leaf_add

ir = lazy_import("mlir.ir")

__all__ = ["Tensor", "copy", "local_tile", "local_partition", "SmemAllocator", "SmemPtr", "fly_layout_type"]

_SPACES = {"generic": 0, "global": 1, "shared": 3, "register": 5}


class _FlyOps:
    """The generated Fly op builders, imported on first use (flydsl.compiler imports this module)."""

    def __getattr__(self, name):
        from flydsl.compiler.dialects import fly

        return getattr(fly, name)


fly_ops = _FlyOps()  # shared by the expr modules that build Fly ops
_fly = fly_ops


def _leaf_text(leaf, dynamic: list) -> str:
    if isinstance(leaf, int):
        return str(leaf)
    dynamic.append(leaf)
    divisor = _fl.known_divisor(leaf)
    return "?" if divisor in (0, 1) else f"?{{div={divisor}}}"


def _tuple_text(tuple_, dynamic: list) -> str:
    if isinstance(tuple_, tuple):
        return "(" + ",".join(_tuple_text(t, dynamic) for t in tuple_) + ")"
    return _leaf_text(tuple_, dynamic)


def fly_layout_type(layout) -> tuple[str, list, list]:
    """(the ``!fly.layout`` / ``!fly.composed_layout`` type text, the dynamic leaves of the inner layout in operand
    order (shape, then stride), the dynamic composed offset or [])."""
    if isinstance(layout, _fl.ComposedLayout):
        inner_text, leaves, _ = fly_layout_type(layout.inner)
        swizzle = layout.outer
        if not isinstance(swizzle, _fl.Swizzle):
            raise TypeError(f"composed layouts in kernels need a swizzle outside, got {swizzle}")
        offset: list = []
        offset_text = _leaf_text(static_leaf(layout.offset), offset)
        body = inner_text[len("!fly.layout<") : -1]
        text = f"!fly.composed_layout<Sw<{swizzle.bits},{swizzle.base},{swizzle.shift}> o {offset_text} o {body}>"
        return text, leaves, offset
    shape_dynamic: list = []
    stride_dynamic: list = []
    text = f"!fly.layout<{_tuple_text(layout.shape, shape_dynamic)}:{_tuple_text(layout.stride, stride_dynamic)}>"
    return text, shape_dynamic + stride_dynamic, []


# Offsets below 2^31 elements are computed in the coordinates' own type (Int32: 32-bit IMAD); larger ones in Index.
_NARROW_LIMIT = 1 << 31


def _fits_narrow(layout) -> bool:
    """Whether every offset into memory holding ``layout`` (a static layout of fewer than 2^31 elements) fits."""
    return _fl.is_static(layout) and _fl.cosize(_plain(layout)) <= _NARROW_LIMIT


def _widened(x):
    """A dynamic integer narrower than 64 bits as an Index; anything else as it is."""
    return x.to(Index) if isinstance(x, Integer) and x.width < 64 else x


def _static_reach(shape, stride) -> int | None:
    """The largest offset a mode reaches, ``sum((s - 1) * |d|)`` over its leaves; None where a leaf is dynamic."""
    total = 0
    for s, d in zip(_leaves(shape), _leaves(stride), strict=True):
        if not (isinstance(s, int) and isinstance(d, int)):
            return None
        total += (s - 1) * abs(d)
    return total


def _indexed_modes(coord, shape, stride):
    """``(leaf, shape, stride)`` for each dynamic integer leaf of ``coord`` and the mode it indexes."""
    if isinstance(coord, tuple):
        if isinstance(shape, tuple) and len(shape) == len(coord):
            for part in zip(coord, shape, stride, strict=True):
                yield from _indexed_modes(*part)
    elif isinstance(coord, Integer):
        yield coord, shape, stride


def _power_of_two_divisor(x) -> int:
    divisor = _fl.known_divisor(x)
    if divisor == 0:
        return 1 << 62
    return divisor & -divisor


class Tensor:
    """A view of memory: ``pointer`` (a ``!fly.ptr``), an element ``offset`` and a ``layout``.

    ``wide``: whether offsets into its memory may reach 2^31 elements; then every dynamic offset that feeds its
    address is computed in 64 bits (``Index``) unless the modes it comes from prove it smaller. Default: True for
    global memory, unless the layout is static with a cosize of at most 2^31 and the offset static; shared memory and
    registers are never wide. Views keep their tensor's."""

    __slots__ = ("pointer", "offset", "layout", "dtype", "space", "base_alignment", "wide")

    def __init__(
        self,
        pointer: ir.Value,
        layout,
        dtype: type[Numeric],
        *,
        space="global",
        alignment=None,
        offset=0,
        wide: bool | None = None,
    ):
        self.pointer = pointer
        self.layout = layout
        self.dtype = dtype
        self.space = space
        self.base_alignment = alignment or max(1, dtype.width // 8)
        self.offset = offset
        if wide is None:
            wide = space in ("global", "generic") and not (isinstance(offset, int) and _fits_narrow(layout))
        self.wide = wide

    def __repr__(self):
        return f"Tensor<{self.dtype.__name__}, {self.space}>({self.layout}, offset={self.offset})"

    @property
    def shape(self):
        return self.layout.shape

    @property
    def stride(self):
        return self.layout.stride

    @property
    def element_bytes(self) -> int:
        return max(1, self.dtype.width // 8)

    @property
    def alignment(self) -> int:
        """What this view's first element is known to be aligned to (bytes)."""
        return min(self.base_alignment, _power_of_two_divisor(self.offset) * self.element_bytes)

    def view(self, layout) -> Tensor:
        """The same memory through another layout (e.g. a ``zipped_divide`` of this one)."""
        return self.moved(layout, 0)

    def moved(self, layout, delta) -> Tensor:
        """The view of this memory through ``layout`` from ``delta`` elements past this view's first one (a delta
        computed with :meth:`offset_of` or :meth:`address_coord`)."""
        offset = self.offset
        if not (isinstance(delta, int) and delta == 0):
            if self.wide and not (isinstance(offset, int) and offset == 0):
                offset, delta = _widened(offset), _widened(delta)
            offset = _leaf_add(offset, delta)
        return Tensor(
            self.pointer,
            layout,
            self.dtype,
            space=self.space,
            alignment=self.base_alignment,
            offset=offset,
            wide=self.wide,
        )

    def address_coord(self, coord, layout=None):
        """``coord`` with its dynamic integer leaves widened to ``Index`` where the offset they give under
        ``layout`` (default: this view's) could reach 2^31 elements of a wide tensor: a leaf whose mode has a
        dynamic shape or stride, and every leaf when the static modes they index reach that far together. Leaves
        whose offsets are proven to fit keep their type (32-bit math). A layout of basis strides (coordinates, not
        offsets) is left alone."""
        plain = _plain(self.layout if layout is None else layout)
        if not self.wide or any(isinstance(d, _fl.ScaledBasis) for d in _leaves(plain.stride)):
            return coord
        modes = [(leaf, _static_reach(shape, stride)) for leaf, shape, stride in _indexed_modes(coord, *_parts(plain))]
        static = sum(reach for _, reach in modes if reach is not None)
        widen = {id(leaf) for leaf, reach in modes if reach is None or static >= _NARROW_LIMIT}
        if not widen:
            return coord
        return _fold(coord, lambda leaf: _widened(leaf) if id(leaf) in widen else leaf, lambda parts: parts)

    def offset_of(self, coord, layout=None):
        """``layout(coord)`` (default: this view's layout), in 64 bits where it could reach 2^31 elements."""
        layout = self.layout if layout is None else layout
        return _fl.crd2idx(self.address_coord(coord, layout), layout)

    # --- IR ---------------------------------------------------------------------------------------------------------
    def _pointer_type(self, alignment: int) -> ir.Type:
        return ir.Type.parse(f"!fly.ptr<{self.dtype.mlir_name}, {self.space}, {alignment}>")

    def materialize(self) -> ir.Value:
        """The ``!fly.tensor`` value of this view, built at the current insertion point."""
        pointer = self.pointer
        if not (isinstance(self.offset, int) and self.offset == 0):
            pointer = _fly.add_offset(self._pointer_type(self.alignment), pointer, as_index(self.offset).value)
        text, leaves, composed_offset = fly_layout_type(self.layout)
        operands = [as_index(leaf).value for leaf in leaves]
        if isinstance(self.layout, _fl.ComposedLayout):
            inner_text, _, _ = fly_layout_type(self.layout.inner)
            inner = _fly.MakeLayoutOp(ir.Type.parse(inner_text), operands).result
            offset = as_index(composed_offset[0]).value if composed_offset else None
            layout_value = _fly.MakeComposedLayoutOp(ir.Type.parse(text), inner, offset=offset).result
        else:
            layout_value = _fly.MakeLayoutOp(ir.Type.parse(text), operands).result
        tensor_type = ir.Type.parse(f"!fly.tensor<{self._pointer_type(self.alignment)}, {text}>")
        return _fly.MakeTensorOp(tensor_type, pointer, layout_value).result

    # --- access -----------------------------------------------------------------------------------------------------
    def _coordinates(self, coord) -> list[ir.Value]:
        plain = _plain(self.layout)
        if not isinstance(coord, tuple):
            return [as_index(coord).value]
        if not _fl.congruent(coord, plain.shape):
            raise IndexError(
                f"{_at_user_line()}indexing a tensor of shape {_shape_text(plain.shape)} (rank {_fl.rank(plain)})"
                f" with {_shape_text(coord, dynamic=None)}: give one linear index, or one index per mode of the shape"
                " (nested like it)"
            )
        return [as_index(c).value for c in _fl.flatten(coord)]

    def __getitem__(self, coord):
        if _has_free_modes(coord):
            sliced, delta = _fl.slice_and_offset(self.address_coord(_static_coord(coord)), self.layout)
            return self.moved(sliced, delta)
        value = _fly.LoadOp(self.materialize(), self._coordinates(_static_coord(coord))).result
        return self.dtype(value)

    def __setitem__(self, coord, value):
        value = as_numeric(value, self.dtype)
        if type(value) is not self.dtype:
            raise TypeError(f"storing a {type(value).__name__} into a tensor of {self.dtype.__name__}: convert it")
        _fly.StoreOp(value.value, self.materialize(), self._coordinates(_static_coord(coord)))


def _at_user_line() -> str:
    """The kernel statement being traced, quoted, to start a message with (empty where it cannot be read)."""
    from flydsl.compiler.tracing import user_source_line

    line = user_source_line()
    return f"`{line}`: " if line else ""


def _parts(layout) -> tuple:
    return layout.shape, layout.stride


def _plain(layout):
    """The layout whose shape indexes a view (the inner one of a swizzled layout)."""
    return layout.inner if isinstance(layout, _fl.ComposedLayout) else layout


def _shape_text(tuple_, dynamic: str | None = "?") -> str:
    """A shape (or, with ``dynamic=None``, a coordinate) for messages in CuTe notation: ints as they are, a dynamic
    leaf as ``?`` (a coordinate's by its type: ``Int32``), never as MLIR text."""
    if isinstance(tuple_, tuple):
        inner = ",".join(_shape_text(t, dynamic) for t in tuple_)
        return f"({inner},)" if len(tuple_) == 1 else f"({inner})"
    if isinstance(tuple_, int) or tuple_ is None:
        return str(tuple_)
    constant = tuple_.constant_value() if isinstance(tuple_, Numeric) else None
    if constant is not None:
        return str(constant)
    return dynamic or type(tuple_).__name__


def _has_free_modes(coord) -> bool:
    if coord is None:
        return True
    if isinstance(coord, tuple):
        return any(_has_free_modes(c) for c in coord)
    return False


def _static_coord(coord):
    if isinstance(coord, tuple):
        return tuple(_static_coord(c) for c in coord)
    return None if coord is None else static_leaf(coord)


def copy(source: Tensor, target: Tensor, predicate=None) -> None:
    """``target(i) = source(i)`` for every ``i < size(source)``; as wide as the layouts prove; skipped where
    ``predicate`` (a Boolean) is false."""
    if source.dtype is not target.dtype:
        raise TypeError(f"copy: element types differ ({source.dtype.__name__} -> {target.dtype.__name__})")
    source_size, target_size = _fl.size(_plain(source.layout)), _fl.size(_plain(target.layout))
    if isinstance(source_size, int) and isinstance(target_size, int) and source_size > target_size:
        raise ValueError(
            f"{_at_user_line()}copy: the source has {source_size} elements (shape {_shape_text(source.shape)}) but"
            f" the target only {target_size} (shape {_shape_text(target.shape)}): copy views of one size (e.g."
            " partitions of the same tile)"
        )
    pred = None if predicate is None else as_numeric(predicate, Boolean).value
    _fly.CopyOp(source.materialize(), target.materialize(), predicate=pred)


def _tiler(tile) -> tuple:
    return tuple(_fl.Layout(t) if isinstance(t, int) else t for t in (tile if isinstance(tile, tuple) else (tile,)))


def local_tile(tensor: Tensor, tile, coord) -> Tensor:
    """Tile ``coord`` of ``tensor`` cut in tiles of shape ``tile``: ``zipped_divide(tensor, tile)[(None, coord)]``."""
    divided = _fl.zipped_divide(tensor.layout, _tiler(tile))
    # ((_, _, ...), coord): the free tile modes come out flattened, (TILE_M, TILE_N) rather than ((TILE_M, TILE_N)).
    free = (None,) * _fl.rank(_fl.get(divided, 0))
    return tensor.view(divided)[(free, _static_coord(coord))]


def local_partition(tensor: Tensor, thread_layout: _fl.Layout, thread_index) -> Tensor:
    """What thread ``thread_index`` of ``thread_layout`` owns when the threads tile ``tensor``: the elements at its
    coordinate in every tile (CuTe's outer partition)."""
    tile = tuple(
        _fl.size(m) for m in (thread_layout.shape if isinstance(thread_layout.shape, tuple) else (thread_layout.shape,))
    )
    position = _fl.right_inverse(thread_layout)(static_leaf(thread_index))
    coord = _fl.idx2crd(position, thread_layout.shape)
    divided = _fl.zipped_divide(tensor.layout, _tiler(tile))
    return tensor.view(divided)[(coord, (None,) * _fl.rank(_fl.get(divided, 1)))]


def _as_layout(layout):
    if isinstance(layout, int):
        return _fl.Layout(layout)
    if isinstance(layout, (_fl.Layout, _fl.ComposedLayout)):
        return layout
    return make_layout(layout)


def _static_cosize(layout) -> int:
    count = _fl.cosize(layout)
    if not isinstance(count, int):
        raise ValueError(f"shared memory needs a static layout, got {layout}")
    return count


def _element_class(dtype) -> type[Numeric]:
    """A numeric class from a numeric class or an MLIR type (``T.f32``)."""
    if isinstance(dtype, type) and issubclass(dtype, Numeric):
        return dtype
    from flydsl.expr.numeric import _BY_MLIR_NAME

    cls = _BY_MLIR_NAME.get(str(dtype))
    if cls is None:
        raise TypeError(f"dtype: expected a FlyDSL numeric type or a scalar MLIR type, got {dtype}")
    return cls


def _view_bytes(base: Tensor, byte_offset: int, dtype, layout, alignment: int | None = None) -> Tensor:
    """A ``dtype`` view at ``byte_offset`` into a byte buffer (``fly.recast_ptr`` of its pointer)."""
    dtype = _element_class(dtype)
    size = max(1, dtype.width // 8)
    if byte_offset % size:
        raise ValueError(f"offset: {byte_offset} bytes is not a multiple of the {size}-byte {dtype.__name__}")
    aligned = min(base.base_alignment, _power_of_two_divisor(byte_offset))
    alignment = min(alignment or aligned, aligned)
    if alignment < size:
        raise ValueError(f"offset: {byte_offset} bytes leaves {dtype.__name__} elements misaligned")
    pointer_type = ir.Type.parse(f"!fly.ptr<{dtype.mlir_name}, {base.space}, {base.base_alignment}>")
    pointer = _fly.RecastPtrOp(pointer_type, base.pointer).result
    return Tensor(
        pointer, _as_layout(layout), dtype, space=base.space, alignment=base.base_alignment, offset=byte_offset // size
    )


def _check_alignment(function: str, argument: str, alignment) -> None:
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or not 1 <= alignment <= SmemAllocator.MAX_ALIGNMENT
        or alignment & (alignment - 1)
    ):
        raise ValueError(
            f"{function}: {argument} must be a power of two from 1 to {SmemAllocator.MAX_ALIGNMENT} bytes, got"
            f" {alignment!r}"
        )


class SmemAllocator:
    """Shared memory for one kernel, placed by the compiler (``fly.alloc_smem``); the launch's shared-memory size
    follows.

    * ``allocate(dtype, layout)``: one buffer per call;
    * ``allocate_struct(a=(dtype, layout), b=...)``: fields laid out one after another in one block, each aligned
      (16 bytes by default; ``(dtype, layout, alignment)`` to say more), returned as attributes;
    * the seed's byte interface: set ``ptr`` to a size in bytes, ``get_base()`` allocates it once, and
      ``SmemPtr(base, byte_offset, T.f32, shape=(N,)).get()`` views a part of it.
    """

    # The largest alignment shared memory needs: a 128-byte swizzle repeats every 1024 bytes and the hardware
    # swizzles absolute addresses (``wgmma.smem_alignment``); a block has at most 227 KiB in all.
    MAX_ALIGNMENT = 1024

    def __init__(self, *_seed_args, arch=None, global_sym_name=None):
        # The seed's arguments (context, arch, symbol name) are accepted; placement is the compiler's job here.
        del arch, global_sym_name
        self.ptr = 0
        self._base: Tensor | None = None

    def allocate(self, dtype: type[Numeric], layout, alignment: int = 128) -> Tensor:
        """A shared-memory Tensor of ``dtype`` with ``layout`` (a layout, a shape, or an element count), aligned to
        ``alignment`` bytes (a power of two up to ``MAX_ALIGNMENT``)."""
        _check_alignment("SmemAllocator.allocate", "alignment", alignment)
        dtype = _element_class(dtype)
        layout = _as_layout(layout)
        pointer_type = ir.Type.parse(f"!fly.ptr<{dtype.mlir_name}, shared, {alignment}>")
        pointer = _fly.AllocSmemOp(pointer_type, _static_cosize(layout)).result
        return Tensor(pointer, layout, dtype, space="shared", alignment=alignment)

    def allocate_struct(self, **fields):
        """One block holding every field: ``s = smem.allocate_struct(a=(fx.BFloat16, (64, 64)), flag=(fx.Int64, 1))``
        then ``s.a`` and ``s.flag`` are Tensors. Fields keep their order; each starts at its alignment."""
        import types as _types

        placed, offset, widest = {}, 0, 16
        for name, spec in fields.items():
            dtype, layout, alignment = (*spec, 16)[:3] if isinstance(spec, tuple) else (spec, 1, 16)
            _check_alignment("SmemAllocator.allocate_struct", f"{name}'s alignment", alignment)
            dtype, layout = _element_class(dtype), _as_layout(layout)
            offset = -(-offset // alignment) * alignment
            placed[name] = (dtype, layout, offset, alignment)
            offset += _static_cosize(layout) * max(1, dtype.width // 8)
            widest = max(widest, alignment)
        block = self.allocate(Uint8, offset, alignment=widest)
        return _types.SimpleNamespace(
            **{
                name: _view_bytes(block, start, dtype, layout, alignment)
                for name, (dtype, layout, start, alignment) in placed.items()
            }
        )

    def get_base(self) -> Tensor:
        """The seed's byte buffer of ``ptr`` bytes (allocated on first call)."""
        if self._base is None:
            if not isinstance(self.ptr, int) or self.ptr <= 0:
                raise ValueError(f"SmemAllocator.ptr: set it to the number of bytes to allocate, got {self.ptr!r}")
            self._base = self.allocate(Uint8, self.ptr)
        return self._base


class SmemPtr:
    """The seed's view of part of a shared byte buffer: ``SmemPtr(base, byte_offset, T.f32, shape=(N,)).get()``."""

    def __init__(self, base: Tensor, offset: int, dtype, shape=None):
        self.base, self.offset, self.dtype, self.shape = base, offset, dtype, shape

    def get(self) -> Tensor:
        dtype = _element_class(self.dtype)
        if self.shape is None:
            available = (_static_cosize(self.base.layout) - self.offset) // max(1, dtype.width // 8)
            layout = _fl.Layout(available)
        else:
            layout = _fl.make_layout(tuple(self.shape))
        return _view_bytes(self.base, self.offset, dtype, layout)
