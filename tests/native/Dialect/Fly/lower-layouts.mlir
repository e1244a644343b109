// RUN: %fly-opt %s -p 'builtin.module(fly-lower-layouts)' | FileCheck %s

// A linear coordinate is split colexicographically over the shape leaves;
// stride-1 terms need no multiply, size-1 leaves contribute nothing.
// CHECK-LABEL: func.func @linear
// CHECK-SAME: (%[[I:.*]]: index)
// CHECK-NOT: fly.
// CHECK: %[[C4:.*]] = arith.constant 4 : index
// CHECK: %[[M:.*]] = arith.remui %[[I]], %[[C4]] : index
// CHECK: %[[N:.*]] = arith.divui %[[I]], %[[C4]] : index
// CHECK: %[[C8:.*]] = arith.constant 8 : index
// CHECK: %[[MS:.*]] = arith.muli %[[M]], %[[C8]] : index
// CHECK: %[[OFF:.*]] = arith.addi %[[MS]], %[[N]] : index
// CHECK: return %[[OFF]]
func.func @linear(%i: index) -> index {
  %l = fly.make_layout : !fly.layout<(4,1,8):(8,5,1)>
  %o = fly.crd2idx(%i), %l : !fly.layout<(4,1,8):(8,5,1)>
  return %o : index
}

// One coordinate per leaf: a dot product with the strides; stride 0 drops out.
// CHECK-LABEL: func.func @per_leaf
// CHECK-SAME: (%[[A:.*]]: index, %[[B:.*]]: index, %[[C:.*]]: index)
// CHECK: %[[C16:.*]] = arith.constant 16 : index
// CHECK: %[[BS:.*]] = arith.muli %[[B]], %[[C16]] : index
// CHECK: %[[SUM:.*]] = arith.addi %[[A]], %[[BS]] : index
// CHECK: return %[[SUM]]
func.func @per_leaf(%a: index, %b: index, %c: index) -> index {
  %l = fly.make_layout : !fly.layout<((2,4),8):((1,16),0)>
  %o = fly.crd2idx(%a, %b, %c), %l : !fly.layout<((2,4),8):((1,16),0)>
  return %o : index
}

// Offsets past 2^31 stay exact: index arithmetic with 64-bit constants.
// CHECK-LABEL: func.func @big_stride
// CHECK: arith.constant 4294967296 : index
func.func @big_stride(%i: index, %j: index) -> index {
  %l = fly.make_layout : !fly.layout<(2,2):(1,4294967296)>
  %o = fly.crd2idx(%i, %j), %l : !fly.layout<(2,2):(1,4294967296)>
  return %o : index
}

// CHECK-LABEL: func.func @size
// CHECK: %[[C32:.*]] = arith.constant 32 : index
// CHECK: return %[[C32]]
func.func @size(%l: !fly.layout<(4,8):(8,1)>) -> index {
  %n = fly.size %l : !fly.layout<(4,8):(8,1)>
  return %n : index
}

// Must not fire: dynamic layouts stay (their lowering needs the dynamic values),
// and IR without Fly ops is left exactly as it was (no folding, no DCE).
// CHECK-LABEL: func.func @no_fire
// CHECK: fly.size %{{.*}} : !fly.layout<(?,8):(8,1)>
// CHECK: fly.crd2idx(%{{.*}}), %{{.*}} : !fly.layout<(?,8):(8,1)>
// CHECK: %[[C1:.*]] = arith.constant 1 : index
// CHECK: %[[C2:.*]] = arith.constant 2 : index
// CHECK: %[[DEAD:.*]] = arith.addi %[[C1]], %[[C2]] : index
func.func @no_fire(%l: !fly.layout<(?,8):(8,1)>, %i: index) -> (index, index) {
  %n = fly.size %l : !fly.layout<(?,8):(8,1)>
  %o = fly.crd2idx(%i), %l : !fly.layout<(?,8):(8,1)>
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %unused = arith.addi %c1, %c2 : index
  return %n, %o : index, index
}
