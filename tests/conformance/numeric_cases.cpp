// Numeric cases, op by op: every catalogue variant the plugin claims is compiled and run with
// fresh random inputs and poisoned outputs, and compared with the eager executor by relative error
// with a tolerance by dtype (harness.h); an ill-conditioned result passes when the plugin is as
// close to a float64 evaluation as eager is, or no further from it than one-ulp perturbations of
// the inputs move it. One case per op family. The run-time scalar cases also change the scalars'
// values between the executes of one executable, as a learning-rate schedule and Adam's bias
// corrections do from step to step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "harness.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

// A result that nearly cancels (a sum of random-signed terms, self + a*b with self ~ -a*b) has a
// large relative error against LibTorch eager although neither side is wrong: both round, in
// different orders. Such an output still passes when the plugin is no further from a float64
// evaluation of the same graph than LibTorch eager is (with a little slack). Returns that
// float64 evaluation's verdict, or false when the graph cannot run in float64.
bool as_accurate_as_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                          const std::vector<c10::IValue>* scalars, const at::Tensor& out, const at::Tensor& ref,
                          size_t k) {
  if (!at::isFloatingType(ref.scalar_type()) || ref.scalar_type() == at::kDouble) return false;
  std::vector<at::Tensor> wide;
  for (const auto& t : inputs) wide.push_back(at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t);
  std::vector<at::Tensor> exact;
  try {
    exact = run_eager(g, wide, scalars);
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
      const auto e = run_eager(g, moved, scalars);
      spread = std::max(spread, (e[k] - exact[k]).abs().max().item<double>());
    } catch (const std::exception&) {
      return false;
    }
  }
  const double plugin_abs = (out.to(at::kDouble) - exact[k]).abs().max().item<double>();
  return spread > 0 && plugin_abs <= 4 * spread;
}

// One run of a variant's executable, as the failures name it: "" for the numeric cases;
// ", execute 2 of 4 ($0 = 1.25 compiled with 0.5)" where the run-time scalars change.
std::string describe_run(int run, int runs, const std::vector<c10::IValue>& scalars,
                         const std::vector<c10::IValue>& captured) {
  if (scalars.empty()) return "";
  std::ostringstream s;
  s << ", execute " << run + 1 << " of " << runs << " (";
  for (size_t k = 0; k < scalars.size(); ++k) {
    s << (k ? ", " : "") << "$" << k << " = " << scalars[k].toScalar().toDouble();
    if (run > 0) s << " compiled with " << captured[k].toScalar().toDouble();
  }
  s << ")";
  return s.str();
}

// What a family's variants came to, for the case's message.
struct FamilyTally {
  size_t checked = 0, compiled_nodes = 0, all_declined = 0;
  double worst = 0;
  std::string worst_label;
};

// Compiles one variant through the plugin (when it claims some of it) and runs that executable
// `runs` times with fresh inputs, each against eager. `scalars_change`: the first run passes the
// run-time scalars' values the graph was captured with, every later one fresh values, as the steps
// of a training run after its capture do; a wrong output after a right first run then says that the
// plugin does not read the new values.
void check_variant(const OpVariant& v, int runs, bool scalars_change, FamilyTally& tally) {
  progress("build " + v.label());
  const ir::Graph g = build_graph(v, make_inputs(v, case_device()));
  progress("claim and compile " + v.label());
  std::unique_ptr<PluginProgram> program;
  try {
    program = std::make_unique<PluginProgram>(g);
  } catch (const PluginError& e) {
    ADD_FAILURE() << v.label() << ": claim: " << error_code_name(e.code()) << ": " << e.what();
    return;
  }
  for (const auto& e : program->compile_errors())
    ADD_FAILURE() << v.label() << ": claimed, then failed to compile (decline with KILN_ERROR_UNIMPLEMENTED): " << e;
  if (program->nodes_compiled() == 0) {
    if (program->groups_declined() > 0) ++tally.all_declined;
    return;
  }
  ++tally.checked;
  tally.compiled_nodes += program->nodes_compiled();
  const std::vector<c10::IValue> captured = captured_scalars(g);
  std::vector<c10::IValue> scalars = captured;
  bool first_matched = false;
  for (int run = 0; run < runs; ++run) {  // one executable, fresh inputs (and scalars) each run
    if (run > 0 && scalars_change) scalars = make_scalars(v, scalars);
    const auto inputs = make_inputs(v, case_device());
    const std::vector<c10::IValue>* bound = scalars.empty() ? nullptr : &scalars;
    const std::string what = v.label() + describe_run(run, runs, scalars, captured);
    progress("run " + what + (run && scalars.empty() ? " (again)" : ""));
    std::vector<at::Tensor> outs;
    try {
      outs = program->run(inputs, bound);
    } catch (const PluginError& e) {
      ADD_FAILURE() << what << ": execute: " << error_code_name(e.code()) << ": " << e.what();
      return;
    }
    const auto ref = run_eager(g, inputs, bound);
    bool matched = true;
    for (size_t k = 0; k < ref.size(); ++k) {
      const at::Tensor& out = outs[k];
      ASSERT_TRUE(out.defined()) << what << ": output " << k << " missing";
      EXPECT_EQ(out.scalar_type(), ref[k].scalar_type()) << what << ": output " << k << " dtype";
      const double tol = tolerance(ref[k].scalar_type(), v.matmul_like);
      const double err = rel_err(out, ref[k]);
      if (err > tol && std::isfinite(err) && as_accurate_as_eager(g, inputs, bound, out, ref[k], k)) continue;
      if (err <= tol) {
        if (err > tally.worst) tally.worst = err, tally.worst_label = v.label();
        continue;
      }
      matched = false;
      ADD_FAILURE() << what << ": output " << k << " relative error " << err << " > " << tol
                    << (std::isinf(err) ? " (NaN, infinity, unwritten output or wrong shape)" : "")
                    << (run > 0 && first_matched
                            ? "; execute 1, with the values it was compiled with, matched: the plugin does not "
                              "read the run-time scalars' new values (KilnExecutableExecuteArgs.scalars[k], at "
                              "every execute)"
                            : "");
    }
    if (run == 0) first_matched = matched;
    if (!matched && scalars_change) return;  // one failure per variant is enough: on to the next
  }
}

// Runs every variant of `family`; skips (saying why) when the plugin runs none of them.
void check_variants(const std::string& family, int runs, bool scalars_change) {
  const auto variants = op_catalogue(family);
  FamilyTally tally;
  for (const auto& v : variants) {
    check_variant(v, runs, scalars_change, tally);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (tally.checked == 0 && tally.all_declined > 0)
    GTEST_SKIP() << "the plugin claims " << tally.all_declined << " of the " << variants.size() << " " << family
                 << " variants and declines to compile every one (KILN_ERROR_UNIMPLEMENTED)";
  if (tally.checked == 0)
    GTEST_SKIP() << "the plugin claims none of the " << variants.size() << " " << family << " variants";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%zu of %zu variants claimed and checked (%zu nodes compiled%s); worst rel err %.2e%s%s", tally.checked,
                variants.size(), tally.compiled_nodes,
                scalars_change ? ", each executed with the run-time scalars changed between executes" : "", tally.worst,
                tally.worst_label.empty() ? "" : " in ", tally.worst_label.c_str());
  note(buf);
}

void check_family(const std::string& family) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  check_variants(family, 2, false);
}

// Executes of one executable in the run-time scalar cases: the capture's values, then three others.
constexpr int kScalarExecutes = 4;

// Run-time scalars: each executable runs with values it was not compiled with. Only a plugin that
// says it reads them is handed such nodes; for any other kiln runs them eagerly.
void check_runtime_scalars(const std::string& family) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  if (!loaded_plugin()->accepts_runtime_scalars())
    GTEST_SKIP() << "the plugin does not declare KILN_CAPABILITY_RUNTIME_SCALARS: kiln never hands it a node with "
                    "a run-time scalar (a scheduled learning rate, Adam's bias corrections) and runs those nodes "
                    "eagerly";
  check_variants(family, kScalarExecutes, true);
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
TEST(Numeric, RuntimeScalars) { check_runtime_scalars("RuntimeScalars"); }
TEST(Numeric, RuntimeScalarChains) { check_runtime_scalars("RuntimeScalarChains"); }

}  // namespace
}  // namespace kiln::conformance
