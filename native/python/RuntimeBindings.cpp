//===- RuntimeBindings.cpp - Python bindings of the CUDA launcher ---------===//
//
// The `runtime` submodule: driver queries, Module/Function loading and the
// kernel launch path, TensorMap (TMA descriptors passed by value), plus a
// DeviceBuffer for torch-free tests.
//
// Launch arguments are validated and packed completely before the driver is
// touched, so bad arguments raise the same errors with or without a GPU. The
// success path does no heap allocation (up to kInlineParams parameters that
// fit in kInlineArena bytes) and no string formatting.
//
//===----------------------------------------------------------------------===//

#include "../runtime/RuntimeBindings.h"
#include "../runtime/CudaDriver.h"

#include <nanobind/stl/string.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;
using fly::runtime::CUstream;
using fly::runtime::CUtensorMap;
using fly::runtime::DeviceBuffer;
using fly::runtime::DriverError;
using fly::runtime::Function;
using fly::runtime::Module;

namespace {

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
  nb::object owner;
};

/// The CudaError type (a RuntimeError subclass); owned for the process.
PyObject *cudaErrorType = nullptr;

/// Raises the pending Python error (set with PyErr_Format) as a C++ exception.
[[noreturn]] void raisePending() { throw nb::python_error(); }

template <typename... Args> [[noreturn]] void raise(PyObject *type, const char *fmt, Args... args) {
  PyErr_Format(type, fmt, args...);
  raisePending();
}

const char *kindName(char code) {
  switch (code) {
  case 'p':
    return "pointer";
  case 'i':
    return "int32";
  case 'I':
    return "uint32";
  case 'l':
    return "int64";
  case 'L':
    return "uint64";
  case 'f':
    return "float32";
  case 'd':
    return "float64";
  case 'm':
    return "TensorMap";
  default:
    return "?";
  }
}

//===----------------------------------------------------------------------===//
// Scalar conversion.
//===----------------------------------------------------------------------===//

/// Returns a new reference to `obj` as a Python int (ints and objects with
/// __index__, e.g. numpy integers), or null without an error set.
PyObject *asPyLong(PyObject *obj) {
  if (PyLong_Check(obj)) {
    Py_INCREF(obj);
    return obj;
  }
  if (!PyIndex_Check(obj))
    return nullptr;
  PyObject *v = PyNumber_Index(obj);
  if (!v)
    PyErr_Clear();
  return v;
}

[[noreturn]] void raiseWrongType(size_t index, char code, PyObject *obj) {
  if (code == 'p')
    raise(PyExc_TypeError,
          "argument %zu: expected pointer (int, DeviceBuffer, or an object with data_ptr() or "
          "__cuda_array_interface__), got %.200s",
          index, Py_TYPE(obj)->tp_name);
  raise(PyExc_TypeError, "argument %zu: expected %s, got %.200s", index, kindName(code),
        Py_TYPE(obj)->tp_name);
}

[[noreturn]] void raiseOutOfRange(size_t index, char code, PyObject *obj) {
  raise(PyExc_OverflowError, "argument %zu: expected %s, got %R (out of range)", index,
        kindName(code), obj);
}

/// Converts an integer to the 'i'/'I'/'l'/'L'/'p' kind and stores it.
void packInteger(size_t index, char code, PyObject *obj, PyObject *value, uint64_t *slot) {
  int overflow = 0;
  long long s = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (s == -1 && PyErr_Occurred())
    raisePending();
  switch (code) {
  case 'i':
    if (overflow || s < INT32_MIN || s > INT32_MAX)
      raiseOutOfRange(index, code, obj);
    {
      int32_t v = int32_t(s);
      std::memcpy(slot, &v, sizeof(v));
    }
    return;
  case 'I':
    if (overflow || s < 0 || s > UINT32_MAX)
      raiseOutOfRange(index, code, obj);
    {
      uint32_t v = uint32_t(s);
      std::memcpy(slot, &v, sizeof(v));
    }
    return;
  case 'l':
    if (overflow)
      raiseOutOfRange(index, code, obj);
    std::memcpy(slot, &s, sizeof(s));
    return;
  default: { // 'L' and 'p': unsigned 64-bit
    uint64_t u;
    if (!overflow) {
      if (s < 0)
        raiseOutOfRange(index, code, obj);
      u = uint64_t(s);
    } else {
      if (overflow < 0)
        raiseOutOfRange(index, code, obj);
      u = PyLong_AsUnsignedLongLong(value);
      if (u == uint64_t(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        raiseOutOfRange(index, code, obj);
      }
    }
    std::memcpy(slot, &u, sizeof(u));
    return;
  }
  }
}

void packIntegerObject(size_t index, char code, PyObject *obj, uint64_t *slot) {
  if (PyLong_CheckExact(obj))
    return packInteger(index, code, obj, obj, slot);
  nb::object v = nb::steal(asPyLong(obj));
  if (!v.is_valid())
    raiseWrongType(index, code, obj);
  packInteger(index, code, obj, v.ptr(), slot);
}

/// Device address of a pointer-like argument: int, None, DeviceBuffer,
/// data_ptr() (torch) or __cuda_array_interface__ (cupy, numba, ...).
void packPointer(size_t index, PyObject *obj, uint64_t *slot) {
  if (PyLong_CheckExact(obj))
    return packInteger(index, 'p', obj, obj, slot);
  if (obj == Py_None) {
    *slot = 0;
    return;
  }
  static PyObject *dataPtrName = PyUnicode_InternFromString("data_ptr");
  static PyObject *caiName = PyUnicode_InternFromString("__cuda_array_interface__");
  // The last type found to have data_ptr() (a strong reference, so its address
  // is never reused): tensors after the first skip the attribute probe, which
  // costs a lookup and a bound-method allocation per argument.
  static PyTypeObject *dataPtrType = nullptr;
  PyTypeObject *type = Py_TYPE(obj);
  if (type != dataPtrType) {
    if (PyBool_Check(obj))
      raiseWrongType(index, 'p', obj);
    if (nb::isinstance<DeviceBuffer>(obj)) {
      *slot = nb::inst_ptr<DeviceBuffer>(obj)->ptr();
      return;
    }
    if (PyObject_HasAttr(obj, dataPtrName)) {
      Py_INCREF(type);
      Py_XDECREF(dataPtrType);
      dataPtrType = type;
    }
  }
  if (type == dataPtrType) {
    nb::object r = nb::steal(PyObject_CallMethodNoArgs(obj, dataPtrName));
    if (!r.is_valid())
      raisePending();
    if (PyLong_CheckExact(r.ptr()))
      return packInteger(index, 'p', obj, r.ptr(), slot);
    nb::object v = nb::steal(asPyLong(r.ptr()));
    if (!v.is_valid())
      raise(PyExc_TypeError, "argument %zu: %.200s.data_ptr() returned %.200s, not an int", index,
            Py_TYPE(obj)->tp_name, Py_TYPE(r.ptr())->tp_name);
    return packInteger(index, 'p', obj, v.ptr(), slot);
  }
  if (PyObject_HasAttr(obj, caiName)) {
    nb::object cai = nb::steal(PyObject_GetAttr(obj, caiName));
    if (!cai.is_valid())
      raisePending();
    PyObject *data = PyDict_Check(cai.ptr()) ? PyDict_GetItemString(cai.ptr(), "data") : nullptr;
    PyObject *addr = data && PyTuple_Check(data) && PyTuple_GET_SIZE(data) >= 1
                         ? PyTuple_GET_ITEM(data, 0)
                         : nullptr;
    nb::object v = nb::steal(addr ? asPyLong(addr) : nullptr);
    if (!v.is_valid())
      raise(PyExc_TypeError, "argument %zu: %.200s.__cuda_array_interface__ has no integer data[0]",
            index, Py_TYPE(obj)->tp_name);
    return packInteger(index, 'p', obj, v.ptr(), slot);
  }
  nb::object v = nb::steal(asPyLong(obj));
  if (!v.is_valid())
    raiseWrongType(index, 'p', obj);
  packInteger(index, 'p', obj, v.ptr(), slot);
}

void packFloat(size_t index, char code, PyObject *obj, uint64_t *slot) {
  double d;
  if (PyFloat_CheckExact(obj)) {
    d = PyFloat_AS_DOUBLE(obj);
  } else {
    if (!PyFloat_Check(obj) && !PyLong_Check(obj) && !PyIndex_Check(obj) &&
        !(Py_TYPE(obj)->tp_as_number && Py_TYPE(obj)->tp_as_number->nb_float))
      raiseWrongType(index, code, obj);
    d = PyFloat_AsDouble(obj);
    if (d == -1.0 && PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        raiseOutOfRange(index, code, obj);
      }
      raisePending();
    }
  }
  if (code == 'd') {
    std::memcpy(slot, &d, sizeof(d));
    return;
  }
  float f = float(d);
  if (std::isinf(f) && std::isfinite(d))
    raiseOutOfRange(index, code, obj);
  std::memcpy(slot, &f, sizeof(f));
}

//===----------------------------------------------------------------------===//
// Launch configuration.
//===----------------------------------------------------------------------===//

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

void packTensorMap(size_t index, PyObject *obj, unsigned char *slot) {
  if (!nb::isinstance<PyTensorMap>(obj))
    raise(PyExc_TypeError, "argument %zu: expected TensorMap, got %.200s", index,
          Py_TYPE(obj)->tp_name);
  std::memcpy(slot, &nb::inst_ptr<PyTensorMap>(obj)->map, kTensorMapBytes);
}

/// Parses an int or a tuple/list of 1 to 3 positive ints (missing dims are 1).
void parseDims(PyObject *obj, const char *what, unsigned out[3]) {
  out[0] = out[1] = out[2] = 1;
  PyObject *items[3] = {obj, nullptr, nullptr};
  Py_ssize_t n = 1;
  if (PyTuple_Check(obj) || PyList_Check(obj)) {
    n = PySequence_Fast_GET_SIZE(obj);
    if (n < 1 || n > 3)
      raise(PyExc_ValueError, "%s must have 1 to 3 dimensions, got %R", what, obj);
    for (Py_ssize_t i = 0; i < n; ++i)
      items[i] = PySequence_Fast_GET_ITEM(obj, i);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::object v = nb::steal(asPyLong(items[i]));
    if (!v.is_valid() || PyBool_Check(items[i]))
      raise(PyExc_TypeError, "%s must be an int or a tuple of 3 ints, got %R", what, obj);
    int overflow = 0;
    long long d = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (d == -1 && PyErr_Occurred())
      raisePending();
    if (overflow || d <= 0 || d > UINT32_MAX)
      raise(PyExc_ValueError, "%s dimensions must be positive 32-bit ints, got %R", what, obj);
    out[i] = unsigned(d);
  }
}

unsigned parseSharedMem(PyObject *obj) {
  nb::object v = nb::steal(asPyLong(obj));
  if (!v.is_valid() || PyBool_Check(obj))
    raise(PyExc_TypeError, "shared_mem must be an int, got %.200s", Py_TYPE(obj)->tp_name);
  int overflow = 0;
  long long s = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (s == -1 && PyErr_Occurred())
    raisePending();
  if (overflow || s < 0 || s > UINT32_MAX)
    raise(PyExc_ValueError, "shared_mem must be a non-negative 32-bit int, got %R", obj);
  return unsigned(s);
}

/// A CUstream from an int handle, None (the legacy default stream), an object
/// with `cuda_stream` (torch.cuda.Stream) or with `__cuda_stream__()`.
CUstream parseStream(PyObject *obj) {
  if (obj == Py_None)
    return nullptr;
  nb::object v = nb::steal(asPyLong(obj));
  if (!v.is_valid()) {
    if (PyObject_HasAttrString(obj, "cuda_stream")) {
      nb::object h = nb::steal(PyObject_GetAttrString(obj, "cuda_stream"));
      v = h.is_valid() ? nb::steal(asPyLong(h.ptr())) : nb::object();
    } else if (PyObject_HasAttrString(obj, "__cuda_stream__")) {
      nb::object r = nb::steal(PyObject_CallMethod(obj, "__cuda_stream__", nullptr));
      if (r.is_valid() && PyTuple_Check(r.ptr()) && PyTuple_GET_SIZE(r.ptr()) == 2)
        v = nb::steal(asPyLong(PyTuple_GET_ITEM(r.ptr(), 1)));
    }
    if (PyErr_Occurred())
      raisePending();
    if (!v.is_valid())
      raise(PyExc_TypeError,
            "stream must be an int handle, None, or a stream object (cuda_stream / "
            "__cuda_stream__), got %.200s",
            Py_TYPE(obj)->tp_name);
  }
  uint64_t handle = PyLong_AsUnsignedLongLong(v.ptr());
  if (handle == uint64_t(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    raise(PyExc_ValueError, "stream handle out of range: %R", v.ptr());
  }
  return reinterpret_cast<CUstream>(uintptr_t(handle));
}

/// Parses and checks grid, block and cluster (None: no cluster).
void parseConfig(PyObject *grid, PyObject *block, PyObject *cluster, unsigned gridOut[3],
                 unsigned blockOut[3], unsigned clusterOut[3], bool &hasCluster) {
  parseDims(grid, "grid", gridOut);
  parseDims(block, "block", blockOut);
  unsigned long long threads =
      (unsigned long long)blockOut[0] * blockOut[1] * (unsigned long long)blockOut[2];
  if (threads > 1024)
    raise(PyExc_ValueError, "block %R has %llu threads; at most 1024 are allowed", block, threads);
  hasCluster = cluster != Py_None;
  if (hasCluster) {
    parseDims(cluster, "cluster", clusterOut);
    for (int i = 0; i < 3; ++i)
      if (gridOut[i] % clusterOut[i])
        raise(PyExc_ValueError, "grid %R is not a multiple of cluster %R", grid, cluster);
  }
}

/// Validates and packs one launch. `name` only appears in error messages.
void prepareLaunch(const char *name, PyObject *grid, PyObject *block, PyObject *signature,
                   PyObject *args, PyObject *sharedMem, PyObject *stream, PyObject *cluster,
                   LaunchArgs &out) {
  parseConfig(grid, block, cluster, out.grid, out.block, out.cluster, out.hasCluster);
  out.sharedBytes = parseSharedMem(sharedMem);
  out.stream = parseStream(stream);

  if (!PyUnicode_Check(signature))
    raise(PyExc_TypeError, "signature must be a str, got %.200s", Py_TYPE(signature)->tp_name);
  Py_ssize_t sigLen = 0;
  const char *sig = PyUnicode_AsUTF8AndSize(signature, &sigLen);
  if (!sig)
    raisePending();

  if (!PyTuple_Check(args) && !PyList_Check(args))
    raise(PyExc_TypeError, "args must be a tuple, got %.200s", Py_TYPE(args)->tp_name);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(args);
  if (n != sigLen)
    raise(PyExc_ValueError, "kernel '%s' takes %zd arguments (signature '%s'), got %zd", name,
          sigLen, sig, n);

  out.numParams = size_t(n);
  // Lay out the slots first (a bad code is reported below; it takes 8 bytes).
  size_t total = 0;
  for (size_t i = 0; i < out.numParams; ++i)
    total = alignUp(total, slotAlign(sig[i])) + slotBytes(sig[i]);
  out.arenaBytes = total;
  if (out.numParams <= kInlineParams && total <= kInlineArena) {
    out.arena = out.inlineArena;
    out.params = out.inlineParams;
  } else {
    // Over-allocate so the arena can start on a kTensorMapAlign boundary.
    out.heapArena.reset(new unsigned char[total + kTensorMapAlign]);
    out.arena = reinterpret_cast<unsigned char *>(
        alignUp(reinterpret_cast<uintptr_t>(out.heapArena.get()), kTensorMapAlign));
    out.heapParams.resize(out.numParams);
    out.params = out.heapParams.data();
  }

  PyObject **items = PySequence_Fast_ITEMS(args);
  size_t offset = 0;
  for (size_t i = 0; i < out.numParams; ++i) {
    PyObject *obj = items[i];
    char code = sig[i];
    size_t start = alignUp(offset, slotAlign(code));
    // Zero padding and slot, so narrower kinds leave the upper bytes defined.
    std::memset(out.arena + offset, 0, start - offset + kSlotBytes);
    offset = start + slotBytes(code);
    out.params[i] = out.arena + start;
    uint64_t *slot = reinterpret_cast<uint64_t *>(out.arena + start);
    switch (code) {
    case 'p':
      packPointer(i, obj, slot);
      break;
    case 'i':
    case 'I':
    case 'l':
    case 'L':
      packIntegerObject(i, code, obj, slot);
      break;
    case 'f':
    case 'd':
      packFloat(i, code, obj, slot);
      break;
    case 'm':
      packTensorMap(i, obj, out.arena + start);
      break;
    default:
      raise(PyExc_ValueError,
            "signature '%s' has invalid code '%c' at position %zu (expected one of "
            "p, i, I, l, L, f, d, m)",
            sig, code, i);
    }
  }
}

//===----------------------------------------------------------------------===//
// Python wrappers.
//===----------------------------------------------------------------------===//

/// Python-side Module: owns the shared_ptr the Functions also hold.
struct PyModule {
  std::shared_ptr<Module> impl;
};

/// A contiguous read-only view of any buffer-protocol object.
class BufferView {
public:
  explicit BufferView(PyObject *obj) {
    if (PyObject_GetBuffer(obj, &view_, PyBUF_C_CONTIGUOUS) != 0)
      raisePending();
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView &) = delete;
  BufferView &operator=(const BufferView &) = delete;
  const void *data() const { return view_.buf; }
  size_t size() const { return size_t(view_.len); }

private:
  Py_buffer view_;
};

std::shared_ptr<Module> loadModule(nb::handle image) {
  if (PyUnicode_Check(image.ptr())) {
    Py_ssize_t size = 0;
    const char *text = PyUnicode_AsUTF8AndSize(image.ptr(), &size);
    if (!text)
      raisePending();
    nb::gil_scoped_release release; // PTX JIT can take a while
    return Module::load(text, size_t(size));
  }
  BufferView view(image.ptr());
  nb::gil_scoped_release release;
  return Module::load(view.data(), view.size());
}

void launchFunction(const Function &fn, nb::handle grid, nb::handle block, nb::handle signature,
                    nb::handle args, nb::handle sharedMem, nb::handle stream, nb::handle cluster) {
  LaunchArgs la;
  prepareLaunch(fn.name().c_str(), grid.ptr(), block.ptr(), signature.ptr(), args.ptr(),
                sharedMem.ptr(), stream.ptr(), cluster.ptr(), la);
  fn.launch(la.grid, la.block, la.params, la.sharedBytes, la.stream,
            la.hasCluster ? la.cluster : nullptr);
}

nb::tuple dimsTuple(const unsigned d[3]) { return nb::make_tuple(d[0], d[1], d[2]); }

/// Test hook: runs the whole validation and packing of Function.launch without
/// a driver and returns what would be passed to it.
nb::dict validateLaunch(nb::handle grid, nb::handle block, nb::handle signature, nb::handle args,
                        nb::handle sharedMem, nb::handle stream, nb::handle cluster,
                        const std::string &name) {
  LaunchArgs la;
  prepareLaunch(name.c_str(), grid.ptr(), block.ptr(), signature.ptr(), args.ptr(), sharedMem.ptr(),
                stream.ptr(), cluster.ptr(), la);
  nb::dict d;
  d["grid"] = dimsTuple(la.grid);
  d["block"] = dimsTuple(la.block);
  d["cluster"] = la.hasCluster ? nb::object(dimsTuple(la.cluster)) : nb::none();
  d["shared_mem"] = la.sharedBytes;
  d["stream"] = uint64_t(reinterpret_cast<uintptr_t>(la.stream));
  d["params"] = nb::bytes(reinterpret_cast<const char *>(la.arena), la.arenaBytes);
  const char *sig = PyUnicode_AsUTF8(signature.ptr()); // checked by prepareLaunch
  nb::list offsets;
  bool aligned = reinterpret_cast<uintptr_t>(la.arena) % kTensorMapAlign == 0;
  for (size_t i = 0; i < la.numParams; ++i) {
    auto *p = static_cast<unsigned char *>(la.params[i]);
    offsets.append(size_t(p - la.arena));
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % slotAlign(sig[i]) == 0;
  }
  d["offsets"] = nb::tuple(offsets);
  d["aligned"] = aligned;
  d["inline"] = la.arena == la.inlineArena;
  return d;
}

//===----------------------------------------------------------------------===//
// TensorMap.
//===----------------------------------------------------------------------===//

struct DtypeName {
  const char *name;
  int type;
};

// fp8 (and int8) data moves as bytes: TMA only copies, so u8 describes it.
constexpr DtypeName kDtypes[] = {
    {"u8", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"u16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT16},
    {"u32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT32},
    {"i32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_INT32},
    {"u64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT64},
    {"i64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_INT64},
    {"f16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT16},
    {"f32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT32},
    {"f64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT64},
    {"bf16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16},
    {"f32_ftz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ},
    {"tf32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32},
    {"tf32_ftz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ},
    // Aliases (torch/numpy spellings and the byte-moved types).
    {"uint8", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"uint16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT16},
    {"uint32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT32},
    {"int32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_INT32},
    {"uint64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT64},
    {"int64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_INT64},
    {"float16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT16},
    {"float32", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT32},
    {"float64", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_FLOAT64},
    {"bfloat16", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16},
    {"i8", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"int8", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"f8e4m3", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"f8e4m3fn", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"f8e4m3fnuz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"f8e5m2", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"f8e5m2fnuz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"float8_e4m3fn", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"float8_e4m3fnuz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"float8_e5m2", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"float8_e5m2fnuz", fly::runtime::CU_TENSOR_MAP_DATA_TYPE_UINT8},
};

int parseDtype(const std::string &name) {
  for (const DtypeName &d : kDtypes)
    if (name == d.name)
      return d.type;
  throw std::invalid_argument("dtype: unknown '" + name +
                              "' (expected u8, u16, u32, i32, u64, i64, f16, f32, f64, bf16, "
                              "f32_ftz, tf32, or an fp8 name such as f8e4m3)");
}

const char *dtypeName(int type) {
  for (const DtypeName &d : kDtypes)
    if (d.type == type)
      return d.name; // the first entry of each type is its short name
  return "?";
}

/// Parses a sequence of non-negative ints no larger than `max` into `out`;
/// returns its length. Errors name the argument (`what[i]`).
template <typename T, size_t N>
size_t parseUIntList(nb::handle obj, const char *what, std::array<T, N> &out, uint64_t max) {
  if (!PySequence_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
    raise(PyExc_TypeError, "%s: expected a sequence of ints, got %.200s", what,
          Py_TYPE(obj.ptr())->tp_name);
  nb::object seq = nb::steal(PySequence_Fast(obj.ptr(), what));
  if (!seq.is_valid())
    raisePending();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  if (size_t(n) > N)
    raise(PyExc_ValueError, "%s: at most %zu entries (rank <= 5), got %zd", what, N, n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *item = PySequence_Fast_GET_ITEM(seq.ptr(), i);
    nb::object v = nb::steal(asPyLong(item));
    if (!v.is_valid() || PyBool_Check(item))
      raise(PyExc_TypeError, "%s[%zd]: expected an int, got %.200s", what, i,
            Py_TYPE(item)->tp_name);
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (x == -1 && PyErr_Occurred())
      raisePending();
    if (overflow || x < 0 || uint64_t(x) > max)
      raise(PyExc_ValueError, "%s[%zd]: out of range, got %R", what, i, item);
    out[size_t(i)] = T(x);
  }
  return size_t(n);
}

/// Maps a byte count to its enum value (the position of `bytes` in `choices`).
int parseChoice(nb::handle obj, const char *what, const long long *choices, int count,
                const char *expected) {
  nb::object v = nb::steal(asPyLong(obj.ptr()));
  if (!v.is_valid() || PyBool_Check(obj.ptr()))
    raise(PyExc_TypeError, "%s: expected an int (%s), got %.200s", what, expected,
          Py_TYPE(obj.ptr())->tp_name);
  long long x = PyLong_AsLongLong(v.ptr());
  if (x == -1 && PyErr_Occurred())
    PyErr_Clear();
  for (int i = 0; i < count; ++i)
    if (x == choices[i])
      return i;
  raise(PyExc_ValueError, "%s: expected %s, got %R", what, expected, obj.ptr());
}

PyTensorMap encodeTiled(const std::string &dtype, nb::handle globalAddress, nb::handle dims,
                        nb::handle stridesBytes, nb::handle box, nb::handle elementStrides,
                        nb::handle swizzle, nb::handle interleave, nb::handle l2Promotion,
                        bool oobFillNan) {
  fly::runtime::TiledTensorMapSpec spec;
  spec.dataType = parseDtype(dtype);

  // The address: an int or anything a 'p' launch argument accepts.
  uint64_t address = 0;
  try {
    packPointer(0, globalAddress.ptr(), &address);
  } catch (nb::python_error &) {
    if (PyLong_Check(globalAddress.ptr()))
      raise(PyExc_ValueError, "global_address: must be a non-negative 64-bit int, got %R",
            globalAddress.ptr());
    raise(PyExc_TypeError,
          "global_address: expected a non-negative int or a tensor-like (data_ptr(), "
          "__cuda_array_interface__, DeviceBuffer), got %.200s",
          Py_TYPE(globalAddress.ptr())->tp_name);
  }
  spec.globalAddress = address;

  spec.rank = unsigned(parseUIntList(dims, "dims", spec.dims, UINT64_MAX));
  if (spec.rank < 1)
    throw std::invalid_argument("dims: rank must be 1 to 5, got 0");
  size_t nStrides = parseUIntList(stridesBytes, "strides_bytes", spec.strides, UINT64_MAX);
  if (nStrides != spec.rank - 1)
    throw std::invalid_argument(
        "strides_bytes: expected rank - 1 = " + std::to_string(spec.rank - 1) +
        " entries (strides of dims 1..), got " + std::to_string(nStrides));
  size_t nBox = parseUIntList(box, "box", spec.box, UINT32_MAX);
  if (nBox != spec.rank)
    throw std::invalid_argument("box: expected " + std::to_string(spec.rank) + " entries, got " +
                                std::to_string(nBox));
  if (elementStrides.is_none()) {
    spec.elementStrides.fill(1);
  } else {
    size_t nElem =
        parseUIntList(elementStrides, "element_strides", spec.elementStrides, UINT32_MAX);
    if (nElem != spec.rank)
      throw std::invalid_argument("element_strides: expected " + std::to_string(spec.rank) +
                                  " entries, got " + std::to_string(nElem));
  }

  static const long long swizzles[] = {0, 32, 64, 128};
  static const long long interleaves[] = {0, 16, 32};
  static const long long promotions[] = {0, 64, 128, 256};
  spec.swizzle = parseChoice(swizzle, "swizzle", swizzles, 4, "0, 32, 64 or 128 (bytes)");
  spec.interleave = parseChoice(interleave, "interleave", interleaves, 3, "0, 16 or 32 (bytes)");
  spec.l2Promotion =
      parseChoice(l2Promotion, "l2_promotion", promotions, 4, "0, 64, 128 or 256 (bytes)");
  spec.oobFill = oobFillNan ? fly::runtime::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                            : fly::runtime::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;

  CUtensorMap map = fly::runtime::encodeTiled(spec); // validates first, then the driver
  // Keep a tensor-like alive as long as the map that points into it.
  nb::object owner = PyLong_Check(globalAddress.ptr()) ? nb::object() : nb::borrow(globalAddress);
  return PyTensorMap{map, spec.dataType, spec.rank, spec.globalAddress, std::move(owner)};
}

//===----------------------------------------------------------------------===//
// Dispatcher: the launch path of a @flyc.kernel in one native call.
//
// Built once per kernel from its parameter kinds. `launch(values, grid, block,
// smem, stream, cluster)` reads torch tensors through the C API (is_cuda,
// dtype, data_ptr(), shape, stride()), computes the specialization exactly as
// kernel.py does, finds the loaded kernel among those registered with `add`,
// packs the launch arguments and launches. Whatever it does not handle (other
// tensor types, a dtype or tensor type not registered yet, a value kernel.py
// would reject, a specialization not registered, a stream object it cannot
// read) returns False with nothing launched and no Python error set: the
// Python path then does the work, and raises its errors naming the parameter.
// Only grid/block/cluster errors and driver errors raise here, as they would
// from Function.launch on the Python path.
//===----------------------------------------------------------------------===//

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
  PyObject *streamGetter = nullptr; // torch._C._cuda_getCurrentRawStream(device) -> int
  PyObject *isCuda = PyUnicode_InternFromString("is_cuda");
  PyObject *dtype = PyUnicode_InternFromString("dtype");
  PyObject *dataPtr = PyUnicode_InternFromString("data_ptr");
  PyObject *shape = PyUnicode_InternFromString("shape");
  PyObject *stride = PyUnicode_InternFromString("stride");
  PyObject *getDevice = PyUnicode_InternFromString("get_device");
  PyObject *cudaStream = PyUnicode_InternFromString("cuda_stream");
  PyObject *constexprTag = PyUnicode_InternFromString("constexpr");
};

DispatchRegistry &registry() {
  static auto *r = new DispatchRegistry; // never destroyed: outlives the interpreter's objects
  return *r;
}

constexpr size_t kMaxElementNames = 250;
constexpr size_t kMaxDtypes = 64;
constexpr size_t kMaxTensorTypes = 32;
constexpr size_t kMaxRank = 16;
constexpr size_t kMaxLaunchValues = 256;
constexpr size_t kMaxKeyBytes = 512;
constexpr size_t kMaxConstexprs = 32;
constexpr size_t kMaxEntries = 256;

/// The index of element type `name` (a str), registered if new; -1 if full.
int elementIndex(PyObject *name) {
  auto &names = registry().elementNames;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name || PyUnicode_Compare(names[i], name) == 0)
      return int(i);
  if (PyErr_Occurred())
    raisePending();
  if (names.size() >= kMaxElementNames)
    return -1;
  Py_INCREF(name);
  names.push_back(name);
  return int(names.size() - 1);
}

struct LaunchValue {
  enum Tag : uint8_t { Int, UInt, Float } tag;
  union {
    long long i;
    unsigned long long u;
    double d;
  };
};

/// One call's arguments as read by the dispatcher (borrowed references).
struct Described {
  unsigned char key[kMaxKeyBytes];
  size_t keyBytes = 0;
  PyObject *constexprs[kMaxConstexprs];
  Py_hash_t hashes[kMaxConstexprs];
  size_t numConstexprs = 0;
  LaunchValue values[kMaxLaunchValues];
  size_t numValues = 0;
  PyObject *streamValue = nullptr; // the fx.Stream parameter's value
  PyObject *firstTensor = nullptr;
};

struct DispatchParam {
  char kind; // 't' tensor, 'i' integer, 'f' float, 'c' constexpr, 's' stream
  long long low = 0, high = 0;
  nb::object keyName; // numeric parameters: their entry of the key
};

struct DispatchEntry {
  std::vector<unsigned char> key;
  std::vector<nb::object> constexprs;
  std::vector<Py_hash_t> hashes;
  std::unique_ptr<Function> function; // null: registered for tests only
  std::string signature;
  unsigned sharedBytes = 0;
};

/// Calls obj.name() without building a bound method.
PyObject *callMethod0(PyObject *obj, PyObject *name) {
  PyObject *args[2] = {nullptr, obj};
  return PyObject_VectorcallMethod(name, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

/// A Python int within long long, else false (no error set).
bool readLongLong(PyObject *obj, long long &out) {
  if (!PyLong_Check(obj))
    return false;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (overflow)
    return false;
  out = v;
  return true;
}

/// False with the pending error (if any) cleared: the Python path takes over.
bool decline() {
  if (PyErr_Occurred())
    PyErr_Clear();
  return false;
}

class Dispatcher {
public:
  explicit Dispatcher(nb::handle params) {
    for (nb::handle item : params) {
      nb::tuple t = nb::cast<nb::tuple>(item);
      if (t.size() != 4)
        throw std::invalid_argument("Dispatcher: each parameter is (kind, low, high, key_name)");
      std::string kind = nb::cast<std::string>(t[0]);
      if (kind.size() != 1 || std::string("tifcs").find(kind[0]) == std::string::npos)
        throw std::invalid_argument("Dispatcher: kind must be one of t, i, f, c, s; got '" + kind +
                                    "'");
      DispatchParam p;
      p.kind = kind[0];
      p.low = nb::cast<long long>(t[1]);
      p.high = nb::cast<long long>(t[2]);
      p.keyName = nb::borrow(t[3]);
      params_.push_back(std::move(p));
    }
  }

  /// Reads `values`; false where the Python path must take over.
  bool describe(PyObject *values, Described &d) const {
    if (!PyTuple_Check(values) && !PyList_Check(values))
      return false;
    if (size_t(PySequence_Fast_GET_SIZE(values)) != params_.size())
      return false;
    PyObject **items = PySequence_Fast_ITEMS(values);
    for (size_t i = 0; i < params_.size(); ++i) {
      const DispatchParam &p = params_[i];
      PyObject *v = items[i];
      switch (p.kind) {
      case 't':
        if (!describeTensor(v, d))
          return decline();
        break;
      case 'i': {
        long long x;
        if (!readLongLong(v, x) || x < p.low || x > p.high || d.numValues >= kMaxLaunchValues)
          return decline();
        LaunchValue &out = d.values[d.numValues++];
        out.tag = LaunchValue::Int;
        out.i = x;
        break;
      }
      case 'f': {
        double x;
        if (PyFloat_CheckExact(v)) {
          x = PyFloat_AS_DOUBLE(v);
        } else if (PyLong_Check(v) && !PyBool_Check(v)) {
          x = PyLong_AsDouble(v);
          if (x == -1.0 && PyErr_Occurred())
            return decline();
        } else if (PyFloat_Check(v)) {
          nb::object f = nb::steal(PyNumber_Float(v)); // float(value), as kernel.py
          if (!f.is_valid() || !PyFloat_Check(f.ptr()))
            return decline();
          x = PyFloat_AS_DOUBLE(f.ptr());
        } else {
          return false;
        }
        if (d.numValues >= kMaxLaunchValues)
          return false;
        LaunchValue &out = d.values[d.numValues++];
        out.tag = LaunchValue::Float;
        out.d = x;
        break;
      }
      case 'c': {
        Py_hash_t h = PyObject_Hash(v);
        if (h == -1 && PyErr_Occurred())
          return decline();
        if (d.numConstexprs >= kMaxConstexprs)
          return false;
        d.constexprs[d.numConstexprs] = v;
        d.hashes[d.numConstexprs++] = h;
        break;
      }
      default: // 's'
        d.streamValue = v;
      }
    }
    return true;
  }

  /// The registered entry for `d`, or null.
  std::shared_ptr<DispatchEntry> find(const Described &d) {
    size_t n = entries_.size();
    if (last_ < n && matches(*entries_[last_], d))
      return entries_[last_];
    for (size_t i = 0; i < n; ++i)
      if (i != last_ && matches(*entries_[i], d)) {
        last_ = i;
        return entries_[i];
      }
    return nullptr;
  }

  /// The kernel.py key (a tuple) of `d`.
  nb::object pythonKey(const Described &d) const {
    auto &names = registry().elementNames;
    nb::list key;
    size_t offset = 0, constexprIndex = 0;
    for (const DispatchParam &p : params_) {
      switch (p.kind) {
      case 't': {
        unsigned element = d.key[offset], rank = d.key[offset + 1];
        bool aligned = d.key[offset + 2];
        nb::list kinds;
        for (unsigned r = 0; r < rank; ++r)
          kinds.append(int(d.key[offset + 3 + r]));
        key.append(nb::make_tuple(nb::handle(names[element]), rank, nb::tuple(kinds), aligned));
        offset += 3 + rank;
        break;
      }
      case 'i':
      case 'f':
        key.append(p.keyName);
        break;
      case 'c': {
        PyObject *v = d.constexprs[constexprIndex++];
        nb::object typeName =
            nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject *>(Py_TYPE(v)), "__name__"));
        if (!typeName.is_valid())
          raisePending();
        key.append(nb::make_tuple(nb::handle(registry().constexprTag), typeName, nb::handle(v)));
        break;
      }
      default:
        break;
      }
    }
    return nb::tuple(key);
  }

  /// Registers a kernel.py key's loaded kernel; false if the key cannot be
  /// matched natively (or the table is full).
  bool add(nb::handle key, nb::handle function, const std::string &signature,
           unsigned sharedBytes) {
    if (!PyTuple_Check(key.ptr()))
      return false;
    auto entry = std::make_shared<DispatchEntry>();
    size_t item = 0, count = size_t(PyTuple_GET_SIZE(key.ptr()));
    for (const DispatchParam &p : params_) {
      if (p.kind == 's')
        continue;
      if (item >= count)
        return false;
      PyObject *part = PyTuple_GET_ITEM(key.ptr(), item++);
      if (p.kind == 't') {
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 4 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(part, 0)))
          return false;
        int element = elementIndex(PyTuple_GET_ITEM(part, 0));
        long long rank;
        PyObject *kinds = PyTuple_GET_ITEM(part, 2);
        if (element < 0 || !readLongLong(PyTuple_GET_ITEM(part, 1), rank) || rank < 0 ||
            size_t(rank) > kMaxRank || !PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != rank)
          return decline();
        entry->key.push_back(uint8_t(element));
        entry->key.push_back(uint8_t(rank));
        entry->key.push_back(PyObject_IsTrue(PyTuple_GET_ITEM(part, 3)) == 1);
        for (long long r = 0; r < rank; ++r) {
          long long kind;
          if (!readLongLong(PyTuple_GET_ITEM(kinds, r), kind) ||
              (kind != 0 && kind != 1 && kind != 16))
            return decline();
          entry->key.push_back(uint8_t(kind));
        }
      } else if (p.kind == 'c') {
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 3)
          return false;
        PyObject *v = PyTuple_GET_ITEM(part, 2);
        Py_hash_t h = PyObject_Hash(v);
        if (h == -1 && PyErr_Occurred())
          return decline();
        entry->constexprs.push_back(nb::borrow(v));
        entry->hashes.push_back(h);
      }
    }
    if (item != count || entry->key.size() > kMaxKeyBytes)
      return false;
    if (!function.is_none())
      entry->function = std::make_unique<Function>(nb::cast<const Function &>(function));
    entry->signature = signature;
    entry->sharedBytes = sharedBytes;
    for (auto &existing : entries_)
      if (existing->key == entry->key && sameConstexprs(*existing, *entry)) {
        existing = std::move(entry); // a reload replaces the kernel
        return true;
      }
    if (entries_.size() >= kMaxEntries)
      return false;
    entries_.push_back(std::move(entry));
    return true;
  }

  /// Everything a launch needs, short of grid/block/cluster; false: decline.
  bool prepare(PyObject *values, PyObject *smem, PyObject *stream, Described &d,
               std::shared_ptr<DispatchEntry> &entry, unsigned &shared, CUstream &handle,
               uint64_t *slots) {
    if (!describe(values, d))
      return false;
    entry = find(d);
    if (!entry)
      return decline();
    if (smem == Py_None) {
      shared = entry->sharedBytes;
    } else {
      long long s;
      if (!PyLong_CheckExact(smem) || !readLongLong(smem, s) || s < (long long)entry->sharedBytes ||
          s > (long long)UINT32_MAX)
        return false;
      shared = unsigned(s);
    }
    if (!resolveStream(stream, d, handle))
      return decline();
    return pack(d, entry->signature, slots);
  }

  bool launch(nb::handle values, nb::handle grid, nb::handle block, nb::handle smem,
              nb::handle stream, nb::handle cluster) {
    Described d;
    std::shared_ptr<DispatchEntry> entry;
    unsigned shared = 0;
    CUstream handle = nullptr;
    uint64_t slots[kMaxLaunchValues];
    if (!prepare(values.ptr(), smem.ptr(), stream.ptr(), d, entry, shared, handle, slots) ||
        !entry->function)
      return false;
    void *params[kMaxLaunchValues];
    for (size_t i = 0; i < d.numValues; ++i)
      params[i] = &slots[i];
    unsigned g[3], b[3], c[3];
    bool hasCluster = false;
    parseConfig(grid.ptr(), block.ptr(), cluster.ptr(), g, b, c, hasCluster);
    entry->function->launch(g, b, params, shared, handle, hasCluster ? c : nullptr);
    return true;
  }

  /// Test hook: what `launch` would pass to the driver, or None where it declines.
  nb::object dryRun(nb::handle values, nb::handle grid, nb::handle block, nb::handle smem,
                    nb::handle stream, nb::handle cluster) {
    Described d;
    std::shared_ptr<DispatchEntry> entry;
    unsigned shared = 0;
    CUstream handle = nullptr;
    uint64_t slots[kMaxLaunchValues];
    if (!prepare(values.ptr(), smem.ptr(), stream.ptr(), d, entry, shared, handle, slots))
      return nb::none();
    unsigned g[3], b[3], c[3];
    bool hasCluster = false;
    parseConfig(grid.ptr(), block.ptr(), cluster.ptr(), g, b, c, hasCluster);
    nb::dict out;
    out["grid"] = dimsTuple(g);
    out["block"] = dimsTuple(b);
    out["cluster"] = hasCluster ? nb::object(dimsTuple(c)) : nb::none();
    out["shared_mem"] = shared;
    out["stream"] = uint64_t(reinterpret_cast<uintptr_t>(handle));
    out["params"] = nb::bytes(reinterpret_cast<const char *>(slots), d.numValues * kSlotBytes);
    out["key"] = pythonKey(d);
    return out;
  }

  /// (key, launch arguments) as kernel.py's specialize computes them, or None.
  nb::object describeArguments(nb::handle values) {
    Described d;
    if (!describe(values.ptr(), d))
      return nb::none();
    nb::list args;
    for (size_t i = 0; i < d.numValues; ++i) {
      const LaunchValue &v = d.values[i];
      if (v.tag == LaunchValue::Float)
        args.append(nb::float_(v.d));
      else if (v.tag == LaunchValue::UInt)
        args.append(nb::steal(PyLong_FromUnsignedLongLong(v.u)));
      else
        args.append(nb::steal(PyLong_FromLongLong(v.i)));
    }
    return nb::make_tuple(pythonKey(d), args);
  }

  size_t size() const { return entries_.size(); }
  void clear() {
    entries_.clear();
    last_ = 0;
  }

private:
  bool describeTensor(PyObject *obj, Described &d) const {
    DispatchRegistry &reg = registry();
    PyTypeObject *type = Py_TYPE(obj);
    bool known = false;
    for (PyTypeObject *t : reg.tensorTypes)
      known |= t == type;
    if (!known)
      return false;
    nb::object isCuda = nb::steal(PyObject_GetAttr(obj, reg.isCuda));
    if (isCuda.ptr() != Py_True)
      return false;
    nb::object dtype = nb::steal(PyObject_GetAttr(obj, reg.dtype));
    const DispatchRegistry::Dtype *found = nullptr;
    for (const auto &entry : reg.dtypes)
      if (entry.object == dtype.ptr())
        found = &entry;
    if (!found)
      return false;
    nb::object pointerObj = nb::steal(callMethod0(obj, reg.dataPtr));
    if (!pointerObj.is_valid() || !PyLong_Check(pointerObj.ptr()))
      return false;
    unsigned long long pointer = PyLong_AsUnsignedLongLong(pointerObj.ptr());
    if (pointer == (unsigned long long)-1 && PyErr_Occurred())
      return false;
    nb::object shape = nb::steal(PyObject_GetAttr(obj, reg.shape));
    if (!shape.is_valid() || !PyTuple_Check(shape.ptr()))
      return false;
    size_t rank = size_t(PyTuple_GET_SIZE(shape.ptr()));
    nb::object strides = nb::steal(callMethod0(obj, reg.stride));
    if (!strides.is_valid() || !PyTuple_Check(strides.ptr()) ||
        size_t(PyTuple_GET_SIZE(strides.ptr())) != rank || rank > kMaxRank ||
        d.keyBytes + 3 + rank > kMaxKeyBytes || d.numValues + 1 + 2 * rank > kMaxLaunchValues)
      return false;

    unsigned char *key = d.key + d.keyBytes;
    key[0] = found->element;
    key[1] = uint8_t(rank);
    key[2] = (pointer & 15) == 0;
    LaunchValue *out = d.values + d.numValues;
    out->tag = LaunchValue::UInt;
    out->u = pointer;
    ++out;
    for (size_t r = 0; r < rank; ++r, ++out) {
      out->tag = LaunchValue::Int;
      if (!readLongLong(PyTuple_GET_ITEM(shape.ptr(), r), out->i))
        return false;
    }
    long long per16Bytes = found->bytes >= 16 ? 1 : 16 / found->bytes;
    for (size_t r = 0; r < rank; ++r) {
      long long s;
      if (!readLongLong(PyTuple_GET_ITEM(strides.ptr(), r), s))
        return false;
      uint8_t kind = s == 1 ? 1 : (s % per16Bytes == 0 ? 16 : 0);
      key[3 + r] = kind;
      if (kind != 1) {
        out->tag = LaunchValue::Int;
        out->i = s;
        ++out;
      }
    }
    d.keyBytes += 3 + rank;
    d.numValues = size_t(out - d.values);
    if (!d.firstTensor)
      d.firstTensor = obj;
    return true;
  }

  static bool sameConstexprs(const DispatchEntry &a, const DispatchEntry &b) {
    for (size_t i = 0; i < a.constexprs.size(); ++i) {
      PyObject *x = a.constexprs[i].ptr(), *y = b.constexprs[i].ptr();
      if (x == y)
        continue;
      if (Py_TYPE(x) != Py_TYPE(y) || a.hashes[i] != b.hashes[i])
        return false;
      int eq = PyObject_RichCompareBool(x, y, Py_EQ);
      if (eq != 1)
        return decline();
    }
    return true;
  }

  static bool matches(const DispatchEntry &e, const Described &d) {
    if (e.key.size() != d.keyBytes || std::memcmp(e.key.data(), d.key, d.keyBytes) != 0 ||
        e.constexprs.size() != d.numConstexprs)
      return false;
    for (size_t i = 0; i < d.numConstexprs; ++i) {
      PyObject *x = e.constexprs[i].ptr(), *y = d.constexprs[i];
      if (x == y)
        continue;
      if (Py_TYPE(x) != Py_TYPE(y) || e.hashes[i] != d.hashes[i])
        return false;
      int eq = PyObject_RichCompareBool(x, y, Py_EQ);
      if (eq != 1)
        return decline();
    }
    return true;
  }

  /// The stream as kernel.py picks it: the launch's, else the fx.Stream
  /// argument, else the first tensor's current torch stream.
  static bool resolveStream(PyObject *stream, const Described &d, CUstream &out) {
    DispatchRegistry &reg = registry();
    PyObject *chosen = stream != Py_None ? stream : d.streamValue;
    nb::object handle;
    if (chosen && chosen != Py_None) {
      if (PyLong_CheckExact(chosen)) {
        handle = nb::borrow(chosen);
      } else {
        handle = nb::steal(PyObject_GetAttr(chosen, reg.cudaStream));
        if (!handle.is_valid() || !PyLong_CheckExact(handle.ptr()))
          return false;
      }
    } else if (!d.firstTensor) {
      out = nullptr; // no tensor: the legacy default stream
      return true;
    } else {
      if (!reg.streamGetter)
        return false;
      nb::object device = nb::steal(callMethod0(d.firstTensor, reg.getDevice));
      if (!device.is_valid())
        return false;
      handle = nb::steal(PyObject_CallOneArg(reg.streamGetter, device.ptr()));
      if (!handle.is_valid() || !PyLong_Check(handle.ptr()))
        return false;
    }
    unsigned long long h = PyLong_AsUnsignedLongLong(handle.ptr());
    if (h == (unsigned long long)-1 && PyErr_Occurred())
      return false;
    out = reinterpret_cast<CUstream>(uintptr_t(h));
    return true;
  }

  /// Packs the values as Function.launch would pack them for `sig`; false
  /// where it would raise (the Python path then raises it).
  static bool pack(const Described &d, const std::string &sig, uint64_t *slots) {
    if (sig.size() != d.numValues)
      return false;
    for (size_t i = 0; i < d.numValues; ++i) {
      const LaunchValue &v = d.values[i];
      uint64_t *slot = &slots[i];
      *slot = 0;
      bool isInt = v.tag != LaunchValue::Float;
      bool negative = v.tag == LaunchValue::Int && v.i < 0;
      unsigned long long asUnsigned = v.tag == LaunchValue::UInt ? v.u : (unsigned long long)v.i;
      switch (sig[i]) {
      case 'p':
      case 'L':
        if (!isInt || negative)
          return false;
        std::memcpy(slot, &asUnsigned, sizeof(asUnsigned));
        break;
      case 'l': {
        if (!isInt || (v.tag == LaunchValue::UInt && v.u > (unsigned long long)INT64_MAX))
          return false;
        long long s = (long long)asUnsigned;
        std::memcpy(slot, &s, sizeof(s));
        break;
      }
      case 'i': {
        long long s = (long long)asUnsigned;
        if (!isInt || (v.tag == LaunchValue::UInt && v.u > INT32_MAX) || s < INT32_MIN ||
            s > INT32_MAX)
          return false;
        int32_t x = int32_t(s);
        std::memcpy(slot, &x, sizeof(x));
        break;
      }
      case 'I': {
        if (!isInt || negative || asUnsigned > UINT32_MAX)
          return false;
        uint32_t x = uint32_t(asUnsigned);
        std::memcpy(slot, &x, sizeof(x));
        break;
      }
      case 'f': {
        if (isInt)
          return false;
        float f = float(v.d);
        if (std::isinf(f) && std::isfinite(v.d))
          return false;
        std::memcpy(slot, &f, sizeof(f));
        break;
      }
      case 'd':
        if (isInt)
          return false;
        std::memcpy(slot, &v.d, sizeof(v.d));
        break;
      default:
        return false;
      }
    }
    return true;
  }

  std::vector<DispatchParam> params_;
  std::vector<std::shared_ptr<DispatchEntry>> entries_;
  size_t last_ = 0;
};

void registerTensorType(nb::handle type) {
  if (!PyType_Check(type.ptr()))
    throw nb::type_error("expected a type");
  auto &types = registry().tensorTypes;
  auto *t = reinterpret_cast<PyTypeObject *>(type.ptr());
  for (PyTypeObject *known : types)
    if (known == t)
      return;
  if (types.size() >= kMaxTensorTypes)
    return;
  Py_INCREF(t);
  types.push_back(t);
}

void registerDtype(nb::handle dtype, nb::handle name, int bytes) {
  if (!PyUnicode_Check(name.ptr()))
    throw nb::type_error("name: expected a str");
  if (bytes < 1 || bytes > 255)
    throw std::invalid_argument("bytes: expected 1 to 255");
  auto &reg = registry();
  for (const auto &entry : reg.dtypes)
    if (entry.object == dtype.ptr())
      return;
  int element = elementIndex(name.ptr());
  if (element < 0 || reg.dtypes.size() >= kMaxDtypes)
    return;
  Py_INCREF(dtype.ptr());
  reg.dtypes.push_back({dtype.ptr(), uint8_t(element), uint8_t(bytes)});
}

void registerStreamGetter(nb::handle getter) {
  auto &reg = registry();
  Py_XINCREF(getter.ptr());
  Py_XDECREF(reg.streamGetter);
  reg.streamGetter = getter.is_none() ? nullptr : getter.ptr();
}

void translateDriverError(const std::exception_ptr &p, void *) {
  try {
    std::rethrow_exception(p);
  } catch (const DriverError &e) {
    // JIT logs are not guaranteed to be UTF-8.
    nb::object msg =
        nb::steal(PyUnicode_DecodeUTF8(e.what(), Py_ssize_t(std::strlen(e.what())), "replace"));
    if (!msg.is_valid())
      return; // the decode error stays set
    PyObject *exc = PyObject_CallOneArg(cudaErrorType, msg.ptr());
    if (!exc)
      return; // the constructor's error stays set
    nb::handle h(exc);
    h.attr("function") = nb::str(e.function().c_str());
    h.attr("result") = nb::int_(e.result());
    h.attr("error_name") = nb::str(e.errorName().c_str());
    h.attr("error_string") = nb::str(e.errorString().c_str());
    PyErr_SetObject(cudaErrorType, exc);
    Py_DECREF(exc);
  }
}

} // namespace

void flyBindRuntime(nb::module_ &m) {
  nb::module_ rt = m.def_submodule("runtime", "CUDA driver launcher (libcuda loaded lazily).");

  std::string errorName = nb::cast<std::string>(rt.attr("__name__")) + ".CudaError";
  cudaErrorType = PyErr_NewExceptionWithDoc(
      errorName.c_str(),
      "A CUDA driver call failed. Attributes: function, result (CUresult number, -1 when "
      "libcuda.so.1 cannot be loaded), error_name, error_string.",
      PyExc_RuntimeError, nullptr);
  if (!cudaErrorType)
    raisePending();
  rt.attr("CudaError") = nb::handle(cudaErrorType);
  nb::register_exception_translator(translateDriverError);

  rt.def("is_available", &fly::runtime::isAvailable,
         "True when libcuda.so.1 loads, cuInit succeeds and a device exists. Never raises.");
  rt.def("driver_version", &fly::runtime::driverVersion,
         "cuDriverGetVersion, e.g. 12040 for CUDA 12.4.");
  rt.def("device_count", &fly::runtime::deviceCount);
  rt.def("device_name", &fly::runtime::deviceName, "device"_a = 0);
  rt.def("device_attribute", &fly::runtime::deviceAttribute, "attr"_a, "device"_a = 0,
         "cuDeviceGetAttribute with a CUdevice_attribute number.");
  rt.def(
      "synchronize",
      [] {
        nb::gil_scoped_release release;
        fly::runtime::synchronize();
      },
      "cuCtxSynchronize on the current (or device 0's primary) context.");
  rt.def("_validate_launch", &validateLaunch, "grid"_a.none(), "block"_a.none(),
         "signature"_a.none(), "args"_a.none(), "shared_mem"_a.none() = 0, "stream"_a.none() = 0,
         "cluster"_a.none() = nb::none(), "name"_a = "kernel",
         "Runs Function.launch's validation and packing only (no driver needed); returns a "
         "dict with grid, block, cluster, shared_mem, stream, params (the packed bytes: 8 per "
         "argument, 128 at a 64-byte boundary for 'm'), offsets (of each argument in params), "
         "aligned (every argument's address suitably aligned) and inline (no heap used).");

  rt.def("_register_tensor_type", &registerTensorType, "type"_a,
         "Dispatcher: instances of this type are torch tensors (is_cuda, dtype, data_ptr(), "
         "shape, stride(), get_device()).");
  rt.def("_register_dtype", &registerDtype, "dtype"_a, "name"_a, "bytes"_a,
         "Dispatcher: a torch dtype object's element type name and size.");
  rt.def("_register_stream_getter", &registerStreamGetter, "getter"_a.none(),
         "Dispatcher: getter(device) -> the raw handle of the device's current torch stream.");
  nb::class_<Dispatcher>(
      rt, "Dispatcher",
      "The launch path of one @flyc.kernel in one call: reads torch tensors and numbers, "
      "computes the specialization key, finds the kernel registered for it and launches; "
      "returns False (nothing launched, no error) wherever the Python path must take over.")
      .def(nb::init<nb::handle>(), "params"_a,
           "params: per parameter (kind, low, high, key_name): kind t tensor, i integer "
           "(low..high), f float, c constexpr, s stream; key_name is a numeric's key entry.")
      .def("launch", &Dispatcher::launch, "values"_a.none(), "grid"_a.none(), "block"_a.none(),
           "smem"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
           "cluster"_a.none() = nb::none())
      .def("add", &Dispatcher::add, "key"_a.none(), "function"_a.none(), "signature"_a,
           "shared_bytes"_a,
           "Registers the loaded kernel of a specialization key (function None: tests only); "
           "False where the key cannot be matched natively.")
      .def("describe", &Dispatcher::describeArguments, "values"_a.none(),
           "(key, launch arguments) as the Python specialization computes them, or None.")
      .def("_dry_run", &Dispatcher::dryRun, "values"_a.none(), "grid"_a.none(), "block"_a.none(),
           "smem"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
           "cluster"_a.none() = nb::none(),
           "Test hook: what launch would pass to the driver (a dict), or None.")
      .def("clear", &Dispatcher::clear)
      .def("__len__", &Dispatcher::size);

  nb::class_<Function>(rt, "Function", "A kernel of a Module; keeps the Module alive.")
      .def_prop_ro("name", &Function::name)
      .def_prop_ro("num_regs", &Function::numRegs)
      .def_prop_ro("max_threads_per_block", &Function::maxThreadsPerBlock)
      .def_prop_ro("static_shared_bytes", &Function::sharedSizeBytes)
      .def_prop_ro("local_bytes", &Function::localSizeBytes)
      .def_prop_ro("max_dynamic_shared_bytes", &Function::maxDynamicSharedMemory,
                   "Dynamic shared memory limit currently set for this kernel.")
      .def("set_max_dynamic_shared_memory", &Function::setMaxDynamicSharedMemory, "bytes"_a)
      .def("launch", &launchFunction, "grid"_a.none(), "block"_a.none(), "signature"_a.none(),
           "args"_a.none(), "shared_mem"_a.none() = 0, "stream"_a.none() = 0,
           "cluster"_a.none() = nb::none(),
           "Launches the kernel. signature has one code per parameter: p pointer (int, "
           "DeviceBuffer, data_ptr(), __cuda_array_interface__), i int32, I uint32, l int64, "
           "L uint64, f float32, d float64, m TensorMap (128 bytes by value, for "
           "__grid_constant__ CUtensorMap parameters).")
      .def("__repr__", [](const Function &f) { return "<runtime.Function '" + f.name() + "'>"; });

  nb::class_<PyModule>(rt, "Module", "A CUDA module loaded from PTX text or cubin/fatbin bytes.")
      .def(
          "__init__",
          [](PyModule *self, nb::handle image) { new (self) PyModule{loadModule(image)}; },
          "image"_a)
      .def(
          "function",
          [](PyModule &self, const std::string &name) { return self.impl->getFunction(name); },
          "name"_a)
      .def_prop_ro("info_log", [](const PyModule &self) { return self.impl->infoLog(); });

  nb::class_<PyTensorMap>(rt, "TensorMap",
                          "A TMA descriptor (CUtensorMap: 128 bytes, 64-byte aligned), passed to "
                          "kernels by value with signature code 'm'.")
      .def_static("encode_tiled", &encodeTiled, "dtype"_a, "global_address"_a, "dims"_a,
                  "strides_bytes"_a, "box"_a, "element_strides"_a.none() = nb::none(),
                  "swizzle"_a = 0, "interleave"_a = 0, "l2_promotion"_a = 0,
                  "oob_fill_nan"_a = false,
                  "cuTensorMapEncodeTiled. dims and box are in elements, innermost first; "
                  "strides_bytes has the byte strides of dims 1.. (rank - 1 entries); swizzle, "
                  "interleave and l2_promotion are in bytes (0 = none). global_address is an int "
                  "or a tensor-like (kept alive by the map). Arguments are checked before the "
                  "driver is called (ValueError naming the argument).")
      .def_static(
          "from_bytes",
          [](nb::handle data) {
            BufferView view(data.ptr());
            if (view.size() != kTensorMapBytes)
              throw std::invalid_argument("TensorMap.from_bytes: expected 128 bytes, got " +
                                          std::to_string(view.size()));
            PyTensorMap t{};
            std::memcpy(&t.map, view.data(), kTensorMapBytes);
            return t;
          },
          "data"_a,
          "A TensorMap holding 128 given bytes, for tests and for descriptors encoded "
          "elsewhere (e.g. by cuda.bindings); nothing is checked.")
      .def("bytes",
           [](const PyTensorMap &t) {
             return nb::bytes(reinterpret_cast<const char *>(&t.map), kTensorMapBytes);
           })
      .def_prop_ro("global_address", [](const PyTensorMap &t) { return t.globalAddress; })
      .def_prop_ro("rank", [](const PyTensorMap &t) { return t.rank; })
      .def_prop_ro("dtype",
                   [](const PyTensorMap &t) -> nb::object {
                     if (t.dataType < 0)
                       return nb::none();
                     return nb::str(dtypeName(t.dataType));
                   })
      .def("__repr__", [](const PyTensorMap &t) {
        if (t.dataType < 0)
          return std::string("<runtime.TensorMap from bytes>");
        char buf[128];
        std::snprintf(buf, sizeof(buf), "<runtime.TensorMap %s rank=%u global_address=0x%llx>",
                      dtypeName(t.dataType), t.rank, (unsigned long long)t.globalAddress);
        return std::string(buf);
      });

  nb::class_<DeviceBuffer>(rt, "DeviceBuffer", "Device memory from cuMemAlloc (freed on GC).")
      .def(
          "__init__",
          [](DeviceBuffer *self, long long nbytes) {
            if (nbytes < 0)
              throw std::invalid_argument("DeviceBuffer size must be >= 0");
            new (self) DeviceBuffer(size_t(nbytes));
          },
          "nbytes"_a)
      .def_prop_ro("ptr", [](const DeviceBuffer &b) { return uint64_t(b.ptr()); })
      .def_prop_ro("nbytes", &DeviceBuffer::size)
      .def("data_ptr", [](const DeviceBuffer &b) { return uint64_t(b.ptr()); })
      .def(
          "copy_from_host",
          [](DeviceBuffer &b, nb::handle obj) {
            BufferView view(obj.ptr());
            if (view.size() > b.size())
              throw std::invalid_argument("copy_from_host: " + std::to_string(view.size()) +
                                          " bytes do not fit in a " + std::to_string(b.size()) +
                                          "-byte DeviceBuffer");
            nb::gil_scoped_release release;
            b.copyFromHost(view.data(), view.size());
          },
          "obj"_a, "Copies a buffer-protocol object's bytes to the start of the buffer.")
      .def("copy_to_host",
           [](const DeviceBuffer &b) {
             nb::object out = nb::steal(PyBytes_FromStringAndSize(nullptr, Py_ssize_t(b.size())));
             if (!out.is_valid())
               raisePending();
             char *dst = PyBytes_AS_STRING(out.ptr());
             {
               nb::gil_scoped_release release;
               b.copyToHost(dst, b.size());
             }
             return nb::borrow<nb::bytes>(out);
           })
      .def(
          "memset",
          [](DeviceBuffer &b, long long value) {
            if (value < 0 || value > 255)
              throw std::invalid_argument("memset value must be in [0, 255]");
            b.memset(static_cast<unsigned char>(value));
          },
          "value"_a)
      .def_prop_ro("__cuda_array_interface__",
                   [](const DeviceBuffer &b) {
                     nb::dict d;
                     d["shape"] = nb::make_tuple(b.size());
                     d["typestr"] = "|u1";
                     d["data"] = nb::make_tuple(uint64_t(b.ptr()), false);
                     d["strides"] = nb::none();
                     d["version"] = 3;
                     return d;
                   })
      .def("__len__", &DeviceBuffer::size)
      .def("__repr__", [](const DeviceBuffer &b) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "<runtime.DeviceBuffer nbytes=%zu ptr=0x%llx>", b.size(),
                      (unsigned long long)b.ptr());
        return std::string(buf);
      });
}
