#include "kiln/workloads.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

namespace kiln {
namespace {

namespace nn = torch::nn;

struct CausalSelfAttentionImpl : nn::Module {
  CausalSelfAttentionImpl(int64_t width, int64_t heads) : heads(heads) {
    qkv = register_module("qkv", nn::Linear(width, 3 * width));
    proj = register_module("proj", nn::Linear(width, width));
  }
  at::Tensor forward(const at::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = qkv->forward(x).split(C, 2);
    auto shape = [&](const at::Tensor& t) { return t.view({B, T, heads, C / heads}).transpose(1, 2); };
    auto y = at::scaled_dot_product_attention(shape(parts[0]), shape(parts[1]), shape(parts[2]),
                                              /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    return proj->forward(y.transpose(1, 2).contiguous().view({B, T, C}));
  }
  int64_t heads;
  nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

// gelu_approximate is at::gelu's `approximate`: "none" (the erf form, gpt's) or "tanh" (GPT-2's
// gelu_new, gpt-medium's).
struct BlockImpl : nn::Module {
  BlockImpl(int64_t width, int64_t heads, std::string gelu_approximate = "none")
      : gelu_approximate(std::move(gelu_approximate)) {
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({width})));
    attn = register_module("attn", CausalSelfAttention(width, heads));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({width})));
    fc = register_module("fc", nn::Linear(width, 4 * width));
    out = register_module("out", nn::Linear(4 * width, width));
  }
  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln1->forward(x));
    return x + out->forward(at::gelu(fc->forward(ln2->forward(x)), gelu_approximate));
  }
  std::string gelu_approximate;
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

struct CharGptImpl : nn::Module {
  CharGptImpl(int64_t vocab, int64_t context, int64_t layers, int64_t heads, int64_t width,
              const std::string& gelu_approximate = "none") {
    tok = register_module("tok", nn::Embedding(vocab, width));
    pos = register_module("pos", nn::Embedding(context, width));
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), Block(width, heads, gelu_approximate)));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({width})));
    head = register_module("head", nn::Linear(nn::LinearOptions(width, vocab).bias(false)));
  }
  at::Tensor forward(const at::Tensor& idx) {
    const auto T = idx.size(1);
    auto positions = at::arange(T, idx.options().dtype(at::kLong));
    auto x = tok->forward(idx) + pos->forward(positions);
    for (auto& b : blocks) x = b->forward(x);
    return head->forward(ln_f->forward(x));
  }
  nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<Block> blocks;
  nn::LayerNorm ln_f{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(CharGpt);

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

}  // namespace

CharGptModel make_char_gpt(int64_t vocab, int64_t context, int64_t layers, int64_t heads, int64_t width,
                           const std::string& gelu_approximate) {
  if (vocab < 1 || context < 1 || layers < 1 || heads < 1 || width % heads != 0)
    throw std::invalid_argument("make_char_gpt: vocab, context, layers and heads must be positive and width (" +
                                std::to_string(width) + ") a multiple of heads (" + std::to_string(heads) + ")");
  if (gelu_approximate != "none" && gelu_approximate != "tanh")
    throw std::invalid_argument("make_char_gpt: gelu_approximate '" + gelu_approximate + "': use none or tanh");
  CharGpt net(vocab, context, layers, heads, width, gelu_approximate);
  return {net.ptr(), [net](const at::Tensor& idx) mutable { return net->forward(idx); }};
}

WorkloadStep workload_step(Workload& w, bool cpu_autocast) {
  return [&w, cpu_autocast](const std::vector<at::Tensor>& in) {
    w.optimizer->zero_grad();
    at::Tensor loss;
    if (w.autocast_bf16 || cpu_autocast) {
      const auto dev = cpu_autocast || !w.input.is_cuda() ? at::kCPU : at::kCUDA;
      at::autocast::set_autocast_enabled(dev, true);
      at::autocast::set_autocast_dtype(dev, at::kBFloat16);
      loss = w.loss_fn(w.forward(in.at(0)), in.at(1));
      at::autocast::set_autocast_enabled(dev, false);
      at::autocast::clear_cache();
    } else {
      loss = w.loss_fn(w.forward(in.at(0)), in.at(1));
    }
    loss.backward();
    w.optimizer->step();
    return std::vector<at::Tensor>{loss.detach()};
  };
}

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"mlp", "cnn", "gpt", "gpt-medium"};
  return names;
}

int64_t workload_block_size(const std::string& name, const std::string& device) {
  const bool cuda = device == "cuda" || device.rfind("cuda:", 0) == 0;
  if (name == "gpt") return cuda ? 256 : 64;
  // GPT-2's context on CUDA. On the CPU a step at GPT-2's context would take minutes: 128 tokens keep
  // every weight matrix at its full size (the step's cost is mostly theirs) for seconds a step.
  if (name == "gpt-medium") return cuda ? 1024 : 128;
  return 0;
}

std::vector<at::Tensor> workload_batch(const Workload& w, int64_t length) {
  if (w.block_size <= 0)
    throw std::invalid_argument("workload_batch: the " + w.name + " workload has no sequence length");
  if (length < 1 || length > w.block_size)
    throw std::invalid_argument("workload_batch: sequence length " + std::to_string(length) + " is outside [1, " +
                                std::to_string(w.block_size) + "] (the " + w.name + " workload's block size)");
  if (length == w.block_size) return {w.input, w.target};
  return {w.input.narrow(1, 0, length).contiguous(), w.target.narrow(1, 0, length).contiguous()};
}

std::vector<int64_t> dynamic_lengths(int64_t min, int64_t max, int steps, uint64_t seed) {
  if (min < 1 || max < min)
    throw std::invalid_argument("dynamic_lengths: need 1 <= min <= max, got " + std::to_string(min) + ":" +
                                std::to_string(max));
  const uint64_t span = static_cast<uint64_t>(max - min) + 1;
  uint64_t state = seed;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max(steps, 0)));
  for (int i = 0; i < steps; ++i) {
    // splitmix64 (Steele, Lea and Flood): bench/reference.py has the same lines.
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    out.push_back(min + static_cast<int64_t>(z % span));
  }
  return out;
}

Workload make_workload(const std::string& name, const WorkloadOptions& opts) {
  // "cuda" is the first GPU; "cuda:N" another (a data-parallel rank's).
  const bool cuda = opts.device == "cuda" || opts.device.rfind("cuda:", 0) == 0;
  if (!cuda && opts.device != "cpu")
    throw std::invalid_argument("unknown device '" + opts.device + "'; use cpu, cuda or cuda:N");
  at::DeviceIndex index = 0;
  if (opts.device.size() > 5) {
    const std::string n = opts.device.substr(5);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("unknown device '" + opts.device + "'; use cpu, cuda or cuda:N");
    index = static_cast<at::DeviceIndex>(std::stoi(n));
  }
  const at::Device device = cuda ? at::Device(at::kCUDA, index) : at::Device(at::kCPU);
  torch::manual_seed(opts.seed);
  Workload w;
  w.name = name;
  if (name == "mlp") {
    const int64_t B = opts.batch ? opts.batch : 256;
    nn::Sequential net(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
    net->to(device);
    w.model = net.ptr();
    w.forward = [net](const at::Tensor& x) mutable { return net->forward(x); };
    w.loss_fn = cross_entropy;
    w.optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    w.input = at::randn({B, 784}, at::TensorOptions(device));
    w.target = at::randint(0, 10, {B}, at::TensorOptions(device).dtype(at::kLong));
  } else if (name == "cnn") {
    const int64_t B = opts.batch ? opts.batch : 128;
    auto conv = [](int64_t in, int64_t out, int64_t stride) {
      return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
    };
    nn::Sequential net(conv(3, 32, 1), nn::BatchNorm2d(32), nn::ReLU(), conv(32, 64, 2), nn::BatchNorm2d(64),
                       nn::ReLU(), conv(64, 128, 2), nn::BatchNorm2d(128), nn::ReLU(), nn::AdaptiveAvgPool2d(1),
                       nn::Flatten(), nn::Linear(128, 10));
    net->to(device);
    w.model = net.ptr();
    w.forward = [net](const at::Tensor& x) mutable { return net->forward(x); };
    w.loss_fn = cross_entropy;
    w.optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    w.input = at::randn({B, 3, 32, 32}, at::TensorOptions(device));
    w.target = at::randint(0, 10, {B}, at::TensorOptions(device).dtype(at::kLong));
  } else if (name == "gpt" || name == "gpt-medium") {
    // gpt: a character GPT. gpt-medium: GPT-2 small's shape (12 layers, width 768, 12 heads, GPT-2's
    // vocabulary 50257 padded to 50304, a multiple of 64, tanh GELU), where the matrix multiplies
    // are most of the step. bench/reference.py builds both the same way.
    const bool medium = name == "gpt-medium";
    const int64_t B = opts.batch ? opts.batch : medium ? (cuda ? 8 : 1) : (cuda ? 64 : 8);
    const int64_t T = workload_block_size(name, opts.device);
    const int64_t V = medium ? 50304 : 65;
    CharGpt net = medium ? CharGpt(V, T, 12, 12, 768, "tanh") : CharGpt(V, T, 6, 6, 384);
    net->to(device);
    w.model = net.ptr();
    w.forward = [net](const at::Tensor& x) mutable { return net->forward(x); };
    w.loss_fn = [](const at::Tensor& logits, const at::Tensor& target) {
      return cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
    };
    w.optimizer = std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
    w.input = at::randint(0, V, {B, T}, at::TensorOptions(device).dtype(at::kLong));
    w.target = at::randint(0, V, {B, T}, at::TensorOptions(device).dtype(at::kLong));
    w.autocast_bf16 = cuda;
    w.block_size = T;
  } else {
    std::string valid;
    for (const auto& n : workload_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown workload '" + name + "'; valid workloads: " + valid);
  }
  if (opts.dtype == "f32") {
    w.autocast_bf16 = false;
  } else if (opts.dtype == "bf16") {
    w.autocast_bf16 = true;
  } else if (!opts.dtype.empty()) {
    throw std::invalid_argument("unknown dtype '" + opts.dtype + "'; use f32 or bf16");
  }
  if (opts.optimizer == "sgd") {
    w.optimizer =
        std::make_unique<torch::optim::SGD>(w.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  } else if (opts.optimizer == "adamw") {
    w.optimizer = std::make_unique<torch::optim::AdamW>(w.model->parameters(), torch::optim::AdamWOptions(1e-3));
  } else if (!opts.optimizer.empty()) {
    throw std::invalid_argument("unknown optimizer '" + opts.optimizer + "'; use sgd or adamw");
  }
  return w;
}

}  // namespace kiln
