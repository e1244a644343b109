//===- IndexEmitter.cpp - index arithmetic for lowering Fly ops -----------===//

#include "fly/Dialect/Fly/Transforms/IndexEmitter.h"

#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/Dialect/Arith/IR/Arith.h"

using namespace mlir;
using namespace mlir::fly;

/// Static leaves as index attributes, dynamic ones from `values` in order.
static FailureOr<SmallVector<OpFoldResult>>
bindLeaves(ArrayRef<std::optional<int64_t>> leaves, ValueRange::iterator &next,
           ValueRange::iterator end, MLIRContext *ctx) {
  SmallVector<OpFoldResult> bound;
  Builder builder(ctx);
  for (std::optional<int64_t> leaf : leaves) {
    if (leaf) {
      bound.push_back(builder.getIndexAttr(*leaf));
      continue;
    }
    if (next == end)
      return failure();
    bound.push_back(*next++);
  }
  return bound;
}

FailureOr<LayoutLeaves> mlir::fly::getLayoutLeaves(Value layout) {
  LayoutLeaves leaves;
  Value plain = layout;
  if (auto composed = dyn_cast<ComposedLayoutType>(layout.getType())) {
    auto maker = layout.getDefiningOp<MakeComposedLayoutOp>();
    if (!maker)
      return failure();
    leaves.swizzle = composed.getSwizzle();
    if (auto offset = dyn_cast<IntegerAttr>(composed.getOffset()))
      leaves.offset = Builder(layout.getContext()).getIndexAttr(offset.getInt());
    else
      leaves.offset = maker.getOffset();
    plain = maker.getInner();
  }
  auto type = cast<LayoutType>(plain.getType());
  ValueRange dynamic;
  if (!type.isStatic()) {
    auto maker = plain.getDefiningOp<MakeLayoutOp>();
    if (!maker)
      return failure();
    dynamic = maker.getDynamicLeaves();
  }
  auto next = dynamic.begin();
  MLIRContext *ctx = layout.getContext();
  FailureOr<SmallVector<OpFoldResult>> shape =
      bindLeaves(type.getShapeLeaves(), next, dynamic.end(), ctx);
  FailureOr<SmallVector<OpFoldResult>> stride =
      bindLeaves(type.getStrideLeaves(), next, dynamic.end(), ctx);
  if (failed(shape) || failed(stride))
    return failure();
  leaves.shape = std::move(*shape);
  leaves.stride = std::move(*stride);
  return leaves;
}

FailureOr<SmallVector<OpFoldResult>> mlir::fly::getIntTupleLeaves(Value tuple) {
  auto type = cast<IntTupleType>(tuple.getType());
  ValueRange dynamic;
  if (type.getNumDynamicLeaves() > 0) {
    auto maker = tuple.getDefiningOp<MakeIntTupleOp>();
    if (!maker)
      return failure();
    dynamic = maker.getDynamicLeaves();
  }
  auto next = dynamic.begin();
  return bindLeaves(getLeaves(type.getValue()), next, dynamic.end(), tuple.getContext());
}

static std::optional<int64_t> constantOf(OpFoldResult value) {
  if (auto attr = dyn_cast<Attribute>(value))
    return cast<IntegerAttr>(attr).getInt();
  return std::nullopt;
}

Value IndexEmitter::materialize(OpFoldResult value) {
  if (std::optional<int64_t> constant = constantOf(value))
    return arith::ConstantIndexOp::create(builder, loc, *constant);
  return cast<Value>(value);
}

OpFoldResult IndexEmitter::add(OpFoldResult a, OpFoldResult b) {
  std::optional<int64_t> ca = constantOf(a), cb = constantOf(b);
  if (ca && cb)
    return builder.getIndexAttr(*ca + *cb);
  if (ca == 0)
    return b;
  if (cb == 0)
    return a;
  return arith::AddIOp::create(builder, loc, materialize(a), materialize(b)).getResult();
}

OpFoldResult IndexEmitter::mul(OpFoldResult a, OpFoldResult b) {
  std::optional<int64_t> ca = constantOf(a), cb = constantOf(b);
  if (ca && cb)
    return builder.getIndexAttr(*ca * *cb);
  if (ca == 0 || cb == 0)
    return builder.getIndexAttr(0);
  if (ca == 1)
    return b;
  if (cb == 1)
    return a;
  return arith::MulIOp::create(builder, loc, materialize(a), materialize(b)).getResult();
}

// Coordinates and extents are non-negative: unsigned division is exact and cheaper.
OpFoldResult IndexEmitter::div(OpFoldResult a, OpFoldResult b) {
  std::optional<int64_t> ca = constantOf(a), cb = constantOf(b);
  if (ca && cb)
    return builder.getIndexAttr(uint64_t(*ca) / uint64_t(*cb));
  if (cb == 1 || ca == 0)
    return a;
  return arith::DivUIOp::create(builder, loc, materialize(a), materialize(b)).getResult();
}

OpFoldResult IndexEmitter::rem(OpFoldResult a, OpFoldResult b) {
  std::optional<int64_t> ca = constantOf(a), cb = constantOf(b);
  if (ca && cb)
    return builder.getIndexAttr(uint64_t(*ca) % uint64_t(*cb));
  if (cb == 1)
    return builder.getIndexAttr(0);
  if (ca == 0)
    return a;
  return arith::RemUIOp::create(builder, loc, materialize(a), materialize(b)).getResult();
}

Value IndexEmitter::swizzle(Value offset, SwizzleAttr swizzle) {
  int64_t shift = swizzle.getShift();
  int64_t mask = ((int64_t(1) << swizzle.getBits()) - 1)
                 << (swizzle.getBase() + std::max<int64_t>(0, shift));
  if (mask == 0 || shift == 0)
    return offset;
  Value selected = arith::AndIOp::create(builder, loc, offset,
                                         arith::ConstantIndexOp::create(builder, loc, mask));
  Value amount = arith::ConstantIndexOp::create(builder, loc, std::abs(shift));
  Value moved = shift > 0 ? Value(arith::ShRUIOp::create(builder, loc, selected, amount))
                          : Value(arith::ShLIOp::create(builder, loc, selected, amount));
  return arith::XOrIOp::create(builder, loc, offset, moved);
}

SmallVector<OpFoldResult> IndexEmitter::leafCoordinates(ValueRange coords,
                                                        ArrayRef<OpFoldResult> shape) {
  if (coords.size() == shape.size())
    return SmallVector<OpFoldResult>(coords.begin(), coords.end());
  SmallVector<OpFoldResult> split;
  OpFoldResult rest = coords.front();
  for (auto [k, extent] : llvm::enumerate(shape)) {
    // The last mode keeps the remainder, as CuTe's idx2crd does.
    if (k + 1 == shape.size()) {
      split.push_back(rest);
      break;
    }
    if (constantOf(extent) == 1) {
      split.push_back(builder.getIndexAttr(0));
      continue;
    }
    split.push_back(rem(rest, extent));
    rest = div(rest, extent);
  }
  return split;
}

Value IndexEmitter::offset(ValueRange coords, const LayoutLeaves &layout) {
  SmallVector<OpFoldResult> leafCoords = leafCoordinates(coords, layout.shape);
  OpFoldResult sum = layout.offset ? layout.offset : builder.getIndexAttr(0);
  for (auto [coord, step] : llvm::zip_equal(leafCoords, layout.stride))
    sum = add(sum, mul(coord, step));
  Value result = materialize(sum);
  return layout.swizzle ? swizzle(result, layout.swizzle) : result;
}
