// PassRunner: run a pass, verify, dump, next pass.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <c10/util/StringUtil.h>

#include "kiln/internal/ir_text.h"
#include "kiln/log.h"
#include "kiln/internal/passes.h"

namespace kiln {

void dump_debug_file(const std::string& dir, const std::string& name, const std::string& text) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto path = std::filesystem::path(dir) / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) log_warn(c10::str("kiln: [debug] dump_dir: cannot write ", path.string()));
}

PassRunner::PassRunner(ir::Graph& graph, std::string dump_dir) : g_(graph), dir_(std::move(dump_dir)) {
  dump_debug_file(dir_, "00-captured.kir", ir::print(g_));
}

void PassRunner::run(const std::string& name, const std::function<void()>& pass) {
  PassRecord r;
  r.name = name;
  r.nodes_before = g_.nodes.size();
  const auto t0 = std::chrono::steady_clock::now();
  pass();
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.nodes_after = g_.nodes.size();
  try {
    g_.verify();
  } catch (const std::logic_error& e) {
    throw std::logic_error(c10::str("after pass ", name, ": ", e.what()));
  }
  if (!dir_.empty()) {
    char file[96];
    std::snprintf(file, sizeof file, "%02d-%s.kir", ++index_, name.c_str());
    dump_debug_file(dir_, file, ir::print(g_));
  }
  log_debug(c10::str("pass ", name, ": ", r.nodes_before, " -> ", r.nodes_after, " nodes in ", r.ms, " ms"));
  records_.push_back(r);
}

void PassRunner::dump(const std::string& name, const std::string& text) {
  if (dir_.empty()) return;
  char file[96];
  std::snprintf(file, sizeof file, "%02d-%s", ++index_, name.c_str());
  dump_debug_file(dir_, file, text);
}

void run_graph_passes(PassRunner& runner, ir::Graph& g, ConstantTensors& constants, bool functionalize_first) {
  if (functionalize_first) runner.run("functionalize", [&] { functionalize(g); });
  runner.run("decompose", [&] { decompose(g); });
  runner.run("dce", [&] { eliminate_dead_code(g); });
  runner.run("cse", [&] { eliminate_common_subexpressions(g); });
  runner.run("constant_fold", [&] { fold_constants(g, constants); });
  runner.run("dce_final", [&] { eliminate_dead_code(g); });
}

std::vector<PassRecord> run_pipeline(ir::Graph& g, ConstantTensors& constants, const PipelineOptions& options) {
  PassRunner runner(g, options.debug_dir);
  run_graph_passes(runner, g, constants, options.functionalize);
  return runner.records();
}

}  // namespace kiln
