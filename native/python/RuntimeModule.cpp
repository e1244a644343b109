//===- RuntimeModule.cpp - the flydsl.compiler._runtime extension ---------===//
//
// The CUDA launcher (driver queries, modules, launches, the native dispatcher,
// TMA descriptors) as an extension of its own, linked against neither MLIR nor
// LLVM: a process that launches kernels from the disk cache loads this one
// (tens of kilobytes, libcuda through dlopen) and never the dialect's `_fly`.
//
//===----------------------------------------------------------------------===//

#include "runtime/RuntimeBindings.h"

namespace nb = nanobind;

NB_MODULE(_runtime, m) {
  m.doc() = "FlyDSL's CUDA launcher (libcuda loaded lazily).";
  // flydsl.compiler.runtime re-exports these functions and types as module globals, which Python
  // tears down in no particular order at exit; nanobind would report them as leaks.
  nb::set_leak_warnings(false);
  flyBindRuntime(m);
}
