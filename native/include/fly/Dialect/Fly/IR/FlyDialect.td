//===- FlyDialect.td - the Fly dialect definition -----------*- tablegen -*-===//
//
// Fly carries CuTe layouts in its types so that IR stays readable and passes can
// reason about memory access. The layout algebra itself lives in Python
// (flydsl.layout); this dialect verifies what is cheap to verify, folds and
// lowers.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_DIALECT_TD
#define FLY_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Fly_Dialect : Dialect {
  let name = "fly";
  let summary = "CuTe-style layouts and tensors for GPU kernels";
  let description = [{
    The Fly dialect models CuTe layouts: functions from coordinates to offsets,
    written `shape:stride` in CuTe notation, e.g. `!fly.layout<(4,8):(1,4)>`,
    and tensors (a pointer and a layout). Leaves known only at run time are
    `?`, optionally with a known divisor (`?{div=8}`), and are SSA operands of
    the op that builds the value. `fly-lower-tensors` and `fly-lower-layouts`
    turn everything into `arith` and `llvm` ops.
  }];
  let cppNamespace = "::mlir::fly";
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::LLVM::LLVMDialect"];
  let extraClassDeclaration = [{
    void registerAttributes();
    void registerTypes();
  }];
}

class Fly_Op<string mnemonic, list<Trait> traits = []>
    : Op<Fly_Dialect, mnemonic, traits>;

class Fly_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Fly_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

class Fly_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Fly_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

#endif // FLY_DIALECT_TD
