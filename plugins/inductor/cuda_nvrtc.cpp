#include "cuda_nvrtc.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <set>
#include <type_traits>

#include <kiln/plugin_api.hpp>

namespace kiln::inductor {

using plugin::Error;

namespace {

// NVRTC's C API, as nvrtc.h declares it (nvrtcResult is an enum, NVRTC_SUCCESS = 0).
using nvrtcResult = int;
using nvrtcProgram = struct nvrtc_program_st*;

std::atomic<uint64_t> g_compiles{0};

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string dirname_of(const std::string& p) {
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

const char* const kSonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

// Directories of the CUDA libraries this process has loaded, where a libnvrtc of the same install
// usually sits: the torch wheel keeps libcudart, libnvrtc and the rest in nvidia/cu13/lib
// (nvidia/cuda_nvrtc/lib in the CUDA 12 wheels), which libtorch_cuda.so finds through its RPATH.
std::vector<std::string> dirs_of_loaded_cuda_libraries() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name)
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        return 0;
      },
      &names);
  std::vector<std::string> dirs;
  auto add = [&](const std::string& d) {
    if (is_dir(d) && std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  };
  for (const auto& n : names) {
    const std::string base = n.substr(n.rfind('/') + 1);
    const std::string dir = dirname_of(n);
    if (base.rfind("libcudart.so", 0) == 0 || base.rfind("libcublas.so", 0) == 0) add(dir);
    if (base.rfind("libtorch_cuda.so", 0) == 0 || base.rfind("libc10_cuda.so", 0) == 0) {
      add(dir + "/../../nvidia/cu13/lib");
      add(dir + "/../../nvidia/cuda_nvrtc/lib");
      add(dir);
    }
  }
  return dirs;
}

}  // namespace

struct Nvrtc::Fns {
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*GetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*GetSupportedArchs)(int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
};

std::shared_ptr<Nvrtc> Nvrtc::load(const std::string& path) {
  // (what to dlopen, where it came from)
  std::vector<std::pair<std::string, std::string>> tries;
  if (!path.empty()) {
    if (is_dir(path)) {
      for (const char* so : kSonames) tries.push_back({path + "/" + so, "the nvrtc option's directory"});
    } else {
      tries.push_back({path, "the nvrtc option"});
    }
  } else {
    for (const char* so : kSonames) {
      // Already in the process (LibTorch loads it for its own fused kernels): the same copy.
      if (void* h = dlopen(so, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD)) {
        tries.push_back({so, "already loaded"});
        dlclose(h);
      }
    }
    for (const auto& dir : dirs_of_loaded_cuda_libraries())
      for (const char* so : kSonames)
        if (is_file(dir + "/" + so)) tries.push_back({dir + "/" + so, "beside a loaded CUDA library"});
    for (const char* so : kSonames) tries.push_back({so, "the loader's search"});
    for (const char* so : kSonames) tries.push_back({std::string("/usr/local/cuda/lib64/") + so, "the system CUDA"});
  }
  std::string failures;
  std::set<std::string> seen;
  for (const auto& [what, where] : tries) {
    if (!seen.insert(what).second) continue;
    // RTLD_NODELETE: once in the process, NVRTC stays. Unloading and loading it again (a plugin
    // unloaded and loaded again, as hosts and the conformance suite do) makes it set itself up
    // anew each time, and what its set-up allocates is never given back.
    void* h = dlopen(what.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
      const char* e = dlerror();
      failures += "\n  " + what + " (" + where + "): " + (e ? e : "not loadable");
      continue;
    }
    std::shared_ptr<Nvrtc> n(new Nvrtc);
    n->handle_ = h;
    n->fn_ = std::make_unique<Fns>();
    std::string missing;
    auto sym = [&](auto& fp, const char* name) {
      fp = reinterpret_cast<std::remove_reference_t<decltype(fp)>>(dlsym(h, name));
      if (!fp) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    Fns& f = *n->fn_;
    sym(f.GetErrorString, "nvrtcGetErrorString");
    sym(f.Version, "nvrtcVersion");
    sym(f.GetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    sym(f.GetSupportedArchs, "nvrtcGetSupportedArchs");
    sym(f.CreateProgram, "nvrtcCreateProgram");
    sym(f.DestroyProgram, "nvrtcDestroyProgram");
    sym(f.CompileProgram, "nvrtcCompileProgram");
    sym(f.GetProgramLogSize, "nvrtcGetProgramLogSize");
    sym(f.GetProgramLog, "nvrtcGetProgramLog");
    sym(f.GetCUBINSize, "nvrtcGetCUBINSize");
    sym(f.GetCUBIN, "nvrtcGetCUBIN");
    if (!missing.empty()) {
      failures += "\n  " + what + " (" + where + "): no " + missing + " (NVRTC older than 11.2?)";
      continue;  // ~Nvrtc closes it
    }
    // Where it really is, for messages and the cache key.
    n->path_ = what;
    if (link_map* lm = nullptr; dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
      n->path_ = lm->l_name;
    if (f.Version(&n->major_, &n->minor_) != 0) {
      failures += "\n  " + what + " (" + where + "): nvrtcVersion failed";
      continue;
    }
    int count = 0;
    if (f.GetNumSupportedArchs(&count) == 0 && count > 0) {
      n->archs_.resize(static_cast<size_t>(count));
      if (f.GetSupportedArchs(n->archs_.data()) != 0) n->archs_.clear();
      std::sort(n->archs_.begin(), n->archs_.end());
    }
    return n;
  }
  throw Error(KILN_ERROR_UNAVAILABLE, "no usable NVRTC library (libnvrtc); tried:" + failures +
                                          "\n(set [plugin.inductor] nvrtc to the library or its directory)");
}

Nvrtc::~Nvrtc() {
  if (handle_) dlclose(handle_);
}

bool Nvrtc::supports(int arch) const { return std::find(archs_.begin(), archs_.end(), arch) != archs_.end(); }

std::vector<std::string> Nvrtc::base_options(int arch) {
  // ATen's kernels are built by nvcc with its defaults: IEEE division and square root, denormals
  // kept, contractions into FMA allowed. NVRTC's defaults are the same; they are spelled out so
  // that they are part of the cache key.
  return {"--gpu-architecture=sm_" + std::to_string(arch),
          "--std=c++17",
          "--fmad=true",
          "--prec-div=true",
          "--prec-sqrt=true",
          "--ftz=false"};
}

uint64_t Nvrtc::compiles() { return g_compiles.load(); }

std::string Nvrtc::compile(const std::string& source, int arch, const std::string& name,
                           const std::vector<std::string>& options) const {
  const Fns& f = *fn_;
  auto err = [&](nvrtcResult r) {
    const char* s = f.GetErrorString ? f.GetErrorString(r) : nullptr;
    return std::string(s ? s : "NVRTC error") + " (" + std::to_string(r) + ")";
  };
  if (!supports(arch))
    throw Error(KILN_ERROR_UNAVAILABLE,
                "NVRTC " + version() + " (" + path_ + ") cannot compile for sm_" + std::to_string(arch));
  nvrtcProgram prog = nullptr;
  if (nvrtcResult r = f.CreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr); r != 0)
    throw Error(KILN_ERROR_INTERNAL, "nvrtcCreateProgram failed for " + name + ": " + err(r));
  struct Destroy {
    const Fns& f;
    nvrtcProgram& p;
    ~Destroy() { f.DestroyProgram(&p); }
  } destroy{f, prog};
  std::vector<std::string> all = base_options(arch);
  all.insert(all.end(), options.begin(), options.end());
  std::vector<const char*> argv;
  for (const auto& o : all) argv.push_back(o.c_str());
  const nvrtcResult rc = f.CompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  ++g_compiles;
  std::string log;
  size_t log_size = 0;
  if (f.GetProgramLogSize(prog, &log_size) == 0 && log_size > 1) {
    log.resize(log_size);
    if (f.GetProgramLog(prog, &log[0]) != 0) log.clear();
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  if (rc != 0) {
    if (log.size() > 8000) log = log.substr(0, 8000) + "\n[... truncated]";
    throw Error(KILN_ERROR_INTERNAL, "NVRTC " + version() + " failed to compile " + name + " for sm_" +
                                         std::to_string(arch) + ": " + err(rc) + "\n" + log);
  }
  size_t size = 0;
  if (nvrtcResult r = f.GetCUBINSize(prog, &size); r != 0 || size == 0)
    throw Error(KILN_ERROR_INTERNAL, "NVRTC produced no cubin for " + name + ": " + (r ? err(r) : "empty"));
  std::string cubin(size, '\0');
  if (nvrtcResult r = f.GetCUBIN(prog, &cubin[0]); r != 0)
    throw Error(KILN_ERROR_INTERNAL, "nvrtcGetCUBIN failed for " + name + ": " + err(r));
  return cubin;
}

}  // namespace kiln::inductor
