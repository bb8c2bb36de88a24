#include "kiln/trainer.h"

#include "kiln/compile.h"
#include "kiln/log.h"

namespace kiln {

struct Trainer::Impl {
  std::shared_ptr<torch::nn::Module> model;
  ForwardFn forward;
  torch::optim::Optimizer* optimizer;
  LossFn loss_fn;
  std::unique_ptr<CompiledStep> step;
};

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward,
                 torch::optim::Optimizer& optimizer, LossFn loss_fn, TrainingArguments args)
    : impl_(std::make_unique<Impl>()) {
  args.apply_env();
  args.validate();
  set_log_level(args.log_level);
  impl_->model = std::move(model);
  impl_->forward = std::move(forward);
  impl_->optimizer = &optimizer;
  impl_->loss_fn = std::move(loss_fn);
  auto* im = impl_.get();
  impl_->step = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>& in) {
        im->optimizer->zero_grad();
        auto loss = im->loss_fn(im->forward(in.at(0)), in.at(1));
        loss.backward();
        im->optimizer->step();
        return std::vector<at::Tensor>{loss.detach()};
      },
      StepState{{impl_->model}, {impl_->optimizer}}, std::move(args));
}

Trainer::~Trainer() = default;

at::Tensor Trainer::step(const at::Tensor& input, const at::Tensor& target) {
  return (*impl_->step)({input, target}).at(0);
}

const std::string& Trainer::backend() const { return impl_->step->backend(); }
const std::vector<std::string>& Trainer::backend_reasons() const { return impl_->step->backend_reasons(); }
bool Trainer::compiled() const { return impl_->step->last_step_compiled(); }
const TrainingArguments& Trainer::args() const { return impl_->step->args(); }
const StepStats& Trainer::stats() const { return impl_->step->stats(); }
const CompiledStep& Trainer::compiled_step() const { return *impl_->step; }

}  // namespace kiln
