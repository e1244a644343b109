"""Vector add in the seed's kernel authoring pattern: buffer resources, range-checked vector loads and stores.

    python examples/vector_add.py            # on a GPU: runs and checks c == a + b; elsewhere: compiles to PTX
    python examples/vector_add.py --n 1000003

Out-of-range accesses of a buffer resource read zeros and drop their writes, so the tail needs no `if`: each thread
moves 4 floats (one 16-byte access when the offset is known to be a multiple of 4), and threads past the end do
nothing. The layout lines are the seed's `idx2crd` idiom: a thread's (warp, lane) coordinate.
"""

from __future__ import annotations

import argparse
import sys

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import buffer_ops, gpu
from flydsl.expr.typing import Int64, T

THREADS = 256
VEC = 4


@flyc.kernel
def vector_add(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, N: Int64):
    # In 64 bits: past 2^31 elements an Int32 `tid * VEC` would wrap negative.
    tid = gpu.block_idx.x.to(Int64) * THREADS + gpu.thread_idx.x
    rsrc_a = buffer_ops.create_buffer_resource(a)  # range: a's extent, so the tail is handled by the resource
    rsrc_b = buffer_ops.create_buffer_resource(b)
    rsrc_c = buffer_ops.create_buffer_resource(c)
    x = buffer_ops.buffer_load(rsrc_a, tid * VEC, vec_width=VEC, dtype=T.f32)
    y = buffer_ops.buffer_load(rsrc_b, tid * VEC, vec_width=VEC, dtype=T.f32)
    buffer_ops.buffer_store(x + y, rsrc_c, tid * VEC)

    # Layout decomposition (preferred over manual arith): which warp and lane this thread is.
    layout = fx.make_layout((THREADS // 32, 32), (32, 1))
    coord = fx.idx2crd(gpu.thread_idx.x, layout)
    warp_id, lane_id = fx.get(coord, 0), fx.get(coord, 1)
    del warp_id, lane_id  # shown for the idiom; this kernel needs neither


@flyc.jit
def add(a, b, c):
    n = a.numel()
    if b.shape != a.shape or c.shape != a.shape:
        raise ValueError(f"b, c: expected the shape of a {tuple(a.shape)}, got {tuple(b.shape)} and {tuple(c.shape)}")
    blocks = (n + THREADS * VEC - 1) // (THREADS * VEC)
    vector_add(a, b, c, n).launch(grid=blocks, block=THREADS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 20)
    args = parser.parse_args()

    spec = flyc.TensorSpec((args.n,), "f32")  # compiles without a GPU
    module = vector_add.lower(spec, spec, spec, args.n)
    accesses = sorted(
        {line.split()[0] for line in module.ptx.splitlines() if line.strip().startswith(("ld.g", "st.g"))}
    )
    print(f"compiled vector_add for {module.target.chip}: global accesses {accesses}")
    if not flyc.runtime.is_available():
        print("no usable NVIDIA GPU here: compiled only")
        return 0

    import torch

    a, b = torch.randn(args.n, device="cuda"), torch.randn(args.n, device="cuda")
    c = torch.full_like(a, float("nan"))
    add(a, b, c)
    torch.cuda.synchronize()
    if not torch.equal(c, a + b):
        print(f"FAILED: {(c != a + b).sum().item()} of {args.n} elements differ")
        return 1
    print(f"c == a + b for {args.n} elements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
