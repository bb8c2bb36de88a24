// Trainer::train's checkpoints, resuming, evaluation, report_to and progress lines. The central
// check: a training that crashes after a checkpoint and is resumed by a fresh model, optimizer and
// Trainer ends bit for bit where the uninterrupted training ends — parameters, optimizer state,
// every logged loss and evaluation.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include "kiln/compile.h"
#include "kiln/trainer.h"

namespace nn = torch::nn;
namespace fs = std::filesystem;

namespace {

struct Learner {
  nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

// A network with dropout, so that the CPU generator's state matters, with parameters drawn from the
// global generator (a resumed one must take everything from the checkpoint).
Learner make(bool adamw, int64_t width = 16) {
  Learner s{nn::Sequential(nn::Linear(12, width), nn::ReLU(), nn::Dropout(0.25), nn::Linear(width, 5)), nullptr};
  if (adamw)
    s.opt =
        std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0.1));
  else s.opt = std::make_unique<torch::optim::SGD>(s.net->parameters(), torch::optim::SGDOptions(1.0).momentum(0.9));
  return s;
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& y) { return nn::functional::cross_entropy(out, y); }

std::map<std::string, double> accuracy(const kiln::EvalPrediction& p) {
  return {{"accuracy", p.predictions.argmax(1).eq(p.label_ids).to(at::kDouble).mean().item<double>()}};
}

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_ckpt_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

struct Data {
  at::Tensor x, y;
  kiln::TensorDataset dataset() const { return kiln::TensorDataset({x}, y); }
};

Data make_data(int64_t n) { return {at::randn({n, 12}), at::randint(0, 5, {n})}; }

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The metrics file's lines, each one JSON object, as key -> the value's text (equal text: equal
// bits, the file writes text that reads back exactly; "null" for a number that is not finite).
std::vector<std::map<std::string, std::string>> read_metrics(const std::string& dir) {
  std::vector<std::map<std::string, std::string>> out;
  for (const auto& line : read_lines(fs::path(dir) / "metrics.jsonl")) {
    const auto j = nlohmann::json::parse(line);  // a line that is not JSON throws: the test fails
    std::map<std::string, std::string> m;
    for (const auto& [k, v] : j.items()) m[k] = v.dump();
    out.push_back(std::move(m));
  }
  return out;
}

// The fields of the metrics lines that training computes (not the clock's), line by line.
std::vector<std::string> computed_fields(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& m : read_metrics(dir)) {
    std::string line;
    for (const char* k : {"step", "epoch", "loss", "learning_rate", "eval_loss", "eval_accuracy", "train_loss"})
      if (m.count(k)) line += std::string(k) + "=" + m.at(k) + " ";
    out.push_back(line);
  }
  return out;
}

void expect_equal_params(Learner& a, Learner& b) {
  auto pa = a.net->named_parameters(), pb = b.net->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value()))
        << pa[i].key() << " differs by " << (pa[i].value() - pb[i].value()).abs().max().item<double>();
}

void expect_equal_optimizer_state(Learner& a, Learner& b) {
  auto pa = a.net->parameters(), pb = b.net->parameters();
  ASSERT_EQ(a.opt->state().size(), b.opt->state().size());
  for (size_t i = 0; i < pa.size(); ++i) {
    auto ia = a.opt->state().find(pa[i].unsafeGetTensorImpl());
    auto ib = b.opt->state().find(pb[i].unsafeGetTensorImpl());
    ASSERT_TRUE(ia != a.opt->state().end() && ib != b.opt->state().end()) << "parameter " << i << " has no state";
    if (auto* sa = dynamic_cast<torch::optim::AdamWParamState*>(ia->second.get())) {
      auto& sb = dynamic_cast<torch::optim::AdamWParamState&>(*ib->second);
      EXPECT_EQ(sa->step(), sb.step()) << "parameter " << i;
      EXPECT_TRUE(at::equal(sa->exp_avg(), sb.exp_avg())) << "exp_avg of parameter " << i;
      EXPECT_TRUE(at::equal(sa->exp_avg_sq(), sb.exp_avg_sq())) << "exp_avg_sq of parameter " << i;
    } else {
      auto& ma = dynamic_cast<torch::optim::SGDParamState&>(*ia->second);
      auto& mb = dynamic_cast<torch::optim::SGDParamState&>(*ib->second);
      EXPECT_TRUE(at::equal(ma.momentum_buffer(), mb.momentum_buffer())) << "momentum of parameter " << i;
    }
  }
  EXPECT_EQ(a.opt->param_groups()[0].options().get_lr(), b.opt->param_groups()[0].options().get_lr());
}

// A dataset that fails ("the machine went down") when asked for more than `limit` examples.
struct Crashing : kiln::Dataset {
  Crashing(const kiln::Dataset& inner, int64_t limit) : inner(inner), limit(limit) {}
  const kiln::Dataset& inner;
  int64_t limit;
  mutable int64_t calls = 0;
  size_t size() const override { return inner.size(); }
  kiln::Example get(size_t i) const override {
    if (++calls > limit) throw std::runtime_error("simulated crash");
    return inner.get(i);
  }
};

struct ResumeCase {
  const char* name;
  bool adamw;
  int64_t ga;
  std::string scheduler;
  int64_t warmup;
  std::string save_strategy;
  int64_t save_steps;
  std::string eval_strategy;
  int64_t total;
  int64_t crash_after_examples;  // the dataset fails after this many get() calls
  std::string resumed_from;      // the checkpoint folder "last" must find
  int64_t resumed_step;
  bool fp16 = false;  // with inputs large enough that float16's first loss scales overflow
};

kiln::TrainingArguments resume_args(const ResumeCase& c, const std::string& dir) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.output_dir = dir;
  a.max_steps = c.total;
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = c.ga;
  a.learning_rate = 0.05;
  a.lr_scheduler_type = c.scheduler;
  a.warmup_steps = c.warmup;
  a.logging_steps = 1;
  a.save_strategy = c.save_strategy;
  a.save_steps = c.save_steps;
  a.eval_strategy = c.eval_strategy;
  a.eval_steps = 2;
  a.seed = 23;
  a.fp16 = c.fp16;
  if (c.scheduler == "reduce_lr_on_plateau") {
    a.learning_rate = 0.3;  // large enough that the eval loss stops improving within the run
    a.lr_scheduler_kwargs = {{"patience", "0"}, {"factor", "0.5"}, {"threshold", "0.02"}};
  }
  return a;
}

class Resume : public ::testing::TestWithParam<ResumeCase> {};

// Uninterrupted, then crashed after a checkpoint and resumed from the newest checkpoint by a fresh
// model, optimizer and Trainer: every parameter, the optimizer's state, every logged loss, learning
// rate and evaluation equal bit for bit, and the resumed Trainer compiled its step once, as a fresh
// one does, and ran the steps after that compiled.
TEST_P(Resume, ContinuesExactlyAsTheUninterruptedTraining) {
  const ResumeCase& c = GetParam();
  auto train = make_data(40), eval = make_data(12);
  if (c.fp16) train.x *= 100, eval.x *= 100;  // the first steps skipped, the scale lowered
  const auto train_set = train.dataset(), eval_set = eval.dataset();

  const std::string ref_dir = fresh_dir(std::string(c.name) + "_ref");
  const auto seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  torch::manual_seed(seed);
  auto ref = make(c.adamw);
  auto ref_start = make(c.adamw);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < ref.net->parameters().size(); ++i)
      ref_start.net->parameters()[i].copy_(ref.net->parameters()[i]);
  }
  kiln::Trainer ref_trainer(ref.net, *ref.opt, ce, resume_args(c, ref_dir));
  ref_trainer.set_compute_metrics(accuracy);
  const auto ref_out = ref_trainer.train(train_set, eval_set);
  ASSERT_EQ(ref_out.global_step, c.total);
  EXPECT_GT(ref_trainer.stats().compiled_steps, 0);

  const std::string dir = fresh_dir(c.name);
  {
    torch::manual_seed(seed);
    auto crashed = make(c.adamw);
    expect_equal_params(ref_start, crashed);
    kiln::Trainer trainer(crashed.net, *crashed.opt, ce, resume_args(c, dir));
    trainer.set_compute_metrics(accuracy);
    Crashing crashing(train_set, c.crash_after_examples);
    EXPECT_THROW(trainer.train(crashing, eval_set), std::runtime_error);
  }
  ASSERT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), c.resumed_from);
  EXPECT_GT(std::stoll(read_metrics(dir).back().at("step")), c.resumed_step) << "the crash came after the checkpoint";

  auto resumed = make(c.adamw);
  auto args = resume_args(c, dir);
  args.resume_from_checkpoint = "last";
  kiln::Trainer trainer(resumed.net, *resumed.opt, ce, args);
  trainer.set_compute_metrics(accuracy);
  const auto out = trainer.train(train_set, eval_set);

  EXPECT_EQ(out.global_step, c.total);
  expect_equal_params(ref, resumed);
  expect_equal_optimizer_state(ref, resumed);
  EXPECT_EQ(out.training_loss, ref_out.training_loss);
  const auto want = computed_fields(ref_dir), got = computed_fields(dir);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "metrics line " << i + 1;
  const auto& st = trainer.stats();
  // With accumulation, its micro-step and its update once each.
  EXPECT_EQ(st.compiles, c.ga > 1 ? 2 : 1) << "a resumed Trainer compiles as a fresh one does";
  EXPECT_EQ(st.recaptures, 0);
  EXPECT_GT(st.compiled_steps, 0) << "the steps after the resume ran compiled";
  // The checkpoints the resumed run wrote are the uninterrupted run's.
  for (const auto& e : fs::directory_iterator(ref_dir))
    if (e.is_directory()) {
      EXPECT_TRUE(fs::exists(fs::path(dir) / e.path().filename())) << e.path().filename();
    }
  fs::remove_all(ref_dir);
  fs::remove_all(dir);
}

// 40 examples in micro-batches of 8. With gradient_accumulation_steps 2 an epoch is 3 optimizer
// steps (16, 16, 8 examples): checkpoint-4 is the first step of the second epoch (mid-epoch), and
// the crash comes in step 6 (after 1 + 72 + 3 examples are read: the first example, five steps,
// part of the sixth). With 1, an epoch is 5 steps: checkpoint-5 ends the first epoch, the crash
// comes in step 7.
INSTANTIATE_TEST_SUITE_P(Trainer, Resume,
                         ::testing::Values(ResumeCase{"adamw_accumulation_warmup_mid_epoch", true, 2, "linear", 3,
                                                      "steps", 4, "steps", 10, 76, "checkpoint-4", 4},
                                           ResumeCase{"sgd_cosine_epoch_end", false, 1, "cosine", 2, "epoch", 500,
                                                      "epoch", 12, 1 + 48 + 2, "checkpoint-5", 5},
                                           // The plateau's best, count and lowered rates in the checkpoint.
                                           ResumeCase{"adamw_reduce_lr_on_plateau", true, 1, "reduce_lr_on_plateau", 0,
                                                      "steps", 4, "steps", 10, 1 + 40 + 4, "checkpoint-4", 4},
                                           // fp16: the loss scale, its counter and the skipped steps (which
                                           // the schedule does not count) in the checkpoint.
                                           ResumeCase{"adamw_fp16_linear", true, 1, "linear", 2, "steps", 4, "steps",
                                                      12, 1 + 40 + 4, "checkpoint-4", 4, true},
                                           ResumeCase{"sgd_fp16_accumulation", false, 2, "linear", 0, "steps", 4,
                                                      "steps", 10, 76, "checkpoint-4", 4, true}),
                         [](const ::testing::TestParamInfo<ResumeCase>& info) { return std::string(info.param.name); });

kiln::TrainingArguments small_args(const std::string& dir) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.output_dir = dir;
  a.per_device_train_batch_size = 8;
  a.learning_rate = 0.05;
  a.logging_steps = 5;
  return a;
}

// save_strategy "steps": every save_steps and at the end, the oldest deleted past
// save_total_limit; each folder complete, none half-written left over, the model file readable by
// torch::load, trainer_state.json with Hugging Face's fields. "epoch": after every epoch. "no":
// none.
TEST(TrainerCheckpoints, StrategiesStepsAndTotalLimit) {
  const auto d = make_data(32);  // 4 steps an epoch
  const auto ds = d.dataset();
  {
    const std::string dir = fresh_dir("steps");
    auto s = make(true);
    auto args = small_args(dir);
    args.max_steps = 10;
    args.save_steps = 3;
    args.save_total_limit = 2;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(ds);
    std::set<std::string> folders;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) folders.insert(e.path().filename().string());
    EXPECT_EQ(folders, (std::set<std::string>{"checkpoint-9", "checkpoint-10"}));
    for (const char* f :
         {"model.pt", "optimizer.pt", "scheduler.pt", "rng_state.pt", "trainer_state.pt", "trainer_state.json"})
      EXPECT_TRUE(fs::is_regular_file(fs::path(dir) / "checkpoint-10" / f)) << f;
    std::ifstream json(fs::path(dir) / "checkpoint-10" / "trainer_state.json");
    const auto state = nlohmann::json::parse(json);
    EXPECT_EQ(state.at("global_step"), 10) << state;
    EXPECT_EQ(state.at("epoch"), 2.5) << state;
    EXPECT_EQ(state.at("log_history").at(0).at("step"), 5) << state;
    EXPECT_EQ(state.at("kiln").at("epoch_index"), 2) << state;
    // The model file is what torch::save(model) writes.
    auto other = make(true);
    torch::load(other.net, (fs::path(dir) / "checkpoint-10" / "model.pt").string());
    expect_equal_params(s, other);
    fs::remove_all(dir);
  }
  {
    const std::string dir = fresh_dir("epochs");
    auto s = make(false);
    auto args = small_args(dir);
    args.num_train_epochs = 2.5;  // 10 steps; the last epoch ends at step 10
    args.save_strategy = "epoch";
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(ds);
    std::set<std::string> folders;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) folders.insert(e.path().filename().string());
    EXPECT_EQ(folders, (std::set<std::string>{"checkpoint-4", "checkpoint-8", "checkpoint-10"}));
    fs::remove_all(dir);
  }
  {
    const std::string dir = fresh_dir("no");
    auto s = make(false);
    auto args = small_args(dir);
    args.max_steps = 6;
    args.save_strategy = "no";
    args.save_steps = 1;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(ds);
    for (const auto& e : fs::directory_iterator(dir)) EXPECT_FALSE(e.is_directory()) << e.path();
    EXPECT_TRUE(fs::exists(fs::path(dir) / "metrics.jsonl"));
    fs::remove_all(dir);
  }
}

// A checkpoint is written into tmp-checkpoint-<step> and renamed into place: a temporary folder a
// crash left behind is never taken for a checkpoint ("last" skips it; it is removed by the next
// save), and "last" is the newest by step, not by name (checkpoint-10 after checkpoint-9).
TEST(TrainerCheckpoints, LastIsTheNewestCompleteCheckpoint) {
  const auto d = make_data(16);
  const auto ds = d.dataset();
  const std::string dir = fresh_dir("last");
  {
    auto s = make(false);
    auto args = small_args(dir);
    args.max_steps = 10;
    args.save_steps = 1;
    args.logging_steps = 1;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(ds);
  }
  // What a crash in the middle of writing checkpoint-11 leaves.
  fs::create_directories(fs::path(dir) / "tmp-checkpoint-11");
  std::ofstream(fs::path(dir) / "tmp-checkpoint-11" / "model.pt") << "half";
  EXPECT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-10");
  // A checkpoint-<step> folder that lacks files (an empty one, a copy cut short) is passed over.
  fs::create_directories(fs::path(dir) / "checkpoint-400");
  EXPECT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-10");
  fs::copy(fs::path(dir) / "checkpoint-10", fs::path(dir) / "checkpoint-300", fs::copy_options::recursive);
  fs::resize_file(fs::path(dir) / "checkpoint-300" / "trainer_state.json", 40);
  EXPECT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-10");
  {
    // Named on purpose, the cut JSON is an error that names the file, and nothing is loaded.
    auto other = make(false);
    auto cut = small_args(dir);
    cut.resume_from_checkpoint = (fs::path(dir) / "checkpoint-300").string();
    kiln::Trainer t(other.net, *other.opt, ce, cut);
    try {
      t.train(ds);
      ADD_FAILURE() << "a checkpoint with a cut trainer_state.json was resumed";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("trainer_state.json: is not whole JSON"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(fs::path(dir) / "checkpoint-400");
  fs::remove_all(fs::path(dir) / "checkpoint-300");
  auto s = make(false);
  auto args = small_args(dir);
  args.max_steps = 12;
  args.save_steps = 1;
  args.logging_steps = 1;
  args.resume_from_checkpoint = "true";
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const auto out = trainer.train(ds);
  EXPECT_EQ(out.global_step, 12);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "tmp-checkpoint-11"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint-11" / "trainer_state.pt"));
  const auto lines = read_metrics(dir);
  ASSERT_EQ(lines.size(), 13u) << "ten lines from checkpoint-10, two new, the run's";
  EXPECT_EQ(lines[9].at("step"), "10");
  EXPECT_EQ(lines[10].at("step"), "11");
  EXPECT_EQ(lines[11].at("step"), "12");
  fs::remove_all(dir);
}

// A fresh run into a folder that holds another run's checkpoints stops before its first step and
// says what to do; with overwrite_output_dir it deletes them, so that "last" resumes this run. An
// output_dir that cannot be made is named.
TEST(TrainerCheckpoints, AFreshRunNeverSharesItsOutputDirWithAnotherRunsCheckpoints) {
  const auto d = make_data(16);
  const auto ds = d.dataset();
  const std::string dir = fresh_dir("overwrite");
  auto first_args = small_args(dir);
  first_args.max_steps = 6;
  first_args.save_steps = 3;
  {
    auto s = make(false);
    kiln::Trainer trainer(s.net, *s.opt, ce, first_args);
    trainer.train(ds);
  }
  ASSERT_TRUE(fs::exists(fs::path(dir) / "checkpoint-6"));

  auto second_args = small_args(dir);
  second_args.max_steps = 2;
  second_args.save_steps = 2;
  auto s = make(false);
  const at::Tensor before = s.net->parameters()[0].detach().clone();
  {
    kiln::Trainer trainer(s.net, *s.opt, ce, second_args);
    try {
      trainer.train(ds);
      ADD_FAILURE() << "a fresh run wrote beside another run's checkpoints";
    } catch (const kiln::CheckpointError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(dir + ": holds 2 checkpoint folders of another run (the newest checkpoint-6)"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("overwrite_output_dir = true"), std::string::npos) << m;
      EXPECT_NE(m.find("resume_from_checkpoint = \"last\""), std::string::npos) << m;
    }
  }
  EXPECT_TRUE(at::equal(s.net->parameters()[0], before)) << "the refused run trained";
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint-6"));

  second_args.overwrite_output_dir = true;
  {
    kiln::Trainer trainer(s.net, *s.opt, ce, second_args);
    trainer.train(ds);
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoint-3"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoint-6"));
  EXPECT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-2");
  fs::remove_all(dir);

  auto nowhere = small_args("/proc/kiln-cannot-make-this");
  kiln::Trainer trainer(s.net, *s.opt, ce, nowhere);
  try {
    trainer.train(ds);
    ADD_FAILURE() << "an output_dir that cannot be made was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write into output_dir '/proc/kiln-cannot-make-this'"),
              std::string::npos)
        << e.what();
  }
}

std::string resume_error(Learner& s, const std::string& dir, const std::string& from) {
  auto args = small_args(dir);
  args.max_steps = 8;
  args.resume_from_checkpoint = from;
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  const auto d = make_data(16);
  try {
    trainer.train(d.dataset());
  } catch (const kiln::CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

// Every way a checkpoint can be wrong is an error that names the file and says what is wrong, and
// nothing is lost: the model, the optimizer, the metrics file and the checkpoint stay as they were.
TEST(TrainerCheckpoints, BadCheckpointsAreClearErrorsThatChangeNothing) {
  const auto d = make_data(16);
  const std::string dir = fresh_dir("bad");
  {
    auto s = make(true);
    auto args = small_args(dir);
    args.max_steps = 4;
    args.save_steps = 4;
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(d.dataset());
  }
  const fs::path ckpt = fs::path(dir) / "checkpoint-4";
  const auto metrics_before = read_lines(fs::path(dir) / "metrics.jsonl");
  ASSERT_FALSE(metrics_before.empty());

  // A model that trained a step of its own, so it has optimizer state worth losing.
  auto victim = [] {
    auto s = make(true);
    kiln::Trainer t(s.net, *s.opt, ce, {});
    t.step(at::randn({8, 12}), at::randint(0, 5, {8}));
    return s;
  };
  auto unchanged = [&](Learner& s, const std::vector<at::Tensor>& params, const at::Tensor& exp_avg, int64_t step) {
    auto now = s.net->parameters();
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(now[i], params[i])) << "parameter " << i;
    auto& st = static_cast<torch::optim::AdamWParamState&>(*s.opt->state().at(now[0].unsafeGetTensorImpl()));
    EXPECT_TRUE(at::equal(st.exp_avg(), exp_avg));
    EXPECT_EQ(st.step(), step);
    EXPECT_EQ(s.opt->param_groups()[0].options().get_lr(), 1.0);
    EXPECT_EQ(read_lines(fs::path(dir) / "metrics.jsonl"), metrics_before);
  };
  auto check = [&](Learner& s, const std::string& from, const std::string& want_start, const std::string& want_part) {
    std::vector<at::Tensor> params;
    for (const auto& p : s.net->parameters()) params.push_back(p.clone());
    auto& st =
        static_cast<torch::optim::AdamWParamState&>(*s.opt->state().at(s.net->parameters()[0].unsafeGetTensorImpl()));
    const at::Tensor exp_avg = st.exp_avg().clone();
    const int64_t step = st.step();
    const std::string msg = resume_error(s, dir, from);
    EXPECT_EQ(msg.rfind(want_start, 0), 0u) << msg;
    EXPECT_NE(msg.find(want_part), std::string::npos) << msg;
    unchanged(s, params, exp_avg, step);
  };

  {
    SCOPED_TRACE("a folder that does not exist");
    auto s = victim();
    check(s, (fs::path(dir) / "checkpoint-7").string(), (fs::path(dir) / "checkpoint-7").string(),
          ": no such checkpoint folder");
  }
  {
    SCOPED_TRACE("a model of other shapes");
    Learner s{nn::Sequential(nn::Linear(12, 32), nn::ReLU(), nn::Dropout(0.25), nn::Linear(32, 5)), nullptr};
    s.opt = std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1.0));
    kiln::Trainer(s.net, *s.opt, ce, {}).step(at::randn({8, 12}), at::randint(0, 5, {8}));
    check(s, ckpt.string(), (ckpt / "model.pt").string(),
          "parameter '0.weight' has shape [16, 12] in the checkpoint, [32, 12] in the model");
  }
  {
    SCOPED_TRACE("a model with other names");
    Learner s{nn::Sequential(nn::Linear(12, 16), nn::ReLU(), nn::Linear(16, 5)), nullptr};
    s.opt = std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1.0));
    kiln::Trainer(s.net, *s.opt, ce, {}).step(at::randn({8, 12}), at::randint(0, 5, {8}));
    check(s, ckpt.string(), (ckpt / "model.pt").string(), "has no parameter '2.weight'");
  }
  {
    SCOPED_TRACE("a model with fewer layers");
    Learner s{nn::Sequential(nn::Linear(12, 16)), nullptr};
    s.opt = std::make_unique<torch::optim::AdamW>(s.net->parameters(), torch::optim::AdamWOptions(1.0));
    kiln::Trainer(s.net, *s.opt,
                  [](const at::Tensor& out, const at::Tensor& y) { return (out.sum(1) - y).pow(2).mean(); }, {})
        .step(at::randn({8, 12}), at::randn({8}));
    check(s, ckpt.string(), (ckpt / "model.pt").string(), "holds '1', which the model does not have");
  }
  {
    SCOPED_TRACE("another optimizer");
    auto s = victim();
    auto sgd_dir = fresh_dir("bad_sgd");
    {
      auto o = make(false);
      auto args = small_args(sgd_dir);
      args.max_steps = 2;
      args.save_steps = 2;
      kiln::Trainer(o.net, *o.opt, ce, args).train(d.dataset());
    }
    const auto sgd = fs::path(sgd_dir) / "checkpoint-2";
    check(s, sgd.string(), (sgd / "optimizer.pt").string(), "does not fit this optimizer");
    fs::remove_all(sgd_dir);
  }
  {
    SCOPED_TRACE("a truncated file");
    auto s = victim();
    const fs::path broken = fs::path(dir) / "checkpoint-5";
    fs::copy(ckpt, broken);
    const auto size = fs::file_size(broken / "optimizer.pt");
    fs::resize_file(broken / "optimizer.pt", size / 2);
    check(s, broken.string(), (broken / "optimizer.pt").string(), "cannot be read (truncated");
    fs::remove_all(broken);
  }
  {
    SCOPED_TRACE("a missing file");
    auto s = victim();
    const fs::path broken = fs::path(dir) / "checkpoint-6";
    fs::copy(ckpt, broken);
    fs::remove(broken / "rng_state.pt");
    check(s, broken.string(), (broken / "rng_state.pt").string(), "missing: the checkpoint is incomplete");
    fs::remove_all(broken);
  }
  {
    SCOPED_TRACE("\"last\" without a checkpoint");
    auto s = victim();
    const std::string empty = fresh_dir("bad_empty");
    fs::create_directories(empty);
    std::vector<at::Tensor> params;
    for (const auto& p : s.net->parameters()) params.push_back(p.clone());
    const std::string msg = resume_error(s, empty, "last");
    EXPECT_EQ(msg, empty + ": no checkpoint-<step> folder to resume from (resume_from_checkpoint 'last')");
    fs::remove_all(empty);
  }
  // And the good checkpoint still resumes.
  auto s = make(true);
  EXPECT_EQ(resume_error(s, dir, ckpt.string()), "(no error)");
  fs::remove_all(dir);
}

// Evaluation every eval_steps (logging_steps when not set) on the dataset given to train(): eval
// mode, no gradients, eager; eval_loss the mean over the examples, the metrics function's results
// as eval_<name>. The compiled step is not disturbed: one compile, and the model is back in
// training mode.
// A dataset through which the disk fills up: from its `after`-th example on, this process may
// write no file past 512 bytes (RLIMIT_FSIZE). With `ignore_signal`, the program ignores SIGXFSZ,
// so a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC; without it,
// the signal keeps its default action (the end of the process), which kiln must hold off while it
// writes. The limit and the signal go back as they were when the dataset goes.
struct FillsTheDisk : kiln::Dataset {
  FillsTheDisk(const kiln::Dataset& inner, int64_t after, bool ignore_signal = true)
      : inner(inner), after(after), ignore_signal(ignore_signal) {
    ::getrlimit(RLIMIT_FSIZE, &old_limit);
  }
  ~FillsTheDisk() override {
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    if (full && ignore_signal) ::signal(SIGXFSZ, old_handler);
  }
  size_t size() const override { return inner.size(); }
  kiln::Example get(size_t i) const override {
    if (++calls == after) {
      if (ignore_signal) old_handler = ::signal(SIGXFSZ, SIG_IGN);
      rlimit lim = old_limit;
      lim.rlim_cur = 512;
      ::setrlimit(RLIMIT_FSIZE, &lim);
      full = true;
    }
    return inner.get(i);
  }
  const kiln::Dataset& inner;
  int64_t after;
  bool ignore_signal;
  rlimit old_limit{};
  mutable int64_t calls = 0;
  mutable bool full = false;
  mutable sighandler_t old_handler = SIG_DFL;
};

// The disk fills up during training (or a file-size limit is reached, whose SIGXFSZ would end the
// process), so the checkpoint at its end cannot be written: train() stops
// with a CheckpointError that names the checkpoint, the file and the reason; no half-written
// folder is left beside the earlier checkpoint, which stays the newest; the model and optimizer in
// memory are what the uninterrupted training computed (the steps ran; only the save failed), and
// resuming from the earlier checkpoint ends bit for bit where the uninterrupted training ends.
TEST(TrainerCheckpoints, AFullDiskWhileACheckpointIsWrittenIsAClearErrorThatLosesNothing) {
  const auto d = make_data(48);
  const auto ds = d.dataset();
  auto args_for = [](const std::string& dir) {
    auto a = small_args(dir);
    a.max_steps = 6;
    a.save_steps = 3;
    a.logging_steps = 100;
    a.seed = 5;
    return a;
  };
  const auto seed = static_cast<uint64_t>(at::randint(1, 1 << 30, {1}).item<int64_t>());
  const std::string ref_dir = fresh_dir("full_disk_ref");
  torch::manual_seed(seed);
  auto ref = make(true);
  {
    kiln::Trainer trainer(ref.net, *ref.opt, ce, args_for(ref_dir));
    ASSERT_EQ(trainer.train(ds).global_step, 6);
  }

  // A full disk, and a file-size limit whose signal the program left at its default (the end of
  // the process, unless kiln holds it off while it writes).
  for (const bool program_ignores_sigxfsz : {true, false}) {
    SCOPED_TRACE(program_ignores_sigxfsz ? "SIGXFSZ ignored by the program" : "SIGXFSZ at its default action");
    const std::string dir = fresh_dir(program_ignores_sigxfsz ? "full_disk" : "file_size_limit");
    torch::manual_seed(seed);
    auto filled = make(true);
    std::string error, file;
    {
      // Steps of 8 examples after the one the first compile reads: step 4's first example fills it,
      // after checkpoint-3 was written.
      FillsTheDisk full(ds, 1 + 3 * 8 + 1, program_ignores_sigxfsz);
      kiln::Trainer trainer(filled.net, *filled.opt, ce, args_for(dir));
      try {
        trainer.train(full);
      } catch (const kiln::CheckpointError& e) {
        error = e.what();
        file = e.file();
      }
      ASSERT_TRUE(full.full) << "the disk never filled";
    }
    ASSERT_FALSE(error.empty()) << "train() did not stop with a CheckpointError";
    std::cout << "  " << error << "\n";
    EXPECT_NE(error.find("checkpoint-6"), std::string::npos) << error;
    EXPECT_NE(error.find("File too large"), std::string::npos) << error;
    EXPECT_NE(error.find("checkpoint-3"), std::string::npos)
        << "the message names the checkpoint to resume from: " << error;
    EXPECT_EQ(fs::path(file).parent_path().filename(), "tmp-checkpoint-6") << file;
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_TRUE(e.path().filename() == "checkpoint-3" || !e.is_directory()) << "left behind: " << e.path();
    EXPECT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-3");
    // Nothing in memory was lost: the six steps are the uninterrupted training's.
    expect_equal_params(ref, filled);
    expect_equal_optimizer_state(ref, filled);
    if (program_ignores_sigxfsz) fs::remove_all(dir);
    if (program_ignores_sigxfsz) continue;

    // With room again, from checkpoint-3.
    auto resumed = make(true);
    auto args = args_for(dir);
    args.resume_from_checkpoint = "last";
    kiln::Trainer trainer(resumed.net, *resumed.opt, ce, args);
    EXPECT_EQ(trainer.train(ds).global_step, 6);
    expect_equal_params(ref, resumed);
    expect_equal_optimizer_state(ref, resumed);
    EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint-6" / "model.pt"));
    fs::remove_all(dir);
  }
  fs::remove_all(ref_dir);
}

TEST(TrainerEvaluation, EveryEvalStepsWithMetricsWithoutDisturbingTheCompiledStep) {
  const auto train = make_data(32), eval = make_data(20);  // eval batches of 8, 8, 4
  const std::string dir = fresh_dir("eval");
  auto s = make(true);
  auto args = small_args(dir);
  args.max_steps = 6;
  args.logging_steps = 3;
  args.eval_strategy = "steps";  // eval_steps 0: every logging_steps
  args.save_strategy = "no";
  kiln::Trainer trainer(s.net, *s.opt, ce, args);
  trainer.set_compute_metrics(accuracy);
  trainer.train(train.dataset(), eval.dataset());
  EXPECT_TRUE(s.net->is_training());
  EXPECT_EQ(trainer.stats().compiles, 1);
  EXPECT_EQ(trainer.stats().recaptures, 0);
  const auto lines = read_metrics(dir);
  std::vector<std::string> eval_steps;
  for (const auto& l : lines)
    if (l.count("eval_loss")) eval_steps.push_back(l.at("step"));
  EXPECT_EQ(eval_steps, (std::vector<std::string>{"3", "6"}));

  // The last evaluation saw the final model: eval_loss and accuracy by hand.
  s.net->eval();
  double loss = 0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t b = 0; b < 20; b += 8) {
      const int64_t e = std::min<int64_t>(b + 8, 20);
      loss +=
          ce(s.net->forward(eval.x.slice(0, b, e)), eval.y.slice(0, b, e)).item<double>() * static_cast<double>(e - b);
    }
  }
  const double acc = s.net->forward(eval.x).argmax(1).eq(eval.y).to(at::kDouble).mean().item<double>();
  s.net->train();
  const auto& last_eval = *std::find_if(lines.rbegin(), lines.rend(), [](auto& l) { return l.count("eval_loss"); });
  EXPECT_DOUBLE_EQ(std::stod(last_eval.at("eval_loss")), loss / 20);
  EXPECT_DOUBLE_EQ(std::stod(last_eval.at("eval_accuracy")), acc);
  EXPECT_EQ(last_eval.at("epoch"), "1.5");
  EXPECT_TRUE(last_eval.count("eval_runtime") && last_eval.count("eval_samples_per_second"));

  // evaluate() on its own returns the same.
  const auto m = trainer.evaluate(eval.dataset());
  EXPECT_DOUBLE_EQ(m.at("eval_loss"), loss / 20);
  EXPECT_DOUBLE_EQ(m.at("eval_accuracy"), acc);
  fs::remove_all(dir);

  // eval_strategy without an evaluation dataset is an error before anything runs.
  args.eval_strategy = "epoch";
  kiln::Trainer without(s.net, *s.opt, ce, args);
  try {
    without.train(train.dataset());
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("eval_strategy is 'epoch' but there is no evaluation dataset"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(without.stats().steps, 0);
}

// report_to "none" writes no metrics file (the checkpoints still hold the metrics); a value kiln
// does not know is a configuration error listing the valid ones, in code and in a file. The
// new keys read from TOML.
TEST(TrainerConfig, ReportToAndTheNewKeys) {
  const auto d = make_data(16);
  const std::string dir = fresh_dir("report");
  {
    auto s = make(false);
    auto args = small_args(dir);
    args.max_steps = 2;
    args.report_to = {"none"};
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    trainer.train(d.dataset());
    EXPECT_FALSE(fs::exists(fs::path(dir) / "metrics.jsonl"));
    EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint-2"));
  }
  {
    auto s = make(false);
    auto args = small_args(dir);
    args.report_to = {"wandb"};
    try {
      kiln::Trainer trainer(s.net, *s.opt, ce, args);
      FAIL() << "expected an error";
    } catch (const kiln::ConfigError& e) {
      EXPECT_STREQ(e.what(), "code: unknown report_to value 'wandb'; valid values: all, jsonl, none");
    }
  }
  try {
    kiln::TrainingArguments::from_toml_string("report_to = [\"jsonl\", \"tensorbord\"]\n", "train.toml");
    FAIL() << "expected an error";
  } catch (const kiln::ConfigError& e) {
    EXPECT_STREQ(e.what(), "train.toml:1:13: unknown report_to value 'tensorbord'; valid values: all, jsonl, none");
  }
  try {
    kiln::TrainingArguments::from_toml_string("save_strategy = \"step\"\n", "train.toml");
    FAIL() << "expected an error";
  } catch (const kiln::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "train.toml:1:17: unknown save_strategy 'step'; did you mean 'steps'? Valid values: no, steps, epoch");
  }
  const auto a = kiln::TrainingArguments::from_toml_string(
      "save_strategy = \"epoch\"\nsave_steps = 7\nsave_total_limit = 3\nresume_from_checkpoint = true\n"
      "eval_strategy = \"steps\"\neval_steps = 9\nper_device_eval_batch_size = 4\nreport_to = \"jsonl\"\n"
      "disable_tqdm = true\n",
      "train.toml");
  EXPECT_EQ(a.save_strategy, "epoch");
  EXPECT_EQ(a.save_steps, 7);
  EXPECT_EQ(a.save_total_limit, 3);
  EXPECT_EQ(a.resume_from_checkpoint, "true");
  EXPECT_EQ(a.eval_strategy, "steps");
  EXPECT_EQ(a.eval_steps, 9);
  EXPECT_EQ(a.per_device_eval_batch_size, 4);
  EXPECT_EQ(a.report_to, std::vector<std::string>{"jsonl"});
  EXPECT_TRUE(a.disable_tqdm);
  fs::remove_all(dir);
}

// stderr is not a terminal here: plain log lines every logging_steps (step/total, epoch, loss,
// learning rate, speed), the step that compiles shown as such, evaluations and checkpoints; no
// line redrawn in place. disable_tqdm gives the same; log_level "warn" silences them.
TEST(TrainerProgress, PlainLinesWhenNotATerminal) {
  const auto train = make_data(32), eval = make_data(8);
  const std::string dir = fresh_dir("progress");
  for (const char* mode : {"default", "disable_tqdm", "warn"}) {
    SCOPED_TRACE(mode);
    auto s = make(true);
    auto args = small_args(dir);
    args.max_steps = 6;
    args.logging_steps = 2;
    args.save_steps = 4;
    args.eval_strategy = "steps";
    args.eval_steps = 3;
    args.disable_tqdm = std::string(mode) == "disable_tqdm";
    if (std::string(mode) == "warn") args.log_level = "warn";
    kiln::Trainer trainer(s.net, *s.opt, ce, args);
    ::testing::internal::CaptureStderr();
    trainer.train(train.dataset(), eval.dataset());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find('\r'), std::string::npos);
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);)
      if (l.find("[kiln] [info] ") != std::string::npos) lines.push_back(l.substr(l.find("[kiln] [info] ") + 14));
    fs::remove_all(dir);
    if (std::string(mode) == "warn") {
      EXPECT_TRUE(lines.empty()) << err;
      continue;
    }
    std::vector<std::string> steps, evals, saves, compiles;
    for (const auto& l : lines) {
      if (l.rfind("step ", 0) == 0 && l.find(": loss ") != std::string::npos) steps.push_back(l.substr(0, l.find(':')));
      if (l.find(": eval_loss ") != std::string::npos) evals.push_back(l.substr(0, l.find(':')));
      if (l.rfind("saved ", 0) == 0) saves.push_back(l.substr(6));
      if (l.rfind("compiling the step\xe2\x80\xa6 ", 0) == 0) compiles.push_back(l);
    }
    EXPECT_EQ(steps, (std::vector<std::string>{"step 2/6 (epoch 0.5)", "step 4/6 (epoch 1)", "step 6/6 (epoch 1.5)"}))
        << err;
    EXPECT_EQ(evals, (std::vector<std::string>{"step 3/6", "step 6/6"})) << err;
    EXPECT_EQ(saves, (std::vector<std::string>{(fs::path(dir) / "checkpoint-4").string(),
                                               (fs::path(dir) / "checkpoint-6").string()}))
        << err;
    ASSERT_EQ(compiles.size(), 1u) << err;
    EXPECT_TRUE(std::regex_match(compiles[0], std::regex("compiling the step\xe2\x80\xa6 [0-9.e-]+ s"))) << compiles[0];
    const auto loss_line =
        std::find_if(lines.begin(), lines.end(), [](auto& l) { return l.rfind("step 4/6", 0) == 0; });
    ASSERT_NE(loss_line, lines.end());
    EXPECT_TRUE(std::regex_search(
        *loss_line,
        std::regex(R"(: loss [0-9.e-]+, learning_rate [0-9.e-]+, [0-9.e+-]+ steps/s, ETA [0-9]+:[0-9]{2}:[0-9]{2}$)")))
        << *loss_line;
  }
}

}  // namespace
