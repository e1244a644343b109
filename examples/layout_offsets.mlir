// A kernel written directly in MLIR with a Fly op: thread i writes L(i), the
// offset that the CuTe layout ((4,2),8):((16,1),2) gives its linear coordinate.
// examples/00_native_demo.py compiles it to PTX and, on a GPU, runs and checks it.
module attributes {gpu.container_module} {
  gpu.module @layout_demo {
    gpu.func @layout_offsets(%out: !llvm.ptr<1>, %n: i32) kernel {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %n_index = arith.index_cast %n : i32 to index
      %in_range = arith.cmpi ult, %i, %n_index : index
      scf.if %in_range {
        %layout = fly.make_layout : !fly.layout<((4,2),8):((16,1),2)>
        %size = fly.size %layout : !fly.layout<((4,2),8):((16,1),2)>
        // Wrap around the layout's domain so every thread has a coordinate.
        %crd = arith.remui %i, %size : index
        %offset = fly.crd2idx(%crd), %layout : !fly.layout<((4,2),8):((16,1),2)>
        %value = arith.index_cast %offset : index to i32
        %i64 = arith.index_cast %i : index to i64
        %slot = llvm.getelementptr %out[%i64] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32
        llvm.store %value, %slot : i32, !llvm.ptr<1>
      }
      gpu.return
    }
  }
}
