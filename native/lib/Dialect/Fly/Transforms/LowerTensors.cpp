//===- LowerTensors.cpp - lower Fly tensor accesses to llvm ---------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/Transforms/IndexEmitter.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"

namespace mlir::fly {
#define GEN_PASS_DEF_FLYLOWERTENSORS
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"
} // namespace mlir::fly

using namespace mlir;
using namespace mlir::fly;

namespace {

/// The address of a tensor element: base pointer + layout(coord) elements.
static FailureOr<Value> elementAddress(PatternRewriter &rewriter, Location loc, Value tensor,
                                       ValueRange coords) {
  auto maker = tensor.getDefiningOp<MakeTensorOp>();
  if (!maker)
    return failure();
  auto pointer = maker.getPtr().getDefiningOp<MakePtrOp>();
  FailureOr<LayoutLeaves> layout = getLayoutLeaves(maker.getLayout());
  if (!pointer || failed(layout))
    return failure();
  IndexEmitter emit(rewriter, loc);
  Value offset = emit.offset(coords, *layout);
  // index is 64-bit in the NVVM lowering: the element offset never wraps at 2^31.
  Value offset64 = arith::IndexCastOp::create(rewriter, loc, rewriter.getI64Type(), offset);
  Value base = pointer.getPointer();
  return LLVM::GEPOp::create(rewriter, loc, base.getType(),
                             maker.getPtr().getType().getElementType(), base,
                             ValueRange{offset64})
      .getResult();
}

static unsigned elementAlignment(Type elementType) {
  return std::max<unsigned>(1, elementType.getIntOrFloatBitWidth() / 8);
}

struct LowerLoad : OpRewritePattern<LoadOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(LoadOp op, PatternRewriter &rewriter) const override {
    FailureOr<Value> address = elementAddress(rewriter, op.getLoc(), op.getTensor(), op.getCoord());
    if (failed(address))
      return rewriter.notifyMatchFailure(op, "tensor not built by fly.make_tensor/make_ptr here");
    rewriter.replaceOpWithNewOp<LLVM::LoadOp>(op, op.getType(), *address,
                                              elementAlignment(op.getType()));
    return success();
  }
};

struct LowerStore : OpRewritePattern<StoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(StoreOp op, PatternRewriter &rewriter) const override {
    FailureOr<Value> address = elementAddress(rewriter, op.getLoc(), op.getTensor(), op.getCoord());
    if (failed(address))
      return rewriter.notifyMatchFailure(op, "tensor not built by fly.make_tensor/make_ptr here");
    rewriter.replaceOpWithNewOp<LLVM::StoreOp>(op, op.getValue(), *address,
                                               elementAlignment(op.getValue().getType()));
    return success();
  }
};

struct FlyLowerTensorsPass : mlir::fly::impl::FlyLowerTensorsBase<FlyLowerTensorsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateFlyLowerTensorsPatterns(patterns);
    walkAndApplyPatterns(getOperation(), std::move(patterns));
    eraseDeadFlyValues(getOperation());
  }
};

} // namespace

void mlir::fly::populateFlyLowerTensorsPatterns(RewritePatternSet &patterns) {
  patterns.add<LowerLoad, LowerStore>(patterns.getContext());
}
