// The data-parallel tests' training: a model, its optimizer and the batches of every step, made the
// same way by the worker processes (ddp_worker.cpp, one per rank) and by the test's one-process
// reference (ddp_test.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

namespace kiln::test::ddp {

constexpr int64_t kIn = 256, kHidden = 1024, kClasses = 8;

struct Setup {
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

// Two linear layers of 1 MiB each and a small head: with ddp_bucket_cap_mb = 1 the gradients go
// in three buckets (c10d's first bucket is 1 MiB).
inline Setup make(uint64_t seed, bool adamw) {
  torch::manual_seed(seed);
  Setup s{torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::ReLU(), torch::nn::Linear(kHidden, kIn),
                                torch::nn::ReLU(), torch::nn::Linear(kIn, kClasses)),
          nullptr};
  if (adamw)
    s.opt =
        std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  else s.opt = std::make_unique<torch::optim::SGD>(s.net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return s;
}

inline at::Tensor loss(const at::Tensor& out, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

// Step `step`'s examples for every rank: rank r gets sizes[r] of them, fresh random numbers from a
// generator of its own (not the global one the model's initialisation uses).
inline std::vector<std::pair<at::Tensor, at::Tensor>> batches(uint64_t seed, int64_t step,
                                                              const std::vector<int64_t>& sizes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + static_cast<uint64_t>(step));
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int64_t b : sizes)
    out.emplace_back(at::randn({b, kIn}, gen, at::TensorOptions().dtype(at::kFloat)),
                     at::randint(kClasses, {b}, gen, at::TensorOptions().dtype(at::kLong)));
  return out;
}

// Trainer::train's examples: `n` of them, from a generator of their own.
inline std::pair<at::Tensor, at::Tensor> examples(uint64_t seed, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 31 + 5);
  return {at::randn({n, kIn}, gen, at::TensorOptions().dtype(at::kFloat)),
          at::randint(kClasses, {n}, gen, at::TensorOptions().dtype(at::kLong))};
}

// The settings of the train() runs: a linear schedule with warmup (a learning rate that changes
// every step), a metrics line every step.
template <class Args>
void train_settings(Args& a, int64_t batch, int64_t accumulation, int64_t steps, const std::string& output_dir) {
  a.per_device_train_batch_size = batch;
  a.gradient_accumulation_steps = accumulation;
  a.max_steps = steps;
  a.learning_rate = 0.05;
  a.lr_scheduler_type = "linear";
  a.warmup_steps = 2;
  a.logging_steps = 1;
  a.seed = 3;
  a.output_dir = output_dir;
  a.save_strategy = "no";
  a.report_to = {"jsonl"};
  a.disable_tqdm = true;
}

}  // namespace kiln::test::ddp
