//===- FlyOps.cpp - generated Fly op definitions --------------------------===//
//
// Verifiers and folders live next to their ops' concern: FlyLayoutOps.cpp and
// FlyTensorOps.cpp.
//
//===----------------------------------------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mlir::fly;

#define GET_OP_CLASSES
#include "fly/Dialect/Fly/IR/FlyOps.cpp.inc"
