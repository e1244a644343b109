//===- FlyDialect.td - the Fly dialect definition -----------*- tablegen -*-===//
//
// Fly carries CuTe layouts in its types so that IR stays readable and passes can
// reason about memory access. The layout algebra itself lives in Python
// (flydsl.layout); this dialect verifies, folds and lowers.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_DIALECT_TD
#define FLY_DIALECT_TD

include "mlir/IR/OpBase.td"

def Fly_Dialect : Dialect {
  let name = "fly";
  let summary = "CuTe-style layouts and tensors for GPU kernels";
  let description = [{
    The Fly dialect models CuTe layouts: functions from coordinates to offsets,
    written `shape:stride` in CuTe notation, e.g. `!fly.layout<(4,8):(1,4)>`.
    Ops build layouts and evaluate them; the `fly-lower-layouts` pass turns
    them into `arith` index arithmetic.
  }];
  let cppNamespace = "::mlir::fly";
  let useDefaultTypePrinterParser = 1;
  let hasConstantMaterializer = 1;
  let dependentDialects = ["::mlir::arith::ArithDialect"];
  let extraClassDeclaration = [{
    void registerTypes();
  }];
}

class Fly_Op<string mnemonic, list<Trait> traits = []>
    : Op<Fly_Dialect, mnemonic, traits>;

#endif // FLY_DIALECT_TD
