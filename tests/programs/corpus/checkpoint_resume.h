// A small MLP with dropout and Adam, on a fixed synthetic data set: the program that
// tests/programs/checkpoint_resume_test.cpp saves, reloads, retunes and switches to eval() between
// steps while the compiled step keeps using it.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::checkpoint_resume {

constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;

struct Options {
  int64_t batch = 16;
  int batches = 4;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(kFeatures, 32), dropout(torch::nn::DropoutOptions(0.2)), fc2(32, kClasses) {
    register_module("fc1", fc1);
    register_module("dropout", dropout);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(const torch::Tensor& x) { return fc2(dropout(torch::relu(fc1(x)))); }

  torch::nn::Linear fc1;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Mlp);

// The model, its optimizer, the data and the training step. The step refers to this object: it is
// neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(), optimizer(model->parameters(), torch::optim::AdamOptions(1e-2)) {
    for (int b = 0; b < options.batches; ++b) {
      inputs.push_back(torch::randn({options.batch, kFeatures}));
      labels.push_back(torch::randint(0, kClasses, {options.batch}));
    }
    model->train();
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& batch) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
      loss.backward();
      optimizer.step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % inputs.size();
    return {inputs[k], labels[k]};
  }

  Mlp model;
  torch::optim::Adam optimizer;
  std::vector<torch::Tensor> inputs, labels;
};

}  // namespace corpus::checkpoint_resume
