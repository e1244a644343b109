"""A read of the same bytes: the roofline of a kernel that streams memory it does not write back.

Decode kernels (paged attention, skinny GEMMs, MoE at one token) read their operand once and write almost nothing.
A same-bytes ``copy_`` (half the bytes copied into as many) is not their ceiling below ~2x the L2's size: its writes
stay in the L2, so it reads half the bytes from DRAM while the kernel must read them all (docs/tuning/gemm.md#skinny).
This kernel reads exactly the bytes, 16 bytes per load, 4 KB rows, ``ROWS_IN_FLIGHT`` rows per CTA per step, and
writes one word per warp (a running XOR, so that no load is dead):

    from read_roofline import reader
    read = reader(nbytes)              # a callable over a fresh buffer of nbytes (rounded up to 4 KB)
    ms = bench_cold(read)              # timed like the kernel it bounds

Run alone it prints TB/s over sizes: ``python benchmarks/read_roofline.py [--mb 16 64 256 1024]``.
"""

from __future__ import annotations

import argparse

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm

ROW_WORDS = 1024  # 4 KB rows: 256 threads x 16 bytes
THREADS = 256
ROWS_IN_FLIGHT = 4  # rows a CTA loads per step (16 KB; 4 CTAs an SM keep 64 KB in flight)
CTAS_PER_SM = 4


@flyc.kernel
def read_rows(src: fx.Tensor, sink: fx.Tensor):
    """``src`` (rows, 1024) int32; CTA ``b`` reads rows ``b, b + grid, ...``, ``ROWS_IN_FLIGHT`` at a time; warp
    ``w`` of CTA ``b`` writes the XOR of its words to ``sink[b * 8 + w]``."""
    flyc.set_kernel_attributes(threads=THREADS, min_blocks_per_sm=CTAS_PER_SM)
    tid = gpu.thread_idx.x
    rows = src.shape[0].to(fx.Int32)
    grid = gpu.grid_dim.x.to(fx.Int32)
    steps = (rows + grid * ROWS_IN_FLIGHT - 1) // (grid * ROWS_IN_FLIGHT)
    acc = fx.Int32(0)
    for step in range(steps):
        words = []
        for u in fx.range_constexpr(ROWS_IN_FLIGHT):
            row = (step * ROWS_IN_FLIGHT + u) * grid + gpu.block_idx.x
            words.append(nvvm.ld_global(src, (row, 4 * tid), 16, predicate=row < rows))
        for loaded in words:
            for i in fx.range_constexpr(4):
                acc = acc ^ loaded[i]
    acc = gpu.warp_reduce(acc, lambda a, b: a ^ b)
    if tid % 32 == 0:
        sink[gpu.block_idx.x * (THREADS // 32) + tid // 32] = acc


def reader(nbytes: int, device: str = "cuda", buffer=None):
    """A callable that reads ``nbytes`` (rounded up to whole 4 KB rows) with :func:`read_rows`, one wave of CTAs
    over the GPU's SMs: a fresh buffer, or the first bytes of ``buffer`` (a contiguous torch tensor that holds them,
    e.g. the one a benchmark's copy uses, so that the read costs no memory of its own)."""
    import torch

    rows = max(1, -(-nbytes // (4 * ROW_WORDS)))
    if buffer is None:
        src = torch.zeros(rows, ROW_WORDS, dtype=torch.int32, device=device)
    else:
        if not buffer.is_contiguous() or buffer.nbytes < rows * 4 * ROW_WORDS:
            raise ValueError(f"reader: buffer: expected a contiguous tensor of >= {rows * 4 * ROW_WORDS} bytes")
        src = buffer.view(-1).view(torch.uint8)[: rows * 4 * ROW_WORDS].view(torch.int32).view(rows, ROW_WORDS)
    ctas = min(rows, torch.cuda.get_device_properties(device).multi_processor_count * CTAS_PER_SM)
    sink = torch.empty(ctas * (THREADS // 32), dtype=torch.int32, device=device)

    def read():
        read_rows(src, sink).launch(grid=ctas, block=THREADS)

    return read


def main(argv=None) -> int:
    from cold_l2 import bench_cold

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[8, 16, 32, 64, 128, 256, 1024])
    parser.add_argument("--flush", default="dirty")
    args = parser.parse_args(argv)
    for mb in args.mb:
        nbytes = int(mb * 1e6)
        ms = bench_cold(reader(nbytes), flush=args.flush, warmup=10, rep=40, queued=True)
        print(f"{mb:8.0f} MB: {ms * 1e3:8.2f} us  {nbytes / ms / 1e9:6.2f} TB/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
