// What users do to a model and its optimizer between training steps, while the compiled step keeps
// using both objects:
//  - save a checkpoint with torch::save, train on, then torch::load it back into the same model and
//    optimizer (a resume after a divergence, or a rewind): the parameters and Adam's moments and
//    step counts are replaced under the compiled step;
//  - change the learning rate of the optimizer's parameter group by hand;
//  - switch the model to eval() for a step (no dropout) and back to train().
// The small MLP with dropout and Adam of corpus/checkpoint_resume.h, on a fixed synthetic data set.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "corpus/checkpoint_resume.h"
#include "program_harness.h"

namespace {

// Everything a program has, and what it does between steps.
struct Program {
  corpus::checkpoint_resume::Program program;
  corpus::checkpoint_resume::Mlp& model;
  torch::optim::Adam& optimizer;
  programs::Driver step;
  programs::Run run;
  int steps_run = 0;

  // The model's initial weights and the data come from the seed.
  static corpus::checkpoint_resume::Options seeded(uint64_t seed) {
    torch::manual_seed(seed);
    return {};
  }

  Program(uint64_t seed, const std::optional<std::string>& backend)
      : program(seeded(seed)),
        model(program.model),
        optimizer(program.optimizer),
        step(program.step(), program.state(), backend) {}

  void train(int steps) {
    for (int i = 0; i < steps; ++i, ++steps_run) run.record_step(step(program.batch(steps_run)));
  }

  programs::Run finish() {
    run.add_module("model.", *model);
    run.add_optimizer("adam.", optimizer);
    step.finish(run);
    return std::move(run);
  }
};

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
}

class CheckpointResume : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // POSIX rather than std::filesystem: LibTorch's wheel exports its own copy of some
    // std::filesystem symbols, and a test binary built with a newer libstdc++ crashed calling them.
    std::string tmpl = ::testing::TempDir() + "kiln_programs_checkpoint_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << "cannot make a temporary directory from " << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : written_) std::remove(f.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string path(const std::string& name) {
    written_.push_back(dir_ + "/" + name);
    return written_.back();
  }

  // Runs `script` eagerly and through kiln from one seed; kiln must compile every step but the
  // first and one capture per signature (at least `min_captures`, at most `max_captures`), and
  // match eager.
  void expect_like_eager(int total_steps, int min_captures, int max_captures,
                         const std::function<void(Program&, const std::string& tag)>& script) {
    const uint64_t seed = programs::fresh_seed();
    SCOPED_TRACE(programs::seed_note(seed));
    Program eager(seed, std::nullopt);
    script(eager, "eager");
    const auto want = eager.finish();
    programs::KilnLog log;
    Program compiled(seed, GetParam());
    script(compiled, "kiln");
    const auto got = compiled.finish();
    programs::expect_no_fallback(got, total_steps, min_captures, max_captures, log);
    programs::expect_same_run(got, want, GetParam(), {"loss"});
  }

  std::string dir_;
  std::vector<std::string> written_;
};

TEST_P(CheckpointResume, LoadIntoTheSameModelAndOptimizerMidTraining) {
  // A load replaces the optimizer's state tensors and the parameters' storage; capturing the step
  // again after it is a legitimate way to follow, eager fallback is not.
  expect_like_eager(/*total_steps=*/4 + 3 + 5, /*min_captures=*/1, /*max_captures=*/2,
                    [&](Program& p, const std::string& tag) {
                      p.train(4);
                      torch::save(p.model, path(tag + "_model.pt"));
                      torch::save(p.optimizer, path(tag + "_optimizer.pt"));
                      p.train(3);
                      torch::load(p.model, path(tag + "_model.pt"));
                      torch::load(p.optimizer, path(tag + "_optimizer.pt"));
                      p.train(5);
                    });
}

TEST_P(CheckpointResume, LearningRateChangedBetweenSteps) {
  expect_like_eager(/*total_steps=*/4 + 3 + 3, 1, 1, [&](Program& p, const std::string&) {
    p.train(4);
    set_lr(p.optimizer, 1e-3);
    p.train(3);
    set_lr(p.optimizer, 5e-2);
    p.train(3);
  });
}

TEST_P(CheckpointResume, EvalStepsBetweenTrainingSteps) {
  // Each switch to eval() is one step without dropout; eval mode is a second signature, captured
  // once and compiled the second time.
  expect_like_eager(/*total_steps=*/4 + 1 + 3 + 1 + 2, 2, 2, [&](Program& p, const std::string&) {
    p.train(4);
    p.model->eval();
    p.train(1);
    p.model->train();
    p.train(3);
    p.model->eval();
    p.train(1);
    p.model->train();
    p.train(2);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointResume, ::testing::ValuesIn(programs::backends()),
                         programs::backend_test_name);

}  // namespace
