//===- FlyTypes.td - Fly types ------------------------------*- tablegen -*-===//

#ifndef FLY_TYPES_TD
#define FLY_TYPES_TD

include "fly/Dialect/Fly/IR/FlyAttrs.td"

// IntTuples (shapes, strides, coordinates) are stored as attributes: an i64
// IntegerAttr (a static leaf), a #fly.dyn (a dynamic leaf) or an ArrayAttr of
// IntTuples. Dynamic leaves are counted in colexicographic (flattened) order;
// the op that builds a value takes one index operand per dynamic leaf.

def Fly_IntTupleType : Fly_Type<"IntTuple", "int_tuple"> {
  let summary = "a CuTe IntTuple value: nested integers, some known only at run time";
  let description = [{
    ```mlir
    !fly.int_tuple<(4,(?,2))>
    !fly.int_tuple<?{div=16}>
    ```
  }];
  let parameters = (ins "::mlir::Attribute":$value);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Number of leaves that are `?`.
    int64_t getNumDynamicLeaves() const;
  }];
}

def Fly_LayoutType : Fly_Type<"Layout", "layout"> {
  let summary = "a CuTe layout (shape:stride) printed in CuTe notation";
  let description = [{
    A layout maps a coordinate in `shape` to the offset `sum(coord_i * stride_i)`.
    Shape and stride are congruent IntTuples.

    ```mlir
    !fly.layout<(4,8):(1,4)>
    !fly.layout<((2,4),8):((1,16),2)>
    !fly.layout<(?,8):(8,1)>
    !fly.layout<(?{div=16},?):(1,?{div=16})>
    ```
  }];
  let parameters = (ins "::mlir::Attribute":$shape, "::mlir::Attribute":$stride);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Number of top-level modes (1 for an integer shape).
    int64_t getRank() const;
    /// Shape and stride leaves in colexicographic order; nullopt is `?`.
    ::llvm::SmallVector<::std::optional<int64_t>> getShapeLeaves() const;
    ::llvm::SmallVector<::std::optional<int64_t>> getStrideLeaves() const;
    int64_t getNumDynamicShapeLeaves() const;
    int64_t getNumDynamicStrideLeaves() const;
    /// True when no leaf of shape or stride is dynamic.
    bool isStatic() const;
    /// Product of the shape, when every shape leaf is static.
    ::std::optional<int64_t> getStaticSize() const;
    /// Prints `shape:stride` (no `!fly.layout<>` around it).
    void printBody(::llvm::raw_ostream &os) const;
    static ::mlir::FailureOr<LayoutType> parseBody(::mlir::AsmParser &parser);
  }];
}

def Fly_ComposedLayoutType : Fly_Type<"ComposedLayout", "composed_layout"> {
  let summary = "a swizzle composed with an offset and a layout: Sw<b,m,s> o off o L";
  let description = [{
    Evaluates as `swizzle(offset + inner(coord))`: CuTe's ComposedLayout with a
    swizzle outside, the form shared-memory layouts take. The offset is a
    leaf: static, or `?` (known only at run time, e.g. after slicing a thread's
    part out of a swizzled tile) with a known divisor.

    ```mlir
    !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>
    !fly.composed_layout<Sw<3,4,3> o ?{div=8} o 8:1>
    ```
  }];
  let parameters = (ins "SwizzleAttr":$swizzle, "::mlir::Attribute":$offset, "LayoutType":$inner);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Fly_PtrType : Fly_Type<"Ptr", "ptr"> {
  let summary = "a typed pointer with an address space and a known alignment";
  let description = [{
    The address space is `generic`, `global`, `shared` or `register` (LLVM
    address spaces 0, 1, 3 and 5); the alignment is in bytes, a promise that
    lets copies be vectorized.

    ```mlir
    !fly.ptr<f16, global, 16>
    ```
  }];
  let parameters = (ins "::mlir::Type":$elementType, "unsigned":$addressSpace,
                        "int64_t":$alignment);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Fly_TensorType : Fly_Type<"Tensor", "tensor"> {
  let summary = "a pointer and a layout: element (coord) is at ptr + layout(coord)";
  let description = [{
    ```mlir
    !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(?,8):(8,1)>>
    ```
  }];
  let parameters = (ins "PtrType":$ptr, "::mlir::Type":$layout);
  let assemblyFormat = "`<` qualified($ptr) `,` $layout `>`";
  let genVerifyDecl = 1;
}

#endif // FLY_TYPES_TD
