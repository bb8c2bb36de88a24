// The pass pipeline, in one place: run a pass, verify, dump, next pass.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <c10/util/StringUtil.h>

#include "kiln/ir_text.h"
#include "kiln/log.h"
#include "kiln/passes.h"

namespace kiln {

std::string debug_dir(const PipelineOptions& options) {
  if (!options.debug_dir.empty()) return options.debug_dir;
  const char* env = std::getenv("KILN_DEBUG_DIR");
  return env ? env : "";
}

void dump_debug_file(const std::string& dir, const std::string& name, const std::string& text) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto path = std::filesystem::path(dir) / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) log_warn(c10::str("KILN_DEBUG_DIR: cannot write ", path.string()));
}

std::vector<PassRecord> run_pipeline(ir::Graph& g, ConstantTensors& constants, const PipelineOptions& options) {
  const std::string dir = debug_dir(options);
  std::vector<PassRecord> records;
  int index = 0;
  dump_debug_file(dir, "00-captured.kir", ir::print(g));
  auto run = [&](const char* name, auto&& pass) {
    PassRecord r;
    r.name = name;
    r.nodes_before = g.nodes.size();
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.nodes_after = g.nodes.size();
    try {
      g.verify();
    } catch (const std::logic_error& e) {
      throw std::logic_error(c10::str("after pass ", name, ": ", e.what()));
    }
    char file[64];
    std::snprintf(file, sizeof file, "%02d-%s.kir", ++index, name);
    dump_debug_file(dir, file, ir::print(g));
    log_debug(c10::str("pass ", name, ": ", r.nodes_before, " -> ", r.nodes_after, " nodes in ", r.ms, " ms"));
    records.push_back(r);
  };
  if (options.functionalize) run("functionalize", [&] { functionalize(g); });
  run("decompose", [&] { decompose(g); });
  run("dce", [&] { eliminate_dead_code(g); });
  run("cse", [&] { eliminate_common_subexpressions(g); });
  run("constant_fold", [&] { fold_constants(g, constants); });
  run("dce_final", [&] { eliminate_dead_code(g); });
  return records;
}

}  // namespace kiln
