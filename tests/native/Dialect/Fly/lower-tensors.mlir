// RUN: %fly-opt %s -p 'builtin.module(fly-lower-tensors)' | FileCheck %s

// A load/store is base + layout(coord) elements: a 64-bit GEP on the element type.
// CHECK-LABEL: func.func @load_store
// CHECK-SAME: (%[[RAW:[^:]*]]: !llvm.ptr<1>, %[[M:[^:]*]]: index, %[[I:[^:]*]]: index, %[[J:[^:]*]]: index)
// CHECK-NOT: fly.
// CHECK: %[[C4:.*]] = arith.constant 4 : index
// CHECK: %[[IS:.*]] = arith.muli %[[I]], %[[C4]] : index
// CHECK: %[[OFF:.*]] = arith.addi %[[IS]], %[[J]] : index
// CHECK: %[[OFF64:.*]] = arith.index_cast %[[OFF]] : index to i64
// CHECK: %[[ADDR:.*]] = llvm.getelementptr %[[RAW]][%[[OFF64]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK: %[[X:.*]] = llvm.load %[[ADDR]] {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK: llvm.getelementptr %[[RAW]]
// CHECK: llvm.store %[[X]], %{{.*}} {alignment = 4 : i64} : f32, !llvm.ptr<1>
func.func @load_store(%raw: !llvm.ptr<1>, %m: index, %i: index, %j: index) {
  %p = fly.make_ptr %raw : !llvm.ptr<1> -> !fly.ptr<f32, global, 16>
  %l = fly.make_layout(%m) : !fly.layout<(?,4):(4,1)>
  %t = fly.make_tensor %p, %l : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,4):(4,1)>>
  %x = fly.load %t(%i, %j) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,4):(4,1)>>
  fly.store %x, %t(%j, %i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,4):(4,1)>>
  return
}

// Must not fire: a tensor that arrives as an argument has no pointer or leaves to lower with.
// CHECK-LABEL: func.func @no_fire
// CHECK: fly.load %{{.*}}(%{{.*}}) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>
func.func @no_fire(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>, %i: index) -> f16 {
  %x = fly.load %t(%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>
  return %x : f16
}
