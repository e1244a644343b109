//===- FlyAttrs.h - Fly attributes ------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_IR_FLYATTRS_H
#define FLY_DIALECT_FLY_IR_FLYATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"

#define GET_ATTRDEF_CLASSES
#include "fly/Dialect/Fly/IR/FlyAttrs.h.inc"

#endif // FLY_DIALECT_FLY_IR_FLYATTRS_H
