"""GEMM tutorial, step 4 of 4: warp-specialized, persistent, 2-CTA clusters: the library kernel
``flydsl.kernels.gemm`` (docs/gemm-tutorial.md).

Same interface as steps 1-3; this step runs the kernel the library ships (``gemm_ws`` in
packages/flydsl-kernels/src/flydsl/kernels/gemm/warp_specialized.py, composed of the building blocks beside it:
operands.py's TMA producer, mainloop.py's wgmma consumer, epilogue.py, schedulers.py). What it adds to step 3:

* **Warp specialization**: warpgroup 0 is a producer (one thread issues every TMA load; it never waits for an MMA),
  warpgroups 1 and 2 are consumers (each 64 rows of a 128 x 256 tile; they never issue a load). In step 3 thread 0
  stalled its warpgroup's MMAs whenever it waited for a free slot.
* **setmaxnreg**: the producer gives its registers away (40 per thread) and the consumers take them (232), so the
  64 x 256 float32 accumulators (128 registers per thread) fit with room for addresses.
* **A persistent tile loop** (``schedulers.GroupedTiles`` over ``fx.TileScheduler``): one CTA per SM walks tiles
  b, b + grid, ... in a grouped order (8 tile rows at a time, for L2 reuse of A and B); the pipeline runs on across
  tile boundaries, so the producer loads the next tile's first K steps while the consumers finish the current tile
  and store it.
* **Clusters of 2 CTAs along M** sharing each B tile: each CTA loads half of it and TMA multicasts both halves to
  both CTAs; a slot is freed by the consumer warps of both CTAs (arrivals on the peer's empty barrier).
* **The epilogue** stores whole tiles without bounds checks (only edge tiles check), in C's type (bf16/fp16/fp32).

    python examples/gemm_4_warp_specialized.py                # CPU: compile and summarize; GPU: check and time
    python examples/gemm_4_warp_specialized.py --m 4096 --n 4096 --k 4096 --show-ptx
"""

from __future__ import annotations

import sys

from gemm_1_naive import check_operands, run_example

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.kernels.gemm import Epilogue, GemmConfig, gemm, gemm_ws  # pip install packages/flydsl-kernels

CFG = GemmConfig()  # tile 128 x 256 x 64, 4 stages, 2 consumer warpgroups, group_m 8, cluster_m 2


def matmul(a, b, c) -> None:
    """c = a @ b: a (M, K) and b (K, N) bf16, c (M, N) float32, all row-major CUDA tensors; K, N multiples of 8.
    (``gemm`` itself also takes column-major operands, fp16, and bf16/fp16 outputs.)"""
    check_operands(a, b, c, k_multiple=8)
    gemm(a, b, c, CFG)


def lower(m: int, n: int, k: int):
    """What ``gemm`` launches for a row-major (M, K) A and (K, N) B: A K-major in (128, 64) boxes; B MN-major in
    (64, 64) boxes of the (K, N) tensor (each CTA of a cluster loads half of the 256 columns)."""
    a, b = flyc.TensorSpec((m, k), "bf16"), flyc.TensorSpec((k, n), "bf16")
    a_tile, b_tile = fx.TmaTile(a, (CFG.tile_m, 64)), fx.TmaTile(b, (CFG.tile_k, 64))
    c = flyc.TensorSpec((m, n), "f32")
    return gemm_ws.lower(a_tile, b_tile, c, a_tile, c, c, c, CFG, ("K", "MN"), Epilogue())  # register stores


PATTERNS = (
    r"cp\.async\.bulk\.tensor",
    r"mbarrier\.try_wait",
    r"wgmma\.mma_async",
    r"setmaxnreg",
    r"mbarrier\.arrive",
    r"st\.global",
)


def main(argv=None) -> int:
    return run_example(__doc__, "gemm_ws", lower, matmul, PATTERNS, argv)


if __name__ == "__main__":
    sys.exit(main())
