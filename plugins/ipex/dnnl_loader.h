// oneDNN at run time. The plugin is compiled against oneDNN's headers but does not link
// libdnnl.so.3: every oneDNN C function it calls is a small trampoline here that jumps through a
// pointer filled by dlsym once the library is loaded. So the plugin always loads, and `available`
// can say why oneDNN does not (missing file, wrong version, wrong runtime) instead of kiln only
// seeing a dlopen failure. The library is loaded with RTLD_LOCAL (its symbols stay out of the
// process's global scope, so LibTorch's own bundled oneDNN, whose symbols are hidden anyway, and
// ours never meet) and stays loaded for the life of the process.
#pragma once

#include <string>

namespace kiln::ipex {

struct DnnlLibrary {
  bool loaded = false;
  std::string path;     // the file that was loaded (or the last one tried)
  std::string version;  // "3.2.0"
  std::string error;    // why it is not loaded: every candidate and what went wrong
};

// Loads oneDNN once per process (thread-safe) and resolves every function the plugin uses.
// Candidates, first that loads: the library CMake found at build time, then libdnnl.so.3 from the
// loader's search path; $KILN_IPEX_ONEDNN (a file) replaces both. Needs oneDNN 3.2+ with a CPU OpenMP runtime.
const DnnlLibrary& dnnl_library();

}  // namespace kiln::ipex
