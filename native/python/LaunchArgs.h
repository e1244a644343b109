//===- LaunchArgs.h - Launch argument packing and configuration -*- C++ -*-===//
//
// Shared by the runtime bindings and the Dispatcher: the parameter arena
// constants, the Python-side TensorMap, the error helpers, and the validation
// and packing of one kernel launch (Function.launch's path).
//
// Nanobind side only (RTTI and exceptions on).
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_LAUNCHARGS_H
#define FLY_PYTHON_LAUNCHARGS_H

#include "../runtime/CudaDriver.h"

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace fly::python {

using fly::runtime::CUstream;
using fly::runtime::CUtensorMap;

/// Kernel parameters packed without touching the heap: at most this many,
/// taking at most kInlineArena bytes (32 scalars and 4 tensor maps fit).
constexpr size_t kInlineParams = 32;
constexpr size_t kInlineArena = 1024;

/// A tensor map is passed by value: 128 bytes, 64-byte aligned (the PTX
/// `.param .align 64 .b8 p[128]` of a __grid_constant__ CUtensorMap).
constexpr size_t kTensorMapBytes = sizeof(CUtensorMap);
constexpr size_t kTensorMapAlign = alignof(CUtensorMap);
/// Every other kind takes one 8-byte slot.
constexpr size_t kSlotBytes = 8;

/// Python-side TensorMap: the encoded descriptor plus what made it (for repr),
/// and the tensor it describes, kept alive as long as the map.
struct PyTensorMap {
  CUtensorMap map;
  int dataType = -1; // -1: from_bytes
  unsigned rank = 0;
  uint64_t globalAddress = 0;
  nanobind::object owner;
  // What encoded it (from_bytes: none): a launch replay encodes it again
  // for the address its argument has then (LaunchPlan.cpp).
  std::optional<fly::runtime::TiledTensorMapSpec> spec;
};

/// Raises the pending Python error (set with PyErr_Format) as a C++ exception.
[[noreturn]] inline void raisePending() { throw nanobind::python_error(); }

template <typename... Args> [[noreturn]] void raise(PyObject *type, const char *fmt, Args... args) {
  PyErr_Format(type, fmt, args...);
  raisePending();
}

/// Returns a new reference to `obj` as a Python int (ints and objects with
/// __index__, e.g. numpy integers), or null without an error set.
PyObject *asPyLong(PyObject *obj);

/// Device address of a pointer-like argument: int, None, DeviceBuffer,
/// data_ptr() (torch) or __cuda_array_interface__ (cupy, numba, ...).
void packPointer(size_t index, PyObject *obj, uint64_t *slot);

/// Everything a launch needs, validated; filled before any driver call.
struct LaunchArgs {
  unsigned grid[3];
  unsigned block[3];
  unsigned cluster[3];
  bool hasCluster = false;
  unsigned sharedBytes = 0;
  CUstream stream = nullptr;
  size_t numParams = 0;
  void **params = nullptr; // params[i] points into arena
  unsigned char *arena = nullptr;
  size_t arenaBytes = 0; // bytes of arena in use, padding included

  alignas(kTensorMapAlign) unsigned char inlineArena[kInlineArena];
  void *inlineParams[kInlineParams];
  // Only past kInlineParams parameters or kInlineArena bytes.
  std::unique_ptr<unsigned char[]> heapArena;
  std::vector<void *> heapParams;
};

/// Size and alignment of one parameter of signature code `code`.
inline size_t slotBytes(char code) { return code == 'm' ? kTensorMapBytes : kSlotBytes; }
inline size_t slotAlign(char code) { return code == 'm' ? kTensorMapAlign : kSlotBytes; }
inline size_t alignUp(size_t offset, size_t align) { return (offset + align - 1) & ~(align - 1); }

/// Parses and checks grid, block and cluster (None: no cluster).
void parseConfig(PyObject *grid, PyObject *block, PyObject *cluster, unsigned gridOut[3],
                 unsigned blockOut[3], unsigned clusterOut[3], bool &hasCluster);

/// Validates and packs one launch. `name` only appears in error messages.
void prepareLaunch(const char *name, PyObject *grid, PyObject *block, PyObject *signature,
                   PyObject *args, PyObject *sharedMem, PyObject *stream, PyObject *cluster,
                   LaunchArgs &out);

/// (d[0], d[1], d[2]) as a Python tuple.
nanobind::tuple dimsTuple(const unsigned d[3]);

} // namespace fly::python

#endif // FLY_PYTHON_LAUNCHARGS_H
