#include "kiln/trainer.h"

#include "kiln/log.h"

namespace kiln {

struct Trainer::Impl {
  std::shared_ptr<torch::nn::Module> model;
  ForwardFn forward;
  torch::optim::Optimizer* optimizer;
  LossFn loss_fn;
  TrainingArguments args;
  std::string backend = "eager";
  std::vector<std::string> reasons;
  bool said_eager = false;

  at::Tensor eager_step(const at::Tensor& input, const at::Tensor& target) {
    optimizer->zero_grad();
    auto loss = loss_fn(forward(input), target);
    loss.backward();
    optimizer->step();
    return loss.detach();
  }
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
  impl_->args = std::move(args);
  impl_->reasons.push_back("the compile pipeline has not landed yet: every step runs eagerly");
}

Trainer::~Trainer() = default;

at::Tensor Trainer::step(const at::Tensor& input, const at::Tensor& target) {
  if (!impl_->said_eager && impl_->args.compile_enabled()) {
    log_warn("torch_compile is on but the compile pipeline has not landed yet; running the eager step");
    impl_->said_eager = true;
  }
  return impl_->eager_step(input, target);
}

const std::string& Trainer::backend() const { return impl_->backend; }
const std::vector<std::string>& Trainer::backend_reasons() const { return impl_->reasons; }
bool Trainer::compiled() const { return false; }
const TrainingArguments& Trainer::args() const { return impl_->args; }

}  // namespace kiln
