//===- LowerTensors.cpp - lower Fly tensor accesses to llvm ---------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/Transforms/IndexEmitter.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"

namespace mlir::fly {
#define GEN_PASS_DEF_FLYLOWERTENSORS
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"
} // namespace mlir::fly

using namespace mlir;
using namespace mlir::fly;

namespace {

/// What lowering a tensor access needs: the LLVM base pointer, the element
/// type and the layout's leaves, all traced to the ops that built the tensor.
struct TracedTensor {
  Value base;
  Type elementType;
  LayoutLeaves layout;
};

static FailureOr<TracedTensor> traceTensor(Value tensor) {
  auto maker = tensor.getDefiningOp<MakeTensorOp>();
  if (!maker)
    return failure();
  auto pointer = maker.getPtr().getDefiningOp<MakePtrOp>();
  FailureOr<LayoutLeaves> layout = getLayoutLeaves(maker.getLayout());
  if (!pointer || failed(layout))
    return failure();
  return TracedTensor{pointer.getPointer(), maker.getPtr().getType().getElementType(),
                      std::move(*layout)};
}

/// The address of a tensor element: base pointer + layout(coord) elements.
static Value elementAddress(OpBuilder &builder, Location loc, const TracedTensor &tensor,
                            ValueRange coords) {
  IndexEmitter emit(builder, loc);
  Value offset = emit.offset(coords, tensor.layout);
  // index is 64-bit in the NVVM lowering: the element offset never wraps at 2^31.
  Value offset64 = arith::IndexCastOp::create(builder, loc, builder.getI64Type(), offset);
  return LLVM::GEPOp::create(builder, loc, tensor.base.getType(), tensor.elementType, tensor.base,
                             ValueRange{offset64});
}

constexpr const char *kUntraceable =
    "tensor not built by fly.make_tensor/make_ptr/make_layout in this region";

static unsigned elementAlignment(Type elementType) {
  return std::max<unsigned>(1, elementType.getIntOrFloatBitWidth() / 8);
}

struct LowerLoad : OpRewritePattern<LoadOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(LoadOp op, PatternRewriter &rewriter) const override {
    FailureOr<TracedTensor> tensor = traceTensor(op.getTensor());
    if (failed(tensor))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    Value address = elementAddress(rewriter, op.getLoc(), *tensor, op.getCoord());
    rewriter.replaceOpWithNewOp<LLVM::LoadOp>(op, op.getType(), address,
                                              elementAlignment(op.getType()));
    return success();
  }
};

struct LowerStore : OpRewritePattern<StoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(StoreOp op, PatternRewriter &rewriter) const override {
    FailureOr<TracedTensor> tensor = traceTensor(op.getTensor());
    if (failed(tensor))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    Value address = elementAddress(rewriter, op.getLoc(), *tensor, op.getCoord());
    rewriter.replaceOpWithNewOp<LLVM::StoreOp>(op, op.getValue(), address,
                                               elementAlignment(op.getValue().getType()));
    return success();
  }
};

// Copies unrolled up to this many accesses; beyond it, an scf.for.
constexpr int64_t kMaxUnrolledAccesses = 64;

struct LowerCopy : OpRewritePattern<CopyOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CopyOp op, PatternRewriter &rewriter) const override {
    FailureOr<TracedTensor> source = traceTensor(op.getSource());
    FailureOr<TracedTensor> target = traceTensor(op.getTarget());
    if (failed(source) || failed(target))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    Location loc = op.getLoc();
    Type elementType = source->elementType;
    int64_t vector = provenCopyVectorElements(op.getSource().getType(), op.getTarget().getType());
    Type accessType = vector == 1 ? elementType : VectorType::get({vector}, elementType);
    unsigned alignment = vector * elementAlignment(elementType);

    if (Value predicate = op.getPredicate()) {
      auto guarded = scf::IfOp::create(rewriter, loc, predicate, /*withElseRegion=*/false);
      rewriter.setInsertionPoint(guarded.thenBlock()->getTerminator());
    }
    auto copyChunk = [&](Value coord) {
      Value from = elementAddress(rewriter, loc, *source, coord);
      Value to = elementAddress(rewriter, loc, *target, coord);
      Value data = LLVM::LoadOp::create(rewriter, loc, accessType, from, alignment);
      LLVM::StoreOp::create(rewriter, loc, data, to, alignment);
    };
    IndexEmitter emit(rewriter, loc);
    OpFoldResult size = rewriter.getIndexAttr(1);
    for (OpFoldResult extent : source->layout.shape)
      size = emit.mul(size, extent);
    std::optional<int64_t> staticSize = getConstantIntValue(size);
    if (staticSize && *staticSize / vector <= kMaxUnrolledAccesses) {
      for (int64_t chunk = 0; chunk < *staticSize / vector; ++chunk)
        copyChunk(arith::ConstantIndexOp::create(rewriter, loc, chunk * vector));
    } else {
      Value zero = arith::ConstantIndexOp::create(rewriter, loc, 0);
      Value step = arith::ConstantIndexOp::create(rewriter, loc, vector);
      auto loop = scf::ForOp::create(rewriter, loc, zero, emit.materialize(size), step);
      rewriter.setInsertionPoint(loop.getBody()->getTerminator());
      copyChunk(loop.getInductionVar());
    }
    rewriter.eraseOp(op);
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
  patterns.add<LowerLoad, LowerStore, LowerCopy>(patterns.getContext());
}
