//===- CudaDriver.h - Lazily loaded CUDA driver API -------------*- C++ -*-===//
//
// Thin C++17 wrapper over the CUDA driver API. libcuda.so.1 is dlopen'ed on
// first use (never at import), so everything here builds without the CUDA
// toolkit and imports on machines without a GPU. The few driver types and
// enum values used are declared below with the values of cuda.h.
//
// No Python and no MLIR in here: the nanobind layer lives in
// native/python/RuntimeBindings.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef FLY_RUNTIME_CUDADRIVER_H
#define FLY_RUNTIME_CUDADRIVER_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace fly::runtime {

//===----------------------------------------------------------------------===//
// Driver types (layout and values as in cuda.h).
//===----------------------------------------------------------------------===//

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = struct CUstream_st *;

enum : CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NOT_FOUND = 500,
};

// CUfunction_attribute
enum : int {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
  CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
  CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

// CUdevice_attribute (only the ones referenced by name in the project).
enum : int {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

// CUjit_option
enum : int {
  CU_JIT_INFO_LOG_BUFFER = 3,
  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
  CU_JIT_LOG_VERBOSE = 12,
};

// CUlaunchAttributeID
enum : int { CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4 };

struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char pad[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "must match cuda.h");

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute *attrs;
  unsigned numAttrs;
};

//===----------------------------------------------------------------------===//
// Errors.
//===----------------------------------------------------------------------===//

/// Result code used when libcuda.so.1 itself cannot be loaded (not a CUresult).
constexpr CUresult kLibraryNotLoaded = -1;

/// A failed driver call. what() reads
/// "<function> failed: <name> (<result>): <description>[\n<detail>]".
class DriverError : public std::runtime_error {
public:
  DriverError(std::string function, CUresult result, std::string name, std::string description,
              const std::string &detail = {});

  const std::string &function() const { return function_; }
  CUresult result() const { return result_; }
  const std::string &errorName() const { return name_; }
  const std::string &errorString() const { return description_; }

private:
  std::string function_;
  CUresult result_;
  std::string name_;
  std::string description_;
};

/// Throws DriverError for `result` (looks up cuGetErrorName/String).
[[noreturn]] void throwDriverError(const char *function, CUresult result,
                                   const std::string &detail = {});

inline void check(CUresult result, const char *function) {
  if (result != CUDA_SUCCESS)
    throwDriverError(function, result);
}

//===----------------------------------------------------------------------===//
// Driver entry points.
//===----------------------------------------------------------------------===//

/// Function pointers resolved from libcuda.so.1 (versioned names where cuda.h
/// maps the plain name to a _v2, so the ABI matches the declarations here).
struct DriverApi {
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int *);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
  // Optional (CUDA >= 11.8); null when the driver lacks it.
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
};

/// The loaded entry points. Loads libcuda.so.1 and runs cuInit(0) on first
/// call; throws DriverError when either fails (every later call rethrows).
const DriverApi &driver();

/// True when libcuda loads, cuInit succeeds and there is at least one device.
/// Never throws.
bool isAvailable() noexcept;

/// cuDriverGetVersion (e.g. 12040). Needs libcuda but not cuInit.
int driverVersion();
int deviceCount();
std::string deviceName(int device);
int deviceAttribute(int attr, int device);

/// Makes sure the calling thread has a current context and returns it: the
/// current one if any (e.g. created by torch), else device 0's primary context
/// (retained once, shared with torch/cudart) made current.
CUcontext ensureContext();

/// cuCtxSynchronize on the (ensured) current context.
void synchronize();

//===----------------------------------------------------------------------===//
// Modules and functions.
//===----------------------------------------------------------------------===//

class Function;

/// A loaded CUmodule (PTX text or cubin/fatbin bytes). Always held by
/// shared_ptr so Functions can keep it alive.
class Module : public std::enable_shared_from_this<Module> {
public:
  /// Loads `image` through cuModuleLoadDataEx. PTX text gets a NUL appended
  /// when missing (the driver reads it as a C string). On failure the JIT
  /// error log is appended to the DriverError message.
  static std::shared_ptr<Module> load(const void *image, size_t size);

  ~Module();
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  Function getFunction(const std::string &name);
  CUmodule handle() const { return module_; }
  /// JIT info log of the load (empty for cubins).
  const std::string &infoLog() const { return infoLog_; }

  /// Per-kernel state shared by all Function copies of one kernel, so the
  /// max-dynamic-shared-memory cache cannot disagree between them.
  struct Kernel {
    CUfunction handle = nullptr;
    std::string name;
    std::atomic<int> maxDynamicShared{0};
  };

private:
  Module(CUmodule module, std::string infoLog) : module_(module), infoLog_(std::move(infoLog)) {}

  CUmodule module_;
  std::string infoLog_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Kernel>> kernels_;
};

/// A kernel of a Module. Cheap to copy; keeps its Module alive.
class Function {
public:
  Function(std::shared_ptr<Module> module, Module::Kernel *kernel)
      : module_(std::move(module)), kernel_(kernel) {}

  const std::string &name() const { return kernel_->name; }
  CUfunction handle() const { return kernel_->handle; }
  const std::shared_ptr<Module> &module() const { return module_; }

  int attribute(int attr) const;
  int numRegs() const { return attribute(CU_FUNC_ATTRIBUTE_NUM_REGS); }
  int maxThreadsPerBlock() const { return attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); }
  int sharedSizeBytes() const { return attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES); }
  int localSizeBytes() const { return attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES); }
  int maxDynamicSharedMemory() const { return kernel_->maxDynamicShared.load(); }

  /// Sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (needed above the
  /// default 48 KiB limit).
  void setMaxDynamicSharedMemory(int bytes) const;

  /// Launches with cuLaunchKernel, or cuLaunchKernelEx with a cluster
  /// dimension attribute when `cluster` is non-null. Raises the dynamic shared
  /// memory limit first when `sharedBytes` exceeds the one already set.
  /// `params` follows cuLaunchKernel's kernelParams convention.
  void launch(const unsigned grid[3], const unsigned block[3], void **params,
              size_t sharedBytes = 0, CUstream stream = nullptr,
              const unsigned *cluster = nullptr) const;

private:
  std::shared_ptr<Module> module_;
  Module::Kernel *kernel_;
};

//===----------------------------------------------------------------------===//
// Device memory.
//===----------------------------------------------------------------------===//

/// Owning cuMemAlloc'ed buffer, so tests and demos can run without torch.
class DeviceBuffer {
public:
  explicit DeviceBuffer(size_t nbytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;

  CUdeviceptr ptr() const { return ptr_; }
  size_t size() const { return size_; }

  /// Copies `nbytes` (<= size()) from host memory to the start of the buffer.
  void copyFromHost(const void *src, size_t nbytes);
  /// Copies `nbytes` (<= size()) from the start of the buffer to host memory.
  void copyToHost(void *dst, size_t nbytes) const;
  /// Sets every byte of the buffer to `value`.
  void memset(unsigned char value);

private:
  void release() noexcept;

  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
};

} // namespace fly::runtime

#endif // FLY_RUNTIME_CUDADRIVER_H
