// The reference workloads as docs/workloads.md describes them: the names kiln bench takes, the block
// sizes, and gpt-medium (GPT-2 small's shape, tanh GELU) built on the CPU at its CPU size (batch 1,
// 128 tokens) and checked against a forward written out here from its parameters. Nothing here
// trains: gpt-medium's 163 million parameters are built and run forward on 8 tokens only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "kiln/workloads.h"

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-30);
}

// The forward of make_workload's gpt and gpt-medium, written out from the model's named parameters:
// embeddings, pre-norm blocks (attention with an explicit causal softmax, then the MLP with
// at::gelu's `gelu` form), final LayerNorm, bias-free head.
at::Tensor forward_by_hand(const kiln::Workload& w, const at::Tensor& idx, int64_t heads, const std::string& gelu) {
  at::NoGradGuard no_grad;
  const auto p = w.model->named_parameters();
  auto P = [&](const std::string& key) {
    const at::Tensor* t = p.find(key);
    if (t == nullptr) throw std::runtime_error("no parameter " + key);
    return *t;
  };
  const int64_t B = idx.size(0), T = idx.size(1), C = P("tok.weight").size(1), D = C / heads;
  auto x = at::embedding(P("tok.weight"), idx) + P("pos.weight").narrow(0, 0, T);
  const auto causal = at::ones({T, T}, at::kBool).triu(1);
  for (int64_t i = 0;; ++i) {
    const std::string b = "block" + std::to_string(i) + ".";
    if (p.find(b + "ln1.weight") == nullptr) break;
    auto h = at::layer_norm(x, {C}, P(b + "ln1.weight"), P(b + "ln1.bias"));
    auto qkv = at::linear(h, P(b + "attn.qkv.weight"), P(b + "attn.qkv.bias")).split(C, 2);
    auto heads_of = [&](const at::Tensor& t) { return t.view({B, T, heads, D}).transpose(1, 2); };
    auto att = at::matmul(heads_of(qkv[0]), heads_of(qkv[1]).transpose(-2, -1)) / std::sqrt(double(D));
    auto y = at::matmul(at::softmax(att.masked_fill(causal, -INFINITY), -1), heads_of(qkv[2]));
    x = x +
        at::linear(y.transpose(1, 2).contiguous().view({B, T, C}), P(b + "attn.proj.weight"), P(b + "attn.proj.bias"));
    h = at::layer_norm(x, {C}, P(b + "ln2.weight"), P(b + "ln2.bias"));
    h = at::gelu(at::linear(h, P(b + "fc.weight"), P(b + "fc.bias")), gelu);
    x = x + at::linear(h, P(b + "out.weight"), P(b + "out.bias"));
  }
  return at::linear(at::layer_norm(x, {C}, P("ln_f.weight"), P("ln_f.bias")), P("head.weight"));
}

// The workload's own forward on the first `length` tokens, against the forward by hand with each
// GELU form: {error with `want_gelu`, error with the other form}.
std::pair<double, double> forward_errors(kiln::Workload& w, int64_t length, int64_t heads,
                                         const std::string& want_gelu) {
  const at::Tensor idx = kiln::workload_batch(w, length)[0];
  at::Tensor got;
  {
    at::NoGradGuard no_grad;
    got = w.forward(idx);
  }
  const std::string other = want_gelu == "tanh" ? "none" : "tanh";
  return {rel_err(got, forward_by_hand(w, idx, heads, want_gelu)), rel_err(got, forward_by_hand(w, idx, heads, other))};
}

TEST(Workloads, NamesAndUnknownNames) {
  EXPECT_EQ(kiln::workload_names(), (std::vector<std::string>{"mlp", "cnn", "gpt", "gpt-medium"}));
  try {
    kiln::make_workload("gpt-large");
    FAIL() << "an unknown workload was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown workload 'gpt-large'; valid workloads: mlp, cnn, gpt, gpt-medium");
  }
}

TEST(Workloads, BlockSizes) {
  EXPECT_EQ(kiln::workload_block_size("gpt", "cpu"), 64);
  EXPECT_EQ(kiln::workload_block_size("gpt", "cuda"), 256);
  EXPECT_EQ(kiln::workload_block_size("gpt-medium", "cpu"), 128);
  EXPECT_EQ(kiln::workload_block_size("gpt-medium", "cuda"), 1024);
  EXPECT_EQ(kiln::workload_block_size("gpt-medium", "cuda:1"), 1024);
  EXPECT_EQ(kiln::workload_block_size("mlp", "cuda"), 0);
  EXPECT_EQ(kiln::workload_block_size("nope", "cpu"), 0);
}

// GPT-2 small's shape: 12 blocks of width 768, vocabulary 50304, at the CPU's context (128 tokens) and
// batch (1); float32 without autocast on the CPU; AdamW.
TEST(Workloads, GptMediumOnTheCpuIsGpt2SmallAtAShortContext) {
  const kiln::Workload w = kiln::make_workload("gpt-medium", {"cpu", 7});
  EXPECT_EQ(w.name, "gpt-medium");
  EXPECT_EQ(w.block_size, 128);
  EXPECT_EQ(w.input.sizes(), (std::vector<int64_t>{1, 128}));
  EXPECT_EQ(w.target.sizes(), (std::vector<int64_t>{1, 128}));
  EXPECT_EQ(w.input.scalar_type(), at::kLong);
  EXPECT_LT(w.input.max().item<int64_t>(), 50304);
  EXPECT_LT(w.target.max().item<int64_t>(), 50304);
  EXPECT_FALSE(w.autocast_bf16);
  const auto p = w.model->named_parameters();
  int64_t count = 0;
  for (const auto& kv : p) count += kv.value().numel();
  // Embeddings 50304 x 768 and 128 x 768, 12 blocks of 7,087,872 (qkv, proj, fc, out and two
  // LayerNorms, with biases), the final LayerNorm, the head 768 -> 50304 (not tied to the embedding).
  EXPECT_EQ(count, 50304 * 768 + 128 * 768 + 12 * 7087872 + 2 * 768 + 50304 * 768);
  EXPECT_EQ(p["tok.weight"].sizes(), (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(p["head.weight"].sizes(), (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(p["block11.attn.qkv.weight"].sizes(), (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(p["block11.fc.weight"].sizes(), (std::vector<int64_t>{3072, 768}));
  EXPECT_EQ(p.find("block12.ln1.weight"), nullptr);
  EXPECT_EQ(w.optimizer->param_groups().at(0).options().get_lr(), 1e-3);
  // --batch reaches it as for the other workloads.
  EXPECT_EQ(kiln::make_workload("gpt-medium", {"cpu", 7, 2}).input.sizes(), (std::vector<int64_t>{2, 128}));
}

// gpt-medium's MLP uses GELU's tanh form (GPT-2's), gpt's the erf form: each model's forward matches the
// forward by hand with its own form, and the other form is measurably further off (about 1e-4 of the
// logits through 12 blocks).
TEST(Workloads, GptMediumUsesTanhGeluAndGptErf) {
  kiln::Workload medium = kiln::make_workload("gpt-medium", {"cpu", 7});
  const auto [m_same, m_other] = forward_errors(medium, 8, 12, "tanh");
  EXPECT_LE(m_same, 1e-5);
  EXPECT_GE(m_other, std::max(2e-5, 5 * m_same)) << "the erf form is as close as the tanh one (" << m_same << ")";

  kiln::Workload gpt = kiln::make_workload("gpt", {"cpu", 7});
  const auto [g_same, g_other] = forward_errors(gpt, 8, 6, "none");
  EXPECT_LE(g_same, 1e-5);
  EXPECT_GE(g_other, 5 * g_same) << "the tanh form is as close as the erf one (" << g_same << ")";
}

}  // namespace
