// Multi-task learning: a shared trunk with a classification head and a regression head, two
// losses, two backward passes in one step and two optimizers. The classification loss goes
// backward first, keeping the graph, and the classification head's SGD steps on its gradient right
// away; the regression loss then goes backward through the same trunk, adding its gradient to the
// trunk's, and an Adam over the trunk and the regression head steps.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::multitask_two_backward {

constexpr int64_t kFeatures = 10;
constexpr int64_t kHidden = 32;
constexpr int64_t kClasses = 3;

struct Options {
  int64_t batch = 16;
  int batches = 3;
};

struct TrunkImpl : torch::nn::Module {
  TrunkImpl() : fc1(kFeatures, kHidden), fc2(kHidden, kHidden) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc2(torch::relu(fc1(x)))); }

  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Trunk);

struct MultiTaskNetImpl : torch::nn::Module {
  MultiTaskNetImpl() : classifier(kHidden, kClasses), regressor(kHidden, 1) {
    register_module("trunk", trunk);
    register_module("classifier", classifier);
    register_module("regressor", regressor);
  }

  // Class logits and the regression value.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto h = trunk(x);
    return {classifier(h), regressor(h).squeeze(1)};
  }

  Trunk trunk;
  torch::nn::Linear classifier, regressor;
};
TORCH_MODULE(MultiTaskNet);

inline std::vector<torch::Tensor> shared_parameters(MultiTaskNet& model) {
  std::vector<torch::Tensor> shared = model->trunk->parameters();
  for (const auto& p : model->regressor->parameters()) shared.push_back(p);
  return shared;
}

// The model, its two optimizers, the data and the training step. The step refers to this object:
// it is neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(),
        head_optimizer(model->classifier->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        shared_optimizer(shared_parameters(model), torch::optim::AdamOptions(1e-2)) {
    for (int b = 0; b < options.batches; ++b) {
      auto x = torch::randn({options.batch, kFeatures});
      inputs.push_back(x);
      classes.push_back(x.slice(1, 0, kClasses).argmax(1));
      values.push_back(x.sum(1) + 0.1 * torch::randn({options.batch}));
    }
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Inputs {x, classes, values}; returns {class_loss, value_loss}.
  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& batch) {
      head_optimizer.zero_grad();
      shared_optimizer.zero_grad();
      auto [logits, value] = model->forward(batch[0]);
      auto class_loss = torch::nn::functional::cross_entropy(logits, batch[1]);
      auto value_loss = torch::nn::functional::mse_loss(value, batch[2]);
      // The regression loss goes backward through the same trunk afterwards: keep the graph.
      class_loss.backward({}, /*retain_graph=*/true);
      head_optimizer.step();
      value_loss.backward();
      shared_optimizer.step();
      return std::vector<torch::Tensor>{class_loss.detach(), value_loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&head_optimizer, &shared_optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % inputs.size();
    return {inputs[k], classes[k], values[k]};
  }

  MultiTaskNet model;
  torch::optim::SGD head_optimizer;
  torch::optim::Adam shared_optimizer;
  std::vector<torch::Tensor> inputs, classes, values;
};

}  // namespace corpus::multitask_two_backward
