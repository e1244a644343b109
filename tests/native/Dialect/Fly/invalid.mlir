// RUN: %not %fly-opt %s --split 2>&1 | FileCheck %s
// One case per verifier message; each case is parsed on its own (--split).

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout shape (4,8) and stride (1,(4,2)) must be congruent (same nesting)
func.func @not_congruent(%l: !fly.layout<(4,8):(1,(4,2))>) { return }

// -----

// CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: layout shape (4,0) has extent 0 at leaf 1; extents must be >= 1 or '?'
func.func @zero_extent(%l: !fly.layout<(4,0):(1,4)>) { return }

// -----

func.func @dynamic_make_layout() {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.make_layout' op expects a static layout; got '!fly.layout<(?,8):(8,1)>' (dynamic leaves are not supported by this op yet)
  %l = fly.make_layout : !fly.layout<(?,8):(8,1)>
  return
}

// -----

func.func @coordinate_count(%i: index, %l: !fly.layout<((2,2),8):((1,2),4)>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'fly.crd2idx' op expects 1 coordinate (a linear index) or 3 (one per shape leaf) for '!fly.layout<((2,2),8):((1,2),4)>', got 2
  %o = fly.crd2idx(%i, %i), %l : !fly.layout<((2,2),8):((1,2),4)>
  return
}
