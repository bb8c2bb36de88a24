// The polynomial regression of corpus/regression_scheduler.h, trained eagerly and through
// kiln::Trainer, with SGD and a StepLR schedule that halves the learning rate every 3 steps.
//
// The scheduler changes the optimizer's learning rate between steps, outside the step: the
// compiled step has to use the rate of the moment, every step.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/regression_scheduler.h"
#include "kiln/trainer.h"
#include "program_harness.h"

namespace {

namespace corpus_program = corpus::regression_scheduler;

constexpr int kSteps = 12;

programs::Run train(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus_program::Program program;
  if (nudge) programs::nudge_parameters(*program.model);

  programs::Run run;
  auto record = [&](const torch::Tensor& loss, double lr) {
    run.record_step({loss, torch::scalar_tensor(lr, torch::kDouble)});
  };
  if (!backend) {
    auto step = program.step();
    for (int i = 0; i < kSteps; ++i) {
      const double lr = program.current_lr();
      auto loss = step(program.batch(i))[0];
      program.after_step();
      record(loss, lr);
    }
  } else {
    kiln::Trainer trainer(program.model, program.optimizer, corpus_program::mse, programs::compile_args(*backend));
    for (int i = 0; i < kSteps; ++i) {
      const double lr = program.current_lr();
      const auto batch = program.batch(i);
      auto loss = trainer.step(batch[0], batch[1]);
      program.after_step();
      record(loss, lr);
    }
    run.record_kiln(trainer.stats(), trainer.compiled_step().last_step_compiled());
  }
  run.add_module("model.", *program.model);
  run.add_optimizer("sgd.", program.optimizer);
  return run;
}

class RegressionScheduler : public ::testing::TestWithParam<std::string> {};

TEST_P(RegressionScheduler, TrainsLikeEager) {
  const auto [eager, kiln] =
      programs::expect_trains_like_eager(train, GetParam(), kSteps, /*captures=*/1, {"loss", "lr"});
  // The schedule did move the rate: 0.1 halved at steps 3, 6 and 9.
  EXPECT_DOUBLE_EQ(eager.steps.back()[1].item<double>(), 0.1 / 8);
}

INSTANTIATE_TEST_SUITE_P(Backends, RegressionScheduler, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
