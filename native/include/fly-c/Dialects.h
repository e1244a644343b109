/*===- Dialects.h - C API of the Fly dialect ---------------------*- C -*-===*\
|*                                                                            *|
|* The nanobind module talks to the dialect only through these functions, so  *|
|* that it can be built with RTTI/exceptions while the dialect is built       *|
|* without (as LLVM was).                                                     *|
\*===----------------------------------------------------------------------===*/

#ifndef FLY_C_DIALECTS_H
#define FLY_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(Fly, fly);

/// Registers every Fly pass with the global pass registry (idempotent).
MLIR_CAPI_EXPORTED void flyRegisterPasses(void);

/// Layout type queries.
MLIR_CAPI_EXPORTED bool flyTypeIsALayout(MlirType type);
MLIR_CAPI_EXPORTED intptr_t flyLayoutTypeGetRank(MlirType type);
MLIR_CAPI_EXPORTED bool flyLayoutTypeIsStatic(MlirType type);
/// Size of the layout's domain, or -1 when a shape leaf is dynamic.
MLIR_CAPI_EXPORTED int64_t flyLayoutTypeGetStaticSize(MlirType type);

#ifdef __cplusplus
}
#endif

#endif // FLY_C_DIALECTS_H
