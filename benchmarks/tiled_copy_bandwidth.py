"""A tiled copy written with Fly tensors, over 2^30 fp32 elements with dynamic shapes, against torch's copy.

    python benchmarks/tiled_copy_bandwidth.py [--m 32768 --n 32768] [--json PATH --commit C]

Each block copies an 8 x 1024 tile; each of its 256 threads moves eight 16-byte chunks (consecutive threads take
consecutive chunks, so every warp moves 512 contiguous bytes per step). Nothing in the kernel names a vector
width: the copies are 16-byte accesses because the layouts (unit column stride, a row stride known to be a
multiple of 16 bytes) and the 16-byte aligned pointers prove it; the script checks the PTX for it. Bandwidth is
bytes read + written per second, medians of 20 timed runs (CUDA events) after warm-up, torch's `dst.copy_(src)` in
the same process; the output is poisoned and compared with the input after the timed runs.
"""

from __future__ import annotations

import argparse
import sys

from record import write_record  # this folder's sibling module

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu
from flydsl.kernels.bench import median_ms

TILE_M, TILE_N, VEC, THREADS = 8, 1024, 4, 256
CHUNKS_PER_THREAD = TILE_M * TILE_N // VEC // THREADS  # 8


@flyc.kernel
def tiled_copy_f32(src: fx.Tensor, dst: fx.Tensor):
    tile = (gpu.block_idx.x, gpu.block_idx.y)
    s_tile = fx.local_tile(src, (TILE_M, TILE_N), tile)  # (8, 1024) of this block
    d_tile = fx.local_tile(dst, (TILE_M, TILE_N), tile)
    chunks_per_row = TILE_N // VEC
    for step in fx.range_constexpr(CHUNKS_PER_THREAD):
        chunk = gpu.thread_idx.x + step * THREADS
        where = (chunk // chunks_per_row, chunk % chunks_per_row)
        fx.copy(fx.local_tile(s_tile, (1, VEC), where), fx.local_tile(d_tile, (1, VEC), where))


@flyc.jit
def copy(src, dst):
    m, n = src.shape
    if m % TILE_M or n % TILE_N:
        raise ValueError(f"src: expected a multiple of {TILE_M}x{TILE_N}, got {m}x{n}")
    tiled_copy_f32(src, dst).launch(grid=(m // TILE_M, n // TILE_N), block=THREADS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=32768)
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--commit", help="the commit measured (the GPU machine has no git)")
    args = parser.parse_args(argv)

    module = tiled_copy_f32.lower(flyc.TensorSpec((args.m, args.n), "f32"), flyc.TensorSpec((args.m, args.n), "f32"))
    accesses = sorted(
        {line.split()[0] for line in module.ptx.splitlines() if line.strip().startswith(("ld.g", "st.g"))}
    )
    print(f"global accesses in the PTX: {accesses}")
    if accesses != ["ld.global.v4.b32", "st.global.v4.b32"]:
        print("FAILED: the copy is not made of 16-byte accesses")
        return 1

    import torch

    src = torch.randn(args.m, args.n, device="cuda")
    dst = torch.full_like(src, float("nan"))
    gigabytes = 2 * src.numel() * src.element_size() / 1e9
    ours_ms = median_ms(lambda: copy(src, dst), 20)
    if not torch.equal(dst, src):
        print("FAILED: the copy is wrong")
        return 1
    dst.fill_(float("nan"))
    torch_ms = median_ms(lambda: dst.copy_(src), 20)
    ours, theirs = gigabytes / ours_ms, gigabytes / torch_ms  # GB/ms = TB/s
    print(
        f"{args.m}x{args.n} fp32 ({src.numel()} elements): FlyDSL {ours_ms:.3f} ms = {ours:.3f} TB/s;"
        f" torch copy_ {torch_ms:.3f} ms = {theirs:.3f} TB/s; ratio {ours / theirs:.3f}"
    )
    if args.json:
        measured = {
            "shape": [args.m, args.n],
            "bytes_moved": 2 * src.numel() * src.element_size(),
            "ptx_global_accesses": accesses,
            "flydsl_ms": ours_ms,
            "flydsl_tb_per_s": ours,
            "torch_copy_ms": torch_ms,
            "torch_copy_tb_per_s": theirs,
            "ratio_to_torch": ours / theirs,
        }
        write_record(args.json, "tiled_copy_bandwidth", argv, measured, commit=args.commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
