// The partitioned executor with real plugins: the example third-party backend runs the
// elementwise nodes it claims through the C ABI, the rest runs eagerly, and the results match the
// eager executor; a plugin whose compile fails or that declines costs a warning or nothing, never a
// result, and groups() records for each claimed group whether the plugin's code runs it.
#include <gtest/gtest.h>

#include <map>

#include <ATen/ATen.h>
#include <ATen/core/function_schema.h>

#include "kiln/config.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/passes.h"
#include "kiln/internal/plugin_registry.h"

using namespace kiln;

namespace {

// x -> relu -> permute (not elementwise: eager) -> add with y^T -> mul -> neg ; the loss-like
// sum at the end is eager too.
const char* kGraph = R"(graph {
  input %0 : f32[8,16]{16,1} input "x"
  input %1 : f32[16,8]{8,1} input "y"
  %2 : f32[8,16]{16,1} = aten::relu(%0)
  %3 : f32[8,16]{16,1} = aten::mul.Tensor(%2, %0)
  %4 : f32[16,8]{1,16} = aten::permute(%3, i[1, 0])
  %5 : f32[16,8]{8,1} = aten::clone(%4, memory_format(0))
  %6 : f32[16,8]{8,1} = aten::add.Tensor(%5, %1, scalar(0.5))
  %7 : f32[16,8]{8,1} = aten::neg(%6)
  %8 : f32[16,8]{8,1} = aten::sigmoid(%7)
  %9 : f32[]{} = aten::sum(%8, None)
  output %9 result "loss"
  output %7 result "h"
}
)";

std::vector<at::Tensor> run_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  EagerExecutor(g).run(env);
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

// Runs kGraph's executor on fresh inputs and checks every output against eager (within 1e-6);
// returns the environment after the run.
std::vector<at::Tensor> run_and_compare(const ir::Graph& g, const PartitionedExecutor& exec) {
  std::vector<at::Tensor> inputs = {at::randn({8, 16}), at::randn({16, 8})};
  auto ref = run_eager(g, inputs);
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  exec.run(env);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const at::Tensor& out = env[g.outputs[k].value];
    EXPECT_TRUE(out.defined()) << "output " << k;
    if (!out.defined()) continue;
    const double rel = (out - ref[k]).norm().item<double>() / std::max(ref[k].norm().item<double>(), 1e-30);
    EXPECT_LE(rel, 1e-6) << "output " << k;
  }
  return env;
}

std::shared_ptr<HostServices> host() {
  TrainingArguments args;
  return torch_host_services(args);
}

// How a plugin left every group it claimed to eager execution.
struct EagerGroups {
  std::string backend;
  bool declined;            // declined (KILN_ERROR_UNIMPLEMENTED) rather than failed
  std::string error;        // "compile failed (<error code>)"
  std::string plugin_says;  // the plugin's own message
};

// Each of exec's groups (over kGraph) is recorded as `want` says, and running exec gives exactly
// eager's results.
void expect_groups_ran_eagerly(const ir::Graph& g, PartitionedExecutor& exec, const EagerGroups& want) {
  SCOPED_TRACE(want.backend);
  for (const auto& o : exec.groups()) {
    EXPECT_EQ(o.backend, want.backend);
    EXPECT_FALSE(o.compiled);
    EXPECT_EQ(o.declined, want.declined);
    EXPECT_NE(o.reason.find(want.error), std::string::npos) << o.reason;
    EXPECT_NE(o.reason.find(want.plugin_says), std::string::npos) << o.reason;
  }
  std::vector<at::Tensor> inputs = {at::randn({8, 16}), at::randn({16, 8})};
  auto ref = run_eager(g, inputs);
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  exec.run(env);
  EXPECT_TRUE(at::equal(env[9], ref[0]));
  EXPECT_TRUE(at::equal(env[7], ref[1]));
}

}  // namespace

TEST(PartitionedExecutor, CustomBackendRunsItsElementwiseNodesAndResultsMatchEager) {
  ir::Graph g = ir::parse(kGraph);
  auto plugin = PluginRegistry::load_file(KILN_CUSTOM_PLUGIN, host());
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  // relu, mul | add, neg, sigmoid: two groups around the eager permute/clone.
  EXPECT_EQ(exec.stats().claimed, 5u);
  EXPECT_EQ(exec.stats().groups, 2u);
  EXPECT_EQ(exec.stats().groups_compiled, 2u);
  EXPECT_EQ(exec.stats().nodes_compiled, 5u);
  // Each claimed group says that the plugin's code runs it.
  ASSERT_EQ(exec.groups().size(), 2u);
  EXPECT_EQ(exec.groups()[0].backend, "custom_elementwise");
  EXPECT_EQ(exec.groups()[0].nodes, 2u);
  EXPECT_EQ(exec.groups()[0].first_op, "aten::relu");
  EXPECT_EQ(exec.groups()[1].nodes, 3u);
  EXPECT_EQ(exec.groups()[1].first_op, "aten::add.Tensor");
  for (const auto& o : exec.groups()) {
    EXPECT_TRUE(o.compiled);
    EXPECT_FALSE(o.declined);
    EXPECT_EQ(o.reason, "");
  }
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<at::Tensor> env = run_and_compare(g, exec);
    // Intermediate values were freed after their last use.
    EXPECT_FALSE(env[2].defined());
    EXPECT_FALSE(env[5].defined());
  }
}

// Two backends share the graph ("custom_elementwise+inductor"): the first claims its element-wise
// nodes, the second takes among what is left (the permute, the clone and the sum; a node the first
// took is not the second's, whatever it claims). Each group holds one backend's nodes and is
// compiled by it, the outcomes name the backend of each group, and the results match eager.
TEST(PartitionedExecutor, ASecondBackendTakesWhatTheFirstLeaves) {
  const ir::Graph g = ir::parse(kGraph);
  auto custom = PluginRegistry::load_file(KILN_CUSTOM_PLUGIN, host());
  auto inductor = PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, host());
  auto cp = compile_partition(g, {custom, inductor}, {KILN_MODE_DEFAULT, KILN_MODE_DEFAULT});
  ASSERT_EQ(cp->plugins.size(), 2u);
  EXPECT_EQ(cp->plugin, custom);
  // Every node is some backend's; the element-wise ones are the custom backend's.
  EXPECT_EQ(cp->stats.nodes_compiled, g.nodes.size()) << print_compiled_partition(g, *cp);
  std::map<std::string, size_t> nodes_of;
  for (size_t gi = 0; gi < cp->partition.groups.size(); ++gi) {
    const auto& grp = cp->partition.groups[gi];
    const std::string backend = cp->plugins[static_cast<size_t>(grp.backend)]->name();
    EXPECT_EQ(cp->outcomes[gi].backend, backend);
    EXPECT_TRUE(cp->outcomes[gi].compiled) << cp->outcomes[gi].reason;
    ASSERT_TRUE(cp->groups[gi].exe);
    EXPECT_EQ(&cp->groups[gi].exe->plugin(), cp->plugins[static_cast<size_t>(grp.backend)].get());
    for (auto ni : grp.nodes) {
      const std::string& op = g.nodes[static_cast<size_t>(ni)].op;
      const bool elementwise = op != "aten::permute" && op != "aten::clone" && op != "aten::sum";
      EXPECT_EQ(backend, elementwise ? "custom_elementwise" : "inductor") << op;
      ++nodes_of[backend];
    }
  }
  EXPECT_EQ(nodes_of["custom_elementwise"], 5u);
  EXPECT_EQ(nodes_of["inductor"], 3u);
  ir::Graph planned = g;
  compute_writebacks_in_place(planned, cp->position);
  PartitionedExecutor exec(planned, cp);
  for (int trial = 0; trial < 2; ++trial) {
    run_and_compare(g, exec);
  }
  // The other way round, inductor claims every node and leaves the custom backend nothing.
  auto reversed = compile_partition(g, {inductor, custom}, {KILN_MODE_DEFAULT, KILN_MODE_DEFAULT});
  for (const auto& grp : reversed->partition.groups) EXPECT_EQ(grp.backend, 0);
  EXPECT_EQ(reversed->stats.nodes_compiled, g.nodes.size());
}

// A write-back computed by a plugin goes straight into the written tensor's memory when the plugin
// accepts it (ABI 2.2) and nothing after the group reads the old value: w - lr * g * exp(w) over w,
// with exp eager (the example backend does not take it) and before the group. When an eager node
// reads w after the group (atan2 of old and new w), the output gets memory of its own.
TEST(PartitionedExecutor, WriteBacksOfACompiledGroupAreComputedOverTheirInputs) {
  const ir::Graph before = ir::parse(R"(graph {
  input %0 : f32[8,16]{16,1} param "w"
  input %1 : f32[8,16]{16,1} grad "g"
  %2 : f32[8,16]{16,1} = aten::exp(%0)
  %3 : f32[8,16]{16,1} = aten::mul.Tensor(%1, %2)
  %4 : f32[8,16]{16,1} = aten::sub.Tensor(%0, %3, scalar(0.1))
  output %4 writeback 0 "w"
}
)");
  const ir::Graph after = ir::parse(R"(graph {
  input %0 : f32[8,16]{16,1} param "w"
  input %1 : f32[8,16]{16,1} grad "g"
  %2 : f32[8,16]{16,1} = aten::mul.Tensor(%1, %1)
  %3 : f32[8,16]{16,1} = aten::sub.Tensor(%0, %2, scalar(0.1))
  %4 : f32[8,16]{16,1} = aten::atan2(%0, %3)
  output %3 writeback 0 "w"
  output %4 result "angle"
}
)");
  auto plugin = PluginRegistry::load_file(KILN_CUSTOM_PLUGIN, host());
  for (const ir::Graph* g : {&before, &after}) {
    const bool in_place = g == &before;
    SCOPED_TRACE(in_place ? "w last read by the group" : "w read after the group");
    PartitionedExecutor exec(*g, plugin, KILN_MODE_DEFAULT);
    ASSERT_EQ(exec.stats().groups_compiled, 1u);
    for (int trial = 0; trial < 2; ++trial) {
      const at::Tensor w = at::randn({8, 16}), grad = at::randn({8, 16});
      const auto ref = run_eager(*g, {w.clone(), grad});
      std::vector<at::Tensor> env(g->values.size());
      env[0] = w.clone();
      env[1] = grad;
      exec.run(env);
      const at::Tensor& out = env[g->outputs[0].value];
      EXPECT_TRUE(at::allclose(out, ref[0], 1e-6, 1e-6));
      EXPECT_EQ(out.is_same(env[0]), in_place);
      if (in_place) continue;
      EXPECT_TRUE(at::equal(env[0], w)) << "the group wrote over w, which atan2 reads afterwards";
      EXPECT_TRUE(at::allclose(env[4], ref[1], 1e-6, 1e-6));
    }
  }
}

// The inductor computes a write-back over the parameter it replaces and says (ABI 2.5) that a
// failed execute has written nothing: the executor keeps no copy for it, and when an execute fails
// (here: the run hands it w at another shape than it was compiled for, which it refuses before any
// kernel) the group's nodes run eagerly in its place from the same inputs, the run goes on, and
// later runs keep them eager.
TEST(PartitionedExecutor, AFailureAtomicInPlaceGroupThatFailsRunsItsNodesEagerlyAndTheRunGoesOn) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[8,16]{16,1} param "w"
  input %1 : f32[8,16]{16,1} grad "g"
  %2 : f32[8,16]{16,1} = aten::exp(%0)
  %3 : f32[8,16]{16,1} = aten::mul.Tensor(%1, %2)
  %4 : f32[8,16]{16,1} = aten::sub.Tensor(%0, %3, scalar(0.1))
  output %4 writeback 0 "w"
}
)");
  auto plugin = PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, host());
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  ASSERT_EQ(exec.stats().groups_compiled, 1u);
  ASSERT_EQ(exec.stats().inplace_accepted, 1u);
  auto run = [&](const at::Tensor& w, const at::Tensor& grad) {
    std::vector<at::Tensor> env(g.values.size());
    env[0] = w;
    env[1] = grad;
    exec.run(env);
    return env;
  };
  auto eager_w = [&](const at::Tensor& w, const at::Tensor& grad) { return run_eager(g, {w.clone(), grad})[0]; };
  {
    const at::Tensor w = at::randn({8, 16}), grad = at::randn({8, 16});
    const at::Tensor want = eager_w(w, grad);
    const auto env = run(w, grad);
    EXPECT_TRUE(env[4].is_same(env[0])) << "computed over w";
    EXPECT_TRUE(at::allclose(env[4], want, 1e-6, 1e-6));
    EXPECT_EQ(exec.groups_failed_in_run(), 0u);
  }
  {
    const at::Tensor w = at::randn({4, 16}), grad = at::randn({4, 16});
    const at::Tensor before = w.clone(), want = eager_w(w, grad);
    const auto env = run(w, grad);
    EXPECT_EQ(exec.groups_failed_in_run(), 1u);
    EXPECT_TRUE(at::equal(w, before)) << "the failed execute wrote into w";
    ASSERT_TRUE(env[4].defined());
    EXPECT_FALSE(env[4].is_same(env[0])) << "the eager nodes give a new tensor";
    EXPECT_TRUE(at::equal(env[4], want));
    const std::string why = exec.last_group_failure();
    EXPECT_NE(why.find("another shape"), std::string::npos) << why;
    EXPECT_NE(why.find("'inductor'"), std::string::npos) << why;
    EXPECT_NE(why.find("ran eagerly in its place"), std::string::npos) << why;
  }
  {
    const at::Tensor w = at::randn({8, 16}), grad = at::randn({8, 16});
    const at::Tensor want = eager_w(w, grad);
    const auto env = run(w, grad);
    EXPECT_FALSE(env[4].is_same(env[0])) << "the group's nodes stay eager after its failure";
    EXPECT_TRUE(at::equal(env[4], want));
    EXPECT_EQ(exec.groups_failed_in_run(), 1u);
  }
}

// The custom backend reads alpha as a run-time scalar on every call, so the host hands it
// the node; the value changes between calls and the results follow.
TEST(PartitionedExecutor, RunTimeScalarsReachAPluginThatTakesThem) {
  ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "lr"
  input %0 : f32[4]{1} param "w"
  input %1 : f32[4]{1} grad "g"
  %2 : f32[4]{1} = aten::add.Tensor(%0, %1, $0:scalar(-0.1))
  %3 : f32[4]{1} = aten::relu(%2)
  output %3 result "w2"
}
)");
  auto plugin = PluginRegistry::load_file(KILN_CUSTOM_PLUGIN, host());
  ASSERT_TRUE(plugin->accepts_runtime_scalars());
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(exec.stats().claimed, 2u);
  EXPECT_EQ(exec.stats().claims_dropped, 0u);
  EXPECT_EQ(exec.stats().nodes_compiled, 2u);
  for (double lr : {0.37, 0.05, 1.5}) {
    at::Tensor w = at::randn({4}), grad = at::randn({4});
    std::vector<c10::IValue> scalars = {c10::IValue(-lr)};
    std::vector<at::Tensor> env(g.values.size());
    env[0] = w;
    env[1] = grad;
    exec.run(env, &scalars);
    EXPECT_TRUE(at::allclose(env[3], at::relu(w - lr * grad))) << "lr " << lr;
  }
}

// A plugin without KILN_CAPABILITY_RUNTIME_SCALARS never sees a node with a run-time scalar.
TEST(PartitionedExecutor, NodesWithRunTimeScalarsStayEagerForPluginsThatCannotTakeThem) {
  ir::Node n;
  n.op = "aten::add.Tensor";
  n.args = {ir::Arg::tensor(0), ir::Arg::tensor(1), ir::Arg::real(-0.1)};
  n.outputs = {2};
  EXPECT_TRUE(node_can_be_claimed(n, false));
  n.args[2].scalar_input = 0;
  EXPECT_FALSE(node_can_be_claimed(n, false));
  EXPECT_TRUE(node_can_be_claimed(n, true));
  n.args[2].scalar_input = -1;
  n.outputs = {ir::kNoValue};
  EXPECT_FALSE(node_can_be_claimed(n, true));
}

TEST(PartitionedExecutor, FailedCompileRunsEagerlyWithTheSameResults) {
  ir::Graph g = ir::parse(kGraph);
  auto plugin = PluginRegistry::load_file(KILN_COMPILE_FAILS_PLUGIN, host());
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(exec.stats().groups_compiled, 0u);
  ASSERT_FALSE(exec.stats().compile_errors.empty());
  // Every group is recorded as a failure (not a decline), with the plugin's code and message.
  ASSERT_EQ(exec.groups().size(), exec.stats().groups);
  ASSERT_FALSE(exec.groups().empty());
  expect_groups_ran_eagerly(
      g, exec, {"bad_compile_fails", false, "compile failed (invalid argument)", "float64 is not supported"});
}

TEST(PartitionedExecutor, DeclinedGroupsAreRecordedAsDeclinesWithTheReason) {
  ir::Graph g = ir::parse(kGraph);
  auto plugin = PluginRegistry::load_file(KILN_DECLINES_PLUGIN, host());
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  // It claims relu, mul | add, neg (not sigmoid): the same two groups, both declined, silently.
  EXPECT_TRUE(exec.stats().compile_errors.empty());
  ASSERT_EQ(exec.groups().size(), 2u);
  EXPECT_EQ(exec.groups()[0].nodes, 2u);
  EXPECT_EQ(exec.groups()[1].nodes, 2u);
  expect_groups_ran_eagerly(g, exec,
                            {"declines_everything", true, "compile failed (unimplemented)", "no code generator yet"});
}

// A plugin whose compile may run from several threads at once gets a step's groups compiled in
// parallel, up to the threads asked for; the outcome is recorded in group order either way. A
// plugin without the capability is compiled one group at a time.
TEST(PartitionedExecutor, GroupsCompileInParallelOnlyWhenThePluginSaysItCan) {
  ir::Graph g = ir::parse(kGraph);
  auto concurrent = PluginRegistry::load_file(KILN_DECLINES_CONCURRENTLY_PLUGIN, host());
  ASSERT_TRUE(concurrent->concurrent_compile_safe());
  EXPECT_FALSE(PluginRegistry::load_file(KILN_DECLINES_PLUGIN, host())->concurrent_compile_safe());
  for (int threads : {1, 4}) {
    SCOPED_TRACE("compile_threads " + std::to_string(threads));
    auto cp = compile_partition(g, concurrent, KILN_MODE_DEFAULT, threads);
    // Two groups (relu, mul | add, neg): at most two compile at once.
    ASSERT_EQ(cp->outcomes.size(), 2u);
    EXPECT_EQ(cp->stats.compile_threads, threads == 1 ? 1u : 2u);
    const std::string at_once = threads == 1 ? "(1 compiling at once)" : "(2 compiling at once)";
    EXPECT_EQ(cp->outcomes[0].first_op, "aten::relu");
    EXPECT_EQ(cp->outcomes[1].first_op, "aten::add.Tensor");
    for (const auto& o : cp->outcomes) {
      EXPECT_TRUE(o.declined);
      EXPECT_NE(o.reason.find(at_once), std::string::npos) << o.reason;
    }
  }
}
