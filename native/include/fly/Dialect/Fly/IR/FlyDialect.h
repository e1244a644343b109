//===- FlyDialect.h - the Fly dialect ---------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_IR_FLYDIALECT_H
#define FLY_DIALECT_FLY_IR_FLYDIALECT_H

#include "mlir/IR/Dialect.h"

#include "fly/Dialect/Fly/IR/FlyDialect.h.inc"

#endif // FLY_DIALECT_FLY_IR_FLYDIALECT_H
