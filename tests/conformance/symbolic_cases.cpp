// Symbolic shapes (ABI 2.4, KILN_CAPABILITY_SYMBOLIC_SHAPES): one graph at many sizes, through
// the pipeline's own path for the shapes of a dynamic step. The graph is claimed, partitioned and
// compiled at its first size as kiln compiles a static step; at its second size each group is
// handed to the plugin in symbolic form (the group at that size, its symbols and size sites); at
// every later size, sizes neither compile saw among them, a group the symbolic form gives back
// runs the executable compiled for every size with that call's sizes. Sizes 1 and 0 get graphs
// of their own, as in PyTorch. Every run is compared with the eager executor on fresh inputs.
//
// A plugin that accepts a symbolic view but computes at the view's own sizes (or at the first
// size it met) fails here at the first size it was not compiled for.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <functional>
#include <string>
#include <vector>

#include "harness.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/symbolic_groups.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

struct SizedGraph {
  std::string what;                      // "an element-wise chain"
  std::function<OpVariant(int64_t)> at;  // the graph at size n
  std::vector<int64_t> sizes;            // first, second, then unseen ones, then 1 and 0
};

InputSpec T(std::vector<int64_t> shape) {
  InputSpec s;
  s.shape = std::move(shape);
  return s;
}

std::vector<SizedGraph> sized_graphs() {
  std::vector<SizedGraph> out;
  out.push_back({"an element-wise chain of one shape [n, 33]",
                 [](int64_t n) {
                   OpVariant v;
                   v.family = "SymbolicShapes";
                   v.op = "mul+add+relu+neg";
                   v.inputs = {T({n, 33}), T({n, 33})};
                   v.body =
                       "%2 = aten::mul.Tensor(%0, %1)\n"
                       "%3 = aten::add.Tensor(%2, %0, scalar(1))\n"
                       "%4 = aten::relu(%3)\n"
                       "%5 = aten::neg(%4)";
                   return v;
                 },
                 {16, 24, 9, 40, 2, 1, 0}});
  out.push_back({"a broadcast add, a row sum and a mean over [n, 20]",
                 [](int64_t n) {
                   OpVariant v;
                   v.family = "SymbolicShapes";
                   v.op = "add+relu+sum+mean";
                   v.inputs = {T({n, 20}), T({20})};
                   v.body =
                       "%2 = aten::add.Tensor(%0, %1, scalar(1))\n"
                       "%3 = aten::relu(%2)\n"
                       "%4 = aten::sum.dim_IntList(%3, i[1], false, None)\n"
                       "%5 = aten::mean(%4, None)";
                   return v;
                 },
                 {16, 24, 9, 37, 2, 1}});
  out.push_back({"a flattening view, a matmul and a softmax over [n, 6, 8]",
                 [](int64_t n) {
                   OpVariant v;
                   v.family = "SymbolicShapes";
                   v.op = "view+mm+softmax";
                   v.inputs = {T({n, 6, 8}), T({8, 5})};
                   v.matmul_like = true;
                   v.body = "%2 = aten::view(%0, i[" + std::to_string(n * 6) +
                            ", 8])\n"
                            "%3 = aten::mm(%2, %1)\n"
                            "%4 = aten::_softmax(%3, 1, false)";
                   return v;
                 },
                 {4, 7, 3, 12, 2, 1}});
  return out;
}

struct SizeRun {
  size_t groups = 0, symbolic = 0, reused = 0;
};

// Plans and runs the graph at size n with the family's shared groups; EXPECTs it matches eager.
SizeRun run_at(const SizedGraph& sg, int64_t n, SymbolicGroups& groups, const std::string& seen) {
  const OpVariant v = sg.at(n);
  progress("build " + v.label());
  const ir::Graph g = build_graph(v, make_inputs(v, case_device()));
  progress("claim, partition and compile " + v.label() + seen);
  auto partition = compile_partition(g, loaded_plugin(), KILN_MODE_DEFAULT, 1, &groups);
  SizeRun r;
  r.groups = partition->stats.groups_compiled;
  r.symbolic = partition->stats.groups_symbolic;
  r.reused = partition->stats.groups_reused;
  for (const auto& e : partition->stats.compile_errors)
    ADD_FAILURE() << v.label() << seen << ": claimed, then failed to compile: " << e;
  PartitionedExecutor exec(g, partition);
  const auto inputs = make_inputs(v, case_device());
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  progress("run " + v.label() + seen);
  try {
    exec.run(env);
  } catch (const PluginError& e) {
    ADD_FAILURE() << v.label() << seen << ": execute: " << error_code_name(e.code()) << ": " << e.what();
    return r;
  }
  if (case_device().is_cuda()) torch::cuda::synchronize();
  const auto ref = run_eager(g, inputs);
  for (size_t k = 0; k < ref.size(); ++k) {
    const at::Tensor& out = env[g.outputs[k].value];
    if (!out.defined()) {
      ADD_FAILURE() << v.label() << seen << ": output " << k << " missing";
      continue;
    }
    if (ref[k].numel() == 0) {
      EXPECT_EQ(out.sizes(), ref[k].sizes()) << v.label() << seen << ": output " << k << " shape";
      continue;
    }
    const double tol = tolerance(ref[k].scalar_type(), v.matmul_like);
    const double err = rel_err(out, ref[k]);
    EXPECT_LE(err, tol) << v.label() << seen << ": output " << k << " relative error " << err << " > " << tol
                        << (std::isinf(err) ? " (NaN, infinity, unwritten output or wrong shape)" : "");
  }
  return r;
}

TEST(SymbolicShapes, OneExecutableServesEverySize) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto plugin = loaded_plugin();
  if (!plugin->symbolic_shapes())
    GTEST_SKIP() << "the plugin does not declare KILN_CAPABILITY_SYMBOLIC_SHAPES (ABI 2.4): kiln hands it the graph of "
                    "each size of a dynamic step and compiles each (the Workload cases with sizes that change check "
                    "that it computes at the sizes it is given)";
  size_t symbolic = 0, reused = 0, graphs = 0;
  std::string declined;
  for (const auto& sg : sized_graphs()) {
    SymbolicGroups groups;
    size_t accepted = 0;  // this graph's groups compiled for every size so far
    for (size_t s = 0; s < sg.sizes.size(); ++s) {
      const int64_t n = sg.sizes[s];
      const std::string seen = s == 0   ? " (first size: compiled for it)"
                               : s == 1 ? " (second size: offered in symbolic form)"
                               : n < 2  ? " (size " + std::to_string(n) + ": a graph of its own)"
                                        : " (a size no compile saw)";
      const SizeRun r = run_at(sg, n, groups, seen);
      if (::testing::Test::HasFatalFailure()) return;
      if (s == 0 && r.groups == 0) break;  // claims nothing of this graph
      if (s == 0) ++graphs;
      if (s == 1 && r.symbolic == 0) declined += (declined.empty() ? "" : "; ") + sg.what;
      if (s >= 2 && n >= 2 && accepted > 0) {
        EXPECT_EQ(r.reused, r.groups) << sg.what << " at size " << n << ": " << r.groups - r.reused << " of "
                                      << r.groups
                                      << " compiled groups were compiled again although an executable for every size "
                                         "was there";
      }
      accepted += r.symbolic;
      symbolic += r.symbolic;
      reused += r.reused;
    }
  }
  if (graphs == 0) GTEST_SKIP() << "the plugin claims nothing of the " << sized_graphs().size() << " graphs";
  if (symbolic == 0)
    GTEST_SKIP() << "the plugin declares symbolic shapes but accepted no symbolic view (" << declined
                 << "): kiln compiled each size, and every size matched eager";
  note(std::to_string(graphs) + " graphs at 6-7 sizes each (sizes 1 and 0 included): " + std::to_string(symbolic) +
       " groups compiled for every size, run " + std::to_string(reused) +
       " times at sizes they were not compiled at; every size matches eager" +
       (declined.empty() ? "" : "; declined in symbolic form: " + declined));
}

}  // namespace
}  // namespace kiln::conformance
