//===- NativeReplay.cpp - Plans replayed from C++ without the GIL --------===//
//
// `_runtime._native_replay`: a capsule holding the C functions through which
// C++ in other extensions (flydsl.torch's autograd node, on autograd's device
// thread) replays a LaunchPlan without Python (LaunchPlan::replayHandles).
// The capsule's table is versioned: its users check `version` before calling.
//
// Nanobind side only.
//
//===----------------------------------------------------------------------===//

#include "LaunchPlanSteps.h"

#include <cstdint>
#include <cstdio>
#include <exception>

namespace nb = nanobind;

namespace fly::python {

namespace {

/// Version 1:
///   void *plan_pointer(PyObject *plan): with the GIL: plan's LaunchPlan where it replays without Python, else null;
///   int replay(void *plan, void *const *args, size_t n, void **made, size_t capacity, char *error, size_t bytes):
///     without the GIL: LaunchPlan::replayHandles; 1 replayed, 0 declined (nothing done: take the Python path),
///     -1 failed (a launch: the message in `error`).
struct NativeReplayTable {
  uint32_t version;
  void *(*planPointer)(PyObject *);
  int (*replay)(void *, void *const *, size_t, void **, size_t, char *, size_t);
};

constexpr const char *kNativeReplayCapsule = "flydsl._runtime.native_replay";

NativeReplayTable &nativeReplayTable() {
  static NativeReplayTable table{
      1,
      [](PyObject *obj) -> void * {
        if (!nb::isinstance<LaunchPlan>(nb::handle(obj)))
          return nullptr;
        LaunchPlan *plan = nb::inst_ptr<LaunchPlan>(nb::handle(obj));
        return plan->replaysWithoutPython() ? plan : nullptr;
      },
      [](void *plan, void *const *args, size_t n, void **made, size_t capacity, char *error, size_t bytes) -> int {
        try {
          return static_cast<const LaunchPlan *>(plan)->replayHandles(args, n, made, capacity) ? 1 : 0;
        } catch (const std::exception &e) {
          if (error && bytes)
            std::snprintf(error, bytes, "%s", e.what());
          return -1;
        }
      }};
  return table;
}

} // namespace

void bindNativeReplay(nb::module_ &rt, nb::class_<LaunchPlan> &plans) {
  plans.def_prop_ro("replays_without_python", &LaunchPlan::replaysWithoutPython,
                    "Whether C++ may replay it without the GIL (the _native_replay capsule): no Python per call, no "
                    "tensor maps.");
  rt.attr("_native_replay") = nb::steal(PyCapsule_New(&nativeReplayTable(), kNativeReplayCapsule, nullptr));
}

} // namespace fly::python
