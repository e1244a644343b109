//===- DispatchRegistry.h - What the launch path knows of Python types ----===//
//
// The registry behind runtime.Dispatcher: torch tensor types and dtypes,
// array interface types and typestrs, the TmaTile type and the torch stream
// getter, registered by kernel.py on first sight (strong references kept for
// the process, so pointer identity is stable), plus the interned attribute
// names the dispatcher reads. Nanobind side only (RTTI and exceptions on).
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_DISPATCHREGISTRY_H
#define FLY_PYTHON_DISPATCHREGISTRY_H

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fly::python {

inline constexpr size_t kMaxElementNames = 250;
inline constexpr size_t kMaxDtypes = 64;
inline constexpr size_t kMaxTensorTypes = 32;
inline constexpr size_t kMaxRank = 16;
inline constexpr size_t kMaxLaunchValues = 256;
inline constexpr size_t kMaxKeyBytes = 512;
inline constexpr size_t kMaxConstexprs = 32;
inline constexpr size_t kMaxEntries = 256;
inline constexpr size_t kMaxTensorMaps = 8;
/// Flags of a tensor's third key byte: its start is 16-byte aligned; its
/// offsets reach 2^31 elements (kernel.py's sixth key element: compiled apart).
inline constexpr uint8_t kAlignedTensor = 1;
inline constexpr uint8_t kWideTensor = 2;

/// What the Python path registers on first sight; strong references kept for
/// the process (types and dtype objects), so pointer identity is stable.
struct DispatchRegistry {
  std::vector<PyObject *> elementNames; // "f32", ...: index = the key's code
  struct Dtype {
    PyObject *object;
    uint8_t element; // index in elementNames
    uint8_t bytes;
  };
  std::vector<Dtype> dtypes;
  std::vector<PyTypeObject *> tensorTypes;
  // Types read through __cuda_array_interface__ (cupy, numba, ...), and the
  // element types of its "typestr" (compared without the byte-order mark).
  std::vector<PyTypeObject *> arrayInterfaceTypes;
  struct Typestr {
    std::string code; // "f4", "i8", ...
    uint8_t element;  // index in elementNames
    uint8_t bytes;
  };
  std::vector<Typestr> typestrs;
  PyObject *streamGetter = nullptr; // torch._C._cuda_getCurrentRawStream(device) -> int
  // kernel.py's _holds_negative_zero(value) -> bool, for Constexpr values that
  // are neither numbers, strings nor tuples (dataclasses, ...).
  PyObject *negativeZeroCheck = nullptr;
  // plan_key (LaunchPlan.cpp): types keyed by identity (torch.dtype), and
  // learner(value) -> whether value's type is now registered (or is a tensor).
  std::vector<PyTypeObject *> keyTypes;
  PyObject *keyTypeLearner = nullptr;
  // kept_plan (PlanKey.cpp): torch._C._len_torch_dispatch_stack() and torch.is_grad_enabled(), registered together.
  PyObject *dispatchStackLength = nullptr, *gradEnabled = nullptr;
  // The objects plan keys name by address (tensors' dtypes, dtype arguments), kept so that portablePlanKey reads
  // only addresses the key builder wrote.
  std::vector<PyObject *> tensorDtypes, keyValues;
  PyObject *isCuda = PyUnicode_InternFromString("is_cuda");
  PyObject *dtype = PyUnicode_InternFromString("dtype");
  PyObject *dataPtr = PyUnicode_InternFromString("data_ptr");
  PyObject *shape = PyUnicode_InternFromString("shape");
  PyObject *stride = PyUnicode_InternFromString("stride");
  PyObject *getDevice = PyUnicode_InternFromString("get_device");
  PyObject *elementSize = PyUnicode_InternFromString("element_size");
  PyObject *cudaStream = PyUnicode_InternFromString("cuda_stream");
  PyObject *constexprTag = PyUnicode_InternFromString("constexpr");
  PyTypeObject *tmaTileType = nullptr; // flydsl.expr.tma.TmaTile
  PyObject *tmaKey = PyUnicode_InternFromString("_key");
  PyObject *tensorMap = PyUnicode_InternFromString("tensor_map");
  PyObject *source = PyUnicode_InternFromString("source");
  PyObject *arrayInterface = PyUnicode_InternFromString("__cuda_array_interface__");
  PyObject *typestr = PyUnicode_InternFromString("typestr");
  PyObject *strides = PyUnicode_InternFromString("strides");
  PyObject *data = PyUnicode_InternFromString("data");
  PyObject *stream = PyUnicode_InternFromString("stream");
  PyObject *requiresGrad = PyUnicode_InternFromString("requires_grad");
};

/// The process-wide registry (never destroyed: it outlives the interpreter's
/// objects).
DispatchRegistry &registry();

/// The index of element type `name` (a str), registered if new; -1 if full.
int elementIndex(PyObject *name);

/// Adds the _register_* functions to the launcher extension `rt`.
void bindDispatchRegistry(nanobind::module_ &rt);

} // namespace fly::python

#endif // FLY_PYTHON_DISPATCHREGISTRY_H
