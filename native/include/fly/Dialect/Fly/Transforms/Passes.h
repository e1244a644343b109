//===- Passes.h - Fly passes ------------------------------------*- C++ -*-===//

#ifndef FLY_DIALECT_FLY_TRANSFORMS_PASSES_H
#define FLY_DIALECT_FLY_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir::fly {

#define GEN_PASS_DECL
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"

/// Patterns that lower Fly layout ops to arith; usable without the pass.
void populateFlyLowerLayoutsPatterns(RewritePatternSet &patterns);
/// Patterns that lower Fly tensor loads and stores to llvm; usable without the pass.
void populateFlyLowerTensorsPatterns(RewritePatternSet &patterns);
/// Elements per access that a copy between these tensors can use (a power of
/// two, at most `maxBytes` wide), proven from their layouts and pointers.
int64_t provenCopyVectorElements(Type source, Type target, int64_t maxBytes = 16);
/// Erases side-effect-free Fly ops without uses under `root` (leaves first).
void eraseDeadFlyValues(Operation *root);

#define GEN_PASS_REGISTRATION
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"

} // namespace mlir::fly

#endif // FLY_DIALECT_FLY_TRANSFORMS_PASSES_H
