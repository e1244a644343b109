//===- LowerLayouts.cpp - lower Fly layout ops to arith -------------------===//
//
// Static layouts carry everything in their type, so evaluating one at a
// coordinate is plain index arithmetic. Index is 64-bit after NVVM lowering, so
// offsets beyond 2^31 stay exact.
//
//===----------------------------------------------------------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"

namespace mlir::fly {
#define GEN_PASS_DEF_FLYLOWERLAYOUTS
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"
} // namespace mlir::fly

using namespace mlir;
using namespace mlir::fly;

namespace {

/// crd2idx(coord, shape:stride) = sum_k coord_k * stride_k, with a linear
/// coordinate first split colexicographically over the shape leaves.
struct LowerCrd2Idx : OpRewritePattern<Crd2IdxOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(Crd2IdxOp op, PatternRewriter &rewriter) const override {
    LayoutType layout = op.getLayout().getType();
    if (!layout.isStatic())
      return rewriter.notifyMatchFailure(op, "layout has dynamic leaves");
    SmallVector<int64_t> shape = layout.getShapeLeaves();
    SmallVector<int64_t> stride = layout.getStrideLeaves();
    Location loc = op.getLoc();
    auto constant = [&](int64_t value) -> Value {
      return arith::ConstantIndexOp::create(rewriter, loc, value);
    };

    // One coordinate per leaf; nullptr marks a coordinate known to be 0.
    SmallVector<Value> coords(op.getCoord().begin(), op.getCoord().end());
    if (coords.size() == 1 && shape.size() != 1) {
      Value rest = coords.front();
      coords.assign(shape.size(), nullptr);
      for (size_t k = 0; k < shape.size(); ++k) {
        if (shape[k] == 1)
          continue;
        // The last mode keeps the remainder, as CuTe's idx2crd does.
        if (k + 1 == shape.size()) {
          coords[k] = rest;
          break;
        }
        Value extent = constant(shape[k]);
        coords[k] = arith::RemUIOp::create(rewriter, loc, rest, extent);
        rest = arith::DivUIOp::create(rewriter, loc, rest, extent);
      }
    }

    Value offset;
    for (auto [coord, step] : llvm::zip_equal(coords, stride)) {
      if (!coord || step == 0)
        continue;
      Value term = step == 1 ? coord : arith::MulIOp::create(rewriter, loc, coord, constant(step));
      offset = offset ? arith::AddIOp::create(rewriter, loc, offset, term) : term;
    }
    rewriter.replaceOp(op, offset ? offset : constant(0));
    return success();
  }
};

struct LowerSize : OpRewritePattern<SizeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SizeOp op, PatternRewriter &rewriter) const override {
    std::optional<int64_t> size = op.getLayout().getType().getStaticSize();
    if (!size)
      return rewriter.notifyMatchFailure(op, "layout shape has dynamic leaves");
    rewriter.replaceOpWithNewOp<arith::ConstantIndexOp>(op, *size);
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
    getOperation()->walk([](MakeLayoutOp op) {
      if (op->use_empty())
        op->erase();
    });
  }
};

} // namespace

void mlir::fly::populateFlyLowerLayoutsPatterns(RewritePatternSet &patterns) {
  patterns.add<LowerCrd2Idx, LowerSize>(patterns.getContext());
}
