// What every program test shares: the seed, the backends, the kiln settings, a driver that runs the
// program's own step either as plain LibTorch or through kiln::compile_step, and the comparisons.
//
// A program is run twice from the same seed, eagerly and through kiln. kiln must then have compiled
// every step it could (no fallback), and reproduce what LibTorch computed: bit for bit with the
// "eager" backend (kiln's whole pipeline, ATen's own kernels), within a relative error of 1e-4 with
// "inductor" (generated C++ kernels, whose sums and math functions round differently).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "kiln/compile.h"
#include "kiln_log.h"

namespace programs {

// The backends every program runs under, as test parameters.
std::vector<std::string> backends();
std::string backend_test_name(const ::testing::TestParamInfo<std::string>& info);

// A fresh seed from std::random_device; KILN_PROGRAM_SEED=<n> replays a failing one.
uint64_t fresh_seed();
std::string seed_note(uint64_t seed);

// torch_compile on with the named backend.
kiln::TrainingArguments compile_args(const std::string& backend);

// What one run of a program leaves behind: each step's results and, at the end, every parameter,
// buffer and optimizer state tensor by name.
struct Run {
  std::vector<std::vector<at::Tensor>> steps;
  std::vector<std::pair<std::string, at::Tensor>> state;

  void record_step(const std::vector<at::Tensor>& results);
  void add_module(const std::string& prefix, const torch::nn::Module& module);
  // Adam, AdamW and SGD state (moments, momentum buffers, step counters), by parameter position.
  void add_optimizer(const std::string& prefix, torch::optim::Optimizer& optimizer);
  void add(const std::string& name, const at::Tensor& t);

  // kiln's counters at the end of a compiled run (unset for the eager run).
  std::optional<kiln::StepStats> stats;
  bool last_step_compiled = false;
  void record_kiln(const kiln::StepStats& s, bool last_compiled);
};

// Runs a program's step: as written (backend unset) or through kiln::compile_step.
class Driver {
 public:
  Driver(kiln::StepFn fn, kiln::StepState state, std::optional<std::string> backend);
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);
  // Only when run through kiln (its graphs, for inspection).
  const kiln::CompiledStep& step() const { return *step_; }
  // The run's results so far, and kiln's counters when compiled.
  void finish(Run& run) const;

 private:
  kiln::StepFn fn_;
  std::optional<kiln::CompiledStep> step_;
};

// kiln ran the step without falling back: the first step eagerly (optimizer state must exist), one
// capture step per input signature (counted as eager), every other step compiled, the last one
// included, no fallback reason and no kiln warning. `min_captures`..`max_captures` signatures.
void expect_no_fallback(const kiln::StepStats& stats, bool last_step_compiled, int total_steps, int min_captures,
                        int max_captures, const KilnLog& log);
// The same, for a Run made through kiln.
void expect_no_fallback(const Run& run, int total_steps, int min_captures, int max_captures, const KilnLog& log);
inline void expect_no_fallback(const Run& run, int total_steps, int captures, const KilnLog& log) {
  expect_no_fallback(run, total_steps, captures, captures, log);
}

// kiln's run against eager's: bit for bit (torch::equal) with the eager backend, else
// ||kiln - eager|| / ||eager|| <= 1e-4 for every step result and every final state tensor.
// `names`: the step's results, for the messages.
// Every parameter of `module` one ulp away: the start of a noise-floor run (expect_same_run). Up,
// except in the second noise-floor run of expect_trains_like_eager, where it is down.
void nudge_parameters(torch::nn::Module& module);
// nudge_parameters moves one ulp down, not up, for as long as this lives (on this thread).
struct NudgeDown {
  NudgeDown();
  ~NudgeDown();
  NudgeDown(const NudgeDown&) = delete;
  NudgeDown& operator=(const NudgeDown&) = delete;
};

// `noise`, for programs whose training amplifies rounding (a GAN's discriminator): an eager run of
// the same program from parameters one ulp away (`noise_down`, if given, another from one ulp the
// other way). With generated kernels a tensor then passes within ten times how far those runs
// strayed from eager (the farther), when that is more than 1e-4 (conformance judges whole training
// steps the same way).
void expect_same_run(const Run& kiln, const Run& eager, const std::string& backend,
                     const std::vector<std::string>& names, const Run* noise = nullptr,
                     const Run* noise_down = nullptr);

// A program trained from `seed`, as written (backend unset) or through kiln; `nudge` starts it from
// parameters one ulp away (the noise-floor runs, see expect_same_run).
using TrainFn = std::function<Run(uint64_t seed, const std::optional<std::string>& backend, bool nudge)>;

// The whole check of a program: trained eagerly and through kiln from one fresh seed, kiln must run
// without fallback (`captures` signatures) and reproduce eager's run (`names`: the step's results).
// with_noise_floor: with generated kernels, judge against eager's own noise floor, from parameters
// one ulp up and one ulp down (programs whose training amplifies rounding). Returns the eager run and kiln's, for
// checks of their own.
std::pair<Run, Run> expect_trains_like_eager(const TrainFn& train, const std::string& backend, int total_steps,
                                             int captures, const std::vector<std::string>& names,
                                             bool with_noise_floor = false);

// The relative error used with generated kernels.
constexpr double kTolerance = 1e-4;

}  // namespace programs
