//===- Dispatcher.h - Native launch path of @flyc.kernel --------*- C++ -*-===//
//
// Nanobind side only (RTTI and exceptions on).
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_DISPATCHER_H
#define FLY_PYTHON_DISPATCHER_H

#include <nanobind/nanobind.h>

namespace fly::python {

/// Adds the Dispatcher class and its registry functions (_register_*) to the
/// `runtime` submodule `rt`.
void bindDispatcher(nanobind::module_ &rt);

} // namespace fly::python

#endif // FLY_PYTHON_DISPATCHER_H
