"""buffer_ops: range-checked loads and stores. CPU: IR and PTX of the checks and of the access widths; GPU (``gpu``):
out-of-range loads give zeros and out-of-range stores write nothing, into poisoned outputs."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import T, buffer_ops, gpu

from .fakes import FakeGpuTensor


@flyc.kernel
def shifted_load(src: fx.Tensor, dst: fx.Tensor, shift: fx.Constexpr[int], vec: fx.Constexpr[int]):
    """dst[t*vec : t*vec+vec] = src[t*vec-shift : ...+vec], zeros where any of it is outside src."""
    t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    loaded = buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src), t * vec - shift, vec_width=vec, dtype=T.f32)
    buffer_ops.buffer_store(loaded, buffer_ops.create_buffer_resource(dst, max_size=True), t * vec)


@flyc.kernel
def limited_store(src: fx.Tensor, dst: fx.Tensor, limit: fx.Int32, vec: fx.Constexpr[int]):
    """Stores src's vector t at t*vec into dst, whose resource covers only ``limit`` floats."""
    t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    loaded = buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src, max_size=True), t * vec, vec, fx.Float32)
    buffer_ops.buffer_store(loaded, buffer_ops.create_buffer_resource(dst, num_bytes=limit * 4), t * vec)


@flyc.kernel
def reinterpreting(src: fx.Tensor, dst: fx.Tensor):
    """bf16 pairs read from a float32 tensor's bytes (fly.recast_ptr), stored back as Int32 bits."""
    t = gpu.thread_idx.x
    pair = buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src), t * 2, vec_width=2, dtype=T.bf16)
    buffer_ops.buffer_store(pair.bitcast(fx.Int32)[0], buffer_ops.create_buffer_resource(dst), t)


def _trace(kernel, *args) -> str:
    return kernel.trace(kernel.specialize(kernel._bind(list(args), {})).key)


def _vectors(n, count=2):
    return [FakeGpuTensor((n,), pointer=(1 << 20) + k * (1 << 16)) for k in range(count)]


def test_vector_load_is_one_16_byte_access_under_a_64_bit_range_check():
    text = _trace(shifted_load, *_vectors(1000), 0, 4)
    # The check: 0 <= offset and (offset + 4) * 4 <= cosize * 4, in i64, around the access.
    assert re.search(r"arith.cmpi sge, %\w+, %\w+ : i64", text)
    assert re.search(r"arith.cmpi sle, %\w+, %\w+ : i64", text)
    assert "scf.if" in text and "-> (vector<4xf32>)" in text
    assert "vector.from_elements" in text  # at the edge, element by element: out-of-range elements read zero
    ptx = shifted_load.lower(*_vectors(1000), 0, 4).ptx
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
    assert "setp.gt.s64" in ptx or "setp.le.s64" in ptx or "setp.lt.s64" in ptx
    assert ".local" not in ptx and "%SP" not in ptx  # the register buffer stayed in registers


def test_max_size_means_no_range_check():
    text = _trace(limited_store, *_vectors(1000), 10, 4)
    load_part = text.split("fly.copy")[0]
    assert "scf.if" not in load_part  # the max_size load is unguarded; the limited store is guarded
    assert text.count("scf.if") == 1 + 4  # the vector's check, then one per element on the edge path


def test_unaligned_offsets_split_the_access_but_keep_the_check():
    ptx = shifted_load.lower(*_vectors(1000), 1, 4).ptx  # t*4 - 1: nothing proves 16-byte alignment
    assert "ld.global.v4" not in ptx and "ld.global.b32" in ptx
    assert "st.global.v4.b32" in ptx  # the store's offset t*4 is still a multiple of 4


def test_scalar_loads_return_numerics_and_other_dtypes_recast_the_pointer():
    text = _trace(reinterpreting, *_vectors(64))
    assert "fly.recast_ptr" in text and "!fly.ptr<bf16, global, 16>" in text
    module = reinterpreting.lower(*_vectors(64))
    assert module.cubin is not None or "ld.global" in module.ptx


def test_bad_arguments_raise_at_trace_time():
    @flyc.kernel
    def bad_width(src: fx.Tensor):
        buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src), 0, vec_width=0)

    @flyc.kernel
    def vector_dtype(src: fx.Tensor):
        buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src), 0, vec_width=4, dtype=T.f32x4)

    @flyc.kernel
    def not_a_tensor(n: fx.Int32):
        buffer_ops.create_buffer_resource(n)

    with pytest.raises(ValueError, match="vec_width"):
        _trace(bad_width, *_vectors(8, 1))
    with pytest.raises(TypeError, match="element type"):
        _trace(vector_dtype, *_vectors(8, 1))
    with pytest.raises(TypeError, match="expected a fx.Tensor"):
        _trace(not_a_tensor, 3)


# --- GPU -----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("vec, shift", [(1, 0), (1, 3), (4, 0), (4, 8), (4, 2), (2, 0)])
def test_out_of_range_loads_give_zeros(vec, shift):
    torch = pytest.importorskip("torch")
    n, threads = 1001, 384  # 3 blocks of 128: the last vectors straddle or pass the end; `shift` makes the first
    # ones negative. The stores are unchecked (max_size): dst has a vector for every thread.
    src = torch.randn(n, device="cuda")
    dst = torch.full((threads * vec,), float("nan"), device="cuda")
    shifted_load(src, dst, shift, vec).launch(grid=threads // 128, block=128)
    torch.cuda.synchronize()
    expected = torch.zeros(threads * vec)
    host = src.cpu()
    for t in range(threads):
        for k in range(vec):  # per element, as AMD's buffer loads: out-of-range elements read zero
            offset = t * vec - shift + k
            if 0 <= offset < n:
                expected[t * vec + k] = host[offset]
    assert torch.equal(dst.cpu(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("vec, limit", [(1, 777), (4, 777), (4, 776), (2, 0)])
def test_out_of_range_stores_are_dropped(vec, limit):
    torch = pytest.importorskip("torch")
    threads = 256
    src = torch.randn(threads * vec, device="cuda")
    dst = torch.full((threads * vec,), -7.0, device="cuda")  # poison: what must stay
    limited_store(src, dst, limit, vec).launch(grid=2, block=128)
    torch.cuda.synchronize()
    expected = torch.full((threads * vec,), -7.0)
    for k in range(min(limit, threads * vec)):  # per element: everything below the limit is stored
        expected[k] = src.cpu()[k]
    assert torch.equal(dst.cpu(), expected)


@pytest.mark.gpu
def test_the_default_range_is_the_tensor_extent():
    torch = pytest.importorskip("torch")
    big = torch.full((2048,), -7.0, device="cuda")
    src = torch.randn(1024, device="cuda")
    view = big[:1000]  # the resource of `view` ends at element 1000 of `big`

    @flyc.kernel
    def copy_all(src: fx.Tensor, dst: fx.Tensor):
        t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
        v = buffer_ops.buffer_load(buffer_ops.create_buffer_resource(src), t * 4, vec_width=4, dtype=T.f32)
        buffer_ops.buffer_store(v, buffer_ops.create_buffer_resource(dst), t * 4)

    copy_all(src, view).launch(grid=2, block=128)
    torch.cuda.synchronize()
    assert torch.equal(big[:1000].cpu(), src[:1000].cpu())
    assert bool((big[1000:] == -7.0).all())


@pytest.mark.gpu
def test_reinterpreted_loads_read_the_same_bytes():
    torch = pytest.importorskip("torch")
    src = torch.randn(64, device="cuda")
    dst = torch.zeros(64, dtype=torch.int32, device="cuda")
    reinterpreting(src, dst).launch(grid=1, block=64)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src.cpu().view(torch.int32))
