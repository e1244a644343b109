//===- FlyAttrs.td - Fly attributes -------------------------*- tablegen -*-===//

#ifndef FLY_ATTRS_TD
#define FLY_ATTRS_TD

include "fly/Dialect/Fly/IR/FlyDialect.td"

def Fly_DynamicLeafAttr : Fly_Attr<"DynamicLeaf", "dyn"> {
  let summary = "an IntTuple leaf known only at run time, with a known divisor";
  let description = [{
    Printed `?` inside Fly types, or `?{div=N}` when the value is known to be
    a multiple of N (what lets passes vectorize copies of dynamic shapes).
  }];
  let parameters = (ins "int64_t":$divisibility);
  let assemblyFormat = "`<` $divisibility `>`";
  let genVerifyDecl = 1;
}

def Fly_SwizzleAttr : Fly_Attr<"Swizzle", "swizzle"> {
  let summary = "CuTe's Swizzle<bits, base, shift>";
  let description = [{
    Maps an offset `x` to `x ^ ((x & mask) >> shift)` where `mask` selects
    `bits` bits starting at bit `base + shift` (for shift >= 0), the XOR that
    spreads shared-memory rows over banks.

    ```mlir
    #fly.swizzle<3,4,3>   // the 128-byte swizzle of 16-bit elements
    ```
  }];
  let parameters = (ins "int32_t":$bits, "int32_t":$base, "int32_t":$shift);
  let assemblyFormat = "`<` $bits `,` $base `,` $shift `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Applies the swizzle to a static offset.
    int64_t apply(int64_t offset) const;
  }];
}

#endif // FLY_ATTRS_TD
