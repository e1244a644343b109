module attributes {gpu.container_module} {
  gpu.module @vector_add_module [#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx80">] {
    gpu.func @vector_add(%arg0: !llvm.ptr<1>, %arg1: i64, %arg2: !llvm.ptr<1>, %arg3: i64, %arg4: !llvm.ptr<1>, %arg5: i64, %arg6: i32) kernel {
      %c1_i32 = arith.constant 1 : i32
      %0 = llvm.alloca %c1_i32 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %c1_i32_0 = arith.constant 1 : i32
      %1 = llvm.alloca %c1_i32_0 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %c1_i32_1 = arith.constant 1 : i32
      %2 = llvm.alloca %c1_i32_1 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %3 = arith.index_cast %arg1 : i64 to index
      %4 = arith.index_cast %arg3 : i64 to index
      %5 = arith.index_cast %arg5 : i64 to index
      %6 = nvvm.read.ptx.sreg.tid.x : i32
      %7 = nvvm.read.ptx.sreg.ctaid.x : i32
      %c256_i32 = arith.constant 256 : i32
      %8 = arith.muli %7, %c256_i32 : i32
      %9 = arith.addi %6, %8 : i32
      %c1 = arith.constant 1 : index
      %10 = arith.subi %3, %c1 : index
      %c1_2 = arith.constant 1 : index
      %11 = arith.addi %10, %c1_2 : index
      %12 = arith.index_cast %11 : index to i64
      %c4_i64 = arith.constant 4 : i64
      %13 = arith.muli %12, %c4_i64 : i64
      %c1_3 = arith.constant 1 : index
      %14 = arith.subi %4, %c1_3 : index
      %c1_4 = arith.constant 1 : index
      %15 = arith.addi %14, %c1_4 : index
      %16 = arith.index_cast %15 : index to i64
      %c4_i64_5 = arith.constant 4 : i64
      %17 = arith.muli %16, %c4_i64_5 : i64
      %c1_6 = arith.constant 1 : index
      %18 = arith.subi %5, %c1_6 : index
      %c1_7 = arith.constant 1 : index
      %19 = arith.addi %18, %c1_7 : index
      %20 = arith.index_cast %19 : index to i64
      %c4_i64_8 = arith.constant 4 : i64
      %21 = arith.muli %20, %c4_i64_8 : i64
      %c4_i32 = arith.constant 4 : i32
      %22 = arith.muli %9, %c4_i32 : i32
      %23 = arith.extsi %22 : i32 to i64
      %c4_i64_9 = arith.constant 4 : i64
      %24 = arith.addi %23, %c4_i64_9 : i64
      %c4_i64_10 = arith.constant 4 : i64
      %25 = arith.muli %24, %c4_i64_10 : i64
      %c0_i64 = arith.constant 0 : i64
      %26 = arith.cmpi sge, %23, %c0_i64 : i64
      %27 = arith.cmpi sle, %25, %13 : i64
      %28 = arith.andi %26, %27 : i1
      %29 = scf.if %28 -> (vector<4xf32>) {
        %50 = arith.index_cast %22 : i32 to index
        %51 = arith.index_cast %50 : index to i64
        %52 = llvm.getelementptr %arg0[%51] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_20 = arith.constant 0 : index
        %53 = arith.index_cast %c0_20 : index to i64
        %54 = llvm.getelementptr %52[%53] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0_21 = arith.constant 0 : index
        %55 = arith.index_cast %c0_21 : index to i64
        %56 = llvm.getelementptr %2[%55] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %57 = llvm.load %54 {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
        llvm.store %57, %56 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %58 = llvm.load %2 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        scf.yield %58 : vector<4xf32>
      } else {
        %c0_i32 = arith.constant 0 : i32
        %50 = arith.addi %22, %c0_i32 : i32
        %51 = arith.extsi %50 : i32 to i64
        %c1_i64 = arith.constant 1 : i64
        %52 = arith.addi %51, %c1_i64 : i64
        %c4_i64_20 = arith.constant 4 : i64
        %53 = arith.muli %52, %c4_i64_20 : i64
        %c0_i64_21 = arith.constant 0 : i64
        %54 = arith.cmpi sge, %51, %c0_i64_21 : i64
        %55 = arith.cmpi sle, %53, %13 : i64
        %56 = arith.andi %54, %55 : i1
        %57 = scf.if %56 -> (f32) {
          %83 = arith.index_cast %50 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg0[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c1_i32_22 = arith.constant 1 : i32
        %58 = arith.addi %22, %c1_i32_22 : i32
        %59 = arith.extsi %58 : i32 to i64
        %c1_i64_23 = arith.constant 1 : i64
        %60 = arith.addi %59, %c1_i64_23 : i64
        %c4_i64_24 = arith.constant 4 : i64
        %61 = arith.muli %60, %c4_i64_24 : i64
        %c0_i64_25 = arith.constant 0 : i64
        %62 = arith.cmpi sge, %59, %c0_i64_25 : i64
        %63 = arith.cmpi sle, %61, %13 : i64
        %64 = arith.andi %62, %63 : i1
        %65 = scf.if %64 -> (f32) {
          %83 = arith.index_cast %58 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg0[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c2_i32 = arith.constant 2 : i32
        %66 = arith.addi %22, %c2_i32 : i32
        %67 = arith.extsi %66 : i32 to i64
        %c1_i64_26 = arith.constant 1 : i64
        %68 = arith.addi %67, %c1_i64_26 : i64
        %c4_i64_27 = arith.constant 4 : i64
        %69 = arith.muli %68, %c4_i64_27 : i64
        %c0_i64_28 = arith.constant 0 : i64
        %70 = arith.cmpi sge, %67, %c0_i64_28 : i64
        %71 = arith.cmpi sle, %69, %13 : i64
        %72 = arith.andi %70, %71 : i1
        %73 = scf.if %72 -> (f32) {
          %83 = arith.index_cast %66 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg0[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c3_i32 = arith.constant 3 : i32
        %74 = arith.addi %22, %c3_i32 : i32
        %75 = arith.extsi %74 : i32 to i64
        %c1_i64_29 = arith.constant 1 : i64
        %76 = arith.addi %75, %c1_i64_29 : i64
        %c4_i64_30 = arith.constant 4 : i64
        %77 = arith.muli %76, %c4_i64_30 : i64
        %c0_i64_31 = arith.constant 0 : i64
        %78 = arith.cmpi sge, %75, %c0_i64_31 : i64
        %79 = arith.cmpi sle, %77, %13 : i64
        %80 = arith.andi %78, %79 : i1
        %81 = scf.if %80 -> (f32) {
          %83 = arith.index_cast %74 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg0[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %82 = vector.from_elements %57, %65, %73, %81 : vector<4xf32>
        scf.yield %82 : vector<4xf32>
      }
      %c4_i32_11 = arith.constant 4 : i32
      %30 = arith.muli %9, %c4_i32_11 : i32
      %31 = arith.extsi %30 : i32 to i64
      %c4_i64_12 = arith.constant 4 : i64
      %32 = arith.addi %31, %c4_i64_12 : i64
      %c4_i64_13 = arith.constant 4 : i64
      %33 = arith.muli %32, %c4_i64_13 : i64
      %c0_i64_14 = arith.constant 0 : i64
      %34 = arith.cmpi sge, %31, %c0_i64_14 : i64
      %35 = arith.cmpi sle, %33, %17 : i64
      %36 = arith.andi %34, %35 : i1
      %37 = scf.if %36 -> (vector<4xf32>) {
        %50 = arith.index_cast %30 : i32 to index
        %51 = arith.index_cast %50 : index to i64
        %52 = llvm.getelementptr %arg2[%51] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_20 = arith.constant 0 : index
        %53 = arith.index_cast %c0_20 : index to i64
        %54 = llvm.getelementptr %52[%53] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0_21 = arith.constant 0 : index
        %55 = arith.index_cast %c0_21 : index to i64
        %56 = llvm.getelementptr %1[%55] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %57 = llvm.load %54 {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
        llvm.store %57, %56 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %58 = llvm.load %1 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        scf.yield %58 : vector<4xf32>
      } else {
        %c0_i32 = arith.constant 0 : i32
        %50 = arith.addi %30, %c0_i32 : i32
        %51 = arith.extsi %50 : i32 to i64
        %c1_i64 = arith.constant 1 : i64
        %52 = arith.addi %51, %c1_i64 : i64
        %c4_i64_20 = arith.constant 4 : i64
        %53 = arith.muli %52, %c4_i64_20 : i64
        %c0_i64_21 = arith.constant 0 : i64
        %54 = arith.cmpi sge, %51, %c0_i64_21 : i64
        %55 = arith.cmpi sle, %53, %17 : i64
        %56 = arith.andi %54, %55 : i1
        %57 = scf.if %56 -> (f32) {
          %83 = arith.index_cast %50 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg2[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c1_i32_22 = arith.constant 1 : i32
        %58 = arith.addi %30, %c1_i32_22 : i32
        %59 = arith.extsi %58 : i32 to i64
        %c1_i64_23 = arith.constant 1 : i64
        %60 = arith.addi %59, %c1_i64_23 : i64
        %c4_i64_24 = arith.constant 4 : i64
        %61 = arith.muli %60, %c4_i64_24 : i64
        %c0_i64_25 = arith.constant 0 : i64
        %62 = arith.cmpi sge, %59, %c0_i64_25 : i64
        %63 = arith.cmpi sle, %61, %17 : i64
        %64 = arith.andi %62, %63 : i1
        %65 = scf.if %64 -> (f32) {
          %83 = arith.index_cast %58 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg2[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c2_i32 = arith.constant 2 : i32
        %66 = arith.addi %30, %c2_i32 : i32
        %67 = arith.extsi %66 : i32 to i64
        %c1_i64_26 = arith.constant 1 : i64
        %68 = arith.addi %67, %c1_i64_26 : i64
        %c4_i64_27 = arith.constant 4 : i64
        %69 = arith.muli %68, %c4_i64_27 : i64
        %c0_i64_28 = arith.constant 0 : i64
        %70 = arith.cmpi sge, %67, %c0_i64_28 : i64
        %71 = arith.cmpi sle, %69, %17 : i64
        %72 = arith.andi %70, %71 : i1
        %73 = scf.if %72 -> (f32) {
          %83 = arith.index_cast %66 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg2[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c3_i32 = arith.constant 3 : i32
        %74 = arith.addi %30, %c3_i32 : i32
        %75 = arith.extsi %74 : i32 to i64
        %c1_i64_29 = arith.constant 1 : i64
        %76 = arith.addi %75, %c1_i64_29 : i64
        %c4_i64_30 = arith.constant 4 : i64
        %77 = arith.muli %76, %c4_i64_30 : i64
        %c0_i64_31 = arith.constant 0 : i64
        %78 = arith.cmpi sge, %75, %c0_i64_31 : i64
        %79 = arith.cmpi sle, %77, %17 : i64
        %80 = arith.andi %78, %79 : i1
        %81 = scf.if %80 -> (f32) {
          %83 = arith.index_cast %74 : i32 to index
          %c0 = arith.constant 0 : index
          %84 = arith.index_cast %83 : index to i64
          %85 = llvm.getelementptr %arg2[%84] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %86 = arith.index_cast %c0_32 : index to i64
          %87 = llvm.getelementptr %85[%86] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %88 = llvm.load %87 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %88 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %82 = vector.from_elements %57, %65, %73, %81 : vector<4xf32>
        scf.yield %82 : vector<4xf32>
      }
      %38 = arith.addf %29, %37 fastmath<contract> : vector<4xf32>
      %c4_i32_15 = arith.constant 4 : i32
      %39 = arith.muli %9, %c4_i32_15 : i32
      %40 = arith.extsi %39 : i32 to i64
      %c4_i64_16 = arith.constant 4 : i64
      %41 = arith.addi %40, %c4_i64_16 : i64
      %c4_i64_17 = arith.constant 4 : i64
      %42 = arith.muli %41, %c4_i64_17 : i64
      %c0_i64_18 = arith.constant 0 : i64
      %43 = arith.cmpi sge, %40, %c0_i64_18 : i64
      %44 = arith.cmpi sle, %42, %21 : i64
      %45 = arith.andi %43, %44 : i1
      scf.if %45 {
        llvm.store %38, %0 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %50 = arith.index_cast %39 : i32 to index
        %51 = arith.index_cast %50 : index to i64
        %52 = llvm.getelementptr %arg4[%51] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_20 = arith.constant 0 : index
        %53 = arith.index_cast %c0_20 : index to i64
        %54 = llvm.getelementptr %0[%53] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %c0_21 = arith.constant 0 : index
        %55 = arith.index_cast %c0_21 : index to i64
        %56 = llvm.getelementptr %52[%55] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %57 = llvm.load %54 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        llvm.store %57, %56 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
      } else {
        %50 = vector.extract %38[0] : f32 from vector<4xf32>
        %c0_i32 = arith.constant 0 : i32
        %51 = arith.addi %39, %c0_i32 : i32
        %52 = arith.extsi %51 : i32 to i64
        %c1_i64 = arith.constant 1 : i64
        %53 = arith.addi %52, %c1_i64 : i64
        %c4_i64_20 = arith.constant 4 : i64
        %54 = arith.muli %53, %c4_i64_20 : i64
        %c0_i64_21 = arith.constant 0 : i64
        %55 = arith.cmpi sge, %52, %c0_i64_21 : i64
        %56 = arith.cmpi sle, %54, %21 : i64
        %57 = arith.andi %55, %56 : i1
        scf.if %57 {
          %82 = arith.index_cast %51 : i32 to index
          %c0 = arith.constant 0 : index
          %83 = arith.index_cast %82 : index to i64
          %84 = llvm.getelementptr %arg4[%83] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %85 = arith.index_cast %c0_32 : index to i64
          %86 = llvm.getelementptr %84[%85] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %50, %86 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %58 = vector.extract %38[1] : f32 from vector<4xf32>
        %c1_i32_22 = arith.constant 1 : i32
        %59 = arith.addi %39, %c1_i32_22 : i32
        %60 = arith.extsi %59 : i32 to i64
        %c1_i64_23 = arith.constant 1 : i64
        %61 = arith.addi %60, %c1_i64_23 : i64
        %c4_i64_24 = arith.constant 4 : i64
        %62 = arith.muli %61, %c4_i64_24 : i64
        %c0_i64_25 = arith.constant 0 : i64
        %63 = arith.cmpi sge, %60, %c0_i64_25 : i64
        %64 = arith.cmpi sle, %62, %21 : i64
        %65 = arith.andi %63, %64 : i1
        scf.if %65 {
          %82 = arith.index_cast %59 : i32 to index
          %c0 = arith.constant 0 : index
          %83 = arith.index_cast %82 : index to i64
          %84 = llvm.getelementptr %arg4[%83] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %85 = arith.index_cast %c0_32 : index to i64
          %86 = llvm.getelementptr %84[%85] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %58, %86 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %66 = vector.extract %38[2] : f32 from vector<4xf32>
        %c2_i32 = arith.constant 2 : i32
        %67 = arith.addi %39, %c2_i32 : i32
        %68 = arith.extsi %67 : i32 to i64
        %c1_i64_26 = arith.constant 1 : i64
        %69 = arith.addi %68, %c1_i64_26 : i64
        %c4_i64_27 = arith.constant 4 : i64
        %70 = arith.muli %69, %c4_i64_27 : i64
        %c0_i64_28 = arith.constant 0 : i64
        %71 = arith.cmpi sge, %68, %c0_i64_28 : i64
        %72 = arith.cmpi sle, %70, %21 : i64
        %73 = arith.andi %71, %72 : i1
        scf.if %73 {
          %82 = arith.index_cast %67 : i32 to index
          %c0 = arith.constant 0 : index
          %83 = arith.index_cast %82 : index to i64
          %84 = llvm.getelementptr %arg4[%83] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %85 = arith.index_cast %c0_32 : index to i64
          %86 = llvm.getelementptr %84[%85] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %66, %86 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %74 = vector.extract %38[3] : f32 from vector<4xf32>
        %c3_i32 = arith.constant 3 : i32
        %75 = arith.addi %39, %c3_i32 : i32
        %76 = arith.extsi %75 : i32 to i64
        %c1_i64_29 = arith.constant 1 : i64
        %77 = arith.addi %76, %c1_i64_29 : i64
        %c4_i64_30 = arith.constant 4 : i64
        %78 = arith.muli %77, %c4_i64_30 : i64
        %c0_i64_31 = arith.constant 0 : i64
        %79 = arith.cmpi sge, %76, %c0_i64_31 : i64
        %80 = arith.cmpi sle, %78, %21 : i64
        %81 = arith.andi %79, %80 : i1
        scf.if %81 {
          %82 = arith.index_cast %75 : i32 to index
          %c0 = arith.constant 0 : index
          %83 = arith.index_cast %82 : index to i64
          %84 = llvm.getelementptr %arg4[%83] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_32 = arith.constant 0 : index
          %85 = arith.index_cast %c0_32 : index to i64
          %86 = llvm.getelementptr %84[%85] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %74, %86 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
      }
      %46 = nvvm.read.ptx.sreg.tid.x : i32
      %c8_i32 = arith.constant 8 : i32
      %47 = arith.remsi %46, %c8_i32 : i32
      %c8_i32_19 = arith.constant 8 : i32
      %48 = arith.divsi %46, %c8_i32_19 : i32
      %c32_i32 = arith.constant 32 : i32
      %49 = arith.remsi %48, %c32_i32 : i32
      gpu.return
    }
  }
}
