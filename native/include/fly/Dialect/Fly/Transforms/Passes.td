//===- Passes.td - Fly passes -------------------------------*- tablegen -*-===//

#ifndef FLY_PASSES_TD
#define FLY_PASSES_TD

include "mlir/Pass/PassBase.td"

def FlyLowerLayouts : Pass<"fly-lower-layouts"> {
  let summary = "lower Fly IntTuple and layout ops to arith index arithmetic";
  let description = [{
    Rewrites `fly.crd2idx`, `fly.idx2crd`, `fly.size`, `fly.rank`, `fly.get`,
    `fly.get_shape`, `fly.get_stride` and `fly.apply_swizzle` into `arith` ops
    on `index` (64-bit after NVVM lowering, so offsets past 2^31 stay exact) and
    removes layout values that are no longer used. Dynamic leaves come from the
    `fly.make_layout` / `fly.make_int_tuple` that built the value; ops whose
    values cannot be traced are left alone. IR without Fly ops is not changed.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def FlyLowerTensors : Pass<"fly-lower-tensors"> {
  let summary = "lower Fly pointer and tensor ops to llvm loads and stores";
  let description = [{
    Rewrites `fly.load` and `fly.store` into an offset computed from the
    tensor's layout (as `fly-lower-layouts` computes it), an
    `llvm.getelementptr` and an `llvm.load` / `llvm.store`; `fly.copy` into
    vector loads and stores as wide as the layouts prove (unrolled when short,
    an `scf.for` otherwise). Then removes the pointer and tensor values that
    are no longer used. Run before `fly-lower-layouts`.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::LLVM::LLVMDialect",
                           "::mlir::scf::SCFDialect"];
}

def FlyLowerSmem : Pass<"fly-lower-smem"> {
  let summary = "place each kernel's fly.alloc_smem in its dynamic shared memory";
  let description = [{
    Gives every `fly.alloc_smem` of a function its own offset (aligned as its
    pointer type says) in one external `[0 x i8]` address-space-3 global
    (`__fly_smem`). Declaring dynamic shared memory that way makes ptxas place
    it after all static shared memory, where `gpu.dynamic_shared_memory` would
    overlap it. The function gets `fly.smem_bytes`, the launch's dynamic
    shared-memory size. Run before `fly-lower-tensors`.
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
}

#endif // FLY_PASSES_TD
