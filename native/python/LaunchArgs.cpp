//===- LaunchArgs.cpp - Launch argument packing and configuration ---------===//
//
// Launch arguments are validated and packed completely before the driver is
// touched, so bad arguments raise the same errors with or without a GPU. The
// success path does no heap allocation (up to kInlineParams parameters that
// fit in kInlineArena bytes) and no string formatting.
//
//===----------------------------------------------------------------------===//

#include "LaunchArgs.h"

#include <cmath>
#include <cstring>

namespace nb = nanobind;
using fly::runtime::DeviceBuffer;

namespace fly::python {

static const char *kindName(char code) {
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

[[noreturn]] static void raiseWrongType(size_t index, char code, PyObject *obj) {
  if (code == 'p')
    raise(PyExc_TypeError,
          "argument %zu: expected pointer (int, DeviceBuffer, or an object with data_ptr() or "
          "__cuda_array_interface__), got %.200s",
          index, Py_TYPE(obj)->tp_name);
  raise(PyExc_TypeError, "argument %zu: expected %s, got %.200s", index, kindName(code),
        Py_TYPE(obj)->tp_name);
}

[[noreturn]] static void raiseOutOfRange(size_t index, char code, PyObject *obj) {
  raise(PyExc_OverflowError, "argument %zu: expected %s, got %R (out of range)", index,
        kindName(code), obj);
}

/// Converts an integer to the 'i'/'I'/'l'/'L'/'p' kind and stores it.
static void packInteger(size_t index, char code, PyObject *obj, PyObject *value, uint64_t *slot) {
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

static void packIntegerObject(size_t index, char code, PyObject *obj, uint64_t *slot) {
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

static void packFloat(size_t index, char code, PyObject *obj, uint64_t *slot) {
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

static void packTensorMap(size_t index, PyObject *obj, unsigned char *slot) {
  if (!nb::isinstance<PyTensorMap>(obj))
    raise(PyExc_TypeError, "argument %zu: expected TensorMap, got %.200s", index,
          Py_TYPE(obj)->tp_name);
  std::memcpy(slot, &nb::inst_ptr<PyTensorMap>(obj)->map, kTensorMapBytes);
}

/// Parses an int or a tuple/list of 1 to 3 positive ints (missing dims are 1).
static void parseDims(PyObject *obj, const char *what, unsigned out[3]) {
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

static unsigned parseSharedMem(PyObject *obj) {
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
static CUstream parseStream(PyObject *obj) {
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

nb::tuple dimsTuple(const unsigned d[3]) { return nb::make_tuple(d[0], d[1], d[2]); }

} // namespace fly::python
