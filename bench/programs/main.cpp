// kiln_programs_bench: the training programs of tests/programs/corpus (the ones programs_test trains
// through kiln and compares with eager), timed side by side on the CPU:
//
//   build/bin/kiln_programs_bench [--programs a,b,...] [--backend B] [--blocks N] [--block-ms X]
//                                 [--warmup N] [--batch N] [--seed N] [--threads N] [--list]
//
// For each program two copies are built from the same seed: one runs its step as plain LibTorch,
// the other runs the same step through kiln::compile_step with the default backend (auto: inductor
// on the CPU). kiln's first two steps are the eager warm-up and the capture-and-compile step; they
// and `--warmup` more steps of each copy run before timing. Then the copies take turns running
// blocks of steps (eager block, kiln block, then kiln first in the next round, and so on), so that a
// change of load on the machine slows both alike; each block is timed as a whole and the table shows
// the median ms per step of each side over the blocks, and eager/kiln.
//
// Each copy keeps its own state of LibTorch's CPU generator (swapped in around its blocks), so both
// draw the same dropout masks and noise and run exactly the same training: the last column is the
// largest relative difference of a parameter or buffer between the two copies at the end (0 with
// the "eager" backend; rounding with generated kernels, which grows with the number of steps).
//
// Batch sizes are larger than the tests' so that a step does a real amount of work; --batch N
// uses N for every program.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "corpus/checkpoint_resume.h"
#include "corpus/cnn_classifier.h"
#include "corpus/dcgan.h"
#include "corpus/mnist_cnn.h"
#include "corpus/multitask_two_backward.h"
#include "corpus/regression_scheduler.h"
#include "corpus/text_classifier.h"
#include "corpus/transformer_lm.h"
#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/log.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// LibTorch's default CPU generator: its state is saved and restored around each copy's steps.
at::Tensor generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_generator_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// One copy of a program: its objects, its step (plain or compiled), its generator state.
struct Copy {
  std::shared_ptr<void> program;                  // first: it outlives the compiled step, which points into it
  std::function<std::vector<at::Tensor>()> step;  // runs the next step (and what follows it)
  std::function<std::vector<std::pair<std::string, at::Tensor>>()> state;  // parameters and buffers
  std::optional<kiln::CompiledStep> compiled;
  at::Tensor rng;
};

template <class P>
std::vector<at::Tensor> after_step(P&, std::vector<at::Tensor> r) {
  return r;
}
template <>
std::vector<at::Tensor> after_step(corpus::regression_scheduler::Program& p, std::vector<at::Tensor> r) {
  p.after_step();  // the learning-rate schedule advances between steps, outside the step
  return r;
}

// Builds a copy of program P from `seed`; compiled through kiln when `args` is given.
template <class P, class O>
std::unique_ptr<Copy> make_copy(const O& options, uint64_t seed, const std::optional<kiln::TrainingArguments>& args) {
  auto c = std::make_unique<Copy>();
  torch::manual_seed(seed);
  auto program = std::make_shared<P>(options);
  c->program = program;
  P* p = program.get();
  auto counter = std::make_shared<int>(0);
  if (args) {
    c->compiled.emplace(kiln::compile_step(p->step(), p->state(), *args));
    kiln::CompiledStep* s = &*c->compiled;
    c->step = [p, s, counter] { return after_step(*p, (*s)(p->batch((*counter)++))); };
  } else {
    c->step = [p, fn = p->step(), counter] { return after_step(*p, fn(p->batch((*counter)++))); };
  }
  c->state = [p] {
    std::vector<std::pair<std::string, at::Tensor>> out;
    int m = 0;
    for (const auto& module : p->state().modules) {
      const std::string prefix = "module" + std::to_string(m++) + ".";
      for (const auto& t : module->named_parameters(true)) out.emplace_back(prefix + t.key(), t.value());
      for (const auto& t : module->named_buffers(true)) out.emplace_back(prefix + t.key(), t.value());
    }
    return out;
  };
  c->rng = generator_state();
  return c;
}

struct Entry {
  std::string name;
  std::string what;
  int64_t batch = 0;
  // Both copies from one seed: eager (no args) and kiln.
  std::function<std::unique_ptr<Copy>(int64_t batch, uint64_t seed, const std::optional<kiln::TrainingArguments>&)>
      make;
};

template <class P, class O>
Entry entry(std::string name, std::string what, int64_t batch, std::function<void(O&)> configure = {}) {
  Entry e;
  e.name = std::move(name);
  e.what = std::move(what);
  e.batch = batch;
  e.make = [configure](int64_t b, uint64_t seed, const std::optional<kiln::TrainingArguments>& args) {
    O o;
    o.batch = b;
    if (configure) configure(o);
    return make_copy<P>(o, seed, args);
  };
  return e;
}

std::vector<Entry> entries() {
  using namespace corpus;
  std::vector<Entry> v;
  v.push_back(entry<cnn_classifier::Program, cnn_classifier::Options>(
      "cnn_classifier", "conv 1->8 + batch norm + max pool + dropout + linear, Adam", 64));
  v.push_back(entry<mnist_cnn::Program, mnist_cnn::Options>(
      "mnist_cnn", "PyTorch's MNIST example net (conv 1->32->64, 9216->128->10), Adam", 64));
  v.push_back(entry<mnist_cnn::Program, mnist_cnn::Options>(
      "mnist_cnn_sgd", "the same net, SGD with momentum", 64,
      [](mnist_cnn::Options& o) { o.optimizer = mnist_cnn::Optimizer::Sgd; }));
  v.push_back(entry<dcgan::Program, dcgan::Options>("dcgan",
                                                    "generator + discriminator, three backward passes, two Adams", 64));
  v.push_back(entry<text_classifier::Program, text_classifier::Options>(
      "text_classifier", "embedding + conv1d + masked mean, clip_grad_norm_, SGD momentum", 1024));
  v.push_back(entry<regression_scheduler::Program, regression_scheduler::Options>(
      "regression_scheduler", "Linear(4, 1) on polynomial features, SGD + StepLR", 65536));
  v.push_back(entry<checkpoint_resume::Program, checkpoint_resume::Options>(
      "checkpoint_resume", "MLP 16->32->4 with dropout, Adam (trained, no reloads)", 4096));
  v.push_back(entry<transformer_lm::Program, transformer_lm::Options>(
      "transformer_lm", "2-layer char GPT, scaled_dot_product_attention, AdamW", 32));
  v.push_back(entry<transformer_lm::Program, transformer_lm::Options>(
      "transformer_lm_mha", "the same, torch::nn::MultiheadAttention", 32,
      [](transformer_lm::Options& o) { o.attention = transformer_lm::Attention::NnMultiheadAttention; }));
  v.push_back(entry<multitask_two_backward::Program, multitask_two_backward::Options>(
      "multitask_two_backward", "trunk + two heads, two backward passes, SGD + Adam", 4096));
  return v;
}

// Runs `n` steps of a copy with its own generator state; returns ms per step.
double run_block(Copy& c, int n) {
  set_generator_state(c.rng);
  std::vector<at::Tensor> keep;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto r = c.step();
    if (!r.empty()) keep.push_back(r[0]);
  }
  const double ms = ms_since(t0) / n;
  c.rng = generator_state();
  return ms;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : INFINITY;
  if (a.sizes() != b.sizes()) return INFINITY;
  const auto x = a.detach().to(at::kDouble), y = b.detach().to(at::kDouble);
  const double num = (x - y).norm().item<double>(), den = y.norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return den > 0 ? num / den : num;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown CPU";
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: kiln_programs_bench [--programs a,b,...] [--backend B] [--blocks N] [--block-ms X]\n"
               "                           [--warmup N] [--batch N] [--seed N] [--threads N] [--list]\n\n"
               "Times the training programs of tests/programs/corpus with LibTorch eager and through kiln, in\n"
               "turns, and prints one table.\n\n"
               "  --programs    comma-separated names (default: all; --list shows them)\n"
               "  --backend B   kiln backend (default: KILN_BACKEND, else auto = inductor on the CPU)\n"
               "  --blocks N    timed blocks per side (default 9)\n"
               "  --block-ms X  aim for blocks of about X ms of eager time (default 150)\n"
               "  --warmup N    steps of each side after kiln's capture, before timing (default 3, at least 1)\n"
               "  --batch N     batch size for every program (default: each program's own)\n"
               "  --seed N      seed of both copies (default 1234)\n"
               "  --threads N   LibTorch's intra-op threads (at::set_num_threads; default: LibTorch's own)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> only;
  std::string backend;
  int blocks = 9, warmup = 3, threads = 0;
  double block_ms = 150;
  int64_t batch = 0;
  uint64_t seed = 1234;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln_programs_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--programs") {
      std::stringstream ss(value());
      for (std::string name; std::getline(ss, name, ',');)
        if (!name.empty()) only.push_back(name);
    } else if (a == "--backend") backend = value();
    else if (a == "--blocks") blocks = std::max(1, std::atoi(value().c_str()));
    else if (a == "--block-ms") block_ms = std::max(1.0, std::atof(value().c_str()));
    else if (a == "--warmup") warmup = std::max(1, std::atoi(value().c_str()));
    else if (a == "--batch") batch = std::atoll(value().c_str());
    else if (a == "--seed") seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--threads") threads = std::max(1, std::atoi(value().c_str()));
    else if (a == "--list") list = true;
    else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "kiln_programs_bench: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  auto all = entries();
  if (list) {
    for (const auto& e : all)
      std::printf("%-24s batch %-5lld %s\n", e.name.c_str(), static_cast<long long>(e.batch), e.what.c_str());
    return 0;
  }
  std::vector<Entry> chosen;
  for (const auto& name : only) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Entry& e) { return e.name == name; });
    if (it == all.end()) {
      std::fprintf(stderr, "kiln_programs_bench: unknown program '%s' (--list shows them)\n", name.c_str());
      return 2;
    }
    chosen.push_back(*it);
  }
  if (only.empty()) chosen = all;
  if (threads > 0) at::set_num_threads(threads);
  // Only warnings, unless KILN_LOG_LEVEL asks otherwise (the environment wins over code).
  kiln::TrainingArguments args;
  args.log_level = "warn";
  try {
    args.apply_env();
  } catch (const kiln::ConfigError& e) {
    std::fprintf(stderr, "kiln_programs_bench: %s\n", e.what());
    return 2;
  }
  kiln::set_log_level(args.log_level);
  args.torch_compile = true;
  if (!backend.empty()) args.torch_compile_backend = backend;
  backend = args.torch_compile_backend;
  args.validate();

  std::printf("kiln_programs_bench: %s, %d ATen threads, load average %s; backend %s\n", cpu_model().c_str(),
              at::get_num_threads(), loadavg().c_str(), backend.c_str());
  std::printf(
      "median of %d interleaved blocks per side (~%.0f ms of eager each), after %d warm-up steps past kiln's "
      "capture\n\n",
      blocks, block_ms, warmup);
  std::printf("%-23s %5s %10s %10s %9s %13s %9s %6s %-28s %11s\n", "program", "batch", "eager ms", "kiln ms",
              "speed-up", "kiln 1st 2 s", "probe ms", "steps", "compiled, no fallback", "max rel diff");
  std::fflush(stdout);

  bool all_compiled = true;
  for (const auto& e : chosen) {
    const int64_t b = batch > 0 ? batch : e.batch;
    auto eager = e.make(b, seed, std::nullopt);
    auto kiln = e.make(b, seed, args);
    // kiln's first two steps: the eager warm-up (optimizer state), then capture and compile.
    double first_ms = 0;
    for (int s = 0; s < 2; ++s) {
      run_block(*eager, 1);
      first_ms += run_block(*kiln, 1);
    }
    std::vector<double> warm;
    for (int s = 0; s < warmup; ++s) {
      warm.push_back(run_block(*eager, 1));
      run_block(*kiln, 1);
    }
    const double est = median(warm);
    const int n = static_cast<int>(std::clamp(std::lround(block_ms / std::max(est, 1e-3)), 2L, 1000L));
    std::vector<double> eager_ms, kiln_ms;
    for (int k = 0; k < blocks; ++k) {
      if (k % 2 == 0) {
        eager_ms.push_back(run_block(*eager, n));
        kiln_ms.push_back(run_block(*kiln, n));
      } else {
        kiln_ms.push_back(run_block(*kiln, n));
        eager_ms.push_back(run_block(*eager, n));
      }
    }
    const auto& st = kiln->compiled->stats();
    std::string how;
    if (!st.last_fallback.empty()) how = "no: " + st.last_fallback;
    else if (!kiln->compiled->last_step_compiled()) how = "no: the last step ran eagerly";
    else if (st.eager_steps != 1 + st.compiles) how = "no: " + std::to_string(st.eager_steps) + " eager steps";
    else how = "yes (" + std::to_string(st.compiles) + " capture" + (st.compiles > 1 ? "s" : "") + ")";
    if (how.rfind("yes", 0) != 0) all_compiled = false;
    if (how.size() > 28) how = how.substr(0, 25) + "...";
    double worst = 0;
    const auto se = eager->state(), sk = kiln->state();
    for (size_t i = 0; i < se.size() && i < sk.size(); ++i)
      worst = std::max(worst, rel_diff(sk[i].second, se[i].second));
    if (se.size() != sk.size()) worst = INFINITY;
    const double em = median(eager_ms), km = median(kiln_ms);
    const double probe_ms = st.compiled_steps > 0 ? 1000.0 * st.probe_seconds / st.compiled_steps : 0.0;
    std::printf("%-23s %5lld %10.3f %10.3f %8.2fx %13.3f %9.3f %6d %-28s %11.1e\n", e.name.c_str(),
                static_cast<long long>(b), em, km, em / km, first_ms / 1000.0, probe_ms, st.steps, how.c_str(), worst);
    std::fflush(stdout);
  }
  std::printf("\nload average at the end: %s\n", loadavg().c_str());
  std::printf(
      "speed-up: eager ms / kiln ms (above 1: kiln faster). kiln 1st 2 s: kiln's first two steps (eager\n"
      "warm-up + capture and compile), seconds. probe ms: host time per compiled step of the optimizer probe\n"
      "(included in kiln ms). steps: kiln steps run. max rel diff: largest ||kiln - eager|| / ||eager|| over\n"
      "parameters and buffers at the end (both copies draw the same random numbers).\n");
  return all_compiled ? 0 : 1;
}
