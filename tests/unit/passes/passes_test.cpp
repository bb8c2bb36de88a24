// The passes, IR in and IR out (golden text), plus numeric checks that rewrites are exact.
#include <array>
#include <cmath>
#include <set>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ATen/core/function_schema.h>
#include <c10/util/StringUtil.h>

#include "kiln/internal/executor.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/passes.h"

using namespace kiln;

namespace {

std::string run_pass(const std::string& in, void (*pass)(ir::Graph&)) {
  ir::Graph g = ir::parse(in);
  pass(g);
  g.verify();
  return ir::print(g);
}

// Evaluates every node of `g` on the given input tensors and returns the graph's outputs.
std::vector<at::Tensor> evaluate(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                                 const ConstantTensors& constants = {}) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    auto c = constants.find(g.inputs[i].value);
    env[g.inputs[i].value] = c != constants.end() ? c->second : inputs.at(i);
  }
  for (const auto& n : g.nodes) EagerExecutor::run_node(n, env);
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

}  // namespace

TEST(Dce, RemovesUnusedPureNodesAndKeepsEffects) {
  const std::string in = R"(graph {
  input %0 : f32[4]{1} param "w"
  %1 : f32[4]{1} = aten::relu(%0)
  %2 : f32[4]{1} = aten::neg(%1)
  %3 : f32[4]{1} = aten::sigmoid(%0)
  %4 : f32[4]{1} = aten::bernoulli(%0, None)
  %5 : f32[4]{1} = aten::add_.Tensor(%0, %0, scalar(1))
  %6 : f32[4]{1} = aten::not_an_op(%0)
  output %2 result "y"
}
)";
  EXPECT_EQ(run_pass(in, eliminate_dead_code), R"(graph {
  input %0 : f32[4]{1} param "w"
  %1 : f32[4]{1} = aten::relu(%0)
  %2 : f32[4]{1} = aten::neg(%1)
  %4 : f32[4]{1} = aten::bernoulli(%0, None)
  %5 : f32[4]{1} = aten::add_.Tensor(%0, %0, scalar(1))
  %6 : f32[4]{1} = aten::not_an_op(%0)
  output %2 result "y"
}
)");
}

TEST(Cse, MergesIdenticalPureNodesTransitively) {
  const std::string in = R"(graph {
  input %0 : f32[4]{1} param "a"
  input %1 : f32[4]{1} param "b"
  %2 : f32[4]{1} = aten::mul.Tensor(%0, %1)
  %3 : f32[4]{1} = aten::mul.Tensor(%0, %1)
  %4 : f32[4]{1} = aten::relu(%2)
  %5 : f32[4]{1} = aten::relu(%3)
  %6 : f32[4]{1} = aten::add.Tensor(%4, %5, scalar(1))
  %7 : f32[4]{1} = aten::add.Tensor(%4, %5, scalar(2))
  %8 : f32[4]{1} = aten::bernoulli(%0, None)
  %9 : f32[4]{1} = aten::bernoulli(%0, None)
  output %6 result "x"
  output %7 result "y"
  output %5 writeback 0 "a"
  output %9 result "z"
}
)";
  EXPECT_EQ(run_pass(in, eliminate_common_subexpressions), R"(graph {
  input %0 : f32[4]{1} param "a"
  input %1 : f32[4]{1} param "b"
  %2 : f32[4]{1} = aten::mul.Tensor(%0, %1)
  %4 : f32[4]{1} = aten::relu(%2)
  %6 : f32[4]{1} = aten::add.Tensor(%4, %4, scalar(1))
  %7 : f32[4]{1} = aten::add.Tensor(%4, %4, scalar(2))
  %8 : f32[4]{1} = aten::bernoulli(%0, None)
  %9 : f32[4]{1} = aten::bernoulli(%0, None)
  output %6 result "x"
  output %7 result "y"
  output %4 writeback 0 "a"
  output %9 result "z"
}
)");
}

TEST(Cse, KeepsNodesWhoseResultTypesDiffer) {
  const std::string in = R"(graph {
  input %0 : f32[4]{1} param "a"
  %1 : f32[4]{1} = aten::clone(%0, None)
  %2 : f32[4]{1} = aten::clone(%0, memory_format(0))
  output %1 result "x"
  output %2 result "y"
}
)";
  EXPECT_EQ(run_pass(in, eliminate_common_subexpressions), in);
}

TEST(Decompose, LowersAliasesToCoreOpsExactly) {
  const std::string in = R"(graph {
  input %0 : f32[3,5]{5,1} param "w"
  input %1 : f32[2,3,5]{15,5,1} input "x"
  %2 : f32[5,3]{1,5} = aten::t(%0)
  %3 : f32[2,5,3]{15,1,5} = aten::transpose.int(%1, -1, 1)
  %4 : f32[3,5]{5,1} = aten::ones_like(%0, None, None, None, None, None)
  %5 : f32[2,3,5]{15,5,1} = aten::zeros_like(%1, None, None, None, None, None)
  %6 : f32[6,5]{5,1} = aten::_unsafe_view(%1, i[6, 5])
  output %2 result "a"
  output %3 result "b"
  output %4 result "c"
  output %5 result "d"
  output %6 result "e"
}
)";
  const std::string out = run_pass(in, decompose);
  EXPECT_EQ(out, R"(graph {
  input %0 : f32[3,5]{5,1} param "w"
  input %1 : f32[2,3,5]{15,5,1} input "x"
  %2 : f32[5,3]{1,5} = aten::permute(%0, i[1, 0])
  %3 : f32[2,5,3]{15,1,5} = aten::permute(%1, i[0, 2, 1])
  %4 : f32[3,5]{5,1} = aten::full(i[3, 5], scalar(1.0), dtype(f32), layout(0), device("cpu"), false)
  %5 : f32[2,3,5]{15,5,1} = aten::full(i[2, 3, 5], scalar(0.0), dtype(f32), layout(0), device("cpu"), false)
  %6 : f32[6,5]{5,1} = aten::view(%1, i[6, 5])
  output %2 result "a"
  output %3 result "b"
  output %4 result "c"
  output %5 result "d"
  output %6 result "e"
}
)");
  // Same numbers, same strides, on fresh random inputs.
  std::vector<at::Tensor> inputs = {at::randn({3, 5}), at::randn({2, 3, 5})};
  auto before = evaluate(ir::parse(in), inputs);
  auto after = evaluate(ir::parse(out), inputs);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal(before[i], after[i])) << "output " << i;
    EXPECT_EQ(before[i].strides(), after[i].strides()) << "output " << i;
  }
}

TEST(ConstantFold, EvaluatesConstantChainsOnceAndNeverFoldsThroughBoundInputs) {
  std::mt19937 rng(std::random_device{}());
  const double fill = std::uniform_real_distribution<double>(0.05, 0.95)(rng);
  const std::string in = R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} const "c"
  %2 : f32[4]{1} = aten::full(i[4], scalar()" +
                         std::to_string(fill) + R"(), dtype(f32), layout(0), device("cpu"), false)
  %3 : f32[4]{1} = aten::mul.Tensor(%2, %2)
  %4 : f32[4]{1} = aten::add.Tensor(%0, %3, scalar(1))
  %5 : i64[3]{1} = aten::arange(3, dtype(i64), None, None, None)
  %6 : f32[4]{1} = aten::bernoulli(%2, None)
  %7 : f32[4]{1} = aten::mul.Tensor(%2, %1)
  output %4 result "y"
  output %5 result "p"
  output %6 result "r"
  output %7 result "c2"
}
)";
  ir::Graph g = ir::parse(in);
  at::Tensor c = at::randn({4});
  ConstantTensors constants{{1, c}};
  fold_constants(g, constants);
  g.verify();
  // add reads the user input, bernoulli is random, and %7 reads %1, a bound Constant input that
  // is read in place every step: none of them folds.
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[0].op, "aten::add.Tensor");
  EXPECT_EQ(g.nodes[1].op, "aten::bernoulli");
  EXPECT_EQ(g.nodes[2].op, "aten::mul.Tensor");
  const float f = static_cast<float>(std::stod(std::to_string(fill)));
  ASSERT_TRUE(constants.count(3));
  EXPECT_TRUE(at::allclose(constants.at(3), at::full({4}, f * f)));
  EXPECT_TRUE(at::equal(constants.at(5), at::arange(3)));
  // The folded values are graph inputs with role Constant.
  int folded = 0;
  for (const auto& i : g.inputs) folded += i.name.rfind("folded.", 0) == 0 && i.role == ir::InputRole::Constant;
  EXPECT_EQ(folded, 3);  // %2, %3, %5
  at::Tensor x = at::randn({4});
  std::vector<at::Tensor> inputs(g.inputs.size());
  inputs[0] = x;
  auto outs = evaluate(g, inputs, constants);
  EXPECT_TRUE(at::allclose(outs[0], x + f * f));
  EXPECT_TRUE(at::allclose(outs[3], c * f));
}

TEST(Pipeline, DumpsTheIrAfterEveryPass) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_pipeline_" + std::to_string(std::random_device{}()));
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[3,5]{5,1} param "w"
  %1 : f32[5,3]{1,5} = aten::t(%0)
  %2 : f32[5,3]{1,5} = aten::t(%0)
  %3 : f32[5,3]{3,1} = aten::add.Tensor(%1, %2, scalar(1))
  %4 : f32[5,3]{3,1} = aten::relu(%3)
  output %3 result "y"
}
)");
  ConstantTensors constants;
  PipelineOptions opts;
  opts.functionalize = false;
  opts.debug_dir = dir.string();
  auto records = run_pipeline(g, constants, opts);
  std::vector<std::string> names;
  for (const auto& r : records) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"decompose", "dce", "cse", "constant_fold", "dce_final"}));
  for (const char* f :
       {"00-captured.kir", "01-decompose.kir", "02-dce.kir", "03-cse.kir", "04-constant_fold.kir", "05-dce_final.kir"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  EXPECT_EQ(ir::print(g), R"(graph {
  input %0 : f32[3,5]{5,1} param "w"
  %1 : f32[5,3]{1,5} = aten::permute(%0, i[1, 0])
  %3 : f32[5,3]{3,1} = aten::add.Tensor(%1, %1, scalar(1))
  output %3 result "y"
}
)");
  std::ifstream dumped(dir / "03-cse.kir");
  std::stringstream ss;
  ss << dumped.rdbuf();
  EXPECT_EQ(ss.str(), ir::print(g));
  std::filesystem::remove_all(dir);
}

// An in-place op keeps its argument's dtype, while its functional variant follows type promotion:
// functionalization casts back, and the pure graph computes what the in-place op did.
TEST(Functionalize, InPlaceOpUnderTypePromotionCastsBackToTheWrittenDtype) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : bf16[4]{1} &0 state "acc"
  input %1 : f32[4]{1} &1 param "b"
  %2 : bf16[4]{1} &0 = aten::add_.Tensor(%0, %1, scalar(1))
  %3 : bf16[4]{1} &2 = aten::mul.Tensor(%2, %2)
  output %3 result "y"
}
)");
  functionalize(g);
  g.verify();
  EXPECT_EQ(ir::print(g), R"(graph {
  input %0 : bf16[4]{1} state "acc"
  input %1 : f32[4]{1} param "b"
  %3 : f32[4]{1} = aten::add.Tensor(%0, %1, scalar(1))
  %2 : bf16[4]{1} = aten::_to_copy(%3, dtype(bf16), None, None, None, false, None)
  %4 : bf16[4]{1} = aten::mul.Tensor(%2, %2)
  output %4 result "y"
  output %2 writeback 0 "acc"
}
)");
  at::Tensor acc = at::randn({4}).to(at::kBFloat16), b = at::randn({4});
  at::Tensor want_acc = acc.clone().add_(b);
  auto outs = evaluate(g, {acc, b});
  EXPECT_TRUE(at::equal(outs[0], want_acc * want_acc));
  EXPECT_TRUE(at::equal(outs[1], want_acc));
  EXPECT_EQ(outs[1].scalar_type(), at::kBFloat16);
}

// A write through a view that is its non-contiguous base with the dims in another order (a
// gradient made transposed, scaled in place through its row-major view, as clipping under autocast
// does) replaces the whole base: its new value is the written one permuted back.
TEST(Functionalize, AWriteThroughATransposeOfANonContiguousBaseReplacesTheBase) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[12,16]{1,12} &0 state "g"
  %1 : f32[16,12]{12,1} &0 = aten::t(%0)
  %2 : f32[16,12]{12,1} &0 = aten::mul_.Scalar(%1, scalar(0.5))
  %3 : f32[]{} &1 = aten::sum(%0, None)
  output %3 result "s"
}
)");
  functionalize(g);
  g.verify();
  const std::string text = ir::print(g);
  EXPECT_NE(text.find("aten::permute"), std::string::npos) << text;
  EXPECT_NE(text.find("writeback 0 \"g\""), std::string::npos) << text;
  const at::Tensor base = at::randn({16, 12}).t();  // [12,16], strides {1,12}
  const at::Tensor want = base * 0.5;
  auto outs = evaluate(g, {base.clone(at::MemoryFormat::Preserve)});
  ASSERT_EQ(outs.size(), 2u) << text;
  EXPECT_TRUE(at::allclose(outs[0], want.sum())) << text;
  EXPECT_TRUE(at::equal(outs[1], want)) << text;
  // A view over part of such a base is still refused, with the shapes in the message.
  ir::Graph part = ir::parse(R"(graph {
  input %0 : f32[12,16]{1,12} &0 state "g"
  %1 : f32[16,12]{12,1} &0 = aten::t(%0)
  %2 : f32[8,12]{12,1} &0 = aten::slice.Tensor(%1, 0, 0, 8, 1)
  %3 : f32[8,12]{12,1} &0 = aten::mul_.Scalar(%2, scalar(0.5))
  %4 : f32[]{} &1 = aten::sum(%0, None)
  output %4 result "s"
}
)");
  try {
    functionalize(part);
    ADD_FAILURE() << "a write through a part of a non-contiguous base was functionalized";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("sizes 8 12"), std::string::npos) << e.what();
  }
}

// Two inputs over one memory (shifted views of one tensor) are read as they are when nothing writes
// that memory; a write into it is refused.
TEST(Functionalize, InputsSharingMemoryAreReadAsTheyAreUnlessTheStepWritesIt) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} &0 input "x"
  input %1 : f32[4]{1} &0 input "y"
  %2 : f32[4]{1} &1 = aten::mul.Tensor(%0, %1)
  output %2 result "p"
}
)");
  functionalize(g);
  g.verify();
  const at::Tensor t = at::randn({5});
  auto outs = evaluate(g, {t.slice(0, 0, 4), t.slice(0, 1, 5)});
  EXPECT_TRUE(at::equal(outs[0], t.slice(0, 0, 4) * t.slice(0, 1, 5)));
  ir::Graph w = ir::parse(R"(graph {
  input %0 : f32[4]{1} &0 input "x"
  input %1 : f32[4]{1} &0 input "y"
  %2 : f32[4]{1} &0 = aten::mul_.Tensor(%0, %1)
  output %2 result "p"
}
)");
  try {
    functionalize(w);
    ADD_FAILURE() << "a write into memory two inputs share was functionalized";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("share memory that the step writes"), std::string::npos) << e.what();
  }
}

// Run-time scalars become 0-dim tensor inputs (for CUDA graphs): the IR, and the same numbers.
TEST(LiftRuntimeScalars, RewritesOptimizerScalarsIntoTensorOpsWithTheSameNumbers) {
  const std::string in = R"(graph {
  scalar $0 float "optimizer.scalar.0"
  scalar $1 float "optimizer.scalar.1"
  input %0 : f32[4,3]{3,1} param "p"
  input %1 : f32[4,3]{3,1} state "m"
  input %2 : f32[4,3]{3,1} state "v"
  %3 : f32[4,3]{3,1} = aten::div.Scalar(%2, $0:scalar(0.5))
  %4 : f32[4,3]{3,1} = aten::addcdiv(%0, %1, %3, $1:scalar(-0.25))
  %5 : f32[4,3]{3,1} = aten::add.Tensor(%4, %1, $1:scalar(-0.25))
  %6 : f32[4,3]{3,1} = aten::addcmul(%5, %1, %2, $0:scalar(0.5))
  %7 : f32[4,3]{3,1} = aten::mul.Scalar(%6, $1:scalar(-0.25))
  %8 : f32[4,3]{3,1} = aten::lerp.Scalar(%7, %1, $0:scalar(0.5))
  %9 : f32[4,3]{3,1} = aten::add.Scalar(%8, scalar(2), $1:scalar(-0.25))
  output %9 result "y"
}
)";
  ir::Graph g = ir::parse(in);
  std::vector<LiftedScalar> lifted;
  auto unsupported = lift_runtime_scalars(g, &lifted);
  g.verify();
  EXPECT_TRUE(unsupported.empty());
  const std::string out = ir::print(g);
  EXPECT_EQ(out.find('$', out.find("input")), std::string::npos) << out;  // no run-time scalar left
  EXPECT_NE(out.find("scalar \"scalar.0.Float.cpu\""), std::string::npos) << out;
  EXPECT_NE(out.find("aten::div.Tensor(%2, %10)"), std::string::npos) << out;  // div.Scalar on the CPU: divides
  EXPECT_NE(out.find("aten::addcdiv(%0, %"), std::string::npos) << out;        // CPU: x + (S*a)/b, as ATen's CPU kernel
  EXPECT_NE(out.find("aten::addcmul"), std::string::npos) << out;
  EXPECT_NE(out.find("aten::lerp.Tensor"), std::string::npos) << out;
  ASSERT_EQ(lifted.size(), 2u);               // one per (scalar, reciprocal or not, dtype, device)
  EXPECT_EQ(ir::print(ir::parse(out)), out);  // the text round-trips with the new role
  // Same numbers: the original with the scalars bound, the lifted graph with 0-dim tensors.
  std::vector<at::Tensor> ins = {at::randn({4, 3}), at::randn({4, 3}), at::rand({4, 3}) + 0.5};
  const std::vector<double> values = {0.37, -0.011};
  const ir::Graph orig = ir::parse(in);
  std::vector<c10::IValue> scalars = {values[0], values[1]};
  std::vector<at::Tensor> env(orig.values.size());
  for (size_t i = 0; i < 3; ++i) env[orig.inputs[i].value] = ins[i];
  for (const auto& n : orig.nodes) EagerExecutor::run_node(n, env, &scalars);
  const at::Tensor want = env[orig.outputs[0].value];
  std::vector<at::Tensor> env2(g.values.size());
  for (size_t i = 0; i < 3; ++i) env2[g.inputs[i].value] = ins[i];
  for (const auto& l : lifted)
    env2[l.value] =
        at::scalar_tensor(l.reciprocal ? 1.0f / static_cast<float>(values[l.scalar]) : values[l.scalar], at::kFloat);
  for (const auto& n : g.nodes) EagerExecutor::run_node(n, env2);
  const at::Tensor got = env2[g.outputs[0].value];
  // Bit for bit: each lifted form rounds where ATen's kernel for the host-scalar op rounds.
  EXPECT_TRUE(at::equal(got, want)) << "max difference " << (got - want).abs().max().item<double>();
}

// On CUDA a division by a host scalar is ATen's multiplication by 1/s (in the operand's math
// type), so the lifted scalar there is the reciprocal.
TEST(LiftRuntimeScalars, DivisionOnCudaBecomesAMultiplicationByTheReciprocal) {
  ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  input %0 : f32[4]{1} on cuda:0 state "v"
  %1 : f32[4]{1} on cuda:0 = aten::div.Scalar(%0, $0:scalar(0.5))
  output %1 result "y"
}
)");
  std::vector<LiftedScalar> lifted;
  EXPECT_TRUE(lift_runtime_scalars(g, &lifted).empty());
  const std::string out = ir::print(g);
  ASSERT_EQ(lifted.size(), 1u);
  EXPECT_TRUE(lifted[0].reciprocal);
  // The operand's dtype and device, read before the new input grew the graph's values (the pass
  // once read them after, from freed memory: AddressSanitizer's heap-use-after-free).
  EXPECT_EQ(lifted[0].dtype, c10::ScalarType::Float);
  EXPECT_EQ(lifted[0].device, c10::Device("cuda:0"));
  EXPECT_NE(out.find("aten::mul.Tensor(%0, %2)"), std::string::npos) << out;
  EXPECT_NE(out.find("scalar.0.reciprocal.Float.cuda:0"), std::string::npos) << out;
}

// A form that adds a value after the scalar's input (CUDA addcdiv: the quotient) takes the
// result's dtype and device from a copy: adding the input reallocates the graph's values, and the
// pass once read the result's meta from the freed block (AddressSanitizer: heap-use-after-free).
TEST(LiftRuntimeScalars, ValuesAddedAfterTheScalarKeepTheResultsDtypeAndDevice) {
  ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  input %0 : bf16[4]{1} on cuda:0 param "p"
  input %1 : bf16[4]{1} on cuda:0 state "m"
  input %2 : bf16[4]{1} on cuda:0 state "d"
  %3 : bf16[4]{1} on cuda:0 = aten::addcdiv(%0, %1, %2, $0:scalar(0.5))
  output %3 result "y"
}
)");
  std::vector<LiftedScalar> lifted;
  EXPECT_TRUE(lift_runtime_scalars(g, &lifted).empty());
  g.verify();
  const std::string out = ir::print(g);
  ASSERT_EQ(lifted.size(), 1u);
  EXPECT_EQ(lifted[0].dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(lifted[0].device, c10::Device("cuda:0"));
  EXPECT_NE(out.find("scalar.0.BFloat16.cuda:0"), std::string::npos) << out;
  ASSERT_EQ(g.values.size(), 6u) << out;  // %4 the scalar, %5 the quotient
  EXPECT_NE(out.find("%5 : bf16[4]{1} on cuda:0 = aten::div.Tensor(%1, %2)"), std::string::npos) << out;
  EXPECT_NE(out.find("aten::addcmul(%0, %5, %4"), std::string::npos) << out;
}

TEST(LiftRuntimeScalars, ReportsOpsItCannotRewrite) {
  ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "lr"
  input %0 : f32[4]{1} param "p"
  %1 : f32[4]{1} = aten::clamp(%0, $0:scalar(0.5), None)
  output %1 result "y"
}
)");
  auto unsupported = lift_runtime_scalars(g);
  ASSERT_EQ(unsupported.size(), 1u);
  EXPECT_EQ(unsupported[0], "aten::clamp");
}

// On CUDA each lifted form must round as ATen's kernel for the host-scalar op does (a
// last-bit difference in AdamW's update grows in bf16 training). One op at a time, over the
// scalars AdamW passes in its first 60 steps (1/sqrt(1 - 0.999^t), -lr/(1 - 0.9^t)) and random
// ones, on elements whose terms are of comparable size, so that any difference in where a kernel
// rounds shows up; a failure names the form and the scalar. (The first version of this test used
// one scalar per form and passed while ATen's reciprocal, taken in double, differed from kiln's,
// taken in float, for about half of AdamW's values.) Skips without a CUDA device (scripts/device-check
// capture runs it on the GPU machine).
TEST(LiftRuntimeScalarsCuda, EachLiftedFormRoundsAsAtensHostScalarKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (scripts/device-check capture)";
  const char* forms[] = {
      "aten::div.Scalar(%0, $0:scalar(0.5))",       // exp_avg_sq.sqrt() / sqrt(bc2)
      "aten::addcdiv(%0, %1, %2, $0:scalar(0.5))",  // p.addcdiv_(m, denom, -step_size)
      "aten::addcmul(%0, %1, %2, $0:scalar(0.5))", "aten::add.Tensor(%0, %1, $0:scalar(0.5))",
      "aten::mul.Scalar(%0, $0:scalar(0.5))",      "aten::add.Scalar(%0, $0:scalar(0.5), scalar(1))",
      "aten::lerp.Scalar(%0, %1, $0:scalar(0.5))",
  };
  std::vector<double> values;
  for (int t = 1; t <= 60; ++t) {
    values.push_back(std::sqrt(1 - std::pow(0.999, t)));
    values.push_back(-1e-3 / (1 - std::pow(0.9, t)));
  }
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> uni(-2.0, 2.0);
  for (int i = 0; i < 40; ++i) values.push_back(uni(rng));
  const int64_t n = 1 << 16;
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  int failures = 0;
  for (const char* op : forms) {
    const std::string text = std::string(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  input %0 : f32[65536]{1} on cuda:0 param "p"
  input %1 : f32[65536]{1} on cuda:0 state "m"
  input %2 : f32[65536]{1} on cuda:0 state "d"
  %3 : f32[65536]{1} on cuda:0 = )") +
                             op + R"(
  output %3 result "y"
}
)";
    const ir::Graph orig = ir::parse(text);
    ir::Graph g = orig;
    std::vector<LiftedScalar> lifted;
    ASSERT_TRUE(lift_runtime_scalars(g, &lifted).empty()) << op;
    ASSERT_EQ(lifted.size(), 1u) << op;
    int64_t differ = 0, worst_at = 0;
    double worst_value = 0;
    for (double value : values) {
      const std::vector<at::Tensor> ins = {at::randn({n}, opts), at::randn({n}, opts), at::rand({n}, opts) + 0.5};
      std::vector<c10::IValue> scalars = {value};
      std::vector<at::Tensor> env(orig.values.size());
      for (size_t i = 0; i < 3; ++i) env[orig.inputs[i].value] = ins[i];
      for (const auto& node : orig.nodes) EagerExecutor::run_node(node, env, &scalars);
      const at::Tensor want = env[orig.outputs[0].value];
      std::vector<at::Tensor> env2(g.values.size());
      for (size_t i = 0; i < 3; ++i) env2[g.inputs[i].value] = ins[i];
      // As CompiledStep::fill_scalars: the reciprocal in double, then rounded to float.
      const float s = lifted[0].reciprocal ? static_cast<float>(1.0 / value) : static_cast<float>(value);
      env2[lifted[0].value] = at::scalar_tensor(s, opts);
      for (const auto& node : g.nodes) EagerExecutor::run_node(node, env2);
      const int64_t d = env2[g.outputs[0].value].ne(want).sum().item<int64_t>();
      if (d > worst_at) worst_at = d, worst_value = value;
      differ += d;
    }
    if (differ != 0) ++failures;
    std::printf("lifted %-48s %s: %lld of %lld elements differ over %zu scalars (worst: %lld at %.17g)\n", op,
                lifted[0].reciprocal ? "(reciprocal)" : "", static_cast<long long>(differ),
                static_cast<long long>(n * static_cast<int64_t>(values.size())), values.size(),
                static_cast<long long>(worst_at), worst_value);
  }
  EXPECT_EQ(failures, 0) << "lifted forms that do not round as ATen's CUDA kernels (see the lines above)";
}

// The optimizer's per-parameter updates as multi-tensor ops (KILN_BATCH_OPTIMIZER): AdamW on three
// parameters of two shapes, as LibTorch's C++ AdamW records it after run-time scalar lifting on
// CUDA, with gradients that come out of the backward at different depths (here on the CPU, where
// the multi-tensor ops loop over the single ops: bit for bit).
TEST(BatchOptimizerUpdates, FoldsEqualPerParameterOpsIntoForeachOpsAndKeepsWriteBacksSingle) {
  std::string text = "graph {\n";
  const char* shapes[] = {"f32[4,3]{3,1}", "f32[3]{1}", "f32[4,3]{3,1}"};
  // inputs: p_i %(4i), g_i %(4i+1), m_i %(4i+2), v_i %(4i+3); the shared lifted scalars %12 (R), %13 (S)
  for (int i = 0; i < 3; ++i) {
    text += c10::str("  input %", 4 * i, " : ", shapes[i], " param \"p", i, "\"\n");
    text += c10::str("  input %", 4 * i + 1, " : ", shapes[i], " grad \"g", i, "\"\n");
    text += c10::str("  input %", 4 * i + 2, " : ", shapes[i], " state \"m", i, "\"\n");
    text += c10::str("  input %", 4 * i + 3, " : ", shapes[i], " state \"v", i, "\"\n");
  }
  text += "  input %12 : f32[]{} scalar \"R\"\n  input %13 : f32[]{} scalar \"S\"\n";
  int next = 14;
  std::vector<std::array<int, 3>> wb;  // (p, m, v) new values per parameter
  for (int i = 0; i < 3; ++i) {
    const int p = 4 * i, m = p + 2, v = p + 3;
    const std::string t = shapes[i];
    // Each gradient leaves the backward at its own depth (here: after 2i negations).
    int g = p + 1;
    for (int k = 0; k < 2 * i; ++k, ++next) {
      text += c10::str("  %", next, " : ", t, " = aten::neg(%", g, ") backward\n");
      g = next;
    }
    const int p1 = next++, m1 = next++, m2 = next++, v1 = next++, v2 = next++, s = next++, d0 = next++, d = next++,
              q = next++, p2 = next++;
    text += c10::str("  %", p1, " : ", t, " = aten::mul.Scalar(%", p, ", scalar(0.99999)) optimizer\n");
    text += c10::str("  %", m1, " : ", t, " = aten::mul.Scalar(%", m, ", scalar(0.9)) optimizer\n");
    text += c10::str("  %", m2, " : ", t, " = aten::add.Tensor(%", m1, ", %", g,
                     ", scalar(0.09999999999999998)) optimizer\n");
    text += c10::str("  %", v1, " : ", t, " = aten::mul.Scalar(%", v, ", scalar(0.999)) optimizer\n");
    text += c10::str("  %", v2, " : ", t, " = aten::addcmul(%", v1, ", %", g, ", %", g,
                     ", scalar(0.0010000000000000009)) optimizer\n");
    text += c10::str("  %", s, " : ", t, " = aten::sqrt(%", v2, ") optimizer\n");
    text += c10::str("  %", d0, " : ", t, " = aten::mul.Tensor(%", s, ", %12) optimizer\n");
    text += c10::str("  %", d, " : ", t, " = aten::add.Scalar(%", d0, ", scalar(1e-08), scalar(1)) optimizer\n");
    text += c10::str("  %", q, " : ", t, " = aten::div.Tensor(%", m2, ", %", d, ") optimizer\n");
    text += c10::str("  %", p2, " : ", t, " = aten::addcmul(%", p1, ", %", q, ", %13, scalar(1)) optimizer\n");
    wb.push_back({p2, m2, v2});
  }
  for (int i = 0; i < 3; ++i) {
    text += c10::str("  output %", wb[i][0], " writeback ", 4 * i, " \"p", i, "\"\n");
    text += c10::str("  output %", wb[i][1], " writeback ", 4 * i + 2, " \"m", i, "\"\n");
    text += c10::str("  output %", wb[i][2], " writeback ", 4 * i + 3, " \"v", i, "\"\n");
  }
  text += "}\n";
  const ir::Graph orig = ir::parse(text);
  ir::Graph g = orig;
  const size_t folded = batch_optimizer_updates(g);
  g.verify();
  const std::string out = ir::print(g);
  // Folded: mul.Scalar x3 kinds, sqrt, mul by the shared R, add eps, div: 7 ops x 3 parameters.
  EXPECT_EQ(folded, 21u) << out;
  for (const char* op : {"aten::_foreach_mul.Scalar", "aten::_foreach_sqrt", "aten::_foreach_mul.Tensor",
                         "aten::_foreach_add.Scalar", "aten::_foreach_div.List"})
    EXPECT_NE(out.find(op), std::string::npos) << op << "\n" << out;
  // The written-back values (m's add, v's addcmul, p's addcmul) stay single ops.
  size_t singles = 0;
  for (const auto& n : g.nodes) singles += n.op == "aten::add.Tensor" || n.op == "aten::addcmul";
  EXPECT_EQ(singles, 9u) << out;
  EXPECT_EQ(g.nodes.size(), 6u + 30u - 21u + 7u) << out;  // 6 backward negations
  // Every value is produced before it is read.
  std::set<ir::ValueId> have;
  for (const auto& in : g.inputs) have.insert(in.value);
  for (const auto& n : g.nodes) {
    for (auto v : ir::Graph::node_inputs(n))
      EXPECT_TRUE(have.count(v)) << "%" << v << " read before it is made\n" << out;
    for (auto v : n.outputs) have.insert(v);
  }
  // The same numbers, bit for bit (fresh random operands, v and the scalars positive).
  std::vector<at::Tensor> ins;
  for (int i = 0; i < 3; ++i) {
    auto sizes = i == 1 ? std::vector<int64_t>{3} : std::vector<int64_t>{4, 3};
    ins.push_back(at::randn(sizes));
    ins.push_back(at::randn(sizes));
    ins.push_back(at::randn(sizes));
    ins.push_back(at::rand(sizes));
  }
  ins.push_back(at::scalar_tensor(18.27f));
  ins.push_back(at::scalar_tensor(-0.00369f));
  const auto want = evaluate(orig, ins), got = evaluate(g, ins);
  ASSERT_EQ(want.size(), got.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(at::equal(got[k], want[k])) << "output " << k;
}

// Nodes that depend on each other, or differ in a constant, dtype or shape-compatibility, are not
// folded together.
TEST(BatchOptimizerUpdates, LeavesDependentAndDifferentNodesAlone) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} param "a"
  input %1 : f32[4]{1} param "b"
  input %2 : f64[4]{1} param "c"
  input %3 : f32[2]{1} param "d"
  %4 : f32[4]{1} = aten::mul.Scalar(%0, scalar(0.5)) optimizer
  %5 : f32[4]{1} = aten::mul.Scalar(%4, scalar(0.5)) optimizer
  %6 : f32[4]{1} = aten::mul.Scalar(%1, scalar(0.25)) optimizer
  %7 : f64[4]{1} = aten::mul.Scalar(%2, scalar(0.5)) optimizer
  %8 : f32[4]{1} = aten::add.Scalar(%1, scalar(2), scalar(3)) optimizer
  %9 : f32[4]{1} = aten::add.Scalar(%0, scalar(2), scalar(3)) optimizer
  %10 : f32[4]{1} = aten::mul.Scalar(%3, scalar(0.5)) forward
  output %5 result "x"
  output %6 result "y"
  output %7 result "z"
  output %8 result "w"
  output %9 result "u"
  output %10 result "t"
}
)");
  // %4 and %5 chain; %6 has another constant; %7 another dtype; add.Scalar with alpha 3 has no
  // multi-tensor form; %10 is not the optimizer's. Only results: nothing may fold.
  EXPECT_EQ(batch_optimizer_updates(g), 0u) << ir::print(g);
}

// On CUDA ATen's multi-tensor kernels must round as its single-op kernels do, or the batched
// optimizer step drifts from eager (as the lifted scalars once did). Each foldable op, over three
// tensors of sizes that take the vectorized and the unaligned paths, against the single ops, bit
// for bit. Skips without a CUDA device (scripts/device-check batch runs it on the GPU machine).
TEST(BatchOptimizerUpdatesCuda, EachMultiTensorOpRoundsAsTheSingleOps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (scripts/device-check batch)";
  const char* ops[] = {
      "aten::mul.Scalar(%A, scalar(0.999))",
      "aten::add.Scalar(%A, scalar(1e-08), scalar(1))",
      "aten::add.Tensor(%A, %B, scalar(0.09999999999999998))",
      "aten::sub.Tensor(%A, %B, scalar(0.37))",
      "aten::mul.Tensor(%A, %B)",
      "aten::mul.Tensor(%A, %S)",
      "aten::div.Tensor(%A, %C)",
      "aten::addcmul(%A, %B, %B, scalar(0.0010000000000000009))",
      "aten::addcdiv(%A, %B, %C, scalar(-0.0036900369003690036))",
      "aten::sqrt(%C)",
      "aten::lerp.Scalar(%A, %B, scalar(0.1))",
      "aten::lerp.Scalar(%A, %B, scalar(0.7))",
  };
  const std::vector<int64_t> sizes = {1000003, 4096, 17};
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  int failures = 0;
  for (const char* op : ops) {
    std::string text = "graph {\n  input %0 : f32[]{} on cuda:0 scalar \"S\"\n";
    int next = 1;
    std::vector<int> a, b, c, r;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string t = c10::str("f32[", sizes[i], "]{1} on cuda:0");
      a.push_back(next++), b.push_back(next++), c.push_back(next++);
      text += c10::str("  input %", a[i], " : ", t, " param \"a", i, "\"\n");
      text += c10::str("  input %", b[i], " : ", t, " grad \"b", i, "\"\n");
      text += c10::str("  input %", c[i], " : ", t, " state \"c", i, "\"\n");
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string node = op;
      for (auto [k, v] : {std::pair<const char*, int>{"%A", a[i]}, {"%B", b[i]}, {"%C", c[i]}, {"%S", 0}})
        for (size_t at = node.find(k); at != std::string::npos; at = node.find(k))
          node.replace(at, 2, "%" + std::to_string(v));
      r.push_back(next++);
      text += c10::str("  %", r[i], " : f32[", sizes[i], "]{1} on cuda:0 = ", node, " optimizer\n");
    }
    for (size_t i = 0; i < sizes.size(); ++i) text += c10::str("  output %", r[i], " result \"r", i, "\"\n");
    text += "}\n";
    const ir::Graph orig = ir::parse(text);
    ir::Graph g = orig;
    ASSERT_EQ(batch_optimizer_updates(g), sizes.size()) << op;
    std::vector<at::Tensor> ins = {at::scalar_tensor(18.27f, opts)};
    for (auto n : sizes) {
      ins.push_back(at::randn({n}, opts));
      ins.push_back(at::randn({n}, opts));
      ins.push_back(at::rand({n}, opts) + 0.5);
    }
    const auto want = evaluate(orig, ins), got = evaluate(g, ins);
    int64_t differ = 0;
    for (size_t k = 0; k < want.size(); ++k) differ += got[k].ne(want[k]).sum().item<int64_t>();
    if (differ != 0) ++failures;
    std::printf("multi-tensor %-58s %lld elements differ\n", op, static_cast<long long>(differ));
  }
  EXPECT_EQ(failures, 0) << "multi-tensor ops that do not round as the single ops (see the lines above)";
}

namespace {

// A training step's batch norm as a CUDA step records it after functionalization: the running
// statistics cloned, cuDNN's forward updating the clones (written back), its backward reading the
// reserve. `device`: " on cuda:0" or "" (the CPU: the rewritten graph runs there).
std::string cudnn_batch_norm_step(const std::string& device, const std::string& extra = "") {
  return c10::str(R"(graph {
  input %0 : f32[8,6,5,5]{150,25,5,1})",
                  device, R"( input "x"
  input %1 : f32[6]{1})",
                  device, R"( param "w"
  input %2 : f32[6]{1})",
                  device, R"( param "b"
  input %3 : f32[6]{1})",
                  device, R"( buffer "running_mean"
  input %4 : f32[6]{1})",
                  device, R"( buffer "running_var"
  input %5 : f32[8,6,5,5]{150,25,5,1})",
                  device, R"( input "go"
  %6 : f32[6]{1})",
                  device, R"( = aten::clone(%3, None)
  %7 : f32[6]{1})",
                  device, R"( = aten::clone(%4, None)
  %8 : f32[8,6,5,5]{150,25,5,1})",
                  device, R"(, %9 : f32[6]{1})", device, R"(, %10 : f32[6]{1})", device, R"(, %11 : u8[0]{1})", device,
                  R"( = aten::cudnn_batch_norm(%0, %1, %2, %6, %7, true, 0.1, 1e-05)
  %12 : f32[8,6,5,5]{150,25,5,1})",
                  device, R"(, %13 : f32[6]{1})", device, R"(, %14 : f32[6]{1})", device,
                  R"( = aten::cudnn_batch_norm_backward(%0, %5, %1, %6, %7, %9, %10, 1e-05, %11)
)",
                  extra, R"(  output %8 result "y"
  output %12 result "dx"
  output %13 result "dw"
  output %14 result "db"
  output %6 writeback 3 "running_mean"
  output %7 writeback 4 "running_var"
}
)");
}

}  // namespace

// cuDNN's batch norm pair becomes ATen's native pair: the forward on the clones' sources returning
// the new running statistics (which the write-backs then read), the backward in training mode
// without the reserve; and the rewritten step computes what autograd through at::batch_norm does.
TEST(NativeBatchNorm, RewritesCudnnPairsIntoTheNativeOpsAndComputesTheSameStep) {
  ir::Graph g = ir::parse(cudnn_batch_norm_step(""));
  const auto pairs = cudnn_batch_norm_pairs(g);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].forward, 2);
  EXPECT_EQ(pairs[0].backwards, (std::vector<int32_t>{3}));
  EXPECT_EQ(to_native_batch_norm(g, pairs), 1u);
  eliminate_dead_code(g);
  g.verify();
  const std::string text = ir::print(g);
  EXPECT_EQ(text.find("cudnn"), std::string::npos) << text;
  EXPECT_EQ(text.find("aten::clone"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("aten::native_batch_norm_backward(%5, %0, %1, None, None, %9, %10, true, 1e-05, "
                      "b[true, true, true])"),
            std::string::npos)
      << text;

  const auto opts = at::TensorOptions(at::kDouble);
  at::Tensor x = at::randn({8, 6, 5, 5}, opts), w = at::rand({6}, opts) + 0.5, b = at::randn({6}, opts);
  at::Tensor rm = at::randn({6}, opts), rv = at::rand({6}, opts) + 0.5, go = at::randn({8, 6, 5, 5}, opts);
  // The graph in float64 (its values are f32; the ops follow their inputs' dtype).
  const auto outs = evaluate(g, {x, w, b, rm, rv, go});
  at::Tensor xr = x.clone().requires_grad_(), wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
  at::Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
  at::Tensor y = at::batch_norm(xr, wr, br, rm_ref, rv_ref, true, 0.1, 1e-5, false);
  y.backward(go);
  const std::vector<at::Tensor> want = {y.detach(), xr.grad(), wr.grad(), br.grad(), rm_ref, rv_ref};
  const char* names[] = {"y", "dx", "dw", "db", "running_mean", "running_var"};
  ASSERT_EQ(outs.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(at::allclose(outs[k], want[k], 1e-10, 1e-12)) << names[k];
}

// Nothing is rewritten where the reserve is read by anything but the backward, or the forward is
// in evaluation mode (no pair to begin with).
TEST(NativeBatchNorm, LeavesAReserveReadElsewhereAlone) {
  const ir::Graph g = ir::parse(cudnn_batch_norm_step("", R"(  output %11 result "reserve"
)"));
  EXPECT_TRUE(cudnn_batch_norm_pairs(g).empty());
  std::string eval = cudnn_batch_norm_step("");
  eval.replace(eval.find("%7, true, 0.1"), 13, "%7, false, 0.1");
  EXPECT_TRUE(cudnn_batch_norm_pairs(ir::parse(eval)).empty());
}

// On the GPU: the native pair computes what cuDNN's does (its saved variance is the inverse
// standard deviation, as the native backward reads it), within float32 rounding.
TEST(NativeBatchNormCuda, TheNativePairMatchesCudnnOnTheGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (scripts/device-check capture)";
  const ir::Graph orig = ir::parse(cudnn_batch_norm_step(" on cuda:0"));
  ir::Graph g = orig;
  ASSERT_EQ(to_native_batch_norm(g, cudnn_batch_norm_pairs(g)), 1u);
  eliminate_dead_code(g);
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  const std::vector<at::Tensor> ins = {at::randn({8, 6, 5, 5}, opts), at::rand({6}, opts) + 0.5,
                                       at::randn({6}, opts),          at::randn({6}, opts),
                                       at::rand({6}, opts) + 0.5,     at::randn({8, 6, 5, 5}, opts)};
  const auto want = evaluate(orig, ins);
  const auto got = evaluate(g, ins);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    const double rel = (got[k] - want[k]).abs().max().item<double>() / (want[k].abs().max().item<double>() + 1e-30);
    EXPECT_LE(rel, 1e-5) << "output " << k << " (" << orig.outputs[k].name << ")";
  }
}

namespace {

// Two convolutions with a ReLU between, their backward and a momentum-like use of one weight
// gradient, the shape of a CNN's step. `dev` is "" or " on cuda:0".
std::string conv_step(const std::string& dev) {
  std::string t = R"(graph {
  input %0 : f32[4,3,8,8]{192,64,8,1}@ input "x"
  input %1 : f32[8,3,3,3]{27,9,3,1}@ param "w1"
  input %2 : f32[16,8,3,3]{72,9,3,1}@ param "w2"
  input %3 : f32[4,16,4,4]{256,16,4,1}@ input "go"
  %4 : f32[4,8,8,8]{512,64,8,1}@ = aten::convolution(%0, %1, None, i[1, 1], i[1, 1], i[1, 1], false, i[0, 0], 1)
  %5 : f32[4,8,8,8]{512,64,8,1}@ = aten::relu(%4)
  %6 : f32[4,16,4,4]{256,16,4,1}@ = aten::convolution(%5, %2, None, i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1)
  %7 : f32[4,8,8,8]{512,64,8,1}@, %8 : f32[16,8,3,3]{72,9,3,1}@, _ = aten::convolution_backward(%3, %5, %2, i[0], i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1, b[true, true, false])
  %9 : f32[4,8,8,8]{512,64,8,1}@ = aten::threshold_backward(%7, %5, scalar(0))
  _, %10 : f32[8,3,3,3]{27,9,3,1}@, _ = aten::convolution_backward(%9, %0, %1, i[0], i[1, 1], i[1, 1], i[1, 1], false, i[0, 0], 1, b[false, true, false])
  %11 : f32[16,8,3,3]{72,9,3,1}@ = aten::mul.Scalar(%8, scalar(0.9))
  output %6 result "y"
  output %10 grad 0 "grad.w1"
  output %8 grad 1 "grad.w2"
  output %11 result "m"
}
)";
  for (size_t at; (at = t.find('@')) != std::string::npos;) t.replace(at, 1, dev);
  return t;
}

const ir::TensorMeta& meta_of(const ir::Graph& g, ir::ValueId v) { return g.value(v).meta; }

}  // namespace

// Each convolution reads its weight through one channels-last clone (forward and backward), and the
// batch too, the activations between them become channels-last, graph inputs keep their layouts, the weight
// gradients and a convolution's result that the user sees go back to eager's layout before anything
// reads them; and the step computes the same values.
TEST(ChannelsLast, ConvolutionsReadChannelsLastWeightsAndActivationsAndComputeTheSameStep) {
  const ir::Graph orig = ir::parse(conv_step(""));
  ir::Graph g = orig;
  EXPECT_EQ(channels_last_convolutions(g), 0u) << "CPU graphs are left alone unless asked";
  EXPECT_EQ(ir::print(g), ir::print(orig));
  ASSERT_EQ(channels_last_convolutions(g, /*any_device=*/true), 2u);
  g.verify();
  const std::string text = ir::print(g);
  EXPECT_EQ(ir::print(ir::parse(text)), text);
  const std::vector<int64_t> cl_act = {512, 1, 64, 8}, plain_act = {512, 64, 8, 1};
  for (ir::ValueId v : {4, 5, 7, 9}) EXPECT_EQ(meta_of(g, v).strides, cl_act) << "%" << v << "\n" << text;
  EXPECT_EQ(meta_of(g, 0).strides, (std::vector<int64_t>{192, 64, 8, 1})) << "a graph input keeps its layout";
  EXPECT_EQ(meta_of(g, 6).strides[1], 1) << "ATen's convolution result is channels-last";
  EXPECT_EQ(g.nodes[static_cast<size_t>(g.value(g.outputs[0].value).producer)].op, "aten::clone")
      << "the result the user sees is a contiguous copy of it";
  size_t weight_clones = 0, grad_clones = 0;
  for (const auto& n : g.nodes) {
    if (n.op != "aten::clone") continue;
    ASSERT_EQ(n.args.size(), 2u);
    ASSERT_EQ(n.args[1].kind, ir::Arg::Kind::MemoryFormat);
    const auto& m = meta_of(g, n.outputs[0]);
    if (n.args[1].i == static_cast<int64_t>(c10::MemoryFormat::ChannelsLast)) {
      ++weight_clones;
      EXPECT_TRUE(n.args[0].value == 0 || n.args[0].value == 1 || n.args[0].value == 2) << "x, w1, w2";
      EXPECT_EQ(m.strides[1], 1) << text;
    } else {
      ++grad_clones;
      EXPECT_TRUE(m.is_contiguous()) << text;
      EXPECT_EQ(meta_of(g, n.args[0].value).strides[1], 1) << "a convolution's result comes out channels-last";
    }
  }
  EXPECT_EQ(weight_clones, 3u) << text;  // the weights, and the batch the first convolution reads
  EXPECT_EQ(grad_clones, 3u) << text;    // two weight gradients and the result
  for (const auto& n : g.nodes) {
    if (n.op == "aten::convolution") {
      EXPECT_GT(n.args[0].value, 3) << "reads a channels-last activation";
      EXPECT_GT(n.args[1].value, 11) << "reads the clone";
    } else if (n.op == "aten::convolution_backward") {
      EXPECT_GT(n.args[1].value, 3) << "reads what its forward read";
      EXPECT_GT(n.args[2].value, 11) << "reads the clone";
    } else if (n.op == "aten::mul.Scalar") {
      EXPECT_TRUE(meta_of(g, n.args[0].value).is_contiguous()) << text;
    }
  }
  for (const auto& o : g.outputs) EXPECT_TRUE(meta_of(g, o.value).is_contiguous()) << o.name;

  const auto opts = at::TensorOptions(at::kDouble);
  const std::vector<at::Tensor> ins = {at::randn({4, 3, 8, 8}, opts), at::randn({8, 3, 3, 3}, opts),
                                       at::randn({16, 8, 3, 3}, opts), at::randn({4, 16, 4, 4}, opts)};
  const auto want = evaluate(orig, ins);
  const auto got = evaluate(g, ins);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_TRUE(at::allclose(got[k], want[k], 1e-10, 1e-12)) << orig.outputs[k].name;
    EXPECT_TRUE(got[k].is_contiguous()) << orig.outputs[k].name << ": eager's layout for what the user sees";
  }
}

// Transposed convolutions, 1-D ones and graphs without convolutions are left alone.
TEST(ChannelsLast, LeavesOtherGraphsAlone) {
  std::string t = conv_step("");
  const std::string plain_conv = "false, i[0, 0], 1)", transposed_conv = "true, i[0, 0], 1)";
  for (size_t at; (at = t.find(plain_conv)) != std::string::npos;) t.replace(at, plain_conv.size(), transposed_conv);
  const ir::Graph transposed = ir::parse(t);
  ir::Graph g = transposed;
  EXPECT_EQ(channels_last_convolutions(g, true), 0u);
  EXPECT_EQ(ir::print(g), ir::print(transposed));
  ir::Graph plain = ir::parse(R"(graph {
  input %0 : f32[4,8,8,8]{512,64,8,1} input "x"
  %1 : f32[4,8,8,8]{512,64,8,1} = aten::relu(%0)
  %2 : f32[4,8,8,8]{512,64,8,1} = aten::relu(%1)
  output %2 result "y"
}
)");
  const std::string before = ir::print(plain);
  EXPECT_EQ(channels_last_convolutions(plain, true), 0u);
  EXPECT_EQ(ir::print(plain), before);
}

// On the GPU: ATen gives every value the layout the graph now says (so no kernel converts one
// behind the backend's back), and the step matches the original within float32 rounding.
TEST(ChannelsLastCuda, AtenProducesTheMarkedLayoutsAndTheSameValues) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  const ir::Graph orig = ir::parse(conv_step(" on cuda:0"));
  ir::Graph g = orig;
  ASSERT_EQ(channels_last_convolutions(g), 2u);
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  const auto opts = at::TensorOptions(at::kFloat).device(at::kCUDA);
  const std::vector<at::Tensor> ins = {at::randn({4, 3, 8, 8}, opts), at::randn({8, 3, 3, 3}, opts),
                                       at::randn({16, 8, 3, 3}, opts), at::randn({4, 16, 4, 4}, opts)};
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) env[g.inputs[i].value] = ins[i];
  for (const auto& n : g.nodes) {
    EagerExecutor::run_node(n, env);
    for (auto o : n.outputs) {
      if (o == ir::kNoValue) continue;
      EXPECT_EQ(env[o].strides().vec(), meta_of(g, o).strides) << n.op << " made %" << o;
    }
  }
  const auto want = evaluate(orig, ins);
  at::globalContext().setAllowTF32CuDNN(tf32);
  for (size_t k = 0; k < want.size(); ++k) {
    const at::Tensor got = env[g.outputs[k].value];
    const double rel = (got - want[k]).abs().max().item<double>() / (want[k].abs().max().item<double>() + 1e-30);
    EXPECT_LE(rel, 1e-5) << orig.outputs[k].name;
  }
}

// Data parallelism: the reducer's flatten, all_reduce and wait come after the whole backward as
// captured. Each all_reduce moves up to right after what it needs, in order; the waits stay; a
// random op needed by the second bucket takes the random op before it along.
TEST(OverlapCollectives, EachAllReduceRightAfterItsGradientsWaitsStayLast) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} param "w1"
  input %2 : f32[4]{1} param "w2"
  %3 : f32[4]{1} = aten::mul.Tensor(%0, %2) backward
  %12 : f32[4]{1} = aten::rand_like(%0, None, None, None, None, None) backward
  %4 : f32[4]{1} = aten::mul.Tensor(%0, %3) backward
  %13 : f32[4]{1} = aten::rand_like(%0, None, None, None, None, None) backward
  %5 : f32[4]{1} = aten::mul.Tensor(%4, %13) backward
  %14 : f32[4]{1} = aten::add.Tensor(%12, %0, scalar(1)) backward
  %6 : f32[4]{1} = aten::div.Scalar(%3, scalar(2))
  %7 : f32[4]{1} = _c10d_functional::all_reduce(%6, "sum", "kiln.0")
  %8 : f32[4]{1} = _c10d_functional::wait_tensor(%7)
  %9 : f32[4]{1} = aten::div.Scalar(%5, scalar(2))
  %10 : f32[4]{1} = _c10d_functional::all_reduce(%9, "sum", "kiln.0")
  %11 : f32[4]{1} = _c10d_functional::wait_tensor(%10)
  output %8 result "g2"
  output %11 result "g1"
  output %14 result "other"
}
)");
  EXPECT_EQ(overlap_collectives(g), 10u);
  g.verify();
  EXPECT_EQ(ir::print(g), R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} param "w1"
  input %2 : f32[4]{1} param "w2"
  %3 : f32[4]{1} = aten::mul.Tensor(%0, %2) backward
  %6 : f32[4]{1} = aten::div.Scalar(%3, scalar(2))
  %7 : f32[4]{1} = _c10d_functional::all_reduce(%6, "sum", "kiln.0")
  %12 : f32[4]{1} = aten::rand_like(%0, None, None, None, None, None) backward
  %4 : f32[4]{1} = aten::mul.Tensor(%0, %3) backward
  %13 : f32[4]{1} = aten::rand_like(%0, None, None, None, None, None) backward
  %5 : f32[4]{1} = aten::mul.Tensor(%4, %13) backward
  %9 : f32[4]{1} = aten::div.Scalar(%5, scalar(2))
  %10 : f32[4]{1} = _c10d_functional::all_reduce(%9, "sum", "kiln.0")
  %14 : f32[4]{1} = aten::add.Tensor(%12, %0, scalar(1)) backward
  %8 : f32[4]{1} = _c10d_functional::wait_tensor(%7)
  %11 : f32[4]{1} = _c10d_functional::wait_tensor(%10)
  output %8 result "g2"
  output %11 result "g1"
  output %14 result "other"
}
)");
  // Nothing to do without an all_reduce.
  ir::Graph plain = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  %1 : f32[4]{1} = aten::relu(%0)
  output %1 result "y"
}
)");
  EXPECT_EQ(overlap_collectives(plain), 0u);
}

// ---- rematerialize ([runtime] activation_memory_budget) -------------------------------------

namespace {

// A linear layer, GELU and a second linear layer, with the backward that autograd records for
// them: the backward reads the GELU's result (for the second weight's gradient, through a
// transpose) and its input (for gelu_backward).
const char* kMlpStep = R"(graph {
  input %0 : f32[8,16]{16,1} input "x"
  input %1 : f32[16,32]{32,1} param "w1"
  input %2 : f32[32,16]{16,1} param "w2"
  input %3 : f32[8,16]{16,1} input "dy"
  %4 : f32[8,32]{32,1} = aten::mm(%0, %1) forward
  %5 : f32[8,32]{32,1} = aten::gelu(%4, "none") forward
  %6 : f32[8,16]{16,1} = aten::mm(%5, %2) forward
  %7 : f32[32,8]{1,32} = aten::permute(%5, i[1, 0]) backward
  %8 : f32[32,16]{16,1} = aten::mm(%7, %3) backward
  %9 : f32[16,32]{1,16} = aten::permute(%2, i[1, 0]) backward
  %10 : f32[8,32]{32,1} = aten::mm(%3, %9) backward
  %11 : f32[8,32]{32,1} = aten::gelu_backward(%10, %4, "none") backward
  output %6 result "y"
  output %8 result "gw2"
  output %11 result "dh"
}
)";

}  // namespace

// Budget 0: the GELU's result is computed again in the backward from its input, which the backward
// keeps anyway (gelu_backward reads it); the matmul's result cannot be (a matmul is never
// recomputed). The copy is a Recompute node just before the first backward reader, which reads
// it; the forward's GELU is then read by the forward alone. The results are bit for bit the same.
TEST(Rematerialize, TheBackwardComputesTheGeluAgainFromWhatItKeepsAnyway) {
  ir::Graph g = ir::parse(kMlpStep);
  const ir::Graph before = g;
  const RematerializeResult r = rematerialize(g, 0.0);
  g.verify();
  EXPECT_EQ(r.kept_bytes_before, 2 * 8 * 32 * 4);
  EXPECT_EQ(r.kept_bytes_after, 8 * 32 * 4) << "the matmul's result stays kept";
  EXPECT_EQ(r.dropped_tensors, 1);
  EXPECT_EQ(r.recomputed_nodes, 1);
  ASSERT_EQ(g.nodes.size(), before.nodes.size() + 1);
  const ir::Node& copy = g.nodes[3];
  EXPECT_EQ(copy.op, "aten::gelu");
  EXPECT_EQ(copy.phase, ir::Phase::Recompute);
  EXPECT_EQ(g.nodes[4].op, "aten::permute");
  EXPECT_EQ(g.nodes[4].args[0].value, copy.outputs[0]) << ir::print(g);
  for (const auto& n : g.nodes) {
    if (n.phase != ir::Phase::Backward) continue;
    for (auto v : ir::Graph::node_inputs(n)) EXPECT_NE(v, 5) << "the backward still reads the forward's GELU";
  }
  // The text form keeps the phase.
  EXPECT_EQ(ir::print(ir::parse(ir::print(g))), ir::print(g));
  const std::vector<at::Tensor> in = {at::randn({8, 16}), at::randn({16, 32}), at::randn({32, 16}), at::randn({8, 16})};
  const auto want = evaluate(before, in), got = evaluate(g, in);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(at::equal(got[k], want[k])) << "output " << k;
}

TEST(Rematerialize, ABudgetOfOneChangesNothingAndABudgetKeepsTheLargestUntilItHolds) {
  ir::Graph g = ir::parse(kMlpStep);
  const RematerializeResult all = rematerialize(g, 1.0);
  EXPECT_EQ(all.dropped_tensors, 0);
  EXPECT_EQ(ir::print(g), ir::print(ir::parse(kMlpStep)));
  // 0.6 of 8 KiB: dropping the GELU's 4 KiB is enough (and the only drop there is).
  const RematerializeResult some = rematerialize(g, 0.6);
  EXPECT_EQ(some.dropped_tensors, 1);
  EXPECT_LE(static_cast<double>(some.kept_bytes_after), 0.6 * static_cast<double>(some.kept_bytes_before));
}

// Dropout's mask is drawn once: a result that depends on it is never computed again (the backward
// would draw other numbers), so what the backward reads of it stays kept.
TEST(Rematerialize, NeverComputesARandomOpAgain) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[8,32]{32,1} input "x"
  input %1 : f32[8,32]{32,1} input "dy"
  %2 : f32[8,32]{32,1}, %3 : bool[8,32]{32,1} = aten::native_dropout(%0, 0.5, true) forward
  %4 : f32[8,32]{32,1} = aten::mul.Tensor(%2, %2) forward
  %5 : f32[8,32]{32,1} = aten::mul.Tensor(%1, %2) backward
  %6 : f32[8,32]{32,1} = aten::native_dropout_backward(%5, %3, 2.0) backward
  output %4 result "y"
  output %6 result "dx"
}
)");
  const RematerializeResult r = rematerialize(g, 0.0);
  EXPECT_EQ(r.kept_bytes_before, 8 * 32 * 4 + 8 * 32) << "the dropout's result and its mask";
  EXPECT_EQ(r.dropped_tensors, 0) << ir::print(g);
  EXPECT_EQ(r.kept_bytes_after, r.kept_bytes_before);
}

// A Recompute node never joins a group of forward nodes, directly or by a merge, even when the
// backend claims every node around it: there it would be computed in the forward and kept again.
TEST(Rematerialize, ThePartitionKeepsTheCopiesOutOfTheForwardsGroups) {
  ir::Graph g = ir::parse(kMlpStep);
  rematerialize(g, 0.0);
  std::vector<int64_t> claimed;
  for (size_t i = 0; i < g.nodes.size(); ++i) claimed.push_back(static_cast<int64_t>(i));
  const Partition p = partition_graph(g, claimed, {}, /*views_at_ends_run_eagerly=*/false);
  int32_t copy_group = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].phase == ir::Phase::Recompute) copy_group = p.group_of[i];
  ASSERT_GE(copy_group, 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].phase == ir::Phase::Forward) {
      EXPECT_NE(p.group_of[i], copy_group) << "node " << i;
    }
  }
}
