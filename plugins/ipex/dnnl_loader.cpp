#include "dnnl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

// For each oneDNN function: a pointer, and a global function of the same name in this library
// (hidden: the version script exports only kiln_plugin_init) that jumps through it. The jump
// keeps every argument register and the stack as the caller left them, so no signature is needed.
#define KILN_DNNL_FUNCTION(name)                                             \
  extern "C" {                                                               \
  __attribute__((visibility("hidden"))) void* kiln_ipex_fn_##name = nullptr; \
  }                                                                          \
  asm(".pushsection .text\n"                                                 \
      ".globl " #name                                                        \
      "\n"                                                                   \
      ".hidden " #name                                                       \
      "\n"                                                                   \
      ".type " #name ", @function\n" #name                                   \
      ":\n"                                                                  \
      "  jmp *kiln_ipex_fn_" #name                                           \
      "(%rip)\n"                                                             \
      ".size " #name ", .-" #name                                            \
      "\n"                                                                   \
      ".popsection\n");
#include "dnnl_symbols.inc"
#undef KILN_DNNL_FUNCTION

namespace kiln::ipex {

namespace {

struct Function {
  const char* name;
  void** slot;
};

const std::vector<Function>& functions() {
#define KILN_DNNL_FUNCTION(name) {#name, &kiln_ipex_fn_##name},
  static const std::vector<Function> all = {
#include "dnnl_symbols.inc"
  };
#undef KILN_DNNL_FUNCTION
  return all;
}

// Loads `path` and checks it; "" when it is usable, else why not.
std::string try_load(const std::string& path, DnnlLibrary& lib) {
  lib.path = path;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    return e ? e : "dlopen failed";
  }
  using VersionFn = const dnnl_version_t* (*)();
  auto version = reinterpret_cast<VersionFn>(dlsym(handle, "dnnl_version"));
  if (!version) return path + " has no dnnl_version: not oneDNN 3.x";
  const dnnl_version_t* v = version();
  lib.version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  if (v->major != 3 || v->minor < 2)
    return path + " is oneDNN " + lib.version + "; the ipex backend needs 3.2 or a later 3.x";
  if (v->cpu_runtime != DNNL_RUNTIME_OMP)
    return path + " is oneDNN " + lib.version + " with CPU runtime " + std::to_string(v->cpu_runtime) +
           ", not OpenMP (" + std::to_string(DNNL_RUNTIME_OMP) + "): install the onednn-cpu-gomp build (scripts/setup)";
  std::string missing;
  for (const Function& f : functions()) {
    void* p = dlsym(handle, f.name);
    if (!p) missing += std::string(missing.empty() ? "" : ", ") + f.name;
    *f.slot = p;
  }
  // The handle is kept: the trampolines point into it for the life of the process.
  if (!missing.empty()) return path + " (oneDNN " + lib.version + ") lacks " + missing;
  return "";
}

}  // namespace

const DnnlLibrary& dnnl_library() {
  static DnnlLibrary lib;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KILN_IPEX_ONEDNN"); env && *env) {
      candidates.emplace_back(env);  // named: the only one tried
    } else {
#ifdef KILN_IPEX_ONEDNN_LIBRARY
      candidates.emplace_back(KILN_IPEX_ONEDNN_LIBRARY);
#endif
      candidates.emplace_back("libdnnl.so.3");
    }
    std::string why;
    for (const std::string& c : candidates) {
      const std::string e = try_load(c, lib);
      if (e.empty()) {
        lib.loaded = true;
        lib.error.clear();
        return;
      }
      why += (why.empty() ? "" : "; ") + e;
    }
    lib.error = "oneDNN cannot be loaded: " + why;
  });
  return lib;
}

}  // namespace kiln::ipex
