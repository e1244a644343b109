//===- TorchCApi.h - Torch tensors read through torch's stable C API -*- C++ -*-===//
//
// Reading a torch tensor's facts through its Python attributes (dtype, shape,
// stride(), data_ptr(), get_device()) costs about a microsecond per tensor:
// most of a replayed zoo call's host time. torch exports a stable C API over
// its tensors (AOTInductor's shim: aoti_torch_get_sizes, aoti_torch_empty_strided,
// ... in libtorch_cpu.so; the current CUDA stream in libtorch_cuda.so) that
// reads the same facts from an at::Tensor in nanoseconds, and a torch tensor's
// Python object holds its at::Tensor right after the object header (torch's
// THPVariable). enableTorchCApi binds the C API from the libraries torch has
// loaded and checks on probe tensors that every fact read through it equals
// the Python attribute's; only then are the readers below used. Anything they
// cannot read (another layout, device type or torch) goes through the
// attributes as before. Nanobind side only.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_PYTHON_TORCHCAPI_H
#define FLY_PYTHON_TORCHCAPI_H

#include "PlanKey.h"

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

namespace fly::python {

/// Whether the C API is bound, checked and not paused.
bool torchCApiOn();

/// Whether torch's grad mode is on, through the C API; false where the API is off or has no such function.
bool gradModeFast(bool &enabled);

/// `obj`'s facts (`obj` of a registered tensor type) through the C API; false
/// (no error set) where the API is off or cannot read them: read the attributes.
bool readTensorFast(PyObject *obj, TensorFacts &t);

/// Learns the dtype object of `obj`'s dtype code from a read of its attributes,
/// so that later fast reads of that dtype need none.
void noteTensorDtype(PyObject *obj, PyObject *dtype);

/// A new contiguous torch.Tensor on `like`'s device, of `like`'s shape (rank < 0)
/// or `rank` `sizes`, and of `like`'s dtype (code < 0) or dtype `code`
/// (dtypeCodeOf); nullptr where the C API cannot make it (an error set only
/// where wrapping it failed).
PyObject *emptyFor(PyObject *like, int rank, const int64_t *sizes, int32_t code);

/// The C API's code of a learnt torch.dtype (-1: none), and the dtype of a code (null: none learnt).
int32_t dtypeCodeOf(PyObject *dtype);
PyObject *dtypeOfCode(int32_t code);

/// The code of the learnt dtype whose str() is `name` ("torch.float32"), or -1.
int32_t dtypeCodeNamed(const std::string &name);

/// Whether `obj` is a dtype object the C API has learnt (reads report it).
bool isLearntDtype(PyObject *obj);

/// `obj`'s data_ptr() through the C API; false where the API is off or the
/// tensor cannot be read so (no error set).
bool tensorDataPtrFast(PyObject *obj, uint64_t &pointer);

/// Without Python (any thread, no GIL: a replay called from C++, LaunchPlan::replayHandles), on torch handles
/// (AtenTensorHandle: an at::Tensor *): a handle's data pointer and device index (-1: the CPU); a new contiguous
/// tensor made as emptyFor makes one, as a new handle (the caller's: deleteHandle); the current stream of CUDA
/// `device` through the C API where it stands for the registered getter. False / null where the C API is off or
/// cannot.
bool handleFacts(void *handle, uint64_t &pointer, long long &device);
void *emptyForHandle(void *like, int rank, const int64_t *sizes, int32_t code);
void deleteHandle(void *handle);
bool currentStreamNative(long long device, uint64_t &stream);

/// The current stream of CUDA `device` as the registered stream getter says
/// (torch._C._cuda_getCurrentRawStream): through the C API where the getter is
/// torch's own and the API is on, else by calling it. False where none is
/// registered or the call failed (its error set).
bool torchCurrentStream(long long device, uint64_t &stream);

/// _enable_torch_c_api and empty_like.
void bindTorchCApi(nanobind::module_ &rt);

} // namespace fly::python

#endif // FLY_PYTHON_TORCHCAPI_H
