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

/// What an index value without a known divisor is a multiple of; 0 is a
/// multiple of everything (2^62, as knownPowerOfTwoMultiple says).
constexpr int64_t kAnyMultiple = int64_t(1) << 62;

/// The leaves of a layout value: attributes where static, SSA values where
/// dynamic (taken from the fly.make_layout that built it).
struct LayoutLeaves {
  SmallVector<OpFoldResult> shape;
  SmallVector<OpFoldResult> stride;
  /// The power of two each stride leaf is known to be a multiple of (its
  /// value, or the divisor its type declares).
  SmallVector<int64_t> strideMultiple;
  /// Set for composed layouts: applied to `offset + offsetConstant +
  /// inner(coord)`, where `offset` is known to be a multiple of
  /// `offsetMultiple` (a power of two: the `?{div=N}` of the type, or what a
  /// slice's fixed strides prove). The constant part is kept apart so that
  /// the swizzle simplifications of IndexEmitter::offset see it.
  SwizzleAttr swizzle;
  OpFoldResult offset;
  int64_t offsetMultiple = kAnyMultiple;
  int64_t offsetConstant = 0;
};

/// An index sum kept as `dynamic + constant`, with the power of two the
/// dynamic part is known to be a multiple of.
struct SplitSum {
  OpFoldResult dynamic; // null when every term is static
  int64_t multiple = kAnyMultiple;
  int64_t constant = 0;
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
  /// `swizzle(sum)`, as cheap as the known multiple and the constant allow:
  /// with `P` the swizzle span `2^(base + bits + |shift|)` and the dynamic
  /// part `d` a multiple of `P`, `swizzle(d + k) = (d + k - k mod P) +
  /// swizzle(k mod P)` (a constant, no xor); with `d` a multiple of
  /// `2^base` only, `swizzle(d + k) = swizzle(d + k - k mod 2^base) + k mod
  /// 2^base` (the low bits pass through, and the add does not carry into
  /// them). Otherwise the plain xor sequence on the whole sum.
  Value swizzle(const SplitSum &sum, SwizzleAttr swizzle);
  Value materialize(OpFoldResult value);

  /// Adds `term`, a multiple of `multiple` (a power of two), to `sum`.
  void accumulate(SplitSum &sum, OpFoldResult term, int64_t multiple);
  /// `coord * stride`, added to `sum` (coordinates are arbitrary, so the
  /// product is known to be a multiple of what the stride is).
  void accumulateProduct(SplitSum &sum, OpFoldResult coord, OpFoldResult stride,
                         int64_t strideMultiple);

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
