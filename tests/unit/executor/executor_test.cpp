// The eager executor: single nodes against ATen, and whole compiled steps (every node on the
// eager executor) against LibTorch eager for the three reference workloads.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "kiln/compile.h"
#include "kiln/internal/executor.h"
#include "kiln/workloads.h"

namespace {

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  auto o = out.detach().to(at::kDouble).cpu(), r = ref.detach().to(at::kDouble).cpu();
  const double denom = r.norm().item<double>();
  const double num = (o - r).norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return denom == 0 ? num : num / denom;
}

// These tests are about kiln's own eager executor: name it, so that the backend the hardware
// probe would pick does not take the nodes (the backends have their own parity tests).
kiln::TrainingArguments compile_args() {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.torch_compile_backend = "eager";
  return a;
}

// 20 compiled steps (the first eager, the second the capture step, 18 through the eager
// executor) against 20 LibTorch eager steps from the same initial weights and batch.
void expect_parity(const std::string& name, int64_t batch, int steps = 20, const std::string& device = "cpu",
                   double tol = 1e-5, bool cpu_autocast = false) {
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  // cuDNN picks non-deterministic kernels by default (atomics in convolution backward): eager
  // would not even match itself over 20 steps.
  if (device == "cuda") at::globalContext().setDeterministicCuDNN(true);
  auto ref = kiln::make_workload(name, {device, seed, batch});
  auto w = kiln::make_workload(name, {device, seed, batch});
  auto ref_step = kiln::workload_step(ref, cpu_autocast);
  auto step =
      kiln::compile_step(kiln::workload_step(w, cpu_autocast), {{w.model}, {w.optimizer.get()}}, compile_args());
  for (int s = 0; s < steps; ++s) {
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    ASSERT_TRUE(got.defined()) << "step " << s;
    EXPECT_LE(rel_err(got, want), tol) << name << " loss at step " << s << ": " << got.item<float>() << " vs "
                                       << want.item<float>();
  }
  EXPECT_EQ(step.stats().compiled_steps, steps - 2) << step.stats().last_fallback;
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  ASSERT_EQ(pr.size(), pw.size());
  for (size_t i = 0; i < pr.size(); ++i) {
    EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), tol) << name << " parameter " << pr[i].key();
    ASSERT_TRUE(pw[i].value().grad().defined()) << "gradient left in " << pr[i].key();
    EXPECT_LE(rel_err(pw[i].value().grad(), pr[i].value().grad()), tol) << name << " gradient " << pr[i].key();
  }
  auto br = ref.model->named_buffers(), bw = w.model->named_buffers();
  for (size_t i = 0; i < br.size(); ++i)
    EXPECT_LE(rel_err(bw[i].value(), br[i].value()), tol) << name << " buffer " << br[i].key();
}

}  // namespace

TEST(EagerExecutor, RunNodeMatchesAtenAddmm) {
  kiln::ir::Graph g;
  auto make = [&](at::IntArrayRef shape) {
    kiln::ir::TensorMeta m;
    m.shape = shape.vec();
    m.strides = at::empty(shape).strides().vec();
    return g.add_input(m, kiln::ir::InputRole::UserInput, "x" + std::to_string(g.inputs.size()));
  };
  auto b = make({5}), x = make({3, 4}), w = make({4, 5});
  kiln::ir::Node n;
  n.op = "aten::addmm";
  n.args = {kiln::ir::Arg::tensor(b), kiln::ir::Arg::tensor(x), kiln::ir::Arg::tensor(w), kiln::ir::Arg::integer(1),
            kiln::ir::Arg::real(0.5)};
  n.args[3].is_scalar = n.args[4].is_scalar = true;
  n.outputs = {g.add_value({})};
  g.add_node(n);
  std::vector<at::Tensor> env(g.values.size());
  env[b] = at::randn({5});
  env[x] = at::randn({3, 4});
  env[w] = at::randn({4, 5});
  kiln::EagerExecutor::run_node(g.nodes[0], env);
  EXPECT_TRUE(at::allclose(env[n.outputs[0]], at::addmm(env[b], env[x], env[w], 1, 0.5)));
}

TEST(EagerExecutor, FreesIntermediatesAfterLastUse) {
  kiln::ir::Graph g;
  kiln::ir::TensorMeta m;
  m.shape = {4};
  m.strides = {1};
  auto x = g.add_input(m, kiln::ir::InputRole::UserInput, "x");
  auto r = g.add_value(m), s = g.add_value(m);
  kiln::ir::Node relu{"aten::relu", {kiln::ir::Arg::tensor(x)}, {r}, false, kiln::ir::Phase::Forward};
  kiln::ir::Node neg{"aten::neg", {kiln::ir::Arg::tensor(r)}, {s}, false, kiln::ir::Phase::Forward};
  g.add_node(relu);
  g.add_node(neg);
  g.outputs.push_back({s, kiln::ir::OutputRole::Result, -1, "result.0"});
  kiln::EagerExecutor ex(g);
  std::vector<at::Tensor> env(g.values.size());
  const auto input = at::randn({4});
  env[x] = input;
  ex.run(env);
  EXPECT_FALSE(env[r].defined()) << "the intermediate relu result should be freed";
  EXPECT_TRUE(at::equal(env[s], -at::relu(input)));
}

TEST(CompiledStepParity, Mlp20StepsMatchEager) { expect_parity("mlp", 0); }
TEST(CompiledStepParity, Cnn20StepsMatchEager) { expect_parity("cnn", 32); }
TEST(CompiledStepParity, Gpt20StepsMatchEager) { expect_parity("gpt", 0); }

TEST(CompiledStepParityCuda, Mlp20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the lead runs this on the GPU machine";
  expect_parity("mlp", 0, 20, "cuda", 1e-5);
}

// In-place ops under autocast keep their argument's dtype (bf16 += f32 stays bf16) where their
// functional variants promote; the step must still match eagerly to the bit.
TEST(CompiledStepParity, GptUnderCpuAutocastBf16MatchesEager) { expect_parity("gpt", 2, 8, "cpu", 1e-5, true); }
TEST(CompiledStepParityCuda, Cnn20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the lead runs this on the GPU machine";
  expect_parity("cnn", 0, 20, "cuda", 1e-5);
}
TEST(CompiledStepParityCuda, GptBf16Autocast20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the lead runs this on the GPU machine";
  expect_parity("gpt", 8, 20, "cuda", 1e-2);
}
