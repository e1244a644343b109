// RUN: %not %fly-opt %s --split 2>&1 | FileCheck %s
// One case per verifier and parser message; each case is parsed on its own (--split).

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout shape (4,8) and stride (1,(4,2)) must be congruent (same nesting)
func.func @not_congruent(%l: !fly.layout<(4,8):(1,(4,2))>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout shape (4,0) has extent 0 at leaf 1; extents must be >= 1 or '?'
func.func @zero_extent(%l: !fly.layout<(4,0):(1,4)>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout (4611686018427387904,4):(1,1) has a static size past int64 (the product of its static extents overflows)
func.func @size_overflow(%l: !fly.layout<(4611686018427387904,4):(1,1)>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout (?,4,4):(1,4611686018427387904,1) reaches offsets past int64 (the sum of (extent - 1) * |stride| overflows)
func.func @reach_overflow(%l: !fly.layout<(?,4,4):(1,4611686018427387904,1)>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: divisibility must be >= 1, got 0
func.func @zero_divisibility(%l: !fly.layout<?{div=0}:1>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: divisibility must be >= 1, got -4
func.func @dyn_attr() attributes {x = #fly.dyn<-4>} { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: swizzle bits and base must be >= 0, got <-1,4,3>
func.func @swizzle_negative() attributes {x = #fly.swizzle<-1, 4, 3>} { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: swizzle |shift| must be >= bits so that the masks do not overlap, got <3,4,2>
func.func @swizzle_overlap(%l: !fly.composed_layout<Sw<3,4,2> o 0 o 8:1>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: swizzle reaches past bit 62: <20,20,30>
func.func @swizzle_wide() attributes {x = #fly.swizzle<20, 20, 30>} { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: unknown address space 'texture'; expected generic, global, shared or register
func.func @bad_space(%p: !fly.ptr<f16, texture, 16>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: pointer alignment must be a power of two >= 1 bytes, got 12
func.func @bad_alignment(%p: !fly.ptr<f16, global, 12>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: pointer alignment must be at most 2^32 bytes (LLVM's largest), got 8589934592
func.func @huge_alignment(%p: !fly.ptr<f32, shared, 8589934592>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: pointer element type must be an integer or float of whole bytes, got '!fly.layout<4:1>'
func.func @bad_element(%p: !fly.ptr<!fly.layout<4:1>, global, 16>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: tensor layout must be !fly.layout or !fly.composed_layout, got 'i32'
func.func @bad_tensor(%t: !fly.tensor<!fly.ptr<f16, global, 16>, i32>) { return }

// -----

func.func @int_tuple_operands(%i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_int_tuple' op expects one index operand per '?' leaf of '!fly.int_tuple<(?,4,?)>': 2, got 1
  %t = fly.make_int_tuple(%i) : !fly.int_tuple<(?,4,?)>
  return
}

// -----

func.func @layout_operands(%i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_layout' op expects one index operand per '?' leaf of '!fly.layout<(?,8):(?,1)>' (1 in the shape, then 1 in the stride), got 1
  %l = fly.make_layout(%i) : !fly.layout<(?,8):(?,1)>
  return
}

// -----

func.func @get_out_of_range(%t: !fly.int_tuple<(4,(?,2))>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.get' path entry 1 is 2 but (?,2) has 2 modes
  %x = fly.get %t[1, 2] : !fly.int_tuple<(4,(?,2))>
  return
}

// -----

func.func @get_empty_path(%t: !fly.int_tuple<(4,?)>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.get' op expects a non-empty path
  %x = fly.get %t[] : !fly.int_tuple<(4,?)>
  return
}

// -----

func.func @coordinate_count(%i: index, %l: !fly.layout<((2,2),8):((1,2),4)>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.crd2idx' op expects 1 coordinate (a linear index) or 3 (one per shape leaf) for '!fly.layout<((2,2),8):((1,2),4)>', got 2
  %o = fly.crd2idx(%i, %i), %l : !fly.layout<((2,2),8):((1,2),4)>
  return
}

// -----

func.func @idx2crd_result(%i: index, %l: !fly.layout<(4,8):(8,1)>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.idx2crd' op result must be '!fly.int_tuple<(?,?)>' (the shape's profile with dynamic leaves), got '!fly.int_tuple<(?,(?,?))>'
  %c = fly.idx2crd(%i), %l : !fly.layout<(4,8):(8,1)> -> !fly.int_tuple<(?,(?,?))>
  return
}

// -----

func.func @composed_inner(%l: !fly.layout<8:1>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_composed_layout' op inner layout '!fly.layout<8:1>' differs from the result's '!fly.layout<8:2>'
  %c = fly.make_composed_layout %l : !fly.layout<8:1> -> !fly.composed_layout<Sw<1,0,1> o 0 o 8:2>
  return
}

// -----

func.func @ptr_space(%raw: !llvm.ptr<3>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_ptr' op address space of '!llvm.ptr<3>' (3) differs from that of '!fly.ptr<f16, global, 16>' (1)
  %p = fly.make_ptr %raw : !llvm.ptr<3> -> !fly.ptr<f16, global, 16>
  return
}

// -----

func.func @load_coordinates(%t: !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.load' op expects 1 coordinate (a linear index) or 2 (one per shape leaf) for '!fly.layout<(4,8):(8,1)>', got 3
  %x = fly.load %t(%i, %i, %i) : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  return
}

// -----

func.func @store_coordinates(%t: !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>, %v: f16) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.store' op expects 1 coordinate (a linear index) or 2 (one per shape leaf) for '!fly.layout<(4,8):(8,1)>', got 0
  fly.store %v, %t() : !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<(4,8):(8,1)>>
  return
}

// -----

func.func @element_address_coordinates(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.element_address' op expects 1 coordinate (a linear index) or 2 (one per shape leaf) for '!fly.layout<(4,8):(8,1)>', got 3
  %a = fly.element_address %t(%i, %i, %i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr<3>
  return
}

// -----

func.func @element_address_space(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.element_address' op result address space 0 differs from that of the tensor's pointer '!fly.ptr<f16, shared, 16>' (3)
  %a = fly.element_address %t(%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<(4,8):(8,1)>> -> !llvm.ptr
  return
}

// -----

func.func @composed_offset_operand(%l: !fly.layout<8:1>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_composed_layout' op expects an offset operand for the '?' offset of '!fly.composed_layout<Sw<1,0,1> o ? o 8:1>'
  %c = fly.make_composed_layout %l : !fly.layout<8:1> -> !fly.composed_layout<Sw<1,0,1> o ? o 8:1>
  return
}

// -----

func.func @composed_static_offset(%l: !fly.layout<8:1>, %o: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_composed_layout' op takes no offset operand: the offset is static in '!fly.composed_layout<Sw<1,0,1> o 4 o 8:1>'
  %c = fly.make_composed_layout %l offset %o : !fly.layout<8:1> -> !fly.composed_layout<Sw<1,0,1> o 4 o 8:1>
  return
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: composed layout offset must be an integer or '?', got (1,2)
func.func @composed_tuple_offset(%l: !fly.composed_layout<Sw<1,0,1> o (1,2) o 8:1>) { return }

// -----

func.func @smem_space() {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.alloc_smem' op result must be a shared-memory pointer, got '!fly.ptr<f32, global, 16>'
  %p = fly.alloc_smem 8 : !fly.ptr<f32, global, 16>
  return
}

// -----

func.func @copy_types(%a: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>, %b: !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<4:1>>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.copy' op element types differ: 'f32' and 'f16'
  fly.copy %a, %b : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>, !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<4:1>>
  return
}

// -----

func.func @copy_sizes(%a: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>, %b: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.copy' op source has 8 elements but target only 4
  fly.copy %a, %b : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>, !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<4:1>>
  return
}

// -----

func.func @slice_fixed_count(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op expects one 'fixed' entry per shape leaf of '!fly.layout<(4,8):(8,1)>' (2), got 1
  %r = fly.slice %t[true](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  return
}

// -----

func.func @slice_coords(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op expects one coordinate per fixed leaf (1), got 2
  %r = fly.slice %t[true, false](%i, %i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  return
}

// -----

func.func @slice_leaves(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op result layout '!fly.layout<8:2>' must have exactly the free leaves of '!fly.layout<(4,8):(8,1)>'
  %r = fly.slice %t[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:2>>
  return
}

// -----

func.func @slice_pointer(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op result pointer '!fly.ptr<f16, global, 16>' must keep the element type and address space of '!fly.ptr<f32, global, 16>'
  %r = fly.slice %t[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f16, global, 16>, !fly.layout<8:1>>
  return
}

// -----

func.func @slice_plain_to_composed(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op slicing a plain layout gives a plain layout, got '!fly.composed_layout<Sw<1,0,1> o ? o 8:1>'
  %r = fly.slice %t[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(8,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.composed_layout<Sw<1,0,1> o ? o 8:1>>
  return
}

// -----

func.func @slice_alignment(%t: !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(6,1)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op result alignment 16 is more than the 8 bytes that the source alignment and the fixed strides prove
  %r = fly.slice %t[true, false](%i) : !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<(4,8):(6,1)>> -> !fly.tensor<!fly.ptr<f32, global, 16>, !fly.layout<8:1>>
  return
}

// -----

func.func @slice_swizzle(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op slicing '!fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>' must keep its swizzle, got '!fly.layout<8:1>'
  %r = fly.slice %t[false, true](%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>> -> !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.layout<8:1>>
  return
}

// -----

func.func @slice_composed_pointer(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op slicing a composed layout keeps the pointer '!fly.ptr<f16, shared, 16>', got '!fly.ptr<f16, shared, 8>'
  %r = fly.slice %t[false, true](%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>> -> !fly.tensor<!fly.ptr<f16, shared, 8>, !fly.composed_layout<Sw<3,3,3> o ? o 8:1>>
  return
}

// -----

func.func @slice_static_offset(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op result offset must be '?' (it depends on the coordinates), got 0
  %r = fly.slice %t[false, true](%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>> -> !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o 8:1>>
  return
}

// -----

func.func @slice_offset_divisor(%t: !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>>, %i: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.slice' op result offset ?{div=16} claims a divisor the fixed strides do not prove (at most 8)
  %r = fly.slice %t[false, true](%i) : !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o 0 o (8,64):(1,8)>> -> !fly.tensor<!fly.ptr<f16, shared, 16>, !fly.composed_layout<Sw<3,3,3> o ?{div=16} o 8:1>>
  return
}

// -----

func.func @recast_space(%p: !fly.ptr<f16, global, 16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.recast_ptr' op recast keeps the address space: '!fly.ptr<f16, global, 16>' and '!fly.ptr<i32, shared, 16>' differ
  %q = fly.recast_ptr %p : !fly.ptr<f16, global, 16> -> !fly.ptr<i32, shared, 16>
  return
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: pointer element type must be an integer or float of whole bytes, got 'vector<8xf16>'
func.func @vector_element(%p: !fly.ptr<vector<8xf16>, global, 16>) { return }

// -----

func.func @recast_more_aligned(%p: !fly.ptr<f16, global, 4>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.recast_ptr' op result alignment 16 is more than the source's 4
  %q = fly.recast_ptr %p : !fly.ptr<f16, global, 4> -> !fly.ptr<i32, global, 16>
  return
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: pointer alignment 2 is less than the 4 bytes of 'i32' (accesses assume aligned elements)
func.func @misaligned_elements(%p: !fly.ptr<i32, global, 2>) { return }

// -----

func.func @add_offset_type(%p: !fly.ptr<f16, global, 16>, %o: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.add_offset' op result '!fly.ptr<f32, global, 4>' must keep the element type and address space of '!fly.ptr<f16, global, 16>'
  %q = fly.add_offset %p, %o : !fly.ptr<f16, global, 16> -> !fly.ptr<f32, global, 4>
  return
}

// -----

func.func @add_offset_more_aligned(%p: !fly.ptr<f16, global, 4>, %o: index) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.add_offset' op result alignment 16 is more than the source's 4
  %q = fly.add_offset %p, %o : !fly.ptr<f16, global, 4> -> !fly.ptr<f16, global, 16>
  return
}

// -----

func.func @add_offset_constant(%p: !fly.ptr<f16, global, 16>) {
  %c3 = arith.constant 3 : index
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.add_offset' op result alignment 8 is more than the 2 bytes that offset 3 keeps
  %q = fly.add_offset %p, %c3 : !fly.ptr<f16, global, 16> -> !fly.ptr<f16, global, 8>
  return
}
