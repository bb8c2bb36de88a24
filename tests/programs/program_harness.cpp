#include "program_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace programs {

std::vector<std::string> backends() { return {"eager", "inductor"}; }

std::string backend_test_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

uint64_t fresh_seed() {
  if (const char* v = std::getenv("KILN_PROGRAM_SEED"); v && *v) return std::strtoull(v, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) >> 1;
}

std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay with KILN_PROGRAM_SEED=" + std::to_string(seed) + ")";
}

kiln::TrainingArguments compile_args(const std::string& backend) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.torch_compile_backend = backend;
  return a;
}

void Run::record_step(const std::vector<at::Tensor>& results) {
  std::vector<at::Tensor> copies;
  for (const auto& t : results) copies.push_back(t.defined() ? t.detach().clone() : t);
  steps.push_back(std::move(copies));
}

void Run::add(const std::string& name, const at::Tensor& t) {
  state.emplace_back(name, t.defined() ? t.detach().clone() : t);
}

void Run::add_module(const std::string& prefix, const torch::nn::Module& module) {
  for (const auto& p : module.named_parameters(/*recurse=*/true)) add(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) add(prefix + b.key(), b.value());
}

void Run::add_optimizer(const std::string& prefix, torch::optim::Optimizer& optimizer) {
  auto count = [](int64_t n) { return at::scalar_tensor(n, at::kLong); };
  int index = 0;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    auto& group = optimizer.param_groups()[g];
    add(prefix + "group" + std::to_string(g) + ".lr", at::scalar_tensor(group.options().get_lr(), at::kDouble));
    for (const auto& p : group.params()) {
      const std::string name = prefix + "param" + std::to_string(index++) + ".";
      auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) {
        add(name + "state", at::Tensor());
        continue;
      }
      const auto& st = *it->second;
      if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
        add(name + "step", count(s->step()));
        add(name + "exp_avg", s->exp_avg());
        add(name + "exp_avg_sq", s->exp_avg_sq());
        add(name + "max_exp_avg_sq", s->max_exp_avg_sq());
      } else if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
        add(name + "step", count(s->step()));
        add(name + "exp_avg", s->exp_avg());
        add(name + "exp_avg_sq", s->exp_avg_sq());
        add(name + "max_exp_avg_sq", s->max_exp_avg_sq());
      } else if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
        add(name + "momentum_buffer", s->momentum_buffer());
      }
    }
  }
}

void Run::record_kiln(const kiln::StepStats& s, bool last_compiled) {
  stats = s;
  last_step_compiled = last_compiled;
}

Driver::Driver(kiln::StepFn fn, kiln::StepState state, std::optional<std::string> backend) : fn_(std::move(fn)) {
  if (backend) step_.emplace(kiln::compile_step(fn_, std::move(state), compile_args(*backend)));
}

std::vector<at::Tensor> Driver::operator()(const std::vector<at::Tensor>& inputs) {
  return step_ ? (*step_)(inputs) : fn_(inputs);
}

void Driver::finish(Run& run) const {
  if (step_) run.record_kiln(step_->stats(), step_->last_step_compiled());
}

namespace {

std::string join_warnings(const KilnLog& log) {
  const auto w = log.warnings();
  if (w.empty()) return "none";
  std::string out;
  for (const auto& line : w) out += "\n    " + line;
  return out;
}

struct Diff {
  bool same = true;
  double max_abs = 0;
  double rel = 0;
  std::string detail;
};

std::string number(double v) {
  std::ostringstream s;
  s << std::setprecision(9) << v;
  return s.str();
}

Diff compare(const at::Tensor& got, const at::Tensor& want, bool exact, double tolerance = kTolerance) {
  Diff d;
  if (!got.defined() || !want.defined()) {
    d.same = got.defined() == want.defined();
    if (!d.same) d.detail = got.defined() ? "eager has no tensor, kiln has one" : "kiln has no tensor, eager has one";
    return d;
  }
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
    d.same = false;
    std::ostringstream s;
    s << "kiln " << got.scalar_type() << got.sizes() << ", eager " << want.scalar_type() << want.sizes();
    d.detail = s.str();
    return d;
  }
  const auto a = got.detach().to(at::kCPU).to(at::kDouble);
  const auto b = want.detach().to(at::kCPU).to(at::kDouble);
  const auto diff = a - b;
  if (diff.numel() > 0) d.max_abs = diff.abs().max().item<double>();
  const double num = diff.norm().item<double>();
  const double den = b.norm().item<double>();
  d.rel = den > 0 ? num / den : (num == 0 ? 0.0 : std::numeric_limits<double>::infinity());
  if (std::isnan(d.rel)) d.rel = std::numeric_limits<double>::infinity();  // a NaN is never close
  d.same = exact ? at::equal(got.detach().cpu(), want.detach().cpu()) : d.rel <= tolerance;
  std::ostringstream s;
  if (got.numel() == 1) s << "kiln " << number(a.item<double>()) << ", eager " << number(b.item<double>()) << ", ";
  s << "max |diff| " << d.max_abs << ", relative " << d.rel;
  d.detail = s.str();
  return d;
}

std::string counters(const kiln::StepStats& stats) {
  std::ostringstream s;
  s << "kiln: steps " << stats.steps << ", eager " << stats.eager_steps << ", compiled " << stats.compiled_steps
    << ", compiles " << stats.compiles << " (recaptures " << stats.recaptures << "), rebuilds " << stats.rebuilds;
  return s.str();
}

}  // namespace

void expect_no_fallback(const kiln::StepStats& stats, bool last_step_compiled, int total_steps, int min_captures,
                        int max_captures, const KilnLog& log) {
  // Also when everything passes: how the run went, for whoever reads the log.
  std::cout << counters(stats) << std::endl;
  std::vector<std::string> problems;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  check(stats.steps == total_steps,
        "steps " + std::to_string(stats.steps) + ", the program ran " + std::to_string(total_steps));
  check(stats.last_fallback.empty(), "a fallback: \"" + stats.last_fallback + "\"");
  check(last_step_compiled, "the last step did not run compiled");
  check(stats.compiles >= min_captures && stats.compiles <= max_captures,
        "compiles " + std::to_string(stats.compiles) + ", expected " + std::to_string(min_captures) +
            (max_captures != min_captures ? " to " + std::to_string(max_captures) : std::string()));
  check(stats.eager_steps == 1 + stats.compiles, "eager steps " + std::to_string(stats.eager_steps) +
                                                     ": the first step and " + std::to_string(stats.compiles) +
                                                     " capture(s) account for " + std::to_string(1 + stats.compiles));
  check(stats.compiled_steps == total_steps - 1 - stats.compiles,
        "compiled steps " + std::to_string(stats.compiled_steps) + ", expected " +
            std::to_string(total_steps - 1 - stats.compiles));
  check(log.warnings().empty(), "kiln warned");
  if (problems.empty()) return;
  std::ostringstream msg;
  msg << "kiln did not compile the program's steps:";
  for (const auto& p : problems) msg << "\n  - " << p;
  msg << "\n" << counters(stats) << "; warnings: " << join_warnings(log);
  ADD_FAILURE() << msg.str();
}

void expect_no_fallback(const Run& run, int total_steps, int min_captures, int max_captures, const KilnLog& log) {
  ASSERT_TRUE(run.stats.has_value()) << "not a kiln run";
  expect_no_fallback(*run.stats, run.last_step_compiled, total_steps, min_captures, max_captures, log);
}

namespace {
// Which way nudge_parameters moves the parameters: +1 one ulp up, -1 one ulp down.
thread_local int nudge_direction = 1;
}  // namespace

NudgeDown::NudgeDown() { nudge_direction = -1; }
NudgeDown::~NudgeDown() { nudge_direction = 1; }

void nudge_parameters(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  const double towards = nudge_direction > 0 ? INFINITY : -INFINITY;
  for (auto& p : module.parameters()) p.copy_(at::nextafter(p, at::full_like(p, towards)));
}

// The tolerance for one tensor: 1e-4, or ten times how far eager itself moves when its start is
// one ulp away (noise: up, and down where given, the farther), whichever is larger.
double tolerance_for(const at::Tensor& want, const at::Tensor* moved, const at::Tensor* moved_down) {
  double floor = 0;
  for (const at::Tensor* m : {moved, moved_down}) {
    if (!m || !m->defined() || !want.defined()) continue;
    const double f = compare(*m, want, false).rel;
    if (std::isfinite(f)) floor = std::max(floor, f);
  }
  return std::max(kTolerance, 10 * floor);
}

void expect_same_run(const Run& kiln, const Run& eager, const std::string& backend,
                     const std::vector<std::string>& names, const Run* noise, const Run* noise_down) {
  const bool exact = backend == "eager";
  const std::string how = exact   ? "bit for bit"
                          : noise ? "within a relative error of 1e-4 or ten times eager's own noise floor"
                                  : "within a relative error of 1e-4";
  if (noise) {
    EXPECT_EQ(noise->steps.size(), eager.steps.size()) << "steps of the noise-floor run";
    EXPECT_EQ(noise->state.size(), eager.state.size()) << "state of the noise-floor run";
  }
  if (noise_down) {
    EXPECT_EQ(noise_down->steps.size(), eager.steps.size()) << "steps of the second noise-floor run";
    EXPECT_EQ(noise_down->state.size(), eager.state.size()) << "state of the second noise-floor run";
  }
  auto moved_result = [&](const Run* n, size_t s, size_t k) -> const at::Tensor* {
    return n && s < n->steps.size() && k < n->steps[s].size() ? &n->steps[s][k] : nullptr;
  };
  auto moved_state = [&](const Run* n, const std::string& name) -> const at::Tensor* {
    if (!n) return nullptr;
    for (const auto& [m, t] : n->state)
      if (m == name) return &t;
    return nullptr;
  };
  ASSERT_EQ(kiln.steps.size(), eager.steps.size()) << "steps run";
  const size_t results = eager.steps.empty() ? 0 : eager.steps.front().size();
  for (size_t s = 0; s < kiln.steps.size(); ++s)
    ASSERT_EQ(kiln.steps[s].size(), eager.steps[s].size()) << "results of step " << s;
  for (size_t k = 0; k < results; ++k) {
    const std::string name = k < names.size() ? names[k] : "result " + std::to_string(k);
    int bad = 0, first = -1, worst = -1;
    double worst_rel = 0;
    std::string first_detail;
    for (size_t s = 0; s < eager.steps.size(); ++s) {
      const auto d = compare(
          kiln.steps[s][k], eager.steps[s][k], exact,
          exact ? 0.0 : tolerance_for(eager.steps[s][k], moved_result(noise, s, k), moved_result(noise_down, s, k)));
      if (d.same) continue;
      if (bad++ == 0) {
        first = static_cast<int>(s);
        first_detail = d.detail;
      }
      if (worst < 0 || d.rel > worst_rel) {
        worst = static_cast<int>(s);
        worst_rel = d.rel;
      }
    }
    if (bad)
      ADD_FAILURE() << "'" << name << "' does not match eager " << how << " at " << bad << " of " << eager.steps.size()
                    << " steps; first at step " << first << ": " << first_detail << "; largest relative error "
                    << worst_rel << " (step " << worst << ")";
  }
  std::vector<std::string> lines;
  for (const auto& [name, want] : eager.state) {
    auto it = std::find_if(kiln.state.begin(), kiln.state.end(), [&](const auto& e) { return e.first == name; });
    if (it == kiln.state.end()) {
      lines.push_back(name + ": missing from kiln's run");
      continue;
    }
    const auto d = compare(it->second, want, exact,
                           exact ? 0.0 : tolerance_for(want, moved_state(noise, name), moved_state(noise_down, name)));
    if (!d.same) lines.push_back(name + ": " + d.detail);
  }
  if (!lines.empty()) {
    std::ostringstream s;
    s << lines.size() << " of " << eager.state.size() << " final state tensors do not match eager " << how << ":";
    for (size_t i = 0; i < lines.size() && i < 16; ++i) s << "\n  " << lines[i];
    if (lines.size() > 16) s << "\n  ... and " << lines.size() - 16 << " more";
    ADD_FAILURE() << s.str();
  }
  EXPECT_EQ(kiln.state.size(), eager.state.size()) << "final state tensors";
}

std::pair<Run, Run> expect_trains_like_eager(const TrainFn& train, const std::string& backend, int total_steps,
                                             int captures, const std::vector<std::string>& names,
                                             bool with_noise_floor) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  auto eager = train(seed, std::nullopt, false);
  KilnLog log;
  auto kiln = train(seed, backend, false);
  expect_no_fallback(kiln, total_steps, captures, log);
  // Eager's noise floor from both sides: parameters one ulp up, then one ulp down. A ReLU mask or a
  // max-pool choice that rounding flips in kiln's run may be flipped by one nudge and not the other.
  std::optional<Run> noise, noise_down;
  if (with_noise_floor && backend != "eager") {
    noise = train(seed, std::nullopt, true);
    const NudgeDown down;
    noise_down = train(seed, std::nullopt, true);
  }
  expect_same_run(kiln, eager, backend, names, noise ? &*noise : nullptr, noise_down ? &*noise_down : nullptr);
  return {std::move(eager), std::move(kiln)};
}

}  // namespace programs
