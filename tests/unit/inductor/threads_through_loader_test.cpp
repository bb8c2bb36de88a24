// The inductor plugin used from several threads through kiln's loader, as a program's threads use
// it, without LibTorch (so that the sanitizer builds of scripts/test run it under ThreadSanitizer
// and AddressSanitizer): threads compile at once (the plugin says compile may run concurrently),
// the same graph and graphs of their own, into one cold compile cache; then threads run the
// executables at once, with fresh inputs each run, and the loader serialises execute as the
// plugin's descriptor asks. Every result is checked against the same arithmetic done here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../loader/graph_builder.h"
#include "run_together.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/plugin_registry.h"

namespace fs = std::filesystem;
using kiln::test::GraphBuilder;

namespace {

std::string fresh_dir() {
  std::string t = (fs::temp_directory_path() / "kiln-inductor-threads-XXXXXX").string();
  if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

// e = -relu(a * b), f = e * e over [n] float32: two outputs, each rounded once per op, so the
// plugin's results equal the same operations done here bit for bit.
struct Graph {
  GraphBuilder g;
  int64_t n;
  explicit Graph(int64_t n_) : n(n_) {
    const int64_t a = g.value({n}), b = g.value({n}), c = g.value({n}), d = g.value({n}), e = g.value({n}),
                  f = g.value({n});
    g.node("aten::mul.Tensor", {GraphBuilder::tensor("self", a), GraphBuilder::tensor("other", b)}, {c});
    g.node("aten::relu", {GraphBuilder::tensor("self", c)}, {d});
    g.node("aten::neg", {GraphBuilder::tensor("self", d)}, {e});
    g.node("aten::mul.Tensor", {GraphBuilder::tensor("self", e), GraphBuilder::tensor("other", e)}, {f});
    g.inputs({a, b});
    g.outputs({e, f});
  }
};

// One run with fresh inputs; "" or what was wrong.
std::string run_once(const kiln::PluginExecutable& exe, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  std::vector<float> a(static_cast<size_t>(n)), b(a.size()), e(a.size(), 7.f), f(a.size(), 7.f);
  for (auto& v : a) v = dist(rng);
  for (auto& v : b) v = dist(rng);
  int64_t shape[] = {n};
  const DLDataType f32{kDLFloat, 32, 1};
  DLTensor in[2] = {{a.data(), {kDLCPU, 0}, 1, f32, shape, nullptr, 0},
                    {b.data(), {kDLCPU, 0}, 1, f32, shape, nullptr, 0}};
  DLTensor out[2] = {{e.data(), {kDLCPU, 0}, 1, f32, shape, nullptr, 0},
                     {f.data(), {kDLCPU, 0}, 1, f32, shape, nullptr, 0}};
  try {
    exe.execute(in, 2, out, 2);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const float c = a[i] * b[i];
    const float want_e = -(c > 0.f ? c : 0.f);
    const float want_f = want_e * want_e;
    if (e[i] != want_e || f[i] != want_f)
      return "element " + std::to_string(i) + " of [" + std::to_string(n) + "]: got " + std::to_string(e[i]) + ", " +
             std::to_string(f[i]) + ", want " + std::to_string(want_e) + ", " + std::to_string(want_f);
  }
  return "";
}

}  // namespace

TEST(InductorThreads, CompileAndExecuteFromSeveralThreadsThroughTheLoader) {
  const std::string dir = fresh_dir();
  auto host = kiln::HostServices::basic(dir, {});
  std::shared_ptr<kiln::LoadedPlugin> plugin;
  try {
    plugin = kiln::PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, host);
  } catch (const std::exception& e) {
    GTEST_SKIP() << "the inductor plugin does not load here: " << e.what();
  }
  ASSERT_TRUE(plugin->concurrent_compile_safe());

  // Four threads compile at once: the same graph (one kernel, compiled by one of them and loaded
  // by the others) and one of their own (a size of their own), from a cold cache.
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<Graph>> graphs;
  graphs.push_back(std::make_unique<Graph>(1000));
  for (int t = 0; t < kThreads; ++t) graphs.push_back(std::make_unique<Graph>(1001 + t));
  // The views are made here, before the threads: making one writes the builder's view.
  std::vector<const KilnGraphView*> views;
  for (auto& g : graphs) views.push_back(g->g.view());
  std::vector<std::unique_ptr<kiln::PluginExecutable>> shared(kThreads), own(kThreads);
  std::vector<std::string> errors(kThreads);
  kiln::test::run_together(kThreads, [&](int t) {
    try {
      shared[static_cast<size_t>(t)] = plugin->compile(*views[0], KILN_MODE_DEFAULT);
      own[static_cast<size_t>(t)] = plugin->compile(*views[static_cast<size_t>(t) + 1], KILN_MODE_DEFAULT);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(t)] = e.what();
    }
  });
  for (int t = 0; t < kThreads; ++t) ASSERT_EQ(errors[static_cast<size_t>(t)], "") << "compile, thread " << t;

  // Then the threads run every executable at once, 25 times each, with fresh inputs: the loader
  // holds execute to one call at a time for this plugin (its descriptor does not promise more).
  EXPECT_FALSE(plugin->concurrent_execution_safe());
  const unsigned seed = std::random_device{}();
  kiln::test::run_together(kThreads, [&](int t) {
    std::mt19937 rng(seed + static_cast<unsigned>(t));
    for (int r = 0; r < 25 && errors[static_cast<size_t>(t)].empty(); ++r) {
      const size_t k = static_cast<size_t>(t + r) % kThreads;
      std::string e = run_once(*shared[k], graphs[0]->n, rng);
      if (e.empty()) e = run_once(*own[k], graphs[k + 1]->n, rng);
      if (!e.empty()) errors[static_cast<size_t>(t)] = "run " + std::to_string(r) + ": " + e;
    }
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[static_cast<size_t>(t)], "") << "execute, thread " << t;

  // The executables outlive nothing they need: freed here, from this thread, after the others ran
  // them.
  shared.clear();
  own.clear();
  plugin.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}
