"""The native launcher. CPU tests check that import and queries work without a GPU; ``gpu`` tests load, launch and
check kernels on the device (output poisoned first, compared exactly with flydsl.layout)."""

from __future__ import annotations

import array

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import runtime
from flydsl.layout import Layout


def test_runtime_imports_and_answers_without_raising():
    assert isinstance(runtime.is_available(), bool)


def _validate(grid, block, signature, args, **kwargs):
    # The launcher's own checks and argument packing, run without a driver.
    return runtime._rt._validate_launch(grid, block, signature, args, name="k", **kwargs)


def test_launch_arguments_are_packed_in_8_byte_slots():
    packed = _validate(4, (32, 2), "pilf", (0x1000, -3, 2**40, 1.5))
    assert packed["params"] == (
        (0x1000).to_bytes(8, "little")
        + (-3).to_bytes(4, "little", signed=True)
        + bytes(4)
        + (2**40).to_bytes(8, "little")
        + bytes.fromhex("0000c03f")
        + bytes(4)
    )


@pytest.mark.parametrize(
    "grid, block, signature, args, error, message",
    [
        (1, 32, "pi", (0,), ValueError, "kernel 'k' takes 2 arguments"),
        (1, 32, "i", (2**40,), OverflowError, "argument 0: expected int32"),
        (1, 32, "p", ("not a pointer",), TypeError, "argument 0"),
        (1, 2048, "", (), ValueError, "block"),
        (0, 32, "", (), ValueError, "grid"),
        ((1, 2, 3, 4), 32, "", (), ValueError, "grid"),
        (1, 32, "x", (1,), ValueError, "signature"),
    ],
)
def test_bad_launches_are_refused_before_the_driver(grid, block, signature, args, error, message):
    with pytest.raises(error, match=message):
        _validate(grid, block, signature, args)


@pytest.fixture(scope="module")
def demo_module(layout_offsets_mlir):
    return runtime.load(flyc.compile_mlir(layout_offsets_mlir))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 63, 64, 1000, 65537])
def test_demo_kernel_writes_every_offset_exactly(demo_module, n):
    layout = Layout(((4, 2), 8), ((16, 1), 2))
    out = runtime.DeviceBuffer(4 * n + 4)
    out.memset(0xFF)
    demo_module.launch("layout_offsets", (n + 127) // 128, 128, out, n)
    runtime.synchronize()
    got = array.array("i")
    got.frombytes(out.copy_to_host())
    assert list(got[:n]) == [layout(i % 64) for i in range(n)]
    assert got[n] == -1, "the kernel wrote past n"


@pytest.mark.gpu
def test_ptx_image_is_jit_compiled_by_the_driver(layout_offsets_mlir):
    compiled = flyc.compile_mlir(layout_offsets_mlir, assemble=False)
    assert compiled.cubin is None
    module = runtime.load(compiled)
    out = runtime.DeviceBuffer(4 * 64)
    out.memset(0xFF)
    module.launch("layout_offsets", 1, 64, out, 64)
    runtime.synchronize()
    got = array.array("i")
    got.frombytes(out.copy_to_host())
    assert list(got) == [Layout(((4, 2), 8), ((16, 1), 2))(i) for i in range(64)]


@pytest.mark.gpu
def test_bad_arguments_are_refused_before_launch(demo_module):
    out = runtime.DeviceBuffer(64)
    with pytest.raises(ValueError, match="takes 2 arguments"):
        demo_module.launch("layout_offsets", 1, 32, out)
    with pytest.raises((TypeError, OverflowError), match="argument 1"):
        demo_module.launch("layout_offsets", 1, 32, out, 2**40)
    with pytest.raises(ValueError, match="block"):
        demo_module.launch("layout_offsets", 1, 2048, out, 1)
    with pytest.raises(KeyError, match="not in module 'layout_demo'"):
        demo_module.launch("missing", 1, 1)


@pytest.mark.gpu
def test_invalid_ptx_raises_cuda_error_with_the_jit_log():
    with pytest.raises(runtime.CudaError, match="cuModuleLoadData"):
        runtime._rt.Module(b".version 8.0\n.target sm_90a\n.address_size 64\nnot ptx at all\n")


@pytest.mark.gpu
def test_device_buffer_round_trip():
    buffer = runtime.DeviceBuffer(16)
    buffer.copy_from_host(bytes(range(16)))
    assert buffer.copy_to_host() == bytes(range(16))
    with pytest.raises(ValueError):
        buffer.copy_from_host(bytes(17))


@pytest.mark.gpu
def test_torch_tensors_and_streams_launch_on_torch_context(demo_module):
    torch = pytest.importorskip("torch")
    n = 4096
    out = torch.full((n,), -1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        demo_module.launch("layout_offsets", n // 128, 128, out, n, stream=stream.cuda_stream)
    stream.synchronize()
    layout = Layout(((4, 2), 8), ((16, 1), 2))
    assert out.cpu().tolist() == [layout(i % 64) for i in range(n)]
