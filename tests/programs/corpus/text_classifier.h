// A sentence classifier over padded token batches: embedding (padding index 0), a 1-d convolution,
// mean pooling over the real tokens only (a mask built inside the step from the lengths),
// a linear head, cross entropy, gradient norm clipping between backward and the update, SGD with
// momentum. The step returns the loss and the number of correct predictions.
//
// clip_grad_norm_ reads the total norm back on the host (it returns a double) in the middle of the
// step; the step must still compile, and clip exactly as eager does.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::text_classifier {

constexpr int64_t kVocab = 50;
constexpr int64_t kDim = 16;
constexpr int64_t kClasses = 4;
constexpr int64_t kMaxLength = 12;

struct Options {
  int64_t batch = 8;
  int batches = 3;
};

struct SentenceClassifierImpl : torch::nn::Module {
  SentenceClassifierImpl()
      : embedding(torch::nn::EmbeddingOptions(kVocab, kDim).padding_idx(0)),
        conv(torch::nn::Conv1dOptions(kDim, kDim, 3).padding(1)),
        fc(kDim, kClasses) {
    register_module("embedding", embedding);
    register_module("conv", conv);
    register_module("fc", fc);
  }

  // tokens (B, T), lengths (B): positions at or past a sentence's length are padding.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& lengths) {
    auto mask = torch::arange(tokens.size(1), tokens.options()).unsqueeze(0) < lengths.unsqueeze(1);  // (B, T)
    auto h = torch::relu(conv(embedding(tokens).transpose(1, 2)));                                    // (B, D, T)
    // The convolution spreads into the padding; the average must not count it.
    auto pooled = (h * mask.unsqueeze(1).to(h.scalar_type())).sum(2) / lengths.unsqueeze(1).to(h.scalar_type());
    return fc(pooled);
  }

  torch::nn::Embedding embedding;
  torch::nn::Conv1d conv;
  torch::nn::Linear fc;
};
TORCH_MODULE(SentenceClassifier);

struct Batch {
  torch::Tensor tokens, lengths, labels;
};

inline Batch make_batch(int64_t batch) {
  auto lengths = torch::randint(3, kMaxLength + 1, {batch});
  auto tokens = torch::randint(1, kVocab, {batch, kMaxLength});
  tokens.masked_fill_(torch::arange(kMaxLength).unsqueeze(0) >= lengths.unsqueeze(1), 0);
  // A label the model can learn: which quarter of the vocabulary the first token is in.
  auto labels = torch::div(tokens.select(1, 0) * kClasses, kVocab, /*rounding_mode=*/"floor");
  return {tokens, lengths, labels};
}

// The model, its optimizer, the data and the training step. The step refers to this object: it is
// neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(), optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)) {
    for (int b = 0; b < options.batches; ++b) batches.push_back(make_batch(options.batch));
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Inputs {tokens, lengths, labels}; returns {loss, correct}.
  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& in) {
      const auto& tokens = in[0];
      const auto& lengths = in[1];
      const auto& labels = in[2];
      optimizer.zero_grad();
      auto logits = model->forward(tokens, lengths);
      auto loss = torch::nn::functional::cross_entropy(logits, labels);
      auto correct = (logits.argmax(1) == labels).sum();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 0.5);
      optimizer.step();
      return std::vector<torch::Tensor>{loss.detach(), correct};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto& b = batches[static_cast<size_t>(i) % batches.size()];
    return {b.tokens, b.lengths, b.labels};
  }

  SentenceClassifier model;
  torch::optim::SGD optimizer;
  std::vector<Batch> batches;
};

}  // namespace corpus::text_classifier
