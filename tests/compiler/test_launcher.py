"""TensorMap (TMA descriptors) and the launcher's 'm' parameters. CPU tests check argument validation and the packing
of 128-byte, 64-byte-aligned slots; ``gpu`` tests encode real descriptors and read them back inside a kernel."""

from __future__ import annotations

import ctypes
import os

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import runtime

rt = runtime._rt
TensorMap = rt.TensorMap


def _validate(signature, args, **kwargs):
    return rt._validate_launch(1, 32, signature, args, name="k", **kwargs)


def _tiled(**overrides):
    # A valid 2-D f16 map: 64 x 256 elements (512-byte rows), 64 x 8 boxes, 128-byte swizzle.
    kwargs = dict(dtype="f16", global_address=0x10000, dims=[256, 64], strides_bytes=[512], box=[64, 8], swizzle=128)
    kwargs.update(overrides)
    return TensorMap.encode_tiled(**kwargs)


# ---------------------------------------------------------------------------------------------------- CPU


def test_from_bytes_round_trips_and_checks_the_size():
    data = os.urandom(128)
    tensor_map = TensorMap.from_bytes(data)
    assert tensor_map.bytes() == data
    assert tensor_map.dtype is None and tensor_map.rank == 0
    assert TensorMap.from_bytes(bytearray(data)).bytes() == data
    for size in (0, 127, 129):
        with pytest.raises(ValueError, match="expected 128 bytes"):
            TensorMap.from_bytes(bytes(size))


def test_tensor_map_is_packed_by_value_at_a_64_byte_boundary():
    data = os.urandom(128)
    packed = _validate("pim", (0x1000, -3, TensorMap.from_bytes(data)))
    assert packed["offsets"] == (0, 8, 64)
    assert packed["aligned"] and packed["inline"]
    params = packed["params"]
    assert len(params) == 192
    assert params[:8] == (0x1000).to_bytes(8, "little")
    assert params[8:16] == (-3).to_bytes(4, "little", signed=True) + bytes(4)
    assert params[16:64] == bytes(48), "padding is zeroed"
    assert params[64:] == data


def test_consecutive_tensor_maps_and_trailing_scalars():
    maps = [os.urandom(128) for _ in range(3)]
    packed = _validate("mmmf", (*map(TensorMap.from_bytes, maps), 1.5))
    assert packed["offsets"] == (0, 128, 256, 384)
    assert packed["params"][:384] == b"".join(maps)
    assert packed["params"][384:] == bytes.fromhex("0000c03f") + bytes(4)


def test_eight_tensor_maps_fill_the_inline_arena():
    packed = _validate("m" * 8, (TensorMap.from_bytes(bytes(128)),) * 8)
    assert packed["inline"] and packed["aligned"] and len(packed["params"]) == 1024


def test_scalar_only_signatures_keep_8_byte_slots():
    packed = _validate("pl", (1, 2))
    assert packed["offsets"] == (0, 8) and packed["params"] == (1).to_bytes(8, "little") + (2).to_bytes(8, "little")


@pytest.mark.parametrize("count, inline", [(1, True), (7, True), (8, False)])
def test_many_tensor_maps_fall_back_to_an_aligned_heap_arena(count, inline):
    # 1024 inline bytes hold a pointer, its padding and 7 maps (or 32 scalars); more go to the heap, still aligned.
    maps = [os.urandom(128) for _ in range(count)]
    packed = _validate("p" + "m" * count, (7, *map(TensorMap.from_bytes, maps)))
    assert packed["inline"] is inline
    assert packed["aligned"]
    assert packed["offsets"] == (0, *range(64, 64 + 128 * count, 128))
    assert packed["params"][64:] == b"".join(maps)


def test_many_scalars_and_a_tensor_map_on_the_heap():
    data = os.urandom(128)
    packed = _validate("i" * 40 + "m", (*range(40), TensorMap.from_bytes(data)))
    assert not packed["inline"] and packed["aligned"]
    assert packed["offsets"][-1] == 320
    assert packed["params"][320:] == data


@pytest.mark.parametrize("bad", [b"\0" * 128, 0, None, "m"])
def test_m_parameters_take_only_tensor_maps(bad):
    with pytest.raises(TypeError, match="argument 1: expected TensorMap"):
        _validate("pm", (0, bad))


def test_invalid_signature_code_lists_m():
    with pytest.raises(ValueError, match="p, i, I, l, L, f, d, m"):
        _validate("x", (1,))


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"dims": []}, ValueError, "dims: rank must be 1 to 5"),
        ({"dims": [1] * 6, "box": [1] * 6}, ValueError, "dims: at most 5"),
        ({"dims": [0, 64]}, ValueError, r"dims\[0\]: must be in 1..2\^32"),
        ({"dims": [256, 2**32 + 1]}, ValueError, r"dims\[1\]: must be in 1..2\^32"),
        ({"dims": [256, -1]}, ValueError, r"dims\[1\]: out of range"),
        ({"dims": [256, 1.5]}, TypeError, r"dims\[1\]: expected an int"),
        ({"dims": 5}, TypeError, "dims: expected a sequence"),
        ({"strides_bytes": []}, ValueError, "strides_bytes: expected rank - 1 = 1"),
        ({"strides_bytes": [520]}, ValueError, r"strides_bytes\[0\]: must be a multiple of 16"),
        ({"strides_bytes": [2**40]}, ValueError, r"strides_bytes\[0\]: must be < 2\^40"),
        ({"box": [64]}, ValueError, "box: expected 2 entries"),
        ({"box": [64, 0]}, ValueError, r"box\[1\]: must be in 1..256"),
        ({"box": [64, 257]}, ValueError, r"box\[1\]: must be in 1..256"),
        ({"box": [4, 8], "swizzle": 0}, ValueError, r"box\[0\]: the inner box \(8 bytes\) must be a multiple of 16"),
        ({"box": [128, 8]}, ValueError, r"box\[0\]: the inner box \(256 bytes\) exceeds the swizzle span of 128"),
        ({"box": [32, 8], "swizzle": 32}, ValueError, r"box\[0\]: .* exceeds the swizzle span of 32"),
        ({"element_strides": [1, 9]}, ValueError, r"element_strides\[1\]: must be in 1..8"),
        ({"element_strides": [1]}, ValueError, "element_strides: expected 2 entries"),
        ({"swizzle": 16}, ValueError, "swizzle: expected 0, 32, 64 or 128"),
        ({"interleave": 8}, ValueError, "interleave: expected 0, 16 or 32"),
        ({"interleave": 16}, ValueError, "dims: an interleaved layout needs rank >= 3"),
        ({"l2_promotion": 32}, ValueError, "l2_promotion: expected 0, 64, 128 or 256"),
        ({"global_address": 0x10008}, ValueError, "global_address: must be 16-byte aligned"),
        ({"global_address": -16}, ValueError, "global_address: must be a non-negative"),
        ({"global_address": "0x10000"}, TypeError, "global_address: expected"),
        ({"dtype": "f8"}, ValueError, "dtype: unknown 'f8'"),
        ({"dtype": "i32", "box": [16, 8], "oob_fill_nan": True}, ValueError, "oob_fill_nan: NaN fill needs"),
    ],
)
def test_encode_tiled_rejects_bad_arguments_before_the_driver(overrides, error, message):
    with pytest.raises(error, match=message):
        _tiled(**overrides)


def test_interleave_32_needs_32_byte_alignment_and_swizzle_32():
    rank3 = dict(dims=[64, 64, 4], strides_bytes=[128, 8192], box=[32, 8, 1])
    with pytest.raises(ValueError, match="swizzle: interleave=32 needs swizzle=32"):
        _tiled(interleave=32, swizzle=128, **rank3)
    with pytest.raises(ValueError, match="global_address: must be 32-byte aligned"):
        _tiled(interleave=32, swizzle=32, global_address=0x10010, **rank3)
    with pytest.raises(ValueError, match=r"strides_bytes\[0\]: must be a multiple of 32"):
        _tiled(interleave=32, swizzle=32, **{**rank3, "strides_bytes": [144, 8192]})


@pytest.mark.skipif(runtime.is_available(), reason="checks the no-driver path")
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f8e4m3fn", "float8_e5m2", "tf32", "u8", "f32_ftz"])
def test_valid_arguments_reach_the_driver(dtype):
    # Everything checked passed: without libcuda the call fails at the driver, as a CudaError.
    with pytest.raises(runtime.CudaError):
        _tiled(dtype=dtype, box=[16, 8], swizzle=0)


# ---------------------------------------------------------------------------------------------------- GPU

# An llvm.func kernel (the pipeline keeps it; convert-gpu-to-nvvm would drop llvm.byval from a gpu.func): its
# __grid_constant__ tensor-map parameters compile to `.param .align 64 .b8 p[128]`. echo_tensor_map copies one map
# to out[0:128]; echo_two writes a, b and tag to out[0:128], out[128:256], out[256:260], checking the layout of
# a 4-byte scalar followed by two maps.
ECHO_MLIR = """
module attributes {gpu.container_module} {
  gpu.module @tensor_map_echo {
    llvm.func @echo_tensor_map(%out: !llvm.ptr<1>,
        %map: !llvm.ptr {llvm.byval = !llvm.array<128 x i8>, llvm.align = 64 : i64, nvvm.grid_constant})
        attributes {nvvm.kernel} {
      %tid = nvvm.read.ptx.sreg.tid.x : i32
      %c16 = llvm.mlir.constant(16 : i32) : i32
      %in = llvm.icmp "ult" %tid, %c16 : i32
      llvm.cond_br %in, ^copy, ^done
    ^copy:
      %i = llvm.zext %tid : i32 to i64
      %src = llvm.getelementptr %map[%i] : (!llvm.ptr, i64) -> !llvm.ptr, i64
      %v = llvm.load %src : !llvm.ptr -> i64
      %dst = llvm.getelementptr %out[%i] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i64
      llvm.store %v, %dst : i64, !llvm.ptr<1>
      llvm.br ^done
    ^done:
      llvm.return
    }

    llvm.func @echo_two(%out: !llvm.ptr<1>, %tag: i32,
        %a: !llvm.ptr {llvm.byval = !llvm.array<128 x i8>, llvm.align = 64 : i64, nvvm.grid_constant},
        %b: !llvm.ptr {llvm.byval = !llvm.array<128 x i8>, llvm.align = 64 : i64, nvvm.grid_constant})
        attributes {nvvm.kernel} {
      %tid = nvvm.read.ptx.sreg.tid.x : i32
      %c16 = llvm.mlir.constant(16 : i32) : i32
      %c16_64 = llvm.mlir.constant(16 : i64) : i64
      %c32_64 = llvm.mlir.constant(32 : i64) : i64
      %in = llvm.icmp "ult" %tid, %c16 : i32
      llvm.cond_br %in, ^copy, ^done
    ^copy:
      %i = llvm.zext %tid : i32 to i64
      %pa = llvm.getelementptr %a[%i] : (!llvm.ptr, i64) -> !llvm.ptr, i64
      %va = llvm.load %pa : !llvm.ptr -> i64
      %da = llvm.getelementptr %out[%i] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i64
      llvm.store %va, %da : i64, !llvm.ptr<1>
      %pb = llvm.getelementptr %b[%i] : (!llvm.ptr, i64) -> !llvm.ptr, i64
      %vb = llvm.load %pb : !llvm.ptr -> i64
      %j = llvm.add %i, %c16_64 : i64
      %db = llvm.getelementptr %out[%j] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i64
      llvm.store %vb, %db : i64, !llvm.ptr<1>
      %dt = llvm.getelementptr %out[%c32_64] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i64
      llvm.store %tag, %dt : i32, !llvm.ptr<1>
      llvm.br ^done
    ^done:
      llvm.return
    }
  }
}
"""


def test_echo_kernels_compile_with_128_byte_aligned_params():
    compiled = flyc.compile_mlir(ECHO_MLIR, assemble=False)
    assert ".param .align 64 .b8 echo_tensor_map_param_1[128]" in compiled.ptx
    assert ".param .align 64 .b8 echo_two_param_3[128]" in compiled.ptx
    # llvm.func kernels count too; a 128-byte byval pointer is a by-value tensor map ('m').
    assert compiled.kernels == {"echo_tensor_map": "pm", "echo_two": "pimm"}


@pytest.fixture(scope="module")
def echo_module():
    return rt.Module(flyc.compile_mlir(ECHO_MLIR).image)


def _run_echo(echo_module, tensor_map) -> bytes:
    out = runtime.DeviceBuffer(128 + 16)
    out.memset(0xA5)
    echo_module.function("echo_tensor_map").launch(1, 32, "pm", (out, tensor_map))
    runtime.synchronize()
    got = out.copy_to_host()
    assert got[128:] == b"\xa5" * 16, "the kernel wrote past the map"
    return got[:128]


@pytest.mark.gpu
def test_kernel_reads_back_a_tensor_map_from_bytes(echo_module):
    for _ in range(3):  # fresh bytes each time
        data = os.urandom(128)
        assert _run_echo(echo_module, TensorMap.from_bytes(data)) == data


@pytest.mark.gpu
def test_kernel_reads_back_a_scalar_and_two_maps(echo_module):
    a, b = os.urandom(128), os.urandom(128)
    tag = int.from_bytes(os.urandom(4), "little", signed=True)
    out = runtime.DeviceBuffer(260 + 12)
    out.memset(0xA5)
    echo_module.function("echo_two").launch(1, 32, "pimm", (out, tag, TensorMap.from_bytes(a), TensorMap.from_bytes(b)))
    runtime.synchronize()
    got = out.copy_to_host()
    assert got[:128] == a and got[128:256] == b
    assert int.from_bytes(got[256:260], "little", signed=True) == tag
    assert got[260:] == b"\xa5" * 12


@pytest.mark.gpu
def test_encode_tiled_on_a_torch_tensor_and_read_back(echo_module):
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 256, dtype=torch.float16, device="cuda")
    tensor_map = TensorMap.encode_tiled("f16", x, dims=[256, 64], strides_bytes=[512], box=[64, 8], swizzle=128)
    assert tensor_map.global_address == x.data_ptr()
    assert tensor_map.dtype == "f16" and tensor_map.rank == 2
    encoded = tensor_map.bytes()
    assert encoded != bytes(128)
    assert _run_echo(echo_module, tensor_map) == encoded


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dtype="bf16", dims=[128, 32], strides_bytes=[256], box=[64, 16], swizzle=128, l2_promotion=128),
        dict(dtype="f32", dims=[32, 8, 4], strides_bytes=[128, 1024], box=[16, 8, 2], swizzle=64),
        dict(dtype="f8e4m3fn", dims=[256, 16], strides_bytes=[256], box=[128, 8], swizzle=128, oob_fill_nan=False),
        dict(dtype="f16", dims=[64, 64], strides_bytes=[128], box=[16, 16], element_strides=[1, 2], oob_fill_nan=True),
    ],
)
def test_encode_tiled_matches_cuda_bindings(kwargs):
    # The same arguments through cuda.bindings' cuTensorMapEncodeTiled give the same 128 bytes.
    cu = pytest.importorskip("cuda.bindings.driver")
    buffer = runtime.DeviceBuffer(1 << 20)
    ours = TensorMap.encode_tiled(global_address=buffer, **kwargs)
    assert ours.global_address == buffer.ptr
    dtypes = {"bf16": "BFLOAT16", "f32": "FLOAT32", "f8e4m3fn": "UINT8", "f16": "FLOAT16"}
    rank = len(kwargs["dims"])
    element_strides = kwargs.get("element_strides", [1] * rank)
    swizzles = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
    promotions = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}
    err, theirs = cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + dtypes[kwargs["dtype"]]),
        rank,
        buffer.ptr,
        [cu.cuuint64_t(d) for d in kwargs["dims"]],
        [cu.cuuint64_t(s) for s in kwargs["strides_bytes"]],
        [cu.cuuint32_t(b) for b in kwargs["box"]],
        [cu.cuuint32_t(e) for e in element_strides],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + swizzles[kwargs.get("swizzle", 0)]),
        getattr(cu.CUtensorMapL2promotion, "CU_TENSOR_MAP_L2_PROMOTION_" + promotions[kwargs.get("l2_promotion", 0)]),
        (
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
            if kwargs.get("oob_fill_nan")
            else cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
        ),
    )
    assert err == cu.CUresult.CUDA_SUCCESS
    assert ours.bytes() == ctypes.string_at(theirs.getPtr(), 128)
