// Programs whose batches change shape, as real text training feeds them, trained eagerly and
// through kiln with dynamic shapes at their default ([runtime] dynamic = "auto"):
//
// - the character language model of corpus/transformer_lm.h with per-batch padding, the way Hugging
//   Face's collators pad: every batch is windows of several lengths, padded on the right to the
//   batch's longest with token 0, the labels -100 at the padding (cross_entropy ignores them); each
//   batch has its own length;
// - the sentence classifier of corpus/text_classifier.h over two epochs of a dataset whose size is
//   not a multiple of the batch: the last batch of each epoch is short.
//
// Each must capture at most two shapes, run every other step compiled (a later shape planned from
// the symbolic step, without a capture) and reproduce eager's run.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/text_classifier.h"
#include "corpus/transformer_lm.h"
#include "program_harness.h"

namespace {

namespace lm = corpus::transformer_lm;

constexpr int kLmSteps = 12;

// Batch i: 4 windows of lengths drawn from [3, kContext], padded to the longest of them.
std::vector<torch::Tensor> padded_batch(const lm::Text& text) {
  auto lengths = torch::randint(3, lm::kContext + 1, {4});
  const int64_t longest = lengths.max().item<int64_t>();
  auto x = torch::zeros({4, longest}, torch::kLong);
  auto y = torch::full({4, longest}, -100, torch::kLong);
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t n = lengths[i].item<int64_t>();
    const int64_t s = torch::randint(0, text.data.size(0) - n - 1, {1}).item<int64_t>();
    x[i].slice(0, 0, n).copy_(text.data.slice(0, s, s + n));
    y[i].slice(0, 0, n).copy_(text.data.slice(0, s + 1, s + 1 + n));
  }
  return {x, y};
}

programs::Run train_lm(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  lm::Program program;
  if (nudge) programs::nudge_parameters(*program.model);
  std::vector<std::vector<torch::Tensor>> batches;
  for (int i = 0; i < kLmSteps; ++i) batches.push_back(padded_batch(program.text));
  // The step of the corpus program, whose cross_entropy skips the -100 labels of the padding.
  programs::Driver step(program.step(), program.state(), backend);
  programs::Run run;
  for (const auto& b : batches) run.record_step(step(b));
  run.add_module("model.", *program.model);
  run.add_optimizer("adamw.", program.optimizer);
  step.finish(run);
  return run;
}

constexpr int kClassifierSteps = 8;

programs::Run train_classifier(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus::text_classifier::Options options;
  options.batch = 8;
  options.batches = 3;
  corpus::text_classifier::Program program(options);
  program.batches.push_back(corpus::text_classifier::make_batch(5));  // 29 sentences: 8, 8, 8, 5
  if (nudge) programs::nudge_parameters(*program.model);
  programs::Driver step(program.step(), program.state(), backend);
  programs::Run run;
  for (int i = 0; i < kClassifierSteps; ++i) run.record_step(step(program.batch(i)));
  run.add_module("model.", *program.model);
  run.add_optimizer("sgd.", program.optimizer);
  step.finish(run);
  return run;
}

class VariableLength : public ::testing::TestWithParam<std::string> {};

TEST_P(VariableLength, LanguageModelWithPerBatchPaddingCompilesTwiceAndTrainsLikeEager) {
  auto [eager, kiln] = programs::expect_trains_like_eager(train_lm, GetParam(), kLmSteps, /*captures=*/2, {"loss"});
  ASSERT_TRUE(kiln.stats.has_value());
  EXPECT_GT(kiln.stats->shape_specialisations, 0) << "no length was planned from the symbolic step";
  EXPECT_EQ(kiln.stats->dynamic_dims, std::vector<std::string>{"input 0 dim 1"});
}

TEST_P(VariableLength, ClassifierWithAShortLastBatchCompilesTwiceAndTrainsLikeEager) {
  auto [eager, kiln] = programs::expect_trains_like_eager(train_classifier, GetParam(), kClassifierSteps,
                                                          /*captures=*/2, {"loss", "correct"});
  ASSERT_TRUE(kiln.stats.has_value());
  // One symbol for the batch of all three inputs (equal sizes share one, as PyTorch's duck sizing
  // does), named after the first of them the graph reads: the lengths.
  EXPECT_EQ(kiln.stats->dynamic_dims, std::vector<std::string>{"input 1 dim 0"});
}

INSTANTIATE_TEST_SUITE_P(Backends, VariableLength, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
