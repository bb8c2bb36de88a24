// The system compiler and the compile cache.
//
// Cache layout, under <cache_dir>/inductor/:
//   <key>.cpp    the generated source (kept for reading and for compiler messages)
//   <key>.so     the compiled kernels
//   <key>.ok     manifest written last: format version, key, byte size and FNV-1a hash of the .so;
//                an entry without a manifest that matches its .so is never loaded
//   <key>.tune   max-autotune winners for that source
//   <key>.cu, <key>.cubin   a generated CUDA source and its cubin (NVRTC), with <key>.ok likewise
// <key> hashes the source, the compiler's path and version, the flags and the CPU features. Every
// file is written to a private temporary name and renamed into place, so concurrent processes only
// ever see whole files; two that build the same key produce the same bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "cuda_nvrtc.h"

namespace kiln::inductor {

std::string hash_hex(const std::string& data);  // 128-bit FNV-1a, 32 hex digits

struct Toolchain {
  std::string cxx = "c++";
  std::vector<std::string> flags;  // everything but the source and -o
  std::string version;             // first line of `cxx --version`
  std::string cpu_features;        // what the flags target, e.g. "avx2,fma,avx512f"
};

// The compiler (the `cxx` option, else c++; the environment is not read, so the options alone say
// what builds the kernels), -O2, OpenMP, and -m flags for this CPU's ISA.
Toolchain make_toolchain(const std::string& cxx, const std::vector<std::string>& extra_flags);

// Runs argv (no shell) and returns its exit status; `output` gets stdout and stderr.
int run_process(const std::vector<std::string>& argv, std::string* output);

class Library {
 public:
  explicit Library(void* handle) : handle_(handle) {}
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* symbol(const std::string& name) const;

 private:
  void* handle_;
};

struct CacheStats {
  bool hit = false;
  double compile_seconds = 0;
};

// The entry for `source`: loaded from the cache when it is whole, else compiled (and stored).
// Throws plugin::Error with the compiler's message and the source's path when compilation fails.
std::shared_ptr<Library> compile_cached(const std::string& source, const Toolchain& tc, const std::string& cache_root,
                                        const plugin::Host& host, std::string* key_out, CacheStats* stats);

// Whether the cache holds a whole entry for `source` (nothing is compiled).
bool cache_has(const std::string& source, const Toolchain& tc, const std::string& cache_root);

// The cubin of a generated CUDA source for sm_<arch>: loaded from the cache when its entry is whole,
// else compiled by NVRTC (and stored). Entries are <key>.cu (the source), <key>.cubin and the
// manifest <key>.ok, as for the C++ libraries; <key> hashes the source, the architecture, NVRTC's
// version and options, so a warm cache runs NVRTC zero times. Throws plugin::Error with NVRTC's
// log and the source's path when compilation fails.
std::string cubin_cached(const std::string& source, const Nvrtc& nvrtc, int arch, const std::string& cache_root,
                         const plugin::Host& host, std::string* key_out, CacheStats* stats);

// The directory the inductor caches in, under a cache_dir.
std::string inductor_cache_dir(const std::string& cache_dir);

// `root` when kiln can create it and write files there; otherwise (a read-only file system, a
// folder of another user, a full disk) a temporary folder of this process's own, said once in a
// warning that names both and the reason, and removed when the plugin is unloaded. Nothing then
// survives the run, but the step still compiles instead of running eagerly.
std::string usable_cache_root(const std::string& root, const plugin::Host& host);

// max-autotune winners: one line per kernel, "<kernel> <variant> <threads>".
bool read_tune(const std::string& path, std::vector<std::pair<int, int>>* winners, size_t kernels);
void write_tune(const std::string& path, const std::vector<std::pair<int, int>>& winners);

// Writes `data` to `path` through a temporary file and a rename.
void write_atomic(const std::string& path, const std::string& data);

}  // namespace kiln::inductor
