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
#include <cstring>
#include <cstdint>
#include <string>
#include <utility>

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
  std::vector<PyObject *> &seen = registry().tensorDtypes;
  if (std::find(seen.begin(), seen.end(), t.dtype) == seen.end()) { // for portablePlanKey
    Py_INCREF(t.dtype);
    seen.push_back(t.dtype);
  }
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
    std::vector<PyObject *> &values = registry().keyValues;
    if (std::find(values.begin(), values.end(), v) == values.end()) { // for portablePlanKey
      Py_INCREF(v);
      values.push_back(v);
    }
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

namespace {

/// Reads `count` bytes of the key at `at` into `out`; false past its end.
template <typename T> bool take(const std::string &key, size_t &at, T &out) {
  if (at + sizeof(T) > key.size())
    return false;
  std::memcpy(&out, key.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

/// `module.qualname` of a type, or its tp_name.
std::string typeName(PyTypeObject *type) {
  nb::object module = nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject *>(type), "__module__"));
  nb::object qualname = nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject *>(type), "__qualname__"));
  if (!module.is_valid() || !qualname.is_valid() || !PyUnicode_Check(module.ptr()) ||
      !PyUnicode_Check(qualname.ptr())) {
    PyErr_Clear();
    return type->tp_name;
  }
  return std::string(PyUnicode_AsUTF8(module.ptr())) + "." + PyUnicode_AsUTF8(qualname.ptr());
}

/// str() of an object the key names by address (a torch.dtype), checked to be one the key builder knows.
bool objectText(uintptr_t address, std::string &out) {
  // Only an address this process put in a key is read (the bytes may come from anywhere).
  auto *obj = reinterpret_cast<PyObject *>(address);
  const std::vector<PyObject *> &seen = registry().tensorDtypes;
  bool known = isLearntDtype(obj) || std::find(seen.begin(), seen.end(), obj) != seen.end();
  for (const DispatchRegistry::Dtype &d : registry().dtypes)
    known |= d.object == obj;
  for (PyObject *value : registry().keyValues)
    known |= value == obj;
  if (!known)
    return false;
  nb::object text = nb::steal(PyObject_Str(obj));
  if (!text.is_valid() || !PyUnicode_Check(text.ptr()))
    return PyErr_Clear(), false;
  out += PyUnicode_AsUTF8(text.ptr());
  return true;
}

} // namespace

nb::object portablePlanKey(nb::bytes bytes) {
  std::string key(bytes.c_str(), bytes.size()), text;
  static const char hex[] = "0123456789abcdef";
  auto raw = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      text += hex[uint8_t(key[i]) >> 4], text += hex[uint8_t(key[i]) & 15];
  };
  for (size_t at = 0; at < key.size();) {
    char tag = key[at++];
    text += tag;
    size_t start = at;
    uint64_t n = 0;
    uintptr_t address = 0;
    switch (tag) {
    case 'N':
    case 'B':
    case 'b':
      break;
    case 'i':
    case 'f':
      at += 8;
      break;
    case 's':
      if (!take(key, at, n))
        return nb::none();
      at += n;
      break;
    case 'L':
    case 't':
      if (!take(key, at, n))
        return nb::none();
      at += 8 * n;
      break;
    case 'D': // a torch.dtype argument
      if (!take(key, at, address) || !objectText(address, text))
        return nb::none();
      text += ';';
      continue;
    case 'T': { // the tensor's type and dtype by name, then its rank, extents, strides, alignment and device as bytes
      uintptr_t type = 0;
      if (!take(key, at, type) || !take(key, at, address) ||
          !isTensorType(reinterpret_cast<PyTypeObject *>(type)))
        return nb::none();
      text += typeName(reinterpret_cast<PyTypeObject *>(type)) + ",";
      if (!objectText(address, text))
        return nb::none();
      text += ',';
      uint8_t rank = 0;
      start = at;
      if (!take(key, at, rank))
        return nb::none();
      at += 16 * size_t(rank) + 1 + sizeof(long long);
      break;
    }
    default:
      return nb::none();
    }
    if (at > key.size())
      return nb::none();
    raw(start, at);
    text += ';';
  }
  return nb::str(text.c_str());
}

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

namespace {

// f() as a C long, or -1 with an error set.
long callForLong(PyObject *f) {
  PyObject *value = PyObject_CallNoArgs(f);
  if (!value)
    return -1;
  long result = value == Py_True ? 1 : value == Py_False ? 0 : PyLong_AsLong(value);
  Py_DECREF(value);
  return result;
}

} // namespace

nb::object keptPlan(nb::handle plans, nb::handle args, nb::handle tensors, nb::handle grad) {
  const auto &reg = registry();
  if (!reg.dispatchStackLength || !PyDict_Check(plans.ptr()) || !PyTuple_Check(tensors.ptr()))
    return nb::none();
  long modes = callForLong(reg.dispatchStackLength);
  if (modes < 0)
    throw nb::python_error();
  if (modes > 0)
    return nb::none();
  bool fast;
  long enabled = gradModeFast(fast) ? long(fast) : callForLong(reg.gradEnabled);
  if (enabled < 0)
    throw nb::python_error();
  for (Py_ssize_t i = 0; enabled && i < PyTuple_GET_SIZE(tensors.ptr()); ++i) {
    PyObject *tensor = PyTuple_GET_ITEM(tensors.ptr(), i);
    if (tensor == Py_None)
      continue;
    PyObject *requires = PyObject_GetAttr(tensor, reg.requiresGrad);
    if (!requires) { // (not a tensor: as getattr(t, "requires_grad", False))
      PyErr_Clear();
      continue;
    }
    bool requiresGrad = requires == Py_True;
    Py_DECREF(requires);
    if (requiresGrad)
      return nb::borrow(grad);
  }
  nb::object key = planKey(args);
  if (key.is_none())
    return key;
  PyObject *plan = PyDict_GetItemWithError(plans.ptr(), key.ptr()); // borrowed
  if (!plan) {
    if (PyErr_Occurred())
      throw nb::python_error();
    return nb::none();
  }
  return nb::borrow(plan);
}

void bindKeptPlan(nb::module_ &rt) {
  using namespace nb::literals;
  rt.def("kept_plan", &keptPlan, "plans"_a, "args"_a, "tensors"_a, "grad"_a,
         "plans[plan_key(args)] for an eager call (plans: a dict by plan key), `grad` where grad mode is on and one "
         "of `tensors` requires grad, None where a torch dispatch mode is active, no checks are registered "
         "(_register_kept_checks), or nothing is kept.");
  rt.def("_register_kept_checks", [](nb::handle dispatchStackLength, nb::handle gradEnabled) {
    auto &reg = registry();
    for (PyObject **slot : {&reg.dispatchStackLength, &reg.gradEnabled})
      Py_XDECREF(std::exchange(*slot, nullptr));
    if (dispatchStackLength.is_none() || gradEnabled.is_none())
      return;
    reg.dispatchStackLength = dispatchStackLength.inc_ref().ptr();
    reg.gradEnabled = gradEnabled.inc_ref().ptr();
  }, "dispatch_stack_length"_a.none(), "grad_enabled"_a.none(),
     "kept_plan's checks: torch._C._len_torch_dispatch_stack and torch.is_grad_enabled (None, None: none).");
}

} // namespace fly::python
