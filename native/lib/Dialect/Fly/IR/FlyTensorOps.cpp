//===- FlyTensorOps.cpp - pointer and tensor ops --------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"

using namespace mlir;
using namespace mlir::fly;

static size_t numShapeLeaves(Type layout) {
  if (auto composed = dyn_cast<ComposedLayoutType>(layout))
    layout = composed.getInner();
  return cast<LayoutType>(layout).getShapeLeaves().size();
}

/// Shared by load and store: 1 linear coordinate or one per shape leaf.
static LogicalResult verifyCoordinates(Operation *op, fly::TensorType tensor, size_t numCoords) {
  size_t numLeaves = numShapeLeaves(tensor.getLayout());
  if (numCoords != 1 && numCoords != numLeaves)
    return op->emitOpError("expects 1 coordinate (a linear index) or ")
           << numLeaves << " (one per shape leaf) for " << tensor.getLayout() << ", got "
           << numCoords;
  return success();
}

LogicalResult MakePtrOp::verify() {
  unsigned source = cast<LLVM::LLVMPointerType>(getPointer().getType()).getAddressSpace();
  if (source != getType().getAddressSpace())
    return emitOpError("address space of ")
           << getPointer().getType() << " (" << source << ") differs from that of " << getType()
           << " (" << getType().getAddressSpace() << ")";
  return success();
}

LogicalResult LoadOp::verify() {
  return verifyCoordinates(*this, getTensor().getType(), getCoord().size());
}

LogicalResult StoreOp::verify() {
  return verifyCoordinates(*this, getTensor().getType(), getCoord().size());
}
