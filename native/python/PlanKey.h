//===- PlanKey.h - The plan key of a call's arguments -----------*- C++ -*-===//
//
// plan_key(args): the bytes that say everything validation and routing read
// about a call's arguments (per torch tensor its type, dtype, shape, strides,
// address mod 16 and device; other values by type and value), and the reading
// of a torch tensor's facts that launch recordings share. Nanobind side only.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_PLANKEY_H
#define FLY_PYTHON_PLANKEY_H

#include "DispatchRegistry.h"

#include <nanobind/nanobind.h>

#include <cstddef>

namespace fly::python {

/// A torch tensor as the plans see it (new references released on return).
struct TensorFacts {
  PyObject *dtype = nullptr; // borrowed from the tensor's attribute (dtypes are immortal)
  unsigned long long pointer = 0;
  long long device = -1;
  size_t rank = 0;
  long long extents[kMaxRank], strides[kMaxRank];
};

/// Whether instances of `type` are read as torch tensors (registered types).
bool isTensorType(PyTypeObject *type);

/// A torch tensor's facts (through torch's C API where it is enabled,
/// TorchCApi.h); false (no error set) where they cannot be read.
bool readTensor(PyObject *obj, TensorFacts &t);

/// A torch tensor's facts read from its Python attributes.
bool readTensorAttributes(PyObject *obj, TensorFacts &t);

/// The plan key of a tuple of arguments (bytes), or None.
nanobind::object planKey(nanobind::handle args);

/// The plan kept in `plans` (a dict by plan key) for a call of an eager entry point, in one native call:
/// None where a torch dispatch mode is active, no checks are registered, `args` has no key or no plan is kept;
/// `grad` where grad mode is on and one of `tensors` requires grad; else plans[plan_key(args)]. What
/// flydsl.torch.functional asks before each call (a Python fallback answers the Nones).
nanobind::object keptPlan(nanobind::handle plans, nanobind::handle args, nanobind::handle tensors,
                          nanobind::handle grad);

/// kept_plan and _register_kept_checks (its torch functions) on the runtime module.
void bindKeptPlan(nanobind::module_ &rt);

/// A plan key as text that another process builds alike for the same call (the key names types and dtypes by
/// address: here by name), or None where it holds something else.
nanobind::object portablePlanKey(nanobind::bytes key);

} // namespace fly::python

#endif // FLY_PYTHON_PLANKEY_H
