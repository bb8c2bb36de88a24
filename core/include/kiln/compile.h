// kiln::compile_step: a whole training step, compiled. For users with their own loop; Trainer is
// built on it.
//
//   kiln::CompiledStep step = kiln::compile_step(
//       [&](const std::vector<at::Tensor>& in) {
//         opt.zero_grad();
//         auto loss = loss_fn(model->forward(in[0]), in[1]);
//         loss.backward();
//         opt.step();
//         return std::vector<at::Tensor>{loss.detach()};
//       },
//       {{model}, {&opt}}, args);
//   for (...) auto loss = step({x, y})[0];
//
// The first call runs the step eagerly (so optimizer state exists); the second runs it for real
// while capturing it, then compiles; later calls run the compiled step. Gradients are left in
// param.grad() after every step, as LibTorch's eager step leaves them. A step that cannot be
// captured or compiled runs eagerly with one warning (an error with args.fullgraph).
//
// Contract for `fn`: it calls each optimizer in StepState::optimizers' step() once, with no
// closure, after the backward; tensors it reads other than its inputs, the modules' parameters
// and buffers and the optimizers' state are bound by identity at capture (read in place).
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "kiln/config.h"
#include "kiln/ir.h"

namespace kiln {

using StepFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// What the step reads and writes besides its inputs.
struct StepState {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::vector<torch::optim::Optimizer*> optimizers;
};

// Runs a compiled graph given its inputs bound in env (graph inputs' value ids). The default
// runs every node on the EagerExecutor; the partitioner installs one that runs backend
// subgraphs through the plugin ABI and the rest on the EagerExecutor.
class GraphExecutor {
 public:
  virtual ~GraphExecutor() = default;
  // `scalars`: the values of Graph::scalar_inputs for this step.
  virtual void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>& scalars) = 0;
};

// Where the rest of the pipeline plugs in. `pipeline` runs on the captured (not yet functional)
// graph and must leave a functional graph: passes, partitioning, planning. It may add Constant
// inputs, with their tensors in `constants` by value id. Defaults: run_pipeline() (passes.h),
// and the eager executor.
struct CompileHooks {
  std::function<void(ir::Graph& graph, std::unordered_map<ir::ValueId, at::Tensor>& constants,
                     const TrainingArguments& args)>
      pipeline;
  std::function<std::unique_ptr<GraphExecutor>(const ir::Graph& graph, const TrainingArguments& args)>
      make_executor;
};
CompileHooks& compile_hooks();

// Thrown with fullgraph = true when a step cannot be captured or compiled.
class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StepStats {
  int steps = 0;
  int eager_steps = 0;     // warm-up, capture failures, fallbacks, past recompile_limit
  int compiled_steps = 0;
  int compiles = 0;        // signatures compiled (the capture step included)
  int rebuilds = 0;        // re-plans of a signature after a scalar turned out to vary per step
  double last_compile_seconds = 0;  // capture step + compile, for the last signature
  std::string last_fallback;        // why the last eager fallback happened ("" when none)
};

class CompiledStep {
 public:
  CompiledStep(StepFn fn, StepState state, TrainingArguments args = {});
  ~CompiledStep();
  CompiledStep(CompiledStep&&) noexcept;
  CompiledStep& operator=(CompiledStep&&) noexcept;

  // Runs one step; returns what `fn` returns.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);

  // Whether the last call ran the compiled graph.
  bool last_step_compiled() const;
  const StepStats& stats() const;
  // The last signature's graphs: as captured (views, in-place ops) and as compiled (pure).
  // Null before the first capture.
  const ir::Graph* captured_graph() const;
  const ir::Graph* compiled_graph() const;
  const TrainingArguments& args() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

CompiledStep compile_step(StepFn fn, StepState state, TrainingArguments args = {});

}  // namespace kiln
