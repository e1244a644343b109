"""Draws the shared-memory layouts of docs/hopper.md into docs/images/hopper/ (SVG).

    python docs/images/make_hopper_pictures.py

TMA boxes are drawn in 16-byte chunks (a cell is a chunk; its label is the chunk's position in shared memory), so
one picture serves every element type. The tiled copy is drawn as a thread-value layout.
"""

from __future__ import annotations

import pathlib

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr.tma import swizzle_layout
from flydsl.kernels.gemm import operand_layout

OUT = pathlib.Path(__file__).resolve().parent / "hopper"


def in_chunks(layout, element_bytes: int = 2):
    """The layout in 16-byte units."""
    return fl.recast_layout(128, 8 * element_bytes, layout)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    # One TMA box of 8 rows x 128 bytes (64 bf16) with each swizzle (128-byte rows need the 128B swizzle; the narrower
    # swizzles are drawn with rows of their own width).
    for swizzle in (0, 32, 64, 128):
        row_elements = (swizzle or 64) // 2
        layout = swizzle_layout(2, swizzle, (8, row_elements))
        fl.draw(in_chunks(layout), OUT / f"tma_box_sw{swizzle}_chunks.svg")
    # The GEMM's operands in one pipeline slot (bf16, 128B swizzle), (MN, K) = (64, 64) shown: K-major is one box of
    # 64 rows; MN-major is one box of the (K, MN) tensor per 64 MN.
    fl.draw(in_chunks(fl.ComposedLayout(*_slot(operand_layout(64, 64, 1, "K")))), OUT / "gemm_operand_K_chunks.svg")
    fl.draw(in_chunks(fl.ComposedLayout(*_slot(operand_layout(64, 64, 1, "MN")))), OUT / "gemm_operand_MN_chunks.svg")
    # A tiled copy: 128 threads, each 8 contiguous fp16 (16 bytes) of a 16 x 64 tile.
    copier = fx.TiledCopy(fl.Layout((16, 8), (8, 1)), fl.Layout((1, 8)))
    fl.draw(copier.layout_tv, OUT / "tiled_copy_tv.svg", tiler=copier.tile)
    print("wrote", sorted(p.name for p in OUT.glob("*.svg")))


def _slot(layout):
    """(swizzle, offset, (MN, K) layout) of stage 0 of an (MN, K, stages) operand layout."""
    inner = layout.inner
    return layout.outer, layout.offset, fl.Layout(inner.shape[:2], inner.stride[:2])


if __name__ == "__main__":
    main()
