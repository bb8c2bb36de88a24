// The character language model of corpus/transformer_lm.h (nanoGPT style: causal self-attention,
// GELU MLPs, dropout everywhere, AdamW with weight decay) trained eagerly and through kiln, with the
// attention written two ways users write it: by hand around torch::scaled_dot_product_attention
// (dropout_p > 0, is_causal), and with torch::nn::MultiheadAttention and an explicit causal mask.
// Attention dropout draws its masks inside ATen's attention code; the compiled step must draw the
// same ones.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/transformer_lm.h"
#include "program_harness.h"

namespace {

using corpus::transformer_lm::Attention;

constexpr int kSteps = 8;

programs::Run train(uint64_t seed, Attention kind, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus::transformer_lm::Options options;
  options.attention = kind;
  corpus::transformer_lm::Program program(options);
  if (nudge) programs::nudge_parameters(*program.model);
  programs::Driver step(program.step(), program.state(), backend);

  programs::Run run;
  for (int i = 0; i < kSteps; ++i) run.record_step(step(program.batch(i)));
  run.add_module("model.", *program.model);
  run.add_optimizer("adamw.", program.optimizer);
  step.finish(run);
  return run;
}

class TransformerLm : public ::testing::TestWithParam<std::string> {
 protected:
  void expect_like_eager(Attention kind) {
    const auto trained = [kind](uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
      return train(seed, kind, backend, nudge);
    };
    programs::expect_trains_like_eager(trained, GetParam(), kSteps, /*captures=*/1, {"loss"});
  }
};

TEST_P(TransformerLm, ScaledDotProductAttentionTrainsLikeEager) { expect_like_eager(Attention::ScaledDotProduct); }

TEST_P(TransformerLm, NnMultiheadAttentionTrainsLikeEager) { expect_like_eager(Attention::NnMultiheadAttention); }

INSTANTIATE_TEST_SUITE_P(Backends, TransformerLm, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
