"""GEMM tutorial, step 2 of 4: tensor cores through mma.sync, operands staged in shared memory (docs/gemm-tutorial.md).

Same interface as step 1: C (M x N, float32) = A (M x K, bf16) @ B (K x N, bf16), all row-major. What this step
adds: a block of 8 warps computes a 128 x 128 tile of C, each warp a 64 x 32 part of it as 4 x 4 ``mma.sync``
tiles of m16n8k16, accumulated in float32 registers. Per K step of 32, the block copies the (128, 32) slice of A
and the (32, 128) slice of B into shared memory with 16-byte ``cp.async`` (every element of A and B is then read
from global memory once per block instead of once per thread), then each warp loads its fragments with
``ldmatrix`` (B transposed on the way) and issues 32 mma.sync. Rows of shared memory are padded by 16 bytes so that
the 8 row addresses of an ``ldmatrix`` fall in 8 different bank groups.

Tails: copies of rows or columns outside A and B are zero fills (``cp.async`` with 0 source bytes), and stores
outside C are skipped, so any M works; K and N must be multiples of 8 (whole 16-byte chunks).

The block still waits for every copy before its MMAs, and the copies wait for the MMAs: step 3 overlaps them.

    python examples/gemm_2_mma_sync.py                        # CPU: compile and summarize; GPU: check and time
    python examples/gemm_2_mma_sync.py --m 4096 --n 4096 --k 4096 --show-ptx
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gemm_1_naive import check_operands, run_example

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import arith, gpu, nvvm
from flydsl.expr.vector import Vector


@dataclass(frozen=True)
class TileConfig:
    """The block tile (bm x bn, K steps of bk) and the warp grid over it; each warp's part is a grid of m16n8k16."""

    bm: int = 128
    bn: int = 128
    bk: int = 32
    warps_m: int = 2
    warps_n: int = 4

    def __post_init__(self):
        if self.bm % (16 * self.warps_m) or self.bn % (8 * self.warps_n) or self.bk % 16:
            raise ValueError(f"{self}: warp tiles must be whole 16x8 mma tiles and bk a multiple of 16")
        if (self.bm * self.bk // 8) % self.threads or (self.bk * self.bn // 8) % self.threads:
            raise ValueError(f"{self}: the 16-byte chunks of a K step must spread evenly over {self.threads} threads")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def mma_tiles(self) -> tuple[int, int]:
        """mma.sync tiles per warp along M and N."""
        return self.bm // self.warps_m // 16, self.bn // self.warps_n // 8


CFG = TileConfig()
ACC = Vector.of(fx.Float32, 4)  # one m16n8 accumulator fragment per lane
SMEM_A = fl.Layout((CFG.bm, CFG.bk), (CFG.bk + 8, 1))  # (bm, bk), rows padded by 8 bf16
SMEM_B = fl.Layout((CFG.bk, CFG.bn), (CFG.bn + 8, 1))  # (bk, bn)


def copy_tile(g_src, s_dst, row0, col0, rows: int, cols: int, tid):
    """This thread's 16-byte chunks of the (rows, cols) tile of ``g_src`` at (row0, col0) into ``s_dst``
    (``cp.async``); chunks outside ``g_src`` are zero-filled without reading it."""
    src_rows, src_cols = g_src.shape[0].to(fx.Int32), g_src.shape[1].to(fx.Int32)
    chunks_per_row = cols // 8
    for i in fx.range_constexpr(rows * chunks_per_row // CFG.threads):
        chunk = tid + i * CFG.threads
        row, col = chunk // chunks_per_row, (chunk % chunks_per_row) * 8
        inside = (row0 + row < src_rows) & (col0 + col < src_cols)
        # Outside: point at element (0, 0) and read 0 bytes (the 16 bytes of shared memory become zeros).
        src = (arith.select(inside, row0 + row, 0), arith.select(inside, col0 + col, 0))
        nvvm.cp_async(s_dst, g_src, 16, dst_coord=(row, col), src_coord=src, src_bytes=arith.select(inside, 16, 0))


def mma_k_step(s_a, s_b, accs: list, warp_m, warp_n, lane) -> list:
    """One bk step of this warp's mma tiles: ldmatrix fragments of A and B, then mma.sync on every pair."""
    tiles_m, tiles_n = CFG.mma_tiles
    accs = list(accs)
    for ks in fx.range_constexpr(CFG.bk // 16):
        k0 = ks * 16
        # A: four 8x8 matrices per 16x16 fragment; lane l points at row l % 16, column (l // 16) * 8.
        a_frags = [
            nvvm.ldmatrix(s_a, (warp_m * tiles_m * 16 + mi * 16 + lane % 16, k0 + (lane // 16) * 8), num=4)
            for mi in fx.range_constexpr(tiles_m)
        ]
        # B: rows k0..k0+15 of an 8-column slice, transposed into the column-major fragment mma.sync reads.
        b_frags = [
            nvvm.ldmatrix(s_b, (k0 + lane % 16, warp_n * tiles_n * 8 + ni * 8), num=2, trans=True)
            for ni in fx.range_constexpr(tiles_n)
        ]
        for mi in fx.range_constexpr(tiles_m):
            for ni in fx.range_constexpr(tiles_n):
                accs[mi * tiles_n + ni] = nvvm.mma_sync(a_frags[mi], b_frags[ni], accs[mi * tiles_n + ni])
    return accs


def store_tile(c, accs: list, row0, col0, lane):
    """Lane l holds rows l // 4 (+8) and columns 2 (l % 4) (+1) of every 16x8 tile; N % 8 == 0, so a pair of
    columns is inside C or outside it together."""
    tiles_m, tiles_n = CFG.mma_tiles
    m, n = c.shape[0].to(fx.Int32), c.shape[1].to(fx.Int32)
    group, pair = lane // 4, (lane % 4) * 2
    for mi in fx.range_constexpr(tiles_m):
        for ni in fx.range_constexpr(tiles_n):
            acc = accs[mi * tiles_n + ni]
            row, col = row0 + mi * 16 + group, col0 + ni * 8 + pair
            if col < n:
                if row < m:
                    c[row, col] = acc[0]
                    c[row, col + 1] = acc[1]
                if row + 8 < m:
                    c[row + 8, col] = acc[2]
                    c[row + 8, col + 1] = acc[3]


@flyc.kernel
def gemm_mma_sync(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor):
    tid = gpu.thread_idx.x
    warp, lane = tid // 32, tid % 32
    warp_m, warp_n = warp // CFG.warps_n, warp % CFG.warps_n
    block_row, block_col = gpu.block_idx.y * CFG.bm, gpu.block_idx.x * CFG.bn
    smem = fx.SmemAllocator()
    s_a = smem.allocate(fx.BFloat16, SMEM_A)  # (bm, bk)
    s_b = smem.allocate(fx.BFloat16, SMEM_B)  # (bk, bn)
    tiles_m, tiles_n = CFG.mma_tiles
    k_steps = (a.shape[1].to(fx.Int32) + (CFG.bk - 1)) // CFG.bk

    accs = [ACC(0.0)] * (tiles_m * tiles_n)
    for kt in range(k_steps):
        copy_tile(a, s_a, block_row, kt * CFG.bk, CFG.bm, CFG.bk, tid)
        copy_tile(b, s_b, kt * CFG.bk, block_col, CFG.bk, CFG.bn, tid)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)
        gpu.barrier()  # every thread's chunks have landed
        accs = mma_k_step(s_a, s_b, accs, warp_m, warp_n, lane)
        gpu.barrier()  # everyone has read the tiles before the next step overwrites them

    store_tile(c, accs, block_row + warp_m * tiles_m * 16, block_col + warp_n * tiles_n * 8, lane)


def matmul(a, b, c) -> None:
    """c = a @ b: a (M, K) and b (K, N) bf16, c (M, N) float32, all row-major CUDA tensors; K, N multiples of 8."""
    m, n, k = check_operands(a, b, c, k_multiple=8)
    if m == 0 or n == 0:
        return
    if k == 0:
        c.zero_()
        return
    gemm_mma_sync(a, b, c).launch(grid=(-(-n // CFG.bn), -(-m // CFG.bm)), block=CFG.threads)


def lower(m: int, n: int, k: int):
    return gemm_mma_sync.lower(
        flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((k, n), "bf16"), flyc.TensorSpec((m, n), "f32")
    )


PATTERNS = (r"cp\.async\.cg", r"ldmatrix", r"mma\.sync", r"st\.global")


def main(argv=None) -> int:
    return run_example(__doc__, "gemm_mma_sync", lower, matmul, PATTERNS, argv)


if __name__ == "__main__":
    sys.exit(main())
