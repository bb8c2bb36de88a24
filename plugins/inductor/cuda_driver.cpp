#include "cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <functional>
#include <type_traits>

#include <kiln/plugin_api.hpp>

namespace kiln::inductor {

using plugin::Error;

namespace {
// cuda.h's values.
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kCaptureStatusNone = 0;
constexpr int kErrorNotFound = 500;  // CUDA_ERROR_NOT_FOUND
}  // namespace

struct CudaDriver::Fns {
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DriverGetVersion)(int*) = nullptr;
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, int*) = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t) = nullptr;
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*ModuleGetGlobal)(CUdeviceptr*, size_t*, CUmodule, const char*) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*EventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*EventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*EventSynchronize)(CUevent) = nullptr;
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*EventDestroy)(CUevent) = nullptr;
};

std::shared_ptr<CudaDriver> CudaDriver::load() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    throw Error(KILN_ERROR_UNAVAILABLE,
                std::string("no CUDA driver: cannot load libcuda.so.1 (") + (e ? e : "not found") + ")");
  }
  std::shared_ptr<CudaDriver> d(new CudaDriver);
  d->handle_ = h;
  d->path_ = "libcuda.so.1";
  if (link_map* lm = nullptr; dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
    d->path_ = lm->l_name;
  d->fn_ = std::make_unique<Fns>();
  Fns& f = *d->fn_;
  std::string missing;
  auto sym = [&](auto& fp, const char* name) {
    fp = reinterpret_cast<std::remove_reference_t<decltype(fp)>>(dlsym(h, name));
    if (!fp) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  sym(f.Init, "cuInit");
  sym(f.DriverGetVersion, "cuDriverGetVersion");
  sym(f.GetErrorName, "cuGetErrorName");
  sym(f.GetErrorString, "cuGetErrorString");
  sym(f.DeviceGetCount, "cuDeviceGetCount");
  sym(f.DeviceGet, "cuDeviceGet");
  sym(f.DeviceGetAttribute, "cuDeviceGetAttribute");
  sym(f.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  sym(f.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  sym(f.CtxGetCurrent, "cuCtxGetCurrent");
  sym(f.CtxSetCurrent, "cuCtxSetCurrent");
  sym(f.ModuleLoadData, "cuModuleLoadData");
  sym(f.ModuleUnload, "cuModuleUnload");
  sym(f.ModuleGetFunction, "cuModuleGetFunction");
  sym(f.LaunchKernel, "cuLaunchKernel");
  sym(f.StreamIsCapturing, "cuStreamIsCapturing");
  sym(f.MemAlloc, "cuMemAlloc_v2");
  sym(f.MemFree, "cuMemFree_v2");
  sym(f.MemsetD32, "cuMemsetD32_v2");
  sym(f.MemsetD8Async, "cuMemsetD8Async");
  sym(f.ModuleGetGlobal, "cuModuleGetGlobal_v2");
  sym(f.MemcpyHtoD, "cuMemcpyHtoD_v2");
  sym(f.CtxSynchronize, "cuCtxSynchronize");
  sym(f.EventCreate, "cuEventCreate");
  sym(f.EventRecord, "cuEventRecord");
  sym(f.EventSynchronize, "cuEventSynchronize");
  sym(f.EventElapsedTime, "cuEventElapsedTime");
  sym(f.EventDestroy, "cuEventDestroy_v2");
  if (!missing.empty())
    throw Error(KILN_ERROR_UNAVAILABLE, "the CUDA driver " + d->path_ + " lacks " + missing + " (too old?)");
  if (CUresult r = f.Init(0); r != 0)
    throw Error(KILN_ERROR_UNAVAILABLE, "the CUDA driver does not start: " + d->describe(r, "cuInit"));
  d->check(f.DriverGetVersion(&d->version_), "cuDriverGetVersion");
  return d;
}

CudaDriver::~CudaDriver() {
  if (fn_)
    for (size_t i = 0; i < primary_.size(); ++i)
      if (primary_[i]) fn_->DevicePrimaryCtxRelease(static_cast<CUdevice>(i));
  // libcuda stays loaded: unloading the driver under a live CUDA runtime is never safe.
}

std::string CudaDriver::version_string() const {
  return std::to_string(version_ / 1000) + "." + std::to_string((version_ % 1000) / 10);
}

std::string CudaDriver::describe(CUresult r, const std::string& what) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (fn_ && fn_->GetErrorName) fn_->GetErrorName(r, &name);
  if (fn_ && fn_->GetErrorString) fn_->GetErrorString(r, &text);
  return what + ": " + (name ? name : "CUDA error " + std::to_string(r)) + (text ? std::string(": ") + text : "");
}

void CudaDriver::check(CUresult r, const std::string& what) const {
  if (r == 0) return;
  // 2: out of memory; 100: no device; 999: unknown.
  const KilnErrorCode code = r == 2     ? KILN_ERROR_OUT_OF_MEMORY
                             : r == 100 ? KILN_ERROR_UNAVAILABLE
                                        : KILN_ERROR_INTERNAL;
  throw Error(code, describe(r, what));
}

int CudaDriver::device_count() const {
  int n = 0;
  check(fn_->DeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

int CudaDriver::compute_capability(int ordinal) const {
  CUdevice dev = 0;
  check(fn_->DeviceGet(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  int major = 0, minor = 0;
  check(fn_->DeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
  check(fn_->DeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
  return major * 10 + minor;
}

int CudaDriver::multiprocessors(int ordinal) const {
  CUdevice dev = 0;
  check(fn_->DeviceGet(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  int n = 0;
  check(fn_->DeviceGetAttribute(&n, kAttrMultiprocessorCount, dev), "cuDeviceGetAttribute");
  return n;
}

CudaDriver::CUcontext CudaDriver::primary(int ordinal) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (ordinal < 0) throw Error(KILN_ERROR_INVALID_ARGUMENT, "CUDA device " + std::to_string(ordinal));
  if (primary_.size() <= static_cast<size_t>(ordinal)) primary_.resize(static_cast<size_t>(ordinal) + 1, nullptr);
  CUcontext& c = primary_[static_cast<size_t>(ordinal)];
  if (!c) {
    CUdevice dev = 0;
    check(fn_->DeviceGet(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
    check(fn_->DevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain(" + std::to_string(ordinal) + ")");
  }
  return c;
}

CudaDriver::Scope::Scope(const CudaDriver& d, int ordinal) : d_(d) {
  CUcontext want = d.primary(ordinal);
  d.check(d.fn_->CtxGetCurrent(&prev_), "cuCtxGetCurrent");
  if (prev_ != want) {
    d.check(d.fn_->CtxSetCurrent(want), "cuCtxSetCurrent");
    switched_ = true;
  }
}

CudaDriver::Scope::~Scope() {
  if (switched_) d_.fn_->CtxSetCurrent(prev_);
}

CudaDriver::CUmodule CudaDriver::load_module(const std::string& image, const std::string& what) const {
  CUmodule m = nullptr;
  check(fn_->ModuleLoadData(&m, image.data()), "cuModuleLoadData(" + what + ")");
  return m;
}

void CudaDriver::unload_module(CUmodule m) const noexcept {
  if (m) fn_->ModuleUnload(m);
}

CudaDriver::CUfunction CudaDriver::function(CUmodule m, const std::string& name) const {
  CUfunction f = nullptr;
  check(fn_->ModuleGetFunction(&f, m, name.c_str()), "cuModuleGetFunction(" + name + ")");
  return f;
}

void CudaDriver::launch(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shared_bytes,
                        void* stream, void** args, const std::string& name) const {
  check(fn_->LaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                          static_cast<CUstream>(stream), args, nullptr),
        "cuLaunchKernel(" + name + ", grid " + std::to_string(grid[0]) + "x" + std::to_string(grid[1]) + ", block " +
            std::to_string(block[0]) + "x" + std::to_string(block[1]) + ")");
}

bool CudaDriver::capturing(void* stream) const {
  int status = kCaptureStatusNone;
  check(fn_->StreamIsCapturing(static_cast<CUstream>(stream), &status), "cuStreamIsCapturing");
  return status != kCaptureStatusNone;
}

CudaDriver::CUdeviceptr CudaDriver::alloc(size_t bytes, const std::string& what) const {
  CUdeviceptr p = 0;
  check(fn_->MemAlloc(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc(" + std::to_string(bytes) + " bytes, " + what + ")");
  return p;
}

void CudaDriver::free(CUdeviceptr p) const noexcept {
  if (p) fn_->MemFree(p);
}

void CudaDriver::fill32(CUdeviceptr p, unsigned value, size_t words) const {
  if (words) check(fn_->MemsetD32(p, value, words), "cuMemsetD32(" + std::to_string(words) + " words)");
}

void CudaDriver::memset_async(CUdeviceptr p, unsigned char value, size_t bytes, void* stream) const {
  if (bytes)
    check(fn_->MemsetD8Async(p, value, bytes, static_cast<CUstream>(stream)),
          "cuMemsetD8Async(" + std::to_string(bytes) + " bytes)");
}

bool CudaDriver::write_global(CUmodule m, const std::string& name, const void* data, size_t bytes,
                              const std::string& what) const {
  CUdeviceptr p = 0;
  size_t size = 0;
  const CUresult r = fn_->ModuleGetGlobal(&p, &size, m, name.c_str());
  if (r == kErrorNotFound) return false;  // no kernel of the module reads it, and it was left out
  check(r, "cuModuleGetGlobal(" + name + ", " + what + ")");
  if (size != bytes)
    throw Error(KILN_ERROR_INTERNAL, "cuModuleGetGlobal(" + name + ", " + what + "): " + std::to_string(size) +
                                         " bytes, where " + std::to_string(bytes) + " are written");
  check(fn_->MemcpyHtoD(p, data, bytes), "cuMemcpyHtoD(" + name + ", " + what + ")");
  // A copy from pageable memory may still be on its way when the call returns; the kernels that
  // read it run on other streams.
  synchronize();
  return true;
}

void CudaDriver::synchronize() const { check(fn_->CtxSynchronize(), "cuCtxSynchronize"); }

double CudaDriver::time_ms(const std::function<void()>& enqueue, void* stream) const {
  CUevent start = nullptr, stop = nullptr;
  check(fn_->EventCreate(&start, 0), "cuEventCreate");
  struct Events {
    const Fns& f;
    CUevent& a;
    CUevent& b;
    ~Events() {
      if (a) f.EventDestroy(a);
      if (b) f.EventDestroy(b);
    }
  } owned{*fn_, start, stop};
  check(fn_->EventCreate(&stop, 0), "cuEventCreate");
  check(fn_->EventRecord(start, static_cast<CUstream>(stream)), "cuEventRecord");
  enqueue();
  check(fn_->EventRecord(stop, static_cast<CUstream>(stream)), "cuEventRecord");
  check(fn_->EventSynchronize(stop), "cuEventSynchronize");
  float ms = 0;
  check(fn_->EventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
  return ms;
}

}  // namespace kiln::inductor
