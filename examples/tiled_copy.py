"""A tiled copy through shared memory, written with layouts: every access is a 16-byte vector, proven from them.

Each block moves one TILE_M x TILE_N tile of a row-major fp16 matrix: global -> shared (optionally swizzled) ->
global. Each thread moves 8 contiguous elements; `local_tile` cuts the matrix into block tiles and each tile into
thread chunks, and `fx.copy` is lowered to 16-byte loads and stores because the layouts, the pointer alignments and
the divisibility of the dynamic row stride prove it (look for `ld.global.v4` in `--show-ptx`).

    python examples/tiled_copy.py                 # on a GPU: runs and checks; elsewhere: compiles to PTX
    python examples/tiled_copy.py --m 4096 --n 8192 --no-swizzle
"""

from __future__ import annotations

import argparse
import sys

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu

TILE_M, TILE_N, VECTOR = 64, 64, 8
THREADS = TILE_M * TILE_N // VECTOR  # 512: one 16-byte chunk each


@flyc.kernel
def tiled_copy(src: fx.Tensor, dst: fx.Tensor, swizzle: fx.Constexpr[bool]):
    chunks_per_row = TILE_N // VECTOR
    tid = gpu.thread_idx.x
    row, chunk = tid // chunks_per_row, tid % chunks_per_row  # chunks of a row go to consecutive threads
    block = (gpu.block_idx.x, gpu.block_idx.y)

    g_src = fx.local_tile(src, (TILE_M, TILE_N), block)  # (TILE_M, TILE_N) view of this block's tile
    g_dst = fx.local_tile(dst, (TILE_M, TILE_N), block)

    tile_layout = fl.Layout((TILE_M, TILE_N), (TILE_N, 1))  # row-major in shared memory
    if fx.const_expr(swizzle):
        # XOR the 16-byte chunk index with the row: column reads of 8 rows hit 8 different bank groups.
        tile_layout = fl.ComposedLayout(fl.Swizzle(3, 3, 3), 0, tile_layout)
    s_tile = fx.SmemAllocator().allocate(fx.Float16, tile_layout)

    # This thread's 8 contiguous elements in each view: (1, VECTOR) tiles, chunk (row, chunk).
    mine = (row, chunk)
    fx.copy(fx.local_tile(g_src, (1, VECTOR), mine), fx.local_tile(s_tile, (1, VECTOR), mine))
    gpu.barrier()
    fx.copy(fx.local_tile(s_tile, (1, VECTOR), mine), fx.local_tile(g_dst, (1, VECTOR), mine))


@flyc.jit
def copy_matrix(src, dst, swizzle: bool = True):
    m, n = src.shape
    if m % TILE_M or n % TILE_N:
        raise ValueError(f"src: this example copies whole {TILE_M}x{TILE_N} tiles, got a {m}x{n} matrix")
    if src.shape != dst.shape:
        raise ValueError(f"dst: expected shape {tuple(src.shape)}, got {tuple(dst.shape)}")
    tiled_copy(src, dst, swizzle).launch(grid=(m // TILE_M, n // TILE_N), block=THREADS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--no-swizzle", action="store_true")
    parser.add_argument("--show-ptx", action="store_true")
    args = parser.parse_args()
    swizzle = not args.no_swizzle

    spec = flyc.TensorSpec((args.m, args.n), "f16")  # compiles without a GPU
    module = tiled_copy.lower(spec, spec, swizzle)
    widths = sorted({line.split()[0] for line in module.ptx.splitlines() if line.strip().startswith(("ld.", "st."))})
    print(
        f"compiled tiled_copy (swizzle={swizzle}): {module.shared_bytes['tiled_copy']} bytes of shared memory,"
        f" accesses {widths}"
    )
    if args.show_ptx:
        print(module.ptx)
    if not flyc.runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only")
        return 0

    import torch

    src = torch.randn(args.m, args.n, device="cuda", dtype=torch.float16)
    dst = torch.full_like(src, float("nan"))
    copy_matrix(src, dst, swizzle)
    torch.cuda.synchronize()
    if not torch.equal(src, dst):
        wrong = (src != dst).nonzero()
        print(f"FAILED: {wrong.shape[0]} elements differ, first at {wrong[0].tolist()}")
        return 1
    print(f"copied a {args.m}x{args.n} fp16 matrix exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
