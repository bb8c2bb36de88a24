// The sentence classifier of corpus/text_classifier.h trained eagerly and through kiln.
//
// clip_grad_norm_ reads the total norm back on the host (it returns a double) in the middle of the
// step; the step must still compile, and clip exactly as eager does.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/text_classifier.h"
#include "program_harness.h"

namespace {

constexpr int kSteps = 8;

programs::Run train(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus::text_classifier::Program program;
  if (nudge) programs::nudge_parameters(*program.model);
  programs::Driver step(program.step(), program.state(), backend);

  programs::Run run;
  for (int i = 0; i < kSteps; ++i) run.record_step(step(program.batch(i)));
  run.add_module("model.", *program.model);
  run.add_optimizer("sgd.", program.optimizer);
  step.finish(run);
  return run;
}

class TextClassifier : public ::testing::TestWithParam<std::string> {};

TEST_P(TextClassifier, TrainsLikeEager) {
  programs::expect_trains_like_eager(train, GetParam(), kSteps, /*captures=*/1, {"loss", "correct"});
}

INSTANTIATE_TEST_SUITE_P(Backends, TextClassifier, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
