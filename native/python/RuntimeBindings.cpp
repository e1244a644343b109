//===- RuntimeBindings.cpp - Python bindings of the CUDA launcher ---------===//
//
// The `flydsl.compiler._runtime` extension: driver queries, Module/Function
// loading and the kernel launch path, TensorMap (TMA descriptors passed by value), plus a
// DeviceBuffer for torch-free tests. Launch arguments are packed in
// LaunchArgs.cpp; the native launch path of @flyc.kernel is in Dispatcher.cpp.
//
//===----------------------------------------------------------------------===//

#include "../runtime/RuntimeBindings.h"
#include "../runtime/CudaDriver.h"
#include "Dispatcher.h"
#include "LaunchPlan.h"
#include "LaunchArgs.h"
#include "TorchCApi.h"

#include <nanobind/stl/string.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;
using namespace fly::python;
using fly::runtime::CUtensorMap;
using fly::runtime::DeviceBuffer;
using fly::runtime::DriverError;
using fly::runtime::Function;
using fly::runtime::Module;

namespace {

/// The CudaError type (a RuntimeError subclass); owned for the process.
PyObject *cudaErrorType = nullptr;

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
  const unsigned *clusterDims = la.hasCluster ? la.cluster : nullptr;
  fn.launch(la.grid, la.block, la.params, la.sharedBytes, la.stream, clusterDims);
  if (recordingLaunches()) {
    const char *sig = PyUnicode_AsUTF8(signature.ptr()); // checked by prepareLaunch
    std::vector<const PyTensorMap *> maps(la.numParams, nullptr);
    for (size_t i = 0; i < la.numParams; ++i)
      if (sig[i] == 'm')
        maps[i] = nb::inst_ptr<PyTensorMap>(PySequence_Fast_GET_ITEM(args.ptr(), Py_ssize_t(i)));
    noteLaunch(fn, la.grid, la.block, clusterDims, la.sharedBytes, la.stream, sig, la.numParams,
               la.params, maps.data());
  }
}

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
  return PyTensorMap{map, spec.dataType, spec.rank, spec.globalAddress, std::move(owner), spec};
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

void flyBindRuntime(nb::module_ &rt) {

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

  fly::python::bindDispatcher(rt);
  fly::python::bindLaunchPlans(rt);
  fly::python::bindTorchCApi(rt);

  nb::class_<Function>(rt, "Function", "A kernel of a Module; keeps the Module alive.")
      .def_prop_ro("name", &Function::name)
      .def_prop_ro("handle", [](const Function &f) { return uint64_t(reinterpret_cast<uintptr_t>(f.handle())); },
                   "The CUfunction (an int): the same for every Function of one loaded kernel.")
      .def_prop_ro("num_regs", &Function::numRegs)
      .def_prop_ro("max_threads_per_block", &Function::maxThreadsPerBlock)
      .def_prop_ro("static_shared_bytes", &Function::sharedSizeBytes)
      .def_prop_ro("local_bytes", &Function::localSizeBytes)
      .def_prop_ro("max_dynamic_shared_bytes", &Function::maxDynamicSharedMemory,
                   "Dynamic shared memory limit currently set for this kernel.")
      .def("set_max_dynamic_shared_memory", &Function::setMaxDynamicSharedMemory, "bytes"_a)
      .def_prop_rw("shared_carveout", &Function::sharedCarveout, &Function::setSharedCarveout,
                   "The preferred shared-memory carveout of SMs running this kernel: a percent of the most "
                   "shared memory (100: all of it, L1 the least), -1 for no preference.")
      .def_prop_rw("dependent_launch", &Function::dependentLaunch, &Function::setDependentLaunch,
                   "Launch with programmatic dependent launch (the kernel may start while the "
                   "stream's previous kernel finishes; it must execute griddepcontrol.wait first).")
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
