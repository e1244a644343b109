"""Pointer recast (``fly.recast_ptr``): bf16 data moved through an i32 view, compiled (CPU) and run (``gpu``)."""

from __future__ import annotations

import array
import random
import re

import pytest

import flydsl.compiler as flyc
from flydsl.compiler import runtime
from flydsl.layout import Layout, recast_layout

# Thread r copies the first 16 bf16 of row r of `in` (row stride `ld` bf16, a multiple of 8) to row r of `out`
# (16 bf16 per row), through i32 views: the layouts are recast_layout(32, 16, ...) of the bf16 ones, so a row is
# 8 i32 and, with 16-byte pointers and a row stride of ld / 2 i32 (a multiple of 4), two 16-byte accesses.
RECAST_COPY = """
!in_t = !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<(8,?):(1,?{div=4})>>
!out_t = !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<(8,?):(1,8)>>
!row_t = !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<8:1>>
module attributes {gpu.container_module} {
  gpu.module @recast_demo {
    gpu.func @recast_copy(%in_raw: !llvm.ptr<1>, %out_raw: !llvm.ptr<1>, %ld_i32: i32, %rows_i32: i32) kernel {
      %ld = arith.index_cast %ld_i32 : i32 to index
      %rows = arith.index_cast %rows_i32 : i32 to index
      %c1 = arith.constant 1 : index
      %ld_words = arith.shrui %ld, %c1 : index
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %r = arith.addi %base, %tid : index
      %in_range = arith.cmpi ult, %r, %rows : index

      %in_bf16 = fly.make_ptr %in_raw : !llvm.ptr<1> -> !fly.ptr<bf16, global, 16>
      %in_ptr = fly.recast_ptr %in_bf16 : !fly.ptr<bf16, global, 16> -> !fly.ptr<i32, global, 16>
      %in_layout = fly.make_layout(%rows, %ld_words) : !fly.layout<(8,?):(1,?{div=4})>
      %in = fly.make_tensor %in_ptr, %in_layout : !in_t
      %out_bf16 = fly.make_ptr %out_raw : !llvm.ptr<1> -> !fly.ptr<bf16, global, 16>
      %out_ptr = fly.recast_ptr %out_bf16 : !fly.ptr<bf16, global, 16> -> !fly.ptr<i32, global, 16>
      %out_layout = fly.make_layout(%rows) : !fly.layout<(8,?):(1,8)>
      %out = fly.make_tensor %out_ptr, %out_layout : !out_t

      %in_row = fly.slice %in[false, true](%r) : !in_t -> !row_t
      %out_row = fly.slice %out[false, true](%r) : !out_t -> !row_t
      fly.copy %in_row, %out_row if %in_range : !row_t, !row_t
      gpu.return
    }
  }
}
"""


def test_the_kernels_i32_layouts_are_the_recast_bf16_layouts():
    # What the tracer computes for the kernel above (with ld = 24, rows = 5 standing in for the dynamic leaves).
    assert recast_layout(32, 16, Layout((16, 5), (1, 24))) == Layout((8, 5), (1, 12))
    assert recast_layout(32, 16, Layout((16, 5), (1, 16))) == Layout((8, 5), (1, 8))


def test_recast_copy_uses_16_byte_i32_accesses():
    compiled = flyc.compile_mlir(RECAST_COPY, keep_stages=True, assemble=True)
    assert compiled.kernels == {"recast_copy": "ppii"}
    assert "fly." not in compiled.stages["fly"].replace("recast_demo", "")
    assert compiled.stages["fly"].count("-> vector<4xi32>") == 2
    accesses = re.findall(r"\b(?:ld|st)\.global[.\w]*", compiled.ptx)
    assert len(accesses) == 4 and all(".v4.b32" in access for access in accesses), accesses


@pytest.mark.gpu
@pytest.mark.parametrize("rows, ld", [(1, 16), (37, 24), (1000, 16), (513, 72)])
def test_bf16_rows_copied_through_an_i32_view_are_exact(rows, ld):
    values = array.array("H", (random.getrandbits(16) for _ in range(rows * ld)))  # any bf16 bits, NaNs included
    source = runtime.DeviceBuffer(2 * rows * ld)
    source.copy_from_host(values)
    spare_rows = 2  # must stay poisoned: threads past `rows` copy nothing
    out = runtime.DeviceBuffer(2 * 16 * (rows + spare_rows))
    out.memset(0xFF)
    module = runtime.load(flyc.compile_mlir(RECAST_COPY))
    module.launch("recast_copy", (rows + 127) // 128, 128, source, out, ld, rows)
    runtime.synchronize()

    got = array.array("H")
    got.frombytes(out.copy_to_host())
    for r in range(rows):
        assert got[16 * r : 16 * (r + 1)] == values[ld * r : ld * r + 16], f"row {r}"
    assert set(got[16 * rows :]) == {0xFFFF}, "rows past the last one were written"
