//===- TorchCApi.cpp - Torch tensors read through torch's stable C API ----===//
//
// See TorchCApi.h. The C API's functions are looked up in the libraries that
// `import torch` loaded (dlopen with RTLD_NOLOAD: nothing new is loaded), and
// THPVariable_Wrap (a new Python tensor of an at::Tensor, for empty_like) in
// libtorch_python.so. Before any fast read, the object layout is checked
// without dereferencing anything: the word after each probe's header must be
// its TensorImpl's address (`tensor._cdata`).
//
//===----------------------------------------------------------------------===//

#include "TorchCApi.h"
#include "DescribeArgs.h"
#include "LaunchArgs.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <dlfcn.h>

#include <cstddef>
#include <optional>
#include <string>

namespace nb = nanobind;
using namespace nb::literals;

namespace fly::python {

namespace {

using Handle = void *;  // AtenTensorHandle: an at::Tensor *
using Error = int32_t;  // AOTITorchError: 0 is success
constexpr int32_t kDtypeCodes = 64;

/// torch's THPVariable as far as this file reads it: the at::Tensor (one
/// intrusive pointer to its TensorImpl) right after the object header.
struct PyTensorMirror {
  PyObject_HEAD void *impl;
};

struct TorchCApi {
  Error (*getDim)(Handle, int64_t *) = nullptr;
  Error (*getSizes)(Handle, int64_t **) = nullptr;
  Error (*getStrides)(Handle, int64_t **) = nullptr;
  Error (*getDataPtr)(Handle, void **) = nullptr;
  Error (*getDtype)(Handle, int32_t *) = nullptr;
  Error (*getLayout)(Handle, int32_t *) = nullptr;
  Error (*getDeviceType)(Handle, int32_t *) = nullptr;
  Error (*getDeviceIndex)(Handle, int32_t *) = nullptr;
  Error (*emptyStrided)(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t, Handle *) = nullptr;
  Error (*deleteTensor)(Handle) = nullptr;
  Error (*currentCudaStream)(int32_t, void **) = nullptr; // libtorch_cuda.so: none in CPU-only builds
  bool (*gradModeEnabled)() = nullptr;                    // (torch >= 2.3)
  PyObject *(*wrap)(const void *) = nullptr;              // THPVariable_Wrap(const at::TensorBase &)
  int32_t strided = 0, cpu = 0, cuda = 1;                 // layout and device type codes
  PyTypeObject *tensorType = nullptr;                     // torch.Tensor: the type empty_like returns
  PyTypeObject *dtypeType = nullptr;                      // torch.dtype: what a learnt dtype object must be
  PyObject *streamGetter = nullptr;                       // what currentCudaStream stands for
  PyObject *dtypes[kDtypeCodes] = {};                     // torch.dtype per dtype code (learnt)
  bool ready = false;
};

TorchCApi &api() {
  static auto *a = new TorchCApi; // never destroyed: holds references past the interpreter's end
  return *a;
}

Handle handleOf(PyObject *obj) {
  return reinterpret_cast<char *>(obj) + offsetof(PyTensorMirror, impl);
}

/// The facts both readers share; false where the tensor is not a strided
/// tensor on the CPU or a CUDA device (read its attributes instead).
bool readCommon(const TorchCApi &a, Handle h, int64_t &rank, int32_t &dtype, int32_t &deviceType,
                int32_t &deviceIndex) {
  int32_t layout;
  if (a.getLayout(h, &layout) || layout != a.strided || a.getDeviceType(h, &deviceType) ||
      (deviceType != a.cpu && deviceType != a.cuda) || a.getDim(h, &rank) || rank < 0 ||
      size_t(rank) > kMaxRank || a.getDtype(h, &dtype) || dtype < 0 || dtype >= kDtypeCodes)
    return false;
  return !a.getDeviceIndex(h, &deviceIndex);
}

/// Whether `obj` is a torch.Tensor (registered types may be other torch objects with data_ptr()).
bool isTorchTensor(const TorchCApi &a, PyObject *obj) {
  return Py_TYPE(obj) == a.tensorType || PyType_IsSubtype(Py_TYPE(obj), a.tensorType);
}

bool readFacts(const TorchCApi &a, PyObject *obj, TensorFacts &t) {
  if (!isTorchTensor(a, obj))
    return false;
  Handle h = handleOf(obj);
  int64_t rank, *sizes, *strides;
  int32_t dtype, deviceType, deviceIndex;
  void *data;
  if (!readCommon(a, h, rank, dtype, deviceType, deviceIndex) || !a.dtypes[dtype] || a.getSizes(h, &sizes) ||
      a.getStrides(h, &strides) || a.getDataPtr(h, &data))
    return false;
  t.dtype = a.dtypes[dtype];
  t.rank = size_t(rank);
  for (size_t i = 0; i < t.rank; ++i) {
    t.extents[i] = sizes[i];
    t.strides[i] = strides[i];
  }
  t.pointer = reinterpret_cast<uintptr_t>(data);
  t.device = deviceType == a.cpu ? -1 : deviceIndex; // as get_device() says
  return true;
}

/// The dtype code of a torch.dtype object the C API has learnt, or -1.
int32_t dtypeCode(const TorchCApi &a, PyObject *dtype) {
  for (int32_t code = 0; code < kDtypeCodes; ++code)
    if (a.dtypes[code] == dtype)
      return code;
  return -1;
}

/// A new contiguous tensor on `obj`'s device, of `obj`'s shape (rank < 0) or
/// `rank` `sizes`, and of `obj`'s dtype (code < 0) or dtype `code`: what
/// memory.torch_empty_like and torch_new_empty make. nullptr (no error set)
/// where the C API cannot make it; nullptr with an error set where wrapping it
/// failed.
Handle emptyOfHandle(const TorchCApi &a, Handle h, int64_t rank, const int64_t *sizes, int32_t code);

PyObject *emptyOf(const TorchCApi &a, PyObject *obj, int64_t rank = -1, const int64_t *sizes = nullptr,
                  int32_t code = -1) {
  Handle made = emptyOfHandle(a, handleOf(obj), rank, sizes, code);
  if (!made)
    return nullptr;
  PyObject *wrapped = a.wrap(made);
  a.deleteTensor(made); // the Python tensor holds its own reference
  return wrapped;
}

/// emptyOf's tensor as a new handle (the caller deletes it), without Python: null where the C API cannot make it.
Handle emptyOfHandle(const TorchCApi &a, Handle h, int64_t rank, const int64_t *sizes, int32_t code) {
  int64_t ownRank, *ownSizes;
  int32_t dtype, deviceType, deviceIndex;
  if (!readCommon(a, h, ownRank, dtype, deviceType, deviceIndex) || a.getSizes(h, &ownSizes))
    return nullptr;
  if (rank < 0)
    rank = ownRank, sizes = ownSizes;
  if (code >= 0)
    dtype = code;
  int64_t strides[kMaxRank];
  int64_t step = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    strides[i] = step;
    step *= sizes[i] > 1 ? sizes[i] : 1;
  }
  Handle made;
  if (a.emptyStrided(rank, sizes, strides, dtype, deviceType, deviceIndex, &made))
    return nullptr;
  return made;
}

/// emptyOf with the shape (a tuple or list of ints) and dtype (a torch.dtype) as Python gives them (null: `obj`'s).
PyObject *emptyLike(const TorchCApi &a, PyObject *obj, PyObject *shape = nullptr, PyObject *dtypeObject = nullptr) {
  int64_t given[kMaxRank], rank = -1;
  if (shape) {
    nb::object items = nb::steal(PySequence_Tuple(shape));
    if (!items.is_valid() || size_t(PyTuple_GET_SIZE(items.ptr())) > kMaxRank)
      return PyErr_Clear(), nullptr;
    rank = PyTuple_GET_SIZE(items.ptr());
    for (int64_t i = 0; i < rank; ++i) {
      long long extent;
      if (!PyLong_CheckExact(PyTuple_GET_ITEM(items.ptr(), i)) ||
          !readLongLong(PyTuple_GET_ITEM(items.ptr(), i), extent) || extent < 0)
        return PyErr_Clear(), nullptr;
      given[i] = extent;
    }
  }
  int32_t code = -1;
  if (dtypeObject && (code = dtypeCode(a, dtypeObject)) < 0)
    return nullptr;
  return emptyOf(a, obj, rank, given, code);
}

void learnDtype(TorchCApi &a, PyObject *obj, PyObject *dtype) {
  int32_t code;
  if (!dtype || !a.dtypeType || Py_TYPE(dtype) != a.dtypeType || a.getDtype(handleOf(obj), &code) || code < 0 || code >= kDtypeCodes || a.dtypes[code])
    return;
  Py_INCREF(dtype);
  a.dtypes[code] = dtype;
}

/// The libraries `import torch` loaded, in the order their symbols are looked
/// up (a handle's lookup also searches what it depends on: libtorch_python.so
/// reaches libtorch_cpu.so, and libtorch_cuda.so in CUDA builds); null: absent.
struct Libraries {
  void *handles[4];

  explicit Libraries(const std::string &dir) {
    const char *names[] = {"libtorch_python.so", "libtorch_cpu.so", "libtorch.so", "libtorch_cuda.so"};
    for (size_t i = 0; i < 4; ++i) // RTLD_NOLOAD: only what torch loaded, nothing new
      handles[i] = dlopen((dir + "/" + names[i]).c_str(), RTLD_NOW | RTLD_NOLOAD);
  }
  ~Libraries() {
    for (void *handle : handles) // the references dlopen took; torch keeps its own
      if (handle)
        dlclose(handle);
  }

  template <typename F> bool bind(const char *name, F &fn, std::string *missing = nullptr) const {
    fn = nullptr;
    for (void *handle : handles)
      if (handle && !fn)
        fn = reinterpret_cast<F>(dlsym(handle, name));
    if (!fn && missing && missing->empty())
      *missing = name;
    return fn != nullptr;
  }
};

bool sameFacts(const TensorFacts &x, const TensorFacts &y) {
  if (x.dtype != y.dtype || x.pointer != y.pointer || x.device != y.device || x.rank != y.rank)
    return false;
  for (size_t i = 0; i < x.rank; ++i)
    if (x.extents[i] != y.extents[i] || x.strides[i] != y.strides[i])
      return false;
  return true;
}

/// Why the bound API cannot read `probe` as its attributes say, or nullopt.
std::optional<std::string> check(TorchCApi &a, PyObject *probe, size_t index) {
  std::string which = "probe " + std::to_string(index) + ": ";
  nb::object impl = nb::steal(PyObject_GetAttrString(probe, "_cdata"));
  if (!impl.is_valid())
    return PyErr_Clear(), which + "no _cdata";
  void *address = PyLong_AsVoidPtr(impl.ptr());
  if (PyErr_Occurred())
    return PyErr_Clear(), which + "_cdata is not an address";
  if (*reinterpret_cast<void **>(handleOf(probe)) != address)
    return which + "the Python object does not hold its at::Tensor where torch 2.9+ does";
  TensorFacts slow, fast;
  if (!readTensorAttributes(probe, slow))
    return PyErr_Clear(), which + "its attributes cannot be read";
  if (!a.dtypeType)
    a.dtypeType = Py_TYPE(slow.dtype);
  learnDtype(a, probe, slow.dtype);
  if (!readFacts(a, probe, fast) || !sameFacts(slow, fast))
    return which + "the C API reads other facts than the attributes";
  nb::object made = nb::steal(emptyLike(a, probe));
  TensorFacts fresh;
  if (!made.is_valid() || Py_TYPE(made.ptr()) != a.tensorType || !readTensorAttributes(made.ptr(), fresh))
    return PyErr_Clear(), which + "empty_like through the C API failed";
  bool contiguous = fresh.rank == slow.rank && fresh.dtype == slow.dtype && fresh.device == slow.device;
  long long step = 1;
  for (size_t i = fresh.rank; contiguous && i-- > 0;) {
    contiguous = fresh.extents[i] == slow.extents[i] && (fresh.extents[i] <= 1 || fresh.strides[i] == step);
    step *= fresh.extents[i] > 1 ? fresh.extents[i] : 1;
  }
  if (!contiguous)
    return which + "empty_like through the C API made another tensor than torch.empty_like";
  return std::nullopt;
}

/// Binds and checks the C API (see TorchCApi.h); nullopt when enabled, else why not.
std::optional<std::string> enable(const std::string &libDir, nb::tuple probes, nb::object streamGetter) {
  TorchCApi &a = api();
  if (a.ready)
    return std::nullopt;
  if (probes.size() == 0)
    return "no probe tensors";
  Libraries libs(libDir);
  std::string missing;
  int32_t (*code)() = nullptr;
  libs.bind("aoti_torch_get_dim", a.getDim, &missing);
  libs.bind("aoti_torch_get_sizes", a.getSizes, &missing);
  libs.bind("aoti_torch_get_strides", a.getStrides, &missing);
  libs.bind("aoti_torch_get_data_ptr", a.getDataPtr, &missing);
  libs.bind("aoti_torch_get_dtype", a.getDtype, &missing);
  libs.bind("aoti_torch_get_layout", a.getLayout, &missing);
  libs.bind("aoti_torch_get_device_type", a.getDeviceType, &missing);
  libs.bind("aoti_torch_get_device_index", a.getDeviceIndex, &missing);
  libs.bind("aoti_torch_empty_strided", a.emptyStrided, &missing);
  libs.bind("aoti_torch_delete_tensor_object", a.deleteTensor, &missing);
  libs.bind("_Z16THPVariable_WrapRKN2at10TensorBaseE", a.wrap, &missing);
  if (libs.bind("aoti_torch_layout_strided", code, &missing))
    a.strided = code();
  if (libs.bind("aoti_torch_device_type_cpu", code, &missing))
    a.cpu = code();
  if (libs.bind("aoti_torch_device_type_cuda", code, &missing))
    a.cuda = code();
  if (!missing.empty())
    return "torch's C API: " + missing + " not found in the libraries of " + libDir;
  libs.bind("aoti_torch_get_current_cuda_stream", a.currentCudaStream); // CUDA builds only
  libs.bind("aoti_torch_grad_mode_is_enabled", a.gradModeEnabled);
  a.tensorType = Py_TYPE(probes[0].ptr());
  for (size_t i = 0; i < probes.size(); ++i) {
    std::optional<std::string> why;
    if (Py_TYPE(probes[i].ptr()) != a.tensorType)
      why = "probe " + std::to_string(i) + ": not of the first probe's type";
    else
      why = check(a, probes[i].ptr(), i);
    if (why) {
      a.tensorType = nullptr; // not enabled: _pause_torch_c_api leaves it off
      return why;
    }
  }
  Py_INCREF(a.tensorType);
  if (!streamGetter.is_none())
    a.streamGetter = streamGetter.inc_ref().ptr();
  a.ready = true;
  return std::nullopt;
}

} // namespace

bool torchCApiOn() { return api().ready; }

bool gradModeFast(bool &enabled) {
  const TorchCApi &a = api();
  if (!a.ready || !a.gradModeEnabled)
    return false;
  enabled = a.gradModeEnabled();
  return true;
}

bool readTensorFast(PyObject *obj, TensorFacts &t) {
  const TorchCApi &a = api();
  return a.ready && readFacts(a, obj, t);
}

void noteTensorDtype(PyObject *obj, PyObject *dtype) {
  TorchCApi &a = api();
  if (a.ready && isTorchTensor(a, obj))
    learnDtype(a, obj, dtype);
}

bool isLearntDtype(PyObject *obj) { return obj && dtypeCode(api(), obj) >= 0; }

int32_t dtypeCodeOf(PyObject *dtype) { return dtype ? dtypeCode(api(), dtype) : -1; }

PyObject *dtypeOfCode(int32_t code) { return code >= 0 && code < kDtypeCodes ? api().dtypes[code] : nullptr; }

int32_t dtypeCodeNamed(const std::string &name) {
  for (int32_t code = 0; code < kDtypeCodes; ++code) {
    PyObject *dtype = api().dtypes[code];
    nb::object text = dtype ? nb::steal(PyObject_Str(dtype)) : nb::object();
    if (text.is_valid() && PyUnicode_Check(text.ptr()) && name == PyUnicode_AsUTF8(text.ptr()))
      return code;
  }
  return -1;
}

PyObject *emptyFor(PyObject *like, int rank, const int64_t *sizes, int32_t code) {
  const TorchCApi &a = api();
  if (!a.ready || Py_TYPE(like) != a.tensorType)
    return nullptr;
  return emptyOf(a, like, rank, sizes, code);
}

bool tensorDataPtrFast(PyObject *obj, uint64_t &pointer) {
  const TorchCApi &a = api();
  if (!a.ready || !isTorchTensor(a, obj))
    return false;
  Handle h = handleOf(obj);
  int32_t layout, deviceType;
  void *data;
  if (a.getLayout(h, &layout) || layout != a.strided || a.getDeviceType(h, &deviceType) ||
      (deviceType != a.cpu && deviceType != a.cuda) || a.getDataPtr(h, &data))
    return false;
  pointer = reinterpret_cast<uintptr_t>(data);
  return true;
}

bool handleFacts(void *handle, uint64_t &pointer, long long &device) {
  const TorchCApi &a = api();
  int64_t rank;
  int32_t dtype, deviceType, deviceIndex;
  void *data;
  if (!a.ready || !handle || !readCommon(a, handle, rank, dtype, deviceType, deviceIndex) ||
      a.getDataPtr(handle, &data))
    return false;
  pointer = reinterpret_cast<uintptr_t>(data);
  device = deviceType == a.cpu ? -1 : deviceIndex;
  return true;
}

void *emptyForHandle(void *like, int rank, const int64_t *sizes, int32_t code) {
  const TorchCApi &a = api();
  return a.ready && like ? emptyOfHandle(a, like, rank, sizes, code) : nullptr;
}

void deleteHandle(void *handle) {
  if (handle)
    api().deleteTensor(handle);
}

bool currentStreamNative(long long device, uint64_t &stream) {
  const TorchCApi &a = api();
  void *s;
  if (!a.ready || !a.currentCudaStream || registry().streamGetter != a.streamGetter || device < 0 ||
      a.currentCudaStream(int32_t(device), &s))
    return false;
  stream = reinterpret_cast<uintptr_t>(s);
  return true;
}

bool torchCurrentStream(long long device, uint64_t &stream) {
  const TorchCApi &a = api();
  PyObject *getter = registry().streamGetter;
  void *s;
  if (!getter)
    return false;
  if (a.ready && a.currentCudaStream && getter == a.streamGetter && !a.currentCudaStream(int32_t(device), &s)) {
    stream = reinterpret_cast<uintptr_t>(s);
    return true;
  }
  nb::object handle = nb::steal(PyObject_CallFunction(getter, "L", device));
  if (!handle.is_valid() || !PyLong_Check(handle.ptr()))
    return false;
  stream = PyLong_AsUnsignedLongLong(handle.ptr());
  return !(stream == uint64_t(-1) && PyErr_Occurred());
}

namespace {

/// Test hook: (dtype, data_ptr, device, shape, strides) as one reader reads them, or None (the C API reads
/// no dtype before a read of the attributes has shown it its object).
nb::object tensorFacts(nb::handle x, bool cApi) {
  TensorFacts t;
  if (!(cApi ? readTensorFast(x.ptr(), t) : readTensorAttributes(x.ptr(), t))) {
    PyErr_Clear();
    return nb::none();
  }
  if (!cApi) // as readTensor does: the C API reads this dtype from now on
    noteTensorDtype(x.ptr(), t.dtype);
  nb::list shape, strides;
  for (size_t i = 0; i < t.rank; ++i) {
    shape.append(t.extents[i]);
    strides.append(t.strides[i]);
  }
  return nb::make_tuple(nb::borrow(t.dtype), t.pointer, t.device, nb::tuple(shape), nb::tuple(strides));
}

} // namespace

void bindTorchCApi(nb::module_ &rt) {
  rt.def(
      "_pause_torch_c_api",
      [](bool paused) {
        TorchCApi &a = api();
        if (a.tensorType) // enabled once: checked
          a.ready = !paused;
      },
      "paused"_a, "Test hook: reads go through the attributes while paused (once enabled).");
  rt.def(
      "stream_key",
      [](nb::handle x) -> nb::object {
        const TorchCApi &a = api();
        TensorFacts t;
        void *stream;
        if (!a.ready || !a.currentCudaStream || !readFacts(a, x.ptr(), t) || t.device < 0 ||
            a.currentCudaStream(int32_t(t.device), &stream))
          return nb::none();
        return nb::make_tuple(t.device, uint64_t(reinterpret_cast<uintptr_t>(stream)));
      },
      "x"_a,
      "(device index, raw handle of its current torch stream) of the CUDA torch tensor x through torch's C API, "
      "as memory.stream_key reads them; None where the C API cannot read them.");
  rt.def("_tensor_facts", &tensorFacts, "x"_a, "c_api"_a,
         "Test hook: x's (dtype, data_ptr, device, shape, strides) read through torch's C API or through its "
         "attributes, or None where that reader cannot read them.");
  rt.def("_enable_torch_c_api", &enable, "lib_dir"_a, "probes"_a, "stream_getter"_a.none(),
         "Reads torch tensors through torch's C API from now on, once it is bound from lib_dir (torch/lib) and "
         "reads each probe (torch.Tensor instances) as its attributes do; returns None, or why not (a str). "
         "stream_getter: the raw-stream getter the C API's current CUDA stream stands for.");
  rt.def(
      "empty_like",
      [](nb::handle x, nb::handle shape, nb::handle dtype) -> nb::object {
        const TorchCApi &a = api();
        if (!a.ready || Py_TYPE(x.ptr()) != a.tensorType)
          return nb::none();
        PyObject *made = emptyLike(a, x.ptr(), shape.is_none() ? nullptr : shape.ptr(),
                                   dtype.is_none() ? nullptr : dtype.ptr());
        if (!made && PyErr_Occurred())
          raisePending();
        return made ? nb::steal(made) : nb::none();
      },
      "x"_a, "shape"_a.none() = nb::none(), "dtype"_a.none() = nb::none(),
      "A new contiguous torch.Tensor on x's device, of x's shape and dtype or the given shape (ints) and dtype (a "
      "torch.dtype), made through torch's C API; None where it cannot be (the C API off, x not a plain strided CPU "
      "or CUDA torch.Tensor, a dtype no tensor has shown it yet).");
}

} // namespace fly::python
