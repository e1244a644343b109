//===- FlyTypes.td - Fly types ------------------------------*- tablegen -*-===//

#ifndef FLY_TYPES_TD
#define FLY_TYPES_TD

include "fly/Dialect/Fly/IR/FlyDialect.td"
include "mlir/IR/AttrTypeBase.td"

class Fly_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Fly_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def Fly_LayoutType : Fly_Type<"Layout", "layout"> {
  let summary = "a CuTe layout (shape:stride) printed in CuTe notation";
  let description = [{
    A layout maps a coordinate in `shape` to the offset `sum(coord_i * stride_i)`.
    Shape and stride are congruent IntTuples: an integer, `?` for a value only
    known at run time, or a parenthesized tuple of IntTuples.

    Example:

    ```mlir
    !fly.layout<(4,8):(1,4)>
    !fly.layout<((2,4),8):((1,16),2)>
    !fly.layout<(?,8):(8,1)>
    ```

    Each IntTuple is stored as an `IntegerAttr` (i64; `?` is
    `ShapedType::kDynamic`) or an `ArrayAttr` of IntTuples.
  }];
  let parameters = (ins "::mlir::Attribute":$shape, "::mlir::Attribute":$stride);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Number of top-level modes (1 for an integer shape).
    int64_t getRank() const;
    /// Shape and stride leaves in colexicographic (flattened) order.
    ::llvm::SmallVector<int64_t> getShapeLeaves() const;
    ::llvm::SmallVector<int64_t> getStrideLeaves() const;
    /// True when no leaf of shape or stride is dynamic.
    bool isStatic() const;
    /// Product of the shape, when every shape leaf is static.
    ::std::optional<int64_t> getStaticSize() const;
  }];
}

#endif // FLY_TYPES_TD
