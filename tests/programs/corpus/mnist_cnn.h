// The classifier of PyTorch's MNIST example, written against LibTorch: two 3x3 convolutions with
// ReLU, max pooling, dropout, a 9216 -> 128 -> 10 head with ReLU and dropout between, log_softmax +
// nll_loss, Adam (or SGD with momentum). The MNIST-style step users time against eager at batch 64.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::mnist_cnn {

enum class Optimizer { Adam, Sgd };

struct Options {
  int64_t batch = 16;
  int batches = 3;
  Optimizer optimizer = Optimizer::Adam;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(torch::nn::Conv2dOptions(1, 32, 3)),
        conv2(torch::nn::Conv2dOptions(32, 64, 3)),
        dropout1(torch::nn::DropoutOptions(0.25)),
        dropout2(torch::nn::DropoutOptions(0.5)),
        fc1(9216, 128),
        fc2(128, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("dropout1", dropout1);
    register_module("dropout2", dropout2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));                        // 28x28 -> 26x26
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // -> 24x24 -> 12x12
    x = dropout1(x).flatten(1);                       // 64 * 12 * 12 = 9216
    x = dropout2(torch::relu(fc1(x)));
    return torch::log_softmax(fc2(x), /*dim=*/1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout dropout1, dropout2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Net& model, Optimizer kind) {
  if (kind == Optimizer::Sgd)
    return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
}

// The model, its optimizer, the data and the training step. The step refers to this object: it is
// neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {}) : model(), optimizer(make_optimizer(model, options.optimizer)) {
    // MNIST-shaped synthetic batches (standard normal, as normalized digits roughly are).
    for (int b = 0; b < options.batches; ++b) {
      images.push_back(torch::randn({options.batch, 1, 28, 28}));
      labels.push_back(torch::randint(0, 10, {options.batch}));
    }
    model->train();
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& batch) {
      optimizer->zero_grad();
      auto output = model->forward(batch[0]);
      auto loss = torch::nll_loss(output, batch[1]);
      loss.backward();
      optimizer->step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {optimizer.get()}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % images.size();
    return {images[k], labels[k]};
  }

  Net model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<torch::Tensor> images, labels;
};

}  // namespace corpus::mnist_cnn
