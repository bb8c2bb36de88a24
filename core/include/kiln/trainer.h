// kiln::Trainer: the user's training step (forward, loss, backward, optional gradient clipping,
// optimizer update) run through kiln. The first step runs eagerly; kiln compiles the whole step and
// runs the compiled step from then on, falling back to the eager step whenever capture or compile
// fails.
//
//   Net model;                                   // TORCH_MODULE(Net), or std::make_shared<NetImpl>()
//   torch::optim::AdamW opt(model->parameters());
//   kiln::Trainer trainer(model, opt, loss_fn, args);
//   auto loss = trainer.step(x, y);              // forward(Tensor)
//   auto loss = trainer.step({ids, lengths}, y); // forward(Tensor, Tensor)
//
// Or a whole training, the way Hugging Face's Trainer runs it (args.num_train_epochs, max_steps,
// per_device_train_batch_size, gradient_accumulation_steps, learning_rate, lr_scheduler_type,
// warmup_steps, logging_steps, seed, output_dir):
//   kiln::TensorDataset data({xs}, ys);          // examples along dim 0
//   kiln::TrainOutput out = trainer.train(data);
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "kiln/config.h"

namespace kiln {
class CompiledStep;
struct StepStats;
}  // namespace kiln

namespace kiln {

using ForwardFn = std::function<at::Tensor(const at::Tensor& input)>;
using MultiForwardFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

namespace trainer_detail {
// The number of tensors a module's (non-template, non-overloaded) forward takes.
template <class F>
struct arity;
template <class C, class R, class... A>
struct arity<R (C::*)(A...)> : std::integral_constant<size_t, sizeof...(A)> {};
template <class C, class R, class... A>
struct arity<R (C::*)(A...) const> : std::integral_constant<size_t, sizeof...(A)> {};

template <class M, class = void>
struct has_plain_forward : std::false_type {};
template <class M>
struct has_plain_forward<M, std::void_t<decltype(&M::forward)>> : std::true_type {};

template <class M, size_t... I>
at::Tensor call_forward(M& m, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return m.forward(in[I]...);
}

// forward(inputs...) of `model`, checking the count. Modules whose forward is a template
// (torch::nn::Sequential) take one tensor.
template <class Module>
MultiForwardFn forward_of(const std::shared_ptr<Module>& model) {
  if constexpr (has_plain_forward<Module>::value) {
    constexpr size_t n = arity<decltype(&Module::forward)>::value;
    return [model](const std::vector<at::Tensor>& in) -> at::Tensor {
      if (in.size() != n)
        throw std::invalid_argument("kiln::Trainer: the model's forward takes " + std::to_string(n) +
                                    " tensors, the step was given " + std::to_string(in.size()));
      return call_forward(*model, in, std::make_index_sequence<n>{});
    };
  } else {
    return [model](const std::vector<at::Tensor>& in) -> at::Tensor {
      if (in.size() != 1)
        throw std::invalid_argument(
            "kiln::Trainer: the model's forward is called with one tensor, the step was given " +
            std::to_string(in.size()));
      return model->forward(in[0]);
    };
  }
}
}  // namespace trainer_detail

// One example of a dataset: the tensors forward takes, and the target the loss reads.
struct Example {
  std::vector<at::Tensor> inputs;
  at::Tensor target;
};

// What Trainer::train reads: examples by index. train() stacks per_device_train_batch_size of them
// (along a new dim 0) into a micro-batch; every example has the same number of inputs and the same
// shapes.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual Example get(size_t index) const = 0;
};

// Examples along dim 0 of tensors: example i is ({inputs[0][i], ...}, target[i]).
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::vector<at::Tensor> inputs, at::Tensor target);
  size_t size() const override;
  Example get(size_t index) const override;

 private:
  std::vector<at::Tensor> inputs_;
  at::Tensor target_;
};

// What Trainer::train returns, as Hugging Face's TrainOutput: the optimizer steps made, the mean
// training loss over them, and the run's metrics (train_runtime, train_samples_per_second,
// train_steps_per_second, train_loss, epoch).
struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;
  std::map<std::string, double> metrics;
};

class Trainer {
 public:
  // `model`: a std::shared_ptr to a torch::nn::Module, or a module holder (torch::nn::Linear, a
  // TORCH_MODULE), whose forward takes one or several tensors and returns the output the loss
  // reads. The optimizer must outlive the Trainer.
  template <class Module>
  Trainer(std::shared_ptr<Module> model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
          TrainingArguments args = {})
      : Trainer(std::static_pointer_cast<torch::nn::Module>(model), trainer_detail::forward_of(model), optimizer,
                std::move(loss_fn), std::move(args)) {}
  template <class Contained>
  Trainer(const torch::nn::ModuleHolder<Contained>& model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
          TrainingArguments args = {})
      : Trainer(model.ptr(), optimizer, std::move(loss_fn), std::move(args)) {}

  Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward, torch::optim::Optimizer& optimizer,
          LossFn loss_fn, TrainingArguments args = {});
  Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, torch::optim::Optimizer& optimizer,
          LossFn loss_fn, TrainingArguments args = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step: zero_grad, forward, loss, backward, clip_grad_norm_ (args.max_grad_norm > 0),
  // optimizer update. Returns the loss.
  at::Tensor step(const at::Tensor& input, const at::Tensor& target);
  at::Tensor step(const std::vector<at::Tensor>& inputs, const at::Tensor& target);

  // A whole training over `dataset`, driven by args() with Hugging Face's meanings: max_steps
  // optimizer steps when > 0, else ceil(num_train_epochs * steps per epoch), where an epoch is the
  // dataset shuffled (a generator seeded with args.seed), cut into micro-batches of
  // per_device_train_batch_size examples (the last may be smaller) and those grouped by
  // gradient_accumulation_steps (the last group may be shorter). Before every optimizer step each
  // parameter group's learning rate is set to the schedule's (learning_rate, lr_scheduler_type,
  // warmup_steps or warmup_ratio); the optimizer's own lr is replaced. A group of one micro-batch
  // runs through step(); a longer group runs through a second compiled step that adds the
  // micro-batches' gradients (each loss divided by the group's size) before one optimizer update.
  // Every logging_steps steps a line {"step", "epoch", "loss" (the mean since the last line),
  // "learning_rate" (the scheduler's after the step, as Hugging Face logs it), "steps_per_second"}
  // goes to <output_dir>/metrics.jsonl (truncated first; no file when output_dir is empty), and a
  // last line holds the run's metrics.
  TrainOutput train(const Dataset& dataset);

  // The backend chosen and the reasons, for display.
  const std::string& backend() const;
  const std::vector<std::string>& backend_reasons() const;
  // Whether steps currently run compiled (false while the pipeline falls back to eager).
  bool compiled() const;
  const TrainingArguments& args() const;
  // Counters (compiles, compiled and eager steps, compile time, last fallback reason) and the
  // compiled step itself (its captured and compiled graphs): step()'s, or, after train() ran
  // groups of several micro-batches, the accumulating step's.
  const StepStats& stats() const;
  const CompiledStep& compiled_step() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
