// RUN: %fly-opt %s -p 'builtin.module(fly-lower-smem)' | FileCheck %s

// Allocations get aligned offsets in one external [0 x i8] addrspace-3 global, whose
// alignment is the largest asked for; the function records the total.
// CHECK: llvm.mlir.global external @__fly_smem() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<0 x i8>
// CHECK-LABEL: func.func @two_buffers
// CHECK-SAME: attributes {fly.smem_bytes = 2056 : i64}
// CHECK: %[[BASE:.*]] = llvm.mlir.addressof @__fly_smem : !llvm.ptr<3>
// CHECK: %[[A:.*]] = llvm.getelementptr %[[BASE]][0] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
// CHECK: fly.make_ptr %[[A]] : !llvm.ptr<3> -> !fly.ptr<f32, shared, 16>
// CHECK: %[[B:.*]] = llvm.getelementptr %{{.*}}[1024] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
// CHECK: fly.make_ptr %[[B]] : !llvm.ptr<3> -> !fly.ptr<bf16, shared, 1024>
func.func @two_buffers() -> (!fly.ptr<f32, shared, 16>, !fly.ptr<bf16, shared, 1024>) {
  %a = fly.alloc_smem 2 : !fly.ptr<f32, shared, 16>
  %b = fly.alloc_smem 516 : !fly.ptr<bf16, shared, 1024>
  return %a, %b : !fly.ptr<f32, shared, 16>, !fly.ptr<bf16, shared, 1024>
}

// Must not fire: no allocation, no attribute.
// CHECK-LABEL: func.func @none()
// CHECK-NOT: fly.smem_bytes
func.func @none() {
  return
}
