// Whole training steps: the reference workloads (mlp, cnn, gpt) compiled by kiln with the plugin
// under test as the backend, against LibTorch eager from the same weights and batch: the loss of
// every step, then every parameter, gradient and buffer; and that the plugin's own code ran: a
// step whose every claimed group fell back to eager matches eager trivially, and a plugin that
// runs nothing of any reference step passes every other case while doing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include "harness.h"
#include "kiln/compile.h"
#include "kiln/workloads.h"

namespace kiln::conformance {
namespace {

// The plugin groups of a compiled step by what became of them.
struct WorkloadGroups {
  size_t total = 0, compiled = 0, declined = 0, failed = 0;
  size_t nodes_compiled = 0, nodes_declined = 0;
  std::string first_decline, first_failure;  // "3 nodes from aten::relu: <the plugin's error>"
};

WorkloadGroups count_groups(const std::vector<GroupOutcome>& outcomes) {
  WorkloadGroups c;
  for (const auto& o : outcomes) {
    ++c.total;
    const std::string which =
        std::to_string(o.nodes) + (o.nodes == 1 ? " node from " : " nodes from ") + o.first_op + ": " + o.reason;
    if (o.compiled) {
      ++c.compiled;
      c.nodes_compiled += o.nodes;
    } else if (o.declined) {
      ++c.declined;
      c.nodes_declined += o.nodes;
      if (c.first_decline.empty()) c.first_decline = which;
    } else {
      ++c.failed;
      if (c.first_failure.empty()) c.first_failure = which;
    }
  }
  return c;
}

// The batch each reference workload runs with here: small, so that a case costs seconds.
int64_t case_batch(const std::string& name) { return name == "mlp" ? 16 : name == "cnn" ? 4 : 2; }

// What kiln compiles a workload's step with: the plugin under test as the backend, found in its
// own folder, with the suite's cache and the plugin's options.
TrainingArguments workload_args() {
  TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = loaded_plugin()->name();
  args.runtime.plugin_dirs = {std::filesystem::path(settings().plugin_path).parent_path().string()};
  args.runtime.cache_dir = torch_host()->cache_dir();
  args.plugin_options = host_args().plugin_options;
  return args;
}

// Device graphs of the step that the plugin's own code recorded: kiln records the whole step with
// the chosen backend when it asks for that (KILN_CAPABILITY_WHOLE_STEP_GRAPH) and can record
// (KILN_CAPABILITY_DEVICE_GRAPHS), as the cudagraphs backend does without claiming any node.
// LibTorch's float32 convolutions on CUDA run in TF32 by default (cuDNN's allow_tf32), so eager is
// a TF32 reference there; this turns TF32 off (cuDNN and cuBLAS) for a full-float32 eager run.
struct FullFloat32 {
  FullFloat32() {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~FullFloat32() {
    at::globalContext().setAllowTF32CuDNN(cudnn);
    at::globalContext().setAllowTF32CuBLAS(cublas);
  }
  const bool cudnn = at::globalContext().allowTF32CuDNN(), cublas = at::globalContext().allowTF32CuBLAS();
};

int graphs_recorded_by_plugin(const CompiledStep& step) {
  return loaded_plugin()->provides_device_graphs() ? step.stats().graphs_recorded : 0;
}

void check_workload(const std::string& name) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto plugin = loaded_plugin();
  const int64_t batch = case_batch(name);
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const std::string dev = settings().device;
  auto ref = make_workload(name, {dev, seed, batch});
  auto w = make_workload(name, {dev, seed, batch});
  // The trajectory's own conditioning: LibTorch eager again, from weights perturbed by one unit in
  // the last place. cnn (batch norm over a small batch, ReLU boundaries) can turn last-bit
  // differences into 1e-3 within five steps; there a correct plugin is judged against that noise
  // floor (ten times it) rather than the fixed tolerance, which still holds wherever the
  // trajectory is well-conditioned.
  auto noisy = make_workload(name, {dev, seed, batch});
  {
    at::NoGradGuard no_grad;
    for (auto& p : noisy.model->parameters())
      if (at::isFloatingType(p.scalar_type())) p.mul_(1 + std::ldexp(1.0, -23) * (2 * at::rand_like(p) - 1));
  }

  // Where eager's float32 is TF32 (convolutions on CUDA), a plugin computing them in full float32
  // (XLA at HIGHEST precision) is as right as one computing them in TF32 (ATen's kernels): eager
  // again in full float32 gives that spread, allowed ten times as the one-ulp floor is.
  const bool tf32 = dev == "cuda" && !ref.autocast_bf16 &&
                    (at::globalContext().allowTF32CuDNN() || at::globalContext().allowTF32CuBLAS());
  auto full = make_workload(name, {dev, seed, batch});

  progress("compile_step for " + name + " with backend " + plugin->name());
  auto ref_step = workload_step(ref);
  auto noisy_step = workload_step(noisy);
  auto full_step = workload_step(full);
  auto step = compile_step(workload_step(w), {{w.model}, {w.optimizer.get()}}, workload_args());
  EXPECT_EQ(step.backend(), plugin->name())
      << "kiln chose another backend: " << (step.backend_reasons().empty() ? "" : step.backend_reasons().back());

  // Tolerances for whole steps: a few steps of a fusing backend reorder float sums; bf16 autocast
  // (gpt on CUDA) and TF32 matmuls on CUDA are looser.
  const double tol = w.autocast_bf16 ? 2e-2 : dev == "cuda" ? 2e-3 : 1e-4;
  const int steps = settings().workload_steps + 2;  // the first runs eagerly, the second captures
  for (int s = 0; s < steps; ++s) {
    progress(name + " step " + std::to_string(s + 1) + " of " + std::to_string(steps));
    auto want = ref_step({ref.input, ref.target})[0];
    auto floor = noisy_step({noisy.input, noisy.target})[0];
    double spread = rel_err(floor, want);
    if (tf32) {
      FullFloat32 no_tf32;
      spread = std::max(spread, rel_err(full_step({full.input, full.target})[0], want));
    }
    auto got = step({w.input, w.target})[0];
    ASSERT_TRUE(got.defined()) << "step " << s << " returned no loss";
    const double err = rel_err(got, want);
    EXPECT_LE(err, std::max(tol, 10 * spread))
        << name << " loss at step " << s + 1 << ": " << got.item<double>() << " vs eager " << want.item<double>();
  }
  EXPECT_EQ(step.stats().compiled_steps, steps - 2) << "steps ran eagerly instead: " << step.stats().last_fallback;
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters(), pn = noisy.model->named_parameters(),
       pf = full.model->named_parameters();
  ASSERT_EQ(pr.size(), pw.size());
  // Eager's spread for one tensor: from weights one ulp away, and in full float32 where eager is TF32.
  auto spread_of = [&](const at::Tensor& noisy_t, const at::Tensor& full_t, const at::Tensor& ref_t) {
    double e = noisy_t.defined() ? rel_err(noisy_t, ref_t) : 0.0;
    if (tf32 && full_t.defined()) e = std::max(e, rel_err(full_t, ref_t));
    return e;
  };
  const std::string spread_what = tf32 ? "eager from weights one ulp away, or in full float32 instead of TF32: "
                                       : "eager from weights one ulp away: ";
  for (size_t i = 0; i < pr.size(); ++i) {
    const double floor = spread_of(pn[i].value(), pf[i].value(), pr[i].value());
    EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), std::max(tol, 10 * floor))
        << name << " parameter " << pr[i].key() << " (" << spread_what << floor << ")";
    if (pr[i].value().grad().defined()) {
      const double gfloor = spread_of(pn[i].value().grad(), pf[i].value().grad(), pr[i].value().grad());
      EXPECT_LE(rel_err(pw[i].value().grad(), pr[i].value().grad()), std::max(tol * 10, 10 * gfloor))
          << name << " gradient " << pr[i].key() << " (" << spread_what << gfloor << ")";
    }
  }
  auto br = ref.model->named_buffers(), bw = w.model->named_buffers(), bn = noisy.model->named_buffers(),
       bf = full.model->named_buffers();
  for (size_t i = 0; i < br.size() && i < bw.size(); ++i) {
    const double floor = spread_of(i < bn.size() ? bn[i].value() : at::Tensor(),
                                   i < bf.size() ? bf[i].value() : at::Tensor(), br[i].value());
    EXPECT_LE(rel_err(bw[i].value(), br[i].value()), std::max(tol, 10 * floor)) << name << " buffer " << br[i].key();
  }

  // What of the step the plugin's own code ran: the groups of the compiled plan as kiln compiled
  // them. Matching numbers prove nothing of a group that ran on kiln's eager executor. Declining a
  // group (KILN_ERROR_UNIMPLEMENTED) is allowed, declining every one is not: then none of the
  // plugin's code ran. Any other compile error is a plugin failure that kiln hid by running the
  // group eagerly.
  const ir::Graph* g = step.compiled_graph();
  ASSERT_NE(g, nullptr) << "no compiled graph";
  const WorkloadGroups groups = count_groups(step.stats().groups);
  const int graphs = graphs_recorded_by_plugin(step);
  const std::string what = plugin->name() + " runs " + std::to_string(groups.nodes_compiled) + " of " +
                           std::to_string(g->nodes.size()) + " nodes of the " + name + " step in " +
                           std::to_string(groups.compiled) + " of " + std::to_string(groups.total) + " groups" +
                           (graphs ? " and records the step as " + std::to_string(graphs) + " device graph(s)" : "");
  const std::string declines = groups.declined == 0 ? ""
                                                    : "; declines " + std::to_string(groups.declined) + " (" +
                                                          std::to_string(groups.nodes_declined) +
                                                          " nodes), first: " + groups.first_decline;
  EXPECT_EQ(groups.failed, 0u) << groups.failed << " of " << groups.total
                               << " claimed groups failed to compile and ran eagerly (decline with "
                                  "KILN_ERROR_UNIMPLEMENTED instead); first: "
                               << groups.first_failure;
  if (groups.total == 0 && graphs == 0 && !::testing::Test::HasFailure())
    GTEST_SKIP() << plugin->name() << " claims none of the " << g->nodes.size() << " nodes of the " << name
                 << " step: nothing of the plugin ran; the step matched eager over " << steps << " steps";
  if (groups.total > 0 && groups.failed == 0) {
    EXPECT_GT(groups.compiled, 0u) << plugin->name() << " declined all " << groups.declined
                                   << " groups it claimed of the " << name
                                   << " step: none of its code ran; first: " << groups.first_decline;
  }
  note(what + declines + "; " + std::to_string(steps) +
       " steps match eager (loss, parameters, gradients, buffers) within " + std::to_string(tol));
}

// Steps whose inputs change size ([runtime] dynamic, on by default): kiln hands the plugin the
// graph of each new shape (planned from the step's symbolic form, without a capture), and the
// plugin must compute at the sizes of the graph it is given, however it caches what it compiled.
// `sizes[s]` is step s's batch size (vary_batch) or gpt's sequence length; 1 and 2 are in the
// schedule (1 stays specialised: a capture of its own; 2 is the smallest size a symbol takes).
void check_sizes_that_change(const std::string& name, const std::vector<int64_t>& sizes, bool vary_batch) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto plugin = loaded_plugin();
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const std::string dev = settings().device;
  const int64_t batch = vary_batch ? *std::max_element(sizes.begin(), sizes.end()) : case_batch(name);
  auto ref = make_workload(name, {dev, seed, batch});
  auto w = make_workload(name, {dev, seed, batch});
  auto noisy = make_workload(name, {dev, seed, batch});
  {
    at::NoGradGuard no_grad;
    for (auto& p : noisy.model->parameters())
      if (at::isFloatingType(p.scalar_type())) p.mul_(1 + std::ldexp(1.0, -23) * (2 * at::rand_like(p) - 1));
  }
  progress("compile_step for " + name + " with sizes that change, backend " + plugin->name());
  auto ref_step = workload_step(ref);
  auto noisy_step = workload_step(noisy);
  auto step = compile_step(workload_step(w), {{w.model}, {w.optimizer.get()}}, workload_args());
  const double tol = w.autocast_bf16 ? 2e-2 : dev == "cuda" ? 2e-3 : 1e-4;
  const char* what = vary_batch ? "batch size" : "sequence length";
  for (size_t s = 0; s < sizes.size(); ++s) {
    progress(name + " step " + std::to_string(s + 1) + " of " + std::to_string(sizes.size()) + ", " + what + " " +
             std::to_string(sizes[s]));
    const int dim = vary_batch ? 0 : 1;
    // Fresh data every step: a plan that read another step's batch would show.
    at::Tensor x = ref.input.narrow(dim, 0, sizes[s]);
    at::Tensor y = ref.target.narrow(dim, 0, sizes[s]);
    x = x.is_floating_point() ? at::randn_like(x) : at::randint_like(x, 0, 64);
    y = y.is_floating_point() ? at::randn_like(y) : (name == "gpt" ? at::randint_like(y, 0, 64) : y.clone());
    auto want = ref_step({x, y})[0];
    auto floor = noisy_step({x, y})[0];
    auto got = step({x.clone(), y.clone()})[0];
    ASSERT_TRUE(got.defined()) << "step " << s + 1 << " returned no loss";
    EXPECT_LE(rel_err(got, want), std::max(tol, 10 * rel_err(floor, want)))
        << name << " loss at step " << s + 1 << " (" << what << " " << sizes[s] << "): " << got.item<double>()
        << " vs eager " << want.item<double>() << (step.last_step_compiled() ? "" : " (ran eagerly)");
  }
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters(), pn = noisy.model->named_parameters();
  for (size_t i = 0; i < pr.size() && i < pw.size(); ++i) {
    const double floor = rel_err(pn[i].value(), pr[i].value());
    EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), std::max(tol, 10 * floor))
        << name << " parameter " << pr[i].key() << " after " << sizes.size() << " steps of changing " << what;
  }
  const auto& st = step.stats();
  EXPECT_GT(st.shape_specialisations, 0) << "no shape was planned from the step's symbolic form: "
                                         << st.last_recompile_reason;
  const WorkloadGroups groups = count_groups(st.groups);
  EXPECT_EQ(groups.failed, 0u) << "claimed groups failed to compile and ran eagerly; first: " << groups.first_failure;
  note(plugin->name() + ": " + std::to_string(sizes.size()) + " steps of " + name + " with the " + what +
       " changing: " + std::to_string(st.compiles) + " captures, " + std::to_string(st.shape_specialisations) +
       " shapes planned from the symbolic step, " + std::to_string(st.compiled_steps) +
       " steps compiled; losses and parameters match eager within " + std::to_string(tol));
}

TEST(Workload, MlpBatchSizesThatChange) {
  check_sizes_that_change("mlp", {16, 16, 24, 9, 31, 2, 1, 24, 9, 16, 5}, true);
}
TEST(Workload, GptLengthsThatChange) { check_sizes_that_change("gpt", {16, 16, 40, 9, 2, 33, 9, 40, 23}, false); }

TEST(Workload, Mlp) { check_workload("mlp"); }
TEST(Workload, Cnn) { check_workload("cnn"); }
TEST(Workload, Gpt) { check_workload("gpt"); }

// The cases above skip a workload the plugin claims nothing of: a backend may serve only some
// models (convolutions, say). A plugin that runs nothing of any of them, though, is never judged by
// them at all: it passes the ABI, availability and error cases, skips the rest, and trains right
// only because kiln ran every step on its own eager executor. Stops at the first workload that runs
// some of the plugin's code: a claimed group (what became of it is the per-workload case's
// verdict), or a device graph it recorded.
TEST(Workload, PluginRunsInSomeReferenceStep) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto plugin = loaded_plugin();
  std::string none, names;  // "mlp: none of 61 nodes, ..." and "mlp, cnn, gpt", for the failure
  for (const auto& name : workload_names()) {
    // gpt-medium is gpt's model and ops at GPT-2 small's size (GELU's tanh form aside): a benchmark
    // of large matrix multiplies, whose 163 million parameters would make this case cost minutes on
    // the CPU and tell nothing gpt does not.
    if (name == "gpt-medium") continue;
    auto w = make_workload(name, {settings().device, 1, case_batch(name)});
    progress("compile_step for " + name + " with backend " + plugin->name());
    auto step = compile_step(workload_step(w), {{w.model}, {w.optimizer.get()}}, workload_args());
    ASSERT_EQ(step.backend(), plugin->name())
        << "kiln chose another backend: " << (step.backend_reasons().empty() ? "" : step.backend_reasons().back());
    // The eager warm-up, the capture and compile, and one compiled step (a device graph's recording).
    for (int s = 0; s < 3; ++s) {
      progress(name + " step " + std::to_string(s + 1) + " of 3");
      step({w.input, w.target});
    }
    const WorkloadGroups groups = count_groups(step.stats().groups);
    const int graphs = graphs_recorded_by_plugin(step);
    if (groups.total > 0 || graphs > 0) {
      std::string what;
      if (groups.total > 0)
        what = "claims " + std::to_string(groups.total) + (groups.total == 1 ? " group (" : " groups (") +
               std::to_string(groups.nodes_compiled) + " nodes compiled)";
      if (graphs > 0) what += (what.empty() ? "" : ", ") + ("records " + std::to_string(graphs) + " device graph(s)");
      note(plugin->name() + " runs in the " + name + " step: " + what);
      return;
    }
    const ir::Graph* g = step.compiled_graph();
    none += (none.empty() ? "" : ", ") + name +
            (g ? ": none of " + std::to_string(g->nodes.size()) + " nodes"
               : ": no step compiled (" + step.stats().last_fallback + ")");
    names += (names.empty() ? "" : ", ") + name;
  }
  FAIL() << plugin->name() << " claimed no node of any reference workload (" << names
         << "): nothing of it ran, and kiln trained every step on its own eager executor (" << none
         << "); claim the nodes the plugin compiles (docs/writing-a-backend.md, \"Claim nodes\")";
}

}  // namespace
}  // namespace kiln::conformance
