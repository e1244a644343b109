"""Thread-value (TV) layouts: which thread holds which value of a tile."""

from __future__ import annotations

from . import int_tuple as it
from .algebra import right_inverse
from .composition import composition
from .layout import as_layout, make_layout, size
from .memo import static_cache
from .tiling import raked_product

__all__ = ["make_layout_tv"]


@static_cache
def make_layout_tv(thr_layout, val_layout):
    """CuTe DSL's ``make_layout_tv``: returns ``(tiler_mn, layout_tv)`` where ``layout_tv(t, v)`` is the
    column-major offset inside the ``tiler_mn`` tile of value ``v`` of thread ``t``. The tile is the raked
    product of the thread layout by the value layout (each thread owns a ``val_layout`` block, threads
    interleaved).

    >>> make_layout_tv(make_layout((4, 2), (2, 1)), make_layout((1, 2), (2, 1)))
    ((4, 4), ((2,4),2):((8,1),4))
    """
    thr_layout = as_layout(thr_layout, "make_layout_tv", "thr_layout")
    val_layout = as_layout(val_layout, "make_layout_tv", "val_layout")
    layout_mn = raked_product(thr_layout, val_layout)
    thr_size, val_size = size(thr_layout), size(val_layout)
    layout_tv = composition(right_inverse(layout_mn), make_layout((thr_size, val_size), (1, thr_size)))
    return it.product_each(layout_mn.shape), layout_tv
