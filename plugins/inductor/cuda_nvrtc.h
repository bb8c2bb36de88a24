// NVRTC, the CUDA run-time compiler, loaded with dlopen when first needed.
//
// The plugin links no CUDA library: it must load, and run its CPU kernels, on machines without
// CUDA, and a CUDA install is a run-time choice (the system toolkit, or the nvidia/cu13 libraries
// of the torch wheel). So NVRTC's few entry points are looked up with dlsym, declared here with
// their C signatures (no CUDA header is needed to build). Without a libnvrtc, `load` throws an
// Error naming every place it looked; the plugin then claims nothing on CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::inductor {

class Nvrtc {
 public:
  // Loads libnvrtc from `path` when it is not empty (the `nvrtc` option: a file, or a directory
  // holding libnvrtc.so.13 / .12 / .so). Otherwise the first of: a libnvrtc the process has already
  // loaded (LibTorch's); one next to a CUDA library the process has loaded (the wheel's
  // nvidia/cu13/lib beside libcudart, or beside libtorch_cuda.so's ../../nvidia/...); the loader's
  // own search by soname (LD_LIBRARY_PATH, the ld.so cache); /usr/local/cuda/lib64. Throws
  // plugin::Error(KILN_ERROR_UNAVAILABLE) listing what was tried and why each failed.
  static std::shared_ptr<Nvrtc> load(const std::string& path);
  ~Nvrtc();
  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;

  const std::string& library_path() const { return path_; }
  int version_major() const { return major_; }
  int version_minor() const { return minor_; }
  std::string version() const { return std::to_string(major_) + "." + std::to_string(minor_); }
  // The real architectures NVRTC can compile for (90 for sm_90), ascending.
  const std::vector<int>& supported_archs() const { return archs_; }
  bool supports(int arch) const;

  // Compiles `source` (named `name` in messages) to a cubin for sm_<arch>, with `options` after
  // kiln's own (-arch, -std=c++17). Throws plugin::Error(KILN_ERROR_INTERNAL) with NVRTC's error
  // and its log on failure.
  std::string compile(const std::string& source, int arch, const std::string& name,
                      const std::vector<std::string>& options = {}) const;
  // The options compile() passes for `arch` besides the caller's: part of a cubin's cache key.
  static std::vector<std::string> base_options(int arch);
  // How many programs compile() has compiled in this process (a warm cache compiles none).
  static uint64_t compiles();

 private:
  Nvrtc() = default;
  struct Fns;
  void* handle_ = nullptr;
  std::string path_;
  int major_ = 0, minor_ = 0;
  std::vector<int> archs_;
  std::unique_ptr<Fns> fn_;
};

}  // namespace kiln::inductor
