//===- IntTuple.h - CuTe IntTuples stored as attributes ---------*- C++ -*-===//
//
// An IntTuple is an i64 IntegerAttr (a leaf; ShapedType::kDynamic means `?`)
// or an ArrayAttr of IntTuples. These helpers parse and print CuTe notation
// and walk the leaves. The layout algebra itself is not re-implemented here:
// it lives in flydsl.layout (Python).
//
//===----------------------------------------------------------------------===//

#ifndef FLY_DIALECT_FLY_IR_INTTUPLE_H
#define FLY_DIALECT_FLY_IR_INTTUPLE_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::fly {

/// True if `attr` is a well-formed IntTuple.
bool isIntTuple(Attribute attr);
/// True if `attr` is a leaf (an integer, static or dynamic).
bool isIntTupleLeaf(Attribute attr);
/// Appends the leaves of `tuple` in colexicographic order.
void appendLeaves(Attribute tuple, SmallVectorImpl<int64_t> &leaves);
/// Number of top-level modes (1 for a leaf).
int64_t intTupleRank(Attribute tuple);
/// True if `a` and `b` have the same nesting structure.
bool isCongruent(Attribute a, Attribute b);

/// Leaf builders.
Attribute makeIntTupleLeaf(MLIRContext *ctx, int64_t value);

/// Parses `4`, `?`, `-2`, `(4,(2,?))`.
FailureOr<Attribute> parseIntTuple(AsmParser &parser);
/// Prints in CuTe notation.
void printIntTuple(llvm::raw_ostream &os, Attribute tuple);

} // namespace mlir::fly

#endif // FLY_DIALECT_FLY_IR_INTTUPLE_H
