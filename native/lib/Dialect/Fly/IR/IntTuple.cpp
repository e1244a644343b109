//===- IntTuple.cpp - CuTe IntTuples stored as attributes -----------------===//

#include "fly/Dialect/Fly/IR/IntTuple.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::fly {

bool isIntTupleLeaf(Attribute attr) {
  auto leaf = dyn_cast_or_null<IntegerAttr>(attr);
  return leaf && leaf.getType().isInteger(64);
}

bool isIntTuple(Attribute attr) {
  if (isIntTupleLeaf(attr))
    return true;
  auto tuple = dyn_cast_or_null<ArrayAttr>(attr);
  return tuple && llvm::all_of(tuple, isIntTuple);
}

void appendLeaves(Attribute tuple, SmallVectorImpl<int64_t> &leaves) {
  if (auto leaf = dyn_cast<IntegerAttr>(tuple)) {
    leaves.push_back(leaf.getInt());
    return;
  }
  for (Attribute element : cast<ArrayAttr>(tuple))
    appendLeaves(element, leaves);
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

Attribute makeIntTupleLeaf(MLIRContext *ctx, int64_t value) {
  return IntegerAttr::get(IntegerType::get(ctx, 64), value);
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
  if (succeeded(parser.parseOptionalQuestion()))
    return makeIntTupleLeaf(ctx, ShapedType::kDynamic);
  int64_t value;
  if (parser.parseInteger(value))
    return failure();
  return makeIntTupleLeaf(ctx, value);
}

void printIntTuple(llvm::raw_ostream &os, Attribute tuple) {
  if (auto leaf = dyn_cast<IntegerAttr>(tuple)) {
    if (ShapedType::isDynamic(leaf.getInt()))
      os << '?';
    else
      os << leaf.getInt();
    return;
  }
  os << '(';
  llvm::interleave(
      cast<ArrayAttr>(tuple), os, [&](Attribute element) { printIntTuple(os, element); }, ",");
  os << ')';
}

} // namespace mlir::fly
