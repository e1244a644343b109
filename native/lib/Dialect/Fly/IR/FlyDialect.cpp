//===- FlyDialect.cpp - the Fly dialect -----------------------------------===//

#include "fly/Dialect/Fly/IR/FlyDialect.h"

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/IR/FlyTypes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace mlir::fly;

#include "fly/Dialect/Fly/IR/FlyDialect.cpp.inc"

void FlyDialect::initialize() {
  registerAttributes();
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "fly/Dialect/Fly/IR/FlyOps.cpp.inc"
      >();
}

Operation *FlyDialect::materializeConstant(OpBuilder &builder, Attribute value, Type type,
                                           Location loc) {
  return arith::ConstantOp::materialize(builder, value, type, loc);
}
