//===- DispatchRegistry.cpp - What the launch path knows of Python types --===//
//
// See DispatchRegistry.h.
//
//===----------------------------------------------------------------------===//

#include "DispatchRegistry.h"
#include "LaunchArgs.h"

#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

namespace nb = nanobind;
using namespace nb::literals;

namespace fly::python {

DispatchRegistry &registry() {
  static auto *r = new DispatchRegistry; // never destroyed: outlives the interpreter's objects
  return *r;
}

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

namespace {

/// Adds `type` to `types` once (a strong reference kept for the process).
void addType(std::vector<PyTypeObject *> &types, nb::handle type) {
  if (!PyType_Check(type.ptr()))
    throw nb::type_error("expected a type");
  auto *t = reinterpret_cast<PyTypeObject *>(type.ptr());
  for (PyTypeObject *known : types)
    if (known == t)
      return;
  if (types.size() >= kMaxTensorTypes)
    return;
  Py_INCREF(t);
  types.push_back(t);
}

void registerTensorType(nb::handle type) { addType(registry().tensorTypes, type); }

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

void registerArrayInterfaceType(nb::handle type) { addType(registry().arrayInterfaceTypes, type); }

void registerTypestr(const std::string &code, nb::handle name, int bytes) {
  if (!PyUnicode_Check(name.ptr()))
    throw nb::type_error("name: expected a str");
  if (bytes < 1 || bytes > 255)
    throw std::invalid_argument("bytes: expected 1 to 255");
  auto &reg = registry();
  for (const auto &entry : reg.typestrs)
    if (entry.code == code)
      return;
  int element = elementIndex(name.ptr());
  if (element < 0 || reg.typestrs.size() >= kMaxDtypes)
    return;
  reg.typestrs.push_back({code, uint8_t(element), uint8_t(bytes)});
}

void registerTmaTileType(nb::handle type) {
  if (!PyType_Check(type.ptr()))
    throw nb::type_error("expected a type");
  auto &reg = registry();
  if (reg.tmaTileType)
    return;
  Py_INCREF(type.ptr());
  reg.tmaTileType = reinterpret_cast<PyTypeObject *>(type.ptr());
}

void registerStreamGetter(nb::handle getter) {
  auto &reg = registry();
  Py_XINCREF(getter.ptr());
  Py_XDECREF(reg.streamGetter);
  reg.streamGetter = getter.is_none() ? nullptr : getter.ptr();
}

void registerNegativeZeroCheck(nb::handle check) {
  auto &reg = registry();
  Py_XINCREF(check.ptr());
  Py_XDECREF(reg.negativeZeroCheck);
  reg.negativeZeroCheck = check.is_none() ? nullptr : check.ptr();
}

} // namespace

void bindDispatchRegistry(nb::module_ &rt) {
  rt.def("_register_tensor_type", &registerTensorType, "type"_a,
         "Dispatcher: instances of this type are torch tensors (is_cuda, dtype, data_ptr(), "
         "shape, stride(), get_device()).");
  rt.def("_register_dtype", &registerDtype, "dtype"_a, "name"_a, "bytes"_a,
         "Dispatcher: a torch dtype object's element type name and size.");
  rt.def("_register_array_interface_type", &registerArrayInterfaceType, "type"_a,
         "Dispatcher: instances of this type are read through __cuda_array_interface__ (v2/v3).");
  rt.def("_register_typestr", &registerTypestr, "code"_a, "name"_a, "bytes"_a,
         "Dispatcher: an array interface typestr (without its byte-order mark, e.g. 'f4') and its "
         "element type name and size.");
  rt.def("_register_tma_tile_type", &registerTmaTileType, "type"_a,
         "Dispatcher: instances of this type are TmaTile arguments (_key, tensor_map, shape, "
         "source).");
  rt.def("_register_stream_getter", &registerStreamGetter, "getter"_a.none(),
         "Dispatcher: getter(device) -> the raw handle of the device's current torch stream.");
  rt.def("_register_negative_zero_check", &registerNegativeZeroCheck, "check"_a.none(),
         "Dispatcher: check(value) -> whether a Constexpr value (not a number, string or tuple) "
         "holds a float -0.0 anywhere.");
}

} // namespace fly::python
