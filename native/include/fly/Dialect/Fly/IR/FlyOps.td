//===- FlyOps.td - Fly operations ---------------------------*- tablegen -*-===//

#ifndef FLY_OPS_TD
#define FLY_OPS_TD

include "fly/Dialect/Fly/IR/FlyTypes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Fly_MakeLayoutOp : Fly_Op<"make_layout", [Pure]> {
  let summary = "materializes a static layout as a value";
  let description = [{
    Produces a value of a fully static layout type. Dynamic leaves are not
    accepted yet: they need operands, which come with the dynamic-layout ops.

    ```mlir
    %l = fly.make_layout : !fly.layout<(4,8):(8,1)>
    ```
  }];
  let results = (outs Fly_LayoutType:$result);
  let assemblyFormat = "attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_SizeOp : Fly_Op<"size", [Pure]> {
  let summary = "number of coordinates in the domain of a layout";
  let description = [{
    The product of the layout's shape. Folds to a constant for static shapes.

    ```mlir
    %n = fly.size %l : !fly.layout<(4,8):(8,1)>   // 32
    ```
  }];
  let arguments = (ins Fly_LayoutType:$layout);
  let results = (outs Index:$result);
  let assemblyFormat = "$layout attr-dict `:` qualified(type($layout))";
  let hasFolder = 1;
}

def Fly_Crd2IdxOp : Fly_Op<"crd2idx", [Pure]> {
  let summary = "evaluates a layout at a coordinate";
  let description = [{
    Maps a coordinate to an offset through the layout. The coordinate is either
    one index, read colexicographically over the whole shape (CuTe's `L(i)`),
    or one index per shape leaf in flattened order.

    ```mlir
    %off = fly.crd2idx(%i), %l : !fly.layout<(4,8):(8,1)>
    %off2 = fly.crd2idx(%m, %n), %l : !fly.layout<(4,8):(8,1)>
    ```
  }];
  let arguments = (ins Variadic<Index>:$coord, Fly_LayoutType:$layout);
  let results = (outs Index:$result);
  let assemblyFormat = [{
    `(` $coord `)` `,` $layout attr-dict `:` qualified(type($layout))
  }];
  let hasVerifier = 1;
}

#endif // FLY_OPS_TD
