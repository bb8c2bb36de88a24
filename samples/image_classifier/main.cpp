// A small convolutional image classifier trained with kiln::Trainer::train, written the way a
// LibTorch user writes one. There is no data set to download: the program draws its own images,
// 16x16 bars in four orientations (-, |, \, /) at random places and lengths under strong Gaussian
// noise, so that the only way to tell the classes apart is the shape. Training runs --steps
// optimizer steps on 2048 images and measures the accuracy on 512 others the model never saw,
// before and after; the counters of the compiled step show that it ran compiled.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/kiln.h"

namespace {

constexpr int64_t kSize = 16, kClasses = 4;

// `n` images [n, 1, 16, 16] of one bar each, with their orientations [n] as labels.
std::pair<at::Tensor, at::Tensor> draw_bars(int64_t n, std::mt19937& rng) {
  const float direction[kClasses][2] = {{1, 0}, {0, 1}, {0.7071f, 0.7071f}, {0.7071f, -0.7071f}};
  std::uniform_int_distribution<int> label_of(0, kClasses - 1), centre(4, 11);
  std::uniform_real_distribution<float> half_length(2.5f, 6.f);
  std::normal_distribution<float> noise(0.f, 0.5f);
  std::vector<float> pixels(static_cast<size_t>(n * kSize * kSize));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (size_t i = 0; i < labels.size(); ++i) {
    const int k = label_of(rng);
    labels[i] = k;
    const float cx = centre(rng), cy = centre(rng), half = half_length(rng);
    for (int y = 0; y < kSize; ++y)
      for (int x = 0; x < kSize; ++x) {
        const float along = (x - cx) * direction[k][0] + (y - cy) * direction[k][1];
        const float across = (x - cx) * direction[k][1] - (y - cy) * direction[k][0];
        const bool on_bar = std::abs(along) <= half && std::abs(across) < 0.75f;
        pixels[(i * kSize + y) * kSize + x] = (on_bar ? 1.f : 0.f) + noise(rng);
      }
  }
  return {torch::tensor(pixels).reshape({n, 1, kSize, kSize}), torch::tensor(labels)};
}

struct BarNetImpl : torch::nn::Module {
  BarNetImpl()
      : conv1(torch::nn::Conv2dOptions(1, 16, 3).padding(1)),
        bn1(16),
        conv2(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
        bn2(32),
        dropout(0.25),
        fc(32 * 4 * 4, kClasses) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("dropout", dropout);
    register_module("fc", fc);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);  // 16x16 -> 8x8
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);  // -> 4x4
    return fc(dropout(x.flatten(1)));                      // logits
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc;
};
TORCH_MODULE(BarNet);

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 300;
  std::string output_dir = "image_classifier_run", precision = "auto", device = "cpu";
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: kiln_image_classifier [--steps N] [--output-dir DIR] [--device cpu|cuda] "
                 "[--precision auto|fp32|bf16]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (flag == "--output-dir" && i + 1 < argc) output_dir = argv[++i];
    else if (flag == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (flag == "--device" && i + 1 < argc) device = argv[++i];
    else return usage();
  }
  if (device != "cpu" && device != "cuda") return usage();
  const at::Device dev = device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);

  // The model is tiny: an op split across threads costs more in hand-offs than it saves, and on a
  // busy machine the threads wait on each other far longer.
  torch::set_num_threads(1);
  std::mt19937 rng(1);
  const auto [train_images, train_labels] = draw_bars(2048, rng);
  const auto [eval_images, eval_labels] = draw_bars(512, rng);
  // 2048 is a multiple of the batch: every micro-batch has one shape, so the step compiles once.
  kiln::TensorDataset train_data({train_images.to(dev)}, train_labels.to(dev)),
      eval_data({eval_images.to(dev)}, eval_labels.to(dev));

  torch::manual_seed(1);
  BarNet model;
  model->to(dev);
  torch::optim::AdamW optimizer(model->parameters());
  auto loss_fn = [](const at::Tensor& logits, const at::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits, labels);
  };

  kiln::TrainingArguments args;
  args.torch_compile = true;  // the default backend for this machine
  args.output_dir = output_dir;
  args.max_steps = steps;
  args.per_device_train_batch_size = 32;
  args.per_device_eval_batch_size = 256;
  args.learning_rate = 3e-3;
  args.warmup_ratio = 0.1;  // then linear decay to 0
  args.logging_steps = std::max<int64_t>(1, steps / 10);
  args.eval_strategy = "steps";
  args.eval_steps = std::max<int64_t>(1, steps / 3);
  args.save_strategy = "no";
  args.seed = 1;
  // bfloat16 autocast where the device computes bfloat16 in hardware (--precision auto).
  std::printf("precision: %s\n", kiln::choose_precision(args, precision, dev).c_str());

  kiln::Trainer trainer(model, optimizer, loss_fn, args);
  trainer.set_compute_metrics([](const kiln::EvalPrediction& p) {
    const double accuracy = p.predictions.argmax(1).eq(p.label_ids).to(at::kDouble).mean().item<double>();
    return std::map<std::string, double>{{"accuracy", accuracy}};
  });
  std::printf("backend: %s\n", trainer.backend().c_str());

  const auto before = trainer.evaluate(eval_data);
  const kiln::TrainOutput out = trainer.train(train_data, eval_data);
  const auto after = trainer.evaluate(eval_data);

  const kiln::StepStats& stats = trainer.stats();
  std::printf("%lld steps in %.1f s: %d compiled, %d eager (warm-up and capture); fallback: %s\n",
              static_cast<long long>(out.global_step), out.metrics.at("train_runtime"), stats.compiled_steps,
              stats.eager_steps, stats.last_fallback.empty() ? "none" : stats.last_fallback.c_str());
  std::printf("held-out accuracy %.3f before, %.3f after (chance %.3f); evaluation loss %.3f before, %.3f after\n",
              before.at("eval_accuracy"), after.at("eval_accuracy"), 1.0 / kClasses, before.at("eval_loss"),
              after.at("eval_loss"));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln_image_classifier: %s\n", e.what());
  return 1;
}
