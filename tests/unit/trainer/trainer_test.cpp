// kiln::Trainer and compile_step: fallback, fullgraph, guards and recompilation, run-time
// optimizer scalars. Every test checks the numbers against LibTorch eager too: nothing is lost.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <cstdlib>
#include <functional>

#include "kiln/compile.h"
#include "kiln/precision.h"
#include "kiln/trainer.h"
#include "log_capture.h"

namespace nn = torch::nn;

namespace {

struct Setup {
  nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

Setup make(uint64_t seed, bool adamw = false) {
  torch::manual_seed(seed);
  Setup s{nn::Sequential(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 5)), nullptr};
  if (adamw) s.opt = std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1e-2));
  else s.opt = std::make_unique<torch::optim::SGD>(s.net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return s;
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& y) { return nn::functional::cross_entropy(out, y); }

at::Tensor eager_step(Setup& s, const at::Tensor& x, const at::Tensor& y) {
  s.opt->zero_grad();
  auto loss = ce(s.net->forward(x), y);
  loss.backward();
  s.opt->step();
  return loss.detach();
}

kiln::TrainingArguments compile_args() {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  return a;
}

uint64_t fresh_seed() { return static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>()); }

void expect_same_params(Setup& a, Setup& b) {
  auto pa = a.net->parameters(), pb = b.net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::allclose(pa[i], pb[i], 1e-5, 1e-6)) << "parameter " << i;
}

// compile_args() with the test backend whose execute fails on a chosen call (fails_execute_plugin.cpp).
kiln::TrainingArguments fails_execute_args() {
  auto args = compile_args();
  args.torch_compile_backend = "fails_execute";
  args.runtime.plugin_dirs = {KILN_FAILS_EXECUTE_PLUGIN_DIR};
  return args;
}

// One step of `trainer` and of the eager reference on the same fresh batch: the losses and then the
// parameters agree.
void step_like_eager(kiln::Trainer& trainer, Setup& ref, Setup& s, int i) {
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  auto got = trainer.step(x, y);
  auto want = eager_step(ref, x, y);
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "step " << i;
  expect_same_params(ref, s);
}

// How many warnings contain every one of `parts`.
int warnings_with(const LogCapture& logs, const std::vector<std::string>& parts) {
  int n = 0;
  for (const auto& w : logs.warnings())
    n += std::all_of(parts.begin(), parts.end(), [&](const std::string& p) { return w.find(p) != std::string::npos; });
  return n;
}

}  // namespace

TEST(Trainer, ItemMidStepRunsEagerlyWithOneWarningNamingTheOp) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  // A forward that reads a tensor's value on the host in the middle of the step.
  auto fwd = [](nn::Sequential& net) {
    return [&net](const at::Tensor& x) {
      auto h = net->forward(x);
      const float scale = h.abs().max().item<float>() > 0 ? 1.0f : 2.0f;
      return h * scale;
    };
  };
  LogCapture logs;
  kiln::Trainer trainer(s.net.ptr(), fwd(s.net), *s.opt, ce, compile_args());
  auto ref_fwd = fwd(ref.net);
  for (int i = 0; i < 6; ++i) {
    auto x = at::randn({8, 12});
    auto y = at::randint(0, 5, {8});
    auto got = trainer.step(x, y);
    ref.opt->zero_grad();
    auto want = ce(ref_fwd(x), y);
    want.backward();
    ref.opt->step();
    EXPECT_TRUE(at::allclose(got, want.detach())) << "step " << i;
    EXPECT_FALSE(trainer.compiled());
  }
  expect_same_params(ref, s);
  int mentions = 0;
  for (const auto& w : logs.warnings()) mentions += w.find("aten::_local_scalar_dense") != std::string::npos;
  EXPECT_EQ(mentions, 1) << "exactly one warning naming the op";
  EXPECT_EQ(trainer.stats().compiled_steps, 0);
  // Nothing compiled: the failed capture is counted as one, with no compile time.
  EXPECT_EQ(trainer.stats().compiles, 0);
  EXPECT_EQ(trainer.stats().failed_captures, 1);
  EXPECT_EQ(trainer.stats().last_compile_seconds, 0.0);
}

TEST(Trainer, ItemMidStepWithFullgraphIsAnError) {
  auto s = make(fresh_seed());
  auto args = compile_args();
  args.runtime.fullgraph = true;
  kiln::Trainer trainer(
      s.net.ptr(),
      [&](const at::Tensor& x) {
        auto h = s.net->forward(x);
        (void)h.sum().item<float>();
        return h;
      },
      *s.opt, ce, args);
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  trainer.step(x, y);  // the eager warm-up step
  try {
    trainer.step(x, y);
    FAIL() << "fullgraph must turn the capture failure into an error";
  } catch (const kiln::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::_local_scalar_dense"), std::string::npos) << e.what();
  }
}

TEST(Trainer, BatchSizeChangeRecompilesAndStaysExact) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, compile_args());
  for (int64_t batch : {8, 8, 8, 4, 4, 4, 8}) {
    auto x = at::randn({batch, 12});
    auto y = at::randint(0, 5, {batch});
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "batch " << batch;
  }
  EXPECT_EQ(trainer.stats().compiles, 2) << "one compile per batch size";
  EXPECT_TRUE(trainer.compiled()) << "back to the cached batch-8 step";
  EXPECT_EQ(trainer.stats().compiled_steps, 4);
  expect_same_params(ref, s);
}

TEST(Trainer, RecompileLimitHoldsThenRunsEagerly) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  auto args = compile_args();
  args.runtime.recompile_limit = 2;
  args.runtime.dynamic = "false";  // one plan per shape (dynamic shapes: DynamicShapes.* and below)
  LogCapture logs;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  for (int64_t batch : {3, 3, 4, 5, 6, 5, 3}) {
    auto x = at::randn({batch, 12});
    auto y = at::randint(0, 5, {batch});
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "batch " << batch;
    if (batch >= 5) {
      EXPECT_FALSE(trainer.compiled()) << "batch " << batch << " is past the limit";
    }
  }
  EXPECT_EQ(trainer.stats().compiles, 2);
  EXPECT_TRUE(trainer.compiled()) << "batch 3 was compiled before the limit";
  int mentions = 0;
  for (const auto& w : logs.warnings()) mentions += w.find("recompile_limit") != std::string::npos;
  EXPECT_EQ(mentions, 1);
  expect_same_params(ref, s);
}

// Whether resident memory follows what the process holds. AddressSanitizer's allocator keeps
// freed blocks in a quarantine (256 MiB) and caches each size class, so its builds (scripts/test
// --sanitize=address) grow by up to that whatever is freed: there the steps below run and are
// checked, their resident memory is not, and LeakSanitizer checks instead that nothing leaks.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kResidentMemoryIsChecked = false;
#else
constexpr bool kResidentMemoryIsChecked = true;
#endif

// This process's resident memory (/proc/self/statm), in MiB.
double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// A recompilation storm: a new batch size every step. kiln compiles recompile_limit signatures,
// warns once, then runs the new shapes eagerly: the compiled steps kept stay at the limit and the
// process's memory stops growing once they are made; every step's loss and the parameters are
// eager's.
TEST(Trainer, ARecompileStormStaysWithinTheLimitAndItsMemory) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  auto args = compile_args();
  args.runtime.recompile_limit = 4;
  args.runtime.dynamic = "false";
  LogCapture logs;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  double after_limit = 0;
  for (int64_t step = 0; step < 400; ++step) {
    const int64_t batch = 1 + step;  // never the same twice
    auto x = at::randn({batch, 12});
    auto y = at::randint(0, 5, {batch});
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    ASSERT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "step " << step;
    if (step == 49) after_limit = resident_mib();
  }
  const double grown = resident_mib() - after_limit;
  std::cout << "[storm] 400 steps, a new shape each: " << trainer.stats().compiles << " compiles, resident memory "
            << after_limit << " MiB after 50 steps, +" << grown << " MiB after 400\n";
  EXPECT_EQ(trainer.stats().compiles, 4);
  int mentions = 0;
  for (const auto& w : logs.warnings()) mentions += w.find("recompile_limit") != std::string::npos;
  EXPECT_EQ(mentions, 1);
  // The batches grow to 400 examples (25 KB of input): what stays is bounded by a few of them.
  if (kResidentMemoryIsChecked) {
    EXPECT_LT(grown, 8.0);
  }
  expect_same_params(ref, s);
}

// The same storm with dynamic shapes: the batch dimension is symbolic after the second shape, every
// later batch size is planned from the symbolic step and runs compiled, and the plans kept are
// bounded by dynamic_shape_cache (least recently used dropped), so memory stops growing once the
// cache is full.
TEST(Trainer, ADynamicStormRunsCompiledAndItsMemoryStaysBounded) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  auto args = compile_args();
  args.runtime.dynamic_shape_cache = 16;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  double full = 0;
  for (int64_t step = 0; step < 400; ++step) {
    const int64_t batch = 2 + step;  // never the same twice; 2 is the smallest a symbol takes
    auto x = at::randn({batch, 12});
    auto y = at::randint(0, 5, {batch});
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    // The default backend's generated kernels sum in their own order: over 400 steps of training
    // the two trajectories part by more than float32's 1e-5 now and then (1 run in 8 at step 281),
    // so this test, about plans and memory, holds them to the generated kernels' 1e-4.
    ASSERT_TRUE(at::allclose(got, want, 1e-4, 1e-6))
        << "step " << step << ": " << got.item<double>() << " vs " << want.item<double>();
    if (step >= 3) {
      ASSERT_TRUE(trainer.compiled()) << "step " << step << ": " << trainer.stats().last_fallback;
    }
    if (step == 99) full = resident_mib();
  }
  const double grown = resident_mib() - full;
  std::cout << "[dynamic storm] 400 steps, a new shape each: " << trainer.stats().compiles << " compiles, "
            << trainer.stats().shape_specialisations << " shapes planned, " << trainer.stats().shape_evictions
            << " dropped; resident memory " << full << " MiB after 100 steps, +" << grown << " MiB after 400\n";
  EXPECT_EQ(trainer.stats().compiles, 2);
  EXPECT_EQ(trainer.stats().shape_specialisations, 397);
  EXPECT_EQ(trainer.stats().shape_evictions, 397 - 16);
  if (kResidentMemoryIsChecked) {
    EXPECT_LT(grown, 8.0);
  }
  // By norm, and loosely: every step's loss was held to 1e-4 above (a wrong plan shows there at
  // once), but 400 steps of SGD with momentum carry the kernels' other summation order into the
  // weights; with the machine busy (thread counts change how reductions split) they ended 2.7e-3
  // apart by norm.
  auto pa = ref.net->parameters(), pb = s.net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const double rel = (pa[i] - pb[i]).norm().item<double>() / std::max(pa[i].norm().item<double>(), 1e-12);
    EXPECT_LT(rel, 1e-2) << "parameter " << i;
  }
}

// 10,000 compiled steps keep the host's memory flat: nothing a step allocates outlives it (the
// plan, the kernels and the buffers they reuse are made once).
TEST(Trainer, TenThousandCompiledStepsKeepHostMemoryFlat) {
  auto s = make(fresh_seed(), /*adamw=*/true);
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, compile_args());
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  double at_1000 = 0;
  for (int step = 1; step <= 10000; ++step) {
    trainer.step(x, y);
    if (step == 1000) at_1000 = resident_mib();
  }
  const double grown = resident_mib() - at_1000;
  std::cout << "[flat] 10,000 compiled steps (" << trainer.backend() << "): resident " << at_1000
            << " MiB at step 1,000, +" << grown << " MiB at step 10,000 (" << grown * (1 << 20) / 9000
            << " bytes a step)\n";
  EXPECT_EQ(trainer.stats().compiled_steps, 9998);
  EXPECT_EQ(trainer.stats().compiles, 1);
  // A leak of 100 bytes a step would be 0.86 MiB over these 9,000 steps.
  if (kResidentMemoryIsChecked) {
    EXPECT_LT(grown, 0.5);
  }
}

// The same on the GPU, with and without the whole-step CUDA graph: the device memory LibTorch's
// allocator holds for tensors is the same at step 10,000 as at step 1,000.
TEST(TrainerCuda, TenThousandCompiledStepsKeepDeviceMemoryFlat) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU on this machine: checked on the GPU machine";
  for (const char* mode : {"default", "reduce-overhead"}) {
    auto s = make(fresh_seed(), /*adamw=*/true);
    s.net->to(at::kCUDA);
    auto args = compile_args();
    args.torch_compile_mode = mode;
    kiln::Trainer trainer(
        s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
    auto x = at::randn({8, 12}, at::kCUDA);
    auto y = at::randint(0, 5, {8}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
    int64_t at_1000 = 0;
    double host_1000 = 0;
    for (int step = 1; step <= 10000; ++step) {
      trainer.step(x, y);
      if (step == 1000) {
        torch::cuda::synchronize();
        at_1000 = kiln::cuda_allocated_bytes(0);
        host_1000 = resident_mib();
      }
    }
    torch::cuda::synchronize();
    const int64_t grown = kiln::cuda_allocated_bytes(0) - at_1000;
    std::cout << "[flat] 10,000 compiled steps on CUDA (" << trainer.backend() << ", " << mode << "): allocated "
              << at_1000 << " bytes at step 1,000, " << grown << " more at step 10,000; host +"
              << resident_mib() - host_1000 << " MiB\n";
    EXPECT_EQ(trainer.stats().compiled_steps, 9998) << mode;
    EXPECT_EQ(grown, 0) << mode;
    if (kResidentMemoryIsChecked) {
      EXPECT_LT(resident_mib() - host_1000, 0.5) << mode;
    }
  }
}

TEST(Trainer, EvalModeIsANewSignature) {
  auto s = make(fresh_seed());
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, compile_args());
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  for (int i = 0; i < 3; ++i) trainer.step(x, y);
  EXPECT_EQ(trainer.stats().compiles, 1);
  s.net->eval();
  trainer.step(x, y);
  EXPECT_EQ(trainer.stats().compiles, 2);
}

TEST(Trainer, AdamWBiasCorrectionsBecomeRunTimeScalars) {
  const auto seed = fresh_seed();
  auto ref = make(seed, true), s = make(seed, true);
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, compile_args());
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  for (int i = 0; i < 8; ++i) {
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_EQ(trainer.stats().rebuilds, 0)
      << "planned once: the bias corrections were found to move right after the capture";
  EXPECT_EQ(trainer.stats().compiles, 1);
  const auto* g = trainer.compiled_step().compiled_graph();
  ASSERT_NE(g, nullptr);
  EXPECT_GT(g->scalar_inputs.size(), 0u);
  expect_same_params(ref, s);
  // The optimizer's own step count advanced with the compiled steps.
  for (const auto& [key, st] : s.opt->state()) EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*st).step(), 8);
}

// Ten AdamW steps through kiln's eager executor (ATen's own kernels, node by node) with the given
// environment switches set, each step's loss and the final parameters compared with LibTorch eager
// bit for bit; `inspect` then looks at the compiled graph.
static void expect_adamw_bit_for_bit_eager(const std::vector<const char*>& switches,
                                           const std::function<void(const kiln::ir::Graph&)>& inspect) {
  for (const char* v : switches) ::setenv(v, "1", 1);
  const auto seed = fresh_seed();
  auto ref = make(seed, true), s = make(seed, true);
  auto args = compile_args();
  args.torch_compile_backend = "eager";
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  for (int i = 0; i < 10; ++i) {
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::equal(got, want)) << "step " << i;
  }
  for (const char* v : switches) ::unsetenv(v);
  const auto* g = trainer.compiled_step().compiled_graph();
  ASSERT_NE(g, nullptr);
  inspect(*g);
  EXPECT_EQ(trainer.stats().compiled_steps, 8);
  auto pa = ref.net->parameters(), pb = s.net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i], pb[i])) << "parameter " << i;
}

// The machinery CUDA graphs use for run-time scalars (lifted into 0-dim tensors that are filled
// before every step), run on the CPU through KILN_LIFT_RUNTIME_SCALARS: the AdamW step stays bit
// for bit LibTorch eager's.
TEST(Trainer, LiftedRunTimeScalarsOnTheCpuAreBitForBitEager) {
  expect_adamw_bit_for_bit_eager({"KILN_LIFT_RUNTIME_SCALARS"}, [](const kiln::ir::Graph& g) {
    size_t lifted = 0;
    for (const auto& in : g.inputs) lifted += in.role == kiln::ir::InputRole::Scalar;
    EXPECT_GT(lifted, 0u) << "the bias corrections are 0-dim tensor inputs";
    for (const auto& n : g.nodes)
      for (const auto& a : n.args) EXPECT_LT(a.scalar_input, 0) << n.op << " still takes a host scalar";
  });
}

// KILN_BATCH_OPTIMIZER (experimental): AdamW's per-parameter updates folded into multi-tensor ops,
// with the run-time scalars lifted as for a CUDA graph. On the CPU ATen's multi-tensor ops loop over
// the single ops, so the step must stay bit for bit eager's; the CUDA kernels are checked on the GPU
// machine (scripts/device-check batch).
TEST(Trainer, BatchedOptimizerUpdatesAreBitForBitEager) {
  expect_adamw_bit_for_bit_eager({"KILN_BATCH_OPTIMIZER", "KILN_LIFT_RUNTIME_SCALARS"}, [](const kiln::ir::Graph& g) {
    size_t multi = 0;
    for (const auto& n : g.nodes) multi += n.op.rfind("aten::_foreach_", 0) == 0;
    EXPECT_GT(multi, 0u) << "the optimizer's updates are multi-tensor ops";
  });
}

TEST(Trainer, CompileOffRunsLibTorchEager) {
  auto s = make(fresh_seed());
  kiln::Trainer trainer(s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, {});
  for (int i = 0; i < 3; ++i) trainer.step(at::randn({4, 12}), at::randint(0, 5, {4}));
  EXPECT_EQ(trainer.stats().compiles, 0);
  EXPECT_EQ(trainer.stats().eager_steps, 3);
  // Not the eager backend (kiln's executor): no backend at all.
  EXPECT_EQ(trainer.backend(), "none");
}

// With no backend named, the hardware probe and the plugins decide, and the Trainer says why.
TEST(Trainer, AutoPicksInductorOnThisCpuAndSaysWhy) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA machine: the rule's CPU branch is tested on CPU machines";
  auto s = make(fresh_seed());
  auto args = compile_args();
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  EXPECT_EQ(trainer.backend(), "inductor");
  ASSERT_FALSE(trainer.backend_reasons().empty());
  EXPECT_NE(trainer.backend_reasons().back().find("chose inductor"), std::string::npos)
      << trainer.backend_reasons().back();
}

// A typo in the backend's name is a configuration error naming the file and line, with the
// nearest name; nothing runs.
TEST(Trainer, UnknownBackendFromTomlIsAnErrorWithFileLineAndSuggestion) {
  const std::string path = ::testing::TempDir() + "kiln_trainer_backend.toml";
  {
    std::ofstream f(path);
    f << "torch_compile = true\ntorch_compile_backend = \"indcutor\"\n";
  }
  auto args = kiln::TrainingArguments::from_toml(path);
  auto s = make(fresh_seed());
  try {
    kiln::Trainer trainer(
        s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
    FAIL() << "expected an error";
  } catch (const kiln::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ":2:25: unknown backend 'indcutor'; did you mean 'inductor'? Backends found: ", 0), 0u)
        << msg;
  }
}

// A backend that is installed but cannot run here is an error with the plugin's own reason.
TEST(Trainer, NamedBackendThatCannotRunHereIsAnErrorWithThePluginsReason) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "cudagraphs can run on this CUDA machine";
  auto s = make(fresh_seed());
  auto args = compile_args();
  args.torch_compile_backend = "cudagraphs";
  try {
    kiln::Trainer trainer(
        s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA device; none found"), std::string::npos) << e.what();
  }
}

// On the CPU a write-back from generated code hands the new storage to the parameter and the
// optimizer state instead of copying (adopt_storage): same TensorImpls, new data, the numbers of
// LibTorch eager.
TEST(CompiledStepMemory, WriteBacksAdoptTheNewStorageAndMatchEager) {
  const auto seed = fresh_seed();
  auto ref = make(seed, /*adamw=*/true), s = make(seed, /*adamw=*/true);
  auto args = compile_args();
  args.torch_compile_backend = "inductor";
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  const auto params = s.net->parameters();
  std::vector<const void*> impls;
  for (const auto& p : params) impls.push_back(p.unsafeGetTensorImpl());
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  std::vector<const void*> data_before;
  for (int i = 0; i < 8; ++i) {
    if (i == 3)
      for (const auto& p : params) data_before.push_back(p.data_ptr());
    auto got = trainer.step(x, y);
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_GT(trainer.stats().adopted_writebacks, 0) << "no write-back took its value's storage";
  const auto after = s.net->parameters();
  size_t moved = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].unsafeGetTensorImpl(), impls[i]) << "parameter " << i << " is still the same tensor";
    moved += after[i].data_ptr() != data_before[i];
  }
  EXPECT_GT(moved, 0u) << "no parameter's data moved";
  expect_same_params(ref, s);
  // The optimizer state is the optimizer's own tensors, with eager's values.
  for (size_t i = 0; i < params.size(); ++i) {
    auto& sa = static_cast<torch::optim::AdamWParamState&>(
        *ref.opt->state().at(ref.net->parameters()[i].unsafeGetTensorImpl()));
    auto& sb = static_cast<torch::optim::AdamWParamState&>(*s.opt->state().at(params[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(at::allclose(sa.exp_avg(), sb.exp_avg(), 1e-5, 1e-7)) << "exp_avg " << i;
    EXPECT_TRUE(at::allclose(sa.exp_avg_sq(), sb.exp_avg_sq(), 1e-5, 1e-9)) << "exp_avg_sq " << i;
  }
}

// A view of a parameter the user keeps (here .detach(), which shares the storage) must go on
// seeing the parameter's values: that write-back copies in place instead.
TEST(CompiledStepMemory, AnAliasTheUserKeepsSeesEveryUpdate) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  auto args = compile_args();
  args.torch_compile_backend = "inductor";
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  at::Tensor weight = s.net->parameters()[0];
  at::Tensor alias = weight.detach();
  const void* data = weight.data_ptr();
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  for (int i = 0; i < 6; ++i) {
    trainer.step(x, y);
    eager_step(ref, x, y);
  }
  EXPECT_GT(trainer.stats().compiled_steps, 0);
  EXPECT_EQ(weight.data_ptr(), data) << "the aliased parameter kept its storage";
  EXPECT_TRUE(at::equal(alias, weight)) << "the alias sees the updated weights";
  expect_same_params(ref, s);
}

// A plugin's execute fails in the middle of training (the first group of the first compiled step,
// before any write-back): the step runs eagerly in its place from untouched state, with one
// warning, and training goes on giving exactly what eager gives.
TEST(Trainer, AnExecuteThatFailsBeforeAnyWriteRunsTheStepEagerlyAndLosesNothing) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  const auto args = fails_execute_args();
  setenv("KILN_TEST_FAIL_EXECUTE_AT", ("trainer-" + std::to_string(seed) + ":1").c_str(), 1);
  LogCapture logs;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  for (int i = 0; i < 6; ++i) step_like_eager(trainer, ref, s, i);
  unsetenv("KILN_TEST_FAIL_EXECUTE_AT");
  EXPECT_FALSE(trainer.compiled());
  EXPECT_EQ(warnings_with(
                logs, {"injected failure in execute call 1", "before it changed any parameter", "nothing was lost"}),
            1);
  // The optimizers' momentum buffers too: one more step on each side must agree.
  step_like_eager(trainer, ref, s, 6);
}

// A plugin that crashes inside execute during training: the process cannot go on, but its last
// words name the plugin, its file, the call, the group and the step.
TEST(Trainer, APluginThatCrashesInExecuteIsNamedWithItsGroupAndStep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto seed = fresh_seed();
  EXPECT_EXIT(
      {
        setenv("KILN_TEST_CRASH_EXECUTE_AT", "1", 1);
        auto s = make(seed);
        kiln::Trainer trainer(
            s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, fails_execute_args());
        for (int i = 0; i < 4; ++i) trainer.step(at::randn({8, 12}), at::randint(0, 5, {8}));
        std::_Exit(0);
      },
      // (or AddressSanitizer's exit, when its handler is the one kiln's hands the signal on to)
      [](int status) {
        return (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
      },
      "kiln: fatal signal SIGSEGV \\(Segmentation fault\\) in plugin 'fails_execute' "
      "\\(.*/libkiln_fails_execute.so\\) during execute of group [0-9]+ at step [23];");
}

// A plugin that fails after the step has written into parameters (the step's last call to it comes
// after write-backs): kiln puts back what the step wrote, from the copy it takes before the first
// write whenever a compiled group runs after it, and runs the step eagerly. Nothing is lost.
TEST(Trainer, AnExecuteThatFailsAfterAWriteIsUndoneAndTheStepRunsEagerly) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  const auto args = fails_execute_args();
  const std::string count_file =
      (std::filesystem::temp_directory_path() / ("kiln-executes-" + std::to_string(seed))).string();
  setenv("KILN_TEST_EXECUTE_COUNT_FILE", count_file.c_str(), 1);
  setenv("KILN_TEST_FAIL_EXECUTE_AT", ("count-" + std::to_string(seed) + ":0").c_str(), 1);
  auto executes = [&] {
    long n = 0;
    std::ifstream(count_file) >> n;
    return n;
  };
  LogCapture logs;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  auto step = [&](int i) { step_like_eager(trainer, ref, s, i); };
  for (int i = 0; i < 3; ++i) step(i);  // eager, captured, compiled
  ASSERT_TRUE(trainer.compiled());
  const long before = executes();
  step(3);
  const long per_step = executes() - before;
  ASSERT_GT(per_step, 0);
  // The next step fails on its last call to the plugin.
  setenv("KILN_TEST_FAIL_EXECUTE_AT", ("after-" + std::to_string(seed) + ":" + std::to_string(per_step)).c_str(), 1);
  for (int i = 4; i < 7; ++i) step(i);
  unsetenv("KILN_TEST_FAIL_EXECUTE_AT");
  unsetenv("KILN_TEST_EXECUTE_COUNT_FILE");
  std::filesystem::remove(count_file);
  EXPECT_FALSE(trainer.compiled());
  EXPECT_EQ(warnings_with(logs, {"injected failure in execute call " + std::to_string(per_step),
                                 "after it had written into parameters or optimizer state, which kiln put back",
                                 "nothing was lost"}),
            1);
}

// With fullgraph the failure is an error, and the step changed nothing.
TEST(Trainer, WithFullgraphAnExecuteThatFailsBeforeAnyWriteIsAnErrorThatChangedNothing) {
  const auto seed = fresh_seed();
  auto ref = make(seed), s = make(seed);
  auto args = fails_execute_args();
  args.runtime.fullgraph = true;
  kiln::Trainer trainer(
      s.net.ptr(), [&](const at::Tensor& x) { return s.net->forward(x); }, *s.opt, ce, args);
  auto x = at::randn({8, 12});
  auto y = at::randint(0, 5, {8});
  for (int i = 0; i < 2; ++i) {  // the eager first step and the capture step
    trainer.step(x, y);
    eager_step(ref, x, y);
  }
  setenv("KILN_TEST_FAIL_EXECUTE_AT", ("fullgraph-" + std::to_string(seed) + ":1").c_str(), 1);
  try {
    trainer.step(x, y);
    ADD_FAILURE() << "the failed step did not throw";
  } catch (const kiln::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure in execute call 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("before it changed any parameter"), std::string::npos) << e.what();
  }
  unsetenv("KILN_TEST_FAIL_EXECUTE_AT");
  expect_same_params(ref, s);
  // The momentum buffers are those of two steps, as the reference's.
  auto pr = ref.net->parameters(), ps = s.net->parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto& a = static_cast<torch::optim::SGDParamState&>(*ref.opt->state().at(pr[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<torch::optim::SGDParamState&>(*s.opt->state().at(ps[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(at::allclose(a.momentum_buffer(), b.momentum_buffer(), 1e-5, 1e-6)) << "momentum of parameter " << i;
  }
}

// step_with_outputs: the same step as step() (the same losses and parameters as the eager loop),
// also returning the forward's output from before the update, compiled in a step of its own.
TEST(Trainer, StepWithOutputsReturnsTheForwardsOutputAndTrainsAsStepDoes) {
  const auto seed = fresh_seed();
  auto ref = make(seed, /*adamw=*/true), s = make(seed, /*adamw=*/true);
  kiln::Trainer trainer(s.net, *s.opt, ce, compile_args());
  double correct = 0;
  for (int i = 0; i < 6; ++i) {
    auto x = at::randn({8, 12});
    auto y = at::randint(0, 5, {8});
    const kiln::StepOutput got = trainer.step_with_outputs(x, y);
    at::Tensor want_out;
    {
      torch::NoGradGuard no_grad;
      want_out = ref.net->forward(x);
    }
    auto want = eager_step(ref, x, y);
    EXPECT_TRUE(at::allclose(got.loss, want, 1e-5, 1e-6)) << "step " << i;
    ASSERT_EQ(got.outputs.size(), 1u);
    EXPECT_FALSE(got.outputs[0].requires_grad());
    EXPECT_TRUE(at::allclose(got.outputs[0], want_out, 1e-5, 1e-6)) << "step " << i;
    correct += got.outputs[0].argmax(1).eq(y).sum().item<double>();  // training accuracy, as a user counts it
  }
  expect_same_params(ref, s);
  EXPECT_TRUE(trainer.compiled()) << trainer.stats().last_fallback;
  EXPECT_EQ(trainer.stats().compiled_steps, 4);
  EXPECT_GE(correct, 0);
}

namespace {
// A model whose forward returns a struct: logits and a penalty the loss adds.
struct Scored {
  at::Tensor logits, penalty;
};
std::vector<at::Tensor> output_tensors(const Scored& s) { return {s.logits, s.penalty}; }
// The same without output_tensors: it trains, and its predictions cannot be read.
struct Opaque {
  at::Tensor logits;
};

struct ScoringNetImpl : nn::Module {
  ScoringNetImpl() : a(register_module("a", nn::Linear(12, 16))), b(register_module("b", nn::Linear(16, 5))) {}
  Scored forward(const at::Tensor& x) {
    auto h = a->forward(x).relu();
    return {b->forward(h), h.pow(2).mean()};
  }
  nn::Linear a, b;
};
TORCH_MODULE(ScoringNet);
}  // namespace

// Forwards that return a tuple (a lambda) or a struct (a module's forward), with a loss that takes
// what they return: every loss and the parameters equal the eager loop's, the steps run compiled,
// step_with_outputs gives each returned tensor, and evaluation's predictions are the first. A
// struct kiln cannot read tensors from still trains; metrics that need predictions say why not.
TEST(Trainer, AForwardReturningATupleOrAStructTrainsWithALossThatTakesIt) {
  const auto seed = fresh_seed();
  {
    SCOPED_TRACE("a lambda returning a tuple");
    auto ref = make(seed), s = make(seed);
    auto forward = [](nn::Sequential& net) {
      return [&net](const std::vector<at::Tensor>& x) {
        auto logits = net->forward(x[0]);
        return std::make_tuple(logits, logits.pow(2).mean());
      };
    };
    auto loss = [](const std::tuple<at::Tensor, at::Tensor>& out, const at::Tensor& y) {
      return ce(std::get<0>(out), y) + 0.1 * std::get<1>(out);
    };
    kiln::Trainer trainer(s.net.ptr(), forward(s.net), *s.opt, loss, compile_args());
    auto ref_forward = forward(ref.net);
    for (int i = 0; i < 6; ++i) {
      auto x = at::randn({8, 12});
      auto y = at::randint(0, 5, {8});
      const kiln::StepOutput got = trainer.step_with_outputs(x, y);
      ref.opt->zero_grad();
      auto want = loss(ref_forward({x}), y);
      want.backward();
      ref.opt->step();
      EXPECT_TRUE(at::allclose(got.loss, want.detach(), 1e-5, 1e-6)) << "step " << i;
      ASSERT_EQ(got.outputs.size(), 2u);
      EXPECT_EQ(got.outputs[0].sizes(), (std::vector<int64_t>{8, 5}));
      EXPECT_EQ(got.outputs[1].dim(), 0);
    }
    expect_same_params(ref, s);
    EXPECT_TRUE(trainer.compiled()) << trainer.stats().last_fallback;
  }
  {
    SCOPED_TRACE("a module returning a struct");
    torch::manual_seed(seed);
    ScoringNet net;
    torch::manual_seed(seed);
    ScoringNet ref;
    torch::optim::SGD opt(net->parameters(), 0.05), ref_opt(ref->parameters(), 0.05);
    auto loss = [](const Scored& out, const at::Tensor& y) { return ce(out.logits, y) + 0.1 * out.penalty; };
    kiln::Trainer trainer(net, opt, loss, compile_args());
    for (int i = 0; i < 6; ++i) {
      auto x = at::randn({8, 12});
      auto y = at::randint(0, 5, {8});
      auto got = trainer.step(x, y);
      ref_opt.zero_grad();
      auto want = loss(ref->forward(x), y);
      want.backward();
      ref_opt.step();
      EXPECT_TRUE(at::allclose(got, want.detach(), 1e-5, 1e-6)) << "step " << i;
    }
    auto pa = ref->parameters(), pb = net->parameters();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::allclose(pa[i], pb[i], 1e-5, 1e-6)) << "parameter " << i;
    EXPECT_TRUE(trainer.compiled()) << trainer.stats().last_fallback;
    // Evaluation's predictions: the struct's first tensor, the logits.
    trainer.set_compute_metrics([](const kiln::EvalPrediction& p) {
      EXPECT_EQ(p.predictions.size(1), 5);
      return std::map<std::string, double>{
          {"accuracy", p.predictions.argmax(1).eq(p.label_ids).to(at::kDouble).mean().item<double>()}};
    });
    const auto m = trainer.evaluate(kiln::TensorDataset({at::randn({10, 12})}, at::randint(0, 5, {10})));
    EXPECT_TRUE(m.count("eval_accuracy"));
  }
  {
    SCOPED_TRACE("a struct without output_tensors");
    auto s = make(seed);
    auto forward = [&](const std::vector<at::Tensor>& x) { return Opaque{s.net->forward(x[0])}; };
    auto loss = [](const Opaque& out, const at::Tensor& y) { return ce(out.logits, y); };
    kiln::Trainer trainer(s.net.ptr(), forward, *s.opt, loss, compile_args());
    for (int i = 0; i < 4; ++i) trainer.step(at::randn({8, 12}), at::randint(0, 5, {8}));
    EXPECT_TRUE(trainer.compiled()) << trainer.stats().last_fallback;
    EXPECT_TRUE(trainer.step_with_outputs(at::randn({8, 12}), at::randint(0, 5, {8})).outputs.empty());
    trainer.set_compute_metrics([](const kiln::EvalPrediction&) { return std::map<std::string, double>{}; });
    try {
      trainer.evaluate(kiln::TensorDataset({at::randn({10, 12})}, at::randint(0, 5, {10})));
      ADD_FAILURE() << "metrics were computed without predictions";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("output_tensors"), std::string::npos) << e.what();
    }
  }
}

// bf16_is_native reads the hardware probe (a fake /proc/cpuinfo through KILN_SYSFS_ROOT here), and
// choose_precision applies a program's --precision to the arguments: auto follows the hardware
// unless the arguments already ask for bf16 or fp16, fp32 and bf16 are what they say.
TEST(Precision, Bf16WhereTheHardwareComputesItAndAsAProgramAsks) {
  const std::string root = ::testing::TempDir() + "kiln_precision_" + std::to_string(::getpid());
  auto cpu_with = [&](const std::string& flags) {
    std::filesystem::create_directories(root + "/proc");
    std::ofstream(root + "/proc/cpuinfo") << "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: Test CPU\n"
                                          << "flags\t\t: fpu sse2 avx2 avx512f " << flags << "\n\n";
  };
  ::setenv("KILN_SYSFS_ROOT", root.c_str(), 1);
  std::string why;
  cpu_with("avx512_bf16");
  EXPECT_TRUE(kiln::bf16_is_native(at::Device(at::kCPU), &why)) << why;
  EXPECT_EQ(why, "the CPU has AVX512-BF16");
  kiln::TrainingArguments a;
  EXPECT_EQ(kiln::choose_precision(a, "auto", at::Device(at::kCPU)), "bfloat16 autocast (the CPU has AVX512-BF16)");
  EXPECT_TRUE(a.bf16);
  cpu_with("avx512_vnni");
  EXPECT_FALSE(kiln::bf16_is_native(at::Device(at::kCPU), &why));
  EXPECT_EQ(why, "the CPU has neither AVX512-BF16 nor AMX-BF16");
  kiln::TrainingArguments b;
  EXPECT_EQ(kiln::choose_precision(b, "auto", at::Device(at::kCPU)),
            "float32 (the CPU has neither AVX512-BF16 nor AMX-BF16)");
  EXPECT_FALSE(b.bf16);
  EXPECT_EQ(kiln::choose_precision(b, "bf16", at::Device(at::kCPU)), "bfloat16 autocast (asked for)");
  EXPECT_TRUE(b.bf16);
  kiln::TrainingArguments c;
  c.fp16 = true;
  cpu_with("avx512_bf16");
  EXPECT_EQ(kiln::choose_precision(c, "auto", at::Device(at::kCPU)),
            "float16 autocast with loss scaling (the configuration's setting)");
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(kiln::choose_precision(c, "fp32", at::Device(at::kCPU)), "float32 (asked for)");
  EXPECT_FALSE(c.fp16);
  EXPECT_THROW(kiln::choose_precision(c, "half", at::Device(at::kCPU)), std::invalid_argument);
  // A tree's CUDA devices come from its PCI list; this one has none.
  EXPECT_FALSE(kiln::bf16_is_native(at::Device(at::kCUDA, 0), &why));
  EXPECT_NE(why.find("no CUDA device 0"), std::string::npos) << why;
  ::unsetenv("KILN_SYSFS_ROOT");
  std::filesystem::remove_all(root);
  // AutocastGuard: the region's type inside, the state before after it; float: no region.
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    kiln::AutocastGuard amp(at::kBFloat16, at::kCPU);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::mm(at::randn({2, 3}), at::randn({3, 2})).scalar_type(), at::kBFloat16);
    {
      kiln::AutocastGuard none(at::kFloat, at::kCPU);
      EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU)) << "a float guard changes nothing";
    }
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::mm(at::randn({2, 3}), at::randn({3, 2})).scalar_type(), at::kFloat);
}
