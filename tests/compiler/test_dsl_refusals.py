"""What would compile into a wrong or failing kernel is refused when it is written, saying why: shared memory over
the per-block limit, a block_reduce scratch too small for its warps, True for an Int32, copies between views of
different sizes, indices of the wrong rank; and what needs a GPU says what works without one."""

from __future__ import annotations

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
import flydsl.layout as fl
from flydsl.compiler import runtime
from flydsl.compiler.errors import CompilationError
from flydsl.expr import gpu

from .fakes import FakeGpuTensor

VECTOR = flyc.TensorSpec((1024,), "f32")


def _line_of(kernel, offset: int) -> int:
    return kernel.__wrapped__.__code__.co_firstlineno + offset


@flyc.kernel
def smem_over_the_limit(x: fx.Tensor):
    smem = fx.SmemAllocator()
    tiles = smem.allocate(fx.Float32, 40 * 1024)  # 160 KiB
    staging = smem.allocate(fx.BFloat16, 40 * 1024)  # 80 KiB: 240 KiB in all, over sm_90a's 227 KiB
    t = gpu.thread_idx.x
    tiles[t] = x[t]
    staging[t] = x[t].to(fx.BFloat16)
    gpu.barrier()
    x[t] = tiles[t + 1] + staging[t + 1].to(fx.Float32)


@flyc.kernel
def smem_at_the_limit(x: fx.Tensor):
    smem = fx.SmemAllocator()
    tiles = smem.allocate(fx.Float32, 227 * 256)  # exactly 227 KiB
    t = gpu.thread_idx.x
    tiles[t] = x[t]
    gpu.barrier()
    x[t] = tiles[t + 1]


def test_shared_memory_over_the_per_block_limit_is_a_compile_error_naming_the_buffers():
    with pytest.raises(CompilationError, match="needs 245760 bytes of shared memory") as info:
        smem_over_the_limit.lower(VECTOR)
    message = str(info.value)
    assert "more than the 232448 one block may use on sm_90a" in message
    assert f"test_dsl_refusals.py:{_line_of(smem_over_the_limit, 3)}:0: 40960 x f32" in message
    assert f"test_dsl_refusals.py:{_line_of(smem_over_the_limit, 4)}:0: 40960 x bf16" in message
    assert smem_at_the_limit.lower(VECTOR).shared_bytes == {"smem_at_the_limit": 227 * 1024}
    # sm_80's blocks have 163 KiB: the kernel that fits on Hopper does not fit there.
    with pytest.raises(CompilationError, match="more than the 166912 one block may use on sm_80"):
        flyc.kernel(smem_at_the_limit.fn, target=flyc.SM80).lower(VECTOR)


def test_block_reduce_refuses_a_scratch_smaller_than_its_warps():
    @flyc.kernel
    def short_scratch(x: fx.Tensor):
        scratch = fx.SmemAllocator().allocate(fx.Float32, 4)
        x[0] = gpu.block_reduce(x[gpu.thread_idx.x], "add", scratch=scratch, num_warps=8)

    @flyc.kernel
    def global_scratch(x: fx.Tensor):
        x[0] = gpu.block_reduce(x[gpu.thread_idx.x], "add", scratch=x, num_warps=8)

    with pytest.raises(ValueError, match="8 warps need 8 elements of scratch, got 4") as info:
        short_scratch.lower(VECTOR)
    assert info.traceback[-1].lineno + 1 == _line_of(short_scratch, 3)
    with pytest.raises(TypeError, match="scratch: expected a shared-memory Tensor"):
        global_scratch.lower(VECTOR)


@flyc.kernel
def scaled(x: fx.Tensor, n: fx.Int32):
    x[gpu.thread_idx.x] = x[gpu.thread_idx.x] * n.to(fx.Float32)


def test_a_bool_is_not_an_int32():
    with pytest.raises(TypeError, match="argument 'n': expected an int for Int32, got True"):
        scaled.lower(VECTOR, True)
    assert scaled.lower(VECTOR, 1).kernels  # the int itself is fine


@pytest.mark.gpu
def test_a_bool_is_not_an_int32_on_the_native_launch_path():
    torch = pytest.importorskip("torch")
    x = torch.ones(1024, device="cuda")
    scaled(x, 3).launch(grid=1, block=256)  # compiled and registered with the native dispatcher
    with pytest.raises(TypeError, match="expected an int for Int32, got True"):
        scaled(x, True).launch(grid=1, block=256)
    torch.cuda.synchronize()
    assert torch.equal(x[:256], torch.full((256,), 3.0, device="cuda"))


def test_copy_between_views_of_different_sizes_raises_at_the_users_line():
    @flyc.kernel
    def k(x: fx.Tensor, y: fx.Tensor):
        src = fx.local_tile(x, (8,), (0,))
        dst = fx.local_tile(y, (4,), (0,))
        fx.copy(src, dst)

    with pytest.raises(ValueError, match=r"`fx\.copy\(src, dst\)`: copy: the source has 8 elements") as info:
        k.lower(VECTOR, VECTOR)
    assert "(shape (8,)) but the target only 4 (shape (4,))" in str(info.value)
    assert info.traceback[-1].lineno + 1 == _line_of(k, 4)


def test_indexing_with_the_wrong_rank_prints_shapes_and_the_expression():
    @flyc.kernel
    def k(x: fx.Tensor, n: fx.Int32):
        i = gpu.thread_idx.x
        x[i, n, 2] = 1.0

    with pytest.raises(IndexError) as info:
        k.lower(flyc.TensorSpec((64, 16), "f32"), 4)
    message = str(info.value)
    assert message.startswith("`x[i, n, 2] = 1.0`: indexing a tensor of shape (?,?) (rank 2) with (Int32,Int32,2)")
    assert "OpResult" not in message and "%" not in message
    assert info.traceback[-1].lineno + 1 == _line_of(k, 3)


@pytest.mark.skipif(runtime.is_available(), reason="the message is for machines without a usable GPU")
def test_compile_without_a_gpu_says_to_use_tensorspec_and_lower():
    with pytest.raises(RuntimeError, match=r"no usable NVIDIA GPU here .*flyc\.TensorSpec.*scaled\.lower\(\.\.\.\)"):
        flyc.compile(scaled, FakeGpuTensor((1024,)), 2)


def test_tensorspec_takes_torch_numpy_and_flydsl_dtypes():
    torch = pytest.importorskip("torch")
    assert flyc.TensorSpec((4,), torch.bfloat16).dtype == "bf16"
    assert flyc.TensorSpec((4,), torch.float8_e4m3fn).dtype == "f8E4M3FN"
    assert flyc.TensorSpec((4,), "torch.int64").dtype == "i64"
    assert flyc.TensorSpec((4,), fx.Float16).dtype == "f16"
    assert flyc.TensorSpec((4,), "i8").dtype == "i8" and flyc.TensorSpec((4,), "int8").dtype == "i8"
    assert scaled.lower(flyc.TensorSpec((1024,), torch.float32), 2).kernels == {"scaled": "pli"}
    with pytest.raises(ValueError, match="a torch or numpy dtype"):
        flyc.TensorSpec((4,), torch.complex64)
    with pytest.raises(ValueError, match="got <class"):
        flyc.TensorSpec((4,), fx.Boolean)


def test_layouts_of_views_in_messages_are_cute_notation():
    # The copy message above shows shapes; a swizzled view's shape is its inner layout's.
    layout = fl.make_composed_layout(fl.Swizzle(1, 0, 1), 0, fl.Layout((2, 2), (2, 1)))
    from flydsl.expr.tensor import _plain, _shape_text

    assert _shape_text(_plain(layout).shape) == "(2,2)" and _shape_text((None, (3,))) == "(None,(3,))"
