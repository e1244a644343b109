//===- LowerLayouts.cpp - lower Fly layout ops to arith -------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/IR/IntTuple.h"
#include "fly/Dialect/Fly/Transforms/IndexEmitter.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/Iterators.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"

namespace mlir::fly {
#define GEN_PASS_DEF_FLYLOWERLAYOUTS
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"
} // namespace mlir::fly

using namespace mlir;
using namespace mlir::fly;

namespace {

constexpr const char *kUntraceable =
    "a dynamic leaf's value is unknown (the value was not built by a fly.make_* op here)";

struct LowerCrd2Idx : OpRewritePattern<Crd2IdxOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(Crd2IdxOp op, PatternRewriter &rewriter) const override {
    FailureOr<LayoutLeaves> layout = getLayoutLeaves(op.getLayout());
    if (failed(layout))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    IndexEmitter emit(rewriter, op.getLoc());
    rewriter.replaceOp(op, emit.offset(op.getCoord(), *layout));
    return success();
  }
};

struct LowerSize : OpRewritePattern<SizeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(SizeOp op, PatternRewriter &rewriter) const override {
    FailureOr<LayoutLeaves> layout = getLayoutLeaves(op.getLayout());
    if (failed(layout))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    IndexEmitter emit(rewriter, op.getLoc());
    OpFoldResult size = rewriter.getIndexAttr(1);
    for (OpFoldResult extent : layout->shape)
      size = emit.mul(size, extent);
    rewriter.replaceOp(op, emit.materialize(size));
    return success();
  }
};

struct LowerRank : OpRewritePattern<RankOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(RankOp op, PatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<arith::ConstantIndexOp>(op, op.getLayout().getType().getRank());
    return success();
  }
};

/// A tuple value: an index for a leaf, else a fly.make_int_tuple of the dynamic leaves.
static Value buildIntTuple(PatternRewriter &rewriter, Location loc, Type type,
                           ArrayRef<OpFoldResult> leaves) {
  IndexEmitter emit(rewriter, loc);
  if (isa<IndexType>(type))
    return emit.materialize(leaves.front());
  SmallVector<Value> dynamic;
  for (OpFoldResult leaf : leaves)
    if (auto value = dyn_cast<Value>(leaf))
      dynamic.push_back(value);
  return MakeIntTupleOp::create(rewriter, loc, cast<IntTupleType>(type), dynamic);
}

template <typename OpTy, bool Shape>
struct LowerLayoutPart : OpRewritePattern<OpTy> {
  using OpRewritePattern<OpTy>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpTy op, PatternRewriter &rewriter) const override {
    FailureOr<LayoutLeaves> layout = getLayoutLeaves(op.getLayout());
    if (failed(layout))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    rewriter.replaceOp(op, buildIntTuple(rewriter, op.getLoc(), op.getType(),
                                         Shape ? layout->shape : layout->stride));
    return success();
  }
};

/// Number of leaves before the mode that `path` selects, and that mode's leaf count.
static std::pair<size_t, size_t> leafRange(Attribute tuple, ArrayRef<int64_t> path) {
  size_t before = 0;
  for (int64_t index : path) {
    auto modes = cast<ArrayAttr>(tuple);
    for (int64_t k = 0; k < index; ++k)
      before += getLeaves(modes[k]).size();
    tuple = modes[index];
  }
  return {before, getLeaves(tuple).size()};
}

struct LowerGet : OpRewritePattern<GetOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GetOp op, PatternRewriter &rewriter) const override {
    FailureOr<SmallVector<OpFoldResult>> leaves = getIntTupleLeaves(op.getTuple());
    if (failed(leaves))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    auto [first, count] = leafRange(op.getTuple().getType().getValue(), op.getPath());
    ArrayRef<OpFoldResult> selected = ArrayRef(*leaves).slice(first, count);
    rewriter.replaceOp(op, buildIntTuple(rewriter, op.getLoc(), op.getType(), selected));
    return success();
  }
};

struct LowerIdx2Crd : OpRewritePattern<Idx2CrdOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(Idx2CrdOp op, PatternRewriter &rewriter) const override {
    FailureOr<LayoutLeaves> layout = getLayoutLeaves(op.getLayout());
    if (failed(layout))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    IndexEmitter emit(rewriter, op.getLoc());
    SmallVector<Value> coords;
    for (OpFoldResult coord : emit.leafCoordinates(op.getIndex(), layout->shape))
      coords.push_back(emit.materialize(coord));
    rewriter.replaceOpWithNewOp<MakeIntTupleOp>(op, op.getType(), coords);
    return success();
  }
};

struct LowerApplySwizzle : OpRewritePattern<ApplySwizzleOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ApplySwizzleOp op, PatternRewriter &rewriter) const override {
    IndexEmitter emit(rewriter, op.getLoc());
    rewriter.replaceOp(op, emit.swizzle(op.getOffset(), op.getSwizzle()));
    return success();
  }
};

struct FlyLowerLayoutsPass : mlir::fly::impl::FlyLowerLayoutsBase<FlyLowerLayoutsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateFlyLowerLayoutsPatterns(patterns);
    // The walk driver neither folds nor erases unrelated ops, so IR without
    // Fly ops comes out unchanged.
    walkAndApplyPatterns(getOperation(), std::move(patterns));
    eraseDeadFlyValues(getOperation());
  }
};

} // namespace

void mlir::fly::populateFlyLowerLayoutsPatterns(RewritePatternSet &patterns) {
  patterns.add<LowerCrd2Idx, LowerSize, LowerRank, LowerGet, LowerIdx2Crd, LowerApplySwizzle,
               LowerLayoutPart<GetShapeOp, true>, LowerLayoutPart<GetStrideOp, false>>(
      patterns.getContext());
}

void mlir::fly::eraseDeadFlyValues(Operation *root) {
  // Post-order visits users before the values they use, so chains die in one walk.
  SmallVector<Operation *> dead;
  llvm::SmallPtrSet<Operation *, 16> isDead;
  root->walk<WalkOrder::PostOrder, ReverseIterator>([&](Operation *op) {
    if (isa_and_nonnull<FlyDialect>(op->getDialect()) && isPure(op) &&
        llvm::all_of(op->getUsers(), [&](Operation *user) { return isDead.contains(user); })) {
      dead.push_back(op);
      isDead.insert(op);
    }
  });
  for (Operation *op : dead)
    op->erase();
}
