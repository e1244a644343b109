//===- FlyOps.cpp - Fly operations ----------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"

#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mlir::fly;

#define GET_OP_CLASSES
#include "fly/Dialect/Fly/IR/FlyOps.cpp.inc"

LogicalResult MakeLayoutOp::verify() {
  if (!getType().isStatic())
    return emitOpError("expects a static layout; got ")
           << getType() << " (dynamic leaves are not supported by this op yet)";
  return success();
}

OpFoldResult SizeOp::fold(FoldAdaptor) {
  std::optional<int64_t> size = getLayout().getType().getStaticSize();
  if (!size)
    return {};
  return IntegerAttr::get(IndexType::get(getContext()), *size);
}

LogicalResult Crd2IdxOp::verify() {
  size_t numLeaves = getLayout().getType().getShapeLeaves().size();
  size_t numCoords = getCoord().size();
  if (numCoords != 1 && numCoords != numLeaves)
    return emitOpError("expects 1 coordinate (a linear index) or ")
           << numLeaves << " (one per shape leaf) for " << getLayout().getType() << ", got "
           << numCoords;
  return success();
}
