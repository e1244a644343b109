// RUN: %fly-opt %s -p 'builtin.module(fly-lower-tensors,fly-lower-layouts,canonicalize,cse)' | FileCheck %s

// 8 contiguous f16 with 16-byte-aligned pointers and an 8-divisible dynamic row stride:
// two 16-byte accesses; the swizzle Sw<3,3,3> moves row 1's chunk from 64 to 72.
// CHECK-LABEL: func.func @vectorized_through_swizzle
// CHECK: %[[V0:.*]] = llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf16>
// CHECK: llvm.store %[[V0]], %{{.*}} {alignment = 16 : i64} : vector<8xf16>, !llvm.ptr<3>
// CHECK: llvm.getelementptr %{{.*}}[72] : (!llvm.ptr<3>) -> !llvm.ptr<3>, f16
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf16>
func.func @vectorized_through_swizzle(%g_raw: !llvm.ptr<1>, %s_raw: !llvm.ptr<3>, %ld: index) {
  %gp = fly.make_ptr %g_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %gl = fly.make_layout(%ld) : !fly.layout<(8,2):(1,?{div=8})>
  %g = fly.make_tensor %gp, %gl : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,2):(1,?{div=8})>>
  %sp = fly.make_ptr %s_raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 128>
  %sl = fly.make_layout : !fly.layout<(8,2):(1,64)>
  %sc = fly.make_composed_layout %sl : !fly.layout<(8,2):(1,64)> -> !fly.composed_layout<Sw<3,3,3> o 0 o (8,2):(1,64)>
  %s = fly.make_tensor %sp, %sc : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,2):(1,64)>>
  fly.copy %g, %s : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,2):(1,?{div=8})>>, !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,2):(1,64)>>
  return
}

// Width limited by what is proven: an unknown row stride allows 8 elements per row only if the run is 8
// and the stride is a multiple of 8; here the stride's divisor is 2, so 2 elements (4 bytes).
// CHECK-LABEL: func.func @limited_by_divisibility
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> vector<2xf16>
// CHECK-NOT: llvm.load
func.func @limited_by_divisibility(%a_raw: !llvm.ptr<1>, %b_raw: !llvm.ptr<1>, %ld: index) {
  %ap = fly.make_ptr %a_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %al = fly.make_layout(%ld) : !fly.layout<(8,2):(1,?{div=2})>
  %a = fly.make_tensor %ap, %al : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,2):(1,?{div=2})>>
  %bp = fly.make_ptr %b_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %bl = fly.make_layout : !fly.layout<16:1>
  %b = fly.make_tensor %bp, %bl : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<16:1>>
  fly.copy %a, %b : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,2):(1,?{div=2})>>, !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<16:1>>
  return
}

// A column (stride != 1) cannot be vectorized: scalar accesses.
// CHECK-LABEL: func.func @strided_is_scalar
// CHECK-COUNT-4: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
func.func @strided_is_scalar(%a_raw: !llvm.ptr<1>, %b_raw: !llvm.ptr<1>) {
  %ap = fly.make_ptr %a_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %al = fly.make_layout : !fly.layout<4:32>
  %a = fly.make_tensor %ap, %al : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:32>>
  %bp = fly.make_ptr %b_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %bl = fly.make_layout : !fly.layout<4:1>
  %b = fly.make_tensor %bp, %bl : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>
  fly.copy %a, %b : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:32>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>
  return
}

// Dynamic size: an scf.for over 4-element (16-byte) chunks, guarded by the predicate.
// CHECK-LABEL: func.func @dynamic_predicated
// CHECK: scf.if %{{.*}} {
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c4
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
func.func @dynamic_predicated(%a_raw: !llvm.ptr<1>, %b_raw: !llvm.ptr<1>, %n: index, %p: i1) {
  %ap = fly.make_ptr %a_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %bp = fly.make_ptr %b_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %l = fly.make_layout(%n) : !fly.layout<?{div=4}:1>
  %a = fly.make_tensor %ap, %l : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<?{div=4}:1>>
  %b = fly.make_tensor %bp, %l : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<?{div=4}:1>>
  fly.copy %a, %b if %p : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<?{div=4}:1>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<?{div=4}:1>>
  return
}

// A slice moves the pointer of a plain layout, and the offset inside the swizzle of a composed
// one: row %r of the swizzled tile starts at Sw<3,3,3>(64 * %r).
// CHECK-LABEL: func.func @sliced
// CHECK-SAME: (%[[G:[^:]*]]: !llvm.ptr<1>, %[[S:[^:]*]]: !llvm.ptr<3>, %[[R:[^:]*]]: index)
// CHECK: %[[C64:.*]] = arith.constant 64 : index
// CHECK: %[[ROW:.*]] = arith.muli %[[R]], %[[C64]] : index
// CHECK: %[[SEL:.*]] = arith.andi %[[ROW]], %{{.*}} : index
// CHECK: %[[MOVED:.*]] = arith.shrui %[[SEL]], %{{.*}} : index
// CHECK: %[[SW:.*]] = arith.xori %[[ROW]], %[[MOVED]] : index
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xf16>
func.func @sliced(%g_raw: !llvm.ptr<1>, %s_raw: !llvm.ptr<3>, %r: index) {
  %sp = fly.make_ptr %s_raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 128>
  %sl = fly.make_layout : !fly.layout<(8,64):(1,64)>
  %sc = fly.make_composed_layout %sl : !fly.layout<(8,64):(1,64)> -> !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,64)>
  %s = fly.make_tensor %sp, %sc : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,64)>>
  %row = fly.slice %s[false, true](%r) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,64)>> -> !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 8:1>>
  %gp = fly.make_ptr %g_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %gl = fly.make_layout : !fly.layout<(8,64):(1,8)>
  %g = fly.make_tensor %gp, %gl : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,64):(1,8)>>
  %grow = fly.slice %g[false, true](%r) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(8,64):(1,8)>> -> !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
  fly.copy %row, %grow : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 8:1>>, !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
  return
}

// add_offset moves the base pointer (a GEP in elements) before the layout's offset.
// CHECK-LABEL: func.func @moved
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<1>, %[[OFF:[^:]*]]: index
// CHECK: %[[OFF64:.*]] = arith.index_cast %[[OFF]] : index to i64
// CHECK: %[[BASE:.*]] = llvm.getelementptr %[[RAW]][%[[OFF64]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK: llvm.load %[[BASE]] {alignment = 4 : i64} : !llvm.ptr<1> -> f32
func.func @moved(%raw: !llvm.ptr<1>, %off: index, %dst_raw: !llvm.ptr<1>) {
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %q = fly.add_offset %p, %off : !fly.ptr<f32, global, 16> -> !fly.ptr<f32, global, 4>
  %l = fly.make_layout : !fly.layout<1:1>
  %t = fly.make_tensor %q, %l : !fly.tensor<!fly.ptr<f32, global, 4>, !fly.layout<1:1>>
  %dp = fly.make_ptr %dst_raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 4>
  %d = fly.make_tensor %dp, %l : !fly.tensor<!fly.ptr<f32, global, 4>, !fly.layout<1:1>>
  fly.copy %t, %d : !fly.tensor<!fly.ptr<f32, global, 4>, !fly.layout<1:1>>, !fly.tensor<!fly.ptr<f32, global, 4>, !fly.layout<1:1>>
  return
}

// Must not fire: a tensor passed in as an argument has nothing to lower with.
// CHECK-LABEL: func.func @no_fire
// CHECK: fly.copy
func.func @no_fire(%a: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>, %b: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>) {
  fly.copy %a, %b : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>
  return
}
