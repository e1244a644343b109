"""fx.TiledCopy: thread-value partitions of plain and swizzled tiles. CPU: each thread's share is what the TV
layout says, and the copies are 16 bytes wide in the PTX; GPU (``gpu``): a tile through swizzled shared memory."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu

COPIER = fx.TiledCopy(thr_layout=fl.Layout((16, 8), (8, 1)), val_layout=fl.Layout((1, 8)))  # 128 threads x 8 fp16
SWIZZLED = fl.ComposedLayout(fl.Swizzle(3, 3, 3), 0, fl.Layout((64, 64), (64, 1)))


@flyc.kernel
def through_shared(src: fx.Tensor, dst: fx.Tensor):
    """Block b copies rows [64b, 64b + 64) of src (N = 64) into swizzled shared memory and back out to dst."""
    tid = gpu.thread_idx.x
    tile = fx.SmemAllocator().allocate(fx.Float16, SWIZZLED, alignment=1024)
    g_src = fx.local_tile(src, (64, 64), (gpu.block_idx.x, 0))
    g_dst = fx.local_tile(dst, (64, 64), (gpu.block_idx.x, 0))
    COPIER.copy(g_src, tile, tid)
    gpu.barrier()
    COPIER.copy(tile, g_dst, tid)


def test_a_thread_owns_the_blocks_its_tv_layout_names():
    assert COPIER.tile == (16, 64) and COPIER.threads == 128 and COPIER.values == 8
    # thread t holds row t // 8, columns 8 * (t % 8) .. + 7 of every 16 x 64 tile (column-major tile offsets)
    for t in (0, 1, 9, 127):
        owned = sorted(COPIER.layout_tv(t, v) for v in range(8))
        row, col0 = t // 8, 8 * (t % 8)
        assert owned == sorted(row + 16 * (col0 + v) for v in range(8))


def test_partitioned_copies_are_16_bytes_wide():
    ptx = through_shared.lower(flyc.TensorSpec((256, 64), "f16"), flyc.TensorSpec((256, 64), "f16")).ptx
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx
    assert "st.shared.v4" in ptx and "ld.shared.v4" in ptx


def test_shapes_that_are_not_whole_tiles_are_refused():
    with pytest.raises(ValueError, match="not a multiple of the copy's tile"):

        @flyc.kernel
        def bad(src: fx.Tensor):
            tile = fx.SmemAllocator().allocate(fx.Float16, fl.Layout((20, 64), (64, 1)))
            COPIER.copy(tile, tile, gpu.thread_idx.x)

        bad.lower(flyc.TensorSpec((64,), "f16"))


@pytest.mark.gpu
def test_tile_through_swizzled_shared_memory_on_gpu():
    torch = pytest.importorskip("torch")
    src = torch.randn(256, 64, device="cuda").half()
    dst = torch.full_like(src, float("nan"))
    through_shared(src, dst).launch(grid=4, block=128)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)
