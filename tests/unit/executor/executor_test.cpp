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

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include <stdlib.h>

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

// Dynamic shapes: steps whose inputs change size, through the eager executor, against LibTorch
// eager from the same weights and batches.
namespace {

struct DynamicRun {
  kiln::StepStats stats;
  int after_second_capture_eager = 0;  // steps that ran eagerly after the family's second capture
};

// `lengths[s]` (the gpt sequence length, or the batch size with `vary_batch`) at step s; kiln's
// results and parameters compared with LibTorch eager's within `tol` (0: bit for bit).
DynamicRun run_dynamic(const std::string& name, const std::vector<int64_t>& lengths, kiln::TrainingArguments args,
                       double tol, bool vary_batch, std::vector<std::pair<size_t, int64_t>> mark = {},
                       std::function<void(size_t)> after_step = {}) {
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const int64_t full_batch = vary_batch ? *std::max_element(lengths.begin(), lengths.end()) : 0;
  auto ref = kiln::make_workload(name, {"cpu", seed, full_batch});
  auto w = kiln::make_workload(name, {"cpu", seed, full_batch});
  auto ref_step = kiln::workload_step(ref);
  auto step = kiln::compile_step(kiln::workload_step(w), {{w.model}, {w.optimizer.get()}}, args);
  for (const auto& [input, dim] : mark) step.mark_dynamic(input, dim);
  DynamicRun r;
  int captures_seen = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    // Fresh random batches every step, so that a plan reading a stale input would show.
    const at::Tensor x = vary_batch ? ref.input.narrow(0, 0, lengths[s]) : ref.input.narrow(1, 0, lengths[s]);
    const at::Tensor y = vary_batch ? ref.target.narrow(0, 0, lengths[s]) : ref.target.narrow(1, 0, lengths[s]);
    const at::Tensor xi = x.is_floating_point() ? at::randn_like(x) : at::randint_like(x, 0, 64);
    const at::Tensor yi =
        y.is_floating_point() ? at::randn_like(y) : (name == "gpt" ? at::randint_like(y, 0, 64) : y.clone());
    auto want = ref_step({xi, yi})[0];
    auto got = step({xi.clone(), yi.clone()})[0];
    EXPECT_LE(rel_err(got, want), tol) << name << " loss at step " << s << " (size " << lengths[s] << ")";
    if (captures_seen >= 2 && !step.last_step_compiled()) ++r.after_second_capture_eager;
    captures_seen = step.stats().compiles;
    if (after_step) after_step(s);
  }
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i)
    EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), tol) << name << " parameter " << pr[i].key();
  r.stats = step.stats();
  return r;
}

std::vector<int64_t> random_sizes(size_t steps, int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (size_t s = 0; s < steps; ++s) v.push_back(at::randint(lo, hi + 1, {1}).item<int64_t>());
  return v;
}

}  // namespace

TEST(DynamicShapes, GptOverManyLengthsCompilesTwiceAndMatchesEagerBitForBit) {
  auto lengths = random_sizes(14, 8, 64);
  lengths[1] = 20, lengths[2] = 33;  // the second distinct shape comes at the third step
  const auto r = run_dynamic("gpt", lengths, compile_args(), 0.0, false);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.after_second_capture_eager, 0) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.eager_steps, 3);
  std::set<int64_t> planned(lengths.begin() + 3, lengths.end());
  planned.erase(20), planned.erase(33);
  EXPECT_EQ(r.stats.shape_specialisations, static_cast<int>(planned.size()));
  EXPECT_EQ(r.stats.dynamic_dims, std::vector<std::string>{"input 0 dim 1"});
  EXPECT_EQ(r.stats.last_recompile_reason,
            "input 0 dim 1 changed 20 -> 33, input 1 dim 1 changed 20 -> 33: compiling with them symbolic");
}

TEST(DynamicShapes, AShortLastBatchCompilesTwiceAndTheNextEpochRunsCompiled) {
  // Two epochs of 50 examples in batches of 16: 16, 16, 16, 2 each.
  std::vector<int64_t> batches = {16, 16, 16, 2, 16, 16, 16, 2};
  // Size 2 is the smallest a symbol may take; a last batch of 1 stays specialised (its own plan).
  const auto r = run_dynamic("mlp", batches, compile_args(), 0.0, true);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.compiled_steps, 5);  // all but the warm-up and the two captures
  EXPECT_EQ(r.stats.dynamic_dims, std::vector<std::string>{"input 0 dim 0"});
}

TEST(DynamicShapes, ThirdAndFourthShapesArePlannedWithoutACapture) {
  const auto r = run_dynamic("cnn", {8, 8, 12, 5, 9, 5, 12, 9}, compile_args(), 0.0, true);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.shape_specialisations, 2);  // 5 and 9
  EXPECT_EQ(r.stats.compiled_steps, 5);
}

TEST(DynamicShapes, DynamicFalseCompilesEveryShape) {
  auto args = compile_args();
  args.runtime.dynamic = "false";
  const auto r = run_dynamic("mlp", {8, 8, 12, 5, 9, 5}, args, 0.0, true);
  EXPECT_EQ(r.stats.compiles, 4) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.shape_specialisations, 0);
  EXPECT_TRUE(r.stats.dynamic_dims.empty());
  EXPECT_EQ(r.stats.last_recompile_reason,
            "input 0 dim 0 changed 8 -> 9, input 1 dim 0 changed 8 -> 9: compiled for this shape (dynamic = false)");
}

TEST(DynamicShapes, AMarkedDimensionIsSymbolicEvenWithDynamicFalse) {
  auto args = compile_args();
  args.runtime.dynamic = "false";
  args.runtime.mark_dynamic = {"1:0"};
  const auto r = run_dynamic("mlp", {8, 8, 12, 5, 9, 5}, args, 0.0, true, {{0, 0}});
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.shape_specialisations, 2);
}

TEST(DynamicShapes, ASizeOfOneIsPlannedFromItsOwnCapture) {
  const auto r = run_dynamic("mlp", {8, 8, 12, 1, 9, 1}, compile_args(), 0.0, true);
  EXPECT_EQ(r.stats.compiles, 3) << r.stats.last_fallback;  // 8, 12, and 1 (specialised)
  EXPECT_EQ(r.stats.shape_specialisations, 1);              // 9
}

TEST(DynamicShapes, TheShapeCacheDropsTheLeastRecentlyUsedPlan) {
  auto args = compile_args();
  args.runtime.dynamic_shape_cache = 2;
  const auto r = run_dynamic("mlp", {8, 8, 12, 5, 6, 7, 5, 6, 7}, args, 0.0, true);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.shape_specialisations, 6);  // 5, 6, 7 each planned twice: a cache of two
  EXPECT_EQ(r.stats.shape_evictions, 4);
  EXPECT_EQ(r.stats.compiled_steps, 6);
}

// On inductor, a length after the second compiles no C++: the second shape's kernels take their
// numbers as arguments, and every later length runs that library.
TEST(DynamicShapes, GptOnInductorCompilesNoKernelsForLaterLengths) {
  char tmpl[] = "/tmp/kiln-dynamic-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string cache = tmpl;
  auto libraries = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(cache)) n += e.path().extension() == ".so";
    return n;
  };
  auto args = compile_args();
  args.torch_compile_backend = "inductor";
  args.runtime.cache_dir = cache;
  std::vector<int64_t> lengths = {24, 24, 40, 40};
  for (int64_t t : random_sizes(8, 9, 63)) lengths.push_back(t == 24 || t == 40 ? t + 1 : t);
  size_t after_second = 0;
  const auto r = run_dynamic("gpt", lengths, args, 1e-3, false, {}, [&](size_t s) {
    if (s == 3) after_second = libraries();
  });
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.after_second_capture_eager, 0) << r.stats.last_fallback;
  EXPECT_GT(after_second, 0u);
  EXPECT_EQ(libraries(), after_second) << "a later length compiled kernels";
  // inductor has symbolic shapes (plugin ABI 2.4): the last plan made, for a length neither
  // capture saw, compiled no group; each runs the executable its group was compiled into for
  // every size at the second length.
  size_t compiled = 0, reused = 0;
  for (const auto& g : r.stats.groups) compiled += g.compiled, reused += g.reused;
  EXPECT_GT(compiled, 0u);
  EXPECT_EQ(reused, compiled) << "groups compiled again at a later length";
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(cache);
}
