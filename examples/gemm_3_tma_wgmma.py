"""GEMM tutorial, step 3 of 4: TMA loads into a multi-stage mbarrier pipeline, wgmma on the swizzled tiles
(docs/gemm-tutorial.md).

Same interface as steps 1 and 2. What this step adds, all Hopper (sm_90a):

* **TMA**: one thread copies a whole (128, 64) tile of A and four (64, 64) boxes of B per K step
  (``cp.async.bulk.tensor``), written into shared memory under the 128-byte swizzle; out-of-range parts of a box
  read as zeros, so the tails of M, N and K need no code on the load side.
* **A pipeline** (``fx.TmaPipeline``): ``stages`` shared-memory slots, each with a "full" mbarrier (completed by
  the bytes TMA brings) and an "empty" one (completed when every warp has released the slot). The loads run
  ``stages - 1`` K steps ahead of the MMAs, so global-memory latency hides behind tensor-core work.
* **wgmma** (``wgmma.mma_async``): a warpgroup (128 threads) multiplies 64 rows of A by the whole 256-column B tile
  straight from shared memory (no ldmatrix, no fragments in registers), asynchronously: the warpgroup keeps one K
  step of MMAs in flight (``wait_group(1)``) and frees the slot of the step before.

Each CTA of 2 warpgroups (256 threads) computes one 128 x 256 tile of C. Every thread issues MMAs; thread 0 also
issues the TMA loads between its MMAs (no warp specialization yet, one CTA per tile: step 4 changes both).

    python examples/gemm_3_tma_wgmma.py                       # CPU: compile and summarize; GPU: check and time
    python examples/gemm_3_tma_wgmma.py --m 4096 --n 4096 --k 4096 --show-ptx
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gemm_1_naive import check_operands, run_example

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, vector, wgmma

BOX_K = 64  # one 128-byte swizzled row of bf16: the widest row a 128B-swizzled TMA box (and wgmma atom) has


@dataclass(frozen=True)
class Config:
    """The CTA tile (tile_m x tile_n, K steps of 64) and the pipeline depth; one warpgroup per 64 rows."""

    tile_m: int = 128
    tile_n: int = 256
    stages: int = 4

    def __post_init__(self):
        if self.tile_m % 64 or self.tile_n % BOX_K or not 64 <= self.tile_n <= 256 or self.stages < 2:
            raise ValueError(f"{self}: tile_m a multiple of 64, tile_n of 64 up to 256 (one wgmma), stages >= 2")
        if self.stages * self.stage_bytes > 227 * 1024:
            raise ValueError(f"{self}: {self.stages} stages of {self.stage_bytes} B exceed the 227 KiB of a CTA")

    @property
    def warpgroups(self) -> int:
        return self.tile_m // 64

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def stage_bytes(self) -> int:
        return (self.tile_m + self.tile_n) * BOX_K * 2  # bf16 A and B tiles of one K step


CFG = Config()
# Shared memory as (MN, K, stage) views, in the layouts TMA writes and wgmma reads (docs/hopper-wgmma.md):
# A (tile_m, 64) is K-major: the 128B atom (8 rows of 64 bf16) repeated down M, exactly one TMA box per stage.
A_LAYOUT = wgmma.smem_layout(fx.BFloat16, (CFG.tile_m, BOX_K, CFG.stages), "K", 128)
# B is a row-major (K, N) tensor, so its tile is MN-major: a TMA box is 64 K-rows of 64 N-columns (128 bytes); atoms
# of 64 columns x 8 K-rows go down K first (order), filling one box, then the next 64 columns, then the stage.
B_LAYOUT = wgmma.smem_layout(fx.BFloat16, (CFG.tile_n, BOX_K, CFG.stages), "MN", 128, order=(1, 0, 2))
PAIR = vector.vector_class(fx.Float32, 2)


def load_stage(a, b, a_tiles, b_tiles, slot, m0, n0, k0, barrier):
    """The TMA loads of one K step into pipeline slot ``slot``: A's (tile_m, 64) box, B's (64, 64) boxes."""
    a.load(a_tiles[None, None, slot], (m0, k0), barrier)
    for j in fx.range_constexpr(CFG.tile_n // BOX_K):
        b.load(b_tiles[(None, j), None, slot], (k0, n0 + j * BOX_K), barrier)  # box corner: (K row, N column)


def store_tile(acc, c, row0, col0, lane, warp):
    """This thread's part of a 64 x tile_n accumulator (wgmma's layout: warp w has rows 16w..16w+15; value pair p
    is row l/4 + 8(p%2), columns 8(p/2) + 2(l%4) and +1) into C at (row0, col0), two floats per store."""
    m, n = c.shape[0].to(fx.Int32), c.shape[1].to(fx.Int32)
    for p in fx.range_constexpr(CFG.tile_n // 4):
        row = row0 + 16 * warp + lane // 4 + 8 * (p % 2)
        col = col0 + 8 * (p // 2) + 2 * (lane % 4)
        if (row < m) & (col < n):  # N % 8 == 0: both columns of the pair are inside or outside
            pair = vector.from_elements(PAIR, [acc[2 * p], acc[2 * p + 1]])
            vector.store(pair, c, (row, col))


@flyc.kernel(threads=CFG.threads)
def gemm_tma_wgmma(a: fx.TmaDescriptor, b: fx.TmaDescriptor, c: fx.Tensor):
    smem = fx.SmemAllocator()
    a_tiles = smem.allocate(fx.BFloat16, A_LAYOUT, alignment=1024)  # (tile_m, 64, stages), swizzle repeats: 1 KiB
    b_tiles = smem.allocate(fx.BFloat16, B_LAYOUT, alignment=1024)  # (tile_n, 64, stages)
    pipe = fx.TmaPipeline(smem, CFG.stages, CFG.stage_bytes, consumers=CFG.threads // 32)  # a release per warp
    pipe.init()

    tid = gpu.thread_idx.x
    lane, warp, warpgroup = tid % 32, (tid // 32) % 4, tid // 128
    m0, n0 = gpu.block_idx.y * CFG.tile_m, gpu.block_idx.x * CFG.tile_n
    k_tiles = ((a.shape[1] + (BOX_K - 1)) // BOX_K).to(fx.Int32)
    mma = wgmma.TiledMma(wgmma.MmaAtom(fx.BFloat16, CFG.tile_n), CFG.tile_m, CFG.tile_n, CFG.warpgroups)
    if tid == 0:
        a.prefetch()
        b.prefetch()

    # Prologue: the first stages - 1 K steps in flight before any MMA.
    load = pipe.producer_start()
    for s in fx.range_constexpr(CFG.stages - 1):
        if (tid == 0) & (fx.Int32(s) < k_tiles):
            pipe.producer_acquire(load)  # a fresh slot: passes at once, arms full[slot] with the stage's bytes
            load_stage(a, b, a_tiles, b_tiles, load.index, m0, n0, s * BOX_K, pipe.full[load.index])
        load = load.advance()

    read = pipe.consumer_start()
    released = read
    accs = mma.make_accumulators(0.0)
    for kt in range(k_tiles):
        pipe.consumer_wait(read)  # K step kt has landed
        accs = wgmma.fence(accs)
        accs = mma.mma(a_tiles[None, None, read.index], b_tiles[None, None, read.index], accs, accumulate=kt > 0)
        wgmma.commit_group()
        accs = wgmma.wait_group(1, accs)  # step kt - 1's MMAs are done: its slot may be refilled
        if kt > 0:
            if lane == 0:
                pipe.consumer_release(released)
            released = released.advance()
        # Refill that slot with K step kt + stages - 1 (the producer waits until every warp has released it).
        if (tid == 0) & (kt + (CFG.stages - 1) < k_tiles):
            pipe.producer_acquire(load)
            k0 = (kt + (CFG.stages - 1)) * BOX_K
            load_stage(a, b, a_tiles, b_tiles, load.index, m0, n0, k0, pipe.full[load.index])
        load = load.advance()
        read = read.advance()
    accs = wgmma.wait_group(0, accs)

    store_tile(accs[0], c, m0 + warpgroup * 64, n0, lane, warp)


def matmul(a, b, c) -> None:
    """c = a @ b: a (M, K) and b (K, N) bf16, c (M, N) float32, all row-major CUDA tensors; K, N multiples of 8
    (TMA moves rows of whole 16-byte units)."""
    m, n, k = check_operands(a, b, c, k_multiple=8)
    if m == 0 or n == 0:
        return
    if k == 0:
        c.zero_()
        return
    a_tile, b_tile = fx.TmaTile(a, (CFG.tile_m, BOX_K)), fx.TmaTile(b, (BOX_K, BOX_K))  # boxes, 128B swizzle
    gemm_tma_wgmma(a_tile, b_tile, c).launch(grid=(-(-n // CFG.tile_n), -(-m // CFG.tile_m)), block=CFG.threads)


def lower(m: int, n: int, k: int):
    a, b = flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((k, n), "bf16")
    return gemm_tma_wgmma.lower(
        fx.TmaTile(a, (CFG.tile_m, BOX_K)), fx.TmaTile(b, (BOX_K, BOX_K)), flyc.TensorSpec((m, n), "f32")
    )


PATTERNS = (r"cp\.async\.bulk\.tensor", r"mbarrier\.try_wait", r"wgmma\.mma_async", r"st\.global")


def main(argv=None) -> int:
    return run_example(__doc__, "gemm_tma_wgmma", lower, matmul, PATTERNS, argv)


if __name__ == "__main__":
    sys.exit(main())
