//===- FlyAttrs.cpp - Fly attributes --------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyAttrs.h"

#include "fly/Dialect/Fly/IR/FlyDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::fly;

#define GET_ATTRDEF_CLASSES
#include "fly/Dialect/Fly/IR/FlyAttrs.cpp.inc"

void FlyDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "fly/Dialect/Fly/IR/FlyAttrs.cpp.inc"
      >();
}

LogicalResult DynamicLeafAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                      int64_t divisibility) {
  if (divisibility < 1)
    return emitError() << "divisibility must be >= 1, got " << divisibility;
  return success();
}

LogicalResult SwizzleAttr::verify(function_ref<InFlightDiagnostic()> emitError, int32_t bits,
                                  int32_t base, int32_t shift) {
  if (bits < 0 || base < 0)
    return emitError() << "swizzle bits and base must be >= 0, got <" << bits << "," << base << ","
                       << shift << ">";
  if (std::abs(shift) < bits)
    return emitError() << "swizzle |shift| must be >= bits so that the masks do not overlap, got <"
                       << bits << "," << base << "," << shift << ">";
  if (bits + base + std::abs(shift) > 62)
    return emitError() << "swizzle reaches past bit 62: <" << bits << "," << base << "," << shift
                       << ">";
  return success();
}

int64_t SwizzleAttr::apply(int64_t offset) const {
  // CuTe: yyy = ((1 << B) - 1) << (M + max(0, S)); x ^ shift_right(x & yyy, S).
  int64_t shift = getShift();
  int64_t mask = ((int64_t(1) << getBits()) - 1) << (getBase() + std::max<int64_t>(0, shift));
  int64_t selected = offset & mask;
  return offset ^ (shift >= 0 ? selected >> shift : selected << -shift);
}
