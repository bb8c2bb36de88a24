// The reference workloads (mlp, cnn, gpt, gpt-medium; docs/workloads.md), defined once so that kiln
// bench, the tests and the samples run exactly the same work, and bench/reference.py its PyTorch twin.
// A library of its own (kiln_workloads): models and data that no user program needs from libkiln.
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
  // The forward and loss run under bf16 autocast on the workload's device: gpt and gpt-medium on CUDA
  // by default, any workload with WorkloadOptions::dtype "bf16".
  bool autocast_bf16 = false;
  // gpt, gpt-medium: the block size, the longest sequence it takes (its position embedding's rows;
  // the length of `input`); 0 for workloads without a sequence.
  int64_t block_size = 0;
};

struct WorkloadOptions {
  std::string device = "cpu";  // "cpu", "cuda" (the first GPU) or "cuda:N"
  uint64_t seed = 0;
  // 0 = the workload's size for the device (docs/workloads.md); otherwise overrides the batch size.
  int64_t batch = 0;
  // "" = the workload's own optimizer; "sgd" (lr 0.01, momentum 0.9) or "adamw"
  // (lr 1e-3) swaps it, to tell a model's effect from an optimizer's.
  std::string optimizer = "";
  // "" = the workload's own precision (gpt and gpt-medium on CUDA under bf16 autocast, everything
  // else float32); "f32" = no autocast; "bf16" = bf16 autocast on the workload's device (CUDA or
  // CPU). The parameters and the optimizer stay float32 either way, as under LibTorch's autocast.
  std::string dtype = "";
};

// The workload's training step as LibTorch runs it, the one every benchmark and test uses:
// zero_grad; forward and loss (under bf16 autocast on the input's device when w.autocast_bf16, or
// on the CPU when cpu_autocast); backward; optimizer step. Takes {input, target}, returns {loss.detach()}
// (the shape of kiln::StepFn). `w` must outlive it.
using WorkloadStep = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;
WorkloadStep workload_step(Workload& w, bool cpu_autocast = false);

// The gpt workload's model at any size, for programs of their own (the character-GPT sample): token
// and position embeddings, `layers` pre-norm blocks (causal self-attention through
// scaled_dot_product_attention, a GELU MLP), a final LayerNorm and a bias-free head.
// forward(token ids [B, T <= context], int64) returns logits [B, T, vocab]. gelu_approximate is
// at::gelu's: "none" (the erf form, gpt's) or "tanh" (GPT-2's, gpt-medium's).
struct CharGptModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};
CharGptModel make_char_gpt(int64_t vocab, int64_t context, int64_t layers, int64_t heads, int64_t width,
                           const std::string& gelu_approximate = "none");

const std::vector<std::string>& workload_names();

// Throws std::invalid_argument naming the valid workloads for an unknown name.
Workload make_workload(const std::string& name, const WorkloadOptions& opts = {});

// The block size of a workload on a device ("cpu", "cuda", "cuda:N"): gpt's context (64 on the CPU,
// 256 on CUDA), gpt-medium's (128 on the CPU, 1024 on CUDA), 0 for workloads without a sequence
// (mlp, cnn) or an unknown name.
int64_t workload_block_size(const std::string& name, const std::string& device);

// gpt's (or gpt-medium's) batch at sequence length `length` (1 <= length <= w.block_size): the first
// `length` tokens of every row of its input and target, each contiguous (the whole batch at the block
// size). The model sizes its positions and its causal mask from the length it is given, so every
// length is the same model on a shorter context; bench/reference.py slices its batch the same way. Throws
// std::invalid_argument for a workload without a sequence or a length out of range.
std::vector<at::Tensor> workload_batch(const Workload& w, int64_t length);

// `steps` sequence lengths drawn uniformly from [min, max] (1 <= min <= max) from `seed`, with
// splitmix64 (each length min + z mod (max - min + 1) of the next 64-bit output z), so that
// bench/reference.py draws exactly the same sequence: `kiln bench gpt --dynamic MIN:MAX` (or gpt-medium).
std::vector<int64_t> dynamic_lengths(int64_t min, int64_t max, int steps, uint64_t seed);

}  // namespace kiln
