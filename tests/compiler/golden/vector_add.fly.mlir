module attributes {gpu.container_module} {
  gpu.module @vector_add_module [#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx80">] {
    gpu.func @vector_add(%arg0: !llvm.ptr<1>, %arg1: i64, %arg2: !llvm.ptr<1>, %arg3: i64, %arg4: !llvm.ptr<1>, %arg5: i64, %arg6: i64) kernel {
      %c1_i32 = arith.constant 1 : i32
      %0 = llvm.alloca %c1_i32 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %c1_i32_0 = arith.constant 1 : i32
      %1 = llvm.alloca %c1_i32_0 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %c1_i32_1 = arith.constant 1 : i32
      %2 = llvm.alloca %c1_i32_1 x vector<4xf32> {alignment = 16 : i64} : (i32) -> !llvm.ptr
      %3 = arith.index_cast %arg1 : i64 to index
      %4 = arith.index_cast %arg3 : i64 to index
      %5 = arith.index_cast %arg5 : i64 to index
      %6 = nvvm.read.ptx.sreg.ctaid.x : i32
      %7 = arith.extsi %6 : i32 to i64
      %c256_i64 = arith.constant 256 : i64
      %8 = arith.muli %7, %c256_i64 : i64
      %9 = nvvm.read.ptx.sreg.tid.x : i32
      %10 = arith.extsi %9 : i32 to i64
      %11 = arith.addi %8, %10 : i64
      %c1 = arith.constant 1 : index
      %12 = arith.subi %3, %c1 : index
      %c1_2 = arith.constant 1 : index
      %13 = arith.addi %12, %c1_2 : index
      %14 = arith.index_cast %13 : index to i64
      %c4_i64 = arith.constant 4 : i64
      %15 = arith.muli %14, %c4_i64 : i64
      %c1_3 = arith.constant 1 : index
      %16 = arith.subi %4, %c1_3 : index
      %c1_4 = arith.constant 1 : index
      %17 = arith.addi %16, %c1_4 : index
      %18 = arith.index_cast %17 : index to i64
      %c4_i64_5 = arith.constant 4 : i64
      %19 = arith.muli %18, %c4_i64_5 : i64
      %c1_6 = arith.constant 1 : index
      %20 = arith.subi %5, %c1_6 : index
      %c1_7 = arith.constant 1 : index
      %21 = arith.addi %20, %c1_7 : index
      %22 = arith.index_cast %21 : index to i64
      %c4_i64_8 = arith.constant 4 : i64
      %23 = arith.muli %22, %c4_i64_8 : i64
      %c4_i64_9 = arith.constant 4 : i64
      %24 = arith.muli %11, %c4_i64_9 : i64
      %c4_i64_10 = arith.constant 4 : i64
      %25 = arith.addi %24, %c4_i64_10 : i64
      %c4_i64_11 = arith.constant 4 : i64
      %26 = arith.muli %25, %c4_i64_11 : i64
      %c0_i64 = arith.constant 0 : i64
      %27 = arith.cmpi sge, %24, %c0_i64 : i64
      %28 = arith.cmpi sle, %26, %15 : i64
      %29 = arith.andi %27, %28 : i1
      %30 = scf.if %29 -> (vector<4xf32>) {
        %49 = arith.index_cast %24 : i64 to index
        %50 = arith.index_cast %49 : index to i64
        %51 = llvm.getelementptr %arg0[%50] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_21 = arith.constant 0 : index
        %52 = arith.index_cast %c0_21 : index to i64
        %53 = llvm.getelementptr %51[%52] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0_22 = arith.constant 0 : index
        %54 = arith.index_cast %c0_22 : index to i64
        %55 = llvm.getelementptr %2[%54] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %56 = llvm.load %53 {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
        llvm.store %56, %55 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %57 = llvm.load %2 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        scf.yield %57 : vector<4xf32>
      } else {
        %c0_i64_21 = arith.constant 0 : i64
        %49 = arith.addi %24, %c0_i64_21 : i64
        %c1_i64 = arith.constant 1 : i64
        %50 = arith.addi %49, %c1_i64 : i64
        %c4_i64_22 = arith.constant 4 : i64
        %51 = arith.muli %50, %c4_i64_22 : i64
        %c0_i64_23 = arith.constant 0 : i64
        %52 = arith.cmpi sge, %49, %c0_i64_23 : i64
        %53 = arith.cmpi sle, %51, %15 : i64
        %54 = arith.andi %52, %53 : i1
        %55 = scf.if %54 -> (f32) {
          %78 = arith.index_cast %49 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg0[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c1_i64_24 = arith.constant 1 : i64
        %56 = arith.addi %24, %c1_i64_24 : i64
        %c1_i64_25 = arith.constant 1 : i64
        %57 = arith.addi %56, %c1_i64_25 : i64
        %c4_i64_26 = arith.constant 4 : i64
        %58 = arith.muli %57, %c4_i64_26 : i64
        %c0_i64_27 = arith.constant 0 : i64
        %59 = arith.cmpi sge, %56, %c0_i64_27 : i64
        %60 = arith.cmpi sle, %58, %15 : i64
        %61 = arith.andi %59, %60 : i1
        %62 = scf.if %61 -> (f32) {
          %78 = arith.index_cast %56 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg0[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c2_i64 = arith.constant 2 : i64
        %63 = arith.addi %24, %c2_i64 : i64
        %c1_i64_28 = arith.constant 1 : i64
        %64 = arith.addi %63, %c1_i64_28 : i64
        %c4_i64_29 = arith.constant 4 : i64
        %65 = arith.muli %64, %c4_i64_29 : i64
        %c0_i64_30 = arith.constant 0 : i64
        %66 = arith.cmpi sge, %63, %c0_i64_30 : i64
        %67 = arith.cmpi sle, %65, %15 : i64
        %68 = arith.andi %66, %67 : i1
        %69 = scf.if %68 -> (f32) {
          %78 = arith.index_cast %63 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg0[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c3_i64 = arith.constant 3 : i64
        %70 = arith.addi %24, %c3_i64 : i64
        %c1_i64_31 = arith.constant 1 : i64
        %71 = arith.addi %70, %c1_i64_31 : i64
        %c4_i64_32 = arith.constant 4 : i64
        %72 = arith.muli %71, %c4_i64_32 : i64
        %c0_i64_33 = arith.constant 0 : i64
        %73 = arith.cmpi sge, %70, %c0_i64_33 : i64
        %74 = arith.cmpi sle, %72, %15 : i64
        %75 = arith.andi %73, %74 : i1
        %76 = scf.if %75 -> (f32) {
          %78 = arith.index_cast %70 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg0[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %77 = vector.from_elements %55, %62, %69, %76 : vector<4xf32>
        scf.yield %77 : vector<4xf32>
      }
      %c4_i64_12 = arith.constant 4 : i64
      %31 = arith.muli %11, %c4_i64_12 : i64
      %c4_i64_13 = arith.constant 4 : i64
      %32 = arith.addi %31, %c4_i64_13 : i64
      %c4_i64_14 = arith.constant 4 : i64
      %33 = arith.muli %32, %c4_i64_14 : i64
      %c0_i64_15 = arith.constant 0 : i64
      %34 = arith.cmpi sge, %31, %c0_i64_15 : i64
      %35 = arith.cmpi sle, %33, %19 : i64
      %36 = arith.andi %34, %35 : i1
      %37 = scf.if %36 -> (vector<4xf32>) {
        %49 = arith.index_cast %31 : i64 to index
        %50 = arith.index_cast %49 : index to i64
        %51 = llvm.getelementptr %arg2[%50] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_21 = arith.constant 0 : index
        %52 = arith.index_cast %c0_21 : index to i64
        %53 = llvm.getelementptr %51[%52] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0_22 = arith.constant 0 : index
        %54 = arith.index_cast %c0_22 : index to i64
        %55 = llvm.getelementptr %1[%54] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %56 = llvm.load %53 {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
        llvm.store %56, %55 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %57 = llvm.load %1 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        scf.yield %57 : vector<4xf32>
      } else {
        %c0_i64_21 = arith.constant 0 : i64
        %49 = arith.addi %31, %c0_i64_21 : i64
        %c1_i64 = arith.constant 1 : i64
        %50 = arith.addi %49, %c1_i64 : i64
        %c4_i64_22 = arith.constant 4 : i64
        %51 = arith.muli %50, %c4_i64_22 : i64
        %c0_i64_23 = arith.constant 0 : i64
        %52 = arith.cmpi sge, %49, %c0_i64_23 : i64
        %53 = arith.cmpi sle, %51, %19 : i64
        %54 = arith.andi %52, %53 : i1
        %55 = scf.if %54 -> (f32) {
          %78 = arith.index_cast %49 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg2[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c1_i64_24 = arith.constant 1 : i64
        %56 = arith.addi %31, %c1_i64_24 : i64
        %c1_i64_25 = arith.constant 1 : i64
        %57 = arith.addi %56, %c1_i64_25 : i64
        %c4_i64_26 = arith.constant 4 : i64
        %58 = arith.muli %57, %c4_i64_26 : i64
        %c0_i64_27 = arith.constant 0 : i64
        %59 = arith.cmpi sge, %56, %c0_i64_27 : i64
        %60 = arith.cmpi sle, %58, %19 : i64
        %61 = arith.andi %59, %60 : i1
        %62 = scf.if %61 -> (f32) {
          %78 = arith.index_cast %56 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg2[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c2_i64 = arith.constant 2 : i64
        %63 = arith.addi %31, %c2_i64 : i64
        %c1_i64_28 = arith.constant 1 : i64
        %64 = arith.addi %63, %c1_i64_28 : i64
        %c4_i64_29 = arith.constant 4 : i64
        %65 = arith.muli %64, %c4_i64_29 : i64
        %c0_i64_30 = arith.constant 0 : i64
        %66 = arith.cmpi sge, %63, %c0_i64_30 : i64
        %67 = arith.cmpi sle, %65, %19 : i64
        %68 = arith.andi %66, %67 : i1
        %69 = scf.if %68 -> (f32) {
          %78 = arith.index_cast %63 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg2[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %c3_i64 = arith.constant 3 : i64
        %70 = arith.addi %31, %c3_i64 : i64
        %c1_i64_31 = arith.constant 1 : i64
        %71 = arith.addi %70, %c1_i64_31 : i64
        %c4_i64_32 = arith.constant 4 : i64
        %72 = arith.muli %71, %c4_i64_32 : i64
        %c0_i64_33 = arith.constant 0 : i64
        %73 = arith.cmpi sge, %70, %c0_i64_33 : i64
        %74 = arith.cmpi sle, %72, %19 : i64
        %75 = arith.andi %73, %74 : i1
        %76 = scf.if %75 -> (f32) {
          %78 = arith.index_cast %70 : i64 to index
          %c0 = arith.constant 0 : index
          %79 = arith.index_cast %78 : index to i64
          %80 = llvm.getelementptr %arg2[%79] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %81 = arith.index_cast %c0_34 : index to i64
          %82 = llvm.getelementptr %80[%81] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %83 = llvm.load %82 {alignment = 4 : i64} : !llvm.ptr<1> -> f32
          scf.yield %83 : f32
        } else {
          %cst = arith.constant 0.000000e+00 : f32
          scf.yield %cst : f32
        }
        %77 = vector.from_elements %55, %62, %69, %76 : vector<4xf32>
        scf.yield %77 : vector<4xf32>
      }
      %38 = arith.addf %30, %37 fastmath<contract> : vector<4xf32>
      %c4_i64_16 = arith.constant 4 : i64
      %39 = arith.muli %11, %c4_i64_16 : i64
      %c4_i64_17 = arith.constant 4 : i64
      %40 = arith.addi %39, %c4_i64_17 : i64
      %c4_i64_18 = arith.constant 4 : i64
      %41 = arith.muli %40, %c4_i64_18 : i64
      %c0_i64_19 = arith.constant 0 : i64
      %42 = arith.cmpi sge, %39, %c0_i64_19 : i64
      %43 = arith.cmpi sle, %41, %23 : i64
      %44 = arith.andi %42, %43 : i1
      scf.if %44 {
        llvm.store %38, %0 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr
        %49 = arith.index_cast %39 : i64 to index
        %50 = arith.index_cast %49 : index to i64
        %51 = llvm.getelementptr %arg4[%50] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %c0 = arith.constant 0 : index
        %c0_21 = arith.constant 0 : index
        %52 = arith.index_cast %c0_21 : index to i64
        %53 = llvm.getelementptr %0[%52] : (!llvm.ptr, i64) -> !llvm.ptr, f32
        %c0_22 = arith.constant 0 : index
        %54 = arith.index_cast %c0_22 : index to i64
        %55 = llvm.getelementptr %51[%54] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
        %56 = llvm.load %53 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
        llvm.store %56, %55 {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
      } else {
        %49 = vector.extract %38[0] : f32 from vector<4xf32>
        %c0_i64_21 = arith.constant 0 : i64
        %50 = arith.addi %39, %c0_i64_21 : i64
        %c1_i64 = arith.constant 1 : i64
        %51 = arith.addi %50, %c1_i64 : i64
        %c4_i64_22 = arith.constant 4 : i64
        %52 = arith.muli %51, %c4_i64_22 : i64
        %c0_i64_23 = arith.constant 0 : i64
        %53 = arith.cmpi sge, %50, %c0_i64_23 : i64
        %54 = arith.cmpi sle, %52, %23 : i64
        %55 = arith.andi %53, %54 : i1
        scf.if %55 {
          %77 = arith.index_cast %50 : i64 to index
          %c0 = arith.constant 0 : index
          %78 = arith.index_cast %77 : index to i64
          %79 = llvm.getelementptr %arg4[%78] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %80 = arith.index_cast %c0_34 : index to i64
          %81 = llvm.getelementptr %79[%80] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %49, %81 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %56 = vector.extract %38[1] : f32 from vector<4xf32>
        %c1_i64_24 = arith.constant 1 : i64
        %57 = arith.addi %39, %c1_i64_24 : i64
        %c1_i64_25 = arith.constant 1 : i64
        %58 = arith.addi %57, %c1_i64_25 : i64
        %c4_i64_26 = arith.constant 4 : i64
        %59 = arith.muli %58, %c4_i64_26 : i64
        %c0_i64_27 = arith.constant 0 : i64
        %60 = arith.cmpi sge, %57, %c0_i64_27 : i64
        %61 = arith.cmpi sle, %59, %23 : i64
        %62 = arith.andi %60, %61 : i1
        scf.if %62 {
          %77 = arith.index_cast %57 : i64 to index
          %c0 = arith.constant 0 : index
          %78 = arith.index_cast %77 : index to i64
          %79 = llvm.getelementptr %arg4[%78] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %80 = arith.index_cast %c0_34 : index to i64
          %81 = llvm.getelementptr %79[%80] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %56, %81 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %63 = vector.extract %38[2] : f32 from vector<4xf32>
        %c2_i64 = arith.constant 2 : i64
        %64 = arith.addi %39, %c2_i64 : i64
        %c1_i64_28 = arith.constant 1 : i64
        %65 = arith.addi %64, %c1_i64_28 : i64
        %c4_i64_29 = arith.constant 4 : i64
        %66 = arith.muli %65, %c4_i64_29 : i64
        %c0_i64_30 = arith.constant 0 : i64
        %67 = arith.cmpi sge, %64, %c0_i64_30 : i64
        %68 = arith.cmpi sle, %66, %23 : i64
        %69 = arith.andi %67, %68 : i1
        scf.if %69 {
          %77 = arith.index_cast %64 : i64 to index
          %c0 = arith.constant 0 : index
          %78 = arith.index_cast %77 : index to i64
          %79 = llvm.getelementptr %arg4[%78] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %80 = arith.index_cast %c0_34 : index to i64
          %81 = llvm.getelementptr %79[%80] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %63, %81 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
        %70 = vector.extract %38[3] : f32 from vector<4xf32>
        %c3_i64 = arith.constant 3 : i64
        %71 = arith.addi %39, %c3_i64 : i64
        %c1_i64_31 = arith.constant 1 : i64
        %72 = arith.addi %71, %c1_i64_31 : i64
        %c4_i64_32 = arith.constant 4 : i64
        %73 = arith.muli %72, %c4_i64_32 : i64
        %c0_i64_33 = arith.constant 0 : i64
        %74 = arith.cmpi sge, %71, %c0_i64_33 : i64
        %75 = arith.cmpi sle, %73, %23 : i64
        %76 = arith.andi %74, %75 : i1
        scf.if %76 {
          %77 = arith.index_cast %71 : i64 to index
          %c0 = arith.constant 0 : index
          %78 = arith.index_cast %77 : index to i64
          %79 = llvm.getelementptr %arg4[%78] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          %c0_34 = arith.constant 0 : index
          %80 = arith.index_cast %c0_34 : index to i64
          %81 = llvm.getelementptr %79[%80] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
          llvm.store %70, %81 {alignment = 4 : i64} : f32, !llvm.ptr<1>
        }
      }
      %45 = nvvm.read.ptx.sreg.tid.x : i32
      %c8_i32 = arith.constant 8 : i32
      %46 = arith.remsi %45, %c8_i32 : i32
      %c8_i32_20 = arith.constant 8 : i32
      %47 = arith.divsi %45, %c8_i32_20 : i32
      %c32_i32 = arith.constant 32 : i32
      %48 = arith.remsi %47, %c32_i32 : i32
      gpu.return
    }
  }
}
