#include "kiln/trainer.h"

#include <torch/nn/utils/clip_grad.h>

#include "kiln/compile.h"
#include "kiln/log.h"

namespace kiln {

struct Trainer::Impl {
  std::shared_ptr<torch::nn::Module> model;
  MultiForwardFn forward;
  torch::optim::Optimizer* optimizer;
  LossFn loss_fn;
  double max_grad_norm = 0;
  std::unique_ptr<CompiledStep> step;
};

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward, torch::optim::Optimizer& optimizer,
                 LossFn loss_fn, TrainingArguments args)
    : Trainer(
          std::move(model), MultiForwardFn([f = std::move(forward)](const std::vector<at::Tensor>& in) {
            if (in.size() != 1)
              throw std::invalid_argument("kiln::Trainer: the forward function takes one tensor, the step was given " +
                                          std::to_string(in.size()));
            return f(in[0]);
          }),
          optimizer, std::move(loss_fn), std::move(args)) {}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, torch::optim::Optimizer& optimizer,
                 LossFn loss_fn, TrainingArguments args)
    : impl_(std::make_unique<Impl>()) {
  if (!model) throw std::invalid_argument("kiln::Trainer: the model is null");
  impl_->model = std::move(model);
  impl_->forward = std::move(forward);
  impl_->optimizer = &optimizer;
  impl_->loss_fn = std::move(loss_fn);
  impl_->max_grad_norm = args.max_grad_norm;
  auto* im = impl_.get();
  // The last input is the target; the others go to forward.
  impl_->step = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>& in) {
        im->optimizer->zero_grad();
        const std::vector<at::Tensor> x(in.begin(), in.end() - 1);
        auto loss = im->loss_fn(im->forward(x), in.back());
        loss.backward();
        if (im->max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(im->model->parameters(), im->max_grad_norm);
        im->optimizer->step();
        return std::vector<at::Tensor>{loss.detach()};
      },
      StepState{{impl_->model}, {impl_->optimizer}}, std::move(args));
  // The environment may have set max_grad_norm too (CompiledStep applied it).
  impl_->max_grad_norm = impl_->step->args().max_grad_norm;
}

Trainer::~Trainer() = default;

at::Tensor Trainer::step(const at::Tensor& input, const at::Tensor& target) {
  return (*impl_->step)({input, target}).at(0);
}

at::Tensor Trainer::step(const std::vector<at::Tensor>& inputs, const at::Tensor& target) {
  std::vector<at::Tensor> all(inputs);
  all.push_back(target);
  return (*impl_->step)(all).at(0);
}

const std::string& Trainer::backend() const { return impl_->step->backend(); }
const std::vector<std::string>& Trainer::backend_reasons() const { return impl_->step->backend_reasons(); }
bool Trainer::compiled() const { return impl_->step->last_step_compiled(); }
const TrainingArguments& Trainer::args() const { return impl_->step->args(); }
const StepStats& Trainer::stats() const { return impl_->step->stats(); }
const CompiledStep& Trainer::compiled_step() const { return *impl_->step; }

}  // namespace kiln
