//===- FlyLayoutOps.td - IntTuple and layout ops ------------*- tablegen -*-===//

#ifndef FLY_LAYOUT_OPS_TD
#define FLY_LAYOUT_OPS_TD

include "fly/Dialect/Fly/IR/FlyTypes.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Fly_AnyLayout : AnyTypeOf<[Fly_LayoutType, Fly_ComposedLayoutType], "a Fly layout">;

def Fly_MakeIntTupleOp : Fly_Op<"make_int_tuple", [Pure]> {
  let summary = "builds an IntTuple value from its dynamic leaves";
  let description = [{
    One index operand per `?` leaf of the result type, in colexicographic order.

    ```mlir
    %t = fly.make_int_tuple(%m, %n) : !fly.int_tuple<(?,(4,?))>
    %c = fly.make_int_tuple() : !fly.int_tuple<(2,3)>
    ```
  }];
  let arguments = (ins Variadic<Index>:$dynamicLeaves);
  let results = (outs Fly_IntTupleType:$result);
  let assemblyFormat = "`(` $dynamicLeaves `)` attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_MakeLayoutOp : Fly_Op<"make_layout", [Pure]> {
  let summary = "builds a layout value from its dynamic shape and stride leaves";
  let description = [{
    One index operand per `?` leaf: first those of the shape, then those of the
    stride, each in colexicographic order. The result type comes from the
    tracer, which computes layouts with flydsl.layout.

    ```mlir
    %l = fly.make_layout : !fly.layout<(4,8):(8,1)>
    %d = fly.make_layout(%m, %ld) : !fly.layout<(?,8):(?,1)>
    ```
  }];
  let arguments = (ins Variadic<Index>:$dynamicLeaves);
  let results = (outs Fly_LayoutType:$result);
  let assemblyFormat = "(`(` $dynamicLeaves^ `)`)? attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_MakeComposedLayoutOp : Fly_Op<"make_composed_layout", [Pure]> {
  let summary = "composes a swizzle and an offset (from the result type) with a layout value";
  let description = [{
    A dynamic offset (`?` in the result type) is given as an operand.

    ```mlir
    %s = fly.make_composed_layout %l : !fly.layout<(8,64):(64,1)> -> !fly.composed_layout<Sw<3,4,3> o 0 o (8,64):(64,1)>
    %t = fly.make_composed_layout %l offset %o : !fly.layout<8:1> -> !fly.composed_layout<Sw<3,4,3> o ?{div=8} o 8:1>
    ```
  }];
  let arguments = (ins Fly_LayoutType:$inner, Optional<Index>:$offset);
  let results = (outs Fly_ComposedLayoutType:$result);
  let assemblyFormat = [{
    $inner (`offset` $offset^)? attr-dict `:` qualified(type($inner)) `->` qualified(type($result))
  }];
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
  let arguments = (ins Fly_AnyLayout:$layout);
  let results = (outs Index:$result);
  let assemblyFormat = "$layout attr-dict `:` qualified(type($layout))";
  let hasFolder = 1;
}

def Fly_RankOp : Fly_Op<"rank", [Pure]> {
  let summary = "number of top-level modes of a layout's shape (always static)";
  let description = [{
    ```mlir
    %r = fly.rank %l : !fly.layout<((2,4),8):((1,16),2)>   // 2
    ```
  }];
  let arguments = (ins Fly_LayoutType:$layout);
  let results = (outs Index:$result);
  let assemblyFormat = "$layout attr-dict `:` qualified(type($layout))";
  let hasFolder = 1;
}

class Fly_LayoutPartOp<string mnemonic, string part>
    : Fly_Op<mnemonic, [Pure, InferTypeOpAdaptor]> {
  let summary = "the " # part # " of a layout as an IntTuple value";
  let description = [{
    ```mlir
    %s = fly.get_}] # part # [{ %l : !fly.layout<(?,8):(8,1)>
    ```
  }];
  let arguments = (ins Fly_LayoutType:$layout);
  let results = (outs Fly_IntTupleType:$result);
  let assemblyFormat = "$layout attr-dict `:` qualified(type($layout))";
}

def Fly_GetShapeOp : Fly_LayoutPartOp<"get_shape", "shape">;
def Fly_GetStrideOp : Fly_LayoutPartOp<"get_stride", "stride">;

def Fly_GetOp : Fly_Op<"get", [Pure, InferTypeOpAdaptor]> {
  let summary = "selects a (nested) mode of an IntTuple";
  let description = [{
    `path` indexes one level per entry. Selecting a leaf gives an `index`,
    anything else an IntTuple.

    ```mlir
    %m = fly.get %t[0] : !fly.int_tuple<(?,(4,?))>      // index
    %k = fly.get %t[1] : !fly.int_tuple<(?,(4,?))>      // !fly.int_tuple<(4,?)>
    ```
  }];
  let arguments = (ins Fly_IntTupleType:$tuple, DenseI64ArrayAttr:$path);
  let results = (outs AnyTypeOf<[Index, Fly_IntTupleType]>:$result);
  let assemblyFormat = "$tuple `` $path attr-dict `:` qualified(type($tuple))";
  let hasVerifier = 1;
}

def Fly_Crd2IdxOp : Fly_Op<"crd2idx", [Pure]> {
  let summary = "evaluates a layout at a coordinate";
  let description = [{
    Maps a coordinate to an offset through the layout. The coordinate is either
    one index, read colexicographically over the whole shape (CuTe's `L(i)`),
    or one index per shape leaf in flattened order. Composed layouts apply
    their swizzle to `offset + inner(coord)`.

    ```mlir
    %off = fly.crd2idx(%i), %l : !fly.layout<(4,8):(8,1)>
    %off2 = fly.crd2idx(%m, %n), %l : !fly.layout<(4,8):(8,1)>
    ```
  }];
  let arguments = (ins Variadic<Index>:$coord, Fly_AnyLayout:$layout);
  let results = (outs Index:$result);
  let assemblyFormat = [{
    `(` $coord `)` `,` $layout attr-dict `:` qualified(type($layout))
  }];
  let hasVerifier = 1;
}

def Fly_Idx2CrdOp : Fly_Op<"idx2crd", [Pure]> {
  let summary = "the coordinate of a linear index in a layout's shape";
  let description = [{
    Splits `index` colexicographically over the shape (the last mode keeps the
    remainder, as in CuTe). The result has the shape's profile with every leaf
    dynamic.

    ```mlir
    %c = fly.idx2crd(%tid), %l : !fly.layout<(4,8):(8,1)> -> !fly.int_tuple<(?,?)>
    ```
  }];
  let arguments = (ins Index:$index, Fly_LayoutType:$layout);
  let results = (outs Fly_IntTupleType:$result);
  let assemblyFormat = [{
    `(` $index `)` `,` $layout attr-dict `:` qualified(type($layout)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def Fly_ApplySwizzleOp : Fly_Op<"apply_swizzle", [Pure, AllTypesMatch<["offset", "result"]>]> {
  let summary = "applies a swizzle to an offset";
  let description = [{
    ```mlir
    %y = fly.apply_swizzle %x, <3,4,3> : index
    ```
  }];
  let arguments = (ins Index:$offset, Fly_SwizzleAttr:$swizzle);
  let results = (outs Index:$result);
  let assemblyFormat = "$offset `,` $swizzle attr-dict `:` type($result)";
  let hasFolder = 1;
}

#endif // FLY_LAYOUT_OPS_TD
