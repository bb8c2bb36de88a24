// Use cases: what a long training run does to a plugin. The same graph compiled and run over and
// over, groups compiled and executables used from several threads (concurrently only when the
// descriptor says that is safe), and executables that outlive the graph view they were compiled
// from.
#include <algorithm>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "harness.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

// A compiled group with what it reads and its reference outputs for one set of inputs.
struct Compiled {
  const SampleGraph* sample = nullptr;
  PartitionGroup group;
  std::unique_ptr<PluginExecutable> exe;
};

std::vector<SampleGraph> use_graphs() {
  auto s = sample_graphs();
  for (const auto& v : op_catalogue("UnaryPointwise")) {
    if (s.size() > 6) break;
    s.push_back({v.label(), build_graph(v, make_inputs(v, case_device())), make_inputs(v, case_device())});
  }
  return s;
}

std::vector<Compiled> compile_all(const std::vector<SampleGraph>& graphs, int copies) {
  auto p = loaded_plugin();
  std::vector<Compiled> out;
  for (const auto& s : graphs) {
    std::vector<int64_t> claims;
    {
      GraphView v(s.graph);
      claims = p->claim(v.view());
    }
    for (const auto& pg : groups_of(s.graph, claims)) {
      for (int c = 0; c < copies; ++c) {
        GraphView sub(s.graph, pg.nodes, pg.inputs, pg.outputs);
        progress("compile a group of " + std::to_string(pg.nodes.size()) + " nodes of " + s.label);
        try {
          Compiled x;
          x.sample = &s;
          x.group = pg;
          x.exe = p->compile(sub.view(), KILN_MODE_DEFAULT);
          out.push_back(std::move(x));
        } catch (const PluginError& e) {
          if (e.code() != KILN_ERROR_UNIMPLEMENTED) ADD_FAILURE() << s.label << ": " << e.what();
        }
      }
    }
  }
  return out;
}

// Runs `c` on fresh inputs; returns "" or what went wrong.
std::string run_once(const Compiled& c) {
  std::vector<at::Tensor> inputs;
  for (const auto& t : c.sample->inputs) {
    at::Tensor fresh = at::empty_like(t);
    if (at::isFloatingType(t.scalar_type())) fresh.normal_();
    else fresh.copy_(t);  // indices keep their valid range
    inputs.push_back(fresh);
  }
  const auto env = eager_env(c.sample->graph, inputs);
  std::vector<DLTensor> in, out;
  std::vector<at::Tensor> outs;
  for (auto v : c.group.inputs) in.push_back(to_dl_tensor(env[v]));
  for (auto v : c.group.outputs) outs.push_back(poisoned(c.sample->graph.value(v).meta));
  for (auto& t : outs) out.push_back(to_dl_tensor(t));
  try {
    c.exe->execute(in.data(), in.size(), out.data(), out.size());
  } catch (const PluginError& e) {
    return c.sample->label + ": " + e.what();
  }
  if (case_device().is_cuda()) torch::cuda::synchronize();
  for (size_t k = 0; k < outs.size(); ++k) {
    // These cases check that repeated, concurrent and late executions stay right; the numeric
    // cases check precision. Their graphs end in a full sum of random-signed terms, whose relative
    // error grows with cancellation (a backend that sums in another order, or in double, differs by
    // ~1e-6 of the terms' magnitude): so a looser floor than the numeric cases' 1e-5.
    const double tol = std::max(tolerance(outs[k].scalar_type(), true), 1e-4);
    const double err = rel_err(outs[k], env[c.group.outputs[k]]);
    if (err <= tol) continue;
    // A sum that nearly cancels: measured against the magnitude of its terms instead, the graph
    // evaluated in float64 on the inputs' absolute values (every op of these graphs is monotone
    // there, so that is the sum of the terms' magnitudes).
    std::vector<at::Tensor> magnitudes;
    for (const auto& t : inputs)
      magnitudes.push_back(at::isFloatingType(t.scalar_type()) ? t.abs().to(at::kDouble) : t);
    const auto mag_env = eager_env(c.sample->graph, magnitudes);
    const at::Tensor mag = mag_env[c.group.outputs[k]];
    const double abs_err =
        (outs[k].to(at::kDouble) - env[c.group.outputs[k]].to(at::kDouble)).abs().max().item<double>();
    const double scale = mag.defined() && mag.numel() > 0 ? mag.abs().max().item<double>() : 0.0;
    if (!(abs_err <= tol * scale))
      return c.sample->label + ": output " + std::to_string(k) + " relative error " + std::to_string(err) +
             " (absolute " + std::to_string(abs_err) + " against terms of magnitude " + std::to_string(scale) + ")";
  }
  return "";
}

TEST(Use, RepeatedCompileAndExecute) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const auto graphs = use_graphs();
  auto compiled = compile_all(graphs, 3);
  if (compiled.empty()) GTEST_SKIP() << "the plugin compiled none of the " << graphs.size() << " use graphs";
  for (int round = 0; round < 5; ++round)
    for (const auto& c : compiled) {
      progress("round " + std::to_string(round) + ": " + c.sample->label);
      const std::string e = run_once(c);
      EXPECT_TRUE(e.empty()) << "round " << round << ": " << e;
    }
  note(std::to_string(compiled.size()) + " executables (3 compiles of each group), 5 runs each with fresh inputs");
}

TEST(Use, ExecuteFromSeveralThreads) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const auto graphs = use_graphs();
  auto compiled = compile_all(graphs, 2);
  if (compiled.empty()) GTEST_SKIP() << "the plugin compiled none of the " << graphs.size() << " use graphs";
  const bool concurrent = loaded_plugin()->concurrent_execution_safe();
  // kiln's loader serialises execute for plugins that are not concurrent-safe; the raw calls here
  // do the same with a lock, so that only what the descriptor promises is tested.
  std::mutex serial;
  std::mutex failures_mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  constexpr int kThreads = 4, kRuns = 10;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        const Compiled& c = compiled[static_cast<size_t>(t + r) % compiled.size()];
        std::string e;
        if (concurrent) {
          e = run_once(c);
        } else {
          std::lock_guard<std::mutex> lock(serial);
          e = run_once(c);
        }
        if (!e.empty()) {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back("thread " + std::to_string(t) + ": " + e);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
  note(std::to_string(kThreads) + " threads x " + std::to_string(kRuns) + " runs over " +
       std::to_string(compiled.size()) + " executables, " +
       (concurrent ? "concurrently (descriptor: concurrent-safe)" : "one at a time (descriptor: not concurrent-safe)"));
}

// A plugin whose descriptor says compile may run from several threads at once
// (KILN_CAPABILITY_CONCURRENT_COMPILE) gets a step's groups compiled in parallel by kiln: here every
// claimed group of the use graphs, twice over (so the same group compiles on two threads at once,
// as a model's identical layers do), from four threads, and then every executable runs right.
TEST(Use, CompileFromSeveralThreads) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto p = loaded_plugin();
  if (!p->concurrent_compile_safe())
    GTEST_SKIP() << "descriptor: compile is not concurrent-safe (kiln compiles the plugin's groups one at a time)";
  const auto graphs = use_graphs();
  struct Job {
    const SampleGraph* sample;
    PartitionGroup group;
  };
  std::vector<Job> jobs;
  for (const auto& s : graphs) {
    GraphView v(s.graph);
    for (const auto& pg : groups_of(s.graph, p->claim(v.view())))
      for (int copy = 0; copy < 2; ++copy) jobs.push_back({&s, pg});
  }
  if (jobs.empty()) GTEST_SKIP() << "the plugin claimed nothing of the " << graphs.size() << " use graphs";
  std::vector<Compiled> compiled(jobs.size());
  std::vector<std::string> errors(jobs.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  constexpr int kThreads = 4;
  progress("compile " + std::to_string(jobs.size()) + " groups from " + std::to_string(kThreads) + " threads");
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        GraphView sub(jobs[i].sample->graph, jobs[i].group.nodes, jobs[i].group.inputs, jobs[i].group.outputs);
        try {
          compiled[i].sample = jobs[i].sample;
          compiled[i].group = jobs[i].group;
          compiled[i].exe = p->compile(sub.view(), KILN_MODE_DEFAULT);
        } catch (const PluginError& e) {
          if (e.code() != KILN_ERROR_UNIMPLEMENTED) errors[i] = jobs[i].sample->label + ": " + e.what();
        }
      }
    });
  for (auto& th : threads) th.join();
  size_t ran = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!errors[i].empty()) ADD_FAILURE() << "compiled on several threads at once: " << errors[i];
    if (!compiled[i].exe) continue;
    const std::string e = run_once(compiled[i]);
    EXPECT_TRUE(e.empty()) << "compiled on several threads at once: " << e;
    ++ran;
  }
  note(std::to_string(jobs.size()) + " compiles (each group twice) from " + std::to_string(kThreads) +
       " threads at once; " + std::to_string(ran) + " executables run right");
}

TEST(Use, ExecutablesOutliveTheirGraphView) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  const auto graphs = use_graphs();
  struct Live {
    const SampleGraph* s;
    PartitionGroup g;
    KilnExecutable* exe;
  };
  std::vector<Live> live;
  for (const auto& s : graphs) {
    std::vector<int64_t> claims;
    GraphView full(s.graph);
    if (!ctx.claim(&full.view(), &claims).ok) continue;
    for (const auto& pg : groups_of(s.graph, claims)) {
      GraphView sub(s.graph, pg.nodes, pg.inputs, pg.outputs);
      Arena arena;  // the view lives here; unmapped right after compile returns
      KilnExecutable* exe = nullptr;
      progress("compile " + s.label);
      auto st = ctx.compile(copy_view(sub.view(), arena, StructLayout::Exact), KILN_MODE_DEFAULT, {}, &exe);
      arena.release();
      if (st.ok && exe) live.push_back({&s, pg, exe});
    }
  }
  if (live.empty()) GTEST_SKIP() << "the plugin compiled none of the " << graphs.size() << " use graphs";
  // Destroy every other executable first: the rest must not depend on them.
  std::vector<Live> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 1) ctx.destroy(live[i].exe);
    else kept.push_back(live[i]);
  }
  for (const auto& l : kept) {
    const auto env = eager_env(l.s->graph, l.s->inputs);
    std::vector<DLTensor> in, out;
    std::vector<at::Tensor> outs;
    for (auto v : l.g.inputs) in.push_back(to_dl_tensor(env[v]));
    for (auto v : l.g.outputs) outs.push_back(poisoned(l.s->graph.value(v).meta));
    for (auto& t : outs) out.push_back(to_dl_tensor(t));
    progress("execute " + l.s->label + " after its view was unmapped");
    auto st = ctx.execute(l.exe, in, out);
    EXPECT_TRUE(st.ok) << l.s->label << ": " << st.message;
    if (case_device().is_cuda()) torch::cuda::synchronize();
    for (size_t k = 0; st.ok && k < outs.size(); ++k)
      EXPECT_LE(rel_err(outs[k], env[l.g.outputs[k]]), tolerance(outs[k].scalar_type(), true))
          << l.s->label << ": output " << k;
    ctx.destroy(l.exe);
  }
  note(std::to_string(live.size()) +
       " executables compiled from views that were unmapped at once; half destroyed first, the rest ran right");
}

}  // namespace
}  // namespace kiln::conformance
