//===- FlyOps.h - Fly operations --------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_IR_FLYOPS_H
#define FLY_DIALECT_FLY_IR_FLYOPS_H

#include "fly/Dialect/Fly/IR/FlyDialect.h"
#include "fly/Dialect/Fly/IR/FlyTypes.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "fly/Dialect/Fly/IR/FlyOps.h.inc"

#endif // FLY_DIALECT_FLY_IR_FLYOPS_H
