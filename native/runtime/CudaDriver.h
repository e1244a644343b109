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

#include <array>
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
  CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
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
enum : int {
  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char pad[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
    int programmaticStreamSerializationAllowed;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "must match cuda.h");

// CUtensorMapDataType
enum : int {
  CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
  CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1,
  CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2,
  CU_TENSOR_MAP_DATA_TYPE_INT32 = 3,
  CU_TENSOR_MAP_DATA_TYPE_UINT64 = 4,
  CU_TENSOR_MAP_DATA_TYPE_INT64 = 5,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT64 = 8,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ = 10,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 = 11,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ = 12,
};

// CUtensorMapInterleave
enum : int {
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_INTERLEAVE_16B = 1,
  CU_TENSOR_MAP_INTERLEAVE_32B = 2,
};

// CUtensorMapSwizzle
enum : int {
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B = 1,
  CU_TENSOR_MAP_SWIZZLE_64B = 2,
  CU_TENSOR_MAP_SWIZZLE_128B = 3,
};

// CUtensorMapL2promotion
enum : int {
  CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
  CU_TENSOR_MAP_L2_PROMOTION_L2_64B = 1,
  CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2,
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
};

// CUtensorMapFloatOOBfill
enum : int {
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1,
};

/// The opaque TMA descriptor. cuda.h asks for 64-byte alignment (newer headers
/// say 128; the driver and the PTX .param both need 64).
struct alignas(64) CUtensorMap {
  uint64_t opaque[16];
};
static_assert(sizeof(CUtensorMap) == 128, "must match cuda.h");

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
  // Optional (CUDA >= 12.0); null when the driver lacks it.
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *, int, unsigned, void *, const uint64_t *,
                                     const uint64_t *, const unsigned *, const unsigned *, int, int,
                                     int, int);
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
    std::atomic<bool> dependentLaunch{false};
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

  /// CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: the share of the
  /// SM's L1/shared storage (percent of the most shared memory, -1: no
  /// preference) that SMs running this kernel are configured with. SMs change
  /// configuration only when idle, so a kernel whose dependents' CTAs need
  /// much shared memory beside its own sets 100.
  int sharedCarveout() const { return attribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT); }
  void setSharedCarveout(int percent) const;

  /// Whether launches allow programmatic dependent launch: the kernel may
  /// start while the stream's previous kernel finishes (it must execute
  /// griddepcontrol.wait before touching memory that kernel writes).
  bool dependentLaunch() const { return kernel_->dependentLaunch.load(); }
  void setDependentLaunch(bool allowed) const { kernel_->dependentLaunch.store(allowed); }

  /// Launches with cuLaunchKernel, or cuLaunchKernelEx with a cluster
  /// dimension attribute when `cluster` is non-null and the programmatic
  /// stream serialization attribute when dependentLaunch(). Raises the dynamic shared
  /// memory limit first when `sharedBytes` exceeds the one already set.
  /// `params` follows cuLaunchKernel's kernelParams convention.
  void launch(const unsigned grid[3], const unsigned block[3], void **params,
              size_t sharedBytes = 0, CUstream stream = nullptr,
              const unsigned *cluster = nullptr) const;

private:
  /// cuFuncSetAttribute, raising a DriverError that names `what` and the kernel.
  void setAttribute(int attr, int value, const std::string &what) const;

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

//===----------------------------------------------------------------------===//
// Tensor maps (TMA descriptors).
//===----------------------------------------------------------------------===//

constexpr unsigned kMaxTensorRank = 5;

/// Arguments of cuTensorMapEncodeTiled, with the enums as cuda.h numbers.
struct TiledTensorMapSpec {
  int dataType = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  unsigned rank = 0;
  uint64_t globalAddress = 0;
  std::array<uint64_t, kMaxTensorRank> dims{};
  std::array<uint64_t, kMaxTensorRank - 1> strides{}; // bytes, of dims 1..rank-1
  std::array<unsigned, kMaxTensorRank> box{};
  std::array<unsigned, kMaxTensorRank> elementStrides{};
  int interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  int swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  int l2Promotion = CU_TENSOR_MAP_L2_PROMOTION_NONE;
  int oobFill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
};

/// Bytes per element of a CUtensorMapDataType (0 when unknown).
unsigned tensorMapElementBytes(int dataType);

/// Checks `spec` against cuTensorMapEncodeTiled's documented requirements so
/// mistakes fail the same way with or without a driver. Throws
/// std::invalid_argument whose message starts with the offending argument's
/// name (dims, strides_bytes, box, element_strides, global_address, ...).
void validateTiled(const TiledTensorMapSpec &spec);

/// validateTiled, then cuTensorMapEncodeTiled. Throws DriverError when the
/// driver lacks the call or rejects the arguments.
CUtensorMap encodeTiled(const TiledTensorMapSpec &spec);

} // namespace fly::runtime

#endif // FLY_RUNTIME_CUDADRIVER_H
