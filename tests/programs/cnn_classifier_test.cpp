// The MNIST-style classifier of corpus/cnn_classifier.h (convolution, batch norm, max pooling,
// dropout, a linear head, log_softmax + nll_loss, Adam), trained eagerly and through kiln.
//
// Dropout draws a new mask every training step from LibTorch's generator; the compiled step has to
// draw the same masks, in the same order, as eager does from the same seed, and batch norm's
// running statistics have to advance as eager's do.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/cnn_classifier.h"
#include "program_harness.h"

namespace {

constexpr int kSteps = 8;

programs::Run train(uint64_t seed, const std::optional<std::string>& backend, bool nudge) {
  torch::manual_seed(seed);
  corpus::cnn_classifier::Program program;
  if (nudge) programs::nudge_parameters(*program.model);
  programs::Driver step(program.step(), program.state(), backend);

  programs::Run run;
  for (int i = 0; i < kSteps; ++i) run.record_step(step(program.batch(i)));
  run.add_module("model.", *program.model);
  run.add_optimizer("adam.", program.optimizer);
  step.finish(run);
  return run;
}

class CnnClassifier : public ::testing::TestWithParam<std::string> {};

TEST_P(CnnClassifier, TrainsLikeEager) {
  programs::expect_trains_like_eager(train, GetParam(), kSteps, /*captures=*/1, {"loss"});
}

INSTANTIATE_TEST_SUITE_P(Backends, CnnClassifier, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
