//===- LowerSmem.cpp - place shared-memory allocations --------------------===//

#include "fly/Dialect/Fly/IR/FlyOps.h"
#include "fly/Dialect/Fly/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/Support/MathExtras.h"

namespace mlir::fly {
#define GEN_PASS_DEF_FLYLOWERSMEM
#include "fly/Dialect/Fly/Transforms/Passes.h.inc"
} // namespace mlir::fly

using namespace mlir;
using namespace mlir::fly;

namespace {

constexpr StringLiteral kSmemSymbol = "__fly_smem";
constexpr StringLiteral kSmemBytesAttr = "fly.smem_bytes";

/// The module-level `[0 x i8]` extern in address space 3 that all allocations index.
static LLVM::GlobalOp getOrCreateSmemGlobal(Operation *symbolTable, int64_t alignment) {
  SymbolTable symbols(symbolTable);
  if (auto global = symbols.lookup<LLVM::GlobalOp>(kSmemSymbol)) {
    if (global.getAlignment().value_or(1) < uint64_t(alignment))
      global.setAlignment(alignment);
    return global;
  }
  OpBuilder builder(symbolTable->getContext());
  builder.setInsertionPointToStart(&symbolTable->getRegion(0).front());
  auto arrayType = LLVM::LLVMArrayType::get(builder.getI8Type(), 0);
  auto global = LLVM::GlobalOp::create(
      builder, symbolTable->getLoc(), arrayType, /*isConstant=*/false, LLVM::Linkage::External,
      kSmemSymbol, /*value=*/Attribute(), alignment, unsigned(AddressSpace::Shared));
  symbols.insert(global);
  return global;
}

struct FlyLowerSmemPass : mlir::fly::impl::FlyLowerSmemBase<FlyLowerSmemPass> {
  void runOnOperation() override {
    getOperation()->walk([&](FunctionOpInterface function) {
      SmallVector<AllocSmemOp> allocations;
      function.walk([&](AllocSmemOp op) { allocations.push_back(op); });
      if (allocations.empty())
        return;
      Operation *symbolTable = SymbolTable::getNearestSymbolTable(function->getParentOp());
      if (!symbolTable) {
        function.emitError("fly.alloc_smem needs the function to be inside a module");
        return signalPassFailure();
      }
      int64_t alignment = 16;
      for (AllocSmemOp op : allocations)
        alignment = std::max(alignment, op.getType().getAlignment());
      LLVM::GlobalOp global = getOrCreateSmemGlobal(symbolTable, alignment);

      int64_t offset = 0;
      for (AllocSmemOp op : allocations) {
        PtrType type = op.getType();
        int64_t elementBytes = llvm::divideCeil(type.getElementType().getIntOrFloatBitWidth(), 8);
        offset = llvm::alignTo(offset, type.getAlignment());
        OpBuilder builder(op);
        Location loc = op.getLoc();
        auto pointerType = LLVM::LLVMPointerType::get(&getContext(), type.getAddressSpace());
        Value base = LLVM::AddressOfOp::create(builder, loc, pointerType, global.getSymName());
        Value address = LLVM::GEPOp::create(builder, loc, pointerType, builder.getI8Type(), base,
                                            ArrayRef<LLVM::GEPArg>{int32_t(offset)});
        op.replaceAllUsesWith(MakePtrOp::create(builder, loc, type, address).getResult());
        offset += op.getCount() * elementBytes;
        op.erase();
      }
      function->setAttr(kSmemBytesAttr, IntegerAttr::get(IntegerType::get(&getContext(), 64),
                                                          offset));
    });
  }
};

} // namespace
