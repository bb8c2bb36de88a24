// The DCGAN of corpus/dcgan.h trained eagerly and through kiln: two optimizers stepping at
// different points of one step, random numbers drawn inside the step, a backward pass that also
// fills the discriminator's gradients without stepping them, batch norm running three times a step
// in the discriminator.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/dcgan.h"
#include "program_harness.h"

namespace {

constexpr int kSteps = 8;

std::vector<int64_t> adam_steps(torch::optim::Adam& optimizer) {
  std::vector<int64_t> steps;
  for (const auto& p : optimizer.param_groups().at(0).params()) {
    auto it = optimizer.state().find(p.unsafeGetTensorImpl());
    steps.push_back(it == optimizer.state().end() ? -1
                                                  : static_cast<torch::optim::AdamParamState&>(*it->second).step());
  }
  return steps;
}

struct GanRun {
  programs::Run run;
  std::vector<int64_t> discriminator_steps, generator_steps;
};

// nudge: every parameter one ulp up before training (the noise-floor run).
GanRun train(uint64_t seed, const std::optional<std::string>& backend, bool nudge = false) {
  torch::manual_seed(seed);
  corpus::dcgan::Program program;
  if (nudge) {
    programs::nudge_parameters(*program.generator);
    programs::nudge_parameters(*program.discriminator);
  }
  programs::Driver step(program.step(), program.state(), backend);

  GanRun out;
  for (int i = 0; i < kSteps; ++i) out.run.record_step(step(program.batch(i)));
  out.run.add_module("generator.", *program.generator);
  out.run.add_module("discriminator.", *program.discriminator);
  out.run.add_optimizer("generator_optimizer.", program.generator_optimizer);
  out.run.add_optimizer("discriminator_optimizer.", program.discriminator_optimizer);
  step.finish(out.run);
  out.discriminator_steps = adam_steps(program.discriminator_optimizer);
  out.generator_steps = adam_steps(program.generator_optimizer);
  return out;
}

class Dcgan : public ::testing::TestWithParam<std::string> {};

TEST_P(Dcgan, TrainsLikeEager) {
  const uint64_t seed = programs::fresh_seed();
  SCOPED_TRACE(programs::seed_note(seed));
  const auto eager = train(seed, std::nullopt);
  programs::KilnLog log;
  const auto kiln = train(seed, GetParam());
  programs::expect_no_fallback(kiln.run, kSteps, /*captures=*/1, log);
  // Each Adam counts its own steps: one per training step, whether the step ran compiled or not.
  EXPECT_EQ(kiln.discriminator_steps, eager.discriminator_steps) << "discriminator Adam step counters";
  EXPECT_EQ(kiln.generator_steps, eager.generator_steps) << "generator Adam step counters";
  EXPECT_EQ(eager.generator_steps, std::vector<int64_t>(eager.generator_steps.size(), kSteps));
  // The adversarial game amplifies rounding: with generated kernels kiln is judged against how far
  // eager itself goes from parameters one ulp away (a discriminator moment 1.8e-2 off after 8 steps
  // was seen with a correct plugin).
  // From both sides, as the other programs' floors: one ulp up, then one ulp down (a ReLU or
  // leaky-ReLU mask that rounding flips in kiln's run may be flipped by one nudge and not the other).
  std::optional<GanRun> noise, noise_down;
  if (GetParam() != "eager") {
    noise = train(seed, std::nullopt, /*nudge=*/true);
    const programs::NudgeDown down;
    noise_down = train(seed, std::nullopt, /*nudge=*/true);
  }
  programs::expect_same_run(kiln.run, eager.run, GetParam(), {"d_loss", "g_loss"}, noise ? &noise->run : nullptr,
                            noise_down ? &noise_down->run : nullptr);
}

INSTANTIATE_TEST_SUITE_P(Backends, Dcgan, ::testing::ValuesIn(programs::backends()), programs::backend_test_name);

}  // namespace
