// `kiln cache ls|clear [--dir DIR]`: what the backends keep in the compile cache, and emptying it.
// The cache directory is TrainingArguments' cache_dir (default ~/.cache/kiln, KILN_CACHE_DIR wins).
// Each backend keeps its own subfolder (inductor: <dir>/inductor, see docs/backends/inductor.md).
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "commands.h"
#include "kiln/config.h"
#include "kiln/internal/command_line.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

struct Entry {
  uintmax_t bytes = 0;
  bool has_lib = false, has_manifest = false, has_tune = false;
};

}  // namespace

int cmd_cache(int argc, char** argv) {
  std::string action, dir;
  CLI::App app;
  setup_command(app, "kiln cache", "usage: kiln cache ls [--dir DIR]\n       kiln cache clear [--dir DIR]",
                "ls lists each backend's cache entries (key, files, bytes, whether the entry is complete);\n"
                "clear removes every backend folder of the cache.");
  app.add_option("action", action, "ls or clear")->type_name("");
  app.add_option("--dir", dir, "the cache directory (default: KILN_CACHE_DIR, else ~/.cache/kiln)")->type_name("DIR");
  if (auto status = parse_command_line(app, argc, argv, "argument")) return *status;
  if (action.empty()) return usage_error(app, "which action? (ls or clear)");
  if (action != "ls" && action != "clear") {
    const auto near = nearest_name(action, {"ls", "clear"});
    return usage_error(app, "unknown action '" + action + "'" + (near ? "; did you mean '" + *near + "'?" : ""));
  }
  if (dir.empty()) {
    TrainingArguments args;
    args.apply_env();
    dir = args.runtime.cache_dir;
  }
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    std::printf("cache %s: empty (no such directory)\n", dir.c_str());
    return 0;
  }
  if (action == "clear") {
    uintmax_t removed = 0;
    for (const auto& sub : fs::directory_iterator(dir, ec)) {
      if (!sub.is_directory()) continue;
      removed += fs::remove_all(sub.path(), ec);
      if (ec) {
        std::fprintf(stderr, "kiln cache: cannot remove %s: %s\n", sub.path().c_str(), ec.message().c_str());
        return 1;
      }
    }
    std::printf("cache %s: removed %ju files\n", dir.c_str(), removed);
    return 0;
  }
  std::printf("cache %s\n", dir.c_str());
  uintmax_t total = 0;
  size_t count = 0;
  for (const auto& sub : fs::directory_iterator(dir, ec)) {
    if (!sub.is_directory()) continue;
    std::map<std::string, Entry> entries;
    for (const auto& f : fs::directory_iterator(sub.path(), ec)) {
      if (!f.is_regular_file()) continue;
      const std::string name = f.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) continue;  // another process is writing it
      const std::string key = f.path().stem().string();
      Entry& e = entries[key];
      e.bytes += f.file_size(ec);
      const std::string ext = f.path().extension().string();
      e.has_lib |= ext == ".so" || ext == ".cubin";
      e.has_manifest |= ext == ".ok";
      e.has_tune |= ext == ".tune";
    }
    std::printf("  %s/ (%zu entries)\n", sub.path().filename().c_str(), entries.size());
    for (const auto& [key, e] : entries) {
      std::printf(
          "    %s  %10ju bytes  %s%s\n", key.c_str(), e.bytes,
          e.has_lib && e.has_manifest ? "complete" : (e.has_lib ? "no manifest (rebuilt on use)" : "source only"),
          e.has_tune ? ", tuned" : "");
      total += e.bytes;
      ++count;
    }
  }
  std::printf("%zu entries, %ju bytes\n", count, total);
  return 0;
}

}  // namespace kiln::cli
