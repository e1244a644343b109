//===- RuntimeBindings.h - Python bindings of the CUDA launcher -*- C++ -*-===//
//
// Nanobind side only (RTTI and exceptions on); the MLIR dialect libraries,
// built with -fno-rtti, must not include this header.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_RUNTIME_RUNTIMEBINDINGS_H
#define FLY_RUNTIME_RUNTIMEBINDINGS_H

#include <nanobind/nanobind.h>

/// Binds the CUDA driver launcher into `rt` (the `_runtime` extension module).
void flyBindRuntime(nanobind::module_ &rt);

#endif // FLY_RUNTIME_RUNTIMEBINDINGS_H
