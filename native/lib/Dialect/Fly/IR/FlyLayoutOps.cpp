//===- FlyLayoutOps.cpp - IntTuple and layout ops -------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"

using namespace mlir;
using namespace mlir::fly;

/// The plain layout inside a layout type (the inner one of a composed layout).
static LayoutType getPlainLayout(Type layout) {
  if (auto composed = dyn_cast<ComposedLayoutType>(layout))
    return composed.getInner();
  return cast<LayoutType>(layout);
}

LogicalResult MakeIntTupleOp::verify() {
  int64_t expected = getType().getNumDynamicLeaves();
  if (int64_t(getDynamicLeaves().size()) != expected)
    return emitOpError("expects one index operand per '?' leaf of ")
           << getType() << ": " << expected << ", got " << getDynamicLeaves().size();
  return success();
}

LogicalResult MakeLayoutOp::verify() {
  LayoutType type = getType();
  int64_t shapeLeaves = type.getNumDynamicShapeLeaves();
  int64_t strideLeaves = type.getNumDynamicStrideLeaves();
  if (int64_t(getDynamicLeaves().size()) != shapeLeaves + strideLeaves)
    return emitOpError("expects one index operand per '?' leaf of ")
           << type << " (" << shapeLeaves << " in the shape, then " << strideLeaves
           << " in the stride), got " << getDynamicLeaves().size();
  return success();
}

OpFoldResult SizeOp::fold(FoldAdaptor) {
  std::optional<int64_t> size = getPlainLayout(getLayout().getType()).getStaticSize();
  if (!size)
    return {};
  return IntegerAttr::get(IndexType::get(getContext()), *size);
}

OpFoldResult RankOp::fold(FoldAdaptor) {
  return IntegerAttr::get(IndexType::get(getContext()), getLayout().getType().getRank());
}

LogicalResult GetShapeOp::inferReturnTypes(MLIRContext *context, std::optional<Location>,
                                           Adaptor adaptor, SmallVectorImpl<Type> &types) {
  types.push_back(
      IntTupleType::get(context, cast<LayoutType>(adaptor.getLayout().getType()).getShape()));
  return success();
}

LogicalResult GetStrideOp::inferReturnTypes(MLIRContext *context, std::optional<Location>,
                                            Adaptor adaptor, SmallVectorImpl<Type> &types) {
  types.push_back(
      IntTupleType::get(context, cast<LayoutType>(adaptor.getLayout().getType()).getStride()));
  return success();
}

/// The mode of `tuple` that `path` selects, or a null attribute after emitting an error.
static Attribute selectMode(Attribute tuple, ArrayRef<int64_t> path, std::optional<Location> loc) {
  Attribute mode = tuple;
  for (auto [depth, index] : llvm::enumerate(path)) {
    auto modes = dyn_cast<ArrayAttr>(mode);
    int64_t rank = modes ? int64_t(modes.size()) : 0;
    if (index < 0 || index >= rank) {
      (void)emitOptionalError(loc, "'fly.get' path entry ", depth, " is ", index, " but ",
                              intTupleToString(mode), " has ", rank,
                              rank == 1 ? " mode" : " modes");
      return {};
    }
    mode = modes[index];
  }
  return mode;
}

LogicalResult GetOp::inferReturnTypes(MLIRContext *context, std::optional<Location> location,
                                      Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto tupleType = cast<IntTupleType>(adaptor.getTuple().getType());
  Attribute mode = selectMode(tupleType.getValue(), adaptor.getPath(), location);
  if (!mode)
    return failure();
  if (isIntTupleLeaf(mode))
    types.push_back(IndexType::get(context));
  else
    types.push_back(IntTupleType::get(context, mode));
  return success();
}

LogicalResult GetOp::verify() {
  if (getPath().empty())
    return emitOpError("expects a non-empty path");
  return success();
}

LogicalResult Crd2IdxOp::verify() {
  size_t numLeaves = getPlainLayout(getLayout().getType()).getShapeLeaves().size();
  size_t numCoords = getCoord().size();
  if (numCoords != 1 && numCoords != numLeaves)
    return emitOpError("expects 1 coordinate (a linear index) or ")
           << numLeaves << " (one per shape leaf) for " << getLayout().getType() << ", got "
           << numCoords;
  return success();
}

LogicalResult Idx2CrdOp::verify() {
  Attribute expected = makeDynamicLike(getLayout().getType().getShape());
  if (getType().getValue() != expected)
    return emitOpError("result must be ")
           << IntTupleType::get(getContext(), expected)
           << " (the shape's profile with dynamic leaves), got " << getType();
  return success();
}

OpFoldResult ApplySwizzleOp::fold(FoldAdaptor adaptor) {
  auto offset = dyn_cast_or_null<IntegerAttr>(adaptor.getOffset());
  if (!offset)
    return {};
  return IntegerAttr::get(offset.getType(), getSwizzle().apply(offset.getInt()));
}

LogicalResult MakeComposedLayoutOp::verify() {
  if (getType().getInner() != getInner().getType())
    return emitOpError("inner layout ")
           << getInner().getType() << " differs from the result's " << getType().getInner();
  bool dynamicOffset = isa<DynamicLeafAttr>(getType().getOffset());
  if (dynamicOffset != bool(getOffset()))
    return emitOpError(dynamicOffset ? "expects an offset operand for the '?' offset of "
                                     : "takes no offset operand: the offset is static in ")
           << getType();
  return success();
}
