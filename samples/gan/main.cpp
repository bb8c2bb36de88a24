// A GAN on a toy 2-D distribution, trained with kiln::compile_step in the user's own loop. The real
// points lie on a ring of eight Gaussians (radius 2, spread 0.05); a generator (an MLP from 2-D
// noise to a point) learns to make points that a discriminator (an MLP from a point to a logit)
// cannot tell from them. The whole GAN update is one compiled step with two Adam optimizers, as
// LibTorch's DCGAN example writes its loop body: the discriminator learns from a real and a
// generated batch and steps, then the generator learns through the updated discriminator and steps.
// The noise is drawn inside the step, so every compiled step draws fresh noise.
//
// Quality, measured on 2000 generated points before and after: the fraction within 0.15 (three
// spreads) of one of the eight modes, their mean distance to the nearest mode, and how many modes
// hold at least 2% of them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/kiln.h"

namespace {

constexpr int64_t kModes = 8, kNoise = 2;
constexpr double kRadius = 2.0, kSpread = 0.05;

at::Tensor mode_centres() {
  const at::Tensor angle = torch::arange(kModes, torch::kFloat) * (2 * M_PI / kModes);
  return torch::stack({torch::cos(angle), torch::sin(angle)}, 1) * kRadius;  // [8, 2]
}

// `n` points of the real distribution: a mode chosen at random, plus Gaussian noise.
at::Tensor sample_ring(int64_t n, const at::Device& device) {
  return (mode_centres().index_select(0, torch::randint(kModes, {n})) + kSpread * torch::randn({n, 2})).to(device);
}

struct Quality {
  double near_fraction, mean_distance;
  int64_t modes_covered;
};

Quality measure(const at::Tensor& generated) {
  const at::Tensor points = generated.to(at::kCPU, at::kFloat);
  const auto [distance, nearest] = torch::cdist(points, mode_centres()).min(1);
  const at::Tensor near = distance < 3 * kSpread;
  const at::Tensor per_mode = torch::bincount(nearest.masked_select(near), {}, kModes);
  return {near.to(torch::kDouble).mean().item<double>(), distance.mean().item<double>(),
          (per_mode >= points.size(0) / 50).sum().item<int64_t>()};
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 1000;
  std::string precision = "auto", device = "cpu";
  auto usage = [] {
    std::fprintf(stderr, "usage: kiln_gan [--steps N] [--device cpu|cuda] [--precision auto|fp32|bf16]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (flag == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (flag == "--device" && i + 1 < argc) device = argv[++i];
    else return usage();
  }
  if (device != "cpu" && device != "cuda") return usage();
  const at::Device dev = device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);

  // The networks are tiny (layers 128 wide, batches of 256 points): an op split across threads costs
  // more in hand-offs than it saves, and on a busy machine the threads wait on each other far longer.
  torch::set_num_threads(1);
  torch::manual_seed(1);
  torch::nn::Sequential generator(torch::nn::Linear(kNoise, 128), torch::nn::ReLU(), torch::nn::Linear(128, 128),
                                  torch::nn::ReLU(), torch::nn::Linear(128, 2));
  torch::nn::Sequential discriminator(torch::nn::Linear(2, 128), torch::nn::LeakyReLU(), torch::nn::Linear(128, 128),
                                      torch::nn::LeakyReLU(), torch::nn::Linear(128, 1));
  generator->to(dev);
  discriminator->to(dev);
  const auto adam = torch::optim::AdamOptions(2e-3).betas({0.5, 0.999});
  torch::optim::Adam generator_optimizer(generator->parameters(), adam);
  torch::optim::Adam discriminator_optimizer(discriminator->parameters(), adam);
  namespace F = torch::nn::functional;

  kiln::TrainingArguments args;
  args.torch_compile = true;  // the default backend for this machine
  // bfloat16 autocast over the forwards and losses where the device computes bfloat16 in hardware
  // (--precision auto), as the Trainer would with bf16 = true; the backwards run outside it.
  std::printf("precision: %s\n", kiln::choose_precision(args, precision, dev).c_str());
  const at::ScalarType amp = args.bf16 ? at::kBFloat16 : at::kFloat;
  kiln::CompiledStep gan_step = kiln::compile_step(
      [&](const std::vector<at::Tensor>& inputs) {
        const at::Tensor& real = inputs[0];
        const at::Tensor ones = torch::ones({real.size(0), 1}, real.options()),
                         zeros = torch::zeros({real.size(0), 1}, real.options());
        // The discriminator learns to call real points real and generated ones fake.
        discriminator_optimizer.zero_grad();
        at::Tensor fake, d_loss, g_loss;
        {
          kiln::AutocastGuard autocast(amp, dev.type());
          fake = generator->forward(torch::randn({real.size(0), kNoise}, real.options()));
          d_loss = F::binary_cross_entropy_with_logits(discriminator->forward(real), ones) +
                   F::binary_cross_entropy_with_logits(discriminator->forward(fake.detach()), zeros);
        }
        d_loss.backward();
        discriminator_optimizer.step();
        // The generator learns to make the updated discriminator call its points real.
        generator_optimizer.zero_grad();
        {
          kiln::AutocastGuard autocast(amp, dev.type());
          g_loss = F::binary_cross_entropy_with_logits(discriminator->forward(fake), ones);
        }
        g_loss.backward();
        generator_optimizer.step();
        return std::vector<at::Tensor>{d_loss.detach(), g_loss.detach()};
      },
      {{generator.ptr(), discriminator.ptr()}, {&discriminator_optimizer, &generator_optimizer}}, args);
  std::printf("backend: %s\n", gan_step.backend().c_str());

  auto generate = [&](int64_t n) {
    torch::NoGradGuard no_grad;
    return generator->forward(torch::randn({n, kNoise}, torch::device(dev)));
  };
  const Quality before = measure(generate(2000));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= steps; ++step) {
    const std::vector<at::Tensor> losses = gan_step({sample_ring(256, dev)});
    if (step % std::max<int64_t>(1, steps / 10) == 0)
      std::printf("step %lld: discriminator loss %.3f, generator loss %.3f, near a mode %.3f\n",
                  static_cast<long long>(step), losses[0].item<double>(), losses[1].item<double>(),
                  measure(generate(500)).near_fraction);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Quality after = measure(generate(2000));

  const kiln::StepStats& stats = gan_step.stats();
  std::printf("%d steps in %.1f s: %d compiled, %d eager (warm-up and capture); fallback: %s\n", stats.steps, seconds,
              stats.compiled_steps, stats.eager_steps,
              stats.last_fallback.empty() ? "none" : stats.last_fallback.c_str());
  std::printf(
      "generated points near a mode: %.3f before, %.3f after; mean distance to the nearest mode %.3f before, "
      "%.3f after; modes covered %lld before, %lld after (of %lld)\n",
      before.near_fraction, after.near_fraction, before.mean_distance, after.mean_distance,
      static_cast<long long>(before.modes_covered), static_cast<long long>(after.modes_covered),
      static_cast<long long>(kModes));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln_gan: %s\n", e.what());
  return 1;
}
