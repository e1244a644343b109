//===- FlyTypes.cpp - Fly types -------------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyTypes.h"

#include "fly/Dialect/Fly/IR/FlyDialect.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

#include <cstdlib>
#include <limits>

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
// IntTupleType
//===----------------------------------------------------------------------===//

LogicalResult IntTupleType::verify(function_ref<InFlightDiagnostic()> emitError, Attribute value) {
  if (!isIntTuple(value))
    return emitError() << "int_tuple value must be an IntTuple of i64 and #fly.dyn leaves, got "
                       << value;
  return success();
}

Type IntTupleType::parse(AsmParser &parser) {
  if (parser.parseLess())
    return {};
  FailureOr<Attribute> value = parseIntTuple(parser);
  if (failed(value) || parser.parseGreater())
    return {};
  return parser.getChecked<IntTupleType>(parser.getContext(), *value);
}

void IntTupleType::print(AsmPrinter &printer) const {
  printer << '<';
  printIntTuple(printer.getStream(), getValue());
  printer << '>';
}

int64_t IntTupleType::getNumDynamicLeaves() const { return countDynamicLeaves(getValue()); }

//===----------------------------------------------------------------------===//
// LayoutType
//===----------------------------------------------------------------------===//

LogicalResult LayoutType::verify(function_ref<InFlightDiagnostic()> emitError, Attribute shape,
                                 Attribute stride) {
  if (!isIntTuple(shape))
    return emitError() << "layout shape must be an IntTuple, got " << shape;
  if (!isIntTuple(stride))
    return emitError() << "layout stride must be an IntTuple, got " << stride;
  if (!isCongruent(shape, stride))
    return emitError() << "layout shape " << intTupleToString(shape) << " and stride "
                       << intTupleToString(stride) << " must be congruent (same nesting)";
  SmallVector<std::optional<int64_t>> extents = getLeaves(shape);
  SmallVector<std::optional<int64_t>> steps = getLeaves(stride);
  for (auto [position, extent] : llvm::enumerate(extents))
    if (extent && *extent < 1)
      return emitError() << "layout shape " << intTupleToString(shape) << " has extent " << *extent
                         << " at leaf " << position << "; extents must be >= 1 or '?'";
  // Sizes and offsets are i64 (index) once lowered: a static size or reach past it would wrap.
  int64_t size = 1, reach = 0;
  for (auto [extent, step] : llvm::zip_equal(extents, steps)) {
    if (!extent)
      continue;
    if (llvm::MulOverflow(size, *extent, size))
      return emitError() << "layout " << intTupleToString(shape) << ":"
                         << intTupleToString(stride)
                         << " has a static size past int64 (the product of its static extents "
                            "overflows)";
    int64_t span;
    if (step && (*step == std::numeric_limits<int64_t>::min() ||
                 llvm::MulOverflow(*extent - 1, std::abs(*step), span) ||
                 llvm::AddOverflow(reach, span, reach)))
      return emitError() << "layout " << intTupleToString(shape) << ":"
                         << intTupleToString(stride)
                         << " reaches offsets past int64 (the sum of (extent - 1) * |stride| "
                            "overflows)";
  }
  return success();
}

FailureOr<LayoutType> LayoutType::parseBody(AsmParser &parser) {
  FailureOr<Attribute> shape = parseIntTuple(parser);
  if (failed(shape) || parser.parseColon())
    return failure();
  FailureOr<Attribute> stride = parseIntTuple(parser);
  if (failed(stride))
    return failure();
  LayoutType type = parser.getChecked<LayoutType>(parser.getContext(), *shape, *stride);
  if (!type)
    return failure();
  return type;
}

void LayoutType::printBody(llvm::raw_ostream &os) const {
  printIntTuple(os, getShape());
  os << ':';
  printIntTuple(os, getStride());
}

Type LayoutType::parse(AsmParser &parser) {
  FailureOr<LayoutType> type;
  if (parser.parseLess() || failed(type = parseBody(parser)) || parser.parseGreater())
    return {};
  return *type;
}

void LayoutType::print(AsmPrinter &printer) const {
  printer << '<';
  printBody(printer.getStream());
  printer << '>';
}

int64_t LayoutType::getRank() const { return intTupleRank(getShape()); }

SmallVector<std::optional<int64_t>> LayoutType::getShapeLeaves() const {
  return getLeaves(getShape());
}

SmallVector<std::optional<int64_t>> LayoutType::getStrideLeaves() const {
  return getLeaves(getStride());
}

int64_t LayoutType::getNumDynamicShapeLeaves() const { return countDynamicLeaves(getShape()); }

int64_t LayoutType::getNumDynamicStrideLeaves() const { return countDynamicLeaves(getStride()); }

bool LayoutType::isStatic() const {
  return getNumDynamicShapeLeaves() == 0 && getNumDynamicStrideLeaves() == 0;
}

std::optional<int64_t> LayoutType::getStaticSize() const {
  int64_t size = 1; // fits: the verifier refuses a static size past int64
  for (std::optional<int64_t> extent : getShapeLeaves()) {
    if (!extent)
      return std::nullopt;
    size *= *extent;
  }
  return size;
}

//===----------------------------------------------------------------------===//
// ComposedLayoutType: Sw<b,m,s> o offset o shape:stride
//===----------------------------------------------------------------------===//

Type ComposedLayoutType::parse(AsmParser &parser) {
  int32_t bits, base, shift;
  SMLoc swizzleLoc = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseKeyword("Sw") || parser.parseLess() ||
      parser.parseInteger(bits) || parser.parseComma() || parser.parseInteger(base) ||
      parser.parseComma() || parser.parseInteger(shift) || parser.parseGreater() ||
      parser.parseKeyword("o"))
    return {};
  FailureOr<Attribute> offset = parseIntTuple(parser);
  if (failed(offset) || parser.parseKeyword("o"))
    return {};
  FailureOr<LayoutType> inner = LayoutType::parseBody(parser);
  if (failed(inner) || parser.parseGreater())
    return {};
  auto emitError = [&] { return parser.emitError(swizzleLoc); };
  SwizzleAttr swizzle = SwizzleAttr::getChecked(emitError, parser.getContext(), bits, base, shift);
  if (!swizzle)
    return {};
  return parser.getChecked<ComposedLayoutType>(parser.getContext(), swizzle, *offset, *inner);
}

void ComposedLayoutType::print(AsmPrinter &printer) const {
  SwizzleAttr swizzle = getSwizzle();
  printer << "<Sw<" << swizzle.getBits() << ',' << swizzle.getBase() << ',' << swizzle.getShift()
          << "> o ";
  printIntTuple(printer.getStream(), getOffset());
  printer << " o ";
  getInner().printBody(printer.getStream());
  printer << '>';
}

LogicalResult ComposedLayoutType::verify(function_ref<InFlightDiagnostic()> emitError,
                                         SwizzleAttr swizzle, Attribute offset, LayoutType inner) {
  if (!isIntTupleLeaf(offset))
    return emitError() << "composed layout offset must be an integer or '?', got "
                       << intTupleToString(offset);
  return success();
}

//===----------------------------------------------------------------------===//
// PtrType
//===----------------------------------------------------------------------===//

static std::optional<AddressSpace> parseAddressSpace(StringRef keyword) {
  return llvm::StringSwitch<std::optional<AddressSpace>>(keyword)
      .Case("generic", AddressSpace::Generic)
      .Case("global", AddressSpace::Global)
      .Case("shared", AddressSpace::Shared)
      .Case("register", AddressSpace::Register)
      .Default(std::nullopt);
}

static StringRef addressSpaceName(unsigned space) {
  switch (AddressSpace(space)) {
  case AddressSpace::Generic:
    return "generic";
  case AddressSpace::Global:
    return "global";
  case AddressSpace::Shared:
    return "shared";
  case AddressSpace::Register:
    return "register";
  }
  return "";
}

LogicalResult PtrType::verify(function_ref<InFlightDiagnostic()> emitError, Type elementType,
                              unsigned addressSpace, int64_t alignment) {
  if (addressSpaceName(addressSpace).empty())
    return emitError() << "unknown address space " << addressSpace
                       << "; expected generic (0), global (1), shared (3) or register (5)";
  if (alignment < 1 || !llvm::isPowerOf2_64(alignment))
    return emitError() << "pointer alignment must be a power of two >= 1 bytes, got " << alignment;
  // LLVM asserts on larger alignments (llvm::Value::MaxAlignmentExponent).
  if (alignment > (int64_t(1) << 32))
    return emitError() << "pointer alignment must be at most 2^32 bytes (LLVM's largest), got " << alignment;
  // Accesses are sized and aligned by whole scalar elements (copies make vectors of them).
  if (!elementType.isIntOrFloat() || elementType.getIntOrFloatBitWidth() % 8 != 0)
    return emitError() << "pointer element type must be an integer or float of whole bytes, got "
                       << elementType;
  if (alignment < int64_t(elementType.getIntOrFloatBitWidth() / 8))
    return emitError() << "pointer alignment " << alignment << " is less than the "
                       << elementType.getIntOrFloatBitWidth() / 8 << " bytes of " << elementType
                       << " (accesses assume aligned elements)";
  return success();
}

Type PtrType::parse(AsmParser &parser) {
  Type elementType;
  StringRef spaceKeyword;
  int64_t alignment;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseType(elementType) || parser.parseComma())
    return {};
  SMLoc spaceLoc = parser.getCurrentLocation();
  if (parser.parseKeyword(&spaceKeyword) || parser.parseComma() ||
      parser.parseInteger(alignment) || parser.parseGreater())
    return {};
  std::optional<AddressSpace> space = parseAddressSpace(spaceKeyword);
  if (!space) {
    parser.emitError(spaceLoc, "unknown address space '")
        << spaceKeyword << "'; expected generic, global, shared or register";
    return {};
  }
  auto emitError = [&] { return parser.emitError(loc); };
  return PtrType::getChecked(emitError, parser.getContext(), elementType, unsigned(*space),
                             alignment);
}

void PtrType::print(AsmPrinter &printer) const {
  printer << '<' << getElementType() << ", " << addressSpaceName(getAddressSpace()) << ", "
          << getAlignment() << '>';
}

//===----------------------------------------------------------------------===//
// TensorType
//===----------------------------------------------------------------------===//

LogicalResult mlir::fly::TensorType::verify(function_ref<InFlightDiagnostic()> emitError, PtrType ptr,
                                 Type layout) {
  if (!isa<LayoutType, ComposedLayoutType>(layout))
    return emitError() << "tensor layout must be !fly.layout or !fly.composed_layout, got "
                       << layout;
  return success();
}
