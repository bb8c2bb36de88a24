// Numeric cases, op by op: every catalogue variant the plugin claims is compiled and run with
// fresh random inputs and poisoned outputs, and compared with the eager executor by relative error
// with a tolerance by dtype (harness.h); an ill-conditioned result passes when the plugin is as
// close to a float64 evaluation as eager is, or no further from it than one-ulp perturbations of
// the inputs move it. One case per op family.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "harness.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

// A result that nearly cancels (a sum of random-signed terms, self + a*b with self ~ -a*b) has a
// large relative error against LibTorch eager although neither side is wrong: both round, in
// different orders. Such an output still passes when the plugin is no further from a float64
// evaluation of the same graph than LibTorch eager is (with a little slack). Returns that
// float64 evaluation's verdict, or false when the graph cannot run in float64.
bool as_accurate_as_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs, const at::Tensor& out,
                          const at::Tensor& ref, size_t k) {
  if (!at::isFloatingType(ref.scalar_type()) || ref.scalar_type() == at::kDouble) return false;
  std::vector<at::Tensor> wide;
  for (const auto& t : inputs) wide.push_back(at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t);
  std::vector<at::Tensor> exact;
  try {
    exact = run_eager(g, wide);
  } catch (const std::exception&) {
    return false;
  }
  if (k >= exact.size() || exact[k].scalar_type() != at::kDouble) return false;
  const double plugin_err = rel_err(out.to(at::kDouble), exact[k]);
  const double eager_err = rel_err(ref.to(at::kDouble), exact[k]);
  if (plugin_err <= 2 * eager_err + tolerance(ref.scalar_type()) / 10) return true;
  // Eager may land closer by luck (its rounding order happened to cancel). Then the measure is the
  // result's own conditioning: how far the float64 result moves when every floating input is
  // perturbed by up to four units in the last place of the output's dtype (a stand-in for the
  // roundings inside a composite op such as gelu's backward near its root). A plugin no further
  // from the float64 result than four such moves rounds no worse than a correct evaluation can; in
  // a well-conditioned place that is still ~1e-6, ten times inside the tolerance.
  const double ulp = ref.scalar_type() == at::kBFloat16 ? 0x1p-8 : ref.scalar_type() == at::kHalf ? 0x1p-11 : 0x1p-24;
  double spread = 0;
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<at::Tensor> moved;
    for (const auto& t : wide)
      moved.push_back(at::isFloatingType(t.scalar_type()) ? t * (1 + 4 * ulp * (2 * at::rand_like(t) - 1)) : t);
    try {
      const auto e = run_eager(g, moved);
      spread = std::max(spread, (e[k] - exact[k]).abs().max().item<double>());
    } catch (const std::exception&) {
      return false;
    }
  }
  const double plugin_abs = (out.to(at::kDouble) - exact[k]).abs().max().item<double>();
  return spread > 0 && plugin_abs <= 4 * spread;
}

void check_family(const std::string& family) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const auto variants = op_catalogue(family);
  size_t checked = 0, compiled_nodes = 0, all_declined = 0;
  double worst = 0;
  std::string worst_label;
  for (const auto& v : variants) {
    progress("build " + v.label());
    const ir::Graph g = build_graph(v, make_inputs(v, case_device()));
    progress("claim and compile " + v.label());
    std::unique_ptr<PluginProgram> program;
    try {
      program = std::make_unique<PluginProgram>(g);
    } catch (const PluginError& e) {
      ADD_FAILURE() << v.label() << ": claim: " << error_code_name(e.code()) << ": " << e.what();
      continue;
    }
    for (const auto& e : program->compile_errors())
      ADD_FAILURE() << v.label() << ": claimed, then failed to compile (decline with KILN_ERROR_UNIMPLEMENTED): " << e;
    if (program->nodes_compiled() == 0) {
      if (program->groups_declined() > 0) ++all_declined;
      continue;
    }
    ++checked;
    compiled_nodes += program->nodes_compiled();
    for (int trial = 0; trial < 2; ++trial) {  // one executable, fresh inputs each run
      const auto inputs = make_inputs(v, case_device());
      progress("run " + v.label() + (trial ? " (again)" : ""));
      std::vector<at::Tensor> outs;
      try {
        outs = program->run(inputs);
      } catch (const PluginError& e) {
        ADD_FAILURE() << v.label() << ": execute: " << error_code_name(e.code()) << ": " << e.what();
        break;
      }
      const auto ref = run_eager(g, inputs);
      for (size_t k = 0; k < ref.size(); ++k) {
        const at::Tensor& out = outs[k];
        ASSERT_TRUE(out.defined()) << v.label() << ": output " << k << " missing";
        EXPECT_EQ(out.scalar_type(), ref[k].scalar_type()) << v.label() << ": output " << k << " dtype";
        const double tol = tolerance(ref[k].scalar_type(), v.matmul_like);
        const double err = rel_err(out, ref[k]);
        if (err > tol && std::isfinite(err) && as_accurate_as_eager(g, inputs, out, ref[k], k)) continue;
        EXPECT_LE(err, tol) << v.label() << ": output " << k << " relative error " << err << " > " << tol
                            << (std::isinf(err) ? " (NaN, infinity, unwritten output or wrong shape)" : "");
        if (err > worst && std::isfinite(err)) {
          worst = err;
          worst_label = v.label();
        }
      }
    }
  }
  if (checked == 0 && all_declined > 0)
    GTEST_SKIP() << "the plugin claims " << all_declined << " of the " << variants.size() << " " << family
                 << " variants and declines to compile every one (KILN_ERROR_UNIMPLEMENTED)";
  if (checked == 0) GTEST_SKIP() << "the plugin claims none of the " << variants.size() << " " << family << " variants";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu of %zu variants claimed and checked (%zu nodes compiled); worst rel err %.2e%s%s",
                checked, variants.size(), compiled_nodes, worst, worst_label.empty() ? "" : " in ",
                worst_label.c_str());
  note(buf);
}

TEST(Numeric, UnaryPointwise) { check_family("UnaryPointwise"); }
TEST(Numeric, BinaryPointwise) { check_family("BinaryPointwise"); }
TEST(Numeric, BackwardPointwise) { check_family("BackwardPointwise"); }
TEST(Numeric, OptimizerPointwise) { check_family("OptimizerPointwise"); }
TEST(Numeric, Reductions) { check_family("Reductions"); }
TEST(Numeric, Softmax) { check_family("Softmax"); }
TEST(Numeric, LayerNorm) { check_family("LayerNorm"); }
TEST(Numeric, NllLoss) { check_family("NllLoss"); }
TEST(Numeric, Matmul) { check_family("Matmul"); }
TEST(Numeric, Layout) { check_family("Layout"); }
TEST(Numeric, Embedding) { check_family("Embedding"); }
TEST(Numeric, Convolution) { check_family("Convolution"); }
TEST(Numeric, FusedChains) { check_family("FusedChains"); }

}  // namespace
}  // namespace kiln::conformance
