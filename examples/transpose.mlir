// A transpose through Fly tensors with dynamic layouts: `in` is M x N row-major
// ((M,N):(N,1)), `out` is N x M row-major; thread i takes coordinate
// idx2crd(i) of in's shape and copies in(r, c) to out(c, r). One binary serves
// every M and N; offsets are 64-bit.
module attributes {gpu.container_module} {
  gpu.module @transpose {
    gpu.func @transpose_f32(%in_raw: !llvm.ptr<1>, %out_raw: !llvm.ptr<1>, %m_i32: i32, %n_i32: i32) kernel {
      %m = arith.index_cast %m_i32 : i32 to index
      %n = arith.index_cast %n_i32 : i32 to index
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %in_layout = fly.make_layout(%m, %n, %n) : !fly.layout<(?,?):(?,1)>
      %size = fly.size %in_layout : !fly.layout<(?,?):(?,1)>
      %in_range = arith.cmpi ult, %i, %size : index
      scf.if %in_range {
        %in_ptr = fly.make_ptr %in_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
        %out_ptr = fly.make_ptr %out_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
        %out_layout = fly.make_layout(%n, %m, %m) : !fly.layout<(?,?):(?,1)>
        %in = fly.make_tensor %in_ptr, %in_layout : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,?):(?,1)>>
        %out = fly.make_tensor %out_ptr, %out_layout : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,?):(?,1)>>
        %crd = fly.idx2crd(%i), %in_layout : !fly.layout<(?,?):(?,1)> -> !fly.int_tuple<(?,?)>
        %r = fly.get %crd[0] : !fly.int_tuple<(?,?)>
        %c = fly.get %crd[1] : !fly.int_tuple<(?,?)>
        %x = fly.load %in(%r, %c) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,?):(?,1)>>
        fly.store %x, %out(%c, %r) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,?):(?,1)>>
      }
      gpu.return
    }
  }
}
