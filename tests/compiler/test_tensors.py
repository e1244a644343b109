"""Fly tensors with dynamic layouts, compiled end to end (CPU) and run on the GPU (``gpu``)."""

from __future__ import annotations

import array
import random
import re
from pathlib import Path

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import runtime

TRANSPOSE = (Path(__file__).resolve().parents[2] / "examples" / "transpose.mlir").read_text()


def test_transpose_compiles_to_ptx_with_64_bit_offsets():
    compiled = flyc.compile_mlir(TRANSPOSE, assemble=True)
    assert compiled.kernels == {"transpose_f32": "ppii"}
    assert "ld.global.b32" in compiled.ptx and "st.global.b32" in compiled.ptx
    # Element offsets are scaled in 64-bit registers.
    assert "shl.b64" in compiled.ptx


def test_untraceable_fly_values_are_reported_with_their_location():
    source = """
    module attributes {gpu.container_module} {
      gpu.module @m {
        gpu.func @k(%out: !llvm.ptr<1>, %m_i32: i32) kernel {
          %m = arith.index_cast %m_i32 : i32 to index
          %c0 = arith.constant 0 : index
          %cond = arith.cmpi eq, %m, %c0 : index
          %l = scf.if %cond -> !fly.layout<(?,8):(8,1)> {
            %a = fly.make_layout(%m) : !fly.layout<(?,8):(8,1)>
            scf.yield %a : !fly.layout<(?,8):(8,1)>
          } else {
            %b = fly.make_layout(%c0) : !fly.layout<(?,8):(8,1)>
            scf.yield %b : !fly.layout<(?,8):(8,1)>
          }
          %n = fly.size %l : !fly.layout<(?,8):(8,1)>
          %n64 = arith.index_cast %n : index to i64
          llvm.store %n64, %out : i64, !llvm.ptr<1>
          gpu.return
        }
      }
    }"""
    with pytest.raises(flyc.CompilationError, match=r"could not be lowered(.|\n)*<input>:15:\d+: 'fly.size'") as info:
        flyc.compile_mlir(source)
    assert info.value.stage == "fly"


def _transpose_on_gpu(module, m: int, n: int) -> None:
    values = array.array("f", (random.uniform(-1e3, 1e3) for _ in range(m * n)))
    source = runtime.DeviceBuffer(4 * m * n)
    source.copy_from_host(values)
    out = runtime.DeviceBuffer(4 * m * n)
    out.memset(0xFF)  # NaN everywhere: every element must be written
    module.launch("transpose_f32", (m * n + 255) // 256, 256, source, out, m, n)
    runtime.synchronize()
    got = array.array("f")
    got.frombytes(out.copy_to_host())
    expected = [values[r * n + c] for c in range(n) for r in range(m)]
    assert got.tolist() == expected


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(1, 1), (37, 53), (1, 1000), (1024, 3), (513, 257)])
def test_transpose_with_dynamic_layouts_is_exact(m, n):
    module = runtime.load(flyc.compile_mlir(TRANSPOSE))
    _transpose_on_gpu(module, m, n)


SMEM_SWIZZLE = (Path(__file__).resolve().parents[2] / "examples" / "smem_swizzle.mlir").read_text()


def test_smem_swizzle_kernel_uses_16_byte_accesses_and_reports_its_shared_memory():
    compiled = flyc.compile_mlir(SMEM_SWIZZLE, assemble=True)
    assert compiled.kernels == {"swizzle_roundtrip": "pppii"}
    assert compiled.shared_bytes == {"swizzle_roundtrip": 8192}
    accesses = re.findall(r"\b(?:ld|st)\.(?:global|shared)[.\w]*", compiled.ptx)
    assert accesses and all(".v4.b32" in access for access in accesses), accesses
    assert ".extern .shared .align 128 .b8 __fly_smem[];" in compiled.ptx


@pytest.mark.gpu
def test_smem_swizzle_round_trip_matches_flydsl_layout_swizzle():
    from flydsl.layout import Swizzle

    blocks, ld = 3, 72  # 64 of the 72 columns are moved; the rest of `out` must stay poisoned
    rows = 64 * blocks
    values = array.array("H", (random.getrandbits(16) & 0x7BFF for _ in range(rows * ld)))  # finite f16 bits
    source = runtime.DeviceBuffer(2 * rows * ld)
    source.copy_from_host(values)
    out = runtime.DeviceBuffer(2 * rows * ld)
    out.memset(0xFF)
    dump = runtime.DeviceBuffer(2 * 4096 * blocks)
    dump.memset(0xFF)
    module = runtime.load(flyc.compile_mlir(SMEM_SWIZZLE))
    module.launch("swizzle_roundtrip", blocks, 512, source, out, dump, ld, blocks)  # shared memory: 8192 bytes
    runtime.synchronize()

    got = array.array("H")
    got.frombytes(out.copy_to_host())
    for r in range(rows):
        assert got[r * ld : r * ld + 64] == values[r * ld : r * ld + 64], f"row {r}"
        assert set(got[r * ld + 64 : (r + 1) * ld]) == {0xFFFF}, f"row {r}: columns past the tile were written"

    placed = array.array("H")
    placed.frombytes(dump.copy_to_host())
    swizzle = Swizzle(3, 3, 3)
    for block in range(blocks):
        for r in range(64):
            for c in range(64):
                expected = values[(64 * block + r) * ld + c]
                assert placed[4096 * block + swizzle(r * 64 + c)] == expected
