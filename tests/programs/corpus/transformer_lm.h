// A tiny character language model in the style of nanoGPT: token and position embeddings, two
// pre-norm transformer blocks of causal self-attention and a GELU MLP, dropout on the embeddings,
// inside attention and on the residual branches, a final LayerNorm and a linear head, cross entropy
// over every position, AdamW with weight decay.
//
// The attention is written two ways users write it: by hand around
// torch::scaled_dot_product_attention (dropout_p > 0, is_causal), and with
// torch::nn::MultiheadAttention and an explicit causal mask. Attention dropout draws its masks
// inside ATen's attention code; the compiled step must draw the same ones.
//
// Shared by tests/programs and bench/programs. Everything is drawn from LibTorch's global
// generator, in this order: seed it first.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/compile.h"

namespace corpus::transformer_lm {

constexpr int64_t kContext = 16;
constexpr int64_t kEmbed = 32;
constexpr int64_t kHeads = 2;
constexpr int64_t kLayers = 2;
constexpr double kDropout = 0.1;

enum class Attention { ScaledDotProduct, NnMultiheadAttention };

struct Options {
  Attention attention = Attention::ScaledDotProduct;
  int64_t batch = 4;
  int batches = 3;
};

inline const std::string kText =
    "it was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of light, "
    "it was the season of darkness, it was the spring of hope, it was the winter of despair.";

struct CausalSelfAttentionImpl : torch::nn::Module {
  // The input projection has no bias: softmax ignores a shift shared by every key, so a key bias gets
  // only rounding noise as its gradient, and AdamW turns noise into full-size updates that no two
  // summation orders agree on.
  CausalSelfAttentionImpl()
      : qkv(torch::nn::LinearOptions(kEmbed, 3 * kEmbed).bias(false)),
        proj(kEmbed, kEmbed),
        resid_dropout(torch::nn::DropoutOptions(kDropout)) {
    register_module("qkv", qkv);
    register_module("proj", proj);
    register_module("resid_dropout", resid_dropout);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = qkv(x).split(kEmbed, /*dim=*/2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, kHeads, C / kHeads}).transpose(1, 2); };
    auto y = torch::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                                 /*attn_mask=*/{}, is_training() ? kDropout : 0.0,
                                                 /*is_causal=*/true);
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return resid_dropout(proj(y));
  }

  torch::nn::Linear qkv, proj;
  torch::nn::Dropout resid_dropout;
};
TORCH_MODULE(CausalSelfAttention);

// The same attention through torch::nn::MultiheadAttention, which takes (T, B, C) and a mask.
struct TorchSelfAttentionImpl : torch::nn::Module {
  // No bias, for the key bias's sake as above.
  TorchSelfAttentionImpl()
      : attention(torch::nn::MultiheadAttentionOptions(kEmbed, kHeads).dropout(kDropout).bias(false)),
        resid_dropout(torch::nn::DropoutOptions(kDropout)) {
    register_module("attention", attention);
    register_module("resid_dropout", resid_dropout);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto T = x.size(1);
    // -inf above the diagonal: a position sees itself and the positions before it.
    auto causal = torch::full({T, T}, -std::numeric_limits<float>::infinity(), x.options()).triu(1);
    auto xt = x.transpose(0, 1);
    auto y = std::get<0>(attention->forward(xt, xt, xt, /*key_padding_mask=*/{}, /*need_weights=*/false, causal));
    return resid_dropout(y.transpose(0, 1));
  }

  torch::nn::MultiheadAttention attention;
  torch::nn::Dropout resid_dropout;
};
TORCH_MODULE(TorchSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(Attention kind)
      : ln1(torch::nn::LayerNormOptions({kEmbed})),
        ln2(torch::nn::LayerNormOptions({kEmbed})),
        fc(kEmbed, 4 * kEmbed),
        fc_proj(4 * kEmbed, kEmbed),
        mlp_dropout(torch::nn::DropoutOptions(kDropout)) {
    register_module("ln1", ln1);
    if (kind == Attention::ScaledDotProduct) attn = register_module("attn", CausalSelfAttention());
    else attn = register_module("attn", TorchSelfAttention());
    register_module("ln2", ln2);
    register_module("fc", fc);
    register_module("fc_proj", fc_proj);
    register_module("mlp_dropout", mlp_dropout);
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor a;
    if (auto* sdpa = attn->as<CausalSelfAttentionImpl>()) a = sdpa->forward(ln1(x));
    else a = attn->as<TorchSelfAttentionImpl>()->forward(ln1(x));
    x = x + a;
    return x + mlp_dropout(fc_proj(torch::gelu(fc(ln2(x)))));
  }

  torch::nn::LayerNorm ln1, ln2;
  std::shared_ptr<torch::nn::Module> attn;
  torch::nn::Linear fc, fc_proj;
  torch::nn::Dropout mlp_dropout;
};
TORCH_MODULE(Block);

struct CharLanguageModelImpl : torch::nn::Module {
  CharLanguageModelImpl(int64_t vocab, Attention kind)
      : token_embedding(vocab, kEmbed),
        position_embedding(kContext, kEmbed),
        dropout(torch::nn::DropoutOptions(kDropout)),
        ln_f(torch::nn::LayerNormOptions({kEmbed})),
        head(kEmbed, vocab) {
    register_module("token_embedding", token_embedding);
    register_module("position_embedding", position_embedding);
    register_module("dropout", dropout);
    for (int64_t i = 0; i < kLayers; ++i) blocks->push_back(Block(kind));
    register_module("blocks", blocks);
    register_module("ln_f", ln_f);
    register_module("head", head);
  }

  torch::Tensor forward(const torch::Tensor& idx) {
    auto positions = torch::arange(idx.size(1), idx.options());
    auto x = dropout(token_embedding(idx) + position_embedding(positions));
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(ln_f(x));
  }

  torch::nn::Embedding token_embedding, position_embedding;
  torch::nn::Dropout dropout;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(CharLanguageModel);

// The character vocabulary of the text, and the text as ids.
struct Text {
  std::string chars;
  torch::Tensor data;
  Text() {
    for (char c : kText)
      if (chars.find(c) == std::string::npos) chars += c;
    std::vector<int64_t> ids;
    for (char c : kText) ids.push_back(static_cast<int64_t>(chars.find(c)));
    data = torch::tensor(ids, torch::kLong);
  }
  int64_t vocab() const { return static_cast<int64_t>(chars.size()); }
};

// The text, the model, its optimizer, the batches and the training step. The step refers to this
// object: it is neither copied nor moved.
struct Program {
  explicit Program(const Options& options = {})
      : model(text.vocab(), options.attention),
        optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.1)) {
    // Random windows of the text; the target is the window shifted by one character.
    for (int b = 0; b < options.batches; ++b) {
      auto starts = torch::randint(0, text.data.size(0) - kContext - 1, {options.batch});
      std::vector<torch::Tensor> x, y;
      for (int64_t i = 0; i < options.batch; ++i) {
        const auto s = starts[i].item<int64_t>();
        x.push_back(text.data.slice(0, s, s + kContext));
        y.push_back(text.data.slice(0, s + 1, s + 1 + kContext));
      }
      inputs.push_back(torch::stack(x));
      targets.push_back(torch::stack(y));
    }
    model->train();
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  kiln::StepFn step() {
    return [this](const std::vector<torch::Tensor>& batch) {
      optimizer.zero_grad();
      auto logits = model->forward(batch[0]);
      auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), batch[1].view({-1}));
      loss.backward();
      optimizer.step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
  }
  kiln::StepState state() { return {{model.ptr()}, {&optimizer}}; }
  std::vector<torch::Tensor> batch(int i) const {
    const auto k = static_cast<size_t>(i) % inputs.size();
    return {inputs[k], targets[k]};
  }

  Text text;
  CharLanguageModel model;
  torch::optim::AdamW optimizer;
  std::vector<torch::Tensor> inputs, targets;
};

}  // namespace corpus::transformer_lm
