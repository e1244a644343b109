//===- FlyTensorOps.td - pointer and tensor ops -------------*- tablegen -*-===//

#ifndef FLY_TENSOR_OPS_TD
#define FLY_TENSOR_OPS_TD

include "fly/Dialect/Fly/IR/FlyTypes.td"
include "mlir/Dialect/LLVMIR/LLVMOpBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Fly_MakePtrOp : Fly_Op<"make_ptr", [Pure]> {
  let summary = "types an LLVM pointer with an element type and an alignment";
  let description = [{
    The address spaces must agree. The alignment is a promise made by the
    caller: the DSL compiles a kernel for the alignment its tensor arguments
    have (it is part of the specialization), so the promise holds there;
    hand-written IR launched directly must keep it itself.

    ```mlir
    %p = fly.make_ptr %arg0 : !llvm.ptr<1> -> !fly.ptr<f16, global, 16>
    ```
  }];
  let arguments = (ins LLVM_AnyPointer:$pointer);
  let results = (outs Fly_PtrType:$result);
  let assemblyFormat = "$pointer attr-dict `:` qualified(type($pointer)) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_RecastPtrOp : Fly_Op<"recast_ptr", [Pure]> {
  let summary = "the same address as a pointer to another element type";
  let description = [{
    The address space stays; the result may claim at most the source's
    alignment and at least its own element's size (accesses assume elements
    are naturally aligned). Element types are integers or floats of whole
    bytes. This is the pointer half of CuTe's `recast`: a recast tensor is
    `fly.make_tensor(fly.recast_ptr(p), L')`, with `L'` computed by the
    tracer (`flydsl.layout.recast_layout`), so that 8 f16 become 4 i32.

    ```mlir
    %q = fly.recast_ptr %p : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, global, 16>
    ```
  }];
  let arguments = (ins Fly_PtrType:$source);
  let results = (outs Fly_PtrType:$result);
  let assemblyFormat = "$source attr-dict `:` qualified(type($source)) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_AddOffsetOp : Fly_Op<"add_offset", [Pure]> {
  let summary = "moves a pointer by a number of elements";
  let description = [{
    The result's alignment is a promise of the tracer, which knows what the
    offset is a multiple of; it may not exceed the source's. When the offset is
    a constant, the verifier checks the promise.

    ```mlir
    %q = fly.add_offset %p, %off : !fly.ptr<f16, global, 16> -> !fly.ptr<f16, global, 2>
    ```
  }];
  let arguments = (ins Fly_PtrType:$ptr, Index:$offset);
  let results = (outs Fly_PtrType:$result);
  let assemblyFormat = "$ptr `,` $offset attr-dict `:` qualified(type($ptr)) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_MakeTensorOp : Fly_Op<"make_tensor", [Pure,
    TypesMatchWith<"pointer is the result's", "result", "ptr",
                   "::llvm::cast<::mlir::fly::TensorType>($_self).getPtr()">,
    TypesMatchWith<"layout is the result's", "result", "layout",
                   "::llvm::cast<::mlir::fly::TensorType>($_self).getLayout()">]> {
  let summary = "a tensor from a pointer and a layout";
  let description = [{
    ```mlir
    %t = fly.make_tensor %p, %l : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(?,8):(8,1)>>
    ```
  }];
  let arguments = (ins Fly_PtrType:$ptr, Fly_AnyLayout:$layout);
  let results = (outs Fly_TensorType:$result);
  let assemblyFormat = "$ptr `,` $layout attr-dict `:` qualified(type($result))";
}

def Fly_SliceOp : Fly_Op<"slice", [Pure]> {
  let summary = "the sub-tensor where some coordinate leaves are fixed (CuTe's slice with `_`)";
  let description = [{
    `fixed` has one entry per shape leaf of the source (colexicographic order);
    the fixed leaves take the operands in order, the free ones form the result.
    The result type comes from the tracer (the free modes' nesting is its
    choice); the verifier checks that its leaves are the free leaves, and that
    the alignment (plain layouts: the pointer moves by the fixed offset) or the
    offset divisor (composed layouts: the offset moves inside the swizzle)
    claimed by the result follows from the fixed strides. This is the
    primitive under `local_tile` and `local_partition`: the tracer first makes
    a tensor of the same pointer with the divided layout that the algebra
    computes (`fly.make_tensor`), then slices it.

    ```mlir
    %row = fly.slice %t[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(?,8):(8,1)>>
                                         -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
    ```
  }];
  let arguments = (ins Fly_TensorType:$tensor, Variadic<Index>:$coord, DenseBoolArrayAttr:$fixed);
  let results = (outs Fly_TensorType:$result);
  let assemblyFormat = [{
    $tensor `` $fixed `(` $coord `)` attr-dict `:` qualified(type($tensor)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def Fly_LoadOp : Fly_Op<"load", [MemoryEffects<[MemRead]>,
    TypesMatchWith<"result is the tensor's element type", "tensor", "result",
                   "::llvm::cast<::mlir::fly::TensorType>($_self).getPtr().getElementType()">]> {
  let summary = "loads the element of a tensor at a coordinate";
  let description = [{
    The coordinate is read as by `fly.crd2idx` on the tensor's layout.

    ```mlir
    %v = fly.load %t(%i, %j) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
    ```
  }];
  let arguments = (ins Fly_TensorType:$tensor, Variadic<Index>:$coord);
  let results = (outs AnyType:$result);
  let assemblyFormat = "$tensor `(` $coord `)` attr-dict `:` qualified(type($tensor))";
  let hasVerifier = 1;
}

def Fly_StoreOp : Fly_Op<"store", [MemoryEffects<[MemWrite]>,
    TypesMatchWith<"value is the tensor's element type", "tensor", "value",
                   "::llvm::cast<::mlir::fly::TensorType>($_self).getPtr().getElementType()">]> {
  let summary = "stores an element of a tensor at a coordinate";
  let description = [{
    ```mlir
    fly.store %v, %t(%i) : !fly.tensor<!fly.ptr<f32, global, 4>, !fly.layout<?:1>>
    ```
  }];
  let arguments = (ins AnyType:$value, Fly_TensorType:$tensor, Variadic<Index>:$coord);
  let assemblyFormat = "$value `,` $tensor `(` $coord `)` attr-dict `:` qualified(type($tensor))";
  let hasVerifier = 1;
}

def Fly_ElementAddressOp : Fly_Op<"element_address", [Pure]> {
  let summary = "the LLVM pointer of a tensor element";
  let description = [{
    The address of the element at a coordinate (read as by `fly.load`), in
    the address space of the tensor's pointer: what instructions that take
    addresses need (ldmatrix, cp.async, TMA, mbarriers). It lowers exactly as
    a load's address does, so it works for tensors whose memory is placed by
    the compiler (`fly.alloc_smem`), through `fly.slice`, `fly.add_offset`,
    `fly.recast_ptr` and swizzled layouts.

    ```mlir
    %a = fly.element_address %t(%i, %j) : !fly.tensor<!fly.ptr<bf16, shared, 128>, !fly.layout<(64,32):(40,1)>> -> !llvm.ptr<3>
    ```
  }];
  let arguments = (ins Fly_TensorType:$tensor, Variadic<Index>:$coord);
  let results = (outs LLVM_AnyPointer:$result);
  let assemblyFormat = [{
    $tensor `(` $coord `)` attr-dict `:` qualified(type($tensor)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def Fly_AllocSmemOp : Fly_Op<"alloc_smem", [MemoryEffects<[MemAlloc]>]> {
  let summary = "reserves shared memory for `count` elements of the pointer's element type";
  let description = [{
    `fly-lower-smem` gives every allocation of a kernel its own offset in the
    kernel's dynamic shared memory (aligned as the result type says) and
    records the total in the kernel's `fly.smem_bytes` attribute, which the
    launcher uses as the launch's shared-memory size.

    ```mlir
    %a = fly.alloc_smem 4096 : !fly.ptr<bf16, shared, 128>
    ```
  }];
  let arguments = (ins ConfinedAttr<I64Attr, [IntPositive]>:$count);
  let results = (outs Fly_PtrType:$result);
  let assemblyFormat = "$count attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Fly_CopyOp : Fly_Op<"copy", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "copies a tensor element by element, vectorized as far as the layouts prove";
  let description = [{
    `target(i) = source(i)` for every linear coordinate `i < size(source)`.
    The lowering picks the widest access (up to 16 bytes) that both layouts,
    the pointers' alignments and the known divisors of dynamic leaves prove
    safe; nobody passes a width. With `if %p`, nothing is copied when `%p` is
    false.

    ```mlir
    fly.copy %src, %dst : !fly.tensor<...>, !fly.tensor<...>
    fly.copy %src, %dst if %in_bounds : !fly.tensor<...>, !fly.tensor<...>
    ```
  }];
  let arguments = (ins Fly_TensorType:$source, Fly_TensorType:$target, Optional<I1>:$predicate);
  let assemblyFormat = [{
    $source `,` $target (`if` $predicate^)? attr-dict `:` qualified(type($source)) `,` qualified(type($target))
  }];
  let hasVerifier = 1;
}

#endif // FLY_TENSOR_OPS_TD
