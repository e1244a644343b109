// Global -> swizzled shared memory -> global, through Fly tensors, slices and copies.
// Each block moves a 64 x 64 f16 tile of a row-major matrix (row stride `ld`, a multiple of 8).
// Shared memory holds the tile as Sw<3,3,3> o ((8,8),64):((1,8),64): 16-byte chunks whose
// position in a 128-byte row is XORed with the row, so that the column-wise reads of phase 2
// hit different banks. Phase 1 writes chunk (t % 8) of row (t / 8); phase 2 reads chunk
// (t / 64) of row (t % 64), which other threads wrote; phase 3 dumps shared memory unswizzled
// so that a test can compare the placement with flydsl.layout's Swizzle(3, 3, 3).
// Every copy is one 16-byte access: the layouts, alignments and divisors prove it.
module attributes {gpu.container_module} {
  gpu.module @smem_demo {
    gpu.func @swizzle_roundtrip(%in_raw: !llvm.ptr<1>, %out_raw: !llvm.ptr<1>, %dump_raw: !llvm.ptr<1>,
                                %ld_i32: i32, %blocks_i32: i32) kernel {
      %ld = arith.index_cast %ld_i32 : i32 to index
      %blocks = arith.index_cast %blocks_i32 : i32 to index
      %t = gpu.thread_id x
      %bid = gpu.block_id x
      %c8 = arith.constant 8 : index
      %c64 = arith.constant 64 : index
      %c4096 = arith.constant 4096 : index
      %ld64 = arith.muli %ld, %c64 : index

      // The matrix as (element in chunk, chunk), (row in tile, tile).
      %g_layout = fly.make_layout(%blocks, %ld, %ld64) : !fly.layout<((8,8),(64,?)):((1,8),(?{div=8},?{div=512}))>
      %in_ptr = fly.make_ptr %in_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
      %out_ptr = fly.make_ptr %out_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
      %in = fly.make_tensor %in_ptr, %g_layout : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,8),(64,?)):((1,8),(?{div=8},?{div=512}))>>
      %out = fly.make_tensor %out_ptr, %g_layout : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,8),(64,?)):((1,8),(?{div=8},?{div=512}))>>

      %s_ptr = fly.alloc_smem 4096 : !fly.ptr<f16, shared, 128>
      %s_plain = fly.make_layout : !fly.layout<((8,8),64):((1,8),64)>
      %s_layout = fly.make_composed_layout %s_plain : !fly.layout<((8,8),64):((1,8),64)> -> !fly.composed_layout<Sw<3,3,3> o 0 o ((8,8),64):((1,8),64)>
      %s = fly.make_tensor %s_ptr, %s_layout : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o ((8,8),64):((1,8),64)>>

      // Phase 1: chunk t % 8 of row t / 8.
      %w_chunk = arith.remui %t, %c8 : index
      %w_row = arith.divui %t, %c8 : index
      %g_w = fly.slice %in[false, true, true, true](%w_chunk, %w_row, %bid) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,8),(64,?)):((1,8),(?{div=8},?{div=512}))>> -> !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
      %s_w = fly.slice %s[false, true, true](%w_chunk, %w_row) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o ((8,8),64):((1,8),64)>> -> !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=8} o 8:1>>
      fly.copy %g_w, %s_w : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=8} o 8:1>>
      gpu.barrier

      // Phase 2: chunk t / 64 of row t % 64, written by another thread.
      %r_chunk = arith.divui %t, %c64 : index
      %r_row = arith.remui %t, %c64 : index
      %s_r = fly.slice %s[false, true, true](%r_chunk, %r_row) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o ((8,8),64):((1,8),64)>> -> !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=8} o 8:1>>
      %g_r = fly.slice %out[false, true, true, true](%r_chunk, %r_row, %bid) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,8),(64,?)):((1,8),(?{div=8},?{div=512}))>> -> !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
      fly.copy %s_r, %g_r : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=8} o 8:1>>, !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>

      // Phase 3: shared memory as it lies, 8 elements per thread.
      %raw_layout = fly.make_layout : !fly.layout<(8,512):(1,8)>
      %raw = fly.make_tensor %s_ptr, %raw_layout : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.layout<(8,512):(1,8)>>
      %raw_t = fly.slice %raw[false, true](%t) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.layout<(8,512):(1,8)>> -> !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>
      %dump_ptr = fly.make_ptr %dump_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
      %dump_layout = fly.make_layout(%blocks) : !fly.layout<((8,512),?):((1,8),4096)>
      %dump = fly.make_tensor %dump_ptr, %dump_layout : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,512),?):((1,8),4096)>>
      %dump_t = fly.slice %dump[false, true, true](%t, %bid) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<((8,512),?):((1,8),4096)>> -> !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
      fly.copy %raw_t, %dump_t : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
      gpu.return
    }
  }
}
