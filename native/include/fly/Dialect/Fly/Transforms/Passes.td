//===- Passes.td - Fly passes -------------------------------*- tablegen -*-===//

#ifndef FLY_PASSES_TD
#define FLY_PASSES_TD

include "mlir/Pass/PassBase.td"

def FlyLowerLayouts : Pass<"fly-lower-layouts"> {
  let summary = "lower Fly layout ops to arith index arithmetic";
  let description = [{
    Rewrites `fly.crd2idx` and `fly.size` on static layouts into `arith` ops on
    `index` (64-bit in NVVM lowering, so offsets past 2^31 stay exact) and
    removes `fly.make_layout` values that are no longer used.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

#endif // FLY_PASSES_TD
