"""A bf16 GEMM tile on tensor cores: cp.async into shared memory, ldmatrix fragments, mma.sync m16n8k16.

C (M x N, float32) = A (M x K, bf16, row-major) @ B (K x N, bf16, row-major). Each block of 4 warps computes one
64x64 tile of C; each warp a 32x32 quarter of it as 2 x 4 mma.sync tiles of 16x8, accumulated in float32 registers
over the K loop. Per K step of 32: every thread issues two 16-byte cp.async for A and two for B into shared memory
(rows padded by 16 bytes, so that the 8 row addresses of an ldmatrix hit 8 different bank groups), then each warp
loads its fragments with ldmatrix (B transposed on the way: ldmatrix.trans) and issues 16 mma.sync.

    python examples/tiled_mma.py                        # on a GPU: runs and checks against torch (float32)
    python examples/tiled_mma.py --m 512 --n 256 --k 1024 --show-ptx
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu, nvvm
from flydsl.expr.vector import Vector


@dataclass(frozen=True)
class TileConfig:
    """The block tile (BM x BN, K step BK), the warp grid, and the mma.sync shape m16n8k16."""

    bm: int = 64
    bn: int = 64
    bk: int = 32
    warps_m: int = 2
    warps_n: int = 2

    def __post_init__(self):
        if self.bm % (16 * self.warps_m) or self.bn % (8 * self.warps_n) or self.bk % 16:
            raise ValueError(f"{self}: warp tiles must be whole 16x8 mma tiles and BK a multiple of 16")
        if (self.bm * self.bk // 8) % self.threads or (self.bk * self.bn // 8) % self.threads:
            raise ValueError(f"{self}: the 16-byte chunks of a K step must spread evenly over {self.threads} threads")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def mma_tiles(self) -> tuple[int, int]:
        """mma.sync tiles per warp along M and N."""
        return self.bm // self.warps_m // 16, self.bn // self.warps_n // 8


CONFIG = TileConfig()
ACC = Vector.of(fx.Float32, 4)  # one mma.sync accumulator fragment per lane
# Shared-memory tiles, row-major with rows padded by 8 bf16 (16 bytes): conflict-free ldmatrix and cp.async.
SMEM_A = fl.Layout((CONFIG.bm, CONFIG.bk), (CONFIG.bk + 8, 1))  # (BM, BK)
SMEM_B = fl.Layout((CONFIG.bk, CONFIG.bn), (CONFIG.bn + 8, 1))  # (BK, BN)


def load_k_step(g_src, s_dst, row0, col0, rows: int, cols: int, tid):
    """Copies the (rows, cols) tile of ``g_src`` at (row0, col0) to ``s_dst`` in 16-byte cp.async chunks."""
    chunks_per_row = cols // 8
    for i in fx.range_constexpr(rows * chunks_per_row // CONFIG.threads):
        chunk = tid + i * CONFIG.threads
        row, col = chunk // chunks_per_row, (chunk % chunks_per_row) * 8
        nvvm.cp_async(s_dst, g_src, 16, dst_coord=(row, col), src_coord=(row0 + row, col0 + col))


def mma_k_step(s_a, s_b, accs: list, warp_m, warp_n, lane) -> list:
    """One BK step of this warp's (2 x 4) mma tiles: ldmatrix fragments of A and B, then mma.sync."""
    tiles_m, tiles_n = CONFIG.mma_tiles
    accs = list(accs)
    for ks in fx.range_constexpr(CONFIG.bk // 16):
        k0 = ks * 16
        # A fragments: 4 8x8 matrices (rows +0/+8, cols +0/+8); lane l gives the address of row l % 16, column
        # (l // 16) * 8.
        a_frags = [
            nvvm.ldmatrix(s_a, (warp_m * tiles_m * 16 + mi * 16 + lane % 16, k0 + (lane // 16) * 8), num=4)
            for mi in fx.range_constexpr(tiles_m)
        ]
        # B fragments: rows k0..k0+15 of an 8-column slice, transposed into the column-major fragment mma wants.
        b_frags = [
            nvvm.ldmatrix(s_b, (k0 + lane % 16, warp_n * tiles_n * 8 + ni * 8), num=2, trans=True)
            for ni in fx.range_constexpr(tiles_n)
        ]
        for mi in fx.range_constexpr(tiles_m):
            for ni in fx.range_constexpr(tiles_n):
                accs[mi * tiles_n + ni] = nvvm.mma_sync(a_frags[mi], b_frags[ni], accs[mi * tiles_n + ni])
    return accs


def store_accumulators(c, accs: list, row0, col0, lane):
    """Each lane holds rows lane // 4 (+8) and columns 2 * (lane % 4) (+1) of every 16x8 tile."""
    tiles_m, tiles_n = CONFIG.mma_tiles
    group, pair = lane // 4, (lane % 4) * 2
    for mi in fx.range_constexpr(tiles_m):
        for ni in fx.range_constexpr(tiles_n):
            acc = accs[mi * tiles_n + ni]
            row, col = row0 + mi * 16 + group, col0 + ni * 8 + pair
            c[row, col] = acc[0]
            c[row, col + 1] = acc[1]
            c[row + 8, col] = acc[2]
            c[row + 8, col + 1] = acc[3]


@flyc.kernel
def tiled_mma(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, k_steps: fx.Int32):
    tid = gpu.thread_idx.x
    warp, lane = tid // 32, tid % 32
    warp_m, warp_n = warp // CONFIG.warps_n, warp % CONFIG.warps_n
    block_row, block_col = gpu.block_idx.x * CONFIG.bm, gpu.block_idx.y * CONFIG.bn
    smem = fx.SmemAllocator()  # dynamic shared memory: the launch's size follows from the two tiles
    s_a = smem.allocate(fx.BFloat16, SMEM_A)  # (BM, BK)
    s_b = smem.allocate(fx.BFloat16, SMEM_B)  # (BK, BN)
    tiles_m, tiles_n = CONFIG.mma_tiles

    for kt, accs in range(0, k_steps, 1, init=[ACC(0.0)] * (tiles_m * tiles_n)):
        load_k_step(a, s_a, block_row, kt * CONFIG.bk, CONFIG.bm, CONFIG.bk, tid)
        load_k_step(b, s_b, kt * CONFIG.bk, block_col, CONFIG.bk, CONFIG.bn, tid)
        nvvm.cp_async_commit_group()
        nvvm.cp_async_wait_group(0)
        gpu.barrier()  # every thread's chunks have landed
        updated = mma_k_step(s_a, s_b, accs, warp_m, warp_n, lane)
        gpu.barrier()  # everyone is done reading before the next step overwrites
        results = yield updated

    warp_row = block_row + warp_m * tiles_m * 16
    warp_col = block_col + warp_n * tiles_n * 8
    store_accumulators(c, results, warp_row, warp_col, lane)


def check_shapes(m: int, n: int, k: int) -> None:
    if m % CONFIG.bm or n % CONFIG.bn or k % CONFIG.bk:
        raise ValueError(f"this example multiplies whole tiles: M % {CONFIG.bm}, N % {CONFIG.bn}, K % {CONFIG.bk} == 0")


def matmul(a, b, c) -> None:
    """c = a @ b for torch tensors (bf16 a, b; float32 c), all row-major and contiguous."""
    (m, k), (_, n) = a.shape, b.shape
    check_shapes(m, n, k)
    tiled_mma(a, b, c, k // CONFIG.bk).launch(grid=(m // CONFIG.bm, n // CONFIG.bn), block=CONFIG.threads)


class _FakeMatrix:
    """Shape and type of a row-major matrix, for compiling where there is no GPU."""

    def __init__(self, rows, cols, typestr):
        self.__cuda_array_interface__ = {
            "shape": (rows, cols),
            "typestr": typestr,
            "data": (1 << 20, False),
            "strides": None,
            "version": 3,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--n", type=int, default=192)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--show-ptx", action="store_true")
    args = parser.parse_args()
    check_shapes(args.m, args.n, args.k)

    module = tiled_mma.lower(
        _FakeMatrix(args.m, args.k, "<bfloat16"),  # no numpy typestr for bf16: the torch name is accepted
        _FakeMatrix(args.k, args.n, "<bfloat16"),
        _FakeMatrix(args.m, args.n, "<f4"),
        args.k // CONFIG.bk,
    )
    instructions = sorted(
        {line.split()[0] for line in module.ptx.splitlines() if line.strip().startswith(("mma.", "ldmatrix", "cp."))}
    )
    print(f"compiled tiled_mma ({CONFIG}): {instructions}")
    if args.show_ptx:
        print(module.ptx)
    if not flyc.runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only (run on a GPU machine to launch and check)")
        return 0

    import torch

    torch.manual_seed(0)
    a = torch.randn(args.m, args.k, device="cuda").to(torch.bfloat16)
    b = torch.randn(args.k, args.n, device="cuda").to(torch.bfloat16)
    c = torch.full((args.m, args.n), float("nan"), device="cuda")
    matmul(a, b, c)
    torch.cuda.synchronize()
    reference = a.float() @ b.float()  # bf16 products are exact in float32: only the summation order differs
    error = (c - reference).abs().max().item()
    tolerance = 1e-4 * reference.abs().max().item() + 1e-4
    if not error <= tolerance:  # NaN (an element never written) fails too
        print(f"FAILED: max |C - reference| = {error:.3g} > {tolerance:.3g}")
        return 1
    print(f"{args.m}x{args.n}x{args.k} bf16 GEMM on {torch.cuda.get_device_name()}: max abs error {error:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
