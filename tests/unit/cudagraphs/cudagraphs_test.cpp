// Whole-step CUDA graphs (docs/backends/cudagraphs.md).
//  - CPU: the cudagraphs plugin's descriptor, device-graph functions and availability; what
//    reduce-overhead does without a GPU.
//  - CUDA (skipped with the reason elsewhere): 20 steps of mlp, cnn and gpt (bf16 autocast) under
//    `inductor` + `reduce-overhead` and under the `cudagraphs` backend match LibTorch eager; a new
//    batch size records a second graph; a step with .item() falls back and says why; a step with
//    dropout is graphed and draws eager's masks; a backend failing, or CUDA running out of memory,
//    while the graph warms up or is recorded loses nothing.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <mutex>
#include <set>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/optim/adamw.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>

#if defined(KILN_TEST_HAVE_CUDA)
#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "kiln/internal/backend.h"
#include "kiln/compile.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/workloads.h"

namespace {

const char* kNoCuda = "no CUDA device: run on the GPU machine (scripts/device-check cudagraphs)";

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  auto o = out.detach().to(at::kDouble).cpu(), r = ref.detach().to(at::kDouble).cpu();
  const double denom = r.norm().item<double>();
  const double num = (o - r).norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return denom == 0 ? num : num / denom;
}

kiln::StepFn step_of(kiln::Workload& w, bool item_inside = false) {
  return [&w, item_inside](const std::vector<at::Tensor>& in) {
    w.optimizer->zero_grad();
    at::Tensor loss;
    if (w.autocast_bf16) {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      loss = w.loss_fn(w.forward(in[0]), in[1]);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    } else {
      loss = w.loss_fn(w.forward(in[0]), in[1]);
    }
    if (item_inside && loss.item<float>() > 1e9) loss = loss * 0;  // a host sync inside the step
    loss.backward();
    w.optimizer->step();
    return std::vector<at::Tensor>{loss.detach()};
  };
}

// These tests are about kiln's graphs of ATen's kernels, which match eager bit for bit with
// deterministic kernels: inductor's generated CUDA kernels are off here (they reorder float sums;
// tests/unit/inductor/inductor_cuda_test.cpp graphs them too, within 1e-4).
kiln::TrainingArguments args_for(const std::string& backend, const std::string& mode) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.torch_compile_backend = backend;
  a.torch_compile_mode = mode;
  a.runtime.plugin_dirs = {KILN_INTREE_PLUGIN_DIR};
  if (backend == "inductor") a.plugin_options["inductor"]["cuda"] = "false";
  return a;
}

std::shared_ptr<kiln::LoadedPlugin> load_cudagraphs() {
  kiln::TrainingArguments a;
  return kiln::PluginRegistry::load_file(std::string(KILN_INTREE_PLUGIN_DIR) + "/libkiln_cudagraphs.so",
                                         kiln::torch_host_services(a));
}

// `steps` graphed steps against LibTorch eager from the same weights and batch: the first step
// eager, the second the capture step, the third warms up and records the graph, the rest replay.
// Attention through the math backend (deterministic): cuDNN/flash attention backward accumulate
// with atomics, so two eager runs of gpt differ, and AdamW turns that noise into lr-sized updates of
// parameters whose true gradient is zero (the attention's key bias), far beyond 1e-2.
struct MathAttention {
  MathAttention() {
    auto& c = at::globalContext();
    c.setSDPUseFlash(false), c.setSDPUseMemEfficient(false), c.setSDPUseCuDNN(false), c.setSDPUseMath(true);
  }
  ~MathAttention() {
    auto& c = at::globalContext();
    c.setSDPUseFlash(true), c.setSDPUseMemEfficient(true), c.setSDPUseCuDNN(true);
  }
};

// cuBLAS's deterministic workspace setting must be in place before the first cuBLAS handle.
const bool kCublasDeterministic = setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0) == 0;

// Every kernel deterministic (as `kiln bench --check` on CUDA): math attention, deterministic
// algorithms (embedding backward without atomics), cuDNN deterministic. Then LibTorch eager
// matches itself bit for bit, and so must kiln's graphed step.
struct Deterministic {
  MathAttention math;
  Deterministic() {
    (void)kCublasDeterministic;
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  ~Deterministic() { at::globalContext().setDeterministicAlgorithms(false, false); }
};

// check_params false: only the losses are checked; parameter and gradient errors are printed.
void expect_graphed_parity(const std::string& name, const std::string& backend, const std::string& mode, double tol,
                           int64_t batch = 0, int steps = 20, bool check_params = true) {
  at::globalContext().setDeterministicCuDNN(true);
  const uint64_t seed = 4321;
  auto ref = kiln::make_workload(name, {"cuda", seed, batch});
  auto w = kiln::make_workload(name, {"cuda", seed, batch});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for(backend, mode));
  for (int s = 0; s < steps; ++s) {
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    ASSERT_TRUE(got.defined()) << "step " << s;
    EXPECT_LE(rel_err(got, want), tol) << name << " loss at step " << s << ": " << got.item<float>() << " vs "
                                       << want.item<float>();
  }
  const auto& st = step.stats();
  EXPECT_EQ(st.compiled_steps, steps - 2) << st.last_fallback;
  EXPECT_EQ(st.graphs_recorded, 1) << st.last_graph_skip;
  EXPECT_EQ(st.graph_replays, steps - 3) << st.last_graph_skip;
  EXPECT_EQ(st.last_graph_skip, "");
  std::printf("%s %s/%s: host-side optimizer probe %.3f ms per compiled step\n", name.c_str(), backend.c_str(),
              mode.c_str(), 1e3 * st.probe_seconds / std::max(1, st.compiled_steps));
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  ASSERT_EQ(pr.size(), pw.size());
  if (!check_params) {
    double worst = 0;
    std::string at;
    for (size_t i = 0; i < pr.size(); ++i)
      for (int g = 0; g < 2; ++g) {
        const double e =
            g ? rel_err(pw[i].value().grad(), pr[i].value().grad()) : rel_err(pw[i].value(), pr[i].value());
        if (e > worst) worst = e, at = pr[i].key() + (g ? ".grad" : "");
      }
    std::printf(
        "%s %s/%s: worst parameter/gradient rel err %.3e at %s (not checked: see the note above the gpt tests)\n",
        name.c_str(), backend.c_str(), mode.c_str(), worst, at.c_str());
    return;
  }
  for (size_t i = 0; i < pr.size(); ++i) {
    EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), tol) << name << " parameter " << pr[i].key();
    ASSERT_TRUE(pw[i].value().grad().defined()) << pr[i].key();
    EXPECT_LE(rel_err(pw[i].value().grad(), pr[i].value().grad()), tol) << name << " gradient " << pr[i].key();
  }
  auto br = ref.model->named_buffers(), bw = w.model->named_buffers();
  for (size_t i = 0; i < br.size(); ++i)
    EXPECT_LE(rel_err(bw[i].value(), br[i].value()), tol) << name << " buffer " << br[i].key();
}

}  // namespace

// ---- CPU ------------------------------------------------------------------------------------------

TEST(CudaGraphsPlugin, DescribesItselfAndSaysWhyItIsUnavailableWithoutAGpu) {
  auto p = load_cudagraphs();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->name(), "cudagraphs");
  EXPECT_EQ(p->abi_version(), "2." + std::to_string(KILN_ABI_VERSION_MINOR));
  EXPECT_EQ(kiln::device_kinds_string(p->device_kinds()), "cuda");
  EXPECT_TRUE(p->asks_whole_step_graph());
  EXPECT_TRUE(p->supports_mode(KILN_MODE_REDUCE_OVERHEAD));
#if defined(KILN_TEST_HAVE_CUDA)
  EXPECT_TRUE(p->provides_device_graphs());
#else
  EXPECT_FALSE(p->provides_device_graphs());
#endif
  auto a = p->available(kiln::basic_cpu_devices());  // the CPU alone
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.reason.find("CUDA"), std::string::npos) << a.reason;
  kiln::PluginDevice gpu;
  gpu.kind = KILN_DEVICE_CUDA;
  gpu.name = "NVIDIA H200";
  auto with_gpu = p->available(std::vector<kiln::PluginDevice>{gpu});
#if defined(KILN_TEST_HAVE_CUDA)
  EXPECT_TRUE(with_gpu.available) << with_gpu.reason;
  EXPECT_EQ(with_gpu.score, 100);
  EXPECT_NE(with_gpu.reason.find("NVIDIA H200"), std::string::npos) << with_gpu.reason;
#else
  EXPECT_FALSE(with_gpu.available);
  EXPECT_NE(with_gpu.reason.find("without the CUDA toolkit"), std::string::npos) << with_gpu.reason;
#endif
}

TEST(CudaGraphsPlugin, ClaimsNothingAndCompilesNothing) {
  auto p = load_cudagraphs();
  ASSERT_TRUE(p);
  KilnGraphView g{};
  g.struct_size = KILN_GRAPH_VIEW_STRUCT_SIZE;
  EXPECT_TRUE(p->claim(g).empty());
}

TEST(CudaGraphsPlugin, CaptureOnTheLegacyDefaultStreamIsAnErrorNotACrash) {
  auto p = load_cudagraphs();
  ASSERT_TRUE(p);
  if (!p->provides_device_graphs()) GTEST_SKIP() << "built without the CUDA toolkit";
  try {
    p->graph_capture_begin(DLDevice{kDLCUDA, 0}, nullptr);
    FAIL() << "capture on stream 0 accepted";
  } catch (const kiln::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("default stream"), std::string::npos) << e.what();
  }
}

TEST(CudaGraphsCpu, ReduceOverheadWithoutAGpuBehavesAsDefaultAndSaysSo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a CUDA device";
  auto r = kiln::resolve_backend(args_for("auto", "reduce-overhead"));
  EXPECT_FALSE(r.cuda_graphs);
  EXPECT_EQ(r.mode, KILN_MODE_DEFAULT);
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("behaves as 'default'"), std::string::npos) << notes;
}

// ---- CUDA -----------------------------------------------------------------------------------------

TEST(CudaGraphsCuda, MlpReduceOverhead20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_graphed_parity("mlp", "inductor", "reduce-overhead", 1e-5);
}
TEST(CudaGraphsCuda, CnnReduceOverhead20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_graphed_parity("cnn", "inductor", "reduce-overhead", 1e-5);
}
// gpt with deterministic kernels: losses, parameters and gradients within 1e-2 (in fact
// bit for bit). With LibTorch's default kernels kiln WITHOUT a graph already differs from eager by
// 6e-2 (math attention) to 7e-2 (flash/cuDNN attention) in some parameters or gradients after 20
// bf16 AdamW steps (the NoiseFloor tests below print it): embedding and attention backward
// accumulate with atomics, and AdamW turns the noise into lr-sized updates of parameters whose
// true gradient is ~0 (the key bias); those tests check the losses only.
TEST(CudaGraphsCuda, GptBf16ReduceOverhead20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  Deterministic deterministic;
  expect_graphed_parity("gpt", "inductor", "reduce-overhead", 1e-2);
}
TEST(CudaGraphsCuda, GptBf16ReduceOverheadFastAttention20StepLossesMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_graphed_parity("gpt", "inductor", "reduce-overhead", 1e-2, 0, 20, /*check_params=*/false);
}
TEST(CudaGraphsCuda, GptBf16KilnWithoutGraphsFastAttention20StepLossesMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  // The noise floor: kiln's default mode (no CUDA graph) against eager, same measure.
  at::globalContext().setDeterministicCuDNN(true);
  auto ref = kiln::make_workload("gpt", {"cuda", 4321, 0});
  auto w = kiln::make_workload("gpt", {"cuda", 4321, 0});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for("inductor", "default"));
  for (int s = 0; s < 20; ++s) {
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    EXPECT_LE(rel_err(got, want), 1e-2) << "step " << s;
  }
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  double worst = 0;
  std::string at;
  for (size_t i = 0; i < pr.size(); ++i)
    for (int g = 0; g < 2; ++g) {
      const double e = g ? rel_err(pw[i].value().grad(), pr[i].value().grad()) : rel_err(pw[i].value(), pr[i].value());
      if (e > worst) worst = e, at = pr[i].key() + (g ? ".grad" : "");
    }
  std::printf("gpt inductor/default (no graph): worst parameter/gradient rel err %.3e at %s\n", worst, at.c_str());
}
TEST(CudaGraphsCuda, GptBf16KilnWithoutGraphsMathAttentionNoiseFloor) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  MathAttention deterministic;
  at::globalContext().setDeterministicCuDNN(true);
  auto ref = kiln::make_workload("gpt", {"cuda", 4321, 0});
  auto w = kiln::make_workload("gpt", {"cuda", 4321, 0});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for("inductor", "default"));
  for (int s = 0; s < 20; ++s) {
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    EXPECT_LE(rel_err(got, want), 1e-2) << "step " << s;
  }
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  double worst = 0;
  std::string at;
  for (size_t i = 0; i < pr.size(); ++i)
    for (int g = 0; g < 2; ++g) {
      const double e = g ? rel_err(pw[i].value().grad(), pr[i].value().grad()) : rel_err(pw[i].value(), pr[i].value());
      if (e > worst) worst = e, at = pr[i].key() + (g ? ".grad" : "");
    }
  std::printf("gpt inductor/default (no graph, math attention): worst parameter/gradient rel err %.3e at %s\n", worst,
              at.c_str());
}
TEST(CudaGraphsCuda, MlpCudagraphsBackend20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_graphed_parity("mlp", "cudagraphs", "default", 1e-5);
}
TEST(CudaGraphsCuda, CnnCudagraphsBackend20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_graphed_parity("cnn", "cudagraphs", "default", 1e-5);
}
TEST(CudaGraphsCuda, GptBf16CudagraphsBackend20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  Deterministic deterministic;
  expect_graphed_parity("gpt", "cudagraphs", "reduce-overhead", 1e-2);
}

TEST(CudaGraphsCuda, ANewBatchSizeRecordsASecondGraph) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const uint64_t seed = 99;
  auto ref = kiln::make_workload("mlp", {"cuda", seed, 0});
  auto w = kiln::make_workload("mlp", {"cuda", seed, 0});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for("cudagraphs", "default"));
  const auto half_in = w.input.slice(0, 0, 128).contiguous(), half_t = w.target.slice(0, 0, 128).contiguous();
  for (int s = 0; s < 12; ++s) {
    const bool half = s >= 6;
    auto want = ref_step({half ? half_in : ref.input, half ? half_t : ref.target})[0];
    auto got = step({half ? half_in : w.input, half ? half_t : w.target})[0];
    EXPECT_LE(rel_err(got, want), 1e-5) << "step " << s;
  }
  const auto& st = step.stats();
  EXPECT_EQ(st.compiles, 2);
  EXPECT_EQ(st.graphs_recorded, 2) << st.last_graph_skip;
  // 6 steps of batch 256: eager, capture, record, 3 replays; 6 of batch 128: capture, record, 4.
  EXPECT_EQ(st.graph_replays, 7);
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), 1e-5) << pr[i].key();
}

// The graphs of a dynamic step's shapes record into one memory pool, as PyTorch's CUDA graph trees
// do: a shape recorded after a larger one finds its temporaries in what the larger one freed. A
// model whose activations dwarf its parameters (a batch of up to 16384 rows through 256-wide
// layers: 16 MB an activation, 0.5 MB of weights), at six batch sizes, largest first, then again in
// another order: every loss and the final weights as LibTorch eager computes them, one graph per
// size, every graph's memory in one private pool, and that pool not much larger than the first
// graph's (six pools of their own would hold about six times as much).
TEST(CudaGraphsCuda, TheGraphsOfADynamicStepShareOneMemoryPool) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
#if !defined(KILN_TEST_HAVE_CUDA)
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  namespace CA = c10::cuda::CUDACachingAllocator;
  auto make = [] {
    torch::manual_seed(5);
    torch::nn::Sequential m(torch::nn::Linear(256, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                            torch::nn::ReLU(), torch::nn::Linear(256, 1));
    m->to(at::kCUDA);
    return m;
  };
  auto ref = make(), net = make();
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto step_fn = [](torch::nn::Sequential& m, torch::optim::Optimizer& o) {
    return [&m, &o](const std::vector<at::Tensor>& in) {
      o.zero_grad();
      auto loss = torch::nn::functional::mse_loss(m->forward(in[0]), in[1]);
      loss.backward();
      o.step();
      return std::vector<at::Tensor>{loss.detach()};
    };
  };
  auto ref_step = step_fn(ref, ref_opt);
  auto args = args_for("cudagraphs", "default");
  args.runtime.dynamic = "true";
  auto step = kiln::compile_step(step_fn(net, opt), {{net.ptr()}, {&opt}}, args);
  // The private pools' segments made since this test began (earlier tests of this process may
  // hold pools of their own): how many pools, and their bytes.
  using PoolId = std::pair<unsigned long long, unsigned long long>;
  auto pool_segments = [] {
    std::vector<std::pair<PoolId, size_t>> out;
    for (const auto& seg : CA::snapshot({0, 0}, false).segments)
      if (seg.owner_private_pool_id.first != 0 || seg.owner_private_pool_id.second != 0)
        out.push_back({{seg.owner_private_pool_id.first, seg.owner_private_pool_id.second}, seg.total_size});
    return out;
  };
  CA::emptyCache();
  std::set<PoolId> earlier;
  for (const auto& [id, bytes] : pool_segments()) earlier.insert(id);
  auto pools = [&] {
    std::set<PoolId> ids;
    size_t bytes = 0;
    for (const auto& [id, b] : pool_segments())
      if (!earlier.count(id)) ids.insert(id), bytes += b;
    return std::make_pair(ids.size(), bytes);
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  const std::vector<int64_t> sizes = {16384, 14336, 12288, 10240, 8192, 6144};
  std::vector<int64_t> order;
  for (auto n : sizes) order.insert(order.end(), {n, n, n});  // eager or capture, record, replay
  for (int64_t n : {8192, 16384, 6144, 12288, 10240, 14336, 16384, 6144}) order.push_back(n);
  size_t first_graph_bytes = 0;
  for (size_t s = 0; s < order.size(); ++s) {
    const auto x = at::randn({order[s], 256}, gen).to(at::kCUDA), y = at::randn({order[s], 1}, gen).to(at::kCUDA);
    const auto want = ref_step({x, y})[0];
    const auto got = step({x, y})[0];
    EXPECT_LE(rel_err(got, want), 1e-5) << "step " << s << " at batch " << order[s];
    if (step.stats().graphs_recorded == 1 && first_graph_bytes == 0) first_graph_bytes = pools().second;
  }
  const auto& st = step.stats();
  EXPECT_EQ(st.graphs_recorded, static_cast<int64_t>(sizes.size())) << st.last_graph_skip;
  EXPECT_GE(st.graph_replays, 8) << st.last_graph_skip;
  const auto [n_pools, bytes] = pools();
  std::printf("graphs of %zu shapes: %zu private pool(s), %.1f MB; after the first graph: %.1f MB\n", sizes.size(),
              n_pools, bytes / 1048576.0, first_graph_bytes / 1048576.0);
  EXPECT_EQ(n_pools, 1u) << "the graphs of one step's shapes record into one pool";
  ASSERT_GT(first_graph_bytes, 0u);
  EXPECT_LE(bytes, 2 * first_graph_bytes)
      << "six graphs hold " << bytes << " bytes, the first alone " << first_graph_bytes;
  auto pr = ref->named_parameters(), pw = net->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), 1e-5) << pr[i].key();
#endif
}

// A training loop feeds a new batch every step. The graph copies it in (and the loss out, and
// AdamW's run-time scalars in) itself, from addresses each replay sets: batches that are fresh
// tensors, a strided view, the same tensor again, and a tensor changed in place after the step that
// read it; every loss stays the step's own after later replays. All as LibTorch eager computes it,
// and the same with the copies made around the launch instead (runtime.graph_copies = false).
static void expect_fresh_batches_like_eager(bool graph_copies) {
  const uint64_t seed = 2024;
  kiln::WorkloadOptions o{"cuda", seed, 64};
  o.optimizer = "adamw";
  auto ref = kiln::make_workload("mlp", o);
  auto w = kiln::make_workload("mlp", o);
  auto ref_step = step_of(ref);
  auto args = args_for("cudagraphs", "default");
  args.runtime.graph_copies = graph_copies;
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> got_losses, want_losses;
  at::Tensor reused = at::randn(w.input.sizes(), gen).to(at::kCUDA);
  const auto targets = w.target.clone();
  for (int s = 0; s < 14; ++s) {
    at::Tensor x;
    if (s % 4 == 1) {
      // A strided batch: the rows of a wider tensor, read through ATen's copy first.
      auto wide = at::randn({w.input.size(0), 2 * w.input.size(1)}, gen).to(at::kCUDA);
      x = wide.slice(1, 0, w.input.size(1));
      ASSERT_FALSE(x.is_contiguous());
    } else if (s % 4 == 2) {
      x = reused;  // the same tensor as the last such step, changed in place since
      reused.add_(0.5);
    } else {
      x = at::randn(w.input.sizes(), gen).to(at::kCUDA);
    }
    want_losses.push_back(ref_step({x, targets})[0]);
    got_losses.push_back(step({x, targets})[0]);
  }
  for (size_t s = 0; s < got_losses.size(); ++s)
    EXPECT_LE(rel_err(got_losses[s], want_losses[s]), 1e-5)
        << "step " << s << ": " << got_losses[s].item<float>() << " vs " << want_losses[s].item<float>();
  const auto& st = step.stats();
  EXPECT_GE(st.graphs_recorded, 1) << st.last_graph_skip;
  EXPECT_GE(st.graph_replays, 8) << st.last_graph_skip;
  // The batch and its targets, AdamW's scalars (one buffer per dtype), the loss.
  if (graph_copies) EXPECT_GE(st.graph_copies, 4);
  else EXPECT_EQ(st.graph_copies, 0);
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), 1e-5) << pr[i].key();
}

TEST(CudaGraphsCuda, FreshBatchesAreCopiedInsideTheGraphAsEagerReadsThem) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_fresh_batches_like_eager(true);
}

TEST(CudaGraphsCuda, FreshBatchesCopiedAroundTheGraphWhenSwitchedOff) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_fresh_batches_like_eager(false);
}

// mlp on CUDA under reduce-overhead with the failing relu backend (tests/unit/cudagraphs/
// fails_execute_cuda_plugin.cpp) next to LibTorch eager: from step 2 on (the warm-up and the
// recording) KILN_TEST_FAIL_EXECUTE_AT is `fail_at`. Six steps, every loss against eager's, then the
// parameters, then one more step (the momentum buffers) and the parameters again. Returns the stats.
kiln::StepStats steps_with_a_failing_backend(uint64_t seed, const std::string& fail_at) {
  Deterministic deterministic;
  auto ref = kiln::make_workload("mlp", {"cuda", seed, 64});
  auto w = kiln::make_workload("mlp", {"cuda", seed, 64});
  auto ref_step = step_of(ref);
  auto args = args_for("fails_execute_cuda", "reduce-overhead");
  args.runtime.plugin_dirs = {KILN_FAILS_EXECUTE_CUDA_PLUGIN_DIR, KILN_INTREE_PLUGIN_DIR};
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args);
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (int s = 0; s < 7; ++s) {
    // Steps 0 and 1: eager and the capture; step 2 warms the graph up and records it.
    if (s == 2) setenv("KILN_TEST_FAIL_EXECUTE_AT", fail_at.c_str(), 1);
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    EXPECT_LE(rel_err(got, want), 1e-6) << "step " << s;
    if (s == 5 || s == 6) {
      for (size_t i = 0; i < pr.size(); ++i)
        EXPECT_LE(rel_err(pw[i].value(), pr[i].value()), 1e-6) << pr[i].key() << " after step " << s;
    }
  }
  unsetenv("KILN_TEST_FAIL_EXECUTE_AT");
  return step.stats();
}

// A plugin whose execute fails while the whole-step graph warms up (the signature's first compiled
// step, run for real on the capture stream): the step is undone as outside graphs and runs eagerly,
// and training goes on giving exactly what eager gives: nothing lost, no graph.
TEST(CudaGraphsCuda, AnExecuteThatFailsWhileTheGraphWarmsUpRunsTheStepEagerlyAndLosesNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  // The warm-up's first execute fails.
  const auto st = steps_with_a_failing_backend(77, "warm-up-" + std::to_string(::getpid()) + ":1");
  EXPECT_EQ(st.graphs_recorded, 0);
  EXPECT_NE(st.last_fallback.find("injected failure in execute call 1"), std::string::npos) << st.last_fallback;
  EXPECT_NE(st.last_fallback.find("before it changed any parameter"), std::string::npos) << st.last_fallback;
}

// A plugin whose execute fails while the graph is recorded (the recording runs nothing on the
// device: the warm-up step before it has done the step's work). The graph is skipped with the
// plugin's message, that step's results are the warm-up's, and the later steps run compiled without
// a graph: every step as eager computes it.
TEST(CudaGraphsCuda, AnExecuteThatFailsWhileTheGraphIsRecordedSkipsTheGraphAndLosesNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  // One execute a relu (mlp: Linear, ReLU, Linear, ReLU, Linear); the warm-up runs both, then the
  // recording's first one fails.
  const int relus = 2;
  const auto st =
      steps_with_a_failing_backend(78, "record-" + std::to_string(::getpid()) + ":" + std::to_string(relus + 1));
  EXPECT_EQ(st.graphs_recorded, 0);
  EXPECT_EQ(st.compiled_steps, 5) << st.last_fallback;
  EXPECT_NE(st.last_graph_skip.find("injected failure in execute call " + std::to_string(relus + 1)), std::string::npos)
      << st.last_graph_skip;
}

#if defined(KILN_TEST_HAVE_CUDA)
// A real CUDA out-of-memory inside the recording of a whole-step graph, raised by LibTorch's own
// caching allocator (c10::OutOfMemoryError), as on a device with no room left for the graph.
//
// Once armed, the first ATen op that runs on this thread while its current stream captures (the
// recording's first op: a thread-local RecordFunction callback sees each op before it runs) limits
// the allocator (setMemoryFraction) to what it has reserved at that moment plus 1 MiB. The recording
// allocates from a private pool of its own, empty when it begins, and while a capture is underway
// the allocator frees no cached blocks to make room (PyTorch's "captures_underway" check); a new
// segment is 2 MiB at least, so the recording's first allocation fails. Limiting the allocator
// before the step would not do: the step that records first runs for real (the warm-up) on the
// capture stream, which cannot reuse the other streams' cached blocks; it would run against the
// limit itself (outside a capture the allocator frees cached blocks and retries, so it may fit or
// not) and leave the recording an unknown margin. A cudaMalloc shim (LD_PRELOAD) would fail
// allocations outside the recording too, and none that the allocator serves from its cache.
// The limit goes when the step returns (restore()), and with this object whatever happens.
class OutOfMemoryWhileRecording {
 public:
  explicit OutOfMemoryWhileRecording(c10::DeviceIndex device) : device_(device) {
    size_t free = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total_));
    fraction_before_ = c10::cuda::CUDACachingAllocator::getMemoryFraction(device_);
    if (!(fraction_before_ > 0 && fraction_before_ <= 1)) fraction_before_ = 1.0;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_op).scopes({at::RecordScope::FUNCTION}));
  }
  ~OutOfMemoryWhileRecording() {
    at::removeCallback(handle_);
    if (armed_ == this) armed_ = nullptr;
    try {
      restore();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "restoring the CUDA allocator's memory fraction: " << e.what();
    }
  }
  OutOfMemoryWhileRecording(const OutOfMemoryWhileRecording&) = delete;
  OutOfMemoryWhileRecording& operator=(const OutOfMemoryWhileRecording&) = delete;

  // The next op that runs on this thread while its current stream captures sets the limit.
  void arm() { armed_ = this; }
  void restore() {
    if (armed_ == this) armed_ = nullptr;
    if (!limited_) return;
    limited_ = false;
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction_before_, device_);
  }
  bool fired() const { return !op_.empty(); }
  const std::string& op() const { return op_; }  // the op the limit was set before
  const std::string& error() const { return error_; }
  int64_t reserved() const { return reserved_; }
  int64_t limit() const { return limit_; }

 private:
  static std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
    OutOfMemoryWhileRecording* self = armed_;
    if (!self) return nullptr;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(self->device_).stream(), &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (status != cudaStreamCaptureStatusActive) return nullptr;
    armed_ = nullptr;
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(self->device_);
      self->reserved_ = stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
      self->limit_ = self->reserved_ + (int64_t{1} << 20);
      // setMemoryFraction sets the device and asks CUDA for its memory (no stream work): relaxed, so
      // that nothing but the allocation can count against the capture.
      c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      c10::cuda::CUDACachingAllocator::setMemoryFraction(
          static_cast<double>(self->limit_) / static_cast<double>(self->total_), self->device_);
      self->limited_ = true;
      self->op_ = fn.name();
    } catch (const std::exception& e) {
      self->error_ = e.what();
    }
    return nullptr;
  }

  static inline OutOfMemoryWhileRecording* armed_ = nullptr;  // this thread's callback only
  c10::DeviceIndex device_;
  size_t total_ = 0;
  double fraction_before_ = 1.0;
  at::CallbackHandle handle_ = at::INVALID_CALLBACK_HANDLE;
  bool limited_ = false;
  std::string op_, error_;
  int64_t reserved_ = 0, limit_ = 0;
};

static int64_t allocator_ooms(c10::DeviceIndex device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).num_ooms;
}

// Every parameter, AdamW's moments and its step count: bit for bit.
static void expect_same_parameters_and_adamw_state(kiln::Workload& ref, kiln::Workload& w, int step) {
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  ASSERT_EQ(pr.size(), pw.size());
  for (size_t i = 0; i < pr.size(); ++i) {
    const std::string where = pr[i].key() + " after step " + std::to_string(step);
    EXPECT_TRUE(at::equal(pw[i].value(), pr[i].value())) << where;
    const auto r = ref.optimizer->state().find(pr[i].value().unsafeGetTensorImpl());
    const auto k = w.optimizer->state().find(pw[i].value().unsafeGetTensorImpl());
    ASSERT_TRUE(r != ref.optimizer->state().end()) << "no AdamW state in eager for " << where;
    ASSERT_TRUE(k != w.optimizer->state().end()) << "no AdamW state in kiln for " << where;
    const auto& sr = static_cast<const torch::optim::AdamWParamState&>(*r->second);
    const auto& sk = static_cast<const torch::optim::AdamWParamState&>(*k->second);
    EXPECT_EQ(sk.step(), sr.step()) << "AdamW step count of " << where;
    EXPECT_TRUE(at::equal(sk.exp_avg(), sr.exp_avg())) << "exp_avg of " << where;
    EXPECT_TRUE(at::equal(sk.exp_avg_sq(), sr.exp_avg_sq())) << "exp_avg_sq of " << where;
  }
}

// mlp with AdamW on CUDA (deterministic kernels) under `args`, next to LibTorch eager, with CUDA
// running out of memory while step 2 records the whole-step graph (step 0 eager, step 1 the
// capture, step 2 the warm-up, which runs the step for real, then the recording). Seven steps: every
// loss, where each leaves the CUDA generator, and from step 2 on every parameter and AdamW's state,
// bit for bit eager's; the injection really happened (the limit set inside the capture, the
// allocator counted an out-of-memory, the graph skipped saying so); the failed recording left no
// capture open and no CUDA error pending, and the allocator out of capture mode; the later steps ran
// compiled without a graph. dropout: the step draws a mask (recorded with at::cuda::CUDAGraph).
static void expect_an_oom_while_recording_loses_nothing(const std::string& what, const kiln::TrainingArguments& args,
                                                        uint64_t seed, bool dropout) {
  SCOPED_TRACE(what);
  Deterministic deterministic;
  unsetenv("KILN_TEST_FAIL_EXECUTE_AT");
  kiln::WorkloadOptions o{"cuda", seed, 64};
  o.optimizer = "adamw";
  auto ref = kiln::make_workload("mlp", o);
  auto w = kiln::make_workload("mlp", o);
  auto body = [dropout](kiln::Workload& m) -> kiln::StepFn {
    return [&m, dropout](const std::vector<at::Tensor>& in) {
      m.optimizer->zero_grad();
      auto h = m.forward(in[0]);
      if (dropout) h = at::dropout(h, 0.1, /*train=*/true);
      auto loss = m.loss_fn(h, in[1]);
      loss.backward();
      m.optimizer->step();
      return std::vector<at::Tensor>{loss.detach()};
    };
  };
  auto ref_step = body(ref);
  auto step = kiln::compile_step(body(w), {{w.model}, {w.optimizer.get()}}, args);
  const c10::DeviceIndex device = w.input.device().index();
  // One generator for both: each step of kiln starts where the eager step started.
  at::Generator gen = at::globalContext().defaultGenerator(w.input.device());
  auto rng_state = [&gen] {
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  };
  auto set_rng_state = [&gen](const at::Tensor& st) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(st);
  };
  OutOfMemoryWhileRecording oom(device);
  for (int s = 0; s < 7; ++s) {
    const at::Tensor before = rng_state();
    auto want = ref_step({ref.input, ref.target})[0];
    const at::Tensor after_eager = rng_state();
    set_rng_state(before);
    int64_t ooms_before = 0;
    if (s == 2) {
      ooms_before = allocator_ooms(device);
      oom.arm();
    }
    auto got = step({w.input, w.target})[0];
    if (s == 2) {
      oom.restore();
      ASSERT_TRUE(oom.fired()) << "no op ran while the graph was recorded" << (oom.error().empty() ? "" : ": ")
                               << oom.error() << " (" << step.stats().last_graph_skip << ")";
      std::printf("%s: allocator limited to %.1f MiB (%.1f MiB reserved) before %s in the recording\n", what.c_str(),
                  oom.limit() / 1048576.0, oom.reserved() / 1048576.0, oom.op().c_str());
      EXPECT_GT(allocator_ooms(device), ooms_before) << "LibTorch's allocator counted no out-of-memory";
      // A capture left open would fail the synchronize (and this thread's next cudaMalloc); an
      // allocator still allocating to the graph's pool would fail emptyCache's internal assert; an
      // error left pending would surface at the next kernel launch check.
      EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << cudaGetErrorString(cudaPeekAtLastError());
      EXPECT_NO_THROW(torch::cuda::synchronize());
      EXPECT_NO_THROW(c10::cuda::CUDACachingAllocator::emptyCache());
    }
    ASSERT_TRUE(got.defined()) << "step " << s;
    EXPECT_TRUE(at::equal(got, want)) << "loss at step " << s << ": " << got.item<float>() << " vs "
                                      << want.item<float>();
    EXPECT_TRUE(at::equal(rng_state(), after_eager)) << "the CUDA generator after step " << s;
    if (s >= 2) expect_same_parameters_and_adamw_state(ref, w, s);
  }
  const auto& st = step.stats();
  std::printf("%s: %s\n", what.c_str(), st.last_graph_skip.c_str());
  EXPECT_EQ(st.graphs_recorded, 0) << st.last_graph_skip;
  EXPECT_EQ(st.graph_replays, 0);
  EXPECT_EQ(st.compiled_steps, 5) << st.last_fallback;  // steps 2 to 6
  EXPECT_TRUE(step.last_step_compiled()) << st.last_fallback;
  EXPECT_NE(st.last_graph_skip.find("kiln: skipping cudagraphs due to out of memory in aten::"), std::string::npos)
      << st.last_graph_skip;
  EXPECT_NE(st.last_graph_skip.find("during capture (CUDA out of memory"), std::string::npos) << st.last_graph_skip;
}

// LibTorch's allocator reports the native caching allocator's pools and limits; the
// cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) has neither.
static bool native_cuda_allocator() { return c10::cuda::CUDACachingAllocator::get()->name() == "native"; }
#endif

// CUDA runs out of memory while the whole-step graph is recorded (a real c10::OutOfMemoryError from
// LibTorch's caching allocator, OutOfMemoryWhileRecording above): the same path as a backend failing
// there (a CaptureFailed, the capture ended, the graph's pool released), so the graph is skipped
// saying why, that step's results are the warm-up's, and the later steps run compiled without a
// graph: every loss, parameter and AdamW state as eager computes them. With kiln's eager executor
// inside the graph (the cudagraphs backend), and with a backend's groups inside it (the partitioned
// executor: `fails_execute_cuda`'s relu, failing nowhere, under reduce-overhead).
TEST(CudaGraphsCuda, CudaOutOfMemoryWhileTheGraphIsRecordedSkipsTheGraphAndLosesNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
#if !defined(KILN_TEST_HAVE_CUDA)
  GTEST_SKIP() << "built without the CUDA toolkit: no whole-step graphs to record";
#else
  if (!native_cuda_allocator())
    GTEST_SKIP() << "LibTorch's CUDA allocator is " << c10::cuda::CUDACachingAllocator::get()->name()
                 << ", not the native caching allocator that the injection limits";
  expect_an_oom_while_recording_loses_nothing("cudagraphs", args_for("cudagraphs", "default"), 91, false);
  auto args = args_for("fails_execute_cuda", "reduce-overhead");
  args.runtime.plugin_dirs = {KILN_FAILS_EXECUTE_CUDA_PLUGIN_DIR, KILN_INTREE_PLUGIN_DIR};
  expect_an_oom_while_recording_loses_nothing("fails_execute_cuda/reduce-overhead", args, 92, false);
#endif
}

// The same with dropout in the step: recorded through at::cuda::CUDAGraph with the CUDA generator
// registered, whose capture_end and pool release run after the out-of-memory. The recording draws
// nothing, so every step leaves the generator where the eager step does.
TEST(CudaGraphsCuda, CudaOutOfMemoryWhileAStepWithDropoutIsRecordedSkipsTheGraphAndLosesNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
#if !defined(KILN_TEST_HAVE_CUDA)
  GTEST_SKIP() << "built without the CUDA toolkit: no whole-step graphs to record";
#else
  if (!native_cuda_allocator())
    GTEST_SKIP() << "LibTorch's CUDA allocator is " << c10::cuda::CUDACachingAllocator::get()->name()
                 << ", not the native caching allocator that the injection limits";
  expect_an_oom_while_recording_loses_nothing("cudagraphs with dropout", args_for("cudagraphs", "default"), 93, true);
#endif
}

TEST(CudaGraphsCuda, AStepWithItemFallsBackAndSaysWhy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  auto w = kiln::make_workload("mlp", {"cuda", 7, 0});
  auto step = kiln::compile_step(step_of(w, /*item_inside=*/true), {{w.model}, {w.optimizer.get()}},
                                 args_for("cudagraphs", "default"));
  for (int s = 0; s < 4; ++s) step({w.input, w.target});
  const auto& st = step.stats();
  EXPECT_EQ(st.compiled_steps, 0);
  EXPECT_EQ(st.graphs_recorded, 0);
  EXPECT_NE(st.last_fallback.find("_local_scalar_dense"), std::string::npos) << st.last_fallback;
}

// Dropout draws from the CUDA generator. The graph is recorded with the generator registered (as
// PyTorch's CUDA graphs do), so every replay draws fresh masks: exactly the eager step's masks from
// the same generator state, step after step, across a torch::manual_seed between steps too.
static void expect_dropout_like_eager(const std::string& backend, const std::string& mode, bool graphed) {
  Deterministic deterministic;
  auto ref = kiln::make_workload("mlp", {"cuda", 11, 0});
  auto w = kiln::make_workload("mlp", {"cuda", 11, 0});
  auto body = [](kiln::Workload& m) {
    return [&m](const std::vector<at::Tensor>& in) {
      m.optimizer->zero_grad();
      auto h = at::dropout(m.forward(in[0]), 0.1, /*train=*/true);
      auto loss = m.loss_fn(h, in[1]);
      loss.backward();
      m.optimizer->step();
      return std::vector<at::Tensor>{loss.detach(), h.detach()};
    };
  };
  auto ref_step = body(ref);
  auto step = kiln::compile_step(body(w), {{w.model}, {w.optimizer.get()}}, args_for(backend, mode));
  at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0));
  at::Tensor previous_mask;
  for (int s = 0; s < 10; ++s) {
    if (s == 6) torch::manual_seed(1234);
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    auto want = ref_step({ref.input, ref.target});
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
    auto got = step({w.input, w.target});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(at::equal(got[0], want[0]))
        << "loss at step " << s << ": " << got[0].item<float>() << " vs " << want[0].item<float>();
    const auto mask = got[1] == 0;
    EXPECT_TRUE(at::equal(mask, want[1] == 0)) << "dropout mask at step " << s;
    if (previous_mask.defined()) {
      EXPECT_FALSE(at::equal(mask, previous_mask)) << "the same mask twice at step " << s;
    }
    previous_mask = mask;
  }
  const auto& st = step.stats();
  EXPECT_EQ(st.compiled_steps, 8) << st.last_fallback;
  EXPECT_EQ(st.graphs_recorded, graphed ? 1 : 0) << st.last_graph_skip;
  EXPECT_EQ(st.graph_replays, graphed ? 7 : 0) << st.last_graph_skip;
  EXPECT_EQ(st.last_graph_skip, "");
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_TRUE(at::equal(pw[i].value(), pr[i].value())) << pr[i].key();
}

TEST(CudaGraphsCuda, AStepWithDropoutIsGraphedAndDrawsEagersMasks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_dropout_like_eager("cudagraphs", "default", /*graphed=*/true);
  expect_dropout_like_eager("inductor", "reduce-overhead", /*graphed=*/true);
}

// native_dropout is functional already: without a graph the compiled step draws eager's masks too.
TEST(CudaGraphsCuda, AStepWithDropoutWithoutGraphsDrawsEagersMasks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_dropout_like_eager("eager", "default", /*graphed=*/false);
}

// A checkpoint loaded into the very model and optimizer a graphed step uses: LibTorch's load gives
// every parameter new memory (Tensor::set_) and the optimizer new state tensors. The recorded graph
// would read the old ones; kiln notices both before the next replay (the graph's addresses, the
// optimizer's tensors) and records again, and the losses stay eager's, bit for bit.
// load_optimizer false: only the model is loaded (SGD keeps its momentum tensors), so nothing but
// the parameters' memory tells the graph that it must be recorded again.
static void expect_checkpoint_followed(const std::string& optimizer, bool load_optimizer) {
  Deterministic deterministic;
  auto ref = kiln::make_workload("mlp", {"cuda", 21, 0, optimizer});
  auto w = kiln::make_workload("mlp", {"cuda", 21, 0, optimizer});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for("cudagraphs", "default"));
  std::string dir = ::testing::TempDir() + "kiln_graph_ckpt_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  const std::string model_path = dir + "/model.pt", opt_path = dir + "/opt.pt";
  for (int s = 0; s < 14; ++s) {
    if (s == 5) {
      torch::serialize::OutputArchive m, o;
      ref.model->save(m);
      ref.optimizer->save(o);
      m.save_to(model_path);
      o.save_to(opt_path);
    }
    if (s == 9)
      for (auto* x : {&ref, &w}) {
        torch::serialize::InputArchive m;
        m.load_from(model_path, at::Device(at::kCUDA, 0));
        x->model->load(m);
        if (load_optimizer) {
          torch::serialize::InputArchive o;
          o.load_from(opt_path, at::Device(at::kCUDA, 0));
          x->optimizer->load(o);
        }
      }
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    EXPECT_TRUE(at::equal(got, want)) << optimizer << " loss at step " << s << ": " << got.item<float>() << " vs "
                                      << want.item<float>();
  }
  const auto& st = step.stats();
  EXPECT_EQ(st.graphs_recorded, 2) << st.last_graph_skip;
  EXPECT_EQ(st.recaptures, load_optimizer ? 1 : 0);
  EXPECT_TRUE(step.last_step_compiled()) << st.last_fallback;
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_TRUE(at::equal(pw[i].value(), pr[i].value())) << pr[i].key();
  std::remove(model_path.c_str());
  std::remove(opt_path.c_str());
  ::rmdir(dir.c_str());
}

TEST(CudaGraphsCuda, ACheckpointLoadedMidTrainingIsFollowedByTheGraph) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_checkpoint_followed("adamw", /*load_optimizer=*/true);
  expect_checkpoint_followed("sgd", /*load_optimizer=*/false);
}

// Run-time scalars lifted into 0-dim device tensors (the machinery of graphed AdamW steps), here
// without a graph (KILN_LIFT_RUNTIME_SCALARS): with deterministic kernels the AdamW step must stay
// bit for bit LibTorch eager's. On a difference it says where it first appears: which tensor
// (parameter, gradient, exp_avg, exp_avg_sq), at which step, and one element's whole update.
TEST(CudaGraphsCuda, LiftedRunTimeScalarsAreBitForBitEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  Deterministic deterministic;
  ::setenv("KILN_LIFT_RUNTIME_SCALARS", "1", 1);
  const uint64_t seed = 2468;
  auto ref = kiln::make_workload("mlp", {"cuda", seed, 0, "adamw"});
  auto w = kiln::make_workload("mlp", {"cuda", seed, 0, "adamw"});
  auto ref_step = step_of(ref);
  auto step = kiln::compile_step(step_of(w), {{w.model}, {w.optimizer.get()}}, args_for("inductor", "default"));
  auto states = [](torch::optim::Optimizer& o, const at::Tensor& p) -> std::pair<at::Tensor, at::Tensor> {
    auto it = o.state().find(p.unsafeGetTensorImpl());
    if (it == o.state().end()) return {};
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    return {st.exp_avg(), st.exp_avg_sq()};
  };
  bool reported = false;
  for (int s = 0; s < 10 && !reported; ++s) {
    auto pr = ref.model->parameters(), pw = w.model->parameters();
    std::vector<at::Tensor> before;
    for (auto& p : pr) before.push_back(p.detach().clone());
    auto want = ref_step({ref.input, ref.target})[0];
    auto got = step({w.input, w.target})[0];
    EXPECT_TRUE(at::equal(got, want)) << "loss at step " << s + 1;
    for (size_t i = 0; i < pr.size() && !reported; ++i) {
      auto [mr, vr] = states(*ref.optimizer, pr[i]);
      auto [mw, vw] = states(*w.optimizer, pw[i]);
      const std::pair<const char*, std::pair<at::Tensor, at::Tensor>> pairs[] = {{"grad", {pr[i].grad(), pw[i].grad()}},
                                                                                 {"exp_avg", {mr, mw}},
                                                                                 {"exp_avg_sq", {vr, vw}},
                                                                                 {"param", {pr[i], pw[i]}}};
      for (const auto& [what, t] : pairs) {
        if (!t.first.defined() || !t.second.defined() || at::equal(t.first, t.second)) continue;
        const auto diff = t.first.ne(t.second).flatten();
        const int64_t k = diff.nonzero()[0][0].item<int64_t>();
        auto at_k = [&](const at::Tensor& x) { return x.detach().flatten()[k].item<double>(); };
        std::printf("first difference: step %d, parameter %zu, %s: %lld of %lld elements; element %lld:\n", s + 1, i,
                    what, static_cast<long long>(diff.sum().item<int64_t>()), static_cast<long long>(diff.numel()),
                    static_cast<long long>(k));
        std::printf(
            "  param before %.9g\n  grad   eager %.9g kiln %.9g\n  m      eager %.9g kiln %.9g\n"
            "  v      eager %.9g kiln %.9g\n  param  eager %.9g kiln %.9g\n",
            at_k(before[i]), at_k(pr[i].grad()), at_k(pw[i].grad()), at_k(mr), at_k(mw), at_k(vr), at_k(vw),
            at_k(pr[i]), at_k(pw[i]));
        ADD_FAILURE() << "step " << s + 1 << ": parameter " << i << " " << what << " differs";
        reported = true;
        break;
      }
    }
  }
  ::unsetenv("KILN_LIFT_RUNTIME_SCALARS");
  if (const auto* g = step.compiled_graph()) {
    const std::string text = kiln::ir::print(*g);
    size_t lines = 0;
    for (size_t a = 0, b; a < text.size() && lines < 400; a = b + 1, ++lines) {
      b = text.find('\n', a);
      if (b == std::string::npos) b = text.size();
      const std::string line = text.substr(a, b - a);
      if (line.find("scalar") != std::string::npos || line.find("addc") != std::string::npos ||
          line.find("sqrt") != std::string::npos || line.find("div") != std::string::npos ||
          line.find("mul") != std::string::npos || line.find("add") != std::string::npos)
        std::printf("  %s\n", line.c_str());
    }
  }
}
