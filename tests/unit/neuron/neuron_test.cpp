// The neuron backend: the StableHLO it emits for a graph (golden text), the PJRT runtime against
// XLA's CPU PJRT plugin (compile, run, errors carrying PJRT's message), and the plugin through the
// real host, its groups checked against the eager executor on fresh random inputs.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/passes.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/workloads.h"
#include "../trainer/log_capture.h"
#include "boundary.h"
#include "cache_entry.h"
#include "padding.h"
#include "pjrt_runtime.h"
#include "stablehlo_emit.h"

using namespace kiln;

namespace {

// A file's bytes.
std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
}

// The whole graph as one subgraph view, as the host hands a group to the plugin.
struct View {
  explicit View(const ir::Graph& g) : graph(g) {
    std::vector<int32_t> nodes;
    for (size_t i = 0; i < g.nodes.size(); ++i) nodes.push_back(static_cast<int32_t>(i));
    std::vector<ir::ValueId> ins, outs;
    for (const auto& in : g.inputs) ins.push_back(in.value);
    for (const auto& o : g.outputs) outs.push_back(o.value);
    view = std::make_unique<GraphView>(g, nodes, ins, outs);
  }
  plugin::Graph pg() const { return plugin::Graph(&view->view()); }
  const ir::Graph& graph;
  std::unique_ptr<GraphView> view;
};

const char* kBroadcastGraph = R"(graph {
  input %0 : f32[2,3]{3,1} input "x"
  input %1 : f32[3]{1} input "b"
  %2 : f32[2,3]{3,1} = aten::add.Tensor(%0, %1, scalar(0.5))
  %3 : f32[2,3]{3,1} = aten::relu(%2)
  output %3 result "y"
}
)";

}  // namespace

// MLIR-test style: the exact module for a small graph (broadcast of a bias, alpha, relu).
TEST(NeuronStablehlo, EmitsTheExpectedModuleForABroadcastAddAndRelu) {
  const ir::Graph g = ir::parse(kBroadcastGraph);
  View v(g);
  EXPECT_EQ(neuron::emit_stablehlo(v.pg()),
            "module @kiln_group {\n"
            "  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>) -> (tensor<2x3xf32>) {\n"
            "    %0 = \"stablehlo.broadcast_in_dim\"(%arg1) {broadcast_dimensions = array<i64: 1>} : "
            "(tensor<3xf32>) -> tensor<2x3xf32>\n"
            "    %1 = \"stablehlo.constant\"() {value = dense<5.00000000e-01> : tensor<2x3xf32>} : () -> "
            "tensor<2x3xf32>\n"
            "    %2 = \"stablehlo.multiply\"(%0, %1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
            "    %3 = \"stablehlo.add\"(%arg0, %2) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
            "    %4 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<2x3xf32>} : () -> "
            "tensor<2x3xf32>\n"
            "    %5 = \"stablehlo.maximum\"(%3, %4) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
            "    \"func.return\"(%5) : (tensor<2x3xf32>) -> ()\n"
            "  }\n"
            "}\n");
}

TEST(NeuronStablehlo, SaysWhyANodeIsNotEmitted) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4,4]{4,1} input "x"
  input %1 : f64[4]{1} input "d"
  %2 : f32[4,4]{4,1} = aten::cumsum(%0, 1, None)
  %3 : f64[4]{1} = aten::neg(%1)
  output %2 result "y"
  output %3 result "z"
}
)");
  View v(g);
  const auto pg = v.pg();
  EXPECT_EQ(neuron::why_not_emitted(pg, pg.node(0)), "no StableHLO lowering for aten::cumsum yet");
  EXPECT_EQ(neuron::why_not_emitted(pg, pg.node(1)), "a float64 result");
  EXPECT_THROW(neuron::emit_stablehlo(pg), plugin::Unimplemented);
}

// Where a tensor's dims lie in memory: strides that are a permutation of a dense layout give the
// order of its dims in storage (size-1 dims in their places, whatever their strides); others none.
TEST(NeuronBoundary, StorageOrderOfDenseLayoutsAndNoneForOthers) {
  using neuron::storage_order;
  using V = std::vector<int64_t>;
  EXPECT_EQ(storage_order({4, 5}, {5, 1}), V({0, 1}));
  EXPECT_EQ(storage_order({5, 6}, {1, 5}), V({1, 0}));                      // t(w) of a [6, 5] w
  EXPECT_EQ(storage_order({2, 3, 4, 5}, {60, 1, 15, 3}), V({0, 2, 3, 1}));  // channels-last
  EXPECT_EQ(storage_order({2, 1, 4, 5}, {20, 1, 5, 1}), V({0, 1, 2, 3}));   // channels-last, C = 1
  EXPECT_EQ(storage_order({2, 1, 12}, {12, 12, 1}), V({0, 1, 2}));          // keepdim's size-1 dim
  EXPECT_EQ(storage_order({3, 1, 4}, {1, 99, 3}), V({2, 1, 0}));            // size-1 dim stays
  EXPECT_EQ(storage_order({2, 3, 4}, {1, 8, 2}), V({1, 2, 0}));
  EXPECT_EQ(storage_order({}, {}), V());
  EXPECT_EQ(storage_order({0, 5}, {1, 7}), V({0, 1}));    // no elements
  EXPECT_FALSE(storage_order({4, 5}, {0, 1}));            // expanded
  EXPECT_FALSE(storage_order({2, 5, 12}, {180, 36, 1}));  // a split's piece: gaps
  EXPECT_FALSE(storage_order({3, 3}, {1, 1}));            // overlapping
  EXPECT_FALSE(storage_order({4, 5}, {10, 2}));           // a stepped slice
  EXPECT_TRUE(neuron::dense_in_order({5, 6}, {1, 5}, {1, 0}));
  EXPECT_FALSE(neuron::dense_in_order({5, 6}, {6, 1}, {1, 0}));
  EXPECT_TRUE(neuron::dense_in_order({5, 6}, {6, 1}, {}));
  EXPECT_TRUE(neuron::dense_in_order({5, 1}, {1, 7}, {1, 0}));  // a size-1 dim's stride says nothing
}

// MLIR-test style: an input dense in another order of its dims (a transposed weight with strides
// {1, 5}, a channels-last image) is a parameter in storage order, transposed first to the shape
// the graph uses; an output so (t of the product, the image's relu) is transposed last into its
// storage order.
namespace {
const char* kPermutedGraph = R"(graph {
  input %0 : f32[4,5]{5,1} input "x"
  input %1 : f32[5,6]{1,5} input "wt"
  input %2 : f32[2,3,4,5]{60,1,15,3} input "img"
  %3 : f32[4,6]{6,1} = aten::mm(%0, %1)
  %4 : f32[6,4]{1,6} = aten::t(%3)
  %5 : f32[2,3,4,5]{60,1,15,3} = aten::relu(%2)
  output %4 result "yt"
  output %5 result "act"
}
)";
}  // namespace

TEST(NeuronStablehlo, TakesAndReturnsPermutedLayoutsInStorageOrderWithTransposes) {
  const ir::Graph g = ir::parse(kPermutedGraph);
  View v(g);
  neuron::BoundaryLayout layout;
  EXPECT_EQ(neuron::emit_stablehlo(v.pg(), nullptr, &layout),
            "module @kiln_group {\n"
            "  func.func public @main(%arg0: tensor<4x5xf32>, %arg1: tensor<6x5xf32>, %arg2: tensor<2x4x5x3xf32>) "
            "-> (tensor<4x6xf32>, tensor<2x4x5x3xf32>) {\n"
            "    %0 = \"stablehlo.transpose\"(%arg1) {permutation = array<i64: 1, 0>} : (tensor<6x5xf32>) -> "
            "tensor<5x6xf32>\n"
            "    %1 = \"stablehlo.transpose\"(%arg2) {permutation = array<i64: 0, 3, 1, 2>} : "
            "(tensor<2x4x5x3xf32>) -> tensor<2x3x4x5xf32>\n"
            "    %2 = \"stablehlo.dot_general\"(%arg0, %0) {dot_dimension_numbers = #stablehlo.dot<"
            "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = "
            "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<4x5xf32>, tensor<5x6xf32>) "
            "-> tensor<4x6xf32>\n"
            "    %3 = \"stablehlo.transpose\"(%2) {permutation = array<i64: 1, 0>} : (tensor<4x6xf32>) -> "
            "tensor<6x4xf32>\n"
            "    %4 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<2x3x4x5xf32>} : () -> "
            "tensor<2x3x4x5xf32>\n"
            "    %5 = \"stablehlo.maximum\"(%1, %4) : (tensor<2x3x4x5xf32>, tensor<2x3x4x5xf32>) -> "
            "tensor<2x3x4x5xf32>\n"
            "    %6 = \"stablehlo.transpose\"(%3) {permutation = array<i64: 1, 0>} : (tensor<6x4xf32>) -> "
            "tensor<4x6xf32>\n"
            "    %7 = \"stablehlo.transpose\"(%5) {permutation = array<i64: 0, 2, 3, 1>} : (tensor<2x3x4x5xf32>) -> "
            "tensor<2x4x5x3xf32>\n"
            "    \"func.return\"(%6, %7) : (tensor<4x6xf32>, tensor<2x4x5x3xf32>) -> ()\n"
            "  }\n"
            "}\n");
  using V = std::vector<int64_t>;
  EXPECT_EQ(layout.inputs, std::vector<V>({V(), V({1, 0}), V({0, 2, 3, 1})}));
  EXPECT_EQ(layout.outputs, std::vector<V>({V({1, 0}), V({0, 2, 3, 1})}));
  // Row-major boundaries, and strides that are no permutation of a dense layout (expanded), are
  // taken as before: no transpose.
  const ir::Graph plain = ir::parse(R"(graph {
  input %0 : f32[4,5]{0,1} input "rows"
  %1 : f32[4,5]{5,1} = aten::neg(%0)
  output %1 result "y"
}
)");
  View pv(plain);
  const std::string m = neuron::emit_stablehlo(pv.pg(), nullptr, &layout);
  EXPECT_EQ(m.find("stablehlo.transpose"), std::string::npos) << m;
  EXPECT_NE(m.find("@main(%arg0: tensor<4x5xf32>) -> (tensor<4x5xf32>)"), std::string::npos) << m;
  EXPECT_EQ(layout.inputs, std::vector<V>({V()}));
  EXPECT_EQ(layout.outputs, std::vector<V>({V()}));
}

// The runtime through XLA's CPU PJRT plugin: the module above compiles and computes what eager does;
// a module PJRT rejects gives PJRT's own message, with the call and the plugin's path.
// A float32 tensor handed to PJRT as dense row-major data.
neuron::HostTensor dense_f32(const at::Tensor& t) {
  return {PJRT_Buffer_Type_F32, t.sizes().vec(), {}, t.data_ptr(), static_cast<size_t>(t.numel()) * 4};
}

TEST(NeuronPjrt, CompilesAndRunsAModuleOnTheCpuPluginAndReportsItsErrors) {
  auto client = neuron::PjrtClient::open(KILN_PJRT_CPU_PLUGIN);
  EXPECT_EQ(client->platform(), "cpu");
  EXPECT_EQ(client->api_major(), 0);
  EXPECT_EQ(neuron::PjrtClient::open(KILN_PJRT_CPU_PLUGIN), client);  // one client per plugin
  const ir::Graph g = ir::parse(kBroadcastGraph);
  View v(g);
  auto exe = client->compile(neuron::emit_stablehlo(v.pg()));
  ASSERT_EQ(exe->num_outputs(), 1u);
  for (int trial = 0; trial < 3; ++trial) {
    at::Tensor x = at::randn({2, 3}), b = at::randn({3}), y = at::empty({2, 3});
    const neuron::HostTensor hx = dense_f32(x), hb = dense_f32(b), hy = dense_f32(y);
    const uint64_t viewed = client->inputs_viewed(), copied = client->inputs_copied();
    exe->run({hx, hb}, {hy});
    EXPECT_TRUE(at::allclose(y, at::relu(x + 0.5 * b), 1e-6, 1e-7)) << y << x << b;
    // LibTorch's tensors are aligned and dense: the plugin reads them where they are.
    EXPECT_TRUE(client->makes_views());
    EXPECT_EQ(client->inputs_viewed() - viewed, 2u);
    EXPECT_EQ(client->inputs_copied() - copied, 0u);
  }
  {
    // An input 4 bytes into its storage, and one given with column-major strides, are copied (the
    // first aligned on the way, the second into row-major order): same results.
    at::Tensor xs = at::randn({7}), b = at::randn({3}), y = at::empty({2, 3});
    at::Tensor x = xs.narrow(0, 1, 6).view({2, 3});
    at::Tensor bt = at::randn({3, 2});  // read as [2,3] with strides (4, 8): b-like values, transposed
    const neuron::HostTensor hx = dense_f32(x), hb = dense_f32(b), hy = dense_f32(y);
    const uint64_t viewed = client->inputs_viewed(), copied = client->inputs_copied();
    exe->run({hx, hb}, {hy});
    EXPECT_TRUE(at::allclose(y, at::relu(x + 0.5 * b), 1e-6, 1e-7)) << y << x << b;
    EXPECT_EQ(client->inputs_viewed() - viewed, 1u);
    EXPECT_EQ(client->inputs_copied() - copied, 1u);
    neuron::HostTensor hxt{PJRT_Buffer_Type_F32, {2, 3}, {4, 8}, bt.data_ptr(), 24};
    exe->run({hxt, hb}, {hy});
    EXPECT_TRUE(at::allclose(y, at::relu(bt.t() + 0.5 * b), 1e-6, 1e-7)) << y << bt << b;
    EXPECT_EQ(client->inputs_copied() - copied, 2u);
  }
  try {
    client->compile("module { this is not mlir }");
    FAIL() << "expected a PJRT error";
  } catch (const neuron::PjrtError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("PJRT plugin ") + KILN_PJRT_CPU_PLUGIN + ": PJRT_Client_Compile failed"),
              std::string::npos)
        << what;
    EXPECT_GE(e.code(), 0) << what;
  }
  EXPECT_THROW(neuron::PjrtClient::open("/nonexistent/libpjrt.so"), neuron::PjrtError);
}

// The same layouts on the CPU cost no copy: the transposed weight and the channels-last image are
// views of their own memory (the dims in storage order), and the results are written where their
// outputs lie. An input whose strides are no longer those compiled for (the weight row-major now)
// is copied in through its byte strides, and computes the same.
TEST(NeuronPjrt, PermutedLayoutsAreViewedWhereTheyLie) {
  auto client = neuron::PjrtClient::open(KILN_PJRT_CPU_PLUGIN);
  const ir::Graph g = ir::parse(kPermutedGraph);
  View v(g);
  neuron::BoundaryLayout layout;
  auto exe = client->compile(neuron::emit_stablehlo(v.pg(), nullptr, &layout));
  using V = std::vector<int64_t>;
  for (int trial = 0; trial < 3; ++trial) {
    const at::Tensor x = at::randn({4, 5}), w = at::randn({6, 5});
    const at::Tensor img = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
    // The last trial hands the weight row-major, where the module was compiled for w.t().
    const at::Tensor wt = trial < 2 ? w.t() : w.t().contiguous();
    at::Tensor yt = at::empty_strided({6, 4}, {1, 6}), act = at::empty_like(img);
    ASSERT_TRUE(act.is_contiguous(at::MemoryFormat::ChannelsLast));
    std::vector<neuron::HostTensor> hin, hout;
    for (const auto& [t, order] : {std::pair{x, layout.inputs[0]}, {wt, layout.inputs[1]}, {img, layout.inputs[2]}})
      hin.push_back(neuron::boundary_tensor(to_dl_tensor(t), order));
    hout.push_back(neuron::boundary_tensor(to_dl_tensor(yt), layout.outputs[0]));
    hout.push_back(neuron::boundary_tensor(to_dl_tensor(act), layout.outputs[1]));
    EXPECT_EQ(hin[1].dims, V({6, 5}));
    EXPECT_EQ(hin[2].dims, V({2, 4, 5, 3}));
    EXPECT_EQ(hin[2].data, img.data_ptr());
    EXPECT_EQ(hout[0].dims, V({4, 6}));
    for (const auto& h : hout) EXPECT_TRUE(h.byte_strides.empty());
    EXPECT_TRUE(hin[0].byte_strides.empty());
    EXPECT_TRUE(hin[2].byte_strides.empty());
    if (trial < 2) EXPECT_TRUE(hin[1].byte_strides.empty());
    else EXPECT_EQ(hin[1].byte_strides, V({4, 24}));  // [6, 5] read through the [5, 6] tensor's strides
    const uint64_t viewed = client->inputs_viewed(), copied = client->inputs_copied();
    exe->run(hin, hout);
    EXPECT_EQ(client->inputs_viewed() - viewed, trial < 2 ? 3u : 2u);
    EXPECT_EQ(client->inputs_copied() - copied, trial < 2 ? 0u : 1u);
    EXPECT_TRUE(at::allclose(yt, at::mm(x, w.t()).t(), 1e-5, 1e-5)) << yt;
    EXPECT_TRUE(at::equal(act, at::relu(img))) << act;
  }
}

// Matmuls (addmm with beta and alpha, bmm), views (t, view, permute, expand), sums (over some dims
// with and without keepdim, and whole) and log_softmax with its backward as one module through
// XLA's CPU plugin, against ATen.
TEST(NeuronPjrt, MatmulsViewsSumsAndLogSoftmaxMatchAten) {
  auto client = neuron::PjrtClient::open(KILN_PJRT_CPU_PLUGIN);
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[6]{1} input "bias"
  input %1 : f32[4,5]{5,1} input "a"
  input %2 : f32[6,5]{5,1} input "w"
  input %3 : f32[2,3,4]{12,4,1} input "p"
  input %4 : f32[2,4,5]{20,5,1} input "q"
  input %16 : f32[4,6]{6,1} input "g"
  %5 : f32[5,6]{1,5} = aten::t(%2)
  %6 : f32[4,6]{6,1} = aten::addmm(%0, %1, %5, scalar(0.5), scalar(2))
  %7 : f32[2,3,5]{15,5,1} = aten::bmm(%3, %4)
  %8 : f32[6,5]{5,1} = aten::view(%7, i[6, 5])
  %9 : f32[5,6]{1,5} = aten::permute(%8, i[1, 0])
  %10 : f32[5,1]{1,1} = aten::sum.dim_IntList(%9, i[-1], true, None)
  %11 : f32[5,4]{4,1} = aten::expand(%10, i[5, 4], false)
  %12 : f32[6]{1} = aten::sum.dim_IntList(%6, i[0], false, None)
  %13 : f32[]{} = aten::sum(%11, None)
  %14 : f32[4,6]{6,1} = aten::_log_softmax(%6, 1, false)
  %15 : f32[4,6]{6,1} = aten::_log_softmax_backward_data(%16, %14, -1, dtype(f32))
  output %6 result "y"
  output %11 result "e"
  output %12 result "s"
  output %13 result "total"
  output %14 result "logp"
  output %15 result "dlogits"
}
)");
  View v(g);
  auto exe = client->compile(neuron::emit_stablehlo(v.pg()));
  ASSERT_EQ(exe->num_outputs(), 6u);
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<at::Tensor> in = {at::randn({6}),       at::randn({4, 5}),    at::randn({6, 5}),
                                  at::randn({2, 3, 4}), at::randn({2, 4, 5}), at::randn({4, 6})};
    std::vector<at::Tensor> env(g.values.size());
    for (size_t i = 0; i < in.size(); ++i) env[g.inputs[i].value] = in[i];
    EagerExecutor(g).run(env);
    std::vector<neuron::HostTensor> hin, hout;
    for (auto& t : in)
      hin.push_back({PJRT_Buffer_Type_F32, t.sizes().vec(), {}, t.data_ptr(), static_cast<size_t>(t.nbytes())});
    std::vector<at::Tensor> got;
    for (const auto& o : g.outputs) got.push_back(at::empty(env[o.value].sizes()));
    for (auto& t : got)
      hout.push_back({PJRT_Buffer_Type_F32, t.sizes().vec(), {}, t.data_ptr(), static_cast<size_t>(t.nbytes())});
    exe->run(hin, hout);
    for (size_t k = 0; k < got.size(); ++k) {
      const at::Tensor want = env[g.outputs[k].value].contiguous();
      EXPECT_TRUE(at::allclose(got[k], want, 1e-5, 1e-5)) << g.outputs[k].name << "\n" << got[k] << "\n" << want;
    }
  }
}

// The plugin through the real host: with [plugin.neuron] pjrt_plugin it is available on the CPU
// (only when named), claims the element-wise nodes of a step-like graph, and its groups match eager
// on fresh inputs, strided ones included (`go` is recorded row-major and handed transposed: a host
// tensor whose strides differ from those compiled for is copied in through them); without the
// option it says why it is unavailable.
TEST(NeuronPlugin, GroupsRunThroughPjrtAndMatchEager) {
  TrainingArguments args;
  args.plugin_options["neuron"]["pjrt_plugin"] = KILN_PJRT_CPU_PLUGIN;
  auto plugin = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(args));
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[8,16]{16,1} input "x"
  input %1 : f32[16]{1} input "b"
  input %2 : f32[8,16]{16,1} input "go"
  %3 : f32[8,16]{16,1} = aten::add.Tensor(%0, %1, scalar(1))
  %4 : f32[8,16]{16,1} = aten::relu(%3)
  %5 : f32[8,16]{16,1} = aten::threshold_backward(%2, %4, 0)
  %6 : f32[16,8]{1,16} = aten::permute(%5, i[1, 0])
  %7 : f32[16,8]{8,1} = aten::cumsum(%6, 1, None)
  %8 : f32[16,8]{8,1} = aten::mul.Scalar(%7, scalar(3))
  %9 : f32[]{} = aten::sum(%8, None)
  output %9 result "loss"
  output %5 result "dx"
  output %8 result "s"
}
)");
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  // The cumsum stays eager, and so does the permute that feeds it (a view at its group's end is
  // metadata over the group's output, not a copy the plugin makes); the rest is two groups.
  EXPECT_EQ(exec.stats().nodes_compiled, 5u);
  EXPECT_EQ(exec.stats().groups_compiled, 2u);
  for (const auto& o : exec.groups()) EXPECT_TRUE(o.compiled) << o.reason;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<at::Tensor> inputs = {at::randn({8, 16}), at::randn({16}), at::randn({16, 8}).t()};
    std::vector<at::Tensor> env(g.values.size()), ref(g.values.size());
    for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = ref[g.inputs[i].value] = inputs[i];
    EagerExecutor(g).run(ref);
    exec.run(env);
    // A sum's error is bounded by its terms' magnitudes, not by the sum itself: a loss that
    // cancels to nearly zero has a large error relative to itself under any other summation
    // order (XLA vectorises the sum, ATen does not). So the loss is measured against the sum
    // of its terms' absolute values, every other output against its own norm.
    const double terms = ref[8].abs().sum().item<double>();
    for (const auto& o : g.outputs) {
      const at::Tensor& got = env[o.value];
      const at::Tensor& want = ref[o.value];
      const double scale = o.name == "loss" ? terms : want.norm().item<double>();
      const double rel = (got - want).norm().item<double>() / std::max(scale, 1e-30);
      EXPECT_LE(rel, 1e-6) << o.name << " trial " << trial;
    }
  }
  // On a CPU: available only when named (score 0), naming the PJRT plugin and its platform.
  std::vector<PluginDevice> cpu(1);
  cpu[0].name = "test CPU";
  const PluginAvailability a = plugin->available(cpu);
  EXPECT_TRUE(a.available) << a.reason;
  EXPECT_EQ(a.score, 0);
  EXPECT_NE(a.reason.find("platform cpu"), std::string::npos) << a.reason;
  // Without pjrt_plugin and without a Neuron device: unavailable, saying so.
  TrainingArguments plain;
  auto bare = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(plain));
  const PluginAvailability b = bare->available(cpu);
  EXPECT_FALSE(b.available);
  EXPECT_EQ(b.reason.rfind("no AWS Neuron device found", 0), 0u) << b.reason;
}

namespace {

// Runs `g` through the neuron plugin (every node it claims) and through the eager executor on the
// same fresh inputs, `scalars` the run-time scalars' values; returns the largest relative error
// (by norm) over the outputs and fills `claimed` with the nodes that ran through PJRT.
double neuron_vs_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                       const std::vector<c10::IValue>& scalars, size_t* claimed) {
  TrainingArguments args;
  args.plugin_options["neuron"]["pjrt_plugin"] = KILN_PJRT_CPU_PLUGIN;
  auto plugin = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(args));
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  *claimed = exec.stats().nodes_compiled;
  for (const auto& o : exec.groups()) EXPECT_TRUE(o.compiled) << o.reason;
  std::vector<at::Tensor> env(g.values.size()), ref(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = ref[g.inputs[i].value] = inputs[i].clone();
  EagerExecutor(g).run(ref, &scalars);
  exec.run(env, &scalars);
  double worst = 0;
  for (const auto& o : g.outputs) {
    const at::Tensor got = env[o.value].to(at::kDouble), want = ref[o.value].to(at::kDouble);
    const double diff = (got - want).norm().item<double>(), scale = want.norm().item<double>();
    if (std::isnan(diff)) {
      EXPECT_TRUE(at::equal(got.isnan(), want.isnan())) << o.name << got << want;
      continue;
    }
    const double rel = scale > 0 ? diff / scale : diff;
    EXPECT_LE(rel, 1e-5) << o.name << "\n" << got << "\n" << want;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace

// Transposed weights and channels-last activations through the plugin and the real host: every node
// is claimed (the weight's t and the matmuls it feeds, a transposed input, a product handed on
// transposed, channels-last element-wise ops, a sum over them, a clone into channels-last), and the
// groups match eager on fresh inputs; then with a weight handed row-major where the graph recorded
// it transposed (the CPU copies it in through its strides).
TEST(NeuronPlugin, TransposedWeightsAndChannelsLastInputsAreClaimedAndMatchEager) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[8,5]{5,1} input "x"
  input %1 : f32[6,5]{5,1} param "w"
  input %2 : f32[6]{1} param "b"
  input %3 : f32[5,6]{1,5} input "wt"
  input %4 : f32[2,3,4,5]{60,1,15,3} input "img"
  input %5 : f32[3,1,1]{1,1,1} param "scale"
  input %6 : f32[2,3,4,5]{60,20,5,1} input "plain"
  %7 : f32[5,6]{1,5} = aten::t(%1)
  %8 : f32[8,6]{6,1} = aten::addmm(%2, %0, %7, scalar(1), scalar(1))
  %9 : f32[8,6]{6,1} = aten::mm(%0, %3)
  %10 : f32[6,8]{1,6} = aten::t(%9)
  %11 : f32[6,8]{1,6} = aten::neg(%10)
  %12 : f32[2,3,4,5]{60,1,15,3} = aten::mul.Tensor(%4, %5)
  %13 : f32[2,3,4,5]{60,1,15,3} = aten::relu(%12)
  %14 : f32[3]{1} = aten::sum.dim_IntList(%13, i[0, 2, 3], false, None)
  %15 : f32[2,3,4,5]{60,1,15,3} = aten::clone(%6, memory_format(2))
  output %8 result "y"
  output %11 result "neg_yt"
  output %13 result "act"
  output %14 result "per_channel"
  output %15 result "nhwc"
}
)");
  for (int trial = 0; trial < 3; ++trial) {
    const at::Tensor wt = at::randn({6, 5}).t();
    const std::vector<at::Tensor> in = {at::randn({8, 5}),
                                        at::randn({6, 5}),
                                        at::randn({6}),
                                        trial < 2 ? wt : wt.contiguous(),
                                        at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast),
                                        at::randn({3, 1, 1}),
                                        at::randn({2, 3, 4, 5})};
    size_t claimed = 0;
    neuron_vs_eager(g, in, {}, &claimed);
    EXPECT_EQ(claimed, g.nodes.size());
  }
}

// nll_loss: the target's column picked by an iota compared with the targets, ignored rows left out.
TEST(NeuronStablehlo, EmitsNllLossWithAnIotaCompareAndSelect) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[2,3]{3,1} input "logp"
  input %1 : i64[2]{1} input "target"
  %2 : f32[]{}, %3 : f32[]{} = aten::nll_loss_forward(%0, %1, None, 2, -100)
  output %2 result "loss"
  output %3 result "total_weight"
}
)");
  View v(g);
  EXPECT_EQ(
      neuron::emit_stablehlo(v.pg()),
      "module @kiln_group {\n"
      "  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2xi64>) -> (tensor<f32>, tensor<f32>) {\n"
      "    %0 = \"stablehlo.iota\"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi64>\n"
      "    %1 = \"stablehlo.broadcast_in_dim\"(%arg1) {broadcast_dimensions = array<i64: 0>} : (tensor<2xi64>) -> "
      "tensor<2x3xi64>\n"
      "    %2 = \"stablehlo.compare\"(%0, %1) {comparison_direction = #stablehlo<comparison_direction EQ>} : "
      "(tensor<2x3xi64>, tensor<2x3xi64>) -> tensor<2x3xi1>\n"
      "    %3 = \"stablehlo.constant\"() {value = dense<-100> : tensor<2xi64>} : () -> tensor<2xi64>\n"
      "    %4 = \"stablehlo.compare\"(%arg1, %3) {comparison_direction = #stablehlo<comparison_direction NE>} : "
      "(tensor<2xi64>, tensor<2xi64>) -> tensor<2xi1>\n"
      "    %5 = \"stablehlo.broadcast_in_dim\"(%4) {broadcast_dimensions = array<i64: 0>} : (tensor<2xi1>) -> "
      "tensor<2x3xi1>\n"
      "    %6 = \"stablehlo.and\"(%2, %5) : (tensor<2x3xi1>, tensor<2x3xi1>) -> tensor<2x3xi1>\n"
      "    %7 = \"stablehlo.constant\"() {value = dense<1.00000000e+00> : tensor<2xf32>} : () -> tensor<2xf32>\n"
      "    %8 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<2xf32>} : () -> tensor<2xf32>\n"
      "    %9 = \"stablehlo.select\"(%4, %7, %8) : (tensor<2xi1>, tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>\n"
      "    %10 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<2x3xf32>} : () -> tensor<2x3xf32>\n"
      "    %11 = \"stablehlo.select\"(%6, %arg0, %10) : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) -> "
      "tensor<2x3xf32>\n"
      "    %12 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<f32>} : () -> tensor<f32>\n"
      "    %13 = \"stablehlo.reduce\"(%11, %12) ({\n"
      "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
      "      %acc = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
      "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
      "    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>\n"
      "    %14 = \"stablehlo.multiply\"(%13, %9) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>\n"
      "    %15 = \"stablehlo.negate\"(%14) : (tensor<2xf32>) -> tensor<2xf32>\n"
      "    %16 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<2xf32>} : () -> tensor<2xf32>\n"
      "    %17 = \"stablehlo.select\"(%4, %15, %16) : (tensor<2xi1>, tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>\n"
      "    %18 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<f32>} : () -> tensor<f32>\n"
      "    %19 = \"stablehlo.reduce\"(%17, %18) ({\n"
      "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
      "      %acc = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
      "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
      "    }) {dimensions = array<i64: 0>} : (tensor<2xf32>, tensor<f32>) -> tensor<f32>\n"
      "    %20 = \"stablehlo.constant\"() {value = dense<0.00000000e+00> : tensor<f32>} : () -> tensor<f32>\n"
      "    %21 = \"stablehlo.reduce\"(%9, %20) ({\n"
      "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
      "      %acc = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
      "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
      "    }) {dimensions = array<i64: 0>} : (tensor<2xf32>, tensor<f32>) -> tensor<f32>\n"
      "    \"func.return\"(%19, %21) : (tensor<f32>, tensor<f32>) -> ()\n"
      "  }\n"
      "}\n");
}

// nll_loss forward and backward through XLA's CPU plugin against ATen, for each reduction, with and
// without a class weight, some targets equal to ignore_index (an in-range class, and -100).
TEST(NeuronPjrt, NllLossForwardAndBackwardMatchAten) {
  for (int reduction : {0, 1, 2}) {
    for (bool weighted : {false, true}) {
      for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
        const std::string r = std::to_string(reduction), ig = std::to_string(ignore);
        const std::string go = reduction == 0 ? "f32[6]{1}" : "f32[]{}";
        const std::string w = weighted ? "%2" : "None";
        const ir::Graph g = ir::parse(
            "graph {\n"
            "  input %0 : f32[6,5]{5,1} input \"logits\"\n"
            "  input %1 : i64[6]{1} input \"target\"\n"
            "  input %2 : f32[5]{1} input \"weight\"\n"
            "  input %3 : " +
            go +
            " input \"grad\"\n"
            "  %4 : f32[6,5]{5,1} = aten::_log_softmax(%0, 1, false)\n"
            "  %5 : " +
            go + ", %6 : f32[]{} = aten::nll_loss_forward(%4, %1, " + w + ", " + r + ", " + ig +
            ")\n"
            "  %7 : f32[6,5]{5,1} = aten::nll_loss_backward(%3, %4, %1, " +
            w + ", " + r + ", " + ig +
            ", %6)\n"
            "  output %5 result \"loss\"\n"
            "  output %6 result \"total_weight\"\n"
            "  output %7 result \"dlogp\"\n"
            "}\n");
        for (int trial = 0; trial < 2; ++trial) {
          at::Tensor target = at::randint(0, 5, {6}, at::kLong);
          target[1] = ignore;
          target[4] = ignore;
          const std::vector<at::Tensor> in = {at::randn({6, 5}), target, at::rand({5}) + 0.5,
                                              reduction == 0 ? at::randn({6}) : at::randn({})};
          size_t claimed = 0;
          neuron_vs_eager(g, in, {}, &claimed);
          EXPECT_EQ(claimed, 3u) << "reduction " << r << " weighted " << weighted;
        }
      }
    }
  }
}

// AdamW's update as the captured step has it, its bias corrections and step size run-time scalars:
// one executable, the scalars' values passed on each call as parameters of @main.
TEST(NeuronPjrt, AdamWUpdateWithRuntimeScalarsMatchesAten) {
  const ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  scalar $1 float "optimizer.scalar.1"
  input %0 : f32[65,384]{384,1} param "w"
  input %1 : f32[65,384]{384,1} input "grad"
  input %2 : f32[65,384]{384,1} state "exp_avg"
  input %3 : f32[65,384]{384,1} state "exp_avg_sq"
  %4 : f32[65,384]{384,1} = aten::mul.Scalar(%0, scalar(0.99999))
  %5 : f32[65,384]{384,1} = aten::mul.Scalar(%2, scalar(0.9))
  %6 : f32[65,384]{384,1} = aten::add.Tensor(%5, %1, scalar(0.09999999999999998))
  %7 : f32[65,384]{384,1} = aten::mul.Scalar(%3, scalar(0.999))
  %8 : f32[65,384]{384,1} = aten::addcmul(%7, %1, %1, scalar(0.0010000000000000009))
  %9 : f32[65,384]{384,1} = aten::sqrt(%8)
  %10 : f32[65,384]{384,1} = aten::div.Scalar(%9, $0:scalar(0.04471017781221601))
  %11 : f32[65,384]{384,1} = aten::add.Scalar(%10, scalar(1e-08), scalar(1))
  %12 : f32[65,384]{384,1} = aten::addcdiv(%4, %6, %11, $1:scalar(-0.005263157894736844))
  output %12 writeback 0 "w"
  output %6 writeback 2 "exp_avg"
  output %8 writeback 3 "exp_avg_sq"
}
)");
  View v(g);
  std::vector<int32_t> rts;
  const std::string m = neuron::emit_stablehlo(v.pg(), &rts);
  EXPECT_EQ(rts, (std::vector<int32_t>{0, 1}));
  EXPECT_NE(m.find("%arg4: tensor<f32>, %arg5: tensor<f32>) -> ("), std::string::npos) << m;
  for (int step = 1; step <= 3; ++step) {
    const double bc2 = std::sqrt(1 - std::pow(0.999, step)), bc1 = 1 - std::pow(0.9, step);
    const std::vector<c10::IValue> scalars = {c10::IValue(bc2), c10::IValue(-1e-3 / bc1)};
    const std::vector<at::Tensor> in = {at::randn({65, 384}), at::randn({65, 384}) * 1e-2, at::randn({65, 384}) * 1e-3,
                                        at::rand({65, 384}) * 1e-5};
    size_t claimed = 0;
    neuron_vs_eager(g, in, scalars, &claimed);
    EXPECT_EQ(claimed, 9u);
  }
}

// gpt's pieces through XLA's CPU plugin against ATen, forward and backward: layer norm, GELU
// (erf), embedding (gather) and its backward (scatter-add, with repeated indices), split, slice,
// cat, mean over dims, softmax.
TEST(NeuronPjrt, GptPiecesMatchAten) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[2,5,12]{60,12,1} input "x"
  input %1 : f32[12]{1} input "w"
  input %2 : f32[12]{1} input "b"
  input %3 : f32[2,5,12]{60,12,1} input "dy"
  input %4 : f32[7,12]{12,1} input "table"
  input %5 : i64[2,5]{5,1} input "ids"
  input %6 : f32[2,5,36]{180,36,1} input "qkv_like"
  %7 : f32[2,5,12]{60,12,1}, %8 : f32[2,5,1]{5,1,1}, %9 : f32[2,5,1]{5,1,1} = aten::native_layer_norm(%0, i[12], %1, %2, 1e-05)
  %10 : f32[2,5,12]{60,12,1}, %11 : f32[12]{1}, %12 : f32[12]{1} = aten::native_layer_norm_backward(%3, %0, i[12], %8, %9, %1, %2, b[true, true, true])
  %13 : f32[2,5,12]{60,12,1} = aten::gelu(%7, "none")
  %14 : f32[2,5,12]{60,12,1} = aten::gelu_backward(%3, %7, "none")
  %15 : f32[2,5,12]{60,12,1} = aten::gelu(%7, "tanh")
  %16 : f32[2,5,12]{60,12,1} = aten::embedding(%4, %5, -1, false, false)
  %17 : f32[7,12]{12,1} = aten::embedding_dense_backward(%3, %5, 7, -1, false)
  %18 : f32[7,12]{12,1} = aten::embedding_dense_backward(%3, %5, 7, 2, false)
  %19 : f32[2,5,12]{180,36,1}, %20 : f32[2,5,12]{180,36,1}+12, %21 : f32[2,5,12]{180,36,1}+24 = aten::split.Tensor(%6, 12, 2) list
  %22 : f32[2,5,36]{180,36,1} = aten::cat(t[%21, %19, %20], 2)
  %23 : f32[2,3,12]{36,12,1} = aten::slice.Tensor(%0, 1, 1, -1, 1)
  %24 : f32[2,1,12]{12,12,1} = aten::mean.dim(%0, i[1], true, None)
  %25 : i64[10]{1} = aten::view(%5, i[-1])
  %26 : f32[10,12]{12,1} = aten::embedding(%4, %25, -1, false, false)
  %27 : f32[2,5,12]{60,12,1} = aten::_softmax(%0, 2, false)
  %28 : f32[2,5,12]{60,12,1} = aten::_softmax_backward_data(%3, %27, -1, dtype(f32))
  output %7 result "ln"
  output %8 result "mean"
  output %9 result "rstd"
  output %10 result "dx"
  output %11 result "dw"
  output %12 result "db"
  output %13 result "gelu"
  output %14 result "dgelu"
  output %15 result "gelu_tanh"
  output %16 result "emb"
  output %17 result "demb"
  output %18 result "demb_pad"
  output %19 result "q"
  output %22 result "cat"
  output %23 result "slice"
  output %24 result "mean_dim"
  output %26 result "emb_flat"
  output %27 result "softmax"
  output %28 result "dsoftmax"
}
)");
  for (int trial = 0; trial < 2; ++trial) {
    at::Tensor ids = at::randint(0, 7, {2, 5}, at::kLong);
    ids[0][1] = 2;
    ids[1][3] = 2;
    const std::vector<at::Tensor> in = {at::randn({2, 5, 12}) * 3 + 1, at::randn({12}),    at::randn({12}),
                                        at::randn({2, 5, 12}),         at::randn({7, 12}), ids,
                                        at::randn({2, 5, 36})};
    size_t claimed = 0;
    neuron_vs_eager(g, in, {}, &claimed);
    EXPECT_EQ(claimed, g.nodes.size());
  }
}

TEST(NeuronPjrt, CausalAttentionAndItsBackwardMatchAten) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[2,3,6,4]{72,24,4,1} input "q"
  input %1 : f32[2,3,6,4]{72,24,4,1} input "k"
  input %2 : f32[2,3,6,4]{72,24,4,1} input "v"
  input %3 : f32[2,3,6,4]{72,24,4,1} input "dout"
  %4 : f32[2,3,6,4]{72,24,4,1}, %5 : f32[2,3,6]{18,6,1} = aten::_scaled_dot_product_flash_attention_for_cpu(%0, %1, %2, 0.0, true, None, None)
  %6 : f32[2,3,6,4]{72,24,4,1}, %7 : f32[2,3,6,4]{72,24,4,1}, %8 : f32[2,3,6,4]{72,24,4,1} = aten::_scaled_dot_product_flash_attention_for_cpu_backward(%3, %0, %1, %2, %4, %5, 0.0, true, None, None)
  %9 : f32[2,3,6,4]{72,24,4,1}, %10 : f32[2,3,6]{18,6,1} = aten::_scaled_dot_product_flash_attention_for_cpu(%0, %1, %2, 0.0, false, None, 0.3)
  output %4 result "out"
  output %5 result "lse"
  output %6 result "dq"
  output %7 result "dk"
  output %8 result "dv"
  output %9 result "out_full"
  output %10 result "lse_full"
}
)");
  for (int trial = 0; trial < 2; ++trial) {
    const std::vector<at::Tensor> in = {at::randn({2, 3, 6, 4}), at::randn({2, 3, 6, 4}), at::randn({2, 3, 6, 4}),
                                        at::randn({2, 3, 6, 4})};
    size_t claimed = 0;
    neuron_vs_eager(g, in, {}, &claimed);
    EXPECT_EQ(claimed, g.nodes.size());
  }
}

// cnn's pieces against ATen: convolutions (strided, padded, dilated, grouped, with a bias) and
// the backward with all three results, training batch norm with its running stats and its
// backward, and the int64 counter batch norm keeps.
TEST(NeuronPjrt, ConvolutionsAndBatchNormMatchAten) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4,6,11,9]{594,99,9,1} input "x"
  input %1 : f32[8,6,3,3]{54,9,3,1} input "w"
  input %2 : f32[8]{1} input "bias"
  input %3 : f32[4,8,6,5]{240,30,5,1} input "dy_s2"
  input %4 : f32[4,8,7,7]{392,49,7,1} input "dy_d2"
  input %5 : f32[8,3,3,3]{27,9,3,1} input "wg"
  input %6 : f32[8]{1} input "gamma"
  input %7 : f32[8]{1} input "beta"
  input %8 : f32[8]{1} buffer "running_mean"
  input %9 : f32[8]{1} buffer "running_var"
  input %10 : f32[4,8,6,5]{240,30,5,1} input "dbn"
  input %11 : i64[]{} buffer "num_batches_tracked"
  %12 : f32[4,8,6,5]{240,30,5,1} = aten::convolution(%0, %1, %2, i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1)
  %13 : f32[4,8,7,7]{392,49,7,1} = aten::convolution(%0, %1, None, i[1, 1], i[0, 1], i[2, 2], false, i[0, 0], 1)
  %14 : f32[4,8,11,9]{792,99,9,1} = aten::convolution(%0, %5, None, i[1, 1], i[1, 1], i[1, 1], false, i[0, 0], 2)
  %15 : f32[4,6,11,9]{594,99,9,1}, %16 : f32[8,6,3,3]{54,9,3,1}, %17 : f32[8]{1} = aten::convolution_backward(%3, %0, %1, i[8], i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1, b[true, true, true])
  %18 : f32[4,6,11,9]{594,99,9,1}, %19 : f32[8,6,3,3]{54,9,3,1}, %20 : f32[8]{1} = aten::convolution_backward(%4, %0, %1, i[8], i[1, 1], i[0, 1], i[2, 2], false, i[0, 0], 1, b[true, true, true])
  %21 : f32[4,8,6,5]{240,30,5,1}, %22 : f32[8]{1}, %23 : f32[8]{1}, %24 : f32[8]{1}, %25 : f32[8]{1} = aten::_native_batch_norm_legit_functional(%12, %6, %7, %8, %9, true, 0.1, 1e-05)
  %26 : f32[4,8,6,5]{240,30,5,1}, %27 : f32[8]{1}, %28 : f32[8]{1} = aten::native_batch_norm_backward(%10, %12, %6, %24, %25, %22, %23, true, 1e-05, b[true, true, true])
  %29 : i64[]{} = aten::add.Scalar(%11, scalar(1), scalar(1))
  output %12 result "conv"
  output %13 result "conv_dilated"
  output %14 result "conv_grouped"
  output %15 result "dx"
  output %16 result "dw"
  output %17 result "db"
  output %18 result "dx_dilated"
  output %19 result "dw_dilated"
  output %20 result "db_dilated"
  output %21 result "bn"
  output %22 result "save_mean"
  output %23 result "save_invstd"
  output %24 result "new_running_mean"
  output %25 result "new_running_var"
  output %26 result "dbn_x"
  output %27 result "dbn_w"
  output %28 result "dbn_b"
  output %29 result "count"
}
)");
  for (int trial = 0; trial < 2; ++trial) {
    const std::vector<at::Tensor> in = {at::randn({4, 6, 11, 9}), at::randn({8, 6, 3, 3}), at::randn({8}),
                                        at::randn({4, 8, 6, 5}),  at::randn({4, 8, 7, 7}), at::randn({8, 3, 3, 3}),
                                        at::randn({8}),           at::randn({8}),          at::randn({8}),
                                        at::rand({8}) + 0.5,      at::randn({4, 8, 6, 5}), at::full({}, 7, at::kLong)};
    size_t claimed = 0;
    neuron_vs_eager(g, in, {}, &claimed);
    EXPECT_EQ(claimed, g.nodes.size());
  }
}

// The compile cache: XLA's CPU plugin serializes executables; one loaded back runs as the compiled
// one did, and bytes that are not an executable give PJRT's error.
TEST(NeuronPjrt, SerializedExecutablesLoadBackAndRun) {
  auto client = neuron::PjrtClient::open(KILN_PJRT_CPU_PLUGIN);
  ASSERT_TRUE(client->can_serialize());
  const ir::Graph g = ir::parse(kBroadcastGraph);
  View v(g);
  const std::string bytes = client->compile(neuron::emit_stablehlo(v.pg()))->serialize();
  ASSERT_FALSE(bytes.empty());
  auto exe = client->load(bytes);
  ASSERT_EQ(exe->num_outputs(), 1u);
  at::Tensor x = at::randn({2, 3}), b = at::randn({3}), y = at::empty({2, 3});
  neuron::HostTensor hx{PJRT_Buffer_Type_F32, {2, 3}, {}, x.data_ptr(), 24};
  neuron::HostTensor hb{PJRT_Buffer_Type_F32, {3}, {}, b.data_ptr(), 12};
  neuron::HostTensor hy{PJRT_Buffer_Type_F32, {2, 3}, {}, y.data_ptr(), 24};
  exe->run({hx, hb}, {hy});
  EXPECT_TRUE(at::allclose(y, at::relu(x + 0.5 * b), 1e-6, 1e-7));
  EXPECT_THROW(client->load("not an executable"), neuron::PjrtError);
}

// Through the plugin: the first compile writes <cache_dir>/neuron/<key>.pjrt, a later one loads it,
// and a damaged file (cut short, bytes changed, another format) is compiled again and replaced;
// every executable matches eager.
// The compile cache's entry files on their own (plugins/neuron/cache_entry.h): what is written
// reads back; each kind of damage is refused with its reason, never handed on.
TEST(NeuronCacheEntry, WrittenEntriesReadBackAndDamagedOnesSayWhy) {
  const std::string dir = ::testing::TempDir() + "/kiln_neuron_entry_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string file = dir + "/neuron/entry.pjrt";
  const std::string module = "module @m {}\n";
  std::string bytes(1000 + static_cast<size_t>(at::randint(0, 1000, {1}).item<int64_t>()), '\0');
  for (auto& c : bytes) c = static_cast<char>(at::randint(0, 256, {1}).item<int64_t>());
  ASSERT_TRUE(neuron::write_cache_entry(file, module, bytes));
  std::string damaged;
  auto read = neuron::read_cache_entry(file, module, &damaged);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(*read, bytes);
  EXPECT_EQ(damaged, "");
  // Another module under the same name: a miss, not damage.
  EXPECT_FALSE(neuron::read_cache_entry(file, "module @other {}\n", &damaged).has_value());
  EXPECT_EQ(damaged, "");
  EXPECT_FALSE(neuron::read_cache_entry(dir + "/neuron/none.pjrt", module, &damaged).has_value());
  EXPECT_EQ(damaged, "");
  const std::string whole = file_bytes(file);
  const auto reason = [&](const std::string& contents) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << contents;
    std::string why;
    EXPECT_FALSE(neuron::read_cache_entry(file, module, &why).has_value()) << why;
    return why;
  };
  EXPECT_EQ(reason(whole.substr(0, whole.size() - 1)), "cut short");
  EXPECT_EQ(reason(whole.substr(0, 12)), "cut short");
  EXPECT_EQ(reason(whole + "x"), "longer than its header says");
  std::string changed = whole;
  changed[changed.size() - 10] = static_cast<char>(changed[changed.size() - 10] ^ 0x5a);
  EXPECT_EQ(reason(changed), "its bytes changed");
  EXPECT_EQ(reason(std::string(64, '\x01')), "not a kiln neuron cache entry of this version");
  std::filesystem::remove_all(dir);
}

// Writers of one entry at once (two contexts of the plugin in one process, threads) each write a
// temporary file of their own and rename it into place: a reader at any moment sees one of the
// written entries whole, or none, never a mix of two.
TEST(NeuronCacheEntry, WritersOfOneEntryAtOnceLeaveItWhole) {
  const std::string dir = ::testing::TempDir() + "/kiln_neuron_entry_threads_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string file = dir + "/neuron/entry.pjrt";
  const std::string module = "module @m {}\n";
  constexpr int kWriters = 4, kWrites = 25;
  std::vector<std::string> payloads;
  for (int w = 0; w < kWriters; ++w) payloads.push_back(std::string(256 << 10, static_cast<char>('a' + w)));
  std::atomic<int> running{kWriters};
  std::vector<std::string> errors(kWriters + 1);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w)
    threads.emplace_back([&, w] {
      for (int k = 0; k < kWrites; ++k)
        if (!neuron::write_cache_entry(file, module, payloads[static_cast<size_t>(w)]))
          errors[static_cast<size_t>(w)] = "a write failed";
      --running;
    });
  threads.emplace_back([&] {
    int reads = 0;
    while (running.load() > 0 || reads == 0) {
      std::string why;
      const auto got = neuron::read_cache_entry(file, module, &why);
      ++reads;
      if (!why.empty()) errors[kWriters] = "a reader saw a damaged entry: " + why;
      if (got && std::find(payloads.begin(), payloads.end(), *got) == payloads.end())
        errors[kWriters] = "a reader saw bytes no writer wrote";
    }
  });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  std::string why;
  const auto last = neuron::read_cache_entry(file, module, &why);
  ASSERT_TRUE(last.has_value()) << why;
  EXPECT_NE(std::find(payloads.begin(), payloads.end(), *last), payloads.end());
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir + "/neuron")) ++files;
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
  std::filesystem::remove_all(dir);
}

// A header whose sizes say more than the file holds (a changed byte, another program's file) is
// refused before a buffer of that size is made: the module's size here says 3 GiB in a file of 70
// bytes. It is read in a child process that may map 1 GiB more than it has, where a reader that
// trusted the header (as the first one did, up to 4 GiB) fails to allocate.
TEST(NeuronCacheEntry, SizesInAHeaderBeyondTheFileAreRefusedBeforeAnythingIsAllocated) {
  const std::string dir = ::testing::TempDir() + "/kiln_neuron_entry_big_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/entry.pjrt";
  const std::string module = "module @m {}\n";
  ASSERT_TRUE(neuron::write_cache_entry(file, module, std::string(40, 'x')));
  const std::string text = file_bytes(file);
  const uint64_t huge = uint64_t{3} << 30;
  std::string module_size_past_the_end = text, executable_size_past_the_end = text;
  std::memcpy(module_size_past_the_end.data() + 8, &huge, sizeof huge);
  std::memcpy(executable_size_past_the_end.data() + 16 + module.size(), &huge, sizeof huge);
  for (const auto& contents : {module_size_past_the_end, executable_size_past_the_end}) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << contents;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // This process's mappings now, plus 1 GiB: a 3 GiB buffer cannot be made.
      std::ifstream statm("/proc/self/statm");
      unsigned long pages = 0;
      statm >> pages;
      const rlim_t limit =
          static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{1} << 30);
      const rlimit lim{limit, limit};
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
      try {
        std::string why;
        const bool refused = !neuron::read_cache_entry(file, module, &why).has_value() && why == "cut short";
        ::_exit(refused ? 0 : 1);
      } catch (...) {
        ::_exit(2);  // std::bad_alloc: the reader tried to make the buffer the header asked for
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not refused as cut short; 2: an allocation of the header's size; 3: "
                                         "setrlimit failed";
  }
  std::filesystem::remove_all(dir);
}

TEST(NeuronPlugin, CompileCacheOnDiskIsWrittenReadAndRepaired) {
  const std::string dir = ::testing::TempDir() + "/kiln_neuron_cache_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const ir::Graph g = ir::parse(kBroadcastGraph);
  TrainingArguments args;
  args.plugin_options["neuron"]["pjrt_plugin"] = KILN_PJRT_CPU_PLUGIN;
  args.runtime.cache_dir = dir;
  auto plugin = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(args));
  auto files = [&] {
    std::vector<std::filesystem::path> f;
    if (std::filesystem::exists(dir + "/neuron"))
      for (const auto& e : std::filesystem::directory_iterator(dir + "/neuron")) f.push_back(e.path());
    return f;
  };
  auto check = [&] {
    PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
    EXPECT_EQ(exec.stats().nodes_compiled, 2u);
    std::vector<at::Tensor> env(g.values.size());
    const at::Tensor x = at::randn({2, 3}), b = at::randn({3});
    env[g.inputs[0].value] = x;
    env[g.inputs[1].value] = b;
    exec.run(env);
    EXPECT_TRUE(at::allclose(env[g.outputs[0].value], at::relu(x + 0.5 * b), 1e-6, 1e-7));
  };
  check();
  auto written = files();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].extension(), ".pjrt");
  const auto size = std::filesystem::file_size(written[0]);
  const auto stamp = std::filesystem::last_write_time(written[0]);
  check();  // loaded: the file is left as it was
  EXPECT_EQ(std::filesystem::last_write_time(written[0]), stamp);
  // Repaired: whole again, so the next compile loads it and leaves it as it is.
  auto expect_repaired = [&](const std::string& damaged) {
    check();
    ASSERT_EQ(files().size(), 1u);
    EXPECT_NE(file_bytes(written[0]), damaged);
    const auto repaired = std::filesystem::last_write_time(written[0]);
    check();
    EXPECT_EQ(std::filesystem::last_write_time(written[0]), repaired);
  };
  std::filesystem::resize_file(written[0], size - 100);  // cut short
  expect_repaired(file_bytes(written[0]));
  EXPECT_EQ(std::filesystem::file_size(written[0]), size);
  // Three bytes changed inside the executable (a changed byte may still parse, and the plugin's
  // deserializer need not survive it): the entry's hash tells, so they never reach the plugin.
  {
    std::fstream f(written[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 200));
    f.write("\x5a\xa5\x5a", 3);
  }
  expect_repaired(file_bytes(written[0]));
  // An entry of another format (the first version had no tag and no hash): compiled again.
  std::ofstream(written[0], std::ios::binary | std::ios::trunc) << std::string(64, '\x01');
  expect_repaired(file_bytes(written[0]));
  std::filesystem::remove_all(dir);
}

// Max pooling with indices and its backward against ATen: strided, padded, dilated and ceil-mode
// windows, and ties (a constant region) and -inf values, where the first maximum's index counts.
TEST(NeuronPjrt, MaxPoolWithIndicesAndItsBackwardMatchAten) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[2,3,9,8]{216,72,8,1} input "x"
  input %1 : f32[2,3,5,4]{60,20,4,1} input "dy"
  input %2 : f32[2,3,5,4]{60,20,4,1} input "dy2"
  %3 : f32[2,3,5,4]{60,20,4,1}, %4 : i64[2,3,5,4]{60,20,4,1} = aten::max_pool2d_with_indices(%0, i[3, 3], i[2, 2], i[1, 1], i[1, 1], false)
  %5 : f32[2,3,9,8]{216,72,8,1} = aten::max_pool2d_with_indices_backward(%1, %0, i[3, 3], i[2, 2], i[1, 1], i[1, 1], false, %4)
  %6 : f32[2,3,5,4]{60,20,4,1}, %7 : i64[2,3,5,4]{60,20,4,1} = aten::max_pool2d_with_indices(%0, i[2], i[], i[0], i[1], true)
  %8 : f32[2,3,9,8]{216,72,8,1} = aten::max_pool2d_with_indices_backward(%2, %0, i[2], i[], i[0], i[1], true, %7)
  %9 : f32[2,3,3,3]{27,9,3,1}, %10 : i64[2,3,3,3]{27,9,3,1} = aten::max_pool2d_with_indices(%0, i[2, 2], i[3, 2], i[0, 0], i[2, 2], false)
  output %3 result "y"
  output %4 result "idx"
  output %5 result "dx"
  output %6 result "y_ceil"
  output %7 result "idx_ceil"
  output %8 result "dx_ceil"
  output %9 result "y_dil"
  output %10 result "idx_dil"
}
)");
  for (int trial = 0; trial < 2; ++trial) {
    at::Tensor x = at::randn({2, 3, 9, 8});
    x.index_put_({0, 0, at::indexing::Slice(0, 4), at::indexing::Slice(0, 4)}, 1.5);  // ties
    x.index_put_({1, 2, at::indexing::Slice(2, 6), at::indexing::Slice(2, 6)}, -INFINITY);
    const std::vector<at::Tensor> in = {x, at::randn({2, 3, 5, 4}), at::randn({2, 3, 5, 4})};
    size_t claimed = 0;
    neuron_vs_eager(g, in, {}, &claimed);
    EXPECT_EQ(claimed, g.nodes.size());
  }
}

// Golden text: a run-time scalar becomes a rank-0 parameter after the inputs, broadcast where used;
// a convolution carries its dimension numbers, strides, padding, dilation and groups.
TEST(NeuronStablehlo, EmitsRuntimeScalarsAsParametersAndConvolutionsWithTheirAttributes) {
  const ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  input %0 : f32[4]{1} input "v"
  %1 : f32[4]{1} = aten::div.Scalar(%0, $0:scalar(0.5))
  output %1 result "y"
}
)");
  View v(g);
  std::vector<int32_t> rts;
  EXPECT_EQ(neuron::emit_stablehlo(v.pg(), &rts),
            "module @kiln_group {\n"
            "  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<f32>) -> (tensor<4xf32>) {\n"
            "    %0 = \"stablehlo.broadcast_in_dim\"(%arg1) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> "
            "tensor<4xf32>\n"
            "    %1 = \"stablehlo.divide\"(%arg0, %0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
            "    \"func.return\"(%1) : (tensor<4xf32>) -> ()\n"
            "  }\n"
            "}\n");
  EXPECT_EQ(rts, std::vector<int32_t>{0});
  const ir::Graph c = ir::parse(R"(graph {
  input %0 : f32[1,4,5,5]{100,25,5,1} input "x"
  input %1 : f32[6,2,3,3]{18,9,3,1} input "w"
  %2 : f32[1,6,3,2]{36,6,2,1} = aten::convolution(%0, %1, None, i[2, 3], i[1, 1], i[1, 1], false, i[0, 0], 2)
  output %2 result "y"
}
)");
  View cv(c);
  EXPECT_EQ(neuron::emit_stablehlo(cv.pg()),
            "module @kiln_group {\n"
            "  func.func public @main(%arg0: tensor<1x4x5x5xf32>, %arg1: tensor<6x2x3x3xf32>) -> "
            "(tensor<1x6x3x2xf32>) {\n"
            "    %0 = \"stablehlo.convolution\"(%arg0, %arg1) {batch_group_count = 1 : i64, dimension_numbers = "
            "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, feature_group_count = 2 : i64, "
            "lhs_dilation = array<i64: 1, 1>, padding = dense<[[1, 1], [1, 1]]> : tensor<2x2xi64>, precision_config = "
            "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = "
            "array<i64: 1, 1>, window_strides = array<i64: 2, 3>} : (tensor<1x4x5x5xf32>, tensor<6x2x3x3xf32>) -> "
            "tensor<1x6x3x2xf32>\n"
            "    \"func.return\"(%0) : (tensor<1x6x3x2xf32>) -> ()\n"
            "  }\n"
            "}\n");
}

namespace {

double rel_norm(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  const double diff = (g - w).norm().item<double>(), scale = w.norm().item<double>();
  if (std::isnan(diff)) return INFINITY;
  return scale > 0 ? diff / scale : diff;
}

// A workload trained through the neuron backend (XLA's CPU PJRT plugin) under dynamic shapes, and
// in LibTorch eager on the same fresh batches: `sizes[s]` is the sequence length at step s (the
// batch size with `vary_batch`). What the compile cache holds after the step that made the
// symbolic plan and at the end: modules compiled padded (they take the sizes, %size0) and the rest.
struct NeuronDynamicRun {
  kiln::StepStats stats;
  size_t padded_at_symbolic = 0, padded = 0, exact_at_symbolic = 0, exact = 0;
  double worst_parameter = 0;
  std::vector<std::string> warnings;
};

NeuronDynamicRun neuron_dynamic(const std::string& name, const std::vector<int64_t>& sizes, bool vary_batch, double tol,
                                const std::string& optimizer = "") {
  const std::string dir = ::testing::TempDir() + "/kiln_neuron_dynamic_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = "neuron";
  args.runtime.plugin_dirs = {KILN_INTREE_PLUGIN_DIR};
  args.runtime.cache_dir = dir;
  args.plugin_options["neuron"]["pjrt_plugin"] = KILN_PJRT_CPU_PLUGIN;
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const int64_t full_batch = vary_batch ? *std::max_element(sizes.begin(), sizes.end()) : 0;
  auto ref = kiln::make_workload(name, {"cpu", seed, full_batch, optimizer});
  auto w = kiln::make_workload(name, {"cpu", seed, full_batch, optimizer});
  auto ref_step = kiln::workload_step(ref);
  LogCapture log;
  auto step = kiln::compile_step(kiln::workload_step(w), {{w.model}, {w.optimizer.get()}}, args);
  auto modules = [&](bool padded) {
    size_t n = 0;
    if (std::filesystem::exists(dir + "/neuron"))
      for (const auto& e : std::filesystem::directory_iterator(dir + "/neuron"))
        n += (file_bytes(e.path()).find("%size0: tensor<i64>") != std::string::npos) == padded;
    return n;
  };
  NeuronDynamicRun r;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const at::Tensor x = vary_batch ? ref.input.narrow(0, 0, sizes[s]) : ref.input.narrow(1, 0, sizes[s]);
    const at::Tensor y = vary_batch ? ref.target.narrow(0, 0, sizes[s]) : ref.target.narrow(1, 0, sizes[s]);
    const at::Tensor xi = x.is_floating_point() ? at::randn_like(x) : at::randint_like(x, 0, 64);
    const at::Tensor yi =
        y.is_floating_point() ? at::randn_like(y) : (name == "gpt" ? at::randint_like(y, 0, 64) : y.clone());
    const at::Tensor want = ref_step({xi, yi})[0];
    const at::Tensor got = step({xi.clone(), yi.clone()})[0];
    EXPECT_LE(rel_norm(got, want), tol) << name << " loss at step " << s << " (size " << sizes[s] << ")";
    if (step.stats().compiles == 2 && r.padded_at_symbolic == 0 && r.exact_at_symbolic == 0)
      r.padded_at_symbolic = modules(true), r.exact_at_symbolic = modules(false);
  }
  // The parameters within ten times the losses' tolerance: AdamW divides each gradient by its own
  // running scale, so one that is zero up to rounding (the keys' bias: softmax ignores a shift)
  // moves its parameter by rounding noise made as large as a real update.
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i) {
    const double e = rel_norm(pw[i].value(), pr[i].value());
    EXPECT_LE(e, 10 * tol) << name << " parameter " << pr[i].key();
    r.worst_parameter = std::max(r.worst_parameter, e);
  }
  std::cout << name << ": parameters within " << r.worst_parameter << " of eager's\n";
  r.stats = step.stats();
  r.padded = modules(true), r.exact = modules(false);
  r.warnings = log.warnings();
  std::filesystem::remove_all(dir);
  return r;
}

std::set<int64_t> pow2_buckets(const std::vector<int64_t>& sizes) {
  std::set<int64_t> b;
  for (int64_t s : sizes) b.insert(neuron::bucket_sizes("pow2", {s})[0]);
  return b;
}

}  // namespace

// A language model whose sequence length changes every step: the symbolic plan's groups are each
// compiled once per bucket of lengths (16, 32, 64), padded inside the plugin, and every step
// matches eager - lengths inside a bucket, at its edge, and past the lengths the captures saw.
TEST(NeuronDynamic, GptOverManyLengthsCompilesEachGroupOncePerBucketAndMatchesEager) {
  const std::vector<int64_t> lengths = {24, 24, 40, 17, 33, 64, 29, 40, 9, 50, 32, 16, 61};
  const auto r = neuron_dynamic("gpt", lengths, false, 1e-4);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.dynamic_dims, std::vector<std::string>{"input 0 dim 1"});
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("compiled for each size"), std::string::npos) << w;
  // The symbolic plan's groups, compiled at the bucket of 40 (64) when it was made; one module each
  // per bucket met after: 64, 32, 16.
  ASSERT_GT(r.padded_at_symbolic, 0u);
  const std::vector<int64_t> after(lengths.begin() + 2, lengths.end());
  EXPECT_EQ(r.padded, r.padded_at_symbolic * pow2_buckets(after).size());
  EXPECT_EQ(r.exact, r.exact_at_symbolic);  // the static first plan's, and nothing per length
}

// A classifier whose last batch is short: the batch dim padded (the loss's rows ignored, the
// weight gradients' sums over the batch masked); two epochs.
TEST(NeuronDynamic, AShortLastBatchIsPaddedAndMatchesEager) {
  const std::vector<int64_t> batches = {16, 16, 16, 5, 16, 16, 16, 5, 11};
  const auto r = neuron_dynamic("mlp", batches, true, 1e-5);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("compiled for each size"), std::string::npos) << w;
  ASSERT_GT(r.padded_at_symbolic, 0u);
  EXPECT_EQ(r.padded, r.padded_at_symbolic * 2);  // buckets 8 (5) and 16 (16, 11)
}

// A group the padding does not cover (a convolution over a padded batch) is compiled for each size
// it meets, saying so once, and still matches eager. With SGD: under Adam the batch norms' biases,
// which start at zero, move by rounding noise made as large as a real update.
TEST(NeuronDynamic, AGroupWithoutAPaddingPlanIsCompiledPerSizeAndSaysWhy) {
  const auto r = neuron_dynamic("cnn", {8, 8, 12, 5, 12}, true, 1e-4, "sgd");
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  size_t said = 0;
  for (const auto& w : r.warnings)
    said += w.find("is compiled for each size it meets, not padded to a bucket") != std::string::npos;
  EXPECT_GE(said, 1u);
}

// Bucket policies: powers of two, multiples, exact; anything else is refused with what it takes.
TEST(NeuronPadding, BucketPolicies) {
  EXPECT_EQ(neuron::bucket_sizes("pow2", {2, 3, 17, 64, 65}), (std::vector<int64_t>{2, 4, 32, 64, 128}));
  EXPECT_EQ(neuron::bucket_sizes("16", {2, 16, 17}), (std::vector<int64_t>{16, 16, 32}));
  EXPECT_EQ(neuron::bucket_sizes("exact", {3, 17}), (std::vector<int64_t>{3, 17}));
  for (const char* bad : {"", "0", "-4", "pow3", "8x"}) {
    try {
      neuron::check_bucket_policy(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const plugin::Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected \"pow2\""), std::string::npos) << e.what();
    }
  }
}

namespace {
// A CUDA PJRT plugin: KILN_PJRT_CUDA_PLUGIN, or JAX's where the GPU machine keeps it.
std::string cuda_pjrt_plugin() {
  if (const char* p = std::getenv("KILN_PJRT_CUDA_PLUGIN")) return p;
  const char* jax = "/opt/torch/.venv/lib/python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so";
  return std::filesystem::exists(jax) ? jax : "";
}
}  // namespace

// LibTorch's CUDA tensors through a CUDA PJRT plugin in the same process: the inputs are views of
// the tensors' own memory (a CUDA input without one is an error, never a host round trip) and the
// results are copied device to device into kiln's outputs; each output matches the eager executor.
// Only the plugin opens a client here (a second one would take the GPU's memory a second time).
TEST(NeuronCuda, CudaTensorsRunThroughACudaPjrtPluginWhereTheyAre) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  const std::string path = cuda_pjrt_plugin();
  if (path.empty()) GTEST_SKIP() << "no CUDA PJRT plugin (set KILN_PJRT_CUDA_PLUGIN to one)";
  TrainingArguments args;
  args.plugin_options["neuron"]["pjrt_plugin"] = path;
  auto plugin = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(args));
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[64,96]{96,1} on cuda:0 input "x"
  input %1 : f32[96,48]{48,1} on cuda:0 input "w"
  input %2 : f32[48]{1} on cuda:0 input "b"
  %3 : f32[64,48]{48,1} on cuda:0 = aten::mm(%0, %1)
  %4 : f32[64,48]{48,1} on cuda:0 = aten::add.Tensor(%3, %2, scalar(1))
  %5 : f32[64,48]{48,1} on cuda:0 = aten::relu(%4)
  %6 : f32[48]{1} on cuda:0 = aten::sum.dim_IntList(%5, i[0], false, None)
  %7 : f32[]{} on cuda:0 = aten::sum(%5, None)
  output %7 result "loss"
  output %5 result "y"
  output %6 result "col"
}
)");
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(exec.stats().nodes_compiled, g.nodes.size());
  for (const auto& o : exec.groups()) EXPECT_TRUE(o.compiled) << o.reason;
  for (int trial = 0; trial < 3; ++trial) {
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    std::vector<at::Tensor> inputs = {at::randn({64, 96}, cuda), at::randn({96, 48}, cuda), at::randn({48}, cuda)};
    std::vector<at::Tensor> env(g.values.size()), ref(g.values.size());
    for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = ref[g.inputs[i].value] = inputs[i];
    EagerExecutor(g).run(ref);
    exec.run(env);
    for (const auto& o : g.outputs) {
      const at::Tensor& got = env[o.value];
      ASSERT_TRUE(got.is_cuda()) << o.name;
      const at::Tensor want = ref[o.value].to(at::kDouble);
      // Sums against the sum of their terms' magnitudes (ReLU's outputs are not negative).
      const double scale = want.abs().sum().item<double>();
      const double rel = (got.to(at::kDouble) - want).abs().sum().item<double>() / std::max(scale, 1e-30);
      EXPECT_LE(rel, 1e-5) << o.name << " trial " << trial;
    }
  }
  // Available on a CUDA device when named, saying which plugin and platform.
  std::vector<PluginDevice> gpu(1);
  gpu[0].kind = KILN_DEVICE_CUDA;
  gpu[0].name = "test GPU";
  const PluginAvailability a = plugin->available(gpu);
  EXPECT_TRUE(a.available) << a.reason;
  EXPECT_NE(a.reason.find("platform cuda"), std::string::npos) << a.reason;
}

// What kept the matmuls of a CUDA step eager before: `t` of a weight feeding `addmm` and `mm`, a
// transposed input, channels-last activations and a result handed on transposed. Every node is
// claimed, each such tensor is viewed where it lies (its dims in storage order, transposed inside
// the module) and each result written where its output lies; the outputs match the eager executor.
// An input handed with other strides than it was captured with is an error that says so (PJRT
// views a CUDA tensor only as the dense layout compiled for), never a wrong read.
TEST(NeuronCuda, TransposedWeightsAndChannelsLastTensorsAreClaimedAndViewedWhereTheyLie) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  const std::string path = cuda_pjrt_plugin();
  if (path.empty()) GTEST_SKIP() << "no CUDA PJRT plugin (set KILN_PJRT_CUDA_PLUGIN to one)";
  TrainingArguments args;
  args.plugin_options["neuron"]["pjrt_plugin"] = path;
  auto plugin = PluginRegistry::load_file(KILN_NEURON_PLUGIN, torch_host_services(args));
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[64,96]{96,1} on cuda:0 input "x"
  input %1 : f32[48,96]{96,1} on cuda:0 param "w"
  input %2 : f32[48]{1} on cuda:0 param "b"
  input %3 : f32[96,32]{1,96} on cuda:0 input "wt"
  input %4 : f32[4,8,6,5]{240,1,40,8} on cuda:0 input "img"
  input %5 : f32[8,1,1]{1,1,1} on cuda:0 param "scale"
  %6 : f32[96,48]{1,96} on cuda:0 = aten::t(%1)
  %7 : f32[64,48]{48,1} on cuda:0 = aten::addmm(%2, %0, %6, scalar(1), scalar(1))
  %8 : f32[64,48]{48,1} on cuda:0 = aten::relu(%7)
  %9 : f32[64,32]{32,1} on cuda:0 = aten::mm(%0, %3)
  %10 : f32[32,64]{1,32} on cuda:0 = aten::t(%9)
  %11 : f32[32,64]{1,32} on cuda:0 = aten::neg(%10)
  %12 : f32[4,8,6,5]{240,1,40,8} on cuda:0 = aten::mul.Tensor(%4, %5)
  %13 : f32[4,8,6,5]{240,1,40,8} on cuda:0 = aten::relu(%12)
  %14 : f32[8]{1} on cuda:0 = aten::sum.dim_IntList(%13, i[0, 2, 3], false, None)
  output %8 result "y"
  output %11 result "neg_yt"
  output %13 result "act"
  output %14 result "per_channel"
}
)");
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(exec.stats().nodes_compiled, g.nodes.size());
  for (const auto& o : exec.groups()) EXPECT_TRUE(o.compiled) << o.reason;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto draw = [&] {
    return std::vector<at::Tensor>{at::randn({64, 96}, cuda),
                                   at::randn({48, 96}, cuda),
                                   at::randn({48}, cuda),
                                   at::randn({32, 96}, cuda).t(),
                                   at::randn({4, 8, 6, 5}, cuda).contiguous(at::MemoryFormat::ChannelsLast),
                                   at::randn({8, 1, 1}, cuda)};
  };
  auto check = [&](const ir::Graph& graph, PartitionedExecutor& ex, const std::vector<at::Tensor>& inputs,
                   const std::string& label) {
    std::vector<at::Tensor> env(graph.values.size()), ref(graph.values.size());
    for (size_t i = 0; i < inputs.size(); ++i) env[graph.inputs[i].value] = ref[graph.inputs[i].value] = inputs[i];
    EagerExecutor(graph).run(ref);
    ex.run(env);
    for (const auto& o : graph.outputs) {
      const at::Tensor& got = env[o.value];
      ASSERT_TRUE(got.is_cuda()) << o.name << " " << label;
      EXPECT_EQ(got.strides().vec(), graph.values[o.value].meta.strides) << o.name << " " << label;
      const at::Tensor want = ref[o.value].to(at::kDouble);
      const double scale = want.abs().sum().item<double>();
      const double rel = (got.to(at::kDouble) - want).abs().sum().item<double>() / std::max(scale, 1e-30);
      EXPECT_LE(rel, 1e-5) << o.name << " " << label;
    }
  };
  for (int trial = 0; trial < 3; ++trial) check(g, exec, draw(), "trial " + std::to_string(trial));
  // Inputs one element into their storage (off the views' alignment) are copied on the device into
  // buffers of their own first: the same results.
  auto at_offset = [](const at::Tensor& t) {
    at::Tensor storage = at::empty({t.numel() + 1}, t.options());
    return storage.narrow(0, 1, t.numel()).view(t.sizes()).copy_(t);
  };
  std::vector<at::Tensor> shifted = draw();
  shifted[0] = at_offset(shifted[0]);
  shifted[2] = at_offset(shifted[2]);
  ASSERT_NE(reinterpret_cast<uintptr_t>(shifted[0].data_ptr()) % 64, 0u);
  check(g, exec, shifted, "inputs at an offset");
  // A tensor without elements, whose address may be null: a buffer of its own as well.
  const ir::Graph e = ir::parse(R"(graph {
  input %0 : f32[0,5]{5,1} on cuda:0 input "none"
  input %1 : f32[5]{1} on cuda:0 input "b"
  %2 : f32[0,5]{5,1} on cuda:0 = aten::add.Tensor(%0, %1, scalar(1))
  %3 : f32[5]{1} on cuda:0 = aten::sum.dim_IntList(%2, i[0], false, None)
  %4 : f32[5]{1} on cuda:0 = aten::add.Tensor(%3, %1, scalar(2))
  output %2 result "empty"
  output %4 result "twice_b"
}
)");
  PartitionedExecutor empty(e, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(empty.stats().nodes_compiled, e.nodes.size());
  check(e, empty, {at::empty({0, 5}, cuda), at::randn({5}, cuda)}, "no elements");
  // The transposed input handed row-major: the module reads it in the order it was compiled for,
  // which its memory no longer has.
  std::vector<at::Tensor> inputs = draw();
  inputs[3] = inputs[3].contiguous();
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  try {
    exec.run(env);
    FAIL() << "a CUDA input with other strides than captured ran";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA input"), std::string::npos) << what;
    EXPECT_NE(what.find("has strides [32, 1], and the group was compiled for the strides it was captured with, "
                        "[1, 96]"),
              std::string::npos)
        << what;
  }
}
