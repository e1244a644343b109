//===- FlyTypes.h - Fly types -----------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_IR_FLYTYPES_H
#define FLY_DIALECT_FLY_IR_FLYTYPES_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "fly/Dialect/Fly/IR/FlyTypes.h.inc"

#endif // FLY_DIALECT_FLY_IR_FLYTYPES_H
