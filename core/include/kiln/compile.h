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
// The backend is chosen once, when the CompiledStep is made (resolve_backend: a named backend that
// cannot run here is an error then). The first call runs the step eagerly (so optimizer state
// exists); the second runs it for real while capturing it, then compiles: the passes, then the
// backend claims its nodes and compiles its groups, and every other node runs on the eager
// executor. Later calls run the compiled step. Gradients are left in
// param.grad() after every step, as LibTorch's eager step leaves them. A step that cannot be
// captured or compiled runs eagerly with one warning (an error with args.runtime.fullgraph).
//
// Contract for `fn`: it calls each optimizer in StepState::optimizers' step() once, with no
// closure, anywhere after the backward that made its gradients (several optimizers, several
// backward passes and several models in one step are fine); tensors it reads other than its
// inputs, the modules' parameters and buffers and the optimizers' state are bound by identity at
// capture (read in place). Host code in `fn` runs at capture only: a compiled step runs the
// recorded ATen calls, not `fn` (a value read with .item() is computed, not handed to host code).
//
// Guards: before every compiled step kiln checks the input signature, the modules' parameters,
// buffers and submodules (by identity), train()/eval(), and replays every optimizer's step() on the
// host; when an optimizer's calls or the tensors they work on changed (torch::load of its state, a
// hyper-parameter that changes its arithmetic), the step is captured again. A learning rate or
// other scalar that merely changes value becomes a run-time scalar. A step that falls back runs
// from exactly the state the eager step would see: the optimizers' counters are restored first.
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
#include "kiln/group_outcome.h"
#include "kiln/ir.h"

namespace kiln {

using StepFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// What the step reads and writes besides its inputs.
struct StepState {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::vector<torch::optim::Optimizer*> optimizers;
};

// Thrown with fullgraph = true when a step cannot be captured or compiled.
class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StepStats {
  int steps = 0;
  int eager_steps = 0;  // warm-up, capture failures, fallbacks, past recompile_limit
  int compiled_steps = 0;
  int compiles = 0;                 // signatures captured and compiled (the capture step included)
  int failed_captures = 0;          // captures or compiles that failed (their signature runs eagerly)
  int rebuilds = 0;                 // re-plans of a signature after a scalar turned out to vary per step
  int recaptures = 0;               // captures again because what the step reads changed (optimizer state
                                    // loaded, parameters or modules replaced, calls of an optimizer changed)
  double last_compile_seconds = 0;  // capture step + compile, for the last signature compiled
  std::string last_fallback;        // why the last eager fallback happened ("" when none)
  int failed_groups = 0;            // compiled groups that failed in a step without writing anything: their
                                    // nodes ran eagerly in their place from then on (last_fallback says why)
  // Whole-step CUDA graphs (reduce-overhead, max-autotune, the cudagraphs backend on CUDA).
  int graphs_recorded = 0;           // CUDA graphs recorded (one per signature, again after a re-plan)
  int graph_replays = 0;             // compiled steps that were one graph launch
  std::string last_graph_skip;       // "kiln: skipping cudagraphs due to ..." ("" when none)
  int graph_copies = 0;              // copies inside the last recorded graph whose addresses each replay sets
                                     // (the batch in, run-time scalars, results out); 0: made around it
  int64_t adopted_writebacks = 0;    // write-backs done by handing the target the value's storage (no copy)
  int64_t copied_writebacks = 0;     // write-backs done by copying (a recorded graph's counted once, when
                                     // recorded); the others were computed in place or adopted
  double probe_seconds = 0;          // host time of the optimizer probe, all compiled steps together
  std::vector<GroupOutcome> groups;  // plugin groups of the last compiled plan
  // Dynamic shapes ([runtime] dynamic). `compiles` counts captures; a shape that a symbolic step
  // covers is planned from it without a capture (a specialisation: the passes and the backend's
  // compile for that shape, which a backend caches).
  int shape_specialisations = 0;          // plans made from a symbolic step for a new shape
  double last_specialise_seconds = 0;     // the last one's planning time
  int shape_evictions = 0;                // plans of a dynamic step dropped as least recently used
  std::vector<std::string> dynamic_dims;  // symbolic dimensions of the last dynamic step: "input 0 dim 1"
  // Why the last compile happened: "input 0 dim 1 changed 37 -> 52: compiling with it symbolic"
  std::string last_recompile_reason;
};

// LibTorch's CUDA caching allocator on `device`: bytes allocated now and at the peak since the
// last reset (0 where kiln was built without CUDA or there is no device). For `kiln bench`.
int64_t cuda_allocated_bytes(int device);
int64_t cuda_peak_allocated_bytes(int device);
void cuda_reset_peak_allocated(int device);

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
  // Input `input`'s dimension `dim` is symbolic from its first compile (torch._dynamo.mark_dynamic;
  // also [runtime] mark_dynamic = ["input:dim"]). Call before the step is captured.
  void mark_dynamic(size_t input, int64_t dim);
  const StepStats& stats() const;
  // The last signature's graphs: as captured (views, in-place ops) and as compiled (pure).
  // Null before the first capture.
  const ir::Graph* captured_graph() const;
  const ir::Graph* compiled_graph() const;
  const TrainingArguments& args() const;
  // The backend the step compiles for ("eager" when none can run: kiln's eager executor; "none"
  // when torch_compile is off and LibTorch runs the step) and the reason for every decision the
  // selection made (backend.h).
  const std::string& backend() const;
  const std::vector<std::string>& backend_reasons() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

CompiledStep compile_step(StepFn fn, StepState state, TrainingArguments args = {});

}  // namespace kiln
