"""Tiled copies: a thread-value layout (CuTe's ``TiledCopy``) that says which elements of a tile each thread moves,
so that a block copies a tile with one ``fx.copy`` per thread, as wide as the layouts allow (16 bytes when a
thread's values are contiguous and aligned).

    copier = fx.TiledCopy(thr_layout=fl.Layout((16, 8), (8, 1)), val_layout=fl.Layout((1, 8)))  # 128 threads
    copier.copy(g_tile, s_tile, tid)         # g_tile, s_tile: any tensors whose shape is a multiple of copier.tile

The tile is the raked product of the two layouts: thread ``t`` owns a ``val_layout`` block at ``thr_layout``'s
position of ``t``, in every tile of the tensors. Swizzled (composed) layouts are divided on their inner layout, so
a swizzled shared-memory tile is partitioned like a plain one.
"""

from __future__ import annotations

import flydsl.layout as _fl
from flydsl.expr.tensor import Tensor, _as_layout, copy

__all__ = ["TiledCopy"]


def _on_inner(layout, transform):
    """``transform`` applied to a layout, or to the inner layout of a swizzled one (the swizzle acts on offsets)."""
    if isinstance(layout, _fl.ComposedLayout):
        return _fl.ComposedLayout(layout.outer, layout.offset, transform(layout.inner))
    return transform(layout)


class TiledCopy:
    """Threads ``thr_layout`` (thread index -> position in the thread grid) each copying a ``val_layout`` block."""

    def __init__(self, thr_layout, val_layout):
        self.thr_layout, self.val_layout = _as_layout(thr_layout), _as_layout(val_layout)
        self.tile, self.layout_tv = _fl.make_layout_tv(self.thr_layout, self.val_layout)

    @property
    def threads(self) -> int:
        return _fl.size(self.thr_layout)

    @property
    def values(self) -> int:
        return _fl.size(self.val_layout)

    def __repr__(self):
        return f"TiledCopy(tile={self.tile}, threads={self.threads}, values={self.values}, tv={self.layout_tv})"

    def _thread_view(self, layout):
        """((thread, value), tiles...) of ``layout``."""
        tiler = tuple(_fl.Layout(extent) for extent in self.tile)
        if _fl.rank(layout) != len(tiler):
            raise ValueError(f"TiledCopy: a rank-{len(tiler)} tile cannot divide a tensor of shape {layout.shape}")

        def divide(inner):
            divided = _fl.zipped_divide(inner, tiler)
            return _fl.make_layout(_fl.composition(_fl.get(divided, 0), self.layout_tv), _fl.get(divided, 1))

        return _on_inner(layout, divide)

    def partition(self, tensor: Tensor, thread) -> Tensor:
        """Thread ``thread``'s elements of ``tensor``: a view of shape ``(values, tiles...)``."""
        shape = tensor.layout.inner.shape if isinstance(tensor.layout, _fl.ComposedLayout) else tensor.shape
        for extent, tile in zip(shape if isinstance(shape, tuple) else (shape,), self.tile, strict=False):
            if isinstance(extent, int) and extent % tile:
                raise ValueError(f"TiledCopy: shape {shape} is not a multiple of the copy's tile {self.tile}")
        view = tensor.view(self._thread_view(tensor.layout))
        rest = (None,) * _fl.rank(_fl.get(_inner(view.layout), 1))
        return view[((thread, None), rest)]

    def copy(self, source: Tensor, target: Tensor, thread, predicate=None) -> None:
        """This thread's share of ``target = source``."""
        copy(self.partition(source, thread), self.partition(target, thread), predicate)


def _inner(layout):
    return layout.inner if isinstance(layout, _fl.ComposedLayout) else layout
