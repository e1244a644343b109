// RUN: %fly-opt %s | %fly-opt - | FileCheck %s
// Every Fly attribute, type and op prints in a form that parses back to the same IR.

// CHECK-LABEL: func.func @layout_types
// CHECK-SAME: !fly.layout<8:1>
// CHECK-SAME: !fly.layout<(4,8):(1,4)>
// CHECK-SAME: !fly.layout<((2,4),8):((1,16),2)>
// CHECK-SAME: !fly.layout<(?,8):(8,1)>
// CHECK-SAME: !fly.layout<(?{div=16},?):(1,?{div=16})>
// CHECK-SAME: !fly.layout<(4,2):(0,-1)>
// CHECK-SAME: !fly.layout<(2,1):(4294967296,9223372036854775807)>
// CHECK-SAME: !fly.layout<():()>
func.func @layout_types(%a: !fly.layout<8:1>, %b: !fly.layout<(4,8):(1,4)>,
                        %c: !fly.layout<((2,4),8):((1,16),2)>, %d: !fly.layout<(?,8):(8,1)>,
                        %e: !fly.layout<(?{div=16},?):(1,?{div=16})>,
                        %f: !fly.layout<(4,2):(0,-1)>,
                        %g: !fly.layout<(2,1):(4294967296,9223372036854775807)>,
                        %h: !fly.layout<():()>) {
  return
}

// CHECK-LABEL: func.func @other_types
// CHECK-SAME: !fly.int_tuple<(4,(?,2))>
// CHECK-SAME: !fly.int_tuple<?{div=8}>
// CHECK-SAME: !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>
// CHECK-SAME: !fly.composed_layout<Sw<2,3,-3> o 32 o (?,8):(8,1)>
// CHECK-SAME: !fly.composed_layout<Sw<3,4,3> o ?{div=8} o 8:1>
// CHECK-SAME: !fly.ptr<f16, global, 16>
// CHECK-SAME: !fly.ptr<bf16, shared, 128>
// CHECK-SAME: !fly.ptr<f32, register, 4>
// CHECK-SAME: !fly.ptr<i64, generic, 16>
// CHECK-SAME: !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(?,8):(8,1)>>
// CHECK-SAME: !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>>
func.func @other_types(%a: !fly.int_tuple<(4,(?,2))>, %b: !fly.int_tuple<?{div=8}>,
                       %c: !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>,
                       %d: !fly.composed_layout<Sw<2,3,-3> o 32 o (?,8):(8,1)>,
                       %d2: !fly.composed_layout<Sw<3,4,3> o ?{div=8} o 8:1>,
                       %e: !fly.ptr<f16, global, 16>, %f: !fly.ptr<bf16, shared, 128>,
                       %g: !fly.ptr<f32, register, 4>, %h: !fly.ptr<i64, generic, 16>,
                       %i: !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(?,8):(8,1)>>,
                       %j: !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>>) {
  return
}

// CHECK-LABEL: func.func @attributes
// CHECK: fly.dyn = #fly.dyn<16>
// CHECK-SAME: fly.swizzle = #fly.swizzle<3, 4, 3>
func.func @attributes() attributes {fly.dyn = #fly.dyn<16>, fly.swizzle = #fly.swizzle<3,4,3>} {
  return
}

// CHECK-LABEL: func.func @layout_ops
func.func @layout_ops(%i: index, %j: index, %m: index) -> (index, index, index, index) {
  // CHECK: %[[L:.*]] = fly.make_layout : !fly.layout<(4,8):(8,1)>
  %l = fly.make_layout : !fly.layout<(4,8):(8,1)>
  // CHECK: %[[D:.*]] = fly.make_layout(%{{.*}}, %{{.*}}) : !fly.layout<(?,8):(?,1)>
  %d = fly.make_layout(%m, %j) : !fly.layout<(?,8):(?,1)>
  // CHECK: fly.size %[[L]] : !fly.layout<(4,8):(8,1)>
  %n = fly.size %l : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.rank %[[L]] : !fly.layout<(4,8):(8,1)>
  %r = fly.rank %l : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.crd2idx(%{{.*}}), %[[L]] : !fly.layout<(4,8):(8,1)>
  %o1 = fly.crd2idx(%i), %l : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.crd2idx(%{{.*}}, %{{.*}}), %[[D]] : !fly.layout<(?,8):(?,1)>
  %o2 = fly.crd2idx(%i, %j), %d : !fly.layout<(?,8):(?,1)>
  // CHECK: fly.idx2crd(%{{.*}}), %[[D]] : !fly.layout<(?,8):(?,1)> -> !fly.int_tuple<(?,?)>
  %c = fly.idx2crd(%i), %d : !fly.layout<(?,8):(?,1)> -> !fly.int_tuple<(?,?)>
  // CHECK: fly.get_shape %[[D]] : !fly.layout<(?,8):(?,1)>
  %s = fly.get_shape %d : !fly.layout<(?,8):(?,1)>
  // CHECK: fly.get_stride %[[D]] : !fly.layout<(?,8):(?,1)>
  %t = fly.get_stride %d : !fly.layout<(?,8):(?,1)>
  // CHECK: fly.get %{{.*}}[0] : !fly.int_tuple<(?,8)>
  %m2 = fly.get %s[0] : !fly.int_tuple<(?,8)>
  // CHECK: fly.make_int_tuple(%{{.*}}) : !fly.int_tuple<(4,(?,2))>
  %tuple = fly.make_int_tuple(%i) : !fly.int_tuple<(4,(?,2))>
  // CHECK: fly.get %{{.*}}[1] : !fly.int_tuple<(4,(?,2))>
  %inner = fly.get %tuple[1] : !fly.int_tuple<(4,(?,2))>
  // CHECK: fly.apply_swizzle %{{.*}}, <3, 4, 3> : index
  %y = fly.apply_swizzle %i, <3,4,3> : index
  // CHECK: fly.make_composed_layout %[[L]] : !fly.layout<(4,8):(8,1)> -> !fly.composed_layout<Sw<1,0,1> o 0 o (4,8):(8,1)>
  %sw = fly.make_composed_layout %l : !fly.layout<(4,8):(8,1)> -> !fly.composed_layout<Sw<1,0,1> o 0 o (4,8):(8,1)>
  return %n, %o1, %o2, %m2 : index, index, index, index
}

// CHECK-LABEL: func.func @tensor_ops
func.func @tensor_ops(%raw: !llvm.ptr<1>, %i: index, %v: f16) -> f16 {
  // CHECK: %[[P:.*]] = fly.make_ptr %{{.*}} : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %l = fly.make_layout : !fly.layout<(4,8):(8,1)>
  // CHECK: %[[T:.*]] = fly.make_tensor %[[P]], %{{.*}} : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  %t = fly.make_tensor %p, %l : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  // CHECK: fly.load %[[T]](%{{.*}}) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  %x = fly.load %t(%i) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  // CHECK: fly.store %{{.*}}, %[[T]](%{{.*}}, %{{.*}}) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  fly.store %v, %t(%i, %i) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  // CHECK: fly.element_address %[[T]](%{{.*}}, %{{.*}}) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr<1>
  %a = fly.element_address %t(%i, %i) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr<1>
  // CHECK: fly.element_address %[[T]](%{{.*}}) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr<1>
  %b = fly.element_address %t(%i) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr<1>
  llvm.store %v, %a : f16, !llvm.ptr<1>
  llvm.store %v, %b : f16, !llvm.ptr<1>
  return %x : f16
}

// CHECK-LABEL: func.func @slices_copies_smem
func.func @slices_copies_smem(%raw: !llvm.ptr<1>, %i: index, %p: i1) {
  %gp = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %gl = fly.make_layout : !fly.layout<(4,8):(8,1)>
  %g = fly.make_tensor %gp, %gl : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>
  // CHECK: fly.slice %{{.*}}[true, false](%{{.*}}) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  %row = fly.slice %g[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  // CHECK: fly.add_offset %{{.*}}, %{{.*}} : !fly.ptr<f32, global, 16> -> !fly.ptr<f32, global, 4>
  %moved = fly.add_offset %gp, %i : !fly.ptr<f32, global, 16> -> !fly.ptr<f32, global, 4>
  // CHECK: fly.alloc_smem 8 : !fly.ptr<f32, shared, 16>
  %sp = fly.alloc_smem 8 : !fly.ptr<f32, shared, 16>
  %sl = fly.make_layout : !fly.layout<8:1>
  // CHECK: fly.make_composed_layout %{{.*}} offset %{{.*}} : !fly.layout<8:1> -> !fly.composed_layout<Sw<1,2,1> o ? o 8:1>
  %sc = fly.make_composed_layout %sl offset %i : !fly.layout<8:1> -> !fly.composed_layout<Sw<1,2,1> o ? o 8:1>
  %s = fly.make_tensor %sp, %sl : !fly.tensor<!fly.ptr<f32, shared, 16>, !fly.layout<8:1>>
  // CHECK: fly.copy %{{.*}}, %{{.*}} : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f32, shared, 16>, !fly.layout<8:1>>
  fly.copy %row, %s : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f32, shared, 16>, !fly.layout<8:1>>
  // CHECK: fly.copy %{{.*}}, %{{.*}} if %{{.*}} : !fly.tensor<!fly.ptr<f32, shared, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  fly.copy %s, %row if %p : !fly.tensor<!fly.ptr<f32, shared, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  return
}

// CHECK-LABEL: func.func @recast_ptr
func.func @recast_ptr(%raw: !llvm.ptr<1>) -> !fly.ptr<i32, global, 8> {
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  // CHECK: fly.recast_ptr %{{.*}} : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, global, 8>
  %q = fly.recast_ptr %p : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, global, 8>
  return %q : !fly.ptr<i32, global, 8>
}
