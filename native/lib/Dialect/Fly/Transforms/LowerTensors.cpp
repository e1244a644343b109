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

/// The fly.make_ptr under a chain of fly.recast_ptr (LLVM pointers are opaque:
/// a recast pointer has the same base, only the GEP element type changes).
/// True if `ptr` comes from a fly.make_ptr through recasts and offsets.
static bool isTraceablePointer(Value ptr) {
  if (auto recast = ptr.getDefiningOp<RecastPtrOp>())
    return isTraceablePointer(recast.getSource());
  if (auto moved = ptr.getDefiningOp<AddOffsetOp>())
    return isTraceablePointer(moved.getPtr());
  return bool(ptr.getDefiningOp<MakePtrOp>());
}

static Value offsetPointer(OpBuilder &builder, Location loc, Value base, Type elementType,
                           Value offset);

/// The LLVM pointer a traceable `ptr` stands for (pointers are opaque: a recast is the same value).
static Value emitPointer(OpBuilder &builder, Location loc, Value ptr) {
  if (auto recast = ptr.getDefiningOp<RecastPtrOp>())
    return emitPointer(builder, loc, recast.getSource());
  if (auto moved = ptr.getDefiningOp<AddOffsetOp>())
    return offsetPointer(builder, loc, emitPointer(builder, loc, moved.getPtr()),
                         moved.getType().getElementType(), moved.getOffset());
  return ptr.getDefiningOp<MakePtrOp>().getPointer();
}

/// True if lowering can find everything `tensor` is built from (checked before
/// any IR is emitted, so that a pattern never fails half way).
static bool isTraceable(Value tensor) {
  if (auto slice = tensor.getDefiningOp<SliceOp>())
    return isTraceable(slice.getTensor());
  auto maker = tensor.getDefiningOp<MakeTensorOp>();
  return maker && isTraceablePointer(maker.getPtr()) && succeeded(getLayoutLeaves(maker.getLayout()));
}

static Value offsetPointer(OpBuilder &builder, Location loc, Value base, Type elementType,
                           Value offset) {
  // index is 64-bit in the NVVM lowering: the element offset never wraps at 2^31.
  Value offset64 = arith::IndexCastOp::create(builder, loc, builder.getI64Type(), offset);
  // A GEP steps by its element type's size; types LLVM has none for (the
  // 8-bit floats) step as the integer of their width.
  if (!LLVM::isCompatibleType(elementType))
    elementType = builder.getIntegerType(elementType.getIntOrFloatBitWidth());
  return LLVM::GEPOp::create(builder, loc, base.getType(), elementType, base,
                             ValueRange{offset64});
}

/// Emits what a traceable tensor's accesses need. A slice adds its fixed
/// coordinates' offset to the pointer, or, under a swizzle, to the composed
/// layout's offset (the swizzle acts on the whole offset).
static TracedTensor traceTensor(OpBuilder &builder, Location loc, Value tensor) {
  if (auto slice = tensor.getDefiningOp<SliceOp>()) {
    TracedTensor source = traceTensor(builder, loc, slice.getTensor());
    IndexEmitter emit(builder, loc);
    TracedTensor result{source.base, source.elementType, {}};
    OpFoldResult fixedOffset = builder.getIndexAttr(0);
    // Under a swizzle, the offset keeps its constant part apart and what its
    // dynamic part is a multiple of (for IndexEmitter::swizzle).
    SplitSum swizzledOffset;
    if (source.layout.swizzle) {
      emit.accumulate(swizzledOffset, source.layout.offset, source.layout.offsetMultiple);
      swizzledOffset.constant += source.layout.offsetConstant;
    }
    auto coord = slice.getCoord().begin();
    for (auto [isFixed, extent, step, multiple] :
         llvm::zip_equal(slice.getFixed(), source.layout.shape, source.layout.stride,
                         source.layout.strideMultiple)) {
      if (isFixed && source.layout.swizzle) {
        emit.accumulateProduct(swizzledOffset, *coord++, step, multiple);
        continue;
      }
      if (isFixed) {
        fixedOffset = emit.add(fixedOffset, emit.mul(*coord++, step));
        continue;
      }
      result.layout.shape.push_back(extent);
      result.layout.stride.push_back(step);
      result.layout.strideMultiple.push_back(multiple);
    }
    if (source.layout.swizzle) {
      result.layout.swizzle = source.layout.swizzle;
      result.layout.offset =
          swizzledOffset.dynamic ? swizzledOffset.dynamic : builder.getIndexAttr(0);
      result.layout.offsetMultiple = swizzledOffset.multiple;
      result.layout.offsetConstant = swizzledOffset.constant;
    } else {
      result.base = offsetPointer(builder, loc, source.base, source.elementType,
                                  emit.materialize(fixedOffset));
    }
    return result;
  }
  auto maker = tensor.getDefiningOp<MakeTensorOp>();
  return TracedTensor{emitPointer(builder, loc, maker.getPtr()),
                      maker.getPtr().getType().getElementType(),
                      *getLayoutLeaves(maker.getLayout())};
}

/// The address of a tensor element: base pointer + layout(coord) elements.
static Value elementAddress(OpBuilder &builder, Location loc, const TracedTensor &tensor,
                            ValueRange coords) {
  IndexEmitter emit(builder, loc);
  return offsetPointer(builder, loc, tensor.base, tensor.elementType,
                       emit.offset(coords, tensor.layout));
}

constexpr const char *kUntraceable =
    "tensor not built by fly.make_tensor/make_ptr/recast_ptr/add_offset/make_layout in this region";

static unsigned elementAlignment(Type elementType) {
  return std::max<unsigned>(1, elementType.getIntOrFloatBitWidth() / 8);
}

/// The address of the element an access op names (load, store, element_address all have
/// getTensor/getCoord), or failure before any IR is emitted.
template <typename OpTy>
static FailureOr<Value> accessAddress(OpTy op, PatternRewriter &rewriter) {
  if (!isTraceable(op.getTensor()))
    return rewriter.notifyMatchFailure(op, kUntraceable);
  TracedTensor tensor = traceTensor(rewriter, op.getLoc(), op.getTensor());
  return elementAddress(rewriter, op.getLoc(), tensor, op.getCoord());
}

struct LowerLoad : OpRewritePattern<LoadOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(LoadOp op, PatternRewriter &rewriter) const override {
    FailureOr<Value> address = accessAddress(op, rewriter);
    if (failed(address))
      return failure();
    rewriter.replaceOpWithNewOp<LLVM::LoadOp>(op, op.getType(), *address,
                                              elementAlignment(op.getType()));
    return success();
  }
};

struct LowerStore : OpRewritePattern<StoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(StoreOp op, PatternRewriter &rewriter) const override {
    FailureOr<Value> address = accessAddress(op, rewriter);
    if (failed(address))
      return failure();
    rewriter.replaceOpWithNewOp<LLVM::StoreOp>(op, op.getValue(), *address,
                                               elementAlignment(op.getValue().getType()));
    return success();
  }
};

/// The address a load at the same coordinate would read.
struct LowerElementAddress : OpRewritePattern<ElementAddressOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ElementAddressOp op, PatternRewriter &rewriter) const override {
    FailureOr<Value> address = accessAddress(op, rewriter);
    if (failed(address))
      return failure();
    rewriter.replaceOp(op, *address);
    return success();
  }
};

// Copies unrolled up to this many accesses; beyond it, an scf.for.
constexpr int64_t kMaxUnrolledAccesses = 64;

struct LowerCopy : OpRewritePattern<CopyOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(CopyOp op, PatternRewriter &rewriter) const override {
    if (!isTraceable(op.getSource()) || !isTraceable(op.getTarget()))
      return rewriter.notifyMatchFailure(op, kUntraceable);
    Location loc = op.getLoc();
    Type elementType = op.getSource().getType().getPtr().getElementType();
    int64_t vector = provenCopyVectorElements(op.getSource().getType(), op.getTarget().getType());
    Type accessType = vector == 1 ? elementType : VectorType::get({vector}, elementType);
    unsigned alignment = vector * elementAlignment(elementType);

    if (Value predicate = op.getPredicate()) {
      auto guarded = scf::IfOp::create(rewriter, loc, predicate, /*withElseRegion=*/false);
      rewriter.setInsertionPoint(guarded.thenBlock()->getTerminator());
    }
    TracedTensor source = traceTensor(rewriter, loc, op.getSource());
    TracedTensor target = traceTensor(rewriter, loc, op.getTarget());
    auto copyChunk = [&](Value coord) {
      Value from = elementAddress(rewriter, loc, source, coord);
      Value to = elementAddress(rewriter, loc, target, coord);
      Value data = LLVM::LoadOp::create(rewriter, loc, accessType, from, alignment);
      LLVM::StoreOp::create(rewriter, loc, data, to, alignment);
    };
    IndexEmitter emit(rewriter, loc);
    OpFoldResult size = rewriter.getIndexAttr(1);
    for (OpFoldResult extent : source.layout.shape)
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
  patterns.add<LowerLoad, LowerStore, LowerElementAddress, LowerCopy>(patterns.getContext());
}
