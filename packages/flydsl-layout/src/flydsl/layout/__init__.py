"""flydsl.layout: the CuTe layout algebra in pure Python.

>>> import flydsl.layout as fl
>>> fl.composition(fl.Layout((6, 2), (8, 2)), fl.Layout((4, 3), (3, 1)))
((2,2),3):((24,2),8)

Modules, each importing only the ones above it: ``leaf`` (the integer-like protocol), ``int_tuple``, ``memo``,
``layout``, ``constructors``, ``composition``, ``algebra``, ``tiling``, ``swizzle``, ``tv``, then ``parse`` and
``draw``.
See ``docs/layout.md`` for the guide and the reference table.
"""

from .algebra import (
    complement,
    downcast,
    left_inverse,
    max_common_layout,
    max_common_vector,
    nullspace,
    recast_layout,
    right_inverse,
    upcast,
)
from .composition import coalesce, composition, filter_layout, filter_zeros
from .constructors import make_basis_like, make_identity_layout, make_ordered_layout
from .draw import draw, layout_table, print_layout
from .int_tuple import (
    ceil_div,
    congruent,
    elem_less,
    flatten,
    inner_product,
    is_tuple,
    prefix_product,
    product,
    product_each,
    shape_div,
    weakly_congruent,
)
from .layout import (
    Layout,
    append,
    cosize,
    crd2crd,
    crd2idx,
    depth,
    dice,
    get,
    group,
    group_modes,
    idx2crd,
    is_static,
    make_layout,
    prepend,
    rank,
    select,
    size,
    slice_,
    slice_and_offset,
    take,
)
from .leaf import LayoutError, ScaledBasis, as_coord, known_divisor, leaf_max, leaf_min
from .memo import clear_caches
from .parse import parse_int_tuple, parse_layout
from .swizzle import ComposedLayout, Swizzle, make_composed_layout, make_swizzle
from .tiling import (
    blocked_product,
    flat_divide,
    flat_product,
    logical_divide,
    logical_product,
    raked_product,
    tile_to_shape,
    tiled_divide,
    tiled_product,
    zipped_divide,
    zipped_product,
)
from .tv import make_layout_tv

filter = filter_layout  # noqa: A001 - CuTe's public name; modules use filter_layout


def E(*mode) -> ScaledBasis:
    """CuTe's basis element ``E<i, j, ...>``: ``1@i@j...`` (``E(0)`` is ``1@0``, ``E(1, 0)`` is ``1@1@0``)."""
    return ScaledBasis(1, tuple(mode))


__all__ = [
    # IntTuples
    "is_tuple",
    "flatten",
    "rank",
    "depth",
    "size",
    "product",
    "product_each",
    "inner_product",
    "prefix_product",
    "shape_div",
    "ceil_div",
    "congruent",
    "weakly_congruent",
    "elem_less",
    "is_static",
    "known_divisor",
    "leaf_max",
    "leaf_min",
    "LayoutError",
    # construction and coordinates
    "Layout",
    "make_layout",
    "make_ordered_layout",
    "make_identity_layout",
    "make_basis_like",
    "ScaledBasis",
    "E",
    "as_coord",
    "crd2idx",
    "idx2crd",
    "crd2crd",
    # structure
    "cosize",
    "get",
    "select",
    "take",
    "group",
    "group_modes",
    "append",
    "prepend",
    "slice_",
    "slice_and_offset",
    "dice",
    # algebra
    "coalesce",
    "filter",
    "filter_layout",
    "filter_zeros",
    "composition",
    "complement",
    "right_inverse",
    "left_inverse",
    "nullspace",
    "max_common_layout",
    "max_common_vector",
    "upcast",
    "downcast",
    "recast_layout",
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "zipped_product",
    "tiled_product",
    "flat_product",
    "blocked_product",
    "raked_product",
    "tile_to_shape",
    # swizzles, TV layouts
    "Swizzle",
    "ComposedLayout",
    "make_swizzle",
    "make_composed_layout",
    "make_layout_tv",
    # memo of static results
    "clear_caches",
    # text and pictures
    "parse_layout",
    "parse_int_tuple",
    "print_layout",
    "layout_table",
    "draw",
]
