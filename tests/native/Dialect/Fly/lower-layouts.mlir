// RUN: %fly-opt %s -p 'builtin.module(fly-lower-layouts)' | FileCheck %s

// A linear coordinate is split colexicographically over the shape leaves;
// stride-1 terms need no multiply, size-1 leaves contribute nothing.
// CHECK-LABEL: func.func @linear
// CHECK-SAME: (%[[I:.*]]: index)
// CHECK-NOT: fly.
// CHECK: %[[C4:.*]] = arith.constant 4 : index
// CHECK: %[[M:.*]] = arith.remui %[[I]], %[[C4]] : index
// CHECK: %[[N:.*]] = arith.divui %[[I]], %{{.*}} : index
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

// Dynamic leaves come from the fly.make_layout operands (shape leaves, then stride leaves).
// CHECK-LABEL: func.func @dynamic
// CHECK-SAME: (%[[M:[^:]*]]: index, %[[LD:[^:]*]]: index, %[[I:[^:]*]]: index, %[[J:[^:]*]]: index)
// CHECK-NOT: fly.
// CHECK: %[[IS:.*]] = arith.muli %[[I]], %[[LD]] : index
// CHECK: %[[OFF:.*]] = arith.addi %[[IS]], %[[J]] : index
// CHECK: %[[R:.*]] = arith.remui %[[I]], %[[M]] : index
// CHECK: %[[Q:.*]] = arith.divui %[[I]], %[[M]] : index
// CHECK: %[[RS:.*]] = arith.muli %[[R]], %[[LD]] : index
// CHECK: %[[LIN:.*]] = arith.addi %[[RS]], %[[Q]] : index
// CHECK: %[[C8:.*]] = arith.constant 8 : index
// CHECK: %[[SIZE:.*]] = arith.muli %[[M]], %[[C8]] : index
// CHECK: %[[CRD1:.*]] = arith.divui %[[I]], %[[M]] : index
// CHECK: return %[[OFF]], %[[LIN]], %[[SIZE]], %[[CRD1]], %[[M]]
func.func @dynamic(%m: index, %ld: index, %i: index, %j: index) -> (index, index, index, index, index) {
  %l = fly.make_layout(%m, %ld) : !fly.layout<(?,8):(?,1)>
  %o = fly.crd2idx(%i, %j), %l : !fly.layout<(?,8):(?,1)>
  %lin = fly.crd2idx(%i), %l : !fly.layout<(?,8):(?,1)>
  %n = fly.size %l : !fly.layout<(?,8):(?,1)>
  %c = fly.idx2crd(%i), %l : !fly.layout<(?,8):(?,1)> -> !fly.int_tuple<(?,?)>
  %c1 = fly.get %c[1] : !fly.int_tuple<(?,?)>
  %s = fly.get_shape %l : !fly.layout<(?,8):(?,1)>
  %s0 = fly.get %s[0] : !fly.int_tuple<(?,8)>
  return %o, %lin, %n, %c1, %s0 : index, index, index, index, index
}

// Nested get of a static leaf folds to a constant; rank is static.
// CHECK-LABEL: func.func @get_nested
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[R:.*]] = arith.constant 2 : index
// CHECK: return %{{.*}}, %[[C2]], %[[R]]
func.func @get_nested(%x: index) -> (index, index, index) {
  %t = fly.make_int_tuple(%x) : !fly.int_tuple<(4,(?,2))>
  %inner = fly.get %t[1] : !fly.int_tuple<(4,(?,2))>
  %a = fly.get %inner[0] : !fly.int_tuple<(?,2)>
  %b = fly.get %t[1, 1] : !fly.int_tuple<(4,(?,2))>
  %l = fly.make_layout : !fly.layout<((2,4),8):((1,16),2)>
  %r = fly.rank %l : !fly.layout<((2,4),8):((1,16),2)>
  return %a, %b, %r : index, index, index
}

// A composed layout applies Sw<3,3,3> to offset + inner(coord): x ^ ((x & 0b111000000) >> 3).
// CHECK-LABEL: func.func @swizzled
// CHECK: %[[X:.*]] = arith.addi
// CHECK: %[[MASK:.*]] = arith.constant 448 : index
// CHECK: %[[SEL:.*]] = arith.andi %[[X]], %[[MASK]] : index
// CHECK: %[[SH:.*]] = arith.constant 3 : index
// CHECK: %[[MOVED:.*]] = arith.shrui %[[SEL]], %[[SH]] : index
// CHECK: %[[Y:.*]] = arith.xori %[[X]], %[[MOVED]] : index
// CHECK: return %[[Y]]
func.func @swizzled(%i: index) -> index {
  %l = fly.make_layout : !fly.layout<(8,64):(64,1)>
  %s = fly.make_composed_layout %l : !fly.layout<(8,64):(64,1)> -> !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(64,1)>
  %o = fly.crd2idx(%i), %s : !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(64,1)>
  return %o : index
}

// CHECK-LABEL: func.func @apply_swizzle
// CHECK: arith.andi
// CHECK: arith.shrui
// CHECK: arith.xori
func.func @apply_swizzle(%x: index) -> index {
  %y = fly.apply_swizzle %x, <2,4,3> : index
  return %y : index
}

// Must not fire: dynamic layouts whose leaf values are unknown here (a block argument) stay,
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
