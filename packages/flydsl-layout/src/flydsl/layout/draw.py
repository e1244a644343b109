"""Pictures of layouts: an ASCII table (:func:`print_layout`) and SVG (:func:`draw`), with no dependencies.

A 2-D layout is drawn as a grid whose cell ``(m, n)`` shows the offset ``L(m, n)``; a rank-1 layout is one row. A TV
layout (``layout_tv(t, v)`` is an offset inside a ``tiler`` tile, as returned by :func:`make_layout_tv`) is drawn
over its tile: each cell shows the thread ``T#`` and value ``V#`` that hold it, coloured by thread.

Other cells are coloured by what the picture shows: with ``element_bytes``, by the 16-byte chunk the offset falls
in; a swizzled layout by the offset bits its swizzle flips (for the usual swizzles, the chunk's place in its row),
so that the permutation shows; any other layout by its offset.
"""

from __future__ import annotations

import sys

from . import int_tuple as it
from .layout import Layout, is_static, rank, size
from .leaf import LayoutError
from .swizzle import ComposedLayout, Swizzle

__all__ = ["print_layout", "layout_table", "draw"]

MAX_CELLS = 16384  # the largest picture drawn (128 x 128 cells); a bigger one is refused, not left running

_PALETTE = ["#cbe4f9", "#cdf5f6", "#eff9da", "#f9ebdf", "#f9d8d6", "#d6cdea", "#fce5cd", "#d9ead3"]


def _colouring(layout, element_bytes):
    """(the colour index of an offset, the title's note on it)."""
    if element_bytes is not None:
        if not isinstance(element_bytes, int) or element_bytes < 1:
            raise LayoutError(f"draw: element_bytes must be a positive int, got {element_bytes!r}")
        return (lambda offset: offset * element_bytes // 16), f"colour: 16-byte chunk of {element_bytes}-byte elements"
    if isinstance(layout, ComposedLayout) and isinstance(layout.outer, Swizzle) and layout.outer.bits:
        swizzle = layout.outer
        low = (swizzle.zzz_mask & -swizzle.zzz_mask).bit_length() - 1
        note = f"colour: offset bits {low}-{low + swizzle.bits - 1} (the bits the swizzle flips)"
        return (lambda offset: (offset & swizzle.zzz_mask) >> low), note
    return (lambda offset: offset), ""


def _check_cells(op, layout, cells):
    if cells > MAX_CELLS:
        raise LayoutError(f"{op}: {layout} has {cells} cells, more than the {MAX_CELLS} a picture shows")


def _grid(layout, tiler, element_bytes=None, op="draw"):
    """(title, rows, cols, {(m, n): (text lines, colour index)}, note on the colours) for a plain or TV layout."""
    if isinstance(layout, tuple) and len(layout) == 2 and tiler is None:
        tiler, layout = layout
    if not isinstance(layout, (Layout, ComposedLayout)):
        raise LayoutError(f"{op}: needs a layout, got {layout!r} ({type(layout).__name__})")
    if not is_static(layout):
        raise LayoutError(f"{op}: needs a static layout, got {layout}")
    if tiler is not None:
        return _tv_grid(layout, tiler, op)
    if rank(layout) > 2:
        raise LayoutError(f"{op}: needs a layout of rank 1 or 2, got {layout} of rank {rank(layout)}")
    two_d = rank(layout) == 2 and it.is_tuple(layout.shape)
    rows, cols = (size(layout[0]), size(layout[1])) if two_d else (1, size(layout))
    _check_cells(op, layout, rows * cols)
    colour_of, note = _colouring(layout, element_bytes)
    cells = {}
    for m in range(rows):
        for n in range(cols):
            value = layout(m, n) if two_d else layout(n)
            # A coordinate-valued (identity-like) layout shows the coordinate, coloured by its leaves' sum.
            colour = colour_of(value) if isinstance(value, int) else sum(it.leaves(value))
            cells[(m, n)] = ([it.tuple_str(value)], colour)
    return str(layout), rows, cols, cells, note


def _tv_grid(layout_tv, tiler, op):
    parts = tiler if isinstance(tiler, tuple) else (tiler,)
    shape = tuple(
        size(t) if isinstance(t, Layout) else it.product(it.check_int_tuple(t, op, "tiler", low=1)) for t in parts
    )
    rows, cols = (shape + (1,))[:2] if len(shape) < 2 else shape[:2]
    _check_cells(op, it.tuple_str(shape), rows * cols)
    threads, values = size(layout_tv[0]), size(layout_tv[1])
    _check_cells(op, layout_tv, threads * values)
    cells = {}
    for t in range(threads):
        for v in range(values):
            idx = layout_tv(t, v)
            m, n = idx % rows, (idx // rows) % cols
            cells.setdefault((m, n), ([f"T{t}", f"V{v}"], t))
    return f"{layout_tv} over {it.tuple_str(shape)}", rows, cols, cells, "colour: thread"


def layout_table(layout, tiler=None) -> str:
    """The ASCII table that :func:`print_layout` prints.

    >>> print(layout_table(Layout((2, 3), (3, 1))))
    (2,3):(3,1)
         0   1   2
        +---+---+---+
     0  | 0 | 1 | 2 |
        +---+---+---+
     1  | 3 | 4 | 5 |
        +---+---+---+
    """
    title, rows, cols, cells, _ = _grid(layout, tiler, op="layout_table")
    texts = {k: "".join(lines) for k, (lines, _) in cells.items()}
    w = max([len(t) for t in texts.values()] + [len(str(cols - 1))])
    rule = "    +" + "+".join("-" * (w + 2) for _ in range(cols)) + "+"
    out = [title, "    " + "".join(f" {n:>{w}}  " for n in range(cols)).rstrip(), rule]
    for m in range(rows):
        out.append(f"{m:>2}  |" + "|".join(f" {texts.get((m, n), ''):>{w}} " for n in range(cols)) + "|")
        out.append(rule)
    return "\n".join(out)


def print_layout(layout, tiler=None, file=None) -> None:
    """Print a rank-2 (or rank-1) layout as an ASCII table of offsets; a TV layout (with ``tiler``, or the pair
    from :func:`make_layout_tv`) as a table of ``T#V#``."""
    print(layout_table(layout, tiler), file=file or sys.stdout)


def draw(layout, path=None, *, tiler=None, cell: int = 40, element_bytes: int | None = None) -> str:
    """SVG picture of a 2-D layout (cells labelled with offsets) or of a TV layout (cells coloured by thread,
    labelled ``T#`` / ``V#``); returns the SVG text and writes it to ``path`` when given. ``element_bytes`` colours
    the cells of a layout by 16-byte chunk (see the module's docstring for the default colours).

    >>> svg = draw(Layout((2, 2), (1, 2)))
    >>> svg.startswith("<svg") and svg.count("<rect") == 5
    True
    """
    from html import escape  # here: html's entity tables cost an import of the layout package ~1.5 ms

    if type(cell) is not int or cell < 1:
        raise LayoutError(f"draw: cell must be a positive int (pixels), got {cell!r}")
    title, rows, cols, cells, note = _grid(layout, tiler, element_bytes)
    titles = [title, note] if note else [title]
    pad, head = cell, 10 + 14 * len(titles)
    char = 0.6 * max(8, cell // 4)  # a monospace character's width: the titles must fit
    width = max(pad + cols * cell + 8, 8 + int(char * max(len(t) for t in titles)))
    height = head + pad + rows * cell + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="{max(8, cell // 4)}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    out += [f'<text x="4" y="{16 + 14 * k}">{escape(t)}</text>' for k, t in enumerate(titles)]
    for n in range(cols):
        out.append(f'<text x="{pad + n * cell + cell // 2}" y="{head + pad - 6}" text-anchor="middle">{n}</text>')
    for m in range(rows):
        out.append(f'<text x="{pad - 6}" y="{head + pad + m * cell + cell // 2 + 4}" text-anchor="end">{m}</text>')
    for (m, n), (lines, colour) in sorted(cells.items()):
        x, y = pad + n * cell, head + pad + m * cell
        fill = _PALETTE[colour % len(_PALETTE)]
        out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="black"/>')
        for k, line in enumerate(lines):
            ty = y + cell // 2 + 4 + (k - (len(lines) - 1) / 2) * (cell // 3)
            out.append(f'<text x="{x + cell // 2}" y="{ty:.0f}" text-anchor="middle">{escape(line)}</text>')
    out.append("</svg>")
    svg = "\n".join(out) + "\n"
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg)
    return svg
