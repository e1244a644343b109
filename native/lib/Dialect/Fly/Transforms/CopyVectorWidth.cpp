//===- CopyVectorWidth.cpp - prove how wide a copy's accesses can be ------===//
//
// A copy moves elements in linear-coordinate order. A chunk of V consecutive
// coordinates can be one access when, in both tensors, those coordinates map
// to V consecutive offsets that start at a multiple of V (and the pointer's
// alignment covers V elements). Everything here reads static facts from the
// types: static leaves, and the known divisors of dynamic ones.
//
//===----------------------------------------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::fly;

/// The largest power-of-two V such that every aligned chunk of V linear
/// coordinates maps to V consecutive offsets starting at a multiple of V.
static int64_t vectorizableElements(Type layoutType) {
  int64_t limit = int64_t(1) << 62;
  if (auto composed = dyn_cast<ComposedLayoutType>(layoutType)) {
    // The swizzle leaves the low `base` bits alone and moves whole 2^base blocks.
    limit = std::min(limit, int64_t(1) << composed.getSwizzle().getBase());
    limit = std::min(limit, knownPowerOfTwoMultiple(composed.getOffset()));
    layoutType = composed.getInner();
  }
  auto layout = cast<LayoutType>(layoutType);
  SmallVector<Attribute> shape, stride;
  appendLeafAttrs(layout.getShape(), shape);
  appendLeafAttrs(layout.getStride(), stride);

  // The leading modes that continue a stride-1 run.
  int64_t run = 1;
  size_t k = 0;
  for (; k < shape.size(); ++k) {
    auto extent = dyn_cast<IntegerAttr>(shape[k]);
    if (extent && extent.getInt() == 1)
      continue;
    auto step = dyn_cast<IntegerAttr>(stride[k]);
    if (!step || step.getInt() != run)
      break;
    if (!extent) {
      // A dynamic extent continues the run only as far as its known divisor.
      run *= knownPowerOfTwoMultiple(shape[k]);
      ++k;
      break;
    }
    run *= extent.getInt();
  }
  int64_t vector = std::min(limit, powerOfTwoFactor(run));
  // Every other mode must move chunks by multiples of V to keep them aligned.
  for (; k < shape.size(); ++k) {
    auto extent = dyn_cast<IntegerAttr>(shape[k]);
    if (extent && extent.getInt() == 1)
      continue;
    vector = std::min(vector, knownPowerOfTwoMultiple(stride[k]));
  }
  return vector;
}

int64_t mlir::fly::provenCopyVectorElements(Type source, Type target, int64_t maxBytes) {
  auto sourceType = cast<fly::TensorType>(source), targetType = cast<fly::TensorType>(target);
  unsigned bits = sourceType.getPtr().getElementType().getIntOrFloatBitWidth();
  if (bits % 8 != 0)
    return 1;
  int64_t elementBytes = bits / 8;
  int64_t vector = maxBytes / elementBytes;
  for (fly::TensorType tensor : {sourceType, targetType}) {
    vector = std::min(vector, vectorizableElements(tensor.getLayout()));
    vector = std::min(vector, std::max<int64_t>(1, tensor.getPtr().getAlignment() / elementBytes));
  }
  return std::max<int64_t>(1, int64_t(llvm::bit_floor(uint64_t(vector))));
}
