//===- PlanKey.cpp - The plan key of a call's arguments -------------------===//
//
// See PlanKey.h.
//
//===----------------------------------------------------------------------===//

#include "PlanKey.h"
#include "DescribeArgs.h"
#include "DispatchRegistry.h"
#include "LaunchArgs.h"
#include "TorchCApi.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace nb = nanobind;

namespace fly::python {

namespace {

//===----------------------------------------------------------------------===//
// Call keys.
//===----------------------------------------------------------------------===//

template <typename T> void put(std::string &key, T value) {
  key.append(reinterpret_cast<const char *>(&value), sizeof value);
}

} // namespace

bool isTensorType(PyTypeObject *type) {
  const auto &types = registry().tensorTypes;
  return std::find(types.begin(), types.end(), type) != types.end();
}

namespace {

bool isKeyType(PyTypeObject *type) {
  const auto &types = registry().keyTypes;
  return std::find(types.begin(), types.end(), type) != types.end();
}

/// The ints of a tuple (torch.Size included), at most kMaxRank.
bool readDims(PyObject *tuple, long long *out, size_t &count) {
  if (!tuple || !PyTuple_Check(tuple) || size_t(PyTuple_GET_SIZE(tuple)) > kMaxRank)
    return false;
  count = size_t(PyTuple_GET_SIZE(tuple));
  for (size_t i = 0; i < count; ++i)
    if (!readLongLong(PyTuple_GET_ITEM(tuple, i), out[i]))
      return false;
  return true;
}

} // namespace

bool readTensor(PyObject *obj, TensorFacts &t) {
  if (readTensorFast(obj, t))
    return true;
  if (!readTensorAttributes(obj, t))
    return false;
  noteTensorDtype(obj, t.dtype);
  return true;
}

bool readTensorAttributes(PyObject *obj, TensorFacts &t) {
  DispatchRegistry &reg = registry();
  nb::object dtype = nb::steal(PyObject_GetAttr(obj, reg.dtype));
  nb::object shape = nb::steal(PyObject_GetAttr(obj, reg.shape));
  nb::object strides = nb::steal(callMethod0(obj, reg.stride));
  nb::object pointer = nb::steal(callMethod0(obj, reg.dataPtr));
  nb::object device = nb::steal(callMethod0(obj, reg.getDevice));
  size_t strideRank = 0;
  if (!dtype.is_valid() || !pointer.is_valid() || !PyLong_Check(pointer.ptr()) || !device.is_valid() ||
      !readLongLong(device.ptr(), t.device) || !readDims(shape.ptr(), t.extents, t.rank) ||
      !readDims(strides.ptr(), t.strides, strideRank) || strideRank != t.rank)
    return decline();
  t.pointer = PyLong_AsUnsignedLongLong(pointer.ptr());
  if (t.pointer == (unsigned long long)-1 && PyErr_Occurred())
    return decline();
  t.dtype = dtype.ptr();
  return true;
}

namespace {

/// Appends one argument; false: the call has no key.
bool appendKey(std::string &key, PyObject *v, bool learn = true) {
  if (v == Py_None) {
    key.push_back('N');
  } else if (PyBool_Check(v)) {
    key.push_back(v == Py_True ? 'B' : 'b');
  } else if (PyLong_CheckExact(v)) {
    long long i;
    if (!readLongLong(v, i))
      return false;
    key.push_back('i');
    put(key, i);
  } else if (PyFloat_CheckExact(v)) {
    key.push_back('f');
    put(key, PyFloat_AS_DOUBLE(v)); // the bits: -0.0 and 0.0 are different calls
  } else if (PyUnicode_CheckExact(v)) {
    Py_ssize_t n = 0;
    const char *text = PyUnicode_AsUTF8AndSize(v, &n);
    if (!text)
      return decline();
    key.push_back('s');
    put(key, uint64_t(n));
    key.append(text, size_t(n));
  } else if (isTensorType(Py_TYPE(v))) {
    TensorFacts t;
    if (!readTensor(v, t))
      return false;
    key.push_back('T');
    put(key, reinterpret_cast<uintptr_t>(Py_TYPE(v)));
    put(key, reinterpret_cast<uintptr_t>(t.dtype));
    put(key, uint8_t(t.rank));
    key.append(reinterpret_cast<const char *>(t.extents), t.rank * sizeof(long long));
    key.append(reinterpret_cast<const char *>(t.strides), t.rank * sizeof(long long));
    put(key, uint8_t(t.pointer & 15));
    put(key, t.device);
  } else if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) { // a shape (normalized_shape)
    nb::object items = nb::steal(PySequence_Tuple(v));
    if (!items.is_valid())
      return decline();
    Py_ssize_t n = PyTuple_GET_SIZE(items.ptr());
    key.push_back(PyList_CheckExact(v) ? 'L' : 't');
    put(key, uint64_t(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject *item = PyTuple_GET_ITEM(items.ptr(), i);
      long long value;
      if (!PyLong_CheckExact(item) || !readLongLong(item, value))
        return false;
      put(key, value);
    }
  } else if (isKeyType(Py_TYPE(v))) { // torch.dtype: one object per dtype, for the process
    key.push_back('D');
    put(key, reinterpret_cast<uintptr_t>(v));
  } else {
    // A type not seen yet: flydsl.kernels.plans registers torch.Tensor subclasses and torch.dtype.
    PyObject *learner = registry().keyTypeLearner;
    if (!learn || !learner)
      return false;
    nb::object known = nb::steal(PyObject_CallOneArg(learner, v));
    if (!known.is_valid())
      raisePending();
    return PyObject_IsTrue(known.ptr()) == 1 && appendKey(key, v, false);
  }
  return true;
}

} // namespace

nb::object planKey(nb::handle args) {
  if (!PyTuple_Check(args.ptr()))
    throw nb::type_error("plan_key: args: expected a tuple");
  std::string key;
  key.reserve(256);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args.ptr()); ++i)
    if (!appendKey(key, PyTuple_GET_ITEM(args.ptr(), i)))
      return nb::none();
  return nb::steal(PyBytes_FromStringAndSize(key.data(), Py_ssize_t(key.size())));
}

} // namespace fly::python
