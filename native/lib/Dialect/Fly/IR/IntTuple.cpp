//===- IntTuple.cpp - CuTe IntTuples stored as attributes -----------------===//

#include "fly/Dialect/Fly/IR/IntTuple.h"

#include "fly/Dialect/Fly/IR/FlyAttrs.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::fly {

bool isIntTupleLeaf(Attribute attr) {
  if (auto leaf = dyn_cast_or_null<IntegerAttr>(attr))
    return leaf.getType().isInteger(64);
  return isa_and_nonnull<DynamicLeafAttr>(attr);
}

bool isIntTuple(Attribute attr) {
  if (isIntTupleLeaf(attr))
    return true;
  auto tuple = dyn_cast_or_null<ArrayAttr>(attr);
  return tuple && llvm::all_of(tuple, isIntTuple);
}

void appendLeafAttrs(Attribute tuple, SmallVectorImpl<Attribute> &leaves) {
  if (auto modes = dyn_cast<ArrayAttr>(tuple)) {
    for (Attribute mode : modes)
      appendLeafAttrs(mode, leaves);
    return;
  }
  leaves.push_back(tuple);
}

void appendLeaves(Attribute tuple, SmallVectorImpl<std::optional<int64_t>> &leaves) {
  SmallVector<Attribute> attrs;
  appendLeafAttrs(tuple, attrs);
  for (Attribute leaf : attrs) {
    if (auto value = dyn_cast<IntegerAttr>(leaf))
      leaves.push_back(value.getInt());
    else
      leaves.push_back(std::nullopt);
  }
}

SmallVector<std::optional<int64_t>> getLeaves(Attribute tuple) {
  SmallVector<std::optional<int64_t>> leaves;
  appendLeaves(tuple, leaves);
  return leaves;
}

int64_t countDynamicLeaves(Attribute tuple) {
  return llvm::count(getLeaves(tuple), std::nullopt);
}

int64_t intTupleRank(Attribute tuple) {
  if (auto modes = dyn_cast<ArrayAttr>(tuple))
    return modes.size();
  return 1;
}

bool isCongruent(Attribute a, Attribute b) {
  auto tupleA = dyn_cast<ArrayAttr>(a);
  auto tupleB = dyn_cast<ArrayAttr>(b);
  if (!tupleA || !tupleB)
    return !tupleA && !tupleB;
  if (tupleA.size() != tupleB.size())
    return false;
  return llvm::all_of(llvm::zip_equal(tupleA, tupleB),
                      [](auto pair) { return isCongruent(std::get<0>(pair), std::get<1>(pair)); });
}

Attribute makeDynamicLike(Attribute profile) {
  MLIRContext *ctx = profile.getContext();
  if (auto modes = dyn_cast<ArrayAttr>(profile))
    return ArrayAttr::get(ctx, llvm::map_to_vector(modes, makeDynamicLike));
  return makeDynamicLeaf(ctx);
}

int64_t powerOfTwoFactor(int64_t value) {
  if (value == 0)
    return int64_t(1) << 62;
  return int64_t(1) << llvm::countr_zero(uint64_t(value < 0 ? -value : value));
}

int64_t knownPowerOfTwoMultiple(Attribute leaf) {
  if (auto constant = dyn_cast<IntegerAttr>(leaf))
    return powerOfTwoFactor(constant.getInt());
  return powerOfTwoFactor(cast<DynamicLeafAttr>(leaf).getDivisibility());
}

Attribute makeStaticLeaf(MLIRContext *ctx, int64_t value) {
  return IntegerAttr::get(IntegerType::get(ctx, 64), value);
}

Attribute makeDynamicLeaf(MLIRContext *ctx, int64_t divisibility) {
  return DynamicLeafAttr::get(ctx, divisibility);
}

FailureOr<Attribute> parseIntTuple(AsmParser &parser) {
  MLIRContext *ctx = parser.getContext();
  if (succeeded(parser.parseOptionalLParen())) {
    SmallVector<Attribute> elements;
    if (succeeded(parser.parseOptionalRParen()))
      return Attribute(ArrayAttr::get(ctx, elements));
    auto parseElement = [&]() -> ParseResult {
      FailureOr<Attribute> element = parseIntTuple(parser);
      if (failed(element))
        return failure();
      elements.push_back(*element);
      return success();
    };
    if (parser.parseCommaSeparatedList(parseElement) || parser.parseRParen())
      return failure();
    return Attribute(ArrayAttr::get(ctx, elements));
  }
  if (succeeded(parser.parseOptionalQuestion())) {
    int64_t divisibility = 1;
    if (succeeded(parser.parseOptionalLBrace())) {
      SMLoc loc = parser.getCurrentLocation();
      if (parser.parseKeyword("div") || parser.parseEqual() || parser.parseInteger(divisibility) ||
          parser.parseRBrace())
        return failure();
      if (divisibility < 1)
        return parser.emitError(loc, "divisibility must be >= 1, got ") << divisibility;
    }
    return makeDynamicLeaf(ctx, divisibility);
  }
  int64_t value;
  if (parser.parseInteger(value))
    return failure();
  return makeStaticLeaf(ctx, value);
}

void printIntTuple(llvm::raw_ostream &os, Attribute tuple) {
  if (auto leaf = dyn_cast<IntegerAttr>(tuple)) {
    os << leaf.getInt();
    return;
  }
  if (auto leaf = dyn_cast<DynamicLeafAttr>(tuple)) {
    os << '?';
    if (leaf.getDivisibility() != 1)
      os << "{div=" << leaf.getDivisibility() << '}';
    return;
  }
  os << '(';
  llvm::interleave(
      cast<ArrayAttr>(tuple), os, [&](Attribute element) { printIntTuple(os, element); }, ",");
  os << ')';
}

std::string intTupleToString(Attribute tuple) {
  std::string text;
  llvm::raw_string_ostream os(text);
  printIntTuple(os, tuple);
  return text;
}

} // namespace mlir::fly
