//===- FlyTypes.h - Fly types -----------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_IR_FLYTYPES_H
#define FLY_DIALECT_FLY_IR_FLYTYPES_H

#include "fly/Dialect/Fly/IR/FlyAttrs.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/Types.h"

namespace mlir::fly {
/// LLVM address spaces of the pointer kinds Fly names.
enum class AddressSpace : unsigned { Generic = 0, Global = 1, Shared = 3, Register = 5 };
} // namespace mlir::fly

#define GET_TYPEDEF_CLASSES
#include "fly/Dialect/Fly/IR/FlyTypes.h.inc"

#endif // FLY_DIALECT_FLY_IR_FLYTYPES_H
