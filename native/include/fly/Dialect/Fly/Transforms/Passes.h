//===- Passes.h - Fly passes ------------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_TRANSFORMS_PASSES_H
#define FLY_DIALECT_FLY_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir::fly {

#define GEN_PASS_DECL
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"

/// Patterns that lower Fly layout ops to arith; usable without the pass.
void populateFlyLowerLayoutsPatterns(RewritePatternSet &patterns);

#define GEN_PASS_REGISTRATION
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"

} // namespace mlir::fly

#endif // FLY_DIALECT_FLY_TRANSFORMS_PASSES_H
