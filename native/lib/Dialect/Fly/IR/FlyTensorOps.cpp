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

LogicalResult AllocSmemOp::verify() {
  if (getType().getAddressSpace() != unsigned(AddressSpace::Shared))
    return emitOpError("result must be a shared-memory pointer, got ") << getType();
  return success();
}

static std::optional<int64_t> staticSize(Type layout) {
  if (auto composed = dyn_cast<ComposedLayoutType>(layout))
    layout = composed.getInner();
  return cast<LayoutType>(layout).getStaticSize();
}

LogicalResult CopyOp::verify() {
  fly::TensorType source = getSource().getType(), target = getTarget().getType();
  if (source.getPtr().getElementType() != target.getPtr().getElementType())
    return emitOpError("element types differ: ")
           << source.getPtr().getElementType() << " and " << target.getPtr().getElementType();
  std::optional<int64_t> sourceSize = staticSize(source.getLayout());
  std::optional<int64_t> targetSize = staticSize(target.getLayout());
  if (sourceSize && targetSize && *sourceSize > *targetSize)
    return emitOpError("source has ") << *sourceSize << " elements but target only "
                                      << *targetSize;
  return success();
}
