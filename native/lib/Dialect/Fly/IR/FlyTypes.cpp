//===- FlyTypes.cpp - Fly types -------------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyTypes.h"

#include "fly/Dialect/Fly/IR/FlyDialect.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fly;

#define GET_TYPEDEF_CLASSES
#include "fly/Dialect/Fly/IR/FlyTypes.cpp.inc"

void FlyDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "fly/Dialect/Fly/IR/FlyTypes.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// LayoutType
//===----------------------------------------------------------------------===//

static std::string intTupleToString(Attribute tuple) {
  std::string text;
  llvm::raw_string_ostream os(text);
  printIntTuple(os, tuple);
  return text;
}

LogicalResult LayoutType::verify(function_ref<InFlightDiagnostic()> emitError, Attribute shape,
                                 Attribute stride) {
  if (!isIntTuple(shape))
    return emitError() << "layout shape must be an IntTuple of i64 leaves, got " << shape;
  if (!isIntTuple(stride))
    return emitError() << "layout stride must be an IntTuple of i64 leaves, got " << stride;
  if (!isCongruent(shape, stride))
    return emitError() << "layout shape " << intTupleToString(shape) << " and stride "
                       << intTupleToString(stride) << " must be congruent (same nesting)";
  SmallVector<int64_t> extents;
  appendLeaves(shape, extents);
  for (auto [position, extent] : llvm::enumerate(extents))
    if (!ShapedType::isDynamic(extent) && extent < 1)
      return emitError() << "layout shape " << intTupleToString(shape) << " has extent " << extent
                         << " at leaf " << position << "; extents must be >= 1 or '?'";
  return success();
}

Type LayoutType::parse(AsmParser &parser) {
  if (parser.parseLess())
    return {};
  FailureOr<Attribute> shape = parseIntTuple(parser);
  if (failed(shape) || parser.parseColon())
    return {};
  FailureOr<Attribute> stride = parseIntTuple(parser);
  if (failed(stride) || parser.parseGreater())
    return {};
  return parser.getChecked<LayoutType>(parser.getContext(), *shape, *stride);
}

void LayoutType::print(AsmPrinter &printer) const {
  printer << '<';
  printIntTuple(printer.getStream(), getShape());
  printer << ':';
  printIntTuple(printer.getStream(), getStride());
  printer << '>';
}

int64_t LayoutType::getRank() const { return intTupleRank(getShape()); }

SmallVector<int64_t> LayoutType::getShapeLeaves() const {
  SmallVector<int64_t> leaves;
  appendLeaves(getShape(), leaves);
  return leaves;
}

SmallVector<int64_t> LayoutType::getStrideLeaves() const {
  SmallVector<int64_t> leaves;
  appendLeaves(getStride(), leaves);
  return leaves;
}

bool LayoutType::isStatic() const {
  return llvm::none_of(getShapeLeaves(), ShapedType::isDynamic) &&
         llvm::none_of(getStrideLeaves(), ShapedType::isDynamic);
}

std::optional<int64_t> LayoutType::getStaticSize() const {
  int64_t size = 1;
  for (int64_t extent : getShapeLeaves()) {
    if (ShapedType::isDynamic(extent))
      return std::nullopt;
    size *= extent;
  }
  return size;
}
