// An MNIST-style image classifier the way LibTorch's examples write one: a convolution with batch
// norm and max pooling, dropout, a linear head, log_softmax + nll_loss, Adam.
//
// Dropout draws a new mask every training step from LibTorch's generator; the compiled step has to
// draw the same masks, in the same order, as eager does from the same seed, and batch norm's
// running statistics have to advance as eager's do.
//
// Shared by tests/programs (which trains it eagerly and through kiln from one seed and compares)
// and bench/programs (which times it). Everything is drawn from LibTorch's global generator, in
// this order: seed it first.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::cnn_classifier {

struct Options {
  int64_t batch = 16;
  int batches = 3;  // the synthetic data set, handed out in turn
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      // No bias: batch norm subtracts it again, so its gradient is pure rounding noise, which Adam
      // would turn into full-size updates that no two summation orders agree on.
      : conv(torch::nn::Conv2dOptions(1, 8, /*kernel_size=*/3).bias(false)),
        bn(8),
        dropout(torch::nn::DropoutOptions(0.25)),
        fc(8 * 13 * 13, 10) {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("dropout", dropout);
    register_module("fc", fc);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn(conv(x))), 2);  // 28x28 -> 26x26 -> 13x13
    x = dropout(x.flatten(1));
    return torch::log_softmax(fc(x), /*dim=*/1);
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

// The model, its optimizer, the data and the training step. The step refers to this object: it is
// neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(), optimizer(model->parameters(), torch::optim::AdamOptions(1e-3)) {
    // A fixed synthetic data set, as a data loader would hand it out: one tensor per batch.
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
      optimizer.zero_grad();
      auto output = model->forward(batch[0]);
      auto loss = torch::nll_loss(output, batch[1]);
      loss.backward();
      optimizer.step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % images.size();
    return {images[k], labels[k]};
  }

  Net model;
  torch::optim::Adam optimizer;
  std::vector<torch::Tensor> images, labels;
};

}  // namespace corpus::cnn_classifier
