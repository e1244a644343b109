"""Draws the shared-memory layouts and register fragments of flydsl.expr.wgmma into docs/images/wgmma/ (SVG).

    python docs/images/make_wgmma_pictures.py

Atoms are drawn in 16-byte chunks (each cell: the chunk's position in memory), so one picture serves every element
type: a cell holds 8 bf16 or 16 fp8 elements along the contiguous mode.
"""

from __future__ import annotations

import pathlib

import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import wgmma

OUT = pathlib.Path(__file__).resolve().parent / "wgmma"


def in_chunks(layout):
    """The bf16 layout in 16-byte units (recast 16-bit elements to 128-bit ones)."""
    return fl.recast_layout(128, 16, layout)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    written = []

    def save(name, layout, **kwargs):
        fl.draw(layout, OUT / f"{name}.svg", **kwargs)
        written.append(name)

    for major in ("K", "MN"):
        for swizzle in wgmma.SWIZZLES:
            atom = wgmma.layout_atom(fx.BFloat16, major, swizzle)
            save(f"atom_{major}_sw{swizzle}_chunks", in_chunks(atom))
    # Element level: one 32-byte-swizzled K-major atom of bf16 (8 rows x 16 elements).
    save("atom_K_sw32_bf16", wgmma.layout_atom(fx.BFloat16, "K", 32))
    # A (64, 64) bf16 operand tile, K-major, 128B swizzle, in chunks: 8 atoms down M.
    save("tile_K_sw128_64x64_chunks", in_chunks(wgmma.smem_layout(fx.BFloat16, (64, 64), "K", 128)))
    # B (128, 16) bf16, N-major, 64B swizzle, in chunks: LBO between the 32-element atoms along N.
    save("tile_MN_sw64_128x16_chunks", in_chunks(wgmma.smem_layout(fx.BFloat16, (128, 16), "MN", 64)))
    # Register fragments, threads x values: the accumulator of m64n16 (the bf16 A fragment of RS is the same layout).
    atom = wgmma.MmaAtom(fx.BFloat16, 16, a_from_registers=True)
    assert atom.a_layout == atom.accumulator_layout
    save("accumulator_m64n16", atom.accumulator_layout, tiler=(64, 16))
    print(f"wrote {len(written)} pictures to {OUT}: {', '.join(written)}")


if __name__ == "__main__":
    main()
