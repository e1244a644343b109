//===- RuntimeBindings.h - Python bindings of the CUDA launcher -*- C++ -*-===//
//
// Nanobind side only (RTTI and exceptions on); the MLIR dialect libraries,
// built with -fno-rtti, must not include this header.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_RUNTIME_RUNTIMEBINDINGS_H
#define FLY_RUNTIME_RUNTIMEBINDINGS_H

#include <nanobind/nanobind.h>

/// Adds the `runtime` submodule (CUDA driver launcher) to `m`.
void flyBindRuntime(nanobind::module_ &m);

#endif // FLY_RUNTIME_RUNTIMEBINDINGS_H
