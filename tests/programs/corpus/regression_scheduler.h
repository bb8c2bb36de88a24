// Polynomial regression, LibTorch's regression example made a training run: a torch::nn::Linear
// over the features x, x^2, x^3, x^4 fits a fixed polynomial with noise, with SGD and a StepLR
// schedule that halves the learning rate every 3 steps.
//
// The scheduler changes the optimizer's learning rate between steps, outside the step: the
// compiled step has to use the rate of the moment, every step.
//
// Shared by tests/programs (which runs it through kiln::Trainer) and bench/programs. Everything is
// drawn from LibTorch's global generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::regression_scheduler {

constexpr int64_t kDegree = 4;

struct Options {
  int64_t batch = 32;
  int batches = 4;
};

inline torch::Tensor make_features(const torch::Tensor& x) {
  std::vector<torch::Tensor> powers;
  for (int64_t i = 1; i <= kDegree; ++i) powers.push_back(x.pow(i));
  return torch::cat(powers, 1);
}

inline torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::mse_loss(output, target);
}

// The model, its optimizer and schedule, the data and the training step (what kiln::Trainer runs
// for this model and loss). The step refers to this object: it is neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(kDegree, 1),
        optimizer(model->parameters(), torch::optim::SGDOptions(0.1)),
        scheduler(optimizer, /*step_size=*/3, /*gamma=*/0.5) {
    const auto target_weight = torch::randn({kDegree, 1}) * 0.5;
    const auto target_bias = torch::randn({1}) * 5;
    for (int b = 0; b < options.batches; ++b) {
      auto x = torch::rand({options.batch, 1}) * 2 - 1;
      auto features = make_features(x);
      inputs.push_back(features);
      targets.push_back(features.mm(target_weight) + target_bias + 0.05 * torch::randn({options.batch, 1}));
    }
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& in) {
      optimizer.zero_grad();
      auto loss = mse(model->forward(in[0]), in[1]);
      loss.backward();
      optimizer.step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % inputs.size();
    return {inputs[k], targets[k]};
  }
  // Between steps, outside the step.
  void after_step() { scheduler.step(); }
  double current_lr() { return optimizer.param_groups()[0].options().get_lr(); }

  torch::nn::Linear model;
  torch::optim::SGD optimizer;
  torch::optim::StepLR scheduler;
  std::vector<torch::Tensor> inputs, targets;
};

}  // namespace corpus::regression_scheduler
