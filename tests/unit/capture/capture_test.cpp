// Capture below autograd through kiln's C++ dispatch mode, and functionalization of what it
// records. The first test pins LibTorch's internal c10::impl mode API: if an upgrade changes what
// reaches the mode, it fails with the op list it saw.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "kiln/internal/capture.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/passes.h"
#include "kiln/workloads.h"

using kiln::ir::InputRole;

namespace {

struct Recorded {
  kiln::ir::Graph graph;
  std::map<std::string, std::multiset<std::string>> ops;  // phase -> ops
  bool ok = false;
  std::string failure;
};

std::vector<kiln::KnownTensor> known_of(kiln::Workload& w) {
  std::vector<kiln::KnownTensor> known;
  for (auto& p : w.model->named_parameters()) known.push_back({p.value(), InputRole::Parameter, p.key()});
  for (auto& b : w.model->named_buffers()) known.push_back({b.value(), InputRole::Buffer, b.key()});
  known.push_back({w.input, InputRole::UserInput, "input.0", 0});
  known.push_back({w.target, InputRole::UserInput, "input.1", 1});
  return known;
}

Recorded record_workload(kiln::Workload& w) {
  auto step = [&, fn = kiln::workload_step(w)] { return fn({w.input, w.target}); };
  step();  // optimizer state exists from here on
  kiln::StepRecorder rec(known_of(w));
  rec.run(step);
  Recorded r;
  r.ok = rec.ok();
  r.failure = rec.failure().reason;
  r.graph = rec.graph();
  for (const auto& n : r.graph.nodes) r.ops[kiln::ir::to_string(n.phase)].insert(n.op);
  return r;
}

void expect_has(const Recorded& r, const std::string& phase, const std::vector<std::string>& ops) {
  auto it = r.ops.find(phase);
  ASSERT_NE(it, r.ops.end()) << "no " << phase << " nodes recorded";
  for (const auto& op : ops) EXPECT_TRUE(it->second.count(op)) << phase << " lacks " << op;
}

std::string joined(const kiln::ir::Graph& g) {
  std::string s;
  for (const auto& n : g.nodes) s += std::string(kiln::ir::to_string(n.phase)).substr(0, 1) + ":" + n.op + " ";
  return s;
}

}  // namespace

TEST(Capture, PinsLibTorchDispatchModeOpList) {
  torch::nn::Linear lin(3, 2);
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.1));
  auto x = at::randn({4, 3});
  {
    // A large bias keeps every ReLU open, so the gradient (and the update checked below) is never
    // zero; with random weights all eight pre-activations were negative about once in 256 runs.
    torch::NoGradGuard no_grad;
    lin->bias.fill_(10.0);
  }
  auto before = lin->weight.detach().clone();
  std::vector<kiln::KnownTensor> known = {{lin->weight, InputRole::Parameter, "weight"},
                                          {lin->bias, InputRole::Parameter, "bias"},
                                          {x, InputRole::UserInput, "input.0", 0}};
  kiln::StepRecorder rec(known);
  rec.run([&] {
    opt.zero_grad();
    auto loss = lin->forward(x).relu().sum();
    loss.backward();
    opt.step();
    return std::vector<at::Tensor>{loss.detach()};
  });
  ASSERT_TRUE(rec.ok()) << rec.failure().reason;
  // Exactly what LibTorch 2.11.0 hands the mode for this step, in order.
  const std::string expected =
      "f:aten::t f:aten::addmm f:aten::relu f:aten::sum f:aten::ones_like b:aten::expand "
      "b:aten::threshold_backward b:aten::t b:aten::mm b:aten::t b:aten::sum.dim_IntList b:aten::view "
      "b:aten::detach b:aten::t b:aten::detach o:aten::add_.Tensor o:aten::add_.Tensor o:aten::detach ";
  EXPECT_EQ(joined(rec.graph()), expected)
      << "LibTorch's dispatch-mode behaviour changed: review core/src/capture before upgrading";
  EXPECT_FALSE(at::equal(before, lin->weight.detach())) << "the capture step must really run";
  const auto nodes = rec.graph().nodes.size();
  (void)at::relu(x);  // after the pop nothing is recorded
  EXPECT_EQ(rec.graph().nodes.size(), nodes);
}

TEST(Capture, MlpGraphHoldsForwardBackwardAndOptimizer) {
  auto w = kiln::make_workload("mlp", {"cpu", 7, 32});
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  expect_has(r, "forward", {"aten::addmm", "aten::relu", "aten::_log_softmax", "aten::nll_loss_forward"});
  expect_has(r, "backward",
             {"aten::nll_loss_backward", "aten::mm", "aten::threshold_backward", "aten::sum.dim_IntList"});
  expect_has(r, "optimizer", {"aten::mul_.Scalar", "aten::add_.Tensor"});
  EXPECT_EQ(r.ops["optimizer"].count("aten::mul_.Scalar"), 6u) << "one momentum update per parameter";
}

TEST(Capture, CnnGraphHoldsForwardBackwardAndOptimizer) {
  auto w = kiln::make_workload("cnn", {"cpu", 7, 8});
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  expect_has(r, "forward", {"aten::convolution", "aten::native_batch_norm", "aten::mean.dim", "aten::addmm"});
  expect_has(r, "backward", {"aten::convolution_backward", "aten::native_batch_norm_backward"});
  expect_has(r, "optimizer", {"aten::mul_.Scalar", "aten::add_.Tensor"});
  int buffers = 0;
  for (const auto& in : r.graph.inputs) buffers += in.role == InputRole::Buffer;
  EXPECT_EQ(buffers, 9) << "running_mean, running_var, num_batches_tracked of three BatchNorms";
}

TEST(Capture, GptGraphHoldsForwardBackwardAndOptimizer) {
  auto w = kiln::make_workload("gpt", {"cpu", 7, 2});
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  expect_has(r, "forward",
             {"aten::embedding", "aten::native_layer_norm", "aten::gelu",
              "aten::_scaled_dot_product_flash_attention_for_cpu"});
  expect_has(r, "backward",
             {"aten::embedding_dense_backward", "aten::native_layer_norm_backward", "aten::gelu_backward",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward"});
  expect_has(r, "optimizer", {"aten::addcmul_", "aten::addcdiv_", "aten::sqrt", "aten::mul_.Scalar"});
}

TEST(Capture, ItemStopsRecordingAndNamesTheOp) {
  torch::nn::Linear lin(3, 2);
  auto x = at::randn({4, 3});
  kiln::StepRecorder rec({{lin->weight, InputRole::Parameter, "weight"}, {x, InputRole::UserInput, "input.0", 0}});
  float seen = 0;
  rec.run([&] {
    auto y = lin->forward(x);
    seen = y.sum().item<float>();
    return std::vector<at::Tensor>{(y * 2).sum()};
  });
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(rec.failure().op, "aten::_local_scalar_dense");
  EXPECT_NE(rec.failure().reason.find("aten::_local_scalar_dense"), std::string::npos) << rec.failure().reason;
  EXPECT_FLOAT_EQ(seen, lin->forward(x).sum().item<float>()) << "the step still ran to its end";
}

TEST(Capture, NonzeroStopsRecording) {
  auto x = at::randn({8});
  kiln::StepRecorder rec({{x, InputRole::UserInput, "input.0", 0}});
  rec.run([&] { return std::vector<at::Tensor>{x.nonzero()}; });
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(rec.failure().op, "aten::nonzero");
}

// x[mask] has as many elements as the mask has true values: not a shape a replay can keep. An
// integer index (a gather of fixed size) is recorded.
TEST(Capture, BooleanMaskIndexStopsRecordingAndIntegerIndexDoesNot) {
  auto x = at::randn({8});
  auto mask = x > 0;
  kiln::StepRecorder rec({{x, InputRole::UserInput, "input.0", 0}, {mask, InputRole::UserInput, "input.1", 1}});
  rec.run([&] { return std::vector<at::Tensor>{x.index({mask}) * 2}; });
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(rec.failure().op, "aten::index.Tensor");
  EXPECT_NE(rec.failure().reason.find("boolean mask"), std::string::npos) << rec.failure().reason;
  auto idx = at::tensor(std::vector<int64_t>{3, 1, 4});
  kiln::StepRecorder ok({{x, InputRole::UserInput, "input.0", 0}, {idx, InputRole::UserInput, "input.1", 1}});
  ok.run([&] { return std::vector<at::Tensor>{x.index({idx}) * 2}; });
  EXPECT_TRUE(ok.ok()) << ok.failure().reason;
}

TEST(Functionalize, WritesThroughViewsBecomeScattersAndWriteBacks) {
  auto p = at::randn({4, 6});
  auto q = at::randn({6});
  const auto p0 = p.clone(), q0 = q.clone();
  kiln::StepRecorder rec({{p, InputRole::Parameter, "p"}, {q, InputRole::OptimizerState, "q"}});
  auto results = rec.run([&] {
    auto row = p.select(0, 1);  // a view of p
    row.mul_(3.0);              // written through the view
    q.add_(row);                // an in-place update of another input
    auto s = (p * 2).sum();     // reads p after the write
    p.t().add_(1.0);            // a write through another view
    return std::vector<at::Tensor>{s};
  });
  ASSERT_TRUE(rec.ok()) << rec.failure().reason;
  rec.add_output(rec.value_of(results[0]), "result.0");
  auto g = rec.graph();
  kiln::functionalize(g);
  int writebacks = 0;
  for (const auto& n : g.nodes)
    EXPECT_FALSE(!n.op.empty() && (n.op.back() == '_' || n.op.find("_.") != std::string::npos))
        << "in-place op left: " << n.op;
  for (const auto& o : g.outputs) writebacks += o.role == kiln::ir::OutputRole::WriteBack;
  EXPECT_EQ(writebacks, 2);
  // Replay the pure graph on the original values: it must reproduce the eager results.
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) env[g.inputs[i].value] = rec.input_tensors()[i];
  env[g.inputs[0].value] = p0.clone();
  env[g.inputs[1].value] = q0.clone();
  const auto p_in = env[g.inputs[0].value];
  kiln::EagerExecutor(g).run(env);
  for (const auto& o : g.outputs) {
    if (o.role == kiln::ir::OutputRole::Result) EXPECT_TRUE(at::allclose(env[o.value], results[0]));
    else if (g.inputs[o.target].name == "p") EXPECT_TRUE(at::allclose(env[o.value], p));
    else EXPECT_TRUE(at::allclose(env[o.value], q));
  }
  EXPECT_TRUE(at::equal(p_in, p0)) << "the pure graph must not write its inputs";
}

TEST(Functionalize, BatchNormRunningStatsBecomeWriteBacks) {
  auto w = kiln::make_workload("cnn", {"cpu", 3, 4});
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  kiln::functionalize(r.graph);
  std::set<std::string> written;
  for (const auto& o : r.graph.outputs)
    if (o.role == kiln::ir::OutputRole::WriteBack) written.insert(r.graph.inputs[o.target].name);
  for (const auto* name : {"1.running_mean", "1.running_var", "1.num_batches_tracked", "0.weight", "11.bias"})
    EXPECT_TRUE(written.count(name)) << name << " is not written back";
  for (const auto& n : r.graph.nodes) EXPECT_NE(n.op, "aten::native_batch_norm") << "left unfunctionalized";
}

TEST(CaptureCuda, RecordsBackwardFromAutogradDeviceThreads) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the lead runs this on the GPU machine";
  auto w = kiln::make_workload("mlp", {"cuda", 5, 64});
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  expect_has(r, "forward", {"aten::addmm", "aten::relu"});
  expect_has(r, "backward", {"aten::mm", "aten::threshold_backward"});
  expect_has(r, "optimizer", {"aten::mul_.Scalar", "aten::add_.Tensor"});
  int cuda_backward = 0;
  for (const auto& n : r.graph.nodes)
    if (n.phase == kiln::ir::Phase::Backward)
      for (auto o : n.outputs) cuda_backward += o != kiln::ir::kNoValue && r.graph.value(o).meta.device.is_cuda();
  EXPECT_GT(cuda_backward, 10) << "backward results recorded on the CUDA device";
}

TEST(CaptureCuda, RecordsAutocastBf16Casts) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the lead runs this on the GPU machine";
  auto w = kiln::make_workload("gpt", {"cuda", 5, 2});
  ASSERT_TRUE(w.autocast_bf16);
  auto r = record_workload(w);
  ASSERT_TRUE(r.ok) << r.failure;
  int bf16_casts = 0, bf16_mm = 0;
  for (const auto& n : r.graph.nodes) {
    if (n.op == "aten::_to_copy" && n.outputs[0] != kiln::ir::kNoValue &&
        r.graph.value(n.outputs[0]).meta.dtype == at::kBFloat16)
      ++bf16_casts;
    if ((n.op == "aten::mm" || n.op == "aten::addmm") && r.graph.value(n.outputs[0]).meta.dtype == at::kBFloat16)
      ++bf16_mm;
  }
  EXPECT_GT(bf16_casts, 0);
  EXPECT_GT(bf16_mm, 0);
  expect_has(r, "optimizer", {"aten::addcdiv_"});
}
