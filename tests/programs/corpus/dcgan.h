// LibTorch's DCGAN example, shrunk: a generator of transposed convolutions and a discriminator of
// strided convolutions, binary cross entropy, one Adam per network (betas 0.5, 0.999), and the
// example's loop body as one step: the discriminator learns from a real batch (noisy labels drawn
// with uniform_) and from a detached fake batch (noise drawn with randn), steps; then the
// generator learns through the updated discriminator and steps.
//
// Two optimizers stepping at different points of one step, random numbers drawn inside the step,
// a backward pass that also fills the discriminator's gradients without stepping them, batch norm
// running three times a step in the discriminator.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::dcgan {

constexpr int64_t kNoiseSize = 16;

struct Options {
  int64_t batch = 8;
  int batches = 3;
};

struct DCGANGeneratorImpl : torch::nn::Module {
  DCGANGeneratorImpl(int64_t noise_size)
      // In declaration order, which is the order they are made in (and draw their weights).
      : conv1(torch::nn::ConvTranspose2dOptions(noise_size, 32, 4).bias(false)),
        conv2(torch::nn::ConvTranspose2dOptions(32, 16, 3).stride(2).padding(1).bias(false)),
        conv3(torch::nn::ConvTranspose2dOptions(16, 8, 4).stride(2).padding(1).bias(false)),
        conv4(torch::nn::ConvTranspose2dOptions(8, 1, 4).stride(2).padding(1).bias(false)),
        batch_norm1(32),
        batch_norm2(16),
        batch_norm3(8) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv3", conv3);
    register_module("conv4", conv4);
    register_module("batch_norm1", batch_norm1);
    register_module("batch_norm2", batch_norm2);
    register_module("batch_norm3", batch_norm3);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(batch_norm1(conv1(x)));  // 1x1 -> 4x4
    x = torch::relu(batch_norm2(conv2(x)));  // -> 7x7
    x = torch::relu(batch_norm3(conv3(x)));  // -> 14x14
    return torch::tanh(conv4(x));            // -> 28x28
  }

  torch::nn::ConvTranspose2d conv1, conv2, conv3, conv4;
  torch::nn::BatchNorm2d batch_norm1, batch_norm2, batch_norm3;
};
TORCH_MODULE(DCGANGenerator);

struct DCGANDiscriminatorImpl : torch::nn::Module {
  DCGANDiscriminatorImpl()
      : conv1(torch::nn::Conv2dOptions(1, 8, 4).stride(2).padding(1).bias(false)),
        conv2(torch::nn::Conv2dOptions(8, 16, 4).stride(2).padding(1).bias(false)),
        conv3(torch::nn::Conv2dOptions(16, 32, 4).stride(2).padding(1).bias(false)),
        conv4(torch::nn::Conv2dOptions(32, 1, 3).stride(1).padding(0).bias(false)),
        batch_norm2(16),
        batch_norm3(32),
        leaky_relu(torch::nn::LeakyReLUOptions().negative_slope(0.2)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("batch_norm2", batch_norm2);
    register_module("conv3", conv3);
    register_module("batch_norm3", batch_norm3);
    register_module("conv4", conv4);
    register_module("leaky_relu", leaky_relu);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = leaky_relu(conv1(x));               // 28x28 -> 14x14
    x = leaky_relu(batch_norm2(conv2(x)));  // -> 7x7
    x = leaky_relu(batch_norm3(conv3(x)));  // -> 3x3
    return torch::sigmoid(conv4(x));        // -> 1x1
  }

  torch::nn::Conv2d conv1, conv2, conv3, conv4;
  torch::nn::BatchNorm2d batch_norm2, batch_norm3;
  torch::nn::LeakyReLU leaky_relu;
};
TORCH_MODULE(DCGANDiscriminator);

// The two networks, their optimizers, the real images and the training step. The step refers to
// this object: it is neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : generator(kNoiseSize),
        discriminator(),
        generator_optimizer(generator->parameters(),
                            torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999))),
        discriminator_optimizer(discriminator->parameters(),
                                torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.999))) {
    // "Real" images in the generator's range [-1, 1].
    for (int b = 0; b < options.batches; ++b) real_batches.push_back(torch::rand({options.batch, 1, 28, 28}) * 2 - 1);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Returns {d_loss, g_loss}.
  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& batch) {
      // Train the discriminator with real images.
      discriminator->zero_grad();
      torch::Tensor real_images = batch[0];
      torch::Tensor real_labels = torch::empty(real_images.size(0)).uniform_(0.8, 1.0);
      torch::Tensor real_output = discriminator->forward(real_images).reshape(real_labels.sizes());
      torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, real_labels);
      d_loss_real.backward();

      // Train the discriminator with fake images.
      torch::Tensor noise = torch::randn({real_images.size(0), kNoiseSize, 1, 1});
      torch::Tensor fake_images = generator->forward(noise);
      torch::Tensor fake_labels = torch::zeros(real_images.size(0));
      torch::Tensor fake_output = discriminator->forward(fake_images.detach()).reshape(fake_labels.sizes());
      torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
      d_loss_fake.backward();

      torch::Tensor d_loss = d_loss_real + d_loss_fake;
      discriminator_optimizer.step();

      // Train the generator.
      generator->zero_grad();
      fake_labels.fill_(1);
      fake_output = discriminator->forward(fake_images).reshape(fake_labels.sizes());
      torch::Tensor g_loss = torch::binary_cross_entropy(fake_output, fake_labels);
      g_loss.backward();
      generator_optimizer.step();

      return std::vector<torch::Tensor>{d_loss.detach(), g_loss.detach()};
    };
  }
  kiln::StepState state() {
    return {{generator.ptr(), discriminator.ptr()}, {&discriminator_optimizer, &generator_optimizer}};
  }
  std::vector<torch::Tensor> batch(int i) const { return {real_batches[static_cast<size_t>(i) % real_batches.size()]}; }

  DCGANGenerator generator;
  DCGANDiscriminator discriminator;
  torch::optim::Adam generator_optimizer;
  torch::optim::Adam discriminator_optimizer;
  std::vector<torch::Tensor> real_batches;
};

}  // namespace corpus::dcgan
