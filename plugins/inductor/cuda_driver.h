// The CUDA driver API, loaded with dlopen (libcuda.so.1) when first needed, for the same reason as
// NVRTC (cuda_nvrtc.h): the plugin links no CUDA library, so it loads on machines without a GPU
// driver. The handful of entry points the inductor uses are declared here with their C
// signatures; every failure names the call and the driver's own error name and message
// (cuGetErrorName, cuGetErrorString).
//
// Kernels run in the device's primary context, the one LibTorch (the CUDA runtime) uses, on the
// stream execute() is given: a cudaStream_t is a CUstream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::inductor {

class CudaDriver {
 public:
  using CUresult = int;
  using CUdevice = int;
  using CUcontext = struct CUctx_st*;
  using CUmodule = struct CUmod_st*;
  using CUfunction = struct CUfunc_st*;
  using CUstream = struct CUstream_st*;
  using CUdeviceptr = unsigned long long;
  using CUevent = struct CUevent_st*;

  // Loads libcuda.so.1 and initializes the driver (cuInit). Throws plugin::Error
  // (KILN_ERROR_UNAVAILABLE) saying why: no driver library, a driver without an entry point, or
  // cuInit's error (no device, a driver older than the kernel module...).
  static std::shared_ptr<CudaDriver> load();
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  const std::string& library_path() const { return path_; }
  int version() const { return version_; }  // cuDriverGetVersion: 13000 for CUDA 13.0
  std::string version_string() const;
  int device_count() const;
  int compute_capability(int ordinal) const;  // 90 for sm_90
  int multiprocessors(int ordinal) const;

  // The calling thread runs in device `ordinal`'s primary context for the life of the scope; the
  // context that was current before is current again after.
  class Scope {
   public:
    Scope(const CudaDriver& d, int ordinal);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const CudaDriver& d_;
    CUcontext prev_ = nullptr;
    bool switched_ = false;
  };

  // In the current context (a Scope). `what` names the module or kernel in errors.
  CUmodule load_module(const std::string& image, const std::string& what) const;
  void unload_module(CUmodule m) const noexcept;
  CUfunction function(CUmodule m, const std::string& name) const;
  void launch(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shared_bytes, void* stream,
              void** args, const std::string& name) const;
  // Whether work enqueued on `stream` is being recorded into a CUDA graph.
  bool capturing(void* stream) const;
  CUdeviceptr alloc(size_t bytes, const std::string& what) const;
  void free(CUdeviceptr p) const noexcept;
  // `words` 32-bit words of `value` from p (synchronous).
  void fill32(CUdeviceptr p, unsigned value, size_t words) const;
  // `bytes` bytes of `value` from p, enqueued on `stream`.
  void memset_async(CUdeviceptr p, unsigned char value, size_t bytes, void* stream) const;
  // Writes `bytes` from `data` into the module's global variable `name` (a __constant__ table) and
  // waits for the copy to land. False when the module has no such global (the compiler leaves out
  // one that nothing reads); throws when its size differs.
  bool write_global(CUmodule m, const std::string& name, const void* data, size_t bytes, const std::string& what) const;
  void synchronize() const;  // cuCtxSynchronize
  // Milliseconds of device time between two events recorded on `stream` around what `enqueue`
  // enqueues there; waits for it.
  double time_ms(const std::function<void()>& enqueue, void* stream) const;

  // "cuLaunchKernel(kiln_k0): CUDA_ERROR_INVALID_VALUE: invalid argument"
  std::string describe(CUresult r, const std::string& what) const;
  void check(CUresult r, const std::string& what) const;

 private:
  CudaDriver() = default;
  CUcontext primary(int ordinal) const;
  struct Fns;
  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  std::unique_ptr<Fns> fn_;
  mutable std::mutex mu_;
  mutable std::vector<CUcontext> primary_;  // by ordinal, retained once
};

}  // namespace kiln::inductor
