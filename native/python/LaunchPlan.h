//===- LaunchPlan.h - Call keys, launch recordings and replays --*- C++ -*-===//
//
// What the zoo's launch plans (flydsl.kernels.plans) need natively:
//  - plan_key(args): the bytes that say everything validation and routing read
//    about a call's arguments (per torch tensor its type, dtype, shape,
//    strides, address mod 16 and device; other values by type and value);
//  - LaunchRecording: the launches a plan made while it was active (every
//    launch of this thread passes through noteLaunch);
//  - LaunchPlan: those launches replayed on new arguments of the same key,
//    each pointer parameter patched to the argument it pointed into.
//
// Nanobind side only.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_LAUNCHPLAN_H
#define FLY_PYTHON_LAUNCHPLAN_H

#include "../runtime/CudaDriver.h"

#include <nanobind/nanobind.h>

#include <cstddef>

namespace fly::python {

struct PyTensorMap;

/// Whether this thread has an active recording (launch paths build what
/// noteLaunch needs only then).
bool recordingLaunches();

/// Notes a launch that was just made (its parameters as cuLaunchKernel took
/// them; `signature` has one code per parameter; `tensorMaps`: per parameter,
/// the TensorMap of an 'm' one) in this thread's active recordings, if any.
void noteLaunch(const fly::runtime::Function &fn, const unsigned grid[3], const unsigned block[3],
                const unsigned *cluster, unsigned sharedBytes, fly::runtime::CUstream stream,
                const char *signature, size_t numParams, void *const *params,
                const PyTensorMap *const *tensorMaps);

struct LaunchValue;

/// noteLaunch for the native dispatcher: each 'm' parameter's TensorMap is
/// the object of its launch value.
void noteDispatchedLaunch(const fly::runtime::Function &fn, const unsigned grid[3],
                          const unsigned block[3], const unsigned *cluster, unsigned sharedBytes,
                          fly::runtime::CUstream stream, const char *signature, size_t numParams,
                          void *const *params, const LaunchValue *values);

void bindLaunchPlans(nanobind::module_ &rt);

} // namespace fly::python

#endif // FLY_PYTHON_LAUNCHPLAN_H
