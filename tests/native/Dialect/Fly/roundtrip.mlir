// RUN: %fly-opt %s | %fly-opt - | FileCheck %s
// Every Fly type and op prints in a form that parses back to the same IR.

// CHECK-LABEL: func.func @layout_types
// CHECK-SAME: !fly.layout<8:1>
// CHECK-SAME: !fly.layout<(4,8):(1,4)>
// CHECK-SAME: !fly.layout<((2,4),8):((1,16),2)>
// CHECK-SAME: !fly.layout<(?,8):(8,1)>
// CHECK-SAME: !fly.layout<(4,2):(0,-1)>
// CHECK-SAME: !fly.layout<(2,2):(4294967296,9223372036854775807)>
// CHECK-SAME: !fly.layout<():()>
func.func @layout_types(%a: !fly.layout<8:1>, %b: !fly.layout<(4,8):(1,4)>,
                        %c: !fly.layout<((2,4),8):((1,16),2)>, %d: !fly.layout<(?,8):(8,1)>,
                        %e: !fly.layout<(4,2):(0,-1)>,
                        %f: !fly.layout<(2,2):(4294967296,9223372036854775807)>,
                        %g: !fly.layout<():()>) {
  return
}

// CHECK-LABEL: func.func @ops
func.func @ops(%i: index, %j: index) -> (index, index, index) {
  // CHECK: %[[L:.*]] = fly.make_layout : !fly.layout<(4,8):(8,1)>
  %l = fly.make_layout : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.size %[[L]] : !fly.layout<(4,8):(8,1)>
  %n = fly.size %l : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.crd2idx(%{{.*}}), %[[L]] : !fly.layout<(4,8):(8,1)>
  %o1 = fly.crd2idx(%i), %l : !fly.layout<(4,8):(8,1)>
  // CHECK: fly.crd2idx(%{{.*}}, %{{.*}}), %[[L]] : !fly.layout<(4,8):(8,1)>
  %o2 = fly.crd2idx(%i, %j), %l : !fly.layout<(4,8):(8,1)>
  return %n, %o1, %o2 : index, index, index
}

// CHECK-LABEL: func.func @size_of_dynamic
// CHECK: fly.size %{{.*}} : !fly.layout<(?,8):(8,1)>
func.func @size_of_dynamic(%l: !fly.layout<(?,8):(8,1)>) -> index {
  %n = fly.size %l : !fly.layout<(?,8):(8,1)>
  return %n : index
}
