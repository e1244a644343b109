//===- IndexEmitter.h - index arithmetic for lowering Fly ops ---*- C++ -*-===//
//
// Builds `arith` index arithmetic on OpFoldResults: static leaves stay
// attributes and fold, dynamic ones become ops. Shared by the layout and the
// tensor lowerings, so that every offset is computed the same way.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_DIALECT_FLY_TRANSFORMS_INDEXEMITTER_H
#define FLY_DIALECT_FLY_TRANSFORMS_INDEXEMITTER_H

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

namespace mlir::fly {

/// The leaves of a layout value: attributes where static, SSA values where
/// dynamic (taken from the fly.make_layout that built it).
struct LayoutLeaves {
  SmallVector<OpFoldResult> shape;
  SmallVector<OpFoldResult> stride;
  /// Set for composed layouts: applied to `offset + inner(coord)`.
  SwizzleAttr swizzle;
  OpFoldResult offset;
};

/// Fails (without emitting) when a dynamic leaf's value cannot be found.
FailureOr<LayoutLeaves> getLayoutLeaves(Value layout);
FailureOr<SmallVector<OpFoldResult>> getIntTupleLeaves(Value tuple);

class IndexEmitter {
public:
  IndexEmitter(OpBuilder &builder, Location loc) : builder(builder), loc(loc) {}

  OpFoldResult add(OpFoldResult a, OpFoldResult b);
  OpFoldResult mul(OpFoldResult a, OpFoldResult b);
  OpFoldResult div(OpFoldResult a, OpFoldResult b);
  OpFoldResult rem(OpFoldResult a, OpFoldResult b);
  Value swizzle(Value offset, SwizzleAttr swizzle);
  Value materialize(OpFoldResult value);

  /// One coordinate per shape leaf: `coords` as given when there is one per
  /// leaf, else the single linear coordinate split colexicographically.
  SmallVector<OpFoldResult> leafCoordinates(ValueRange coords, ArrayRef<OpFoldResult> shape);
  /// crd2idx: sum of coordinate * stride, then the composed layout's offset
  /// and swizzle.
  Value offset(ValueRange coords, const LayoutLeaves &layout);

private:
  OpBuilder &builder;
  Location loc;
};

} // namespace mlir::fly

#endif // FLY_DIALECT_FLY_TRANSFORMS_INDEXEMITTER_H
