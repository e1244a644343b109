//===- DescribeArgs.cpp - Reading a call's arguments natively -------------===//
//
// See DescribeArgs.h.
//
//===----------------------------------------------------------------------===//

#include "DescribeArgs.h"
#include "TorchCApi.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <string>

namespace nb = nanobind;

namespace fly::python {

PyObject *callMethod0(PyObject *obj, PyObject *name) {
  PyObject *args[2] = {nullptr, obj};
  return PyObject_VectorcallMethod(name, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

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

bool decline() {
  if (PyErr_Occurred())
    PyErr_Clear();
  return false;
}

int holdsNegativeZero(PyObject *v) {
  if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    return d == 0.0 && std::signbit(d);
  }
  if (PyLong_CheckExact(v) || PyUnicode_CheckExact(v) || PyBool_Check(v) || v == Py_None)
    return 0;
  if (PyTuple_CheckExact(v)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); ++i)
      if (int zero = holdsNegativeZero(PyTuple_GET_ITEM(v, i)))
        return zero;
    return 0;
  }
  PyObject *check = registry().negativeZeroCheck;
  if (!check)
    return 0;
  PyObject *result = PyObject_CallOneArg(check, v);
  if (!result)
    return -1;
  int zero = PyObject_IsTrue(result);
  Py_DECREF(result);
  return zero;
}

namespace {

bool isTorchTensor(PyObject *obj) {
  for (PyTypeObject *t : registry().tensorTypes)
    if (Py_TYPE(obj) == t)
      return true;
  return false;
}

bool isArrayInterface(PyObject *obj) {
  for (PyTypeObject *t : registry().arrayInterfaceTypes)
    if (Py_TYPE(obj) == t)
      return true;
  return false;
}

/// An array interface's "stream" (v3), if it names one and none was named
/// before: kernel.py launches there by default.
bool noteInterfaceStream(PyObject *interface, Described &d) {
  PyObject *stream = PyDict_GetItemWithError(interface, registry().stream);
  if (!stream)
    return !PyErr_Occurred();
  int named = PyObject_IsTrue(stream);
  if (named < 0)
    return decline();
  if (named) {
    if (!PyLong_Check(stream))
      return false;
    unsigned long long h = PyLong_AsUnsignedLongLong(stream);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
      return decline();
    d.streamNamed = true;
    d.interfaceStream = h;
  }
  return true;
}

/// The ints of a tuple (at most kMaxRank; exactly `expected` when given).
bool readInts(PyObject *tuple, long long *out, size_t &count, size_t expected = SIZE_MAX) {
  if (!tuple || !PyTuple_Check(tuple))
    return false;
  count = size_t(PyTuple_GET_SIZE(tuple));
  if (count > kMaxRank || (expected != SIZE_MAX && count != expected))
    return false;
  for (size_t i = 0; i < count; ++i)
    if (!readLongLong(PyTuple_GET_ITEM(tuple, i), out[i]))
      return false;
  return true;
}

/// Whether an element offset can reach 2^31 (args.reaches_2_31): kernel.py
/// specializes such a tensor apart (64-bit offsets; its key byte 2 holds
/// kWideTensor).
bool reaches2To31(size_t rank, const long long *extents, const long long *steps) {
  for (size_t r = 0; r < rank; ++r)
    if (extents[r] == 0) // no elements, no offsets
      return false;
  long long span = 0;
  for (size_t r = 0; r < rank; ++r) {
    long long stride = steps[r], term;
    if (stride == LLONG_MIN)
      return true;
    if (__builtin_mul_overflow(extents[r] - 1, stride < 0 ? -stride : stride, &term) ||
        __builtin_add_overflow(span, term, &span))
      return true;
  }
  return span >= (1LL << 31);
}

/// A tensor's key bytes (element, rank, 16-byte aligned start and whether
/// its offsets reach 2^31 elements, each stride's kind: unit, multiple of 16
/// bytes or other) and launch values (pointer, extents, non-unit strides), as
/// kernel.py specializes.
bool appendTensor(Described &d, uint8_t element, uint8_t bytes, unsigned long long pointer,
                  size_t rank, const long long *extents, const long long *steps) {
  if (d.keyBytes + 3 + rank > kMaxKeyBytes || d.numValues + 1 + 2 * rank > kMaxLaunchValues)
    return false;
  unsigned char *key = d.key + d.keyBytes;
  key[0] = element;
  key[1] = uint8_t(rank);
  key[2] = uint8_t((pointer & 15) == 0 ? kAlignedTensor : 0) |
           uint8_t(reaches2To31(rank, extents, steps) ? kWideTensor : 0);
  LaunchValue *out = d.values + d.numValues;
  out->tag = LaunchValue::UInt;
  out->u = pointer;
  ++out;
  for (size_t r = 0; r < rank; ++r, ++out) {
    out->tag = LaunchValue::Int;
    out->i = extents[r];
  }
  long long per16Bytes = bytes >= 16 ? 1 : 16 / bytes;
  for (size_t r = 0; r < rank; ++r) {
    long long s = steps[r];
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
  return true;
}

/// Whether an array interface's memory is plausible: no negative extent, and
/// a null pointer only for a tensor without elements (else the Python path
/// names the argument).
bool plausibleMemory(unsigned long long pointer, size_t rank, const long long *extents) {
  bool empty = false;
  for (size_t r = 0; r < rank; ++r) {
    if (extents[r] < 0)
      return false;
    empty |= extents[r] == 0;
  }
  return pointer != 0 || empty;
}

bool describeTorch(PyObject *obj, Described &d) {
  Described::TorchRead &last = d.lastTorch;
  if (obj == last.obj) // read once per launch (the stream is already named)
    return appendTensor(d, last.element, last.bytes, last.pointer, last.rank, last.extents,
                        last.steps);
  DispatchRegistry &reg = registry();
  TensorFacts facts; // through torch's C API where it is on (TorchCApi.h): no attribute read
  bool fast = readTensorFast(obj, facts);
  nb::object isCuda = fast ? nb::object() : nb::steal(PyObject_GetAttr(obj, reg.isCuda));
  if (fast ? facts.device < 0 : isCuda.ptr() != Py_True)
    return false;
  nb::object dtype = fast ? nb::borrow(facts.dtype) : nb::steal(PyObject_GetAttr(obj, reg.dtype));
  const DispatchRegistry::Dtype *found = nullptr;
  for (const auto &entry : reg.dtypes)
    if (entry.object == dtype.ptr())
      found = &entry;
  if (!fast && dtype.is_valid())
    noteTensorDtype(obj, dtype.ptr());
  if (!found)
    return false;
  unsigned long long pointer = facts.pointer;
  long long extents[kMaxRank], steps[kMaxRank];
  size_t rank = facts.rank;
  if (fast) {
    std::memcpy(extents, facts.extents, rank * sizeof *extents);
    std::memcpy(steps, facts.strides, rank * sizeof *steps);
  } else {
    nb::object pointerObj = nb::steal(callMethod0(obj, reg.dataPtr));
    if (!pointerObj.is_valid() || !PyLong_Check(pointerObj.ptr()))
      return false;
    pointer = PyLong_AsUnsignedLongLong(pointerObj.ptr());
    if (pointer == (unsigned long long)-1 && PyErr_Occurred())
      return false;
    nb::object shape = nb::steal(PyObject_GetAttr(obj, reg.shape));
    nb::object strides = nb::steal(callMethod0(obj, reg.stride));
    if (!readInts(shape.ptr(), extents, rank) || !readInts(strides.ptr(), steps, rank, rank))
      return false;
  }
  if (!appendTensor(d, found->element, found->bytes, pointer, rank, extents, steps))
    return false;
  if (!d.streamNamed) {
    d.streamNamed = true;
    d.streamTensor = obj;
    d.streamDevice = fast ? facts.device : -1;
  }
  last.obj = obj; // borrowed: the caller's values hold it for the launch
  last.element = found->element;
  last.bytes = found->bytes;
  last.pointer = pointer;
  last.rank = rank;
  std::memcpy(last.extents, extents, rank * sizeof *extents);
  std::memcpy(last.steps, steps, rank * sizeof *steps);
  return true;
}

bool describeArrayInterface(PyObject *obj, Described &d) {
  DispatchRegistry &reg = registry();
  // Borrowed items below: `holder` keeps the dict (often built per access).
  nb::object holder = nb::steal(PyObject_GetAttr(obj, reg.arrayInterface));
  if (!holder.is_valid() || !PyDict_Check(holder.ptr()))
    return false;
  PyObject *interface = holder.ptr();
  PyObject *typestr = PyDict_GetItemWithError(interface, reg.typestr);
  if (!typestr || !PyUnicode_Check(typestr))
    return false;
  Py_ssize_t length = 0;
  const char *text = PyUnicode_AsUTF8AndSize(typestr, &length);
  if (!text || length < 2)
    return false;
  const DispatchRegistry::Typestr *found = nullptr;
  for (const auto &entry : reg.typestrs) // as kernel.py: the byte-order mark is not compared
    if (entry.code.size() == size_t(length - 1) &&
        std::memcmp(entry.code.data(), text + 1, length - 1) == 0)
      found = &entry;
  if (!found)
    return false;
  PyObject *data = PyDict_GetItemWithError(interface, reg.data);
  if (!data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 ||
      !PyLong_Check(PyTuple_GET_ITEM(data, 0)))
    return false;
  unsigned long long pointer = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
  if (pointer == (unsigned long long)-1 && PyErr_Occurred())
    return false;
  long long extents[kMaxRank], steps[kMaxRank];
  size_t rank;
  if (!readInts(PyDict_GetItemWithError(interface, reg.shape), extents, rank) ||
      !plausibleMemory(pointer, rank, extents))
    return false;
  PyObject *strides = PyDict_GetItemWithError(interface, reg.strides);
  if (!strides || strides == Py_None) { // row-major
    long long step = 1;
    for (size_t r = rank; r-- > 0;) {
      steps[r] = step;
      if (__builtin_mul_overflow(step, extents[r], &step)) // past int64: Python's error
        return false;
    }
  } else {
    if (!readInts(strides, steps, rank, rank))
      return false;
    for (size_t r = 0; r < rank; ++r) {
      if (steps[r] % found->bytes) // kernel.py raises: let it
        return false;
      steps[r] /= found->bytes;
    }
  }
  if (!appendTensor(d, found->element, found->bytes, pointer, rank, extents, steps))
    return false;
  return d.streamNamed || noteInterfaceStream(interface, d);
}

} // namespace

bool tensorKeyBytes(PyObject *part, std::vector<uint8_t> &out) {
  Py_ssize_t size = PyTuple_Check(part) ? PyTuple_GET_SIZE(part) : 0;
  if ((size != 4 && size != 6) || !PyUnicode_Check(PyTuple_GET_ITEM(part, 0)))
    return false;
  int element = elementIndex(PyTuple_GET_ITEM(part, 0));
  long long rank;
  PyObject *kinds = PyTuple_GET_ITEM(part, 2);
  if (element < 0 || !readLongLong(PyTuple_GET_ITEM(part, 1), rank) || rank < 0 ||
      size_t(rank) > kMaxRank || !PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != rank)
    return decline();
  bool wide = size == 6; // every extent dynamic (marked ones take the Python path)
  if (wide) {
    PyObject *extents = PyTuple_GET_ITEM(part, 4);
    if (!PyTuple_Check(extents) || PyTuple_GET_SIZE(extents) != rank ||
        PyTuple_GET_ITEM(part, 5) != Py_True)
      return false;
    for (long long r = 0; r < rank; ++r)
      if (PyTuple_GET_ITEM(extents, r) != Py_None)
        return false;
  }
  out.push_back(uint8_t(element));
  out.push_back(uint8_t(rank));
  out.push_back(uint8_t(PyObject_IsTrue(PyTuple_GET_ITEM(part, 3)) == 1 ? kAlignedTensor : 0) |
                uint8_t(wide ? kWideTensor : 0));
  for (long long r = 0; r < rank; ++r) {
    long long kind;
    if (!readLongLong(PyTuple_GET_ITEM(kinds, r), kind) || (kind != 0 && kind != 1 && kind != 16))
      return decline();
    out.push_back(uint8_t(kind));
  }
  return true;
}

nb::object tensorKeyEntry(const unsigned char *key) {
  unsigned rank = key[1];
  bool aligned = key[2] & kAlignedTensor;
  nb::list kinds, extents;
  for (unsigned r = 0; r < rank; ++r) {
    kinds.append(int(key[3 + r]));
    extents.append(nb::none());
  }
  nb::handle name = registry().elementNames[key[0]];
  if (key[2] & kWideTensor) // every extent dynamic, offsets in 64 bits
    return nb::make_tuple(name, rank, nb::tuple(kinds), aligned, nb::tuple(extents), true);
  return nb::make_tuple(name, rank, nb::tuple(kinds), aligned);
}

bool describeTensor(PyObject *obj, Described &d) {
  if (isTorchTensor(obj))
    return describeTorch(obj, d);
  if (isArrayInterface(obj))
    return describeArrayInterface(obj, d);
  return false;
}

bool describeTmaTile(PyObject *obj, Described &d) {
  DispatchRegistry &reg = registry();
  if (!reg.tmaTileType || Py_TYPE(obj) != reg.tmaTileType || d.numConstexprs >= kMaxConstexprs)
    return false;
  // Borrowed below: the tile holds its key, map, shape and source.
  nb::object key = nb::steal(PyObject_GetAttr(obj, reg.tmaKey));
  nb::object map = nb::steal(PyObject_GetAttr(obj, reg.tensorMap));
  nb::object shape = nb::steal(PyObject_GetAttr(obj, reg.shape));
  if (!key.is_valid() || !map.is_valid() || !shape.is_valid() || !PyTuple_Check(shape.ptr()))
    return false;
  size_t rank = size_t(PyTuple_GET_SIZE(shape.ptr()));
  if (d.numValues + 1 + rank > kMaxLaunchValues)
    return false;
  d.constexprs[d.numConstexprs] = key.ptr();
  d.hashes[d.numConstexprs++] = -1;
  LaunchValue &m = d.values[d.numValues++];
  m.tag = LaunchValue::Object;
  m.o = map.ptr();
  for (size_t r = 0; r < rank; ++r) {
    long long extent;
    if (!readLongLong(PyTuple_GET_ITEM(shape.ptr(), r), extent))
      return false;
    LaunchValue &out = d.values[d.numValues++];
    out.tag = LaunchValue::Int;
    out.i = extent;
  }
  if (!d.streamNamed) { // the tile's tensor counts for the default stream
    nb::object source = nb::steal(PyObject_GetAttr(obj, reg.source));
    if (!source.is_valid())
      return false;
    if (isTorchTensor(source.ptr())) {
      d.streamNamed = true;
      d.streamTensor = source.ptr(); // kept alive by the tile
    } else if (isArrayInterface(source.ptr())) {
      nb::object interface = nb::steal(PyObject_GetAttr(source.ptr(), reg.arrayInterface));
      if (!interface.is_valid() || !PyDict_Check(interface.ptr()) ||
          !noteInterfaceStream(interface.ptr(), d))
        return false;
    }
  }
  return true;
}

} // namespace fly::python
