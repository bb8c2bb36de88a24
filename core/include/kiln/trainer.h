// kiln::Trainer: the user's training step (forward, loss, backward, optimizer update) run through
// kiln. The first step runs eagerly; kiln compiles the whole step and runs the compiled step from
// then on, falling back to the eager step whenever capture or compile fails.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "kiln/config.h"

namespace kiln {
class CompiledStep;
struct StepStats;
}  // namespace kiln

namespace kiln {

using ForwardFn = std::function<at::Tensor(const at::Tensor& input)>;
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

class Trainer {
 public:
  // `model` must be a torch::nn::Module with `Tensor forward(Tensor)`; the optimizer must outlive
  // the Trainer.
  template <class Module>
  Trainer(std::shared_ptr<Module> model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
          TrainingArguments args = {})
      : Trainer(std::static_pointer_cast<torch::nn::Module>(model),
                [model](const at::Tensor& x) { return model->forward(x); }, optimizer,
                std::move(loss_fn), std::move(args)) {}

  Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward,
          torch::optim::Optimizer& optimizer, LossFn loss_fn, TrainingArguments args = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step: zero_grad, forward, loss, backward, optimizer update. Returns the loss.
  at::Tensor step(const at::Tensor& input, const at::Tensor& target);

  // The backend chosen and the reasons, for display.
  const std::string& backend() const;
  const std::vector<std::string>& backend_reasons() const;
  // Whether steps currently run compiled (false while the pipeline falls back to eager).
  bool compiled() const;
  const TrainingArguments& args() const;
  // Counters (compiles, compiled and eager steps, compile time, last fallback reason) and the
  // compiled step itself (its captured and compiled graphs).
  const StepStats& stats() const;
  const CompiledStep& compiled_step() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
