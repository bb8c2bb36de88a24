// kiln::Trainer::train: the Hugging Face loop (epochs, max_steps, schedules with warmup, gradient
// accumulation, the metrics file) checked against a LibTorch loop written out here, with the
// schedules' formulas as transformers.optimization writes them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/utils.h>

#include <ATen/autocast_mode.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>

#include "kiln/compile.h"
#include "kiln/trainer.h"
#include "log_capture.h"

namespace nn = torch::nn;
namespace fs = std::filesystem;

namespace {

struct Setup {
  nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

Setup make(uint64_t seed, bool adamw) {
  torch::manual_seed(seed);
  Setup s{nn::Sequential(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 5)), nullptr};
  // train_args sets learning_rate: the optimizers' own rates (1.0) are not used.
  if (adamw) s.opt = std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1.0));
  else s.opt = std::make_unique<torch::optim::SGD>(s.net->parameters(), torch::optim::SGDOptions(1.0).momentum(0.9));
  return s;
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& y) { return nn::functional::cross_entropy(out, y); }

// transformers.optimization: get_linear_schedule_with_warmup's lr_lambda, times the peak.
double hf_linear(double peak, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  return peak *
         std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
}

// get_cosine_schedule_with_warmup (num_cycles 0.5).
double hf_cosine(double peak, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)));
}

double rel_err(double got, double want) { return std::abs(got - want) / std::max(std::abs(want), 1e-12); }

// The metrics file's lines, each one JSON object, as key -> number (null values left out).
std::vector<std::map<std::string, double>> read_metrics(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  EXPECT_TRUE(in.good()) << dir << "/metrics.jsonl";
  std::vector<std::map<std::string, double>> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);  // a line that is not JSON throws: the test fails
    EXPECT_TRUE(j.is_object()) << line;
    std::map<std::string, double> m;
    for (const auto& [k, v] : j.items())
      if (v.is_number()) m[k] = v.get<double>();
    out.push_back(std::move(m));
  }
  return out;
}

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_train_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

struct Data {
  at::Tensor x, y;
};

Data make_data(int64_t n) {
  torch::manual_seed(1234);
  return {at::randn({n, 12}), at::randint(0, 5, {n})};
}

// Hugging Face's loop in plain LibTorch: each epoch the examples in the order of a generator seeded
// with `seed`, micro-batches of `bs`, `ga` of them per optimizer step, the learning rate set before
// each step. Returns each step's loss (the micro-batches' mean).
std::vector<double> eager_loop(Setup& s, const Data& d, int64_t bs, int64_t ga, int64_t total, uint64_t seed,
                               const std::function<double(int64_t)>& lr_at, bool bf16 = false) {
  torch::manual_seed(seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t n = d.x.size(0);
  const int64_t batches = (n + bs - 1) / bs, steps_per_epoch = (batches + ga - 1) / ga;
  std::vector<double> losses;
  while (static_cast<int64_t>(losses.size()) < total) {
    const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    for (int64_t st = 0; st < steps_per_epoch && static_cast<int64_t>(losses.size()) < total; ++st) {
      const double lr = lr_at(static_cast<int64_t>(losses.size()));
      for (auto& g : s.opt->param_groups()) g.options().set_lr(lr);
      s.opt->zero_grad();
      const int64_t first = st * ga, last = std::min(first + ga, batches);
      double sum = 0;
      for (int64_t b = first; b < last; ++b) {
        const at::Tensor idx = perm.slice(0, b * bs, std::min((b + 1) * bs, n));
        at::Tensor loss;
        {
          // bf16: Hugging Face's autocast region, the forward and the loss.
          if (bf16) {
            at::autocast::set_autocast_enabled(at::kCPU, true);
            at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
          }
          loss = ce(s.net->forward(d.x.index_select(0, idx)), d.y.index_select(0, idx)) /
                 static_cast<double>(last - first);
          if (bf16) {
            at::autocast::set_autocast_enabled(at::kCPU, false);
            at::autocast::clear_cache();
          }
        }
        loss.backward();
        sum += loss.item<double>();
      }
      s.opt->step();
      losses.push_back(sum);
    }
  }
  return losses;
}

void expect_same_params(Setup& a, Setup& b, double rtol) {
  auto pa = a.net->parameters(), pb = b.net->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(at::allclose(pa[i], pb[i], rtol, 1e-6))
        << "parameter " << i << " differs by " << (pa[i] - pb[i]).abs().max().item<double>();
}

kiln::TrainingArguments train_args(const std::string& dir) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.output_dir = dir;
  a.per_device_train_batch_size = 8;
  a.learning_rate = 0.05;
  a.seed = 17;
  a.logging_steps = 1;
  return a;
}

}  // namespace

// Ten compiled optimizer steps with a linear schedule and three warmup steps, for SGD with momentum
// and for AdamW: every step's loss and learning rate in the metrics file against the eager loop and
// Hugging Face's formula, and the final parameters. The schedule changes the learning rate every
// step, yet the step is captured, compiled and planned once: train() has the step function set the
// next step's rate after the update, so the optimizer probe's look-ahead right after the capture
// already sees the rate move (SGD's -lr, AdamW's 1 - lr * weight_decay) and the first plan takes it
// as a run-time scalar. Without that, the first compiled step would plan the step again.
TEST(TrainerTrain, LinearWarmupFollowsHuggingFaceAndTheEagerLoop) {
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD");
    const auto d = make_data(32);  // 4 micro-batches of 8 an epoch
    auto ref = make(5, adamw), s = make(5, adamw);
    auto args = train_args(fresh_dir(adamw ? "linear_adamw" : "linear_sgd"));
    args.max_steps = 10;
    args.warmup_steps = 3;
    args.lr_scheduler_type = "linear";
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));

    auto lr_at = [&](int64_t step) { return hf_linear(0.05, step, 3, 10); };
    const auto want = eager_loop(ref, d, 8, 1, 10, 17, lr_at);
    EXPECT_EQ(out.global_step, 10);
    const auto lines = read_metrics(args.output_dir);
    ASSERT_EQ(lines.size(), 11u) << "a line a step (logging_steps 1), then the run's metrics";
    double sum = 0;
    for (int64_t i = 0; i < 10; ++i) {
      const auto& l = lines[static_cast<size_t>(i)];
      EXPECT_EQ(l.at("step"), static_cast<double>(i + 1));
      EXPECT_NEAR(l.at("epoch"), (i + 1) / 4.0, 1e-12);
      EXPECT_LT(rel_err(l.at("loss"), want[static_cast<size_t>(i)]), 1e-5)
          << "step " << i + 1 << ": " << l.at("loss") << " vs " << want[static_cast<size_t>(i)];
      // As Hugging Face logs it: the scheduler's rate after the step, i.e. the next step's.
      EXPECT_DOUBLE_EQ(l.at("learning_rate"), lr_at(i + 1)) << "step " << i + 1;
      EXPECT_GT(l.at("steps_per_second"), 0);
      // The interval's peak of CPU tensor memory allocated since train() began: at least the
      // gradients, which live from each backward to the next zero_grad.
      EXPECT_GT(l.at("peak_memory_mb"), 0) << "step " << i + 1;
      sum += want[static_cast<size_t>(i)];
    }
    EXPECT_EQ(lr_at(0), 0.0);
    EXPECT_DOUBLE_EQ(lr_at(3), 0.05);
    EXPECT_LT(rel_err(out.training_loss, sum / 10), 1e-5);
    const auto& last = lines.back();
    EXPECT_EQ(last.at("step"), 10.0);
    EXPECT_LT(rel_err(last.at("train_loss"), sum / 10), 1e-5);
    EXPECT_GT(last.at("train_runtime"), 0);
    EXPECT_GT(last.at("train_steps_per_second"), 0);
    EXPECT_GT(last.at("peak_memory_mb"), 0);
    EXPECT_EQ(out.metrics.at("peak_memory_mb"), last.at("peak_memory_mb"));
    EXPECT_EQ(out.metrics.at("epoch"), 2.5);
    expect_same_params(ref, s, 1e-5);
    // As after Hugging Face's last scheduler step: the rate after the last step.
    EXPECT_DOUBLE_EQ(s.opt->param_groups()[0].options().get_lr(), lr_at(10));

    const auto& st = trainer.stats();
    EXPECT_EQ(st.compiles, 1) << "the schedule must not recompile the step";
    EXPECT_EQ(st.recaptures, 0);
    EXPECT_EQ(st.compiled_steps, 8) << "the first step runs eagerly, the second is captured, the others compiled";
    EXPECT_EQ(st.rebuilds, 0) << "the rate was a run-time scalar of the first plan";
    std::printf("[ %s ] compiles %d, rebuilds %d, compiled steps %d\n", adamw ? "AdamW" : "SGD", st.compiles,
                st.rebuilds, st.compiled_steps);
    fs::remove_all(args.output_dir);
  }
}

// Without learning_rate, as Hugging Face's Trainer with an optimizer it is given: the schedule
// scales each parameter group's own rate (here two groups, 0.05 and 0.01), the metrics log the first
// group's, and a resumed run goes on from the checkpoint's peaks, though the optimizer it loads holds
// the rates of a step inside the warmup. With learning_rate set, it is every group's peak.
TEST(TrainerTrain, WithoutLearningRateTheScheduleScalesTheOptimizersOwnRates) {
  const auto d = make_data(32);  // 4 micro-batches of 8 an epoch
  auto two_groups = [](uint64_t seed) {
    torch::manual_seed(seed);
    ::Setup s{nn::Sequential(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 5)), nullptr};
    auto params = s.net->parameters();
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>(params.begin(), params.begin() + 2),
                        std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.9)));
    groups.emplace_back(std::vector<at::Tensor>(params.begin() + 2, params.end()),
                        std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.01).momentum(0.9)));
    s.opt = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(1.0));
    return s;
  };
  auto factor = [](int64_t step) { return step < 3 ? static_cast<double>(step) / 3 : 1.0; };  // constant_with_warmup
  auto args_for = [&](const std::string& dir) {
    auto a = train_args(dir);
    a.learning_rate.reset();
    a.max_steps = 6;
    a.warmup_steps = 3;
    a.lr_scheduler_type = "constant_with_warmup";
    a.save_steps = 2;
    return a;
  };

  // The eager loop with each group's rate scheduled on its own.
  auto ref = two_groups(8);
  std::vector<double> want;
  {
    torch::manual_seed(17);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
    while (want.size() < 6) {
      const at::Tensor perm = at::randperm(32, gen, at::TensorOptions().dtype(at::kLong));
      for (int64_t b = 0; b < 4 && want.size() < 6; ++b) {
        const double f = factor(static_cast<int64_t>(want.size()));
        ref.opt->param_groups()[0].options().set_lr(0.05 * f);
        ref.opt->param_groups()[1].options().set_lr(0.01 * f);
        ref.opt->zero_grad();
        const at::Tensor idx = perm.slice(0, b * 8, (b + 1) * 8);
        auto loss = ce(ref.net->forward(d.x.index_select(0, idx)), d.y.index_select(0, idx));
        loss.backward();
        ref.opt->step();
        want.push_back(loss.item<double>());
      }
    }
  }

  auto s = two_groups(8);
  auto args = args_for(fresh_dir("own_rates"));
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  trainer.train(kiln::TensorDataset({d.x}, d.y));
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 7u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-5) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(lines[i].at("learning_rate"), 0.05 * factor(static_cast<int64_t>(i) + 1)) << "step " << i + 1;
  }
  expect_same_params(ref, s, 1e-5);
  EXPECT_DOUBLE_EQ(s.opt->param_groups()[0].options().get_lr(), 0.05);
  EXPECT_DOUBLE_EQ(s.opt->param_groups()[1].options().get_lr(), 0.01);

  // Resumed at step 2, inside the warmup: the optimizer it loads holds 0.05 * 2/3 and 0.01 * 2/3.
  auto r = two_groups(99);
  auto resumed_args = args_for(args.output_dir);
  resumed_args.resume_from_checkpoint = args.output_dir + "/checkpoint-2";
  kiln::Trainer resumed(r.net, *r.opt, ce, resumed_args);
  resumed.train(kiln::TensorDataset({d.x}, d.y));
  expect_same_params(ref, r, 1e-5);
  EXPECT_DOUBLE_EQ(r.opt->param_groups()[0].options().get_lr(), 0.05);
  EXPECT_DOUBLE_EQ(r.opt->param_groups()[1].options().get_lr(), 0.01);
  fs::remove_all(args.output_dir);

  // learning_rate set: every group's peak, whatever the optimizer's own rates.
  auto e = two_groups(8);
  auto explicit_args = args_for(fresh_dir("explicit_rate"));
  explicit_args.learning_rate = 0.02;
  explicit_args.max_steps = 3;
  kiln::Trainer explicit_trainer(e.net, *e.opt, ce, explicit_args);
  explicit_trainer.train(kiln::TensorDataset({d.x}, d.y));
  EXPECT_DOUBLE_EQ(e.opt->param_groups()[0].options().get_lr(), 0.02);
  EXPECT_DOUBLE_EQ(e.opt->param_groups()[1].options().get_lr(), 0.02);
  fs::remove_all(explicit_args.output_dir);
}

// Without an optimizer the Trainer makes Hugging Face's: AdamW at learning_rate with adam_beta1,
// adam_beta2 and adam_epsilon, weight_decay on every parameter but the biases and the layer norm's
// weight (two groups), and trains as the eager loop with that optimizer does. optim = "sgd" makes
// SGD, at 5e-5 when learning_rate is unset. A Trainer given an optimizer keeps it, and says that the
// keys set for a made one change nothing.
TEST(TrainerTrain, WithoutAnOptimizerTheTrainerMakesHuggingFacesOne) {
  const auto d = make_data(32);
  auto model_for = [](uint64_t seed) {
    torch::manual_seed(seed);
    return nn::Sequential(nn::Linear(12, 16), nn::LayerNorm(nn::LayerNormOptions({16})), nn::ReLU(), nn::Linear(16, 5));
  };
  auto args = train_args(fresh_dir("made_optimizer"));
  args.learning_rate = 0.01;
  args.lr_scheduler_type = "constant";
  args.max_steps = 4;
  args.weight_decay = 0.1;
  args.adam_beta1 = 0.8;
  args.adam_beta2 = 0.99;
  args.adam_epsilon = 1e-6;

  ::Setup ref{model_for(3), nullptr};
  std::vector<at::Tensor> decay, plain;
  for (const auto& p : ref.net->named_parameters()) {
    const bool layer_norm = p.key().rfind("1.", 0) == 0;
    (p.key().find("bias") == std::string::npos && !layer_norm ? decay : plain).push_back(p.value());
  }
  ASSERT_EQ(decay.size(), 2u);  // the two Linear weights
  auto opts = torch::optim::AdamWOptions(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1);
  auto no_decay = opts;
  no_decay.weight_decay(0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(no_decay));
  ref.opt = std::make_unique<torch::optim::AdamW>(std::move(groups), opts);
  const auto want = eager_loop(ref, d, 8, 1, 4, 17, [](int64_t) { return 0.01; });

  ::Setup got{model_for(3), nullptr};
  kiln::Trainer trainer(got.net, ce, args);
  auto* made = dynamic_cast<torch::optim::AdamW*>(&trainer.optimizer());
  ASSERT_NE(made, nullptr) << "adamw_torch makes AdamW";
  ASSERT_EQ(made->param_groups().size(), 2u);
  const auto& g0 = static_cast<const torch::optim::AdamWOptions&>(made->param_groups()[0].options());
  const auto& g1 = static_cast<const torch::optim::AdamWOptions&>(made->param_groups()[1].options());
  EXPECT_EQ(made->param_groups()[0].params().size(), 2u);
  EXPECT_EQ(g0.weight_decay(), 0.1);
  EXPECT_EQ(g1.weight_decay(), 0.0);
  EXPECT_EQ(std::get<0>(g0.betas()), 0.8);
  EXPECT_EQ(std::get<1>(g0.betas()), 0.99);
  EXPECT_EQ(g0.eps(), 1e-6);
  trainer.train(kiln::TensorDataset({d.x}, d.y));
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-5) << "step " << i + 1;
  expect_same_params(ref, got, 1e-5);
  fs::remove_all(args.output_dir);

  auto sgd_args = train_args("");
  sgd_args.learning_rate.reset();
  sgd_args.optim = "sgd";
  ::Setup s{model_for(4), nullptr};
  kiln::Trainer sgd(s.net, ce, sgd_args);
  ASSERT_NE(dynamic_cast<torch::optim::SGD*>(&sgd.optimizer()), nullptr);
  EXPECT_EQ(sgd.optimizer().param_groups().size(), 1u) << "no weight decay: one group";
  EXPECT_EQ(sgd.optimizer().param_groups()[0].options().get_lr(), 5e-5);

  ::Setup own = make(5, false);
  LogCapture log;
  kiln::Trainer given(own.net, *own.opt, ce, args);
  EXPECT_EQ(&given.optimizer(), own.opt.get());
  bool said = false;
  for (const auto& w : log.warnings())
    said = said || (w.find("weight_decay, adam_beta1, adam_beta2, adam_epsilon are set") != std::string::npos &&
                    w.find("given an optimizer") != std::string::npos);
  EXPECT_TRUE(said) << "no warning that the optimizer keys change nothing";
}

// bf16 = true: the forward and the loss run under bfloat16 autocast inside the compiled step, as in
// Hugging Face's Trainer; the losses and parameters follow the eager loop under the same autocast,
// and differ from float32's (autocast did apply). fp16 is refused, naming bf16.
TEST(TrainerTrain, Bf16TrainsUnderAutocastAsTheEagerLoop) {
  const auto d = make_data(32);
  auto lr = [](int64_t) { return 0.05; };
  auto ref = make(6, true);
  const auto want = eager_loop(ref, d, 8, 1, 20, 17, lr, /*bf16=*/true);
  auto f32 = make(6, true);
  const auto plain = eager_loop(f32, d, 8, 1, 20, 17, lr);
  double apart = 0;
  for (size_t i = 0; i < want.size(); ++i) apart = std::max(apart, rel_err(want[i], plain[i]));
  ASSERT_GT(apart, 1e-4) << "the bf16 loop computes what float32 computes: autocast did not apply";

  auto s = make(6, true);
  auto args = train_args(fresh_dir("bf16"));
  args.bf16 = true;
  args.lr_scheduler_type = "constant";
  args.max_steps = 20;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  trainer.train(kiln::TensorDataset({d.x}, d.y));
  EXPECT_EQ(trainer.stats().compiled_steps, 18) << "warm-up and capture run eagerly, the other 18 compiled";
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 21u);
  for (size_t i = 0; i < 20; ++i) EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-2) << "step " << i + 1;
  expect_same_params(ref, s, 1e-2);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "the autocast region was left open";
  fs::remove_all(args.output_dir);

  auto both = train_args("");
  both.fp16 = both.bf16 = true;
  auto t = make(7, true);
  try {
    kiln::Trainer refused(t.net, *t.opt, ce, both);
    ADD_FAILURE() << "fp16 and bf16 together were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fp16 and bf16 are both true"), std::string::npos) << e.what();
  }
}

namespace {

// Hugging Face's fp16 loop in plain LibTorch with PyTorch's own GradScaler kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_, GradScaler's defaults): float16
// autocast, each micro-batch's loss divided by the step's count and scaled before its backward, the
// optimizer stepped only when no gradient held an inf or a NaN (a host read, as GradScaler.step
// makes), and the schedule stepped only after an update, as Hugging Face's Trainer steps it. Returns
// each step's loss; `skipped` gets each step's skip, `scale` the final scale.
std::vector<double> eager_fp16_loop(Setup& s, const at::Tensor& x, const at::Tensor& y, int64_t bs, int64_t ga,
                                    int64_t total, uint64_t seed, const std::function<double(int64_t)>& lr_at,
                                    std::vector<bool>* skipped, double* scale_out) {
  torch::manual_seed(seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t n = x.size(0), batches = (n + bs - 1) / bs, steps_per_epoch = (batches + ga - 1) / ga;
  at::Tensor scale = at::full({1}, 65536.0), tracker = at::zeros({1}, at::kInt);
  int64_t applied = 0;
  std::vector<double> losses;
  while (static_cast<int64_t>(losses.size()) < total) {
    const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    for (int64_t st = 0; st < steps_per_epoch && static_cast<int64_t>(losses.size()) < total; ++st) {
      for (auto& g : s.opt->param_groups()) g.options().set_lr(lr_at(applied));
      s.opt->zero_grad();
      const int64_t first = st * ga, last = std::min(first + ga, batches);
      double sum = 0;
      for (int64_t b = first; b < last; ++b) {
        const at::Tensor idx = perm.slice(0, b * bs, std::min((b + 1) * bs, n));
        at::autocast::set_autocast_enabled(at::kCPU, true);
        at::autocast::set_autocast_dtype(at::kCPU, at::kHalf);
        at::Tensor loss =
            ce(s.net->forward(x.index_select(0, idx)), y.index_select(0, idx)) / static_cast<double>(last - first);
        at::autocast::set_autocast_enabled(at::kCPU, false);
        at::autocast::clear_cache();
        (loss * scale).backward();
        sum += loss.item<double>();
      }
      std::vector<at::Tensor> grads;
      for (auto& p : s.net->parameters())
        if (p.grad().defined()) grads.push_back(p.mutable_grad());
      at::Tensor found = at::zeros({1});
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found, scale.to(at::kDouble).reciprocal().to(at::kFloat));
      const bool skip = found.item<float>() != 0;
      if (!skip) s.opt->step(), ++applied;
      at::_amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2000);
      skipped->push_back(skip);
      losses.push_back(sum);
    }
  }
  *scale_out = scale.item<double>();
  return losses;
}

}  // namespace

// fp16 = true: float16 autocast and dynamic loss scaling compiled into the step, for AdamW in one
// step and for SGD with momentum accumulating two micro-batches (the micro-step and the update).
// Inputs a hundred times larger than make_data's overflow float16's backward at the first scales
// (65536 and down), so the first steps are skipped and the scale halves until the gradients fit, as
// GradScaler does; then the updates run. Against the loop above, built on PyTorch's own GradScaler
// kernels: the same steps skipped, every loss, the learning rates logged (a linear schedule that
// counts only the updates that ran), the final scale and skip count in the checkpoint, the
// optimizer's step counts and the parameters; and the steps, skipped ones included, ran compiled.
TEST(TrainerTrain, Fp16ScalesTheLossAndSkipsTheStepsThatOverflowAsGradScalerDoes) {
  const auto d = make_data(32);
  const at::Tensor x = d.x * 100;
  for (const int64_t ga : {1, 2}) {
    const bool adamw = ga == 1;
    // SGD with momentum on these inputs diverges at AdamW's rate.
    const double peak = adamw ? 0.05 : 0.002;
    auto lr_at = [peak](int64_t applied) { return hf_linear(peak, applied, 0, 20); };
    SCOPED_TRACE(adamw ? "AdamW, one micro-batch a step" : "SGD, two micro-batches a step");
    auto ref = make(8, adamw);
    std::vector<bool> skipped;
    double want_scale = 0;
    const auto want = eager_fp16_loop(ref, x, d.y, 8, ga, 20, 17, lr_at, &skipped, &want_scale);
    const auto n_skipped = std::count(skipped.begin(), skipped.end(), true);
    double worst = 0;
    ASSERT_GE(n_skipped, 2) << "the test's inputs no longer overflow float16 at the first scales";
    ASSERT_LE(n_skipped, 16) << "too few updates ran to compare them";
    ASSERT_FALSE(skipped.back()) << "the run should end with updates that ran";

    auto s = make(8, adamw);
    auto args = train_args(fresh_dir(adamw ? "fp16_adamw" : "fp16_sgd_accumulate"));
    args.fp16 = true;
    args.learning_rate = peak;
    args.max_steps = 20;
    args.gradient_accumulation_steps = ga;
    args.lr_scheduler_type = "linear";
    args.save_strategy = "steps";
    args.save_steps = 20;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(kiln::TensorDataset({x}, d.y));
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "the autocast region was left open";
    const auto& st = trainer.stats();
    EXPECT_EQ(st.compiles, ga == 1 ? 1 : 2) << "the step, or the micro-step and the update, once each";
    EXPECT_EQ(st.recaptures, 0) << st.last_recompile_reason;
    // Each compiled step's first call runs eagerly (warm-up) and its second captures.
    EXPECT_EQ(st.compiled_steps, ga == 1 ? 18 : 20 * 2 - 2 + 20 - 2) << st.last_fallback;
    const auto lines = read_metrics(args.output_dir);
    ASSERT_EQ(lines.size(), 21u);
    int64_t applied = 0;
    for (size_t i = 0; i < 20; ++i) {
      EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-3) << "step " << i + 1;
      if (!skipped[i]) ++applied;
      EXPECT_DOUBLE_EQ(lines[i].at("learning_rate"), lr_at(applied)) << "step " << i + 1;
    }
    // By norm: float16 rounds the generated kernels' products and ATen's apart, and AdamW's steps
    // of nearly the same size whatever the gradient carry it into parameters near zero.
    auto pa = ref.net->parameters(), pb = s.net->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      const double rel = (pa[i] - pb[i]).norm().item<double>() / pa[i].norm().item<double>();
      EXPECT_LT(rel, 1e-3) << "parameter " << i;
      worst = std::max(worst, rel);
    }
    // AdamW's step counts count the updates that ran.
    if (adamw) {
      for (const auto& kv : s.opt->state())
        EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*kv.second).step(), applied);
    }
    torch::serialize::InputArchive ar;
    ar.load_from(args.output_dir + "/checkpoint-20/scheduler.pt");
    c10::IValue v;
    ASSERT_TRUE(ar.try_read("loss_scale", v));
    EXPECT_EQ(v.toDouble(), want_scale);
    ASSERT_TRUE(ar.try_read("skipped_steps", v));
    EXPECT_EQ(v.toInt(), n_skipped);
    std::printf("[ fp16 ga %ld ] %ld of 20 steps skipped, final scale %g, %d compiled, parameters %.2e apart\n",
                static_cast<long>(ga), static_cast<long>(n_skipped), want_scale, st.compiled_steps, worst);
    fs::remove_all(args.output_dir);
  }
  // Trainer::step in a loop of one's own, every step overflowing float16 (activations past 65504):
  // optimizer() reads the last step's flag first, so no step count counts a skipped update.
  auto s = make(8, true);
  auto args = train_args("");
  args.fp16 = true;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  for (int i = 0; i < 4; ++i) trainer.step(x.slice(0, 0, 8) * 1000, d.y.slice(0, 0, 8));
  ASSERT_FALSE(trainer.optimizer().state().empty());
  for (const auto& kv : trainer.optimizer().state())
    EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*kv.second).step(), 0);
}

// predict() runs the model as evaluate() does and also returns its outputs and the targets, its
// metrics named "test_..." (Hugging Face's predict, and its metric_key_prefix); save_model() writes
// model.pt into output_dir, which a module of the same layout loads to the same parameters.
TEST(TrainerTrain, PredictReturnsOutputsAndSaveModelWritesTheModel) {
  const auto d = make_data(20);  // eval batches of 8, 8 and 4
  auto s = make(9, false);
  auto args = train_args(fresh_dir("predict"));
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  auto accuracy = [](const at::Tensor& out, const at::Tensor& y) {
    return out.argmax(1).eq(y).to(at::kDouble).mean().item<double>();
  };
  trainer.set_compute_metrics([&](const kiln::EvalPrediction& p) {
    return std::map<std::string, double>{{"accuracy", accuracy(p.predictions, p.label_ids)}};
  });
  const auto out = trainer.predict(kiln::TensorDataset({d.x}, d.y));
  at::Tensor want;
  {
    torch::NoGradGuard no_grad;
    want = s.net->forward(d.x);
  }
  ASSERT_EQ(out.predictions.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(out.predictions, want, 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(out.label_ids, d.y));
  EXPECT_NEAR(out.metrics.at("test_loss"), ce(want, d.y).item<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(out.metrics.at("test_accuracy"), accuracy(want, d.y));
  EXPECT_EQ(out.metrics.count("test_runtime"), 1u);
  EXPECT_EQ(out.metrics.count("eval_loss"), 0u);
  EXPECT_EQ(trainer.predict(kiln::TensorDataset({d.x}, d.y), "holdout").metrics.count("holdout_loss"), 1u);

  const std::string file = trainer.save_model();
  EXPECT_EQ(file, args.output_dir + "/model.pt");
  auto other = make(10, false);
  torch::serialize::InputArchive ar;
  ar.load_from(file);
  other.net->load(ar);
  expect_same_params(s, other, 0);
  kiln::Trainer nowhere(s.net, *s.opt, ce, train_args(""));
  EXPECT_THROW(nowhere.save_model(), std::invalid_argument);
  fs::remove_all(args.output_dir);
}

// With max_grad_norm, every metrics line carries grad_norm (Hugging Face's): the norm of the
// interval's last step before clipping, as clip_grad_norm_ returns it in the eager loop, while the
// compiled step clips without reading the norm on the host. Without clipping there is none.
TEST(TrainerTrain, GradNormIsTheLastStepsNormBeforeClipping) {
  const auto d = make_data(32);
  auto ref = make(11, false);
  std::vector<double> norms;
  {
    torch::manual_seed(17);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
    const at::Tensor perm = at::randperm(32, gen, at::TensorOptions().dtype(at::kLong));
    for (auto& g : ref.opt->param_groups()) g.options().set_lr(0.05);
    for (int64_t b = 0; b < 4; ++b) {
      ref.opt->zero_grad();
      const at::Tensor idx = perm.slice(0, b * 8, (b + 1) * 8);
      ce(ref.net->forward(d.x.index_select(0, idx)), d.y.index_select(0, idx)).backward();
      norms.push_back(torch::nn::utils::clip_grad_norm_(ref.net->parameters(), 0.5));
      ref.opt->step();
    }
  }
  auto s = make(11, false);
  auto args = train_args(fresh_dir("grad_norm"));
  args.max_grad_norm = 0.5;
  args.max_steps = 4;
  args.lr_scheduler_type = "constant";
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  trainer.train(kiln::TensorDataset({d.x}, d.y));
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(lines[i].count("grad_norm"), 1u) << "step " << i + 1;
    EXPECT_LT(rel_err(lines[i].at("grad_norm"), norms[i]), 1e-5) << "step " << i + 1;
  }
  ASSERT_GT(*std::max_element(norms.begin(), norms.end()), 0.5) << "no step was clipped";
  expect_same_params(ref, s, 1e-5);
  EXPECT_EQ(trainer.stats().compiled_steps, 2);
  fs::remove_all(args.output_dir);

  auto u = make(11, false);
  auto plain = train_args(fresh_dir("no_grad_norm"));
  plain.max_steps = 2;
  kiln::Trainer unclipped(u.net, *u.opt, ce, plain);
  unclipped.train(kiln::TensorDataset({d.x}, d.y));
  for (const auto& line : read_metrics(plain.output_dir)) EXPECT_EQ(line.count("grad_norm"), 0u);
  fs::remove_all(plain.output_dir);
}

TEST(TrainerTrain, CosineWithWarmupRatio) {
  const auto d = make_data(24);  // 3 micro-batches of 8 an epoch
  auto ref = make(6, false), s = make(6, false);
  auto args = train_args(fresh_dir("cosine"));
  args.num_train_epochs = 3;  // 9 steps
  args.warmup_ratio = 0.2;    // ceil(1.8) = 2 warmup steps
  args.lr_scheduler_type = "cosine";
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));
  auto lr_at = [&](int64_t step) { return hf_cosine(0.05, step, 2, 9); };
  const auto want = eager_loop(ref, d, 8, 1, 9, 17, lr_at);
  EXPECT_EQ(out.global_step, 9);
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 10u);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-5) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(lines[i].at("learning_rate"), lr_at(static_cast<int64_t>(i) + 1)) << "step " << i + 1;
  }
  expect_same_params(ref, s, 1e-5);
  fs::remove_all(args.output_dir);
}

// max_steps wins over num_train_epochs (Hugging Face); without it the epochs decide, fractional
// ones too. Eager steps here: the counting is the point.
TEST(TrainerTrain, MaxStepsWinsOverEpochs) {
  const auto d = make_data(32);  // 4 steps an epoch
  struct Case {
    double epochs;
    int64_t max_steps;
    int64_t want_steps;
    double want_epoch;
  };
  for (const Case c : {Case{1, 6, 6, 1.5}, Case{5, 3, 3, 0.75}, Case{2, -1, 8, 2.0}, Case{0.5, -1, 2, 0.5}}) {
    SCOPED_TRACE("epochs " + std::to_string(c.epochs) + ", max_steps " + std::to_string(c.max_steps));
    auto s = make(7, false);
    auto args = train_args(fresh_dir("counts"));
    args.torch_compile = false;
    args.num_train_epochs = c.epochs;
    args.max_steps = c.max_steps;
    args.logging_steps = 2;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));
    EXPECT_EQ(out.global_step, c.want_steps);
    EXPECT_EQ(out.metrics.at("epoch"), c.want_epoch);
    EXPECT_EQ(trainer.stats().steps, c.want_steps);
    const auto lines = read_metrics(args.output_dir);
    ASSERT_EQ(lines.size(), static_cast<size_t>(c.want_steps / 2 + 1)) << "a line every 2 steps, then the run's";
    for (size_t i = 0; i + 1 < lines.size(); ++i) EXPECT_EQ(lines[i].at("step"), 2.0 * (i + 1));
    EXPECT_EQ(lines.back().at("step"), static_cast<double>(c.want_steps));
    fs::remove_all(args.output_dir);
  }
}

// Two micro-batches of 4 accumulated in one compiled step update the parameters as one batch of 8
// does (the same examples: the same seed shuffles both alike), and as the eager loop does.
TEST(TrainerTrain, GradientAccumulationEqualsOneBigBatch) {
  const auto d = make_data(32);
  auto big = make(8, true), acc = make(8, true), ref = make(8, true);
  auto a_args = train_args("");
  a_args.max_steps = 6;
  a_args.lr_scheduler_type = "constant";
  a_args.logging_steps = 100;
  auto b_args = a_args;
  a_args.per_device_train_batch_size = 4;
  a_args.gradient_accumulation_steps = 2;
  kiln::Trainer big_trainer(big.net, *big.opt, ce, b_args);
  kiln::Trainer acc_trainer(acc.net, *acc.opt, ce, a_args);
  const auto big_out = big_trainer.train(kiln::TensorDataset({d.x}, d.y));
  const auto acc_out = acc_trainer.train(kiln::TensorDataset({d.x}, d.y));
  EXPECT_EQ(acc_out.global_step, 6);
  EXPECT_LT(rel_err(acc_out.training_loss, big_out.training_loss), 1e-5);
  expect_same_params(big, acc, 1e-5);
  const auto want = eager_loop(ref, d, 4, 2, 6, 17, [](int64_t) { return 0.05; });
  double sum = 0;
  for (double l : want) sum += l;
  EXPECT_LT(rel_err(acc_out.training_loss, sum / 6), 1e-5);
  expect_same_params(ref, acc, 1e-5);
  // The micro-step and the update, each compiled once: 12 micro-steps (the first eager, the
  // second its capture, 10 compiled) and 6 updates (eager, capture, 4 compiled).
  const auto& st = acc_trainer.stats();
  EXPECT_EQ(st.compiles, 2) << "the micro-step and the update are compiled once each";
  EXPECT_EQ(st.compiled_steps, 14);
  EXPECT_EQ(st.recaptures, 0);
}

// Accumulation over 4, 8 and 3 micro-batches compiles the same two steps, once each, whatever the
// count: the compile does not grow with the count, and an epoch's short last group (2 of 4, 2 of
// 8, 1 of 3) runs them too, compiling nothing. Losses and parameters as in the eager loop.
TEST(TrainerTrain, AccumulationCompilesTheMicroStepAndTheUpdateOnceWhateverTheCount) {
  const auto d = make_data(40);  // 10 micro-batches of 4 an epoch
  for (int64_t ga : {4, 8, 3}) {
    SCOPED_TRACE("gradient_accumulation_steps " + std::to_string(ga));
    auto acc = make(8, true), ref = make(8, true);
    auto args = train_args("");
    args.per_device_train_batch_size = 4;
    args.gradient_accumulation_steps = ga;
    args.num_train_epochs = 2;
    args.lr_scheduler_type = "constant";
    args.logging_steps = 100;
    kiln::Trainer trainer(acc.net, *acc.opt, ce, args);
    const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));
    const int64_t per_epoch = (10 + ga - 1) / ga;
    ASSERT_EQ(out.global_step, 2 * per_epoch);
    const auto want = eager_loop(ref, d, 4, ga, out.global_step, 17, [](int64_t) { return 0.05; });
    double sum = 0;
    for (double l : want) sum += l;
    EXPECT_LT(rel_err(out.training_loss, sum / static_cast<double>(out.global_step)), 1e-5);
    expect_same_params(ref, acc, 1e-5);
    const auto& st = trainer.stats();
    EXPECT_EQ(st.compiles, 2) << "the micro-step and the update, once each";
    EXPECT_EQ(st.recaptures, 0);
    EXPECT_EQ(st.failed_captures, 0);
    // Every call but the micro-step's first two and the update's first two ran compiled.
    EXPECT_EQ(st.compiled_steps, 20 + 2 * per_epoch - 4);
    EXPECT_TRUE(trainer.compiled());
  }
}

// A dataset of the user's own, whose examples are two tensors the forward adds, 20 of them: micro-
// batches of 8, 8 and 4, grouped two by two (an accumulating step of 16 examples, then a step of 4
// through step()), every step's loss and the parameters as in the eager loop.
TEST(TrainerTrain, OwnDatasetWithAShortLastBatchAndAShortLastGroup) {
  struct Pairs : kiln::Dataset {
    at::Tensor a, b, y;
    size_t size() const override { return static_cast<size_t>(y.size(0)); }
    kiln::Example get(size_t i) const override {
      const auto k = static_cast<int64_t>(i);
      return {{a[k], b[k]}, y[k]};
    }
  };
  struct AddImpl : nn::Module {
    nn::Sequential net{nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 5)};
    AddImpl() { register_module("net", net); }
    at::Tensor forward(const at::Tensor& a, const at::Tensor& b) { return net->forward(a + b); }
  };
  torch::manual_seed(99);
  Pairs data;
  data.a = at::randn({20, 12});
  data.b = at::randn({20, 12});
  data.y = at::randint(0, 5, {20});
  torch::manual_seed(9);
  auto model = std::make_shared<AddImpl>();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1.0).momentum(0.9));
  auto ref = make(9, false);  // the same network on a+b, started from the model's parameters
  {
    torch::NoGradGuard no_grad;
    auto pa = ref.net->parameters(), pb = model->net->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pa[i].copy_(pb[i]);
  }
  auto args = train_args(fresh_dir("own"));
  args.gradient_accumulation_steps = 2;  // 2 optimizer steps an epoch
  args.num_train_epochs = 3;
  args.warmup_steps = 2;
  kiln::Trainer trainer(model, opt, ce, args);
  const auto out = trainer.train(data);
  EXPECT_EQ(out.global_step, 6);
  auto lr_at = [&](int64_t step) { return hf_linear(0.05, step, 2, 6); };
  const auto want = eager_loop(ref, Data{data.a + data.b, data.y}, 8, 2, 6, 17, lr_at);
  const auto lines = read_metrics(args.output_dir);
  ASSERT_EQ(lines.size(), 7u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_LT(rel_err(lines[i].at("loss"), want[i]), 1e-5) << "step " << i + 1;
    EXPECT_NEAR(lines[i].at("epoch"), static_cast<double>(i + 1) / 2, 1e-12);
  }
  auto pa = ref.net->parameters(), pb = model->net->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::allclose(pa[i], pb[i], 1e-5, 1e-6)) << "parameter " << i;
  // Every group, the last of one micro-batch of 4 too, ran the micro-step and the update: the
  // micro-step compiled for batches of 8 and, once more, of 4 (9 calls: 3 eager, the warm-up and
  // the two captures), the update once (6 calls: warm-up, capture, 4 compiled).
  EXPECT_EQ(trainer.stats().compiles, 3);
  EXPECT_EQ(trainer.stats().compiled_steps, 10);
  EXPECT_EQ(trainer.stats().rebuilds, 0);
  fs::remove_all(args.output_dir);
}

namespace {

// transformers.optimization's other lr_lambdas (times the peak), written from its definitions.
double hf_rate(const std::string& type, const std::map<std::string, double>& kw, double peak, int64_t step,
               int64_t warmup, int64_t total) {
  auto get = [&](const char* k, double d) { return kw.count(k) ? kw.at(k) : d; };
  const double w = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  if (type == "cosine_with_restarts") {
    if (step < warmup) return peak * w;
    if (progress >= 1.0) return 0.0;
    const double cycles = get("num_cycles", 1.0);
    return peak * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(cycles * progress, 1.0))));
  }
  if (type == "polynomial") {  // get_polynomial_decay_schedule_with_warmup
    const double lr_end = get("lr_end", 1e-7), power = get("power", 1.0);
    if (step < warmup) return peak * w;
    if (step > total) return lr_end;
    const double pct_remaining = 1.0 - static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    return (peak - lr_end) * std::pow(pct_remaining, power) + lr_end;
  }
  if (type == "inverse_sqrt") {
    const double timescale = get("timescale", warmup ? static_cast<double>(warmup) : 10000.0);
    if (step < warmup) return peak * w;
    const double shift = timescale - static_cast<double>(warmup);
    return peak / std::sqrt((static_cast<double>(step) + shift) / timescale);
  }
  if (type == "cosine_with_min_lr") {
    const double min_rate = kw.count("min_lr") ? kw.at("min_lr") / peak : get("min_lr_rate", 0.0);
    if (step < warmup) return peak * w;
    const double f = 0.5 * (1.0 + std::cos(M_PI * get("num_cycles", 0.5) * 2.0 * progress));
    return peak * std::max(0.0, f * (1.0 - min_rate) + min_rate);
  }
  if (type == "warmup_stable_decay") {
    const double min_ratio = get("min_lr_ratio", 0.0);
    const auto decay = static_cast<int64_t>(get("num_decay_steps", 0));
    const auto stable =
        kw.count("num_stable_steps") ? static_cast<int64_t>(kw.at("num_stable_steps")) : total - warmup - decay;
    if (step < warmup) return peak * std::max(0.0, w * (1.0 - min_ratio) + min_ratio);
    if (step < warmup + stable) return peak;
    if (step < warmup + stable + decay) {
      const double p = static_cast<double>(step - warmup - stable) / static_cast<double>(decay);
      return peak * std::max(0.0, (1.0 - p) * (1.0 - min_ratio) + min_ratio);  // decay_type linear
    }
    return peak * min_ratio;
  }
  ADD_FAILURE() << "no formula for " << type;
  return 0;
}

}  // namespace

// Every lr_scheduler_type Hugging Face has beyond linear, cosine and the constants, with arguments
// from [lr_scheduler_kwargs] (TOML, as a user writes them): each step's logged rate is the
// formula's. The steps run eagerly: the schedule is the point.
TEST(TrainerTrain, HuggingFacesOtherSchedulesGiveTheirRates) {
  const auto d = make_data(40);  // 5 steps an epoch
  struct Case {
    std::string type, kwargs_toml;
    std::map<std::string, double> kw;
  };
  const std::vector<Case> cases = {
      {"cosine_with_restarts", "num_cycles = 2", {{"num_cycles", 2}}},
      {"polynomial", "lr_end = 0.001\npower = 2.0", {{"lr_end", 0.001}, {"power", 2.0}}},
      {"inverse_sqrt", "", {}},
      {"inverse_sqrt", "timescale = 7", {{"timescale", 7}}},
      {"cosine_with_min_lr", "min_lr_rate = 0.1", {{"min_lr_rate", 0.1}}},
      {"cosine_with_min_lr", "min_lr = 0.02", {{"min_lr", 0.02}}},
      {"warmup_stable_decay",
       "num_decay_steps = 4\nmin_lr_ratio = 0.2\ndecay_type = 'linear'",
       {{"num_decay_steps", 4}, {"min_lr_ratio", 0.2}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.type + " " + c.kwargs_toml);
    auto s = make(5, false);
    const std::string dir = fresh_dir("schedules");
    auto args = kiln::TrainingArguments::from_toml_string(
        "lr_scheduler_type = '" + c.type + "'\nwarmup_steps = 3\nnum_train_epochs = 3\n[lr_scheduler_kwargs]\n" +
            c.kwargs_toml + "\n",
        "schedules.toml");
    args.output_dir = dir;
    args.per_device_train_batch_size = 8;
    args.learning_rate = 0.05;
    args.logging_steps = 1;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));
    ASSERT_EQ(out.global_step, 15);
    const auto lines = read_metrics(dir);
    ASSERT_EQ(lines.size(), 16u);
    for (int64_t i = 0; i < 15; ++i)
      EXPECT_NEAR(lines[static_cast<size_t>(i)].at("learning_rate"), hf_rate(c.type, c.kw, 0.05, i + 1, 3, 15), 1e-12)
          << "step " << i + 1;
    fs::remove_all(dir);
  }
  // Arguments a schedule does not take, and one it needs, are named.
  try {
    (void)kiln::TrainingArguments::from_toml_string(
        "lr_scheduler_type = 'polynomial'\n[lr_scheduler_kwargs]\nnum_cycles = 2\n", "bad.toml");
    ADD_FAILURE() << "num_cycles accepted for polynomial";
  } catch (const kiln::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.toml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("takes only lr_end, power, not 'num_cycles'"), std::string::npos) << e.what();
  }
  // cosine_with_min_lr needs min_lr or min_lr_rate: said when the arguments are checked as a whole
  // (compile_step and the Trainer do), since the table may come later in a file.
  const auto no_min = kiln::TrainingArguments::from_toml_string("lr_scheduler_type = 'cosine_with_min_lr'\n", "x");
  EXPECT_THROW(no_min.validate(), kiln::ConfigError);
  // reduce_lr_on_plateau steps on evaluations: without an eval strategy it is refused, as its
  // arguments out of range are.
  const auto no_eval = kiln::TrainingArguments::from_toml_string("lr_scheduler_type = 'reduce_lr_on_plateau'\n", "p");
  try {
    no_eval.validate();
    ADD_FAILURE() << "reduce_lr_on_plateau accepted without an eval strategy";
  } catch (const kiln::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set eval_strategy"), std::string::npos) << e.what();
  }
  for (const std::string bad : {"factor = 1.5", "mode = 'up'", "patience = 2.5", "threshold_mode = 'pct'"}) {
    try {
      (void)kiln::TrainingArguments::from_toml_string(
          "lr_scheduler_type = 'reduce_lr_on_plateau'\neval_strategy = 'steps'\n[lr_scheduler_kwargs]\n" + bad + "\n",
          "p.toml")
          .validate();
      ADD_FAILURE() << bad << " accepted";
    } catch (const kiln::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("lr_scheduler_kwargs." + bad.substr(0, bad.find(' '))), std::string::npos)
          << e.what();
    }
  }
}

// reduce_lr_on_plateau as Hugging Face runs it: PyTorch's ReduceLROnPlateau stepped after every
// evaluation on eval_loss (metric_for_best_model unset), its arguments from lr_scheduler_kwargs,
// no warmup. The rates the run logged are those LibTorch's own ReduceLROnPlateauScheduler gives
// on the run's logged eval losses, and the compiled run's parameters are the eager loop's at those
// rates.
TEST(TrainerTrain, ReduceLrOnPlateauLowersTheRateOnTheEvaluationsAsPyTorchDoes) {
  const auto d = make_data(40), e = make_data(16);  // 5 steps an epoch
  auto s = make(3, true), ref = make(3, true);
  const std::string dir = fresh_dir("plateau");
  auto args = train_args(dir);
  args.num_train_epochs = 6;
  args.learning_rate = 0.4;  // large enough that the eval loss stops improving
  args.lr_scheduler_type = "reduce_lr_on_plateau";
  args.lr_scheduler_kwargs = {{"patience", "1"}, {"factor", "0.5"}, {"threshold", "0.01"}, {"cooldown", "1"}};
  args.warmup_steps = 2;  // not taken, as in Hugging Face
  args.eval_strategy = "steps";
  args.eval_steps = 2;
  args.logging_steps = 1;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({e.x}, e.y));
  ASSERT_EQ(out.global_step, 30);
  std::vector<double> logged_lr, eval_loss;
  for (const auto& l : read_metrics(dir)) {
    if (l.count("learning_rate")) logged_lr.push_back(l.at("learning_rate"));
    if (l.count("eval_loss")) eval_loss.push_back(l.at("eval_loss"));
  }
  ASSERT_EQ(logged_lr.size(), 30u);
  ASSERT_EQ(eval_loss.size(), 15u);
  // LibTorch's scheduler on an optimizer of its own, stepped on the same losses at the same steps.
  auto probe = at::zeros({1}, at::requires_grad());
  torch::optim::SGD plain({probe}, torch::optim::SGDOptions(0.4));
  torch::optim::ReduceLROnPlateauScheduler sched(plain, torch::optim::ReduceLROnPlateauScheduler::min, 0.5f, 1, 0.01,
                                                 torch::optim::ReduceLROnPlateauScheduler::rel, 1);
  std::vector<double> want_lr;  // the rate each step ran at
  size_t lowered = 0;
  for (int64_t step = 1; step <= 30; ++step) {
    want_lr.push_back(plain.param_groups()[0].options().get_lr());
    // Logged after the step, before its evaluation: the rate the step ran at.
    EXPECT_NEAR(logged_lr[static_cast<size_t>(step - 1)], want_lr.back(), 1e-12) << "step " << step;
    if (step % 2 == 0) {
      const double before = plain.param_groups()[0].options().get_lr();
      sched.step(static_cast<float>(eval_loss[static_cast<size_t>(step / 2 - 1)]));
      lowered += plain.param_groups()[0].options().get_lr() < before;
    }
  }
  EXPECT_GE(lowered, 2u) << "the run should have lowered its rate at least twice";
  EXPECT_LT(want_lr.back(), 0.4);
  // The same training eagerly, at those rates.
  eager_loop(ref, d, 8, 1, 30, 17, [&](int64_t step) { return want_lr[static_cast<size_t>(step)]; });
  expect_same_params(ref, s, 1e-5);
  EXPECT_GT(trainer.stats().compiled_steps, 20);
  fs::remove_all(dir);
}

// logging_steps, eval_steps and save_steps below 1 are ratios of the run; logging_first_step logs
// step 1 as well; run_name is in trainer_state.json and the first line of train().
TEST(TrainerTrain, FractionalStepsLoggingFirstStepAndRunName) {
  const auto d = make_data(40);  // 5 steps an epoch, 20 steps in 4 epochs
  auto s = make(3, false);
  auto args = train_args(fresh_dir("ratios"));
  args.torch_compile = false;
  args.num_train_epochs = 4;
  args.logging_steps = 0.25;  // every 5 steps
  args.logging_first_step = true;
  args.eval_strategy = "steps";
  args.eval_steps = 0.5;   // every 10
  args.save_steps = 0.34;  // ceil(6.8) = every 7 (and at the end)
  args.run_name = "ratio-run";
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y));
  ASSERT_EQ(out.global_step, 20);
  std::vector<double> loss_steps, eval_steps;
  for (const auto& l : read_metrics(args.output_dir)) {
    if (l.count("loss")) loss_steps.push_back(l.at("step"));
    if (l.count("eval_loss")) eval_steps.push_back(l.at("step"));
  }
  EXPECT_EQ(loss_steps, (std::vector<double>{1, 5, 10, 15, 20}));
  EXPECT_EQ(eval_steps, (std::vector<double>{10, 20}));
  std::vector<std::string> saved;
  for (const auto& e : fs::directory_iterator(args.output_dir))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) saved.push_back(e.path().filename().string());
  std::sort(saved.begin(), saved.end());
  EXPECT_EQ(saved, (std::vector<std::string>{"checkpoint-14", "checkpoint-20", "checkpoint-7"}));
  std::ifstream state(args.output_dir + "/checkpoint-20/trainer_state.json");
  const auto j = nlohmann::json::parse(state);
  EXPECT_EQ(j.at("run_name"), "ratio-run");
  EXPECT_EQ(j.at("save_steps"), 7);
  EXPECT_EQ(j.at("logging_steps"), 5);
  EXPECT_EQ(j.at("eval_steps"), 10);
  EXPECT_THROW(
      [] {
        kiln::TrainingArguments a;
        a.logging_steps = 2.5;  // neither whole nor a ratio
        a.validate();
      }(),
      kiln::ConfigError);
  fs::remove_all(args.output_dir);
}

// dataloader_drop_last drops each epoch's short last micro-batch; data_seed orders the data as a
// run whose seed it is, and leaves the generators to seed.
TEST(TrainerTrain, DropLastAndDataSeed) {
  const auto d = make_data(44);  // 5 full micro-batches of 8 and one of 4
  auto run = [&](bool drop, std::optional<int64_t> data_seed, int64_t seed) {
    auto s = make(4, false);
    auto args = train_args(fresh_dir("drop_last"));
    args.torch_compile = false;
    args.num_train_epochs = 1;
    args.dataloader_drop_last = drop;
    args.data_seed = data_seed;
    args.seed = seed;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y));
    std::vector<double> losses;
    for (const auto& l : read_metrics(args.output_dir))
      if (l.count("loss")) losses.push_back(l.at("loss"));
    fs::remove_all(args.output_dir);
    return std::make_pair(out.global_step, losses);
  };
  EXPECT_EQ(run(false, std::nullopt, 17).first, 6);
  EXPECT_EQ(run(true, std::nullopt, 17).first, 5);
  // The same model (make(4, ...)) and the same order: data_seed 99 with seed 17 shuffles as seed 99.
  const auto by_data_seed = run(true, 99, 17), by_seed = run(true, std::nullopt, 99),
             plain = run(true, std::nullopt, 17);
  EXPECT_EQ(by_data_seed.second, by_seed.second);
  EXPECT_NE(by_data_seed.second, plain.second);
  kiln::TrainingArguments few;
  few.dataloader_drop_last = true;
  few.per_device_train_batch_size = 64;
  few.num_train_epochs = 1;
  auto s = make(4, false);
  kiln::Trainer trainer(s.net, *s.opt, ce, few);
  try {
    trainer.train(kiln::TensorDataset({d.x}, d.y));
    ADD_FAILURE() << "an epoch of no batches";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("44 examples are fewer than per_device_train_batch_size 64"),
              std::string::npos)
        << e.what();
  }
}

namespace {

// Records every event it is shown; at `stop_at` it stops the training, at `save_at` it asks for a
// checkpoint the strategies would not write.
struct Recorder : kiln::TrainerCallback {
  std::map<std::string, int> events;
  int64_t stop_at = -1, save_at = -1;
  std::vector<int64_t> saved_at, logged_at;
  void on_train_begin(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&) override {
    ++events["train_begin"];
  }
  void on_train_end(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&) override {
    ++events["train_end"];
  }
  void on_epoch_begin(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&) override {
    ++events["epoch_begin"];
  }
  void on_epoch_end(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&) override {
    ++events["epoch_end"];
  }
  void on_step_begin(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&) override {
    ++events["step_begin"];
  }
  void on_step_end(const kiln::TrainingArguments&, const kiln::TrainerState& s, kiln::TrainerControl& c) override {
    ++events["step_end"];
    if (s.global_step == save_at) c.should_save = true;
    if (s.global_step == stop_at) c.should_training_stop = true;
  }
  void on_log(const kiln::TrainingArguments&, const kiln::TrainerState& s, kiln::TrainerControl&,
              const std::map<std::string, double>& logs) override {
    ++events["log"];
    EXPECT_EQ(logs.at("step"), static_cast<double>(s.global_step));
    logged_at.push_back(s.global_step);
  }
  void on_evaluate(const kiln::TrainingArguments&, const kiln::TrainerState&, kiln::TrainerControl&,
                   const std::map<std::string, double>& metrics) override {
    ++events["evaluate"];
    EXPECT_TRUE(metrics.count("eval_loss"));
  }
  void on_save(const kiln::TrainingArguments&, const kiln::TrainerState& s, kiln::TrainerControl&) override {
    ++events["save"];
    saved_at.push_back(s.global_step);
  }
};

std::vector<at::Tensor> copies_of(nn::Sequential& net) {
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

// Hugging Face's callback events, in their number, and a callback's control: a checkpoint asked at
// step 3, the training stopped at step 7; state() says where train() stopped.
TEST(TrainerTrain, CallbacksSeeEveryEventAndControlTheLoop) {
  const auto d = make_data(40);  // 5 steps an epoch
  auto s = make(8, false);
  auto args = train_args(fresh_dir("callbacks"));
  args.torch_compile = false;
  args.num_train_epochs = 4;  // 20 steps, stopped at 7
  args.logging_steps = 2;
  args.eval_strategy = "epoch";
  args.save_steps = 500;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  auto rec = std::make_shared<Recorder>();
  rec->save_at = 3;
  rec->stop_at = 7;
  trainer.add_callback(rec);
  const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y));
  EXPECT_EQ(out.global_step, 7);
  EXPECT_EQ(rec->events["train_begin"], 1);
  EXPECT_EQ(rec->events["train_end"], 1);
  EXPECT_EQ(rec->events["step_begin"], 7);
  EXPECT_EQ(rec->events["step_end"], 7);
  EXPECT_EQ(rec->events["epoch_begin"], 2);
  EXPECT_EQ(rec->events["epoch_end"], 2);  // the stopped epoch ends too, as Hugging Face's does
  EXPECT_EQ(rec->events["evaluate"], 2);
  EXPECT_EQ(rec->saved_at, (std::vector<int64_t>{3}));
  // metrics lines at 2, 4, 6, the two evaluations (5, 7) and the run's last line (7)
  EXPECT_EQ(rec->logged_at, (std::vector<int64_t>{2, 4, 5, 6, 7, 7}));
  const kiln::TrainerState& st = trainer.state();
  EXPECT_EQ(st.global_step, 7);
  EXPECT_EQ(st.max_steps, 20);
  EXPECT_EQ(st.logging_steps, 2);
  EXPECT_DOUBLE_EQ(st.epoch, 1.4);
  EXPECT_EQ(st.log_history.size(), 6u);
  EXPECT_TRUE(fs::exists(args.output_dir + "/checkpoint-3/model.pt"));
  fs::remove_all(args.output_dir);
}

// EarlyStoppingCallback with metric_for_best_model, greater_is_better and load_best_model_at_end:
// a scripted score that improves twice and then does not, with patience 2, stops the training at
// the fourth evaluation; the best checkpoint survives save_total_limit and is the model at the end.
TEST(TrainerTrain, EarlyStoppingStopsAndTheBestModelIsLoadedAtTheEnd) {
  const auto d = make_data(40);
  auto s = make(9, false);
  auto args = train_args(fresh_dir("early_stopping"));
  args.torch_compile = false;
  args.num_train_epochs = 10;  // 50 steps unless stopped
  args.eval_strategy = "steps";
  args.eval_steps = 2;
  args.save_steps = 2;
  args.save_total_limit = 1;
  args.load_best_model_at_end = true;
  args.metric_for_best_model = "score";
  args.greater_is_better = true;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const std::vector<double> scores = {0.5, 0.7, 0.6, 0.65, 0.9, 0.95};
  size_t evaluation = 0;
  trainer.set_compute_metrics([&](const kiln::EvalPrediction&) {
    return std::map<std::string, double>{{"score", scores.at(evaluation++)}};
  });
  auto early = std::make_shared<kiln::EarlyStoppingCallback>(2);
  trainer.add_callback(early);
  std::vector<at::Tensor> at_step_4;
  struct Keep : kiln::TrainerCallback {
    nn::Sequential net;
    std::vector<at::Tensor>* out;
    void on_save(const kiln::TrainingArguments&, const kiln::TrainerState& s, kiln::TrainerControl&) override {
      if (s.global_step == 4) *out = copies_of(net);
    }
  };
  auto keep = std::make_shared<Keep>();
  keep->net = s.net;
  keep->out = &at_step_4;
  trainer.add_callback(keep);
  const auto out = trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y));
  EXPECT_EQ(out.global_step, 8) << "stopped at the fourth evaluation";
  EXPECT_EQ(evaluation, 4u);
  EXPECT_EQ(early->patience_counter(), 2);
  const kiln::TrainerState& st = trainer.state();
  ASSERT_TRUE(st.best_metric.has_value());
  EXPECT_DOUBLE_EQ(*st.best_metric, 0.7);
  EXPECT_EQ(fs::path(st.best_model_checkpoint).filename(), "checkpoint-4");
  EXPECT_TRUE(fs::exists(args.output_dir + "/checkpoint-4")) << "the best checkpoint outlives save_total_limit";
  EXPECT_TRUE(fs::exists(args.output_dir + "/checkpoint-8"));
  EXPECT_FALSE(fs::exists(args.output_dir + "/checkpoint-6"));
  ASSERT_EQ(at_step_4.size(), s.net->parameters().size());
  for (size_t i = 0; i < at_step_4.size(); ++i)
    EXPECT_TRUE(at::equal(s.net->parameters()[i], at_step_4[i])) << "parameter " << i << " is not the best model's";
  const auto j = nlohmann::json::parse(std::ifstream(args.output_dir + "/checkpoint-8/trainer_state.json"));
  EXPECT_DOUBLE_EQ(j.at("best_metric").get<double>(), 0.7);
  fs::remove_all(args.output_dir);
}

TEST(TrainerTrain, BestModelSettingsThatCannotWorkAreNamed) {
  const auto d = make_data(16);
  auto s = make(9, false);
  auto args = train_args(fresh_dir("best_model_errors"));
  args.torch_compile = false;
  args.load_best_model_at_end = true;
  args.eval_strategy = "epoch";
  args.save_strategy = "steps";
  {
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    try {
      trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y));
      ADD_FAILURE() << "strategies that differ accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("eval_strategy 'epoch' and save_strategy 'steps'"), std::string::npos)
          << e.what();
    }
  }
  args.save_strategy = "epoch";
  args.metric_for_best_model = "accuracy";
  {
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    try {
      trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y));
      ADD_FAILURE() << "a metric the evaluation does not have accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'accuracy' (eval_accuracy) is not among the evaluation's metrics"),
                std::string::npos)
          << e.what();
    }
  }
  args.load_best_model_at_end = false;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  trainer.add_callback(std::make_shared<kiln::EarlyStoppingCallback>(1));
  EXPECT_THROW(trainer.train(kiln::TensorDataset({d.x}, d.y), kiln::TensorDataset({d.x}, d.y)), std::invalid_argument);
  fs::remove_all(args.output_dir);
}
