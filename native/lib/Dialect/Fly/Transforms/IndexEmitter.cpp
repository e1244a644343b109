//===- IndexEmitter.cpp - index arithmetic for lowering Fly ops -----------===//

#include "fly/Dialect/Fly/Transforms/IndexEmitter.h"

#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"

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
    if (auto offset = dyn_cast<IntegerAttr>(composed.getOffset())) {
      leaves.offset = Builder(layout.getContext()).getIndexAttr(0);
      leaves.offsetConstant = offset.getInt();
    } else {
      leaves.offset = maker.getOffset();
      leaves.offsetMultiple = knownPowerOfTwoMultiple(composed.getOffset());
    }
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
  SmallVector<Attribute> strideAttrs;
  appendLeafAttrs(type.getStride(), strideAttrs);
  for (Attribute leaf : strideAttrs)
    leaves.strideMultiple.push_back(knownPowerOfTwoMultiple(leaf));
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

/// Static leaves, and values defined by constants (copies pass their chunks'
/// coordinates as arith.constant).
static std::optional<int64_t> constantOf(OpFoldResult value) { return getConstantIntValue(value); }

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

void IndexEmitter::accumulate(SplitSum &sum, OpFoldResult term, int64_t multiple) {
  if (std::optional<int64_t> constant = constantOf(term)) {
    sum.constant += *constant;
    return;
  }
  sum.dynamic = sum.dynamic ? add(sum.dynamic, term) : term;
  sum.multiple = std::min(sum.multiple, multiple);
}

void IndexEmitter::accumulateProduct(SplitSum &sum, OpFoldResult coord, OpFoldResult stride,
                                     int64_t strideMultiple) {
  int64_t coordMultiple = constantOf(coord) ? powerOfTwoFactor(*constantOf(coord)) : 1;
  // Both are powers of two: their product, saturated at kAnyMultiple.
  int64_t multiple = coordMultiple >= kAnyMultiple / std::min(strideMultiple, kAnyMultiple)
                         ? kAnyMultiple
                         : coordMultiple * strideMultiple;
  accumulate(sum, mul(coord, stride), multiple);
}

/// `swizzle(x)` of a constant.
static int64_t swizzleConstant(int64_t x, SwizzleAttr swizzle) {
  int64_t shift = swizzle.getShift();
  int64_t mask = ((int64_t(1) << swizzle.getBits()) - 1)
                 << (swizzle.getBase() + std::max<int64_t>(0, shift));
  uint64_t selected = uint64_t(x) & uint64_t(mask);
  return int64_t(uint64_t(x) ^ (shift > 0 ? selected >> shift : selected << -shift));
}

Value IndexEmitter::swizzle(const SplitSum &sum, SwizzleAttr swizzle) {
  int64_t bits = swizzle.getBits(), base = swizzle.getBase(), shift = swizzle.getShift();
  OpFoldResult dynamic = sum.dynamic ? sum.dynamic : builder.getIndexAttr(0);
  auto whole = [&] { return materialize(add(dynamic, builder.getIndexAttr(sum.constant))); };
  if (bits == 0 || shift == 0)
    return whole();
  // Splits the constant as a multiple of `unit` (moved into the dynamic part,
  // which stays a multiple of `unit`) and a remainder in [0, unit).
  auto split = [&](int64_t unit) {
    int64_t low = sum.constant & (unit - 1);
    return std::make_pair(add(dynamic, builder.getIndexAttr(sum.constant - low)), low);
  };
  // (b) The dynamic part is a multiple of the whole span: the swizzle only
  // permutes within the span, so it acts on the constant's remainder alone.
  int64_t span = int64_t(1) << (base + bits + std::abs(shift));
  if (sum.multiple >= span) {
    auto [high, low] = split(span);
    return materialize(add(high, builder.getIndexAttr(swizzleConstant(low, swizzle))));
  }
  // (a) A multiple of 2^base: the low base bits neither are read nor
  // written by the swizzle, and adding them to a multiple does not carry.
  if (sum.multiple >= (int64_t(1) << base)) {
    auto [high, low] = split(int64_t(1) << base);
    return materialize(add(this->swizzle(materialize(high), swizzle), builder.getIndexAttr(low)));
  }
  return this->swizzle(whole(), swizzle);
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
  if (layout.swizzle) {
    SplitSum sum;
    accumulate(sum, layout.offset, layout.offsetMultiple);
    sum.constant += layout.offsetConstant;
    for (auto [coord, step, multiple] :
         llvm::zip_equal(leafCoords, layout.stride, layout.strideMultiple))
      accumulateProduct(sum, coord, step, multiple);
    return swizzle(sum, layout.swizzle);
  }
  OpFoldResult sum = builder.getIndexAttr(0);
  for (auto [coord, step] : llvm::zip_equal(leafCoords, layout.stride))
    sum = add(sum, mul(coord, step));
  return materialize(sum);
}
