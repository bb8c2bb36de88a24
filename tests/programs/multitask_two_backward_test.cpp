// The multi-task network of corpus/multitask_two_backward.h trained eagerly and through kiln: a
// shared trunk with a classification head and a regression head, two losses, two backward passes in
// one step and two optimizers (the head's SGD steps between the two backward passes).
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/multitask_two_backward.h"
#include "program_harness.h"

namespace {

constexpr int kSteps = 8;

programs::Run train(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus::multitask_two_backward::Program program;
  if (nudge) programs::nudge_parameters(*program.model);
  programs::Driver step(program.step(), program.state(), backend);

  programs::Run run;
  for (int i = 0; i < kSteps; ++i) run.record_step(step(program.batch(i)));
  run.add_module("model.", *program.model);
  run.add_optimizer("head_sgd.", program.head_optimizer);
  run.add_optimizer("shared_adam.", program.shared_optimizer);
  step.finish(run);
  return run;
}

class MultitaskTwoBackward : public ::testing::TestWithParam<std::string> {};

TEST_P(MultitaskTwoBackward, TrainsLikeEager) {
  programs::expect_trains_like_eager(train, GetParam(), kSteps, /*captures=*/1, {"class_loss", "value_loss"});
}

INSTANTIATE_TEST_SUITE_P(Backends, MultitaskTwoBackward, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
