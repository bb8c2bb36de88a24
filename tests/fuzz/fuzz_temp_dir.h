// A folder of the fuzz target's own for the files its inputs become, made on first use and removed
// at exit. Header-only: each target is one translation unit built by clang (tests/fuzz/CMakeLists.txt).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace kiln::fuzz {

// `<the folder>/<what>`; the folder is /tmp/kiln-fuzz-<name>-XXXXXX.
inline std::string temp_path(const char* name, const char* what) {
  static std::string dir;
  if (dir.empty()) {
    std::string pattern = std::string("/tmp/kiln-fuzz-") + name + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    dir = pattern;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
  }
  return dir + "/" + what;
}

}  // namespace kiln::fuzz
