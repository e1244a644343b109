//===- DescribeArgs.h - Reading a call's arguments natively -----*- C++ -*-===//
//
// The arguments of one @flyc.kernel call as the native dispatcher reads them:
// tensors (torch through its C API, other arrays through
// __cuda_array_interface__) and TmaTiles become the specialization key bytes,
// the launch values and the default stream, exactly as kernel.py computes
// them. The readers return false, with no Python error set, for what they do
// not handle: the Python path then takes the call. Nanobind side only.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_DESCRIBEARGS_H
#define FLY_PYTHON_DESCRIBEARGS_H

#include "DispatchRegistry.h"

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fly::python {

struct LaunchValue {
  enum Tag : uint8_t { Int, UInt, Float, Object } tag;
  union {
    long long i;
    unsigned long long u;
    double d;
    PyObject *o; // a runtime.TensorMap, borrowed from its TmaTile
  };
};

/// One call's arguments as read by the dispatcher (borrowed references).
struct Described {
  unsigned char key[kMaxKeyBytes];
  size_t keyBytes = 0;
  PyObject *constexprs[kMaxConstexprs];
  // Hashed only when a registered value is not the same object (-1: not
  // yet; a Python hash is never -1).
  mutable Py_hash_t hashes[kMaxConstexprs];
  size_t numConstexprs = 0;
  LaunchValue values[kMaxLaunchValues];
  size_t numValues = 0;
  PyObject *streamValue = nullptr; // the fx.Stream parameter's value
  // kernel.py's default stream: that of the first tensor naming one, a torch
  // tensor (its device's current stream) or an array interface's "stream".
  bool streamNamed = false;
  PyObject *streamTensor = nullptr; // the torch tensor, or null
  long long streamDevice = -1;       // its device where read through torch's C API, else -1
  unsigned long long interfaceStream = 0;
  // The last torch tensor read, as read: the same object passed again (the
  // zoo's kernels pass their first tensor for the ones a variant leaves out)
  // is appended without reading it again (five attribute calls).
  struct TorchRead {
    PyObject *obj = nullptr;
    uint8_t element = 0, bytes = 0;
    unsigned long long pointer = 0;
    size_t rank = 0;
    long long extents[kMaxRank], steps[kMaxRank];
  } lastTorch;
};

/// Calls obj.name() without building a bound method (a new reference, or null).
PyObject *callMethod0(PyObject *obj, PyObject *name);

/// A Python int within long long, else false (no error set).
bool readLongLong(PyObject *obj, long long &out);

/// False with the pending error (if any) cleared: the Python path takes over.
bool decline();

/// Appends a tensor argument: a torch tensor, or an object read through
/// __cuda_array_interface__ (strides in bytes, or None: row-major); the first
/// tensor naming a stream gives the default one.
bool describeTensor(PyObject *obj, Described &d);

/// Appends kernel.py's key entry of a tensor parameter, (dtype, rank, stride
/// kinds, aligned) or a wide tensor's (..., (None,) * rank, True), to `out`
/// as the key bytes describeTensor writes; false (no error set) for an entry
/// the native path does not match (marked static extents, unknown names).
bool tensorKeyBytes(PyObject *part, std::vector<uint8_t> &out);

/// kernel.py's key entry of the tensor key bytes at `key` (tensorKeyBytes'
/// inverse; 3 + rank bytes, the rank at key[1]).
nanobind::object tensorKeyEntry(const unsigned char *key);

/// Appends a TmaTile argument: its key (compared like a constexpr), its
/// encoded tensor map and its extents; its tensor counts for the stream.
bool describeTmaTile(PyObject *obj, Described &d);

/// 1 if the Constexpr value `v` holds a float -0.0 (itself, inside tuples, or
/// where kernel.py's registered check says so: dataclasses, ...), 0 if not,
/// -1 with a Python error set.
int holdsNegativeZero(PyObject *v);

} // namespace fly::python

#endif // FLY_PYTHON_DESCRIBEARGS_H
