// RUN: %fly-opt %s -p 'builtin.module(fly-lower-tensors,fly-lower-layouts)' | FileCheck %s

// A composed layout's offset is swizzle(d + k): d the dynamic part (the composed offset, dynamic
// coordinates times strides), k the static part. Sw<3,3,3> reads bits 6..8 and xors them into bits
// 3..5: bits 0..2 pass through, and it acts within spans of 2^9 = 512 elements. Element (3, 9) of
// (8,64):(1,8) is k = 75 = 72 + 3.

// (a) d is a multiple of 2^3 (here 64, the ?{div=64} of the type): swizzle(d + 72) + 3, the xor
// sequence on the 8-element block and the low bits added after it.
// CHECK-LABEL: func.func @rule_a
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<3>, %[[D:[^:]*]]: index)
// CHECK: %[[C72:.*]] = arith.constant 72 : index
// CHECK: %[[HIGH:.*]] = arith.addi %[[D]], %[[C72]] : index
// CHECK: %[[MASK:.*]] = arith.constant 448 : index
// CHECK: %[[SEL:.*]] = arith.andi %[[HIGH]], %[[MASK]] : index
// CHECK: %[[MOVED:.*]] = arith.shrui %[[SEL]], %{{.*}} : index
// CHECK: %[[SW:.*]] = arith.xori %[[HIGH]], %[[MOVED]] : index
// CHECK: %[[C3:.*]] = arith.constant 3 : index
// CHECK: %[[OFF:.*]] = arith.addi %[[SW]], %[[C3]] : index
// CHECK: %[[OFF64:.*]] = arith.index_cast %[[OFF]] : index to i64
// CHECK: llvm.getelementptr %[[RAW]][%[[OFF64]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, f16
func.func @rule_a(%raw: !llvm.ptr<3>, %d: index) -> f16 {
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 16>
  %l = fly.make_layout : !fly.layout<(8,64):(1,8)>
  %s = fly.make_composed_layout %l offset %d : !fly.layout<(8,64):(1,8)> -> !fly.composed_layout<Sw<3,3,3> o ?{div=64} o (8,64):(1,8)>
  %t = fly.make_tensor %p, %s : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o (8,64):(1,8)>>
  %c3 = arith.constant 3 : index
  %c9 = arith.constant 9 : index
  %x = fly.load %t(%c3, %c9) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o (8,64):(1,8)>>
  return %x : f16
}

// (a) through a slice: row %r of a swizzled tile starts at 64 * %r, a multiple of 64 by its stride, so
// element 11 of the row is swizzle(64 * %r + 8) + 3.
// CHECK-LABEL: func.func @rule_a_sliced
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<3>, %[[R:[^:]*]]: index)
// CHECK: %[[ROW:.*]] = arith.muli %[[R]], %{{.*}} : index
// CHECK: %[[C8:.*]] = arith.constant 8 : index
// CHECK: %[[HIGH:.*]] = arith.addi %[[ROW]], %[[C8]] : index
// CHECK: arith.andi %[[HIGH]]
// CHECK: %[[SW:.*]] = arith.xori %[[HIGH]], %{{.*}} : index
// CHECK: %[[C3:.*]] = arith.constant 3 : index
// CHECK: %[[OFF:.*]] = arith.addi %[[SW]], %[[C3]] : index
// CHECK: arith.index_cast %[[OFF]] : index to i64
func.func @rule_a_sliced(%raw: !llvm.ptr<3>, %r: index) -> !llvm.ptr<3> {
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 128>
  %l = fly.make_layout : !fly.layout<(64,8):(1,64)>
  %s = fly.make_composed_layout %l : !fly.layout<(64,8):(1,64)> -> !fly.composed_layout<Sw<3,3,3> o 0 o (64,8):(1,64)>
  %t = fly.make_tensor %p, %s : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (64,8):(1,64)>>
  %row = fly.slice %t[false, true](%r) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o 0 o (64,8):(1,64)>> -> !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 64:1>>
  %c11 = arith.constant 11 : index
  %a = fly.element_address %row(%c11) : !fly.tensor<!fly.ptr<f16, shared, 128>, !fly.composed_layout<Sw<3,3,3> o ?{div=64} o 64:1>> -> !llvm.ptr<3>
  return %a : !llvm.ptr<3>
}

// (b) d is a multiple of the whole span 512: d + swizzle(75), with swizzle(75) = 75 ^ 8 = 67 a
// constant; no xor left.
// CHECK-LABEL: func.func @rule_b
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<3>, %[[D:[^:]*]]: index)
// CHECK-NOT: arith.xori
// CHECK: %[[C67:.*]] = arith.constant 67 : index
// CHECK: %[[OFF:.*]] = arith.addi %[[D]], %[[C67]] : index
// CHECK: %[[OFF64:.*]] = arith.index_cast %[[OFF]] : index to i64
// CHECK: llvm.getelementptr %[[RAW]][%[[OFF64]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, f16
// CHECK-NOT: arith.xori
func.func @rule_b(%raw: !llvm.ptr<3>, %d: index) -> f16 {
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 16>
  %l = fly.make_layout : !fly.layout<(8,64):(1,8)>
  %s = fly.make_composed_layout %l offset %d : !fly.layout<(8,64):(1,8)> -> !fly.composed_layout<Sw<3,3,3> o ?{div=512} o (8,64):(1,8)>
  %t = fly.make_tensor %p, %s : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=512} o (8,64):(1,8)>>
  %c3 = arith.constant 3 : index
  %c9 = arith.constant 9 : index
  %x = fly.load %t(%c3, %c9) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=512} o (8,64):(1,8)>>
  return %x : f16
}

// (b) with nothing dynamic (fly.crd2idx of a static coordinate): the whole offset is a constant,
// Sw<3,3,3>(8 + 5 * 64 + 1024) = 1352 ^ (5 << 3) = 1376.
// CHECK-LABEL: func.func @rule_b_static
// CHECK-NOT: arith.xori
// CHECK: %[[C:.*]] = arith.constant 1376 : index
// CHECK-NEXT: return %[[C]] : index
func.func @rule_b_static() -> index {
  %l = fly.make_layout : !fly.layout<(64,8):(1,64)>
  %s = fly.make_composed_layout %l : !fly.layout<(64,8):(1,64)> -> !fly.composed_layout<Sw<3,3,3> o 1024 o (64,8):(1,64)>
  %c8 = arith.constant 8 : index
  %c5 = arith.constant 5 : index
  %o = fly.crd2idx(%c8, %c5), %s : !fly.composed_layout<Sw<3,3,3> o 1024 o (64,8):(1,64)>
  return %o : index
}

// Neither: d is only known to be a multiple of 4, so the low bits of d + 75 may carry into the
// swizzled ones; the xor sequence stays on the whole sum.
// CHECK-LABEL: func.func @neither
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<3>, %[[D:[^:]*]]: index)
// CHECK: %[[C75:.*]] = arith.constant 75 : index
// CHECK: %[[SUM:.*]] = arith.addi %[[D]], %[[C75]] : index
// CHECK: %[[MASK:.*]] = arith.constant 448 : index
// CHECK: %[[SEL:.*]] = arith.andi %[[SUM]], %[[MASK]] : index
// CHECK: %[[SHIFT:.*]] = arith.constant 3 : index
// CHECK: %[[MOVED:.*]] = arith.shrui %[[SEL]], %[[SHIFT]] : index
// CHECK: %[[SW:.*]] = arith.xori %[[SUM]], %[[MOVED]] : index
// CHECK: %[[OFF64:.*]] = arith.index_cast %[[SW]] : index to i64
// CHECK: llvm.getelementptr %[[RAW]][%[[OFF64]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, f16
func.func @neither(%raw: !llvm.ptr<3>, %d: index) -> f16 {
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<f16, shared, 16>
  %l = fly.make_layout : !fly.layout<(8,64):(1,8)>
  %s = fly.make_composed_layout %l offset %d : !fly.layout<(8,64):(1,8)> -> !fly.composed_layout<Sw<3,3,3> o ?{div=4} o (8,64):(1,8)>
  %t = fly.make_tensor %p, %s : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=4} o (8,64):(1,8)>>
  %c3 = arith.constant 3 : index
  %c9 = arith.constant 9 : index
  %x = fly.load %t(%c3, %c9) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=4} o (8,64):(1,8)>>
  return %x : f16
}

// A negative shift moves bits up: Sw<2,2,-3> reads bits 2..3 and xors them into bits 5..6, so its
// span is 2^(2 + 2 + 3) = 128 (not 2^4): with d a multiple of 16 only, rule (b) must not apply, and
// rule (a) keeps the xor on d + 20 and adds 1 after it.
// CHECK-LABEL: func.func @negative_shift
// CHECK-SAME: (%[[D:[^:]*]]: index)
// CHECK: %[[C20:.*]] = arith.constant 20 : index
// CHECK: %[[HIGH:.*]] = arith.addi %[[D]], %[[C20]] : index
// CHECK: %[[SEL:.*]] = arith.andi %[[HIGH]], %{{.*}} : index
// CHECK: %[[MOVED:.*]] = arith.shli %[[SEL]], %{{.*}} : index
// CHECK: %[[SW:.*]] = arith.xori %[[HIGH]], %[[MOVED]] : index
// CHECK: %[[C1:.*]] = arith.constant 1 : index
// CHECK: %[[OFF:.*]] = arith.addi %[[SW]], %[[C1]] : index
// CHECK: return %[[OFF]] : index
func.func @negative_shift(%d: index) -> index {
  %l = fly.make_layout : !fly.layout<(4,8):(1,4)>
  %s = fly.make_composed_layout %l offset %d : !fly.layout<(4,8):(1,4)> -> !fly.composed_layout<Sw<2,2,-3> o ?{div=16} o (4,8):(1,4)>
  %c1 = arith.constant 1 : index
  %c5 = arith.constant 5 : index
  %o = fly.crd2idx(%c1, %c5), %s : !fly.composed_layout<Sw<2,2,-3> o ?{div=16} o (4,8):(1,4)>
  return %o : index
}
