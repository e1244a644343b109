//===- CudaDriver.cpp - Lazily loaded CUDA driver API ---------------------===//

#include "CudaDriver.h"

#include <climits>
#include <cstring>
#include <dlfcn.h>
#include <stdexcept>
#include <string>
#include <vector>

namespace fly::runtime {

namespace {

/// Process-wide loader state. Filled once under std::call_once; read-only
/// afterwards, so the launch path needs no locking.
struct DriverState {
  DriverApi api{};
  bool libraryLoaded = false;
  bool initialized = false;
  // Failure of the load (or of cuInit), replayed on every later use.
  std::string failedFunction;
  CUresult failedResult = CUDA_SUCCESS;
  std::string failedDetail;
};

DriverState &state() {
  static DriverState s;
  return s;
}

[[noreturn]] void rethrowFailure(const DriverState &s) {
  throwDriverError(s.failedFunction.c_str(), s.failedResult, s.failedDetail);
}

void loadLibraryOnce(DriverState &s) {
  // RTLD_LOCAL: keep the driver's symbols out of the global namespace.
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *err = dlerror();
    s.failedFunction = "dlopen";
    s.failedResult = kLibraryNotLoaded;
    s.failedDetail = err ? err : "libcuda.so.1 not found";
    return;
  }

  std::string missing;
  auto resolve = [&](auto &fn, const char *name, bool required = true) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && required)
      missing += missing.empty() ? name : std::string(", ") + name;
  };
  DriverApi &a = s.api;
  resolve(a.cuGetErrorName, "cuGetErrorName");
  resolve(a.cuGetErrorString, "cuGetErrorString");
  resolve(a.cuInit, "cuInit");
  resolve(a.cuDriverGetVersion, "cuDriverGetVersion");
  resolve(a.cuDeviceGetCount, "cuDeviceGetCount");
  resolve(a.cuDeviceGet, "cuDeviceGet");
  resolve(a.cuDeviceGetName, "cuDeviceGetName");
  resolve(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  resolve(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(a.cuCtxGetCurrent, "cuCtxGetCurrent");
  resolve(a.cuCtxSetCurrent, "cuCtxSetCurrent");
  resolve(a.cuCtxSynchronize, "cuCtxSynchronize");
  resolve(a.cuModuleLoadDataEx, "cuModuleLoadDataEx");
  resolve(a.cuModuleUnload, "cuModuleUnload");
  resolve(a.cuModuleGetFunction, "cuModuleGetFunction");
  resolve(a.cuFuncGetAttribute, "cuFuncGetAttribute");
  resolve(a.cuFuncSetAttribute, "cuFuncSetAttribute");
  resolve(a.cuLaunchKernel, "cuLaunchKernel");
  resolve(a.cuLaunchKernelEx, "cuLaunchKernelEx", /*required=*/false);
  // cuda.h maps these plain names to _v2 (64-bit sizes and pointers).
  resolve(a.cuMemAlloc, "cuMemAlloc_v2");
  resolve(a.cuMemFree, "cuMemFree_v2");
  resolve(a.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  resolve(a.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  resolve(a.cuMemsetD8, "cuMemsetD8_v2");
  resolve(a.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", /*required=*/false);

  if (!missing.empty()) {
    // Too old or a broken stub: behave as if there were no driver at all.
    s.api = DriverApi{};
    dlclose(lib);
    s.failedFunction = "dlsym";
    s.failedResult = kLibraryNotLoaded;
    s.failedDetail = "libcuda.so.1 lacks " + missing;
    return;
  }
  s.libraryLoaded = true;
}

/// libcuda loaded and resolved; cuInit not necessarily called.
const DriverApi &library() {
  static std::once_flag once;
  DriverState &s = state();
  std::call_once(once, [&s] { loadLibraryOnce(s); });
  if (!s.libraryLoaded)
    rethrowFailure(s);
  return s.api;
}

} // namespace

//===----------------------------------------------------------------------===//
// Errors.
//===----------------------------------------------------------------------===//

static std::string formatError(const std::string &function, CUresult result,
                               const std::string &name, const std::string &description,
                               const std::string &detail) {
  std::string msg =
      function + " failed: " + name + " (" + std::to_string(result) + "): " + description;
  if (!detail.empty())
    msg += "\n" + detail;
  return msg;
}

DriverError::DriverError(std::string function, CUresult result, std::string name,
                         std::string description, const std::string &detail)
    : std::runtime_error(formatError(function, result, name, description, detail)),
      function_(std::move(function)), result_(result), name_(std::move(name)),
      description_(std::move(description)) {}

void throwDriverError(const char *function, CUresult result, const std::string &detail) {
  std::string name, description;
  if (result == kLibraryNotLoaded) {
    name = "CUDA_DRIVER_NOT_LOADED";
    description = "the CUDA driver library (libcuda.so.1) could not be loaded";
  } else {
    const DriverApi &a = state().api;
    const char *n = nullptr, *d = nullptr;
    if (a.cuGetErrorName && a.cuGetErrorName(result, &n) == CUDA_SUCCESS && n)
      name = n;
    else
      name = "CUDA_ERROR_UNKNOWN_CODE";
    if (a.cuGetErrorString && a.cuGetErrorString(result, &d) == CUDA_SUCCESS && d)
      description = d;
    else
      description = "unrecognized error code";
  }
  throw DriverError(function, result, std::move(name), std::move(description), detail);
}

//===----------------------------------------------------------------------===//
// Driver, devices and contexts.
//===----------------------------------------------------------------------===//

const DriverApi &driver() {
  static std::once_flag once;
  DriverState &s = state();
  std::call_once(once, [&s] {
    try {
      library();
    } catch (const DriverError &) {
      return; // failure already recorded in s
    }
    CUresult r = s.api.cuInit(0);
    if (r != CUDA_SUCCESS) {
      s.failedFunction = "cuInit";
      s.failedResult = r;
      return;
    }
    s.initialized = true;
  });
  if (!s.initialized)
    rethrowFailure(s);
  return s.api;
}

bool isAvailable() noexcept {
  try {
    return deviceCount() > 0;
  } catch (...) {
    return false;
  }
}

int driverVersion() {
  int version = 0;
  check(library().cuDriverGetVersion(&version), "cuDriverGetVersion");
  return version;
}

int deviceCount() {
  int count = 0;
  check(driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

static CUdevice getDevice(int ordinal) {
  CUdevice dev = 0;
  check(driver().cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  return dev;
}

std::string deviceName(int device) {
  CUdevice dev = getDevice(device);
  char name[256] = {};
  check(driver().cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  return name;
}

int deviceAttribute(int attr, int device) {
  CUdevice dev = getDevice(device);
  int value = 0;
  check(driver().cuDeviceGetAttribute(&value, attr, dev), "cuDeviceGetAttribute");
  return value;
}

CUcontext ensureContext() {
  const DriverApi &a = driver();
  CUcontext ctx = nullptr;
  check(a.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx)
    return ctx; // e.g. torch's; reuse rather than competing with it
  // Device 0's primary context, retained once for the process lifetime: it is
  // the context torch/cudart use too, so pointers and modules are shared.
  static CUcontext primary = nullptr;
  static std::once_flag once;
  std::call_once(once, [&a] {
    CUdevice dev = getDevice(0);
    check(a.cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain");
  });
  check(a.cuCtxSetCurrent(primary), "cuCtxSetCurrent");
  return primary;
}

void synchronize() {
  ensureContext();
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

/// Runs `call`; when it fails only because this thread has no current context
/// (e.g. a fresh Python thread), makes one current and retries once. Keeps
/// cuCtxGetCurrent off the launch path.
template <typename Call> static CUresult withContextRetry(Call &&call) {
  CUresult r = call();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    ensureContext();
    r = call();
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Module.
//===----------------------------------------------------------------------===//

static bool isBinaryImage(const unsigned char *p, size_t size) {
  static const unsigned char elf[] = {0x7f, 'E', 'L', 'F'};
  static const unsigned char fatbin[] = {0x50, 0xed, 0x55, 0xba}; // 0xBA55ED50 LE
  return size >= 4 && (!std::memcmp(p, elf, 4) || !std::memcmp(p, fatbin, 4));
}

std::shared_ptr<Module> Module::load(const void *image, size_t size) {
  const DriverApi &a = driver();
  ensureContext();

  const auto *bytes = static_cast<const unsigned char *>(image);
  std::string ptx;
  if (!isBinaryImage(bytes, size) && (size == 0 || bytes[size - 1] != '\0')) {
    // PTX is read as a NUL-terminated string.
    ptx.assign(reinterpret_cast<const char *>(bytes), size);
    image = ptx.c_str();
  }

  constexpr size_t kLogSize = 16 * 1024;
  std::vector<char> errorLog(kLogSize, '\0'), infoLog(kLogSize, '\0');
  int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                   CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {errorLog.data(), reinterpret_cast<void *>(uintptr_t(kLogSize - 1)),
                    infoLog.data(), reinterpret_cast<void *>(uintptr_t(kLogSize - 1))};

  CUmodule module = nullptr;
  CUresult r = a.cuModuleLoadDataEx(&module, image, 4, options, values);
  if (r != CUDA_SUCCESS) {
    std::string log(errorLog.data(), strnlen(errorLog.data(), kLogSize));
    while (!log.empty() && (log.back() == '\n' || log.back() == '\0'))
      log.pop_back();
    throwDriverError("cuModuleLoadDataEx", r, log);
  }
  std::string info(infoLog.data(), strnlen(infoLog.data(), kLogSize));
  return std::shared_ptr<Module>(new Module(module, std::move(info)));
}

Module::~Module() {
  if (!module_)
    return;
  // Best effort: may run on a thread without a context, or after the driver
  // has started shutting down at exit; never throw from here.
  try {
    ensureContext();
  } catch (...) {
  }
  (void)state().api.cuModuleUnload(module_);
}

Function Module::getFunction(const std::string &name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = kernels_.find(name);
  if (it == kernels_.end()) {
    const DriverApi &a = driver();
    auto kernel = std::make_unique<Kernel>();
    kernel->name = name;
    CUresult r = withContextRetry(
        [&] { return a.cuModuleGetFunction(&kernel->handle, module_, name.c_str()); });
    if (r != CUDA_SUCCESS)
      throwDriverError("cuModuleGetFunction", r, "kernel '" + name + "'");
    // Seed the cache with the limit in force (48 KiB minus static shared by
    // default) so launches below it never touch the attribute.
    int maxDynamic = 0;
    check(a.cuFuncGetAttribute(&maxDynamic, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               kernel->handle),
          "cuFuncGetAttribute");
    kernel->maxDynamicShared.store(maxDynamic);
    it = kernels_.emplace(name, std::move(kernel)).first;
  }
  return Function(shared_from_this(), it->second.get());
}

//===----------------------------------------------------------------------===//
// Function.
//===----------------------------------------------------------------------===//

int Function::attribute(int attr) const {
  int value = 0;
  const DriverApi &a = driver();
  check(withContextRetry([&] { return a.cuFuncGetAttribute(&value, attr, kernel_->handle); }),
        "cuFuncGetAttribute");
  return value;
}

void Function::setAttribute(int attr, int value, const std::string &what) const {
  const DriverApi &a = driver();
  CUresult r = withContextRetry([&] { return a.cuFuncSetAttribute(kernel_->handle, attr, value); });
  if (r != CUDA_SUCCESS)
    throwDriverError("cuFuncSetAttribute", r, "setting " + what + " of '" + kernel_->name + "'");
}

void Function::setMaxDynamicSharedMemory(int bytes) const {
  setAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes,
               "max dynamic shared memory to " + std::to_string(bytes) + " bytes");
  kernel_->maxDynamicShared.store(bytes, std::memory_order_relaxed);
}

void Function::setSharedCarveout(int percent) const {
  if (percent < -1 || percent > 100)
    throw std::invalid_argument("shared_carveout: expected -1 (no preference) or a percent 0..100, got " +
                                std::to_string(percent));
  setAttribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent,
               "the preferred shared memory carveout to " + std::to_string(percent) + "%");
}

void Function::launch(const unsigned grid[3], const unsigned block[3], void **params,
                      size_t sharedBytes, CUstream stream, const unsigned *cluster) const {
  // A Function exists only after a successful load, so the table is filled.
  const DriverApi &a = state().api;
  if (sharedBytes > size_t(kernel_->maxDynamicShared.load(std::memory_order_relaxed))) {
    if (sharedBytes > size_t(INT_MAX))
      throwDriverError("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE,
                       "dynamic shared memory of " + std::to_string(sharedBytes) + " bytes");
    setMaxDynamicSharedMemory(int(sharedBytes));
  }
  const unsigned smem = unsigned(sharedBytes);

  const bool dependent = kernel_->dependentLaunch.load(std::memory_order_relaxed);
  if (!cluster && !dependent) {
    CUresult r = withContextRetry([&] {
      return a.cuLaunchKernel(kernel_->handle, grid[0], grid[1], grid[2], block[0], block[1],
                              block[2], smem, stream, params, nullptr);
    });
    check(r, "cuLaunchKernel");
    return;
  }

  if (!a.cuLaunchKernelEx)
    throwDriverError("cuLaunchKernelEx", CUDA_ERROR_NOT_FOUND,
                     "the installed driver has no cuLaunchKernelEx (needs CUDA >= 11.8)");
  CUlaunchAttribute attrs[2];
  std::memset(attrs, 0, sizeof(attrs));
  unsigned count = 0;
  if (cluster) {
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[count].value.clusterDim.x = cluster[0];
    attrs[count].value.clusterDim.y = cluster[1];
    attrs[count].value.clusterDim.z = cluster[2];
    ++count;
  }
  if (dependent) {
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[count].value.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  CUlaunchConfig config{grid[0],  grid[1], grid[2], block[0], block[1],
                        block[2], smem,    stream,  attrs,    count};
  check(withContextRetry(
            [&] { return a.cuLaunchKernelEx(&config, kernel_->handle, params, nullptr); }),
        "cuLaunchKernelEx");
}

//===----------------------------------------------------------------------===//
// DeviceBuffer.
//===----------------------------------------------------------------------===//

DeviceBuffer::DeviceBuffer(size_t nbytes) : size_(nbytes) {
  if (nbytes == 0)
    return; // cuMemAlloc rejects 0; a null buffer is still useful as an argument
  const DriverApi &a = driver();
  ensureContext();
  check(a.cuMemAlloc(&ptr_, nbytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept : ptr_(other.ptr_), size_(other.size_) {
  other.ptr_ = 0;
  other.size_ = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    release();
    ptr_ = other.ptr_;
    size_ = other.size_;
    other.ptr_ = 0;
    other.size_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (!ptr_)
    return;
  try {
    ensureContext();
  } catch (...) {
  }
  (void)state().api.cuMemFree(ptr_); // errors at shutdown are expected; ignore
  ptr_ = 0;
}

void DeviceBuffer::copyFromHost(const void *src, size_t nbytes) {
  if (nbytes > size_)
    throw std::invalid_argument("copy of " + std::to_string(nbytes) + " bytes into a " +
                                std::to_string(size_) + "-byte DeviceBuffer");
  if (nbytes == 0)
    return;
  const DriverApi &a = driver();
  ensureContext();
  check(a.cuMemcpyHtoD(ptr_, src, nbytes), "cuMemcpyHtoD");
}

void DeviceBuffer::copyToHost(void *dst, size_t nbytes) const {
  if (nbytes > size_)
    throw std::invalid_argument("copy of " + std::to_string(nbytes) + " bytes from a " +
                                std::to_string(size_) + "-byte DeviceBuffer");
  if (nbytes == 0)
    return;
  const DriverApi &a = driver();
  ensureContext();
  check(a.cuMemcpyDtoH(dst, ptr_, nbytes), "cuMemcpyDtoH");
}

void DeviceBuffer::memset(unsigned char value) {
  if (size_ == 0)
    return;
  const DriverApi &a = driver();
  ensureContext();
  check(a.cuMemsetD8(ptr_, value, size_), "cuMemsetD8");
}

//===----------------------------------------------------------------------===//
// Tensor maps.
//===----------------------------------------------------------------------===//

unsigned tensorMapElementBytes(int dataType) {
  switch (dataType) {
  case CU_TENSOR_MAP_DATA_TYPE_UINT8:
    return 1;
  case CU_TENSOR_MAP_DATA_TYPE_UINT16:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
  case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    return 2;
  case CU_TENSOR_MAP_DATA_TYPE_UINT32:
  case CU_TENSOR_MAP_DATA_TYPE_INT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
    return 4;
  case CU_TENSOR_MAP_DATA_TYPE_UINT64:
  case CU_TENSOR_MAP_DATA_TYPE_INT64:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    return 8;
  default:
    return 0;
  }
}

static bool isFloatType(int dataType) {
  return dataType >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 &&
         dataType <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
}

[[noreturn]] static void invalid(const std::string &msg) { throw std::invalid_argument(msg); }

static std::string indexed(const char *name, unsigned i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

void validateTiled(const TiledTensorMapSpec &spec) {
  const unsigned elem = tensorMapElementBytes(spec.dataType);
  if (!elem)
    invalid("dtype: unknown CUtensorMapDataType " + std::to_string(spec.dataType));
  if (spec.interleave < CU_TENSOR_MAP_INTERLEAVE_NONE ||
      spec.interleave > CU_TENSOR_MAP_INTERLEAVE_32B)
    invalid("interleave: unknown CUtensorMapInterleave " + std::to_string(spec.interleave));
  if (spec.swizzle < CU_TENSOR_MAP_SWIZZLE_NONE || spec.swizzle > CU_TENSOR_MAP_SWIZZLE_128B)
    invalid("swizzle: unknown CUtensorMapSwizzle " + std::to_string(spec.swizzle));
  if (spec.l2Promotion < CU_TENSOR_MAP_L2_PROMOTION_NONE ||
      spec.l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
    invalid("l2_promotion: unknown CUtensorMapL2promotion " + std::to_string(spec.l2Promotion));
  if (spec.oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA &&
      !isFloatType(spec.dataType))
    invalid("oob_fill_nan: NaN fill needs a floating-point dtype");

  const bool interleaved = spec.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE;
  if (spec.rank < 1 || spec.rank > kMaxTensorRank)
    invalid("dims: rank must be 1 to 5, got " + std::to_string(spec.rank));
  if (interleaved && spec.rank < 3)
    invalid("dims: an interleaved layout needs rank >= 3, got " + std::to_string(spec.rank));
  if (spec.interleave == CU_TENSOR_MAP_INTERLEAVE_32B && spec.swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
    invalid("swizzle: interleave=32 needs swizzle=32");

  const uint64_t addressAlign = spec.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
  if (spec.globalAddress % addressAlign)
    invalid("global_address: must be " + std::to_string(addressAlign) + "-byte aligned, got " +
            std::to_string(spec.globalAddress));

  for (unsigned i = 0; i < spec.rank; ++i)
    if (spec.dims[i] == 0 || spec.dims[i] > (uint64_t(1) << 32))
      invalid(indexed("dims", i) + ": must be in 1..2^32, got " + std::to_string(spec.dims[i]));

  const uint64_t strideAlign = spec.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
  for (unsigned i = 0; i + 1 < spec.rank; ++i) {
    uint64_t s = spec.strides[i];
    if (s % strideAlign)
      invalid(indexed("strides_bytes", i) + ": must be a multiple of " +
              std::to_string(strideAlign) + " bytes, got " + std::to_string(s));
    if (s >= (uint64_t(1) << 40))
      invalid(indexed("strides_bytes", i) + ": must be < 2^40, got " + std::to_string(s));
  }

  for (unsigned i = 0; i < spec.rank; ++i)
    if (spec.box[i] < 1 || spec.box[i] > 256)
      invalid(indexed("box", i) + ": must be in 1..256, got " + std::to_string(spec.box[i]));
  const uint64_t innerBytes = uint64_t(spec.box[0]) * elem;
  if (!interleaved) {
    if (innerBytes % 16)
      invalid("box[0]: the inner box (" + std::to_string(innerBytes) +
              " bytes) must be a multiple of 16 bytes");
    if (spec.swizzle != CU_TENSOR_MAP_SWIZZLE_NONE) {
      const uint64_t span = uint64_t(16) << spec.swizzle; // 32, 64, 128
      if (innerBytes > span)
        invalid("box[0]: the inner box (" + std::to_string(innerBytes) +
                " bytes) exceeds the swizzle span of " + std::to_string(span) + " bytes");
    }
  }

  for (unsigned i = 0; i < spec.rank; ++i)
    if (spec.elementStrides[i] < 1 || spec.elementStrides[i] > 8)
      invalid(indexed("element_strides", i) + ": must be in 1..8, got " +
              std::to_string(spec.elementStrides[i]));
}

CUtensorMap encodeTiled(const TiledTensorMapSpec &spec) {
  validateTiled(spec);
  const DriverApi &a = driver();
  if (!a.cuTensorMapEncodeTiled)
    throwDriverError("cuTensorMapEncodeTiled", CUDA_ERROR_NOT_FOUND,
                     "the installed driver has no cuTensorMapEncodeTiled (needs CUDA >= 12.0)");
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  CUresult r = withContextRetry([&] {
    return a.cuTensorMapEncodeTiled(
        &map, spec.dataType, spec.rank, reinterpret_cast<void *>(uintptr_t(spec.globalAddress)),
        spec.dims.data(), spec.strides.data(), spec.box.data(), spec.elementStrides.data(),
        spec.interleave, spec.swizzle, spec.l2Promotion, spec.oobFill);
  });
  if (r != CUDA_SUCCESS)
    throwDriverError("cuTensorMapEncodeTiled", r, "rejected the tensor map arguments");
  return map;
}

} // namespace fly::runtime
