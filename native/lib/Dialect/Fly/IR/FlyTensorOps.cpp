//===- FlyTensorOps.cpp - pointer and tensor ops --------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/Dialect/Arith/IR/Arith.h"

using namespace mlir;
using namespace mlir::fly;

static size_t numShapeLeaves(Type layout) {
  if (auto composed = dyn_cast<ComposedLayoutType>(layout))
    layout = composed.getInner();
  return cast<LayoutType>(layout).getShapeLeaves().size();
}

/// Shared by load, store and element_address: 1 linear coordinate or one per shape leaf.
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

LogicalResult RecastPtrOp::verify() {
  PtrType source = getSource().getType(), result = getType();
  if (source.getAddressSpace() != result.getAddressSpace())
    return emitOpError("recast keeps the address space: ")
           << source << " and " << result << " differ";
  if (result.getAlignment() > source.getAlignment())
    return emitOpError("result alignment ")
           << result.getAlignment() << " is more than the source's " << source.getAlignment();
  return success();
}

LogicalResult AddOffsetOp::verify() {
  PtrType source = getPtr().getType(), result = getType();
  if (source.getElementType() != result.getElementType() ||
      source.getAddressSpace() != result.getAddressSpace())
    return emitOpError("result ") << result << " must keep the element type and address space of "
                                  << source;
  if (result.getAlignment() > source.getAlignment())
    return emitOpError("result alignment ")
           << result.getAlignment() << " is more than the source's " << source.getAlignment();
  if (auto constant = getOffset().getDefiningOp<arith::ConstantIndexOp>()) {
    int64_t bytes = constant.value() * (source.getElementType().getIntOrFloatBitWidth() / 8);
    int64_t proven = std::min(source.getAlignment(), powerOfTwoFactor(bytes));
    if (result.getAlignment() > proven)
      return emitOpError("result alignment ")
             << result.getAlignment() << " is more than the " << proven << " bytes that offset "
             << constant.value() << " keeps";
  }
  return success();
}

LogicalResult LoadOp::verify() {
  return verifyCoordinates(*this, getTensor().getType(), getCoord().size());
}

LogicalResult StoreOp::verify() {
  return verifyCoordinates(*this, getTensor().getType(), getCoord().size());
}

LogicalResult ElementAddressOp::verify() {
  fly::TensorType tensor = getTensor().getType();
  unsigned result = cast<LLVM::LLVMPointerType>(getType()).getAddressSpace();
  if (result != tensor.getPtr().getAddressSpace())
    return emitOpError("result address space ")
           << result << " differs from that of the tensor's pointer " << tensor.getPtr() << " ("
           << tensor.getPtr().getAddressSpace() << ")";
  return verifyCoordinates(*this, tensor, getCoord().size());
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

/// The plain layout of a tensor (the inner one of a composed layout).
static LayoutType plainLayout(fly::TensorType tensor) {
  if (auto composed = dyn_cast<ComposedLayoutType>(tensor.getLayout()))
    return composed.getInner();
  return cast<LayoutType>(tensor.getLayout());
}

LogicalResult SliceOp::verify() {
  fly::TensorType source = getTensor().getType(), result = getType();
  SmallVector<Attribute> shape, stride, freeShape, freeStride, resultShape, resultStride;
  appendLeafAttrs(plainLayout(source).getShape(), shape);
  appendLeafAttrs(plainLayout(source).getStride(), stride);
  ArrayRef<bool> fixed = getFixed();
  if (fixed.size() != shape.size())
    return emitOpError("expects one 'fixed' entry per shape leaf of ")
           << source.getLayout() << " (" << shape.size() << "), got " << fixed.size();
  int64_t numFixed = llvm::count(fixed, true);
  if (int64_t(getCoord().size()) != numFixed)
    return emitOpError("expects one coordinate per fixed leaf (") << numFixed << "), got "
                                                                   << getCoord().size();
  // What the fixed part of the offset is known to be a multiple of.
  int64_t multiple = int64_t(1) << 62;
  for (auto [isFixed, extent, step] : llvm::zip_equal(fixed, shape, stride)) {
    if (isFixed) {
      multiple = std::min(multiple, knownPowerOfTwoMultiple(step));
      continue;
    }
    freeShape.push_back(extent);
    freeStride.push_back(step);
  }
  appendLeafAttrs(plainLayout(result).getShape(), resultShape);
  appendLeafAttrs(plainLayout(result).getStride(), resultStride);
  if (resultShape != freeShape || resultStride != freeStride)
    return emitOpError("result layout ")
           << result.getLayout() << " must have exactly the free leaves of " << source.getLayout();

  PtrType sourcePtr = source.getPtr(), resultPtr = result.getPtr();
  if (resultPtr.getElementType() != sourcePtr.getElementType() ||
      resultPtr.getAddressSpace() != sourcePtr.getAddressSpace())
    return emitOpError("result pointer ")
           << resultPtr << " must keep the element type and address space of " << sourcePtr;
  int64_t elementBytes =
      std::max<int64_t>(1, sourcePtr.getElementType().getIntOrFloatBitWidth() / 8);
  auto composed = dyn_cast<ComposedLayoutType>(source.getLayout());
  if (!composed) {
    if (!isa<LayoutType>(result.getLayout()))
      return emitOpError("slicing a plain layout gives a plain layout, got ") << result.getLayout();
    // Plain layouts: the pointer moves by the fixed offset (in elements).
    int64_t proven = std::min<int64_t>(sourcePtr.getAlignment(),
                                       multiple >= (int64_t(1) << 40) ? sourcePtr.getAlignment()
                                                                      : multiple * elementBytes);
    if (resultPtr.getAlignment() > proven)
      return emitOpError("result alignment ")
             << resultPtr.getAlignment() << " is more than the " << proven
             << " bytes that the source alignment and the fixed strides prove";
    return success();
  }
  // Composed layouts: the pointer stays, the offset moves inside the swizzle.
  auto resultComposed = dyn_cast<ComposedLayoutType>(result.getLayout());
  if (!resultComposed || resultComposed.getSwizzle() != composed.getSwizzle())
    return emitOpError("slicing ") << source.getLayout() << " must keep its swizzle, got "
                                   << result.getLayout();
  if (resultPtr != sourcePtr)
    return emitOpError("slicing a composed layout keeps the pointer ")
           << sourcePtr << ", got " << resultPtr;
  int64_t offsetMultiple =
      std::min(multiple, knownPowerOfTwoMultiple(composed.getOffset()));
  Attribute offset = resultComposed.getOffset();
  if (isa<IntegerAttr>(offset)) {
    if (numFixed > 0 || offset != composed.getOffset())
      return emitOpError("result offset must be '?' (it depends on the coordinates), got ")
             << intTupleToString(offset);
    return success();
  }
  if (knownPowerOfTwoMultiple(offset) > offsetMultiple)
    return emitOpError("result offset ")
           << intTupleToString(offset) << " claims a divisor the fixed strides do not prove (at most "
           << offsetMultiple << ")";
  return success();
}
