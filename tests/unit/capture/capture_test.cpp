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
#include "kiln/internal/ir_text.h"
#include "kiln/internal/shape_unify.h"
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
  kiln::StepRecorder rec({{lin->weight, InputRole::Parameter, "fc.weight"}, {x, InputRole::UserInput, "input.0", 0}});
  float seen = 0;
  rec.run([&] {
    auto y = lin->forward(x);
    seen = y.sum().item<float>();
    return std::vector<at::Tensor>{(y * 2).sum()};
  });
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(rec.failure().op, "aten::_local_scalar_dense");
  EXPECT_NE(rec.failure().reason.find("aten::_local_scalar_dense"), std::string::npos) << rec.failure().reason;
  // The tensor read is named by the op that made it and the module of the nearest parameter.
  EXPECT_NE(rec.failure().reason.find("of aten::sum in module fc (after parameter fc.weight)"), std::string::npos)
      << rec.failure().reason;
  EXPECT_FLOAT_EQ(seen, lin->forward(x).sum().item<float>()) << "the step still ran to its end";
}

TEST(Capture, NonzeroStopsRecording) {
  auto x = at::randn({8});
  kiln::StepRecorder rec({{x, InputRole::UserInput, "input.0", 0}});
  rec.run([&] { return std::vector<at::Tensor>{x.nonzero()}; });
  EXPECT_FALSE(rec.ok());
  EXPECT_EQ(rec.failure().op, "aten::nonzero");
  EXPECT_NE(rec.failure().reason.find("aten::nonzero of the step's input 0"), std::string::npos)
      << rec.failure().reason;
}

// A read let through (a value already used on the device) is reported by what it reads: the
// result of an op, in the module of the nearest parameter.
TEST(Capture, AHostReadItLetsThroughIsNamedByOpAndModule) {
  torch::nn::Linear lin(3, 2);
  auto x = at::randn({4, 3});
  kiln::StepRecorder rec({{lin->weight, InputRole::Parameter, "head.weight"}, {x, InputRole::UserInput, "input.0", 0}});
  rec.run([&] {
    auto s = lin->forward(x).sum();
    auto out = s * 2;
    (void)s.item<float>();
    return std::vector<at::Tensor>{out};
  });
  ASSERT_TRUE(rec.ok()) << rec.failure().reason;
  ASSERT_EQ(rec.host_reads().size(), 1u);
  EXPECT_EQ(rec.host_reads()[0],
            ".item() of aten::sum in module head (after parameter head.weight), already used on "
            "the device");
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

// ---- shape-generic steps from two captures (shape_unify.h) ----------------------------------------

namespace {

kiln::ir::Graph captured(const std::string& workload, int64_t batch) {
  auto w = kiln::make_workload(workload, {"cpu", 7, batch});
  auto r = record_workload(w);
  EXPECT_TRUE(r.ok) << r.failure;
  return r.graph;
}

// Unifies `workload` captured at batches a and b, then makes the graph at each of `others` from the
// expressions alone and compares it, text for text, with a real capture at that batch.
void expect_unified_graph_matches_real_captures(const std::string& workload, int64_t a, int64_t b,
                                                const std::vector<int64_t>& others) {
  const auto ga = captured(workload, a), gb = captured(workload, b);
  const auto u = kiln::ir::unify_captures(ga, gb);
  ASSERT_TRUE(u.step) << u.failure;
  // The batch's dimension of the input and of the target are one size (duck sizing).
  EXPECT_EQ(u.step->symbols_text(), "s0 = input.0 dim 0");
  EXPECT_GT(u.step->sites.size(), 2u);
  EXPECT_EQ(kiln::ir::print(kiln::ir::specialise(*u.step, {a})), kiln::ir::print(ga));
  for (int64_t n : others) {
    const auto real = captured(workload, n);
    EXPECT_EQ(u.step->sizes_of(real), std::vector<int64_t>{n});
    EXPECT_EQ(kiln::ir::print(kiln::ir::specialise(*u.step, {n})), kiln::ir::print(real))
        << workload << " at batch " << n << ", unified from " << a << " and " << b;
  }
}

}  // namespace

TEST(ShapeUnify, MlpAtTwoBatchSizesGivesTheGraphOfBatchesNeitherCaptureSaw) {
  expect_unified_graph_matches_real_captures("mlp", 8, 12, {5, 2, 33});
}

TEST(ShapeUnify, CnnAtTwoBatchSizesGivesTheGraphOfBatchesNeitherCaptureSaw) {
  expect_unified_graph_matches_real_captures("cnn", 4, 6, {3, 9});
}

TEST(ShapeUnify, GptAtTwoBatchSizesGivesTheGraphOfBatchesNeitherCaptureSaw) {
  expect_unified_graph_matches_real_captures("gpt", 2, 3, {5});
}

// Sizes 0 and 1 stay specialised, as in PyTorch: neither a capture at 1 nor a graph for 1.
TEST(ShapeUnify, SizesBelowTwoStaySpecialised) {
  const auto g8 = captured("mlp", 8), g12 = captured("mlp", 12), g1 = captured("mlp", 1);
  const auto u = kiln::ir::unify_captures(g8, g12);
  ASSERT_TRUE(u.step) << u.failure;
  try {
    kiln::ir::specialise(*u.step, {1});
    FAIL() << "a graph for batch 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("s0 (input.0 dim 0) = 1: sizes 0 and 1 stay specialised"), std::string::npos)
        << e.what();
  }
  const auto one = kiln::ir::unify_captures(g8, g1);
  EXPECT_FALSE(one.step);
  EXPECT_EQ(one.failure, "input.0 dim 0 is 1 in one capture: sizes 0 and 1 stay specialised");
}

TEST(ShapeUnify, StepsThatDifferInTheirOpsAreNotUnified) {
  const auto u = kiln::ir::unify_captures(captured("mlp", 8), captured("cnn", 8));
  EXPECT_FALSE(u.step);
  EXPECT_FALSE(u.failure.empty());
}

// Two sizes that both change: a view to [B*T], its stride, a mean's 1/(B*T), a slice bound T - 1,
// fitted from (8, 64) and (4, 96) and specialised at (5, 37).
TEST(ShapeUnify, ProductsOfTwoSizesConstantsAndReciprocals) {
  using namespace kiln::ir;
  auto make = [](int64_t b, int64_t t) {
    Graph g;
    TensorMeta x;
    x.shape = {b, t};
    x.strides = {t, 1};
    const ValueId in = g.add_input(x, InputRole::UserInput, "input.0");
    TensorMeta flat;
    flat.shape = {b * t};
    flat.strides = {1};
    const ValueId y = g.add_value(flat);
    Node view;
    view.op = "aten::view";
    view.args = {Arg::tensor(in), Arg::int_list({b * t})};
    view.outputs = {y};
    g.add_node(view);
    const ValueId z = g.add_value(flat);
    Node scale;
    scale.op = "aten::mul.Scalar";
    Arg factor = Arg::real(1.0 / static_cast<double>(b * t));
    factor.is_scalar = true;
    scale.args = {Arg::tensor(y), factor};
    scale.outputs = {z};
    g.add_node(scale);
    TensorMeta cut;
    cut.shape = {b, t - 1};
    cut.strides = {t, 1};
    const ValueId s = g.add_value(cut);
    Node slice;
    slice.op = "aten::slice.Tensor";
    slice.args = {Arg::tensor(in), Arg::integer(1), Arg::integer(0), Arg::integer(t - 1), Arg::integer(1)};
    slice.outputs = {s};
    g.add_node(slice);
    g.outputs.push_back({z, OutputRole::Result, 0, "result.0"});
    g.outputs.push_back({s, OutputRole::Result, 1, "result.1"});
    return g;
  };
  const auto u = unify_captures(make(8, 64), make(4, 96));
  ASSERT_TRUE(u.step) << u.failure;
  EXPECT_EQ(u.step->symbols_text(), "s0 = input.0 dim 0, s1 = input.0 dim 1");
  EXPECT_EQ(print(specialise(*u.step, {5, 37})), print(make(5, 37)));
  EXPECT_EQ(print(specialise(*u.step, {3, 2})), print(make(3, 2)));
  std::vector<std::string> exprs;
  for (const auto& site : u.step->sites) exprs.push_back(site.expr.str());
  for (const char* e : {"s0*s1", "1/(s0*s1)", "s1 - 1"})
    EXPECT_NE(std::find(exprs.begin(), exprs.end(), e), exprs.end()) << e;
}

namespace {

// gpt captured with batches of `batch` sequences of `length` tokens (its context is 64 on the CPU).
kiln::ir::Graph captured_gpt(int64_t batch, int64_t length) {
  auto w = kiln::make_workload("gpt", {"cpu", 7, batch});
  w.input = w.input.narrow(1, 0, length).contiguous();
  w.target = w.target.narrow(1, 0, length).contiguous();
  auto r = record_workload(w);
  EXPECT_TRUE(r.ok) << r.failure;
  return r.graph;
}

}  // namespace

// What per-batch padding gives a language model: the sequence length changes from batch to batch.
// Unified from lengths 32 and 48, the graph at 20, 61 and 64 is the real capture's, position
// embedding's arange(T), views to [B*T, C] and attention included.
TEST(ShapeUnify, GptAtTwoSequenceLengthsGivesTheGraphOfLengthsNeitherCaptureSaw) {
  const auto g32 = captured_gpt(2, 32), g48 = captured_gpt(2, 48);
  const auto u = kiln::ir::unify_captures(g32, g48);
  ASSERT_TRUE(u.step) << u.failure;
  EXPECT_EQ(u.step->symbols_text(), "s0 = input.0 dim 1");
  for (int64_t t : {20, 61, 64})
    EXPECT_EQ(kiln::ir::print(kiln::ir::specialise(*u.step, {t})), kiln::ir::print(captured_gpt(2, t)))
        << "length " << t;
}

// Batch and length both changing: two symbols, products of the two in the views.
TEST(ShapeUnify, GptWithBatchAndLengthChangingTogether) {
  const auto u = kiln::ir::unify_captures(captured_gpt(2, 32), captured_gpt(3, 40));
  ASSERT_TRUE(u.step) << u.failure;
  EXPECT_EQ(u.step->symbols_text(), "s0 = input.0 dim 0, s1 = input.0 dim 1");
  EXPECT_EQ(kiln::ir::print(kiln::ir::specialise(*u.step, {5, 23})), kiln::ir::print(captured_gpt(5, 23)));
}

// A tensor the step reads in place (a constant captured by value, a buffer) is bound once: a step
// where one changes size with the batch is not made shape-generic.
TEST(ShapeUnify, ATensorReadInPlaceThatChangesSizeIsNotUnified) {
  using namespace kiln::ir;
  auto make = [](int64_t b) {
    Graph g;
    TensorMeta x;
    x.shape = {b, 4};
    x.strides = {4, 1};
    const ValueId in = g.add_input(x, InputRole::UserInput, "input.0");
    const ValueId mask = g.add_input(x, InputRole::Constant, "const.0");
    const ValueId y = g.add_value(x);
    Node mul;
    mul.op = "aten::mul.Tensor";
    mul.args = {Arg::tensor(in), Arg::tensor(mask)};
    mul.outputs = {y};
    g.add_node(mul);
    g.outputs.push_back({y, OutputRole::Result, 0, "result.0"});
    return g;
  };
  const auto u = unify_captures(make(8), make(12));
  EXPECT_FALSE(u.step);
  EXPECT_EQ(u.failure,
            "const.0 (const) is f32[8,4]{4,1} in one capture and f32[12,4]{4,1} in the other: only the step's "
            "inputs may change size");
}
