// `kiln conformance PLUGIN.so [...]`: runs the plugin conformance suite, the kiln_conformance
// program installed next to `kiln` (tests/conformance; docs/conformance.md). It is a program of its
// own so that third parties can run it from an installed kiln, and so that `kiln` does not link
// GoogleTest; this command hands it every argument.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"

namespace kiln::cli {

int cmd_conformance(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path suite = (ec ? fs::path(".") : self.parent_path()) / "kiln_conformance";
  if (!fs::exists(suite)) {
    std::fprintf(stderr,
                 "kiln conformance: the suite is not installed: %s does not exist (build the kiln_conformance "
                 "target, or install kiln with its tests: cmake --install)\n",
                 suite.c_str());
    return 2;
  }
  std::vector<char*> args;
  std::string prog = suite.string();
  args.push_back(prog.data());
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(prog.c_str(), args.data());
  std::fprintf(stderr, "kiln conformance: cannot run %s: %s\n", prog.c_str(), std::strerror(errno));
  return 2;
}

}  // namespace kiln::cli
