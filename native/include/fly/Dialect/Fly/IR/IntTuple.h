//===- IntTuple.h - CuTe IntTuples stored as attributes ---------*- C++ -*-===//
//
// An IntTuple is an i64 IntegerAttr (a static leaf), a DynamicLeafAttr (`?`,
// with a known divisor) or an ArrayAttr of IntTuples. These helpers parse and
// print CuTe notation and walk the leaves in colexicographic order. The layout
// algebra itself is not re-implemented here: it lives in flydsl.layout.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_DIALECT_FLY_IR_INTTUPLE_H
#define FLY_DIALECT_FLY_IR_INTTUPLE_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>

namespace mlir::fly {

/// True if `attr` is a well-formed IntTuple.
bool isIntTuple(Attribute attr);
/// True if `attr` is a leaf, static or dynamic.
bool isIntTupleLeaf(Attribute attr);
/// Appends the leaves of `tuple` in colexicographic order (nullopt for `?`).
void appendLeaves(Attribute tuple, SmallVectorImpl<std::optional<int64_t>> &leaves);
SmallVector<std::optional<int64_t>> getLeaves(Attribute tuple);
/// Appends the leaf attributes themselves.
void appendLeafAttrs(Attribute tuple, SmallVectorImpl<Attribute> &leaves);
int64_t countDynamicLeaves(Attribute tuple);
/// Number of top-level modes (1 for a leaf).
int64_t intTupleRank(Attribute tuple);
/// True if `a` and `b` have the same nesting structure.
bool isCongruent(Attribute a, Attribute b);
/// A tuple of `profile`'s structure whose leaves are all dynamic.
Attribute makeDynamicLike(Attribute profile);

/// The largest power of two dividing `value` (2^62 for 0, a multiple of everything).
int64_t powerOfTwoFactor(int64_t value);
/// The largest power of two a leaf is known to be a multiple of (static
/// value or declared divisor; 0 counts as a multiple of everything: 2^62).
int64_t knownPowerOfTwoMultiple(Attribute leaf);

Attribute makeStaticLeaf(MLIRContext *ctx, int64_t value);
Attribute makeDynamicLeaf(MLIRContext *ctx, int64_t divisibility = 1);

/// Parses `4`, `?`, `?{div=8}`, `-2`, `(4,(2,?))`, `()`.
FailureOr<Attribute> parseIntTuple(AsmParser &parser);
/// Prints in CuTe notation.
void printIntTuple(llvm::raw_ostream &os, Attribute tuple);
std::string intTupleToString(Attribute tuple);

} // namespace mlir::fly

#endif // FLY_DIALECT_FLY_IR_INTTUPLE_H
