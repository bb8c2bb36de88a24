// The hpu_backend: the Synapse graph it lowers a subgraph to (golden text), and the plugin through
// the real host with the stand-in libSynapse.so (fake_synapse.cpp), which checks every call against
// the API's rules and runs each recipe with ATen: every lowered op and whole groups against the
// eager executor on fresh random inputs, in float32 and bfloat16, the recipe caches, and the
// failures the stand-in injects.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/workloads.h"
#include "../cli_run.h"
#include "../trainer/log_capture.h"
#include "../hardware_probe/fake_machine.h"
#include "synapse_lower.h"

using namespace kiln;

namespace {

// The stand-in's counters and violations (kiln_fake_synapse_report). Opened here and kept open:
// the plugin's dlopen of the same path gets this same copy.
std::string fake_report() {
  static void* h = dlopen(KILN_FAKE_SYNAPSE, RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::string("cannot open the stand-in: ") + dlerror();
  auto fn = reinterpret_cast<const char* (*)()>(dlsym(h, "kiln_fake_synapse_report"));
  return fn ? fn() : "the stand-in has no kiln_fake_synapse_report";
}

int64_t counter(const std::string& report, const std::string& name) {
  const auto at = report.find(name + " ");
  return at == std::string::npos ? -1 : std::stoll(report.substr(at + name.size() + 1));
}

std::shared_ptr<LoadedPlugin> load(const std::string& cache_dir = "") {
  TrainingArguments args;
  args.plugin_options["hpu_backend"]["synapse_library"] = KILN_FAKE_SYNAPSE;
  args.runtime.cache_dir = cache_dir;  // no recipe cache on disk unless asked for
  return PluginRegistry::load_file(KILN_HPU_PLUGIN, torch_host_services(args));
}

// The whole graph as one subgraph view, as the host hands a group to the plugin.
struct View {
  explicit View(const ir::Graph& g) {
    std::vector<int32_t> nodes;
    for (size_t i = 0; i < g.nodes.size(); ++i) nodes.push_back(static_cast<int32_t>(i));
    std::vector<ir::ValueId> ins, outs;
    for (const auto& in : g.inputs) ins.push_back(in.value);
    for (const auto& o : g.outputs) outs.push_back(o.value);
    view = std::make_unique<GraphView>(g, nodes, ins, outs);
  }
  plugin::Graph pg() const { return plugin::Graph(&view->view()); }
  std::unique_ptr<GraphView> view;
};

// Runs `g` through the plugin (every node it claims) and the eager executor on the same inputs;
// returns the largest relative error (by norm) over the outputs, the nodes compiled in `claimed`.
double hpu_vs_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs, const std::vector<c10::IValue>& scalars,
                    size_t* claimed, const std::string& what) {
  auto plugin = load();
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  *claimed = exec.stats().nodes_compiled;
  for (const auto& o : exec.groups()) EXPECT_TRUE(o.compiled) << what << ": " << o.reason;
  std::vector<at::Tensor> env(g.values.size()), ref(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = ref[g.inputs[i].value] = inputs[i].clone();
  EagerExecutor(g).run(ref, &scalars);
  exec.run(env, &scalars);
  double worst = 0;
  for (const auto& o : g.outputs) {
    const at::Tensor got = env[o.value].to(at::kDouble), want = ref[o.value].to(at::kDouble);
    EXPECT_EQ(got.sizes(), want.sizes()) << what << " " << o.name;
    const double diff = (got - want).norm().item<double>(), scale = want.norm().item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// One op (or a small chain) per case: the graph in `dt`, its inputs drawn fresh for each trial.
struct OpCase {
  const char* name;
  std::string graph;  // "DT" stands for the dtype
  std::function<std::vector<at::Tensor>(at::ScalarType)> inputs;
  size_t nodes;      // all claimed
  bool bf16 = true;  // lowered in bfloat16 too
};

std::string with_dtype(std::string g, const char* dt) {
  for (size_t at = g.find("DT"); at != std::string::npos; at = g.find("DT", at)) g.replace(at, 2, dt);
  return g;
}

std::vector<OpCase> op_cases() {
  auto rn = [](std::vector<int64_t> s, at::ScalarType t) { return at::randn(s).to(t); };
  auto pos = [](std::vector<int64_t> s, at::ScalarType t) { return (at::rand(s) + 0.5).to(t); };
  return {
      {"mm", R"(graph {
  input %0 : DT[8,16]{16,1} input "x"
  input %1 : DT[16,4]{4,1} input "w"
  %2 : DT[8,4]{4,1} = aten::mm(%0, %1)
  output %2 result "y"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 16}, t), rn({16, 4}, t)};
       },
       1},
      {"addmm of a transposed weight", R"(graph {
  input %0 : DT[4]{1} param "b"
  input %1 : DT[8,16]{16,1} input "x"
  input %2 : DT[4,16]{16,1} param "w"
  %3 : DT[16,4]{1,16} = aten::t(%2)
  %4 : DT[8,4]{4,1} = aten::addmm(%0, %1, %3, scalar(1), scalar(1))
  output %4 result "y"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({4}, t), rn({8, 16}, t), rn({4, 16}, t)};
       },
       2},
      {"addmm with beta and alpha, t of the input", R"(graph {
  input %0 : DT[8,4]{4,1} param "b"
  input %1 : DT[16,8]{8,1} input "x"
  input %2 : DT[16,4]{4,1} param "w"
  %3 : DT[8,16]{1,8} = aten::t(%1)
  %4 : DT[8,4]{4,1} = aten::addmm(%0, %3, %2, scalar(0.5), scalar(2))
  output %4 result "y"
  output %3 result "xt"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 4}, t), rn({16, 8}, t), rn({16, 4}, t)};
       },
       2},
      {"bmm", R"(graph {
  input %0 : DT[2,3,4]{12,4,1} input "a"
  input %1 : DT[2,4,5]{20,5,1} input "b"
  %2 : DT[2,3,5]{15,5,1} = aten::bmm(%0, %1)
  output %2 result "y"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({2, 3, 4}, t), rn({2, 4, 5}, t)};
       },
       1},
      {"binary ops with broadcasting and alpha", R"(graph {
  input %0 : DT[8,16]{16,1} input "x"
  input %1 : DT[16]{1} input "b"
  input %2 : DT[8,1]{1,1} input "c"
  %3 : DT[8,16]{16,1} = aten::add.Tensor(%0, %1, scalar(0.5))
  %4 : DT[8,16]{16,1} = aten::sub.Tensor(%3, %2, scalar(2))
  %5 : DT[8,16]{16,1} = aten::mul.Tensor(%4, %1)
  %6 : DT[8,16]{16,1} = aten::div.Tensor(%5, %2)
  output %6 result "y"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 16}, t), rn({16}, t), pos({8, 1}, t)};
       },
       4},
      {"Scalar ops", R"(graph {
  input %0 : DT[8,16]{16,1} input "x"
  %1 : DT[8,16]{16,1} = aten::add.Scalar(%0, scalar(3), scalar(1))
  %2 : DT[8,16]{16,1} = aten::sub.Scalar(%1, scalar(0.25), scalar(2))
  %3 : DT[8,16]{16,1} = aten::mul.Scalar(%2, scalar(-1.5))
  %4 : DT[8,16]{16,1} = aten::div.Scalar(%3, scalar(7))
  output %4 result "y"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 16}, t)};
       },
       4},
      {"relu and its backward", R"(graph {
  input %0 : DT[8,16]{16,1} input "x"
  input %1 : DT[8,16]{16,1} input "g"
  %2 : DT[8,16]{16,1} = aten::relu(%0)
  %3 : DT[8,16]{16,1} = aten::threshold_backward(%1, %2, 0)
  output %2 result "y"
  output %3 result "dx"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 16}, t), rn({8, 16}, t)};
       },
       2},
      {"unary ops", R"(graph {
  input %0 : DT[6,5]{5,1} input "x"
  input %1 : DT[6,5]{5,1} input "p"
  %2 : DT[6,5]{5,1} = aten::neg(%0)
  %3 : DT[6,5]{5,1} = aten::exp(%0)
  %4 : DT[6,5]{5,1} = aten::tanh(%0)
  %5 : DT[6,5]{5,1} = aten::sigmoid(%0)
  %6 : DT[6,5]{5,1} = aten::sqrt(%1)
  %7 : DT[6,5]{5,1} = aten::log(%1)
  %8 : DT[6,5]{5,1} = aten::rsqrt(%1)
  %9 : DT[6,5]{5,1} = aten::gelu(%0, "none")
  %10 : DT[6,5]{5,1} = aten::gelu_backward(%1, %0, "none")
  output %9 result "gelu"
  output %10 result "dgelu"
  output %2 result "neg"
  output %3 result "exp"
  output %4 result "tanh"
  output %5 result "sigmoid"
  output %6 result "sqrt"
  output %7 result "log"
  output %8 result "rsqrt"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({6, 5}, t), pos({6, 5}, t)};
       },
       9},
      {"sums and means", R"(graph {
  input %0 : DT[4,6,5]{30,5,1} input "x"
  %1 : DT[6,5]{5,1} = aten::sum.dim_IntList(%0, i[0], false, None)
  %2 : DT[4,1,5]{5,5,1} = aten::sum.dim_IntList(%0, i[1], true, None)
  %3 : DT[]{} = aten::sum(%0, None)
  %4 : DT[4]{1} = aten::mean.dim(%0, i[-1, 1], false, None)
  %5 : DT[5]{1} = aten::sum.dim_IntList(%0, i[0, 1], false, None)
  output %1 result "s0"
  output %2 result "s1"
  output %3 result "all"
  output %4 result "m"
  output %5 result "s01"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({4, 6, 5}, t)};
       },
       5},
      {"softmax, log_softmax and their backward", R"(graph {
  input %0 : DT[4,6]{6,1} input "x"
  input %1 : DT[4,6]{6,1} input "g"
  %2 : DT[4,6]{6,1} = aten::_softmax(%0, -1, false)
  %3 : DT[4,6]{6,1} = aten::_softmax_backward_data(%1, %2, -1, dtype(DT))
  %4 : DT[4,6]{6,1} = aten::_log_softmax(%0, 0, false)
  %5 : DT[4,6]{6,1} = aten::_log_softmax_backward_data(%1, %4, 0, dtype(DT))
  output %2 result "sm"
  output %3 result "dsm"
  output %4 result "lsm"
  output %5 result "dlsm"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({4, 6}, t), rn({4, 6}, t)};
       },
       4},
      {"views", R"(graph {
  input %0 : DT[8,16]{16,1} input "x"
  input %1 : DT[16,8]{8,1} input "w"
  %2 : DT[4,32]{32,1} = aten::view(%0, i[4, 32])
  %3 : DT[8,16]{1,8} = aten::t(%1)
  %4 : DT[8,16]{16,1} = aten::add.Tensor(%0, %3, scalar(1))
  %5 : DT[128]{1} = aten::_unsafe_view(%4, i[128])
  %6 : DT[8,16]{16,1} = aten::clone(%0, None)
  output %2 result "v"
  output %5 result "flat"
  output %6 result "copy"
})",
       // The view handed out at the group's end is metadata over the group's output (the host's),
       // not a node of the group.
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 16}, t), rn({16, 8}, t)};
       },
       4},
      {"permute and transpose", R"(graph {
  input %0 : DT[2,3,4]{12,4,1} input "x"
  input %1 : DT[6,5]{5,1} input "w"
  input %2 : DT[4,5]{5,1} input "a"
  %3 : DT[4,2,3]{1,12,4} = aten::permute(%0, i[2, 0, 1])
  %4 : DT[4,2,3]{6,3,1} = aten::neg(%3)
  %5 : DT[2,4,3]{12,1,4} = aten::transpose.int(%0, -1, 1)
  %6 : DT[2,4,3]{12,3,1} = aten::exp(%5)
  %7 : DT[5,6]{1,5} = aten::permute(%1, i[1, 0])
  %8 : DT[4,6]{6,1} = aten::mm(%2, %7)
  %9 : DT[5,6]{6,1} = aten::mul.Scalar(%7, scalar(2))
  output %4 result "p"
  output %6 result "tr"
  output %8 result "mm"
  output %9 result "wt2"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({2, 3, 4}, t), rn({6, 5}, t), rn({4, 5}, t)};
       },
       7},
      {"nll_loss_backward with the total_weight it is given", R"(graph {
  input %0 : DT[]{} input "go"
  input %1 : DT[8,10]{10,1} input "x"
  input %2 : i64[8]{1} input "t"
  input %3 : DT[]{} input "tw"
  %4 : DT[8,10]{10,1} = aten::nll_loss_backward(%0, %1, %2, None, 1, -100, %3)
  %5 : DT[8,10]{10,1} = aten::nll_loss_backward(%0, %1, %2, None, 2, 3, %3)
  output %4 result "mean"
  output %5 result "sum"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({}, t), rn({8, 10}, t), at::randint(0, 10, {8}, at::kLong), pos({}, t)};
       },
       2},
      {"convolution and its backward (stride, padding, dilation, bias)", R"(graph {
  input %0 : DT[4,6,11,9]{594,99,9,1} input "x"
  input %1 : DT[8,6,3,3]{54,9,3,1} param "w"
  input %2 : DT[8]{1} param "b"
  input %3 : DT[4,8,6,5]{240,30,5,1} input "g"
  input %4 : DT[4,8,7,7]{392,49,7,1} input "g2"
  %5 : DT[4,8,6,5]{240,30,5,1} = aten::convolution(%0, %1, %2, i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1)
  %6 : DT[4,8,7,7]{392,49,7,1} = aten::convolution(%0, %1, None, i[1, 1], i[0, 1], i[2, 2], false, i[0, 0], 1)
  %7 : DT[4,6,11,9]{594,99,9,1}, %8 : DT[8,6,3,3]{54,9,3,1}, %9 : DT[8]{1} = aten::convolution_backward(%3, %0, %1, i[8], i[2, 2], i[1, 1], i[1, 1], false, i[0, 0], 1, b[true, true, true])
  %10 : DT[4,6,11,9]{594,99,9,1}, %11 : DT[8,6,3,3]{54,9,3,1}, %12 : DT[8]{1} = aten::convolution_backward(%4, %0, %1, i[8], i[1, 1], i[0, 1], i[2, 2], false, i[0, 0], 1, b[true, true, true])
  output %5 result "conv"
  output %6 result "conv_dilated"
  output %7 result "dx"
  output %8 result "dw"
  output %9 result "db"
  output %10 result "dx_dilated"
  output %11 result "dw_dilated"
  output %12 result "db_dilated"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({4, 6, 11, 9}, t), rn({8, 6, 3, 3}, t), rn({8}, t), rn({4, 8, 6, 5}, t),
                                        rn({4, 8, 7, 7}, t)};
       },
       4},
      {"layer norm and its backward", R"(graph {
  input %0 : DT[2,5,12]{60,12,1} input "x"
  input %1 : DT[12]{1} param "w"
  input %2 : DT[12]{1} param "b"
  input %3 : DT[2,5,12]{60,12,1} input "g"
  %4 : DT[2,5,12]{60,12,1}, %5 : DT[2,5,1]{5,1,1}, %6 : DT[2,5,1]{5,1,1} = aten::native_layer_norm(%0, i[12], %1, %2, 1e-05)
  %7 : DT[2,5,12]{60,12,1}, %8 : DT[12]{1}, %9 : DT[12]{1} = aten::native_layer_norm_backward(%3, %0, i[12], %5, %6, %1, %2, b[true, true, true])
  output %4 result "y"
  output %5 result "mean"
  output %6 result "rstd"
  output %7 result "dx"
  output %8 result "dw"
  output %9 result "db"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({2, 5, 12}, t), rn({12}, t), rn({12}, t), rn({2, 5, 12}, t)};
       },
       2},
      {"layer norm with float32 weight and bias, and its backward", R"(graph {
  input %0 : DT[3,4,10]{40,10,1} input "x"
  input %1 : f32[10]{1} param "w"
  input %2 : f32[10]{1} param "b"
  input %3 : DT[3,4,10]{40,10,1} input "g"
  %4 : DT[3,4,10]{40,10,1}, %5 : f32[3,4,1]{4,1,1}, %6 : f32[3,4,1]{4,1,1} = aten::native_layer_norm(%0, i[10], %1, %2, 1e-05)
  %7 : DT[3,4,10]{40,10,1}, %8 : f32[10]{1}, %9 : f32[10]{1} = aten::native_layer_norm_backward(%3, %0, i[10], %5, %6, %1, %2, b[true, true, true])
  output %4 result "y"
  output %5 result "mean"
  output %6 result "rstd"
  output %7 result "dx"
  output %8 result "dw"
  output %9 result "db"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({3, 4, 10}, t), rn({10}, at::kFloat), rn({10}, at::kFloat),
                                        rn({3, 4, 10}, t)};
       },
       2},
      {"training batch norm, its backward and its counter", R"(graph {
  input %0 : DT[4,6,5,7]{210,35,7,1} input "x"
  input %1 : f32[6]{1} param "w"
  input %2 : f32[6]{1} param "b"
  input %3 : f32[6]{1} buffer "running_mean"
  input %4 : f32[6]{1} buffer "running_var"
  input %5 : DT[4,6,5,7]{210,35,7,1} input "g"
  input %6 : i64[]{} buffer "num_batches_tracked"
  %7 : DT[4,6,5,7]{210,35,7,1}, %8 : f32[6]{1}, %9 : f32[6]{1}, %10 : f32[6]{1}, %11 : f32[6]{1} = aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)
  %12 : DT[4,6,5,7]{210,35,7,1}, %13 : f32[6]{1}, %14 : f32[6]{1} = aten::native_batch_norm_backward(%5, %0, %1, %10, %11, %8, %9, true, 1e-05, b[true, true, true])
  %15 : i64[]{} = aten::add.Scalar(%6, scalar(1), scalar(1))
  output %7 result "y"
  output %8 result "save_mean"
  output %9 result "save_invstd"
  output %10 result "new_running_mean"
  output %11 result "new_running_var"
  output %12 result "dx"
  output %13 result "dw"
  output %14 result "db"
  output %15 result "num_batches_tracked"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({4, 6, 5, 7}, t),       rn({6}, at::kFloat),  rn({6}, at::kFloat),
                                        rn({6}, at::kFloat),       pos({6}, at::kFloat), rn({4, 6, 5, 7}, t),
                                        at::full({}, 7, at::kLong)};
       },
       3},
      {"gelu with the tanh approximation and its backward", R"(graph {
  input %0 : DT[6,5]{5,1} input "x"
  input %1 : DT[6,5]{5,1} input "g"
  %2 : DT[6,5]{5,1} = aten::gelu(%0, "tanh")
  %3 : DT[6,5]{5,1} = aten::gelu_backward(%1, %0, "tanh")
  output %2 result "y"
  output %3 result "dx"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({6, 5}, t) * 3, rn({6, 5}, t)};
       },
       2},
      {"nll_loss with reduction none and its backward", R"(graph {
  input %0 : DT[8,10]{10,1} input "x"
  input %1 : i64[8]{1} input "t"
  input %2 : DT[8]{1} input "go"
  %3 : DT[8]{1}, %4 : DT[]{} = aten::nll_loss_forward(%0, %1, None, 0, 3)
  %5 : DT[8,10]{10,1} = aten::nll_loss_backward(%2, %0, %1, None, 0, 3, %4)
  output %3 result "loss"
  output %4 result "total_weight"
  output %5 result "dx"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({8, 10}, t), at::randint(0, 10, {8}, at::kLong), rn({8}, t)};
       },
       2},
      {"embedding and its backward, repeated indices", R"(graph {
  input %0 : DT[7,12]{12,1} param "table"
  input %1 : i64[2,5]{5,1} input "idx"
  input %2 : DT[2,5,12]{60,12,1} input "g"
  %3 : DT[2,5,12]{60,12,1} = aten::embedding(%0, %1, -1, false, false)
  %4 : DT[7,12]{12,1} = aten::embedding_dense_backward(%2, %1, 7, -1, false)
  %5 : DT[7,12]{12,1} = aten::embedding_dense_backward(%2, %1, 7, 2, false)
  output %3 result "rows"
  output %4 result "dtable"
  output %5 result "dtable_pad2"
})",
       [=](at::ScalarType t) {
         return std::vector<at::Tensor>{rn({7, 12}, t), at::randint(0, 7, {2, 5}, at::kLong), rn({2, 5, 12}, t)};
       },
       3},
  };
}

void run_op_cases(at::ScalarType t, const char* dt, double tol) {
  const int64_t violations = counter(fake_report(), "violations");
  for (const auto& c : op_cases()) {
    if (t == at::kBFloat16 && !c.bf16) continue;
    const ir::Graph g = ir::parse(with_dtype(c.graph, dt) + "\n");
    for (int trial = 0; trial < 3; ++trial) {
      size_t claimed = 0;
      const double err = hpu_vs_eager(g, c.inputs(t), {}, &claimed, c.name);
      EXPECT_LE(err, tol) << c.name << " (" << dt << ") trial " << trial;
      EXPECT_EQ(claimed, c.nodes) << c.name << " (" << dt << ")";
    }
  }
  const std::string report = fake_report();
  EXPECT_EQ(counter(report, "violations"), std::max<int64_t>(violations, 0)) << report;
}

}  // namespace

// The graph text for a linear layer with a transposed weight and relu: the transpose folded into
// the GEMM's flag, the bias broadcast by a reshape, every persistent tensor named.
TEST(HpuLowering, GoldenGraphOfALinearLayerAndRelu) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} param "b"
  input %1 : f32[8,16]{16,1} input "x"
  input %2 : f32[4,16]{16,1} param "w"
  %3 : f32[16,4]{1,16} = aten::t(%2)
  %4 : f32[8,4]{4,1} = aten::addmm(%0, %1, %3, scalar(1), scalar(1))
  %5 : f32[8,4]{4,1} = aten::relu(%4)
  %6 : f32[8,4]{4,1} = aten::mul.Scalar(%5, scalar(0.5))
  output %6 result "y"
}
)");
  View v(g);
  EXPECT_EQ(hpu::lower(v.pg()).dump(),
            "synapse graph {\n"
            "  tensor 0 \"in0\" f32[4] input 0\n"
            "  tensor 1 \"in1\" f32[8,16] input 1\n"
            "  tensor 2 \"in2\" f32[4,16] input 2\n"
            "  tensor 3 \"t3\" f32[8,4]\n"
            "  tensor 4 \"t4\" f32[1,4]\n"
            "  tensor 5 \"t5\" f32[8,4]\n"
            "  tensor 6 \"t6\" f32[8,4]\n"
            "  tensor 7 \"t7\" f32[1,1]\n"
            "  tensor 8 \"out0\" f32[8,4] output 0\n"
            "  node gemm \"n1\" (1, 2) -> (3) {transpose_a=0 transpose_b=1}\n"
            "  node reshape \"n1.reshape\" (0) -> (4)\n"
            "  node add_fwd_f32 \"n1.bias\" (4, 3) -> (5)\n"
            "  node relu_fwd_f32 \"n2\" (5) -> (6)\n"
            "  node constant_f32 \"n3.constant\" () -> (7) {constant=0.5}\n"
            "  node mult_fwd_f32 \"n3\" (6, 7) -> (8)\n"
            "}\n");
}

TEST(HpuLowering, SaysWhyANodeIsNotLowered) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4,4]{4,1} input "x"
  input %1 : f64[4]{1} input "d"
  input %2 : f32[4,4]{4,1} input "g"
  input %3 : bf16[4,4]{4,1} input "h"
  input %4 : bf16[2,3,4,4]{48,16,4,1} input "img"
  input %5 : f32[3]{1} param "gamma"
  input %6 : bf16[3]{1} param "gamma16"
  input %7 : i64[4]{1} input "counts"
  %8 : f32[4,4]{4,1} = aten::cumsum(%0, 1, None)
  %9 : f64[4]{1} = aten::neg(%1)
  %10 : f32[4,4]{4,1} = aten::threshold_backward(%2, %0, 0.5)
  %11 : f32[4,4]{4,1} = aten::add.Tensor(%0, %3, scalar(1))
  %12 : bf16[2,3,4,4]{48,16,4,1}, %13 : f32[3]{1}, %14 : f32[3]{1}, %15 : f32[3]{1}, %16 : f32[3]{1} = aten::_native_batch_norm_legit_functional(%4, %5, %5, %5, %5, false, 0.1, 1e-05)
  %17 : bf16[2,3,4,4]{48,16,4,1}, %18 : bf16[3]{1}, %19 : bf16[3]{1}, %20 : bf16[3]{1}, %21 : bf16[3]{1} = aten::_native_batch_norm_legit_functional(%4, %6, %6, %6, %6, true, 0.1, 1e-05)
  %22 : i64[4]{1} = aten::add.Scalar(%7, scalar(1), scalar(1))
  output %8 result "y"
  output %9 result "z"
  output %10 result "dx"
  output %11 result "mixed"
  output %12 result "bn_eval"
  output %17 result "bn_bf16_stats"
  output %22 result "counts1"
}
)");
  View v(g);
  const auto pg = v.pg();
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(0)), "no Synapse lowering for aten::cumsum yet");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(1)), "a float64 tensor");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(2)), "a threshold other than 0 (relu's backward is lowered)");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(3)), "float32 and bfloat16 tensors in one node");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(4)), "batch norm in eval mode (training is lowered)");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(5)),
            "batch norm with bfloat16 weights or statistics (float32 ones are lowered)");
  EXPECT_EQ(hpu::why_not_lowered(pg, pg.node(6)), "an int64 add of more than one element");
  EXPECT_THROW(hpu::lower(pg), plugin::Unimplemented);
  // Through the plugin: those nodes stay eager, and the group is empty.
  auto plugin = load();
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  EXPECT_EQ(exec.stats().nodes_compiled, 0u);
}

TEST(HpuPlugin, EachLoweredOpMatchesEagerInFloat32) { run_op_cases(at::kFloat, "f32", 1e-4); }

TEST(HpuPlugin, EachLoweredOpMatchesEagerInBfloat16) { run_op_cases(at::kBFloat16, "bf16", 1e-2); }

// log_softmax, nll_loss (mean and sum, with ignored rows) and their backward: the loss's
// total_weight computed on the device (not_equal, cast, sum) and handed out.
TEST(HpuPlugin, NllLossForwardAndBackwardMatchEager) {
  for (const char* reduction : {"1", "2"}) {
    const ir::Graph g = ir::parse(std::string(R"(graph {
  input %0 : f32[6,5]{5,1} input "x"
  input %1 : i64[6]{1} input "t"
  input %2 : f32[]{} input "go"
  %3 : f32[6,5]{5,1} = aten::_log_softmax(%0, 1, false)
  %4 : f32[]{}, %5 : f32[]{} = aten::nll_loss_forward(%3, %1, None, )") +
                                  reduction + R"(, 2)
  %6 : f32[6,5]{5,1} = aten::nll_loss_backward(%2, %3, %1, None, )" +
                                  reduction + R"(, 2, %5)
  %7 : f32[6,5]{5,1} = aten::_log_softmax_backward_data(%6, %3, 1, dtype(f32))
  output %4 result "loss"
  output %5 result "total_weight"
  output %7 result "dx"
}
)");
    for (int trial = 0; trial < 3; ++trial) {
      at::Tensor t = at::randint(0, 5, {6}, at::kLong);
      t[trial] = 2;  // an ignored row
      size_t claimed = 0;
      const double err = hpu_vs_eager(g, {at::randn({6, 5}), t, at::randn({})}, {}, &claimed, "nll");
      EXPECT_LE(err, 1e-4) << "reduction " << reduction;
      EXPECT_EQ(claimed, 4u);
    }
  }
}

// AdamW's update with its two run-time scalars (bias corrections that change every step): one
// recipe serves every value, each written into its persistent tensor at launch.
TEST(HpuPlugin, AdamWUpdateWithRuntimeScalarsMatchesEager) {
  const ir::Graph g = ir::parse(R"(graph {
  scalar $0 float "optimizer.scalar.0"
  scalar $1 float "optimizer.scalar.1"
  input %0 : f32[65,38]{38,1} param "w"
  input %1 : f32[65,38]{38,1} input "grad"
  input %2 : f32[65,38]{38,1} state "exp_avg"
  input %3 : f32[65,38]{38,1} state "exp_avg_sq"
  %4 : f32[65,38]{38,1} = aten::mul.Scalar(%0, scalar(0.99999))
  %5 : f32[65,38]{38,1} = aten::mul.Scalar(%2, scalar(0.9))
  %6 : f32[65,38]{38,1} = aten::add.Tensor(%5, %1, scalar(0.09999999999999998))
  %7 : f32[65,38]{38,1} = aten::mul.Scalar(%3, scalar(0.999))
  %8 : f32[65,38]{38,1} = aten::addcmul(%7, %1, %1, scalar(0.0010000000000000009))
  %9 : f32[65,38]{38,1} = aten::sqrt(%8)
  %10 : f32[65,38]{38,1} = aten::div.Scalar(%9, $0:scalar(0.04471017781221601))
  %11 : f32[65,38]{38,1} = aten::add.Scalar(%10, scalar(1e-08), scalar(1))
  %12 : f32[65,38]{38,1} = aten::addcdiv(%4, %6, %11, $1:scalar(-0.005263157894736844))
  output %12 writeback 0 "w"
  output %6 writeback 2 "exp_avg"
  output %8 writeback 3 "exp_avg_sq"
}
)");
  View v(g);
  const auto sg = hpu::lower(v.pg());
  ASSERT_EQ(sg.scalars.size(), 2u);
  EXPECT_EQ(sg.tensors[static_cast<size_t>(sg.scalars[0])].index, 0);
  EXPECT_EQ(sg.tensors[static_cast<size_t>(sg.scalars[1])].index, 1);
  for (int step = 1; step <= 3; ++step) {
    const double bc2 = std::sqrt(1 - std::pow(0.999, step)), bc1 = 1 - std::pow(0.9, step);
    const std::vector<c10::IValue> scalars = {c10::IValue(bc2), c10::IValue(-1e-3 / bc1)};
    const std::vector<at::Tensor> in = {at::randn({65, 38}), at::randn({65, 38}) * 1e-2, at::randn({65, 38}) * 1e-3,
                                        at::rand({65, 38}) * 1e-5};
    size_t claimed = 0;
    EXPECT_LE(hpu_vs_eager(g, in, scalars, &claimed, "adamw"), 1e-5) << "step " << step;
    EXPECT_EQ(claimed, 9u);
  }
}

namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
  const char* name;
};

}  // namespace

// A recipe is compiled once per graph text: kept in memory while an executable uses it, and on disk
// (serialized to a temporary name, renamed) for later, read back by synRecipeDeSerialize.
TEST(HpuPlugin, RecipesAreCachedInMemoryAndOnDisk) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_hpu_cache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // A graph of its own (the other tests' recipes may be in the process's cache already).
  const ir::Graph g2 = ir::parse(R"(graph {
  input %0 : f32[3,7]{7,1} input "x"
  %1 : f32[3,7]{7,1} = aten::mul.Scalar(%0, scalar(1.25))
  output %1 result "y"
}
)");
  const int64_t compiles0 = counter(fake_report(), "compiles");
  {
    auto plugin = load(dir.string());
    PartitionedExecutor a(g2, plugin, KILN_MODE_DEFAULT);
    PartitionedExecutor b(g2, plugin, KILN_MODE_DEFAULT);
    EXPECT_EQ(counter(fake_report(), "compiles"), compiles0 + 1) << "the second compile reuses the recipe";
    std::vector<at::Tensor> env(g2.values.size());
    env[0] = at::randn({3, 7});
    b.run(env);
    EXPECT_TRUE(at::allclose(env[1], env[0] * 1.25));
  }
  size_t recipes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().extension() == ".recipe") ++recipes;
  EXPECT_EQ(recipes, 1u);
  // No executable left: the device was released. The next compile acquires it again and reads the
  // recipe back from disk instead of compiling.
  const std::string after = fake_report();
  EXPECT_EQ(counter(after, "live_recipes"), 0) << after;
  {
    auto plugin = load(dir.string());
    PartitionedExecutor c(g2, plugin, KILN_MODE_DEFAULT);
    const std::string report = fake_report();
    EXPECT_EQ(counter(report, "compiles"), compiles0 + 1) << report;
    EXPECT_EQ(counter(report, "deserialized"), counter(after, "deserialized") + 1) << report;
    std::vector<at::Tensor> env(g2.values.size());
    env[0] = at::randn({3, 7});
    c.run(env);
    EXPECT_TRUE(at::allclose(env[1], env[0] * 1.25));
  }
  // Beside the recipe, the graph text it was compiled from (a hash collision reads as a miss).
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().extension() == ".graph") {
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      EXPECT_EQ(text.str().rfind("synapse graph {\n", 0), 0u) << text.str();
      EXPECT_NE(text.str().find("mult_fwd_f32"), std::string::npos) << text.str();
    }
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "a temporary file left: " << e.path();
  // All executables gone: every device buffer freed (the recipes stay cached).
  EXPECT_EQ(counter(fake_report(), "live_allocations"), 0) << fake_report();
  EXPECT_EQ(counter(fake_report(), "violations"), 0) << fake_report();
  std::filesystem::remove_all(dir);
}

// Failures the stand-in injects: a compile that fails leaves the group eager with the call named;
// a launch that fails throws from the run with synLaunchExt named; device memory running out is
// an out-of-memory error naming the buffer; nothing is leaked on the way.
TEST(HpuPlugin, InjectedFailuresGiveClearErrorsAndLeakNothing) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[5,9]{9,1} input "x"
  input %1 : f32[9,3]{3,1} input "w"
  %2 : f32[5,3]{3,1} = aten::mm(%0, %1)
  %3 : f32[5,3]{3,1} = aten::neg(%2)
  output %3 result "y"
}
)");
  auto plugin = load();
  {
    ScopedEnv fail("KILN_FAKE_SYNAPSE_FAIL_COMPILE", "1");
    PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
    ASSERT_EQ(exec.groups().size(), 1u);
    EXPECT_FALSE(exec.groups()[0].compiled);
    EXPECT_NE(exec.groups()[0].reason.find("synGraphCompile failed (graph kiln_hpu_"), std::string::npos)
        << exec.groups()[0].reason;
    EXPECT_NE(exec.groups()[0].reason.find("injected"), std::string::npos) << exec.groups()[0].reason;
    // The nodes run eagerly and the result is right.
    std::vector<at::Tensor> env(g.values.size());
    env[0] = at::randn({5, 9});
    env[1] = at::randn({9, 3});
    exec.run(env);
    EXPECT_TRUE(at::allclose(env[3], -at::mm(env[0], env[1])));
  }
  {
    ScopedEnv fail("KILN_FAKE_SYNAPSE_FAIL_COMPILE", "neg_fwd_f32");
    const ir::Graph other = ir::parse(R"(graph {
  input %0 : f32[2,9]{9,1} input "x"
  %1 : f32[2,9]{9,1} = aten::neg(%0)
  output %1 result "y"
}
)");
    PartitionedExecutor exec(other, plugin, KILN_MODE_DEFAULT);
    EXPECT_FALSE(exec.groups()[0].compiled);
    EXPECT_NE(exec.groups()[0].reason.find("neg_fwd_f32"), std::string::npos) << exec.groups()[0].reason;
  }
  {
    PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
    ASSERT_TRUE(exec.groups()[0].compiled) << exec.groups()[0].reason;
    ScopedEnv fail("KILN_FAKE_SYNAPSE_FAIL_LAUNCH", "1");
    std::vector<at::Tensor> env(g.values.size());
    env[0] = at::randn({5, 9});
    env[1] = at::randn({9, 3});
    try {
      exec.run(env);
      ADD_FAILURE() << "the launch failure did not reach the caller";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("synLaunchExt failed (launching kiln_hpu_"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv oom("KILN_FAKE_SYNAPSE_DEVICE_MEMORY", "64");
    const ir::Graph big = ir::parse(R"(graph {
  input %0 : f32[33,9]{9,1} input "x"
  %1 : f32[33,9]{9,1} = aten::exp(%0)
  output %1 result "y"
}
)");
    PartitionedExecutor exec(big, plugin, KILN_MODE_DEFAULT);
    EXPECT_FALSE(exec.groups()[0].compiled);
    EXPECT_NE(exec.groups()[0].reason.find("synDeviceMalloc failed"), std::string::npos) << exec.groups()[0].reason;
    EXPECT_NE(exec.groups()[0].reason.find("out of device memory"), std::string::npos) << exec.groups()[0].reason;
  }
  EXPECT_EQ(counter(fake_report(), "live_allocations"), 0) << fake_report();
  EXPECT_EQ(counter(fake_report(), "violations"), 0) << fake_report();
}

// The stand-in holds its caller to the API: a graph it must reject (a GEMM whose operands do not
// line up, written by hand here) fails synGraphCompile with the reason, recorded as a violation.
TEST(HpuStandIn, RejectsAGemmWhoseSizesDoNotLineUp) {
  void* h = dlopen(KILN_FAKE_SYNAPSE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  namespace syn = hpu::syn;
  auto sym = [&](const char* n) { return dlsym(h, n); };
  auto init = reinterpret_cast<syn::InitializeFn>(sym("synInitialize"));
  auto graph_create = reinterpret_cast<syn::GraphCreateFn>(sym("synGraphCreate"));
  auto graph_destroy = reinterpret_cast<syn::GraphDestroyFn>(sym("synGraphDestroy"));
  auto tensor_create = reinterpret_cast<syn::TensorHandleCreateFn>(sym("synTensorHandleCreate"));
  auto set_dtype = reinterpret_cast<syn::TensorSetDeviceDataTypeFn>(sym("synTensorSetDeviceDataType"));
  auto set_geo = reinterpret_cast<syn::TensorSetGeometryFn>(sym("synTensorSetGeometry"));
  auto node_create = reinterpret_cast<syn::NodeCreateFn>(sym("synNodeCreate"));
  auto compile = reinterpret_cast<syn::GraphCompileFn>(sym("synGraphCompile"));
  auto section_create = reinterpret_cast<syn::SectionCreateFn>(sym("synSectionCreate"));
  auto assign = reinterpret_cast<syn::TensorAssignToSectionFn>(sym("synTensorAssignToSection"));
  const syn::Status s0 = init();
  EXPECT_TRUE(s0 == syn::kSuccess || s0 == syn::kAlreadyInitialized);
  syn::GraphHandle g = nullptr;
  ASSERT_EQ(graph_create(&g, syn::kDeviceGaudi2), syn::kSuccess);
  syn::TensorHandle t[3];
  const std::vector<std::vector<uint64_t>> sizes = {{16, 8}, {5, 15}, {5, 8}};  // [8,16] x [15,5]
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tensor_create(&t[i], g, syn::kDataTensor, ("t" + std::to_string(i)).c_str()), syn::kSuccess);
    ASSERT_EQ(set_dtype(t[i], syn::kTypeFloat), syn::kSuccess);
    syn::TensorGeometry geo{};
    geo.dims = 2;
    geo.sizes[0] = sizes[static_cast<size_t>(i)][0];
    geo.sizes[1] = sizes[static_cast<size_t>(i)][1];
    ASSERT_EQ(set_geo(t[i], &geo, syn::kGeometrySizes), syn::kSuccess);
    syn::SectionHandle sec = nullptr;
    ASSERT_EQ(section_create(&sec, 0, g), syn::kSuccess);
    ASSERT_EQ(assign(t[i], sec, 0), syn::kSuccess);
  }
  const syn::GemmParams p{false, false};
  ASSERT_EQ(node_create(g, t, t + 2, 2, 1, &p, sizeof p, "gemm", "bad", nullptr, nullptr), syn::kSuccess);
  const int64_t before = counter(fake_report(), "violations");
  syn::RecipeHandle r = nullptr;
  EXPECT_NE(compile(&r, g, "bad", nullptr), syn::kSuccess);
  const std::string report = fake_report();
  EXPECT_EQ(counter(report, "violations"), before + 1);
  EXPECT_NE(report.find("violation synGraphCompile: node \"bad\" (gemm): sizes [8,16] x [15,5] (transpose 00) do not "
                        "give [8,5]"),
            std::string::npos)
      << report;
  EXPECT_EQ(graph_destroy(g), syn::kSuccess);
  dlclose(h);
}

// Where the backend says it can run: on a Gaudi (score 400, before the inductor's 200), on a CPU
// only with synapse_library named (score 0), and otherwise not, saying why: no Gaudi and no
// library, a library that does not open, a library without the entry points it calls.
TEST(HpuPlugin, AvailabilityOnAGaudiOnACpuAndWithoutTheLibrary) {
  std::vector<PluginDevice> cpu(1), gaudi(2);
  cpu[0].name = "test CPU";
  gaudi[0].kind = KILN_DEVICE_GAUDI;
  gaudi[0].name = "Gaudi2";
  gaudi[1].name = "test CPU";
  auto with_library = load();
  PluginAvailability a = with_library->available(gaudi);
  EXPECT_TRUE(a.available) << a.reason;
  EXPECT_EQ(a.score, 400);
  EXPECT_NE(a.reason.find("1 Gaudi device(s), first Gaudi2"), std::string::npos) << a.reason;
  a = with_library->available(cpu);
  EXPECT_TRUE(a.available) << a.reason;
  EXPECT_EQ(a.score, 0);
  EXPECT_NE(a.reason.find("set by [plugin.hpu_backend] synapse_library"), std::string::npos) << a.reason;
  TrainingArguments plain;
  auto bare = PluginRegistry::load_file(KILN_HPU_PLUGIN, torch_host_services(plain));
  a = bare->available(cpu);
  EXPECT_FALSE(a.available);
  // (Whether libSynapse.so then loads depends on this process: the stand-in, loaded already, has
  // that name.)
  EXPECT_EQ(a.reason.rfind("no Intel Gaudi device found", 0), 0u) << a.reason;
  for (const char* lib : {"/nonexistent/libSynapse.so", "libm.so.6"}) {
    TrainingArguments args;
    args.plugin_options["hpu_backend"]["synapse_library"] = lib;
    auto p = PluginRegistry::load_file(KILN_HPU_PLUGIN, torch_host_services(args));
    a = p->available(gaudi);
    EXPECT_FALSE(a.available) << lib;
    EXPECT_NE(
        a.reason.find(lib[0] == '/' ? "cannot be loaded" : "lacks entry points the hpu_backend calls: synInitialize"),
        std::string::npos)
        << a.reason;
  }
}

// The whole way on a machine that looks like a Gaudi's (a fake sysfs tree with a Gaudi2 on PCI, the
// probe pointed at it): `auto` picks the hpu_backend over the CPU's backends, and mlp trains
// through it (the stand-in as its Synapse library) and matches eager.
TEST(HpuPlugin, AutoPicksItOnAGaudiMachineAndMlpMatchesEager) {
  kiln::testing::FakeMachine m;
  m.cpu();
  m.gaudi(kiln::testing::FakeMachine::bus_id(0x33), 0x1020, 0);
  const std::string env = "env -u KILN_BACKEND KILN_SYSFS_ROOT=" + kiln::test::shell_quote(m.root()) +
                          " KILN_FAKE_SYNAPSE_ABORT=1 KILN_PLUGIN_OPTIONS=hpu_backend.synapse_library=" +
                          kiln::test::shell_quote(KILN_FAKE_SYNAPSE) + " " + kiln::test::shell_quote(KILN_CLI);
  // What scripts/gaudi-check looks for in the probe's report.
  const auto probe = kiln::test::run_command(env + " probe --json", "hpu_probe");
  EXPECT_EQ(probe.status, 0) << probe.out << probe.err;
  EXPECT_NE(probe.out.find("\"kind\": \"gaudi\""), std::string::npos) << probe.out;
  EXPECT_NE(probe.out.find("\"default_backend\": \"hpu_backend\""), std::string::npos) << probe.out;
  const auto r = kiln::test::run_command(env + " bench mlp --steps 6 --check", "hpu_auto");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("why: ranked the available backends by the score each gave for Intel Gaudi2"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("runs on: hpu_backend"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("check: PASS"), std::string::npos) << r.out;
}

// Sizes that change: the lowerings of one graph at the smallest and largest sizes of a range make
// one graph for the range (golden text): tensors whose sizes change carry their smallest sizes, a
// reshape of a changing size reads a shape tensor, and a constant that follows the sizes (a mean's
// 1/n, here a multiplication by it) becomes a persistent size scalar.
TEST(HpuDynamic, TheGraphForARangeOfSizes) {
  auto graph_at = [](int64_t b) {
    const std::string B = std::to_string(b), BK = std::to_string(b * 4);
    return ir::parse(R"(graph {
  input %0 : f32[)" + B +
                     R"(,4]{4,1} input "x"
  input %1 : f32[4,4]{4,1} param "w"
  %2 : f32[)" + B + R"(,4]{4,1} = aten::mm(%0, %1)
  %3 : f32[)" + BK + R"(]{1} = aten::view(%2, i[)" +
                     BK + R"(])
  %4 : f32[]{} = aten::sum(%3, None)
  %5 : f32[]{} = aten::mul.Scalar(%4, scalar()" +
                     std::to_string(1.0 / static_cast<double>(b)) + R"())
  output %5 result "loss"
  output %3 result "flat"
})");
  };
  const ir::Graph low = graph_at(3), high = graph_at(4);
  std::string why;
  const auto g = hpu::dynamic_graph(hpu::lower(View(low).pg()), hpu::lower(View(high).pg()), &why);
  ASSERT_TRUE(g) << why;
  // The constant 1/B (node 4 of each lowering) is a size scalar; the flattening reshape reads the
  // shape tensor of its output.
  EXPECT_EQ(g->dump(),
            "synapse graph {\n"
            "  tensor 0 \"in0\" f32[4,4] min[3,4] input 0\n"
            "  tensor 1 \"in1\" f32[4,4] input 1\n"
            "  tensor 2 \"t2\" f32[4,4] min[3,4]\n"
            "  tensor 3 \"out1\" f32[16] min[12] output 1\n"
            "  tensor 4 \"t4\" f32[1]\n"
            "  tensor 5 \"t5\" f32[]\n"
            "  tensor 6 \"size_scalar0\" f32[] size_scalar of node 4\n"
            "  tensor 7 \"out0\" f32[] output 0\n"
            "  tensor 8 \"shape0\" i32[16] min[12] shape_of 3\n"
            "  node gemm \"n0\" (0, 1) -> (2) {transpose_a=0 transpose_b=0}\n"
            "  node reshape \"n1.reshape\" (2, 8) -> (3)\n"
            "  node reduce_sum_fwd_f32 \"n2.dim0\" (3) -> (4) {reduction_dimension=0}\n"
            "  node reshape \"n2.reshape\" (4) -> (5)\n"
            "  node mult_fwd_f32 \"n3\" (5, 6) -> (7)\n"
            "}\n");
  EXPECT_EQ(g->size_scalars, std::vector<int32_t>{6});
  EXPECT_EQ(g->shape_tensors, std::vector<int32_t>{8});
  // The lowering at a size inside the range gives the launch its numbers: 1/3 at B = 3.
  const hpu::SynGraph at3 = hpu::lower(View(low).pg());
  EXPECT_NEAR(hpu::constant_value(at3, at3.nodes[4]), 1.0 / 3, 1e-6);
  // Lowerings that differ in more than sizes make no range: here a GEMM's transpose flag.
  hpu::SynGraph flipped = hpu::lower(View(high).pg());
  flipped.nodes[0].params[0] = 1;
  EXPECT_FALSE(hpu::dynamic_graph(hpu::lower(View(low).pg()), flipped, &why));
  EXPECT_NE(why.find("node n0 (gemm) has parameters that follow the sizes"), std::string::npos) << why;
}

namespace {

double rel_norm(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  const double diff = (g - w).norm().item<double>(), scale = w.norm().item<double>();
  if (std::isnan(diff)) return INFINITY;
  return scale > 0 ? diff / scale : diff;
}

std::string file_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A workload trained through the hpu_backend (the stand-in) under dynamic shapes, and in LibTorch
// eager on the same fresh batches: `sizes[s]` is the sequence length at step s (the batch size with
// `vary_batch`). What the recipe cache on disk holds after the step that made the symbolic plan
// and at the end: recipes for a range of sizes (their graph has tensors with smallest sizes) and
// the rest.
struct HpuDynamicRun {
  kiln::StepStats stats;
  size_t ranged_at_symbolic = 0, ranged = 0, fixed_at_symbolic = 0, fixed = 0;
  std::vector<std::string> warnings;
  std::string report;
};

HpuDynamicRun hpu_dynamic(const std::string& name, const std::vector<int64_t>& sizes, bool vary_batch, double tol,
                          const std::string& optimizer = "") {
  const std::string dir = ::testing::TempDir() + "/kiln_hpu_dynamic_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = "hpu_backend";
  args.runtime.plugin_dirs = {KILN_INTREE_PLUGIN_DIR};
  args.runtime.cache_dir = dir;
  args.plugin_options["hpu_backend"]["synapse_library"] = KILN_FAKE_SYNAPSE;
  const uint64_t seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const int64_t full_batch = vary_batch ? *std::max_element(sizes.begin(), sizes.end()) : 0;
  auto ref = kiln::make_workload(name, {"cpu", seed, full_batch, optimizer});
  auto w = kiln::make_workload(name, {"cpu", seed, full_batch, optimizer});
  auto ref_step = kiln::workload_step(ref);
  LogCapture log;
  const int64_t violations_before = counter(fake_report(), "violations");
  auto step = kiln::compile_step(kiln::workload_step(w), {{w.model}, {w.optimizer.get()}}, args);
  auto recipes = [&](bool ranged) {
    size_t n = 0;
    if (std::filesystem::exists(dir + "/hpu_backend"))
      for (const auto& e : std::filesystem::directory_iterator(dir + "/hpu_backend"))
        if (e.path().extension() == ".graph") n += (file_text(e.path()).find(" min[") != std::string::npos) == ranged;
    return n;
  };
  HpuDynamicRun r;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const at::Tensor x = vary_batch ? ref.input.narrow(0, 0, sizes[s]) : ref.input.narrow(1, 0, sizes[s]);
    const at::Tensor y = vary_batch ? ref.target.narrow(0, 0, sizes[s]) : ref.target.narrow(1, 0, sizes[s]);
    const at::Tensor xi = x.is_floating_point() ? at::randn_like(x) : at::randint_like(x, 0, 64);
    const at::Tensor yi =
        y.is_floating_point() ? at::randn_like(y) : (name == "gpt" ? at::randint_like(y, 0, 64) : y.clone());
    const at::Tensor want = ref_step({xi, yi})[0];
    const at::Tensor got = step({xi.clone(), yi.clone()})[0];
    EXPECT_LE(rel_norm(got, want), tol) << name << " loss at step " << s << " (size " << sizes[s] << ")";
    if (step.stats().compiles == 2 && r.ranged_at_symbolic == 0 && r.fixed_at_symbolic == 0)
      r.ranged_at_symbolic = recipes(true), r.fixed_at_symbolic = recipes(false);
  }
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters();
  for (size_t i = 0; i < pr.size(); ++i)
    EXPECT_LE(rel_norm(pw[i].value(), pr[i].value()), 10 * tol) << name << " parameter " << pr[i].key();
  r.stats = step.stats();
  r.ranged = recipes(true), r.fixed = recipes(false);
  r.warnings = log.warnings();
  r.report = fake_report();
  EXPECT_EQ(counter(r.report, "violations"), violations_before) << r.report;
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace

// A language model whose sequence length changes every step: each group of the symbolic plan is
// compiled once per range of lengths (17-32, 33-64 and 9-16 here) into one recipe with Synapse's
// dynamic shapes, launched at each length with its actual sizes, and every step matches eager.
TEST(HpuDynamic, GptOverManyLengthsCompilesOneRecipePerRangeAndMatchesEager) {
  const std::vector<int64_t> lengths = {24, 24, 40, 17, 33, 64, 29, 40, 9, 50, 32, 16, 61};
  const auto r = hpu_dynamic("gpt", lengths, false, 1e-4);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  EXPECT_EQ(r.stats.dynamic_dims, std::vector<std::string>{"input 0 dim 1"});
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("compiled for each size"), std::string::npos) << w;
  // The symbolic plan's groups compiled at 40's range (33-64) when it was made; one recipe each per
  // range met after: 17-32 and 9-16.
  ASSERT_GT(r.ranged_at_symbolic, 0u);
  EXPECT_EQ(r.ranged, r.ranged_at_symbolic * 3);
  EXPECT_EQ(r.fixed, r.fixed_at_symbolic);  // the static first plan's, and nothing per length
  EXPECT_GT(counter(r.report, "launches"), 0) << r.report;
}

// A classifier whose last batch is short: the batch dim changes (5 in the range 5-8, 11 and 16 in
// 9-16), two recipes per group, and the steps match eager.
TEST(HpuDynamic, AShortLastBatchRunsInTheRecipeOfItsRangeAndMatchesEager) {
  const std::vector<int64_t> batches = {16, 16, 16, 5, 16, 16, 16, 5, 11};
  const auto r = hpu_dynamic("mlp", batches, true, 1e-5);
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("compiled for each size"), std::string::npos) << w;
  ASSERT_GT(r.ranged_at_symbolic, 0u);
  EXPECT_EQ(r.ranged, r.ranged_at_symbolic * 2);
}

// A convolutional net whose batch changes: the convolutions and their gradients run at the batch
// of each call inside the recipe of its range, matching eager; the batch of 5 (range 5-8) adds
// recipes, none per size. With SGD: under Adam the batch norms' biases, which start at zero, move
// by rounding noise made as large as a real update.
TEST(HpuDynamic, ConvolutionsOverAChangingBatchRunInOneRecipePerRange) {
  const auto r = hpu_dynamic("cnn", {8, 8, 12, 5, 12}, true, 1e-4, "sgd");
  EXPECT_EQ(r.stats.compiles, 2) << r.stats.last_fallback;
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("compiled for each size"), std::string::npos) << w;
  ASSERT_GT(r.ranged_at_symbolic, 0u);
  EXPECT_GT(r.ranged, r.ranged_at_symbolic);
}

// Policies: "exact" compiles each size's own static recipe (no smallest sizes anywhere); another
// policy than pow2, N or exact is refused at compile, naming the option.
TEST(HpuDynamic, BucketPolicies) {
  const auto pow2 = plugin::size_bucket("pow2", {2, 3, 17, 64, 65}, "x");
  EXPECT_EQ(pow2.high, (std::vector<int64_t>{2, 4, 32, 64, 128}));
  EXPECT_EQ(pow2.low, (std::vector<int64_t>{2, 3, 17, 33, 65}));
  const auto n16 = plugin::size_bucket("16", {2, 16, 17}, "x");
  EXPECT_EQ(n16.high, (std::vector<int64_t>{16, 16, 32}));
  EXPECT_EQ(n16.low, (std::vector<int64_t>{2, 2, 17}));
  const auto exact = plugin::size_bucket("exact", {3, 17}, "x");
  EXPECT_EQ(exact.low, exact.high);
  for (const char* bad : {"", "0", "-4", "pow3", "8x"}) {
    try {
      plugin::check_size_bucket_policy(bad, "[plugin.hpu_backend] buckets");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const plugin::Error& e) {
      EXPECT_NE(std::string(e.what()).find("[plugin.hpu_backend] buckets = '"), std::string::npos) << e.what();
    }
  }
}
