//===- FlyOps.td - Fly operations ---------------------------*- tablegen -*-===//
//
// The op definitions live in one file per concern; this file is the single
// tablegen entry point for them.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_OPS_TD
#define FLY_OPS_TD

include "fly/Dialect/Fly/IR/FlyLayoutOps.td"
include "fly/Dialect/Fly/IR/FlyTensorOps.td"

#endif // FLY_OPS_TD
