// RUN: %fly-opt %s -p 'builtin.module(fly-lower-smem,fly-lower-tensors)' | FileCheck %s

// An element's address is computed as a load's: through fly.add_offset (a GEP on the source element),
// fly.recast_ptr (the same base, GEPs on the new element) and fly.slice (the fixed offset moves the pointer).
// CHECK-LABEL: func.func @through_views
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<1>, %[[O:[^:]*]]: index, %[[R:[^:]*]]: index, %[[C:[^:]*]]: index)
// CHECK-NOT: fly.
// CHECK: %[[O64:.*]] = arith.index_cast %[[O]] : index to i64
// CHECK: %[[MOVED:.*]] = llvm.getelementptr %[[RAW]][%[[O64]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK: %[[C16:.*]] = arith.constant 16 : index
// CHECK: %[[ROW:.*]] = arith.muli %[[R]], %[[C16]] : index
// CHECK: %[[ROW64:.*]] = arith.index_cast %[[ROW]] : index to i64
// CHECK: %[[ROWP:.*]] = llvm.getelementptr %[[MOVED]][%[[ROW64]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK: %[[C64:.*]] = arith.index_cast %[[C]] : index to i64
// CHECK: %[[A:.*]] = llvm.getelementptr %[[ROWP]][%[[C64]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK: return %[[A]] : !llvm.ptr<1>
func.func @through_views(%raw: !llvm.ptr<1>, %o: index, %r: index, %c: index) -> !llvm.ptr<1> {
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
  %q = fly.add_offset %p, %o : !fly.ptr<f16, global, 16> -> !fly.ptr<f16, global, 2>
  %w = fly.recast_ptr %q : !fly.ptr<f16, global, 2> -> !fly.ptr<i8, global, 1>
  %l = fly.make_layout : !fly.layout<(4,16):(16,1)>
  %t = fly.make_tensor %w, %l : !fly.tensor<!fly.ptr<i8, global, 1>, !fly.layout<(4,16):(16,1)>>
  %row = fly.slice %t[true, false](%r) : !fly.tensor<!fly.ptr<i8, global, 1>, !fly.layout<(4,16):(16,1)>> -> !fly.tensor<!fly.ptr<i8, global, 1>, !fly.layout<16:1>>
  %a = fly.element_address %row(%c) : !fly.tensor<!fly.ptr<i8, global, 1>, !fly.layout<16:1>> -> !llvm.ptr<1>
  return %a : !llvm.ptr<1>
}

// Shared memory placed by fly-lower-smem, swizzled: the slice moves the offset inside the swizzle, so
// the address is base + Sw<3,3,3>(64 * %r + %k) bf16 elements.
// CHECK-LABEL: func.func @swizzled_smem
// CHECK-SAME: (%[[R:[^:]*]]: index, %[[K:[^:]*]]: index) -> !llvm.ptr<3> attributes {fly.smem_bytes = 1024 : i64}
// CHECK-NOT: fly.
// CHECK: %[[SMEM:.*]] = llvm.mlir.addressof @__fly_smem : !llvm.ptr<3>
// CHECK: %[[BASE:.*]] = llvm.getelementptr %[[SMEM]][0] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
// CHECK: %[[ROW:.*]] = arith.muli %[[R]], %{{.*}} : index
// CHECK: %[[SUM:.*]] = arith.addi %[[ROW]], %[[K]] : index
// CHECK: %[[MASK:.*]] = arith.constant 448 : index
// CHECK: %[[BITS:.*]] = arith.andi %[[SUM]], %[[MASK]] : index
// CHECK: %[[SHIFT:.*]] = arith.constant 3 : index
// CHECK: %[[MOVED:.*]] = arith.shrui %[[BITS]], %[[SHIFT]] : index
// CHECK: %[[SW:.*]] = arith.xori %[[SUM]], %[[MOVED]] : index
// CHECK: %[[SW64:.*]] = arith.index_cast %[[SW]] : index to i64
// CHECK: %[[A:.*]] = llvm.getelementptr %[[BASE]][%[[SW64]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, bf16
// CHECK: return %[[A]] : !llvm.ptr<3>
func.func @swizzled_smem(%r: index, %k: index) -> !llvm.ptr<3> {
  %p = fly.alloc_smem 512 : !fly.ptr<bf16, shared, 128>
  %l = fly.make_layout : !fly.layout<(8,64):(64,1)>
  %s = fly.make_composed_layout %l : !fly.layout<(8,64):(64,1)> -> !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(64,1)>
  %t = fly.make_tensor %p, %s : !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(64,1)>>
  %row = fly.slice %t[true, false](%r) : !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(64,1)>> -> !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 64:1>>
  %a = fly.element_address %row(%k) : !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 64:1>> -> !llvm.ptr<3>
  return %a : !llvm.ptr<3>
}

// Must not fire: a tensor that arrives as an argument has no pointer or leaves to compute with.
// CHECK-LABEL: func.func @no_fire
// CHECK: fly.element_address %{{.*}}(%{{.*}}) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>> -> !llvm.ptr<3>
func.func @no_fire(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>, %i: index) -> !llvm.ptr<3> {
  %a = fly.element_address %t(%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>> -> !llvm.ptr<3>
  return %a : !llvm.ptr<3>
}

// 8-bit floats have no LLVM type: their addresses step as i8 (what fp8 GEMM operands in shared memory use).
// CHECK-LABEL: func.func @fp8_element
// CHECK: llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NOT: f8E4M3FN
func.func @fp8_element(%raw: !llvm.ptr<1>, %c: index) -> !llvm.ptr<1> {
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f8E4M3FN, global, 16>
  %l = fly.make_layout : !fly.layout<64:1>
  %t = fly.make_tensor %p, %l : !fly.tensor<!fly.ptr<f8E4M3FN, global, 16>, !fly.layout<64:1>>
  %a = fly.element_address %t(%c) : !fly.tensor<!fly.ptr<f8E4M3FN, global, 16>, !fly.layout<64:1>> -> !llvm.ptr<1>
  return %a : !llvm.ptr<1>
}
