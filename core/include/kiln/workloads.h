// The three reference workloads of shared/WORKLOADS.md (mlp, cnn, gpt), defined once so that
// kiln bench, the demo, the tests and bench/reference.py run exactly the same work.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace kiln {

struct Workload {
  std::string name;
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss_fn;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  at::Tensor input;
  at::Tensor target;
  bool autocast_bf16 = false;  // gpt on CUDA
};

struct WorkloadOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  uint64_t seed = 0;
  // 0 = the WORKLOADS.md size for the device; otherwise overrides the batch size.
  int64_t batch = 0;
  // "" = the workload's own optimizer (WORKLOADS.md); "sgd" (lr 0.01, momentum 0.9) or "adamw"
  // (lr 1e-3) swaps it, to tell a model's effect from an optimizer's.
  std::string optimizer;
};

// The workload's training step as LibTorch runs it, the one every benchmark and test uses:
// zero_grad; forward and loss (under bf16 autocast on CUDA when w.autocast_bf16, or on the CPU
// when cpu_autocast); backward; optimizer step. Takes {input, target}, returns {loss.detach()}
// (the shape of kiln::StepFn). `w` must outlive it.
using WorkloadStep = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;
WorkloadStep workload_step(Workload& w, bool cpu_autocast = false);

const std::vector<std::string>& workload_names();
// Throws std::invalid_argument naming the valid workloads for an unknown name.
Workload make_workload(const std::string& name, const WorkloadOptions& opts = {});

}  // namespace kiln
