//===- Dispatcher.cpp - Native launch path of @flyc.kernel ----------------===//
//
// Dispatcher: the launch path of a @flyc.kernel in one native call.
//
// Built once per kernel from its parameter kinds. `launch(values, grid, block,
// smem, stream, cluster)` reads torch tensors through the C API (is_cuda,
// dtype, data_ptr(), shape, stride()) and other arrays through their
// __cuda_array_interface__, computes the specialization exactly as
// kernel.py does, finds the loaded kernel among those registered with `add`,
// packs the launch arguments and launches. Whatever it does not handle (other
// tensor types, a dtype or tensor type not registered yet, a value kernel.py
// would reject, a specialization not registered, a stream object it cannot
// read) returns False with nothing launched and no Python error set: the
// Python path then does the work, and raises its errors naming the parameter.
// Only grid/block/cluster errors and driver errors raise here, as they would
// from Function.launch on the Python path.
//
//===----------------------------------------------------------------------===//

#include "Dispatcher.h"
#include "DescribeArgs.h"
#include "LaunchArgs.h"
#include "LaunchPlan.h"
#include "TorchCApi.h"

#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;
using namespace fly::python;
using fly::runtime::CUstream;
using fly::runtime::Function;

namespace {

/// Where a launch's 128-byte tensor maps are packed: the driver reads each
/// from the pointer in kernelParams, 64-byte aligned like the Python path.
struct alignas(64) TensorMapSlots {
  unsigned char bytes[kMaxTensorMaps][kTensorMapBytes];
};

struct DispatchParam {
  char kind; // 't' tensor, 'i' integer, 'f' float, 'c' constexpr, 's' stream, 'm' TmaTile
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
  unsigned block[3] = {0, 0, 0};   // compiled-in block shape (0: any)
  unsigned cluster[3] = {0, 0, 0}; // compiled-in cluster shape (0: any)
};


/// A compiled-in shape: None (any) or a tuple of 3 positive ints.
bool readShape(nb::handle shape, unsigned out[3]) {
  if (shape.is_none())
    return true;
  if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != 3)
    return false;
  for (int i = 0; i < 3; ++i) {
    long long v;
    if (!readLongLong(PyTuple_GET_ITEM(shape.ptr(), i), v) || v < 1 || v > UINT32_MAX)
      return false;
    out[i] = unsigned(v);
  }
  return true;
}

/// Whether a launch's block (and cluster, when it gives one) fit what the
/// entry's kernel was compiled for; else the Python path raises the error.
bool fitsShape(const DispatchEntry &e, const unsigned b[3], const unsigned c[3], bool hasCluster) {
  if (e.block[0] && std::memcmp(e.block, b, sizeof e.block) != 0)
    return false;
  return !(hasCluster && e.cluster[0] && std::memcmp(e.cluster, c, sizeof e.cluster) != 0);
}

class Dispatcher {
public:
  explicit Dispatcher(nb::handle params) {
    for (nb::handle item : params) {
      nb::tuple t = nb::cast<nb::tuple>(item);
      if (t.size() != 4)
        throw std::invalid_argument("Dispatcher: each parameter is (kind, low, high, key_name)");
      std::string kind = nb::cast<std::string>(t[0]);
      if (kind.size() != 1 || std::string("tifcsm").find(kind[0]) == std::string::npos)
        throw std::invalid_argument("Dispatcher: kind must be one of t, i, f, c, s, m; got '" +
                                    kind + "'");
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
        // A bool is an int to Python, not a count: the Python path refuses it.
        if (PyBool_Check(v) || !readLongLong(v, x) || x < p.low || x > p.high ||
            d.numValues >= kMaxLaunchValues)
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
      case 'c':
        if (d.numConstexprs >= kMaxConstexprs)
          return false;
        d.constexprs[d.numConstexprs] = v;
        d.hashes[d.numConstexprs++] = -1;
        break;
      case 'm':
        if (!describeTmaTile(v, d))
          return decline();
        break;
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
    nb::list key;
    size_t offset = 0, constexprIndex = 0;
    for (const DispatchParam &p : params_) {
      switch (p.kind) {
      case 't':
        key.append(tensorKeyEntry(d.key + offset));
        offset += 3 + d.key[offset + 1];
        break;
      case 'i':
      case 'f':
        key.append(p.keyName);
        break;
      case 'm': // the TmaTile's key tuple, as kernel.py appends it
        key.append(nb::handle(d.constexprs[constexprIndex++]));
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
           unsigned sharedBytes, nb::handle block, nb::handle cluster) {
    if (!PyTuple_Check(key.ptr()))
      return false;
    auto entry = std::make_shared<DispatchEntry>();
    if (!readShape(block, entry->block) || !readShape(cluster, entry->cluster))
      return decline();
    size_t item = 0, count = size_t(PyTuple_GET_SIZE(key.ptr()));
    for (const DispatchParam &p : params_) {
      if (p.kind == 's')
        continue;
      if (item >= count)
        return false;
      PyObject *part = PyTuple_GET_ITEM(key.ptr(), item++);
      if (p.kind == 't') {
        if (!tensorKeyBytes(part, entry->key))
          return false;
      } else if (p.kind == 'm') {
        Py_hash_t h = PyObject_Hash(part);
        if (h == -1 && PyErr_Occurred())
          return decline();
        entry->constexprs.push_back(nb::borrow(part));
        entry->hashes.push_back(h);
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
               uint64_t *slots, TensorMapSlots &maps) {
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
    return pack(d, entry->signature, slots, maps);
  }

  bool launch(nb::handle values, nb::handle grid, nb::handle block, nb::handle smem,
              nb::handle stream, nb::handle cluster) {
    Described d;
    std::shared_ptr<DispatchEntry> entry;
    unsigned shared = 0;
    CUstream handle = nullptr;
    uint64_t slots[kMaxLaunchValues];
    TensorMapSlots maps;
    if (!prepare(values.ptr(), smem.ptr(), stream.ptr(), d, entry, shared, handle, slots, maps) ||
        !entry->function)
      return false;
    void *params[kMaxLaunchValues];
    for (size_t i = 0, m = 0; i < d.numValues; ++i)
      params[i] = entry->signature[i] == 'm' ? static_cast<void *>(maps.bytes[m++]) : &slots[i];
    unsigned g[3], b[3], c[3];
    bool hasCluster = false;
    parseConfig(grid.ptr(), block.ptr(), cluster.ptr(), g, b, c, hasCluster);
    if (!fitsShape(*entry, b, c, hasCluster))
      return false;
    entry->function->launch(g, b, params, shared, handle, hasCluster ? c : nullptr);
    noteDispatchedLaunch(*entry->function, g, b, hasCluster ? c : nullptr, shared, handle,
                         entry->signature.c_str(), d.numValues, params, d.values);
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
    TensorMapSlots maps;
    if (!prepare(values.ptr(), smem.ptr(), stream.ptr(), d, entry, shared, handle, slots, maps))
      return nb::none();
    unsigned g[3], b[3], c[3];
    bool hasCluster = false;
    parseConfig(grid.ptr(), block.ptr(), cluster.ptr(), g, b, c, hasCluster);
    if (!fitsShape(*entry, b, c, hasCluster))
      return nb::none();
    nb::dict out;
    out["grid"] = dimsTuple(g);
    out["block"] = dimsTuple(b);
    out["cluster"] = hasCluster ? nb::object(dimsTuple(c)) : nb::none();
    out["shared_mem"] = shared;
    out["stream"] = uint64_t(reinterpret_cast<uintptr_t>(handle));
    out["params"] = nb::bytes(reinterpret_cast<const char *>(slots), d.numValues * kSlotBytes);
    nb::list tensorMaps; // 'm' slots of params stay zero: the driver reads these
    for (size_t i = 0, m = 0; i < d.numValues; ++i)
      if (entry->signature[i] == 'm')
        tensorMaps.append(
            nb::bytes(reinterpret_cast<const char *>(maps.bytes[m++]), kTensorMapBytes));
    out["tensor_maps"] = tensorMaps;
    out["key"] = pythonKey(d);
    return out;
  }

  /// (key, launch arguments) as kernel.py's specialize computes them, or None.
  nb::object describeArguments(nb::handle values) {
    Described d;
    if (!describe(values.ptr(), d))
      return nb::none();
    // Launches hash constexprs only on a miss; a key needs them all.
    for (size_t i = 0; i < d.numConstexprs; ++i)
      if (PyObject_Hash(d.constexprs[i]) == -1)
        return decline(), nb::none();
    nb::list args;
    for (size_t i = 0; i < d.numValues; ++i) {
      const LaunchValue &v = d.values[i];
      if (v.tag == LaunchValue::Object)
        args.append(nb::handle(v.o));
      else if (v.tag == LaunchValue::Float)
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
  /// A TmaTile: its key (compared like a constexpr), its encoded TensorMap
  /// (encoded on first use, then cached by the tile) and its extents.
  /// Constexpr values match as Python dicts match keys: same object, else same type, hash and ==
  /// (an == that raises or is not a plain True declines, leaving the launch to Python); floats bit
  /// for bit, as kernel.py keys them (0.0 == -0.0, but they compile to different constants). A
  /// value holding a -0.0 inside (a tuple, a dataclass) is keyed apart by kernel.py and never
  /// registered here, so an equal call value that holds one is another kernel: no match.
  static bool sameConstexpr(PyObject *x, Py_hash_t hx, PyObject *y, Py_hash_t hy) {
    if (x == y)
      return true;
    if (Py_TYPE(x) != Py_TYPE(y) || hx != hy)
      return false;
    if (PyFloat_CheckExact(x)) {
      double a = PyFloat_AS_DOUBLE(x), b = PyFloat_AS_DOUBLE(y);
      return std::memcmp(&a, &b, sizeof a) == 0;
    }
    if (PyObject_RichCompareBool(x, y, Py_EQ) != 1)
      return decline();
    int zero = holdsNegativeZero(y);
    return zero == 0 || (zero < 0 && decline());
  }

  static bool sameConstexprs(const DispatchEntry &a, const DispatchEntry &b) {
    for (size_t i = 0; i < a.constexprs.size(); ++i)
      if (!sameConstexpr(a.constexprs[i].ptr(), a.hashes[i], b.constexprs[i].ptr(), b.hashes[i]))
        return false;
    return true;
  }

  static bool matches(const DispatchEntry &e, const Described &d) {
    if (e.key.size() != d.keyBytes || std::memcmp(e.key.data(), d.key, d.keyBytes) != 0 ||
        e.constexprs.size() != d.numConstexprs)
      return false;
    for (size_t i = 0; i < d.numConstexprs; ++i) {
      PyObject *x = e.constexprs[i].ptr(), *y = d.constexprs[i];
      if (x == y) // the common case (a cached configuration): no hash, no ==
        continue;
      if (d.hashes[i] == -1 && (d.hashes[i] = PyObject_Hash(y)) == -1)
        return decline(); // unhashable: the Python path reports it
      if (!sameConstexpr(x, e.hashes[i], y, d.hashes[i]))
        return false;
    }
    return true;
  }

  /// The stream as kernel.py picks it: the launch's, else the fx.Stream
  /// argument, else the first tensor's that names one (Described).
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
    } else if (!d.streamNamed) {
      out = nullptr; // no tensor names one: the legacy default stream
      return true;
    } else if (!d.streamTensor) {
      out = reinterpret_cast<CUstream>(uintptr_t(d.interfaceStream));
      return true;
    } else { // the tensor's device: read through torch's C API by describeTorch, else here
      long long device = d.streamDevice;
      nb::object index = device < 0 ? nb::steal(callMethod0(d.streamTensor, reg.getDevice)) : nb::object();
      uint64_t h;
      if ((device < 0 && (!index.is_valid() || !readLongLong(index.ptr(), device))) || !torchCurrentStream(device, h))
        return false;
      out = reinterpret_cast<CUstream>(uintptr_t(h));
      return true;
    }
    unsigned long long h = PyLong_AsUnsignedLongLong(handle.ptr());
    if (h == (unsigned long long)-1 && PyErr_Occurred())
      return false;
    out = reinterpret_cast<CUstream>(uintptr_t(h));
    return true;
  }

  /// Packs the values as Function.launch would pack them for `sig`; false
  /// where it would raise (the Python path then raises it).
  static bool pack(const Described &d, const std::string &sig, uint64_t *slots,
                   TensorMapSlots &maps) {
    if (sig.size() != d.numValues)
      return false;
    size_t numMaps = 0;
    for (size_t i = 0; i < d.numValues; ++i) {
      const LaunchValue &v = d.values[i];
      uint64_t *slot = &slots[i];
      *slot = 0;
      if (sig[i] == 'm') {
        if (v.tag != LaunchValue::Object || numMaps >= kMaxTensorMaps ||
            !nb::isinstance<PyTensorMap>(nb::handle(v.o)))
          return false;
        std::memcpy(maps.bytes[numMaps++], &nb::inst_ptr<PyTensorMap>(v.o)->map, kTensorMapBytes);
        continue;
      }
      if (v.tag == LaunchValue::Object)
        return false;
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

} // namespace

void fly::python::bindDispatcher(nb::module_ &rt) {
  bindDispatchRegistry(rt);
  nb::class_<Dispatcher>(
      rt, "Dispatcher",
      "The launch path of one @flyc.kernel in one call: reads torch tensors and numbers, "
      "computes the specialization key, finds the kernel registered for it and launches; "
      "returns False (nothing launched, no error) wherever the Python path must take over.")
      .def(nb::init<nb::handle>(), "params"_a,
           "params: per parameter (kind, low, high, key_name): kind t tensor, i integer "
           "(low..high), f float, c constexpr, s stream, m TmaTile; key_name is a numeric's "
           "key entry.")
      .def("launch", &Dispatcher::launch, "values"_a.none(), "grid"_a.none(), "block"_a.none(),
           "smem"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
           "cluster"_a.none() = nb::none())
      .def("add", &Dispatcher::add, "key"_a.none(), "function"_a.none(), "signature"_a,
           "shared_bytes"_a, "block"_a.none() = nb::none(), "cluster"_a.none() = nb::none(),
           "Registers the loaded kernel of a specialization key (function None: tests only), "
           "with the block and cluster shapes it was compiled for (3-tuples, None: any): other "
           "launches are left to the Python path. False where the key cannot be matched natively.")
      .def("describe", &Dispatcher::describeArguments, "values"_a.none(),
           "(key, launch arguments) as the Python specialization computes them, or None.")
      .def("_dry_run", &Dispatcher::dryRun, "values"_a.none(), "grid"_a.none(), "block"_a.none(),
           "smem"_a.none() = nb::none(), "stream"_a.none() = nb::none(),
           "cluster"_a.none() = nb::none(),
           "Test hook: what launch would pass to the driver (a dict), or None.")
      .def("clear", &Dispatcher::clear)
      .def("__len__", &Dispatcher::size);
}
