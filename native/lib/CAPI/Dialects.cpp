//===- Dialects.cpp - C API of the Fly dialect ----------------------------===//

#include "fly-c/Dialects.h"

#include "fly/Dialect/Fly/IR/FlyDialect.h"
#include "fly/Dialect/Fly/IR/FlyTypes.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Registration.h"

#include <mutex>

using namespace mlir;
using namespace mlir::fly;

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(Fly, fly, FlyDialect)

void flyRegisterPasses(void) {
  static std::once_flag once;
  std::call_once(once, [] { registerFlyPasses(); });
}

bool flyTypeIsALayout(MlirType type) { return isa<LayoutType>(unwrap(type)); }

intptr_t flyLayoutTypeGetRank(MlirType type) { return cast<LayoutType>(unwrap(type)).getRank(); }

bool flyLayoutTypeIsStatic(MlirType type) { return cast<LayoutType>(unwrap(type)).isStatic(); }

int64_t flyLayoutTypeGetStaticSize(MlirType type) {
  return cast<LayoutType>(unwrap(type)).getStaticSize().value_or(-1);
}
