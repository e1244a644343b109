// RUN: %fly-opt %s -p 'builtin.module(fly-lower-tensors,fly-lower-layouts,canonicalize,cse)' | FileCheck %s

// An f16 tile (8,2):(1,8) seen as i32 is (4,2):(1,4) (flydsl.layout.recast_layout(32, 16, ...)): the
// same base pointer, i32 GEPs, and two 16-byte vector<4xi32> accesses.
// CHECK-LABEL: func.func @f16_as_i32
// CHECK-SAME: (%[[A:[^:]*]]: !llvm.ptr<1>, %[[B:[^:]*]]: !llvm.ptr<1>)
// CHECK: %[[V0:.*]] = llvm.load %[[A]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.store %[[V0]], %[[B]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-DAG: %[[A4:.*]] = llvm.getelementptr %[[A]][4] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i32
// CHECK-DAG: %[[B4:.*]] = llvm.getelementptr %[[B]][4] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i32
// CHECK: %[[V1:.*]] = llvm.load %[[A4]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.store %[[V1]], %[[B4]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NOT: llvm.load
// CHECK-NOT: fly.
func.func @f16_as_i32(%a_raw: !llvm.ptr<1>, %b_raw: !llvm.ptr<1>) {
  %ap = fly.make_ptr %a_raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %aq = fly.recast_ptr %ap : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, global, 16>
  %al = fly.make_layout : !fly.layout<(4,2):(1,4)>
  %a = fly.make_tensor %aq, %al : !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<(4,2):(1,4)>>
  %bp = fly.make_ptr %b_raw : !llvm.ptr<1> -> !fly.ptr<i32, global, 16>
  %bl = fly.make_layout : !fly.layout<8:1>
  %b = fly.make_tensor %bp, %bl : !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<8:1>>
  fly.copy %a, %b : !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<(4,2):(1,4)>>, !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<8:1>>
  return
}

// A chain of recasts reaches the fly.make_ptr; a slice of the recast tensor moves the pointer in units of
// the recast element (row %r of (2,?):(1,2) i64 is 2 * %r i64 elements on), and loads read that type.
// CHECK-LABEL: func.func @chain_and_slice
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<3>, %[[R:[^:]*]]: index, %{{.*}}: index)
// CHECK: %[[ROW:.*]] = arith.muli %[[R]], %{{.*}} : index
// CHECK: %[[ROW64:.*]] = arith.index_cast %[[ROW]] : index to i64
// CHECK: %[[MOVED:.*]] = llvm.getelementptr %[[RAW]][%[[ROW64]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i64
// CHECK: %[[ONE:.*]] = llvm.getelementptr %[[MOVED]][1] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i64
// CHECK: llvm.load %[[ONE]] {alignment = 8 : i64} : !llvm.ptr<3> -> i64
func.func @chain_and_slice(%raw: !llvm.ptr<3>, %r: index, %n: index) -> i64 {
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<bf16, shared, 16>
  %q = fly.recast_ptr %p : !fly.ptr<bf16, shared, 16> -> !fly.ptr<i32, shared, 16>
  %w = fly.recast_ptr %q : !fly.ptr<i32, shared, 16> -> !fly.ptr<i64, shared, 8>
  %l = fly.make_layout(%n) : !fly.layout<(2,?):(1,2)>
  %t = fly.make_tensor %w, %l : !fly.tensor<!fly.ptr<i64, shared, 8>, !fly.layout<(2,?):(1,2)>>
  %row = fly.slice %t[false, true](%r) : !fly.tensor<!fly.ptr<i64, shared, 8>, !fly.layout<(2,?):(1,2)>> -> !fly.tensor<!fly.ptr<i64, shared, 8>, !fly.layout<2:1>>
  %c1 = arith.constant 1 : index
  %x = fly.load %row(%c1) : !fly.tensor<!fly.ptr<i64, shared, 8>, !fly.layout<2:1>>
  return %x : i64
}

// Must not fire: the recast pointer comes in as an argument, so there is no base pointer to lower with.
// CHECK-LABEL: func.func @no_fire
// CHECK: fly.recast_ptr
// CHECK: fly.copy
func.func @no_fire(%p: !fly.ptr<f16, global, 16>, %b: !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<4:1>>) {
  %q = fly.recast_ptr %p : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, global, 16>
  %l = fly.make_layout : !fly.layout<4:1>
  %a = fly.make_tensor %q, %l : !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<4:1>>
  fly.copy %a, %b : !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<4:1>>, !fly.tensor<!fly.ptr<i32, global, 16>, !fly.layout<4:1>>
  return
}
