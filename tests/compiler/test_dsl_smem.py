"""Shared memory from kernels: one buffer per allocate, structs in one block, the seed's byte API (CPU: IR and PTX;
GPU: values round-trip)."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.expr import gpu
from flydsl.expr.typing import T

SPEC = flyc.TensorSpec((256,), "f32")


@flyc.kernel
def through_struct(x: fx.Tensor, y: fx.Tensor):
    s = fx.SmemAllocator().allocate_struct(
        flag=(fx.Int32, 1), data=(fx.Float32, 256), pairs=(fx.BFloat16, fl.Layout((2, 8), (8, 1)), 64)
    )
    t = gpu.thread_idx.x
    s.data[t] = x[t]
    gpu.barrier()
    y[t] = s.data[255 - t]


@flyc.kernel
def through_seed_api(x: fx.Tensor, y: fx.Tensor):
    allocator = fx.SmemAllocator(None, arch="sm_90a", global_sym_name="my_smem")
    allocator.ptr = 2048
    base = allocator.get_base()
    floats = fx.SmemPtr(base, 1024, T.f32, shape=(256,)).get()
    t = gpu.thread_idx.x
    floats[t] = x[t]
    gpu.barrier()
    y[t] = floats[(t + 1) % 256]


def test_struct_fields_are_views_of_one_block_at_aligned_offsets():
    text = through_struct.trace(through_struct.specialize([SPEC, SPEC]).key)
    # flag: 4 bytes at 0; data: 1024 bytes at 16; pairs: 32 bytes at 1088 (64-aligned): 1120 bytes in all.
    assert re.findall(r"fly.alloc_smem (\d+) : !fly.ptr<i8, shared, (\d+)>", text) == [("1120", "64")]
    assert text.count("fly.recast_ptr") == 3  # one typed view per field
    module = through_struct.lower(SPEC, SPEC)
    assert module.shared_bytes == {"through_struct": 1120}


def test_the_seed_byte_api_views_part_of_one_buffer():
    module = through_seed_api.lower(SPEC, SPEC)
    assert module.shared_bytes == {"through_seed_api": 2048}
    assert "st.shared" in module.ptx and "ld.shared" in module.ptx


def test_misaligned_views_are_refused():
    @flyc.kernel
    def misaligned(x: fx.Tensor):
        allocator = fx.SmemAllocator()
        allocator.ptr = 64
        fx.SmemPtr(allocator.get_base(), 2, T.f32, shape=(4,)).get()

    with pytest.raises(ValueError, match="offset: 2 bytes is not a multiple of the 4-byte Float32"):
        misaligned.lower(SPEC)


def test_get_base_needs_a_size():
    @flyc.kernel
    def sizeless(x: fx.Tensor):
        fx.SmemAllocator().get_base()

    with pytest.raises(ValueError, match="SmemAllocator.ptr: set it to the number of bytes"):
        sizeless.lower(SPEC)


@pytest.mark.parametrize("alignment", [2**33, 2**20, 2048, 3, 0, -128, 16.0, True])
def test_allocate_refuses_an_alignment_shared_memory_cannot_have(alignment):
    # 2**33 aborted the process in LLVM ("Alignment is greater than MaximumAlignment"); 2**20 compiled silently.
    @flyc.kernel
    def over_aligned(x: fx.Tensor):
        fx.SmemAllocator().allocate(fx.Float32, 256, alignment=alignment)

    expected = f"SmemAllocator.allocate: alignment must be a power of two from 1 to 1024 bytes, got {alignment!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        over_aligned.lower(SPEC)


def test_allocate_struct_refuses_a_field_alignment_shared_memory_cannot_have():
    @flyc.kernel
    def over_aligned(x: fx.Tensor):
        fx.SmemAllocator().allocate_struct(a=(fx.Float32, 4), b=(fx.Float32, 4, 2**33))

    with pytest.raises(ValueError, match="SmemAllocator.allocate_struct: b's alignment must be a power of two"):
        over_aligned.lower(SPEC)


def test_allocate_takes_the_largest_alignment():
    @flyc.kernel
    def aligned(x: fx.Tensor):
        s = fx.SmemAllocator().allocate(fx.Float32, 256, alignment=1024)
        s[gpu.thread_idx.x] = x[gpu.thread_idx.x]

    assert "align 1024" in aligned.lower(SPEC).ptx


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, shift", [(through_struct, "reverse"), (through_seed_api, "rotate")])
def test_shared_memory_round_trips(kernel, shift):
    torch = pytest.importorskip("torch")
    x = torch.randn(256, device="cuda")
    y = torch.full_like(x, float("nan"))
    kernel(x, y).launch(grid=1, block=256)
    torch.cuda.synchronize()
    expected = x.flip(0) if shift == "reverse" else x.roll(-1)
    assert torch.equal(y, expected)
