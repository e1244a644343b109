"""Fly tensors with dynamic layouts, compiled end to end (CPU) and run on the GPU (``gpu``)."""

from __future__ import annotations

import array
import random
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
