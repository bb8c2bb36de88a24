// `kiln bench WORKLOAD [options]`: LibTorch eager and kiln side by side in one process on a
// reference workload (docs/workloads.md). Prints eager and kiln ms per step (the median of five
// timed blocks of the steady state, each ending in one device sync, as docs/workloads.md and
// bench/reference.py time), their ratio and kiln's first-step seconds (the eager warm-up plus the
// capture-and-compile step), and what of the step the backend's own code ran: a backend whose every
// group fell back to kiln's eager executor trains right and proves nothing, so the report names it.
// --check trains both from the same initial weights for N steps and fails (exit 1) when a loss or a
// final parameter (with --check-grads: or its last gradient) differs beyond the tolerance, when a
// step ran eagerly, when the backend claimed groups and none of them, or not all that did not
// decline, compiled, or when the backend asked for ran nothing of the step (everything on kiln's
// eager executor; --backend eager aside). On CUDA it also reports each side's peak allocated memory, and --check makes
// CUDA deterministic (cuDNN's convolution backward, embedding backward's atomics and flash
// attention's backward are not, and eager would not even match itself). Time without --check.
// --kernels then profiles a few more steady-state steps of each side with LibTorch's profiler
// (bench_kernels.h): on CUDA the kernels a step runs, their GPU time and the generated kernels'
// share; on the CPU the ATen operator calls a step makes.
// --dynamic MIN:MAX (bench_dynamic.h) trains gpt or gpt-medium at a sequence length drawn per step
// instead: LibTorch eager, kiln with the configuration's dynamic setting, kiln one plan per shape and
// kiln at the mean length, in tokens per second, warm-up and steady state apart.
//
// One pass per stage: parse the flags, run both sides, compare them, print the report.
#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include "bench_ddp.h"
#include "bench_dynamic.h"
#include "bench_kernels.h"
#include "commands.h"
#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/memory.h"
#include "kiln/internal/backend.h"
#include "kiln/internal/command_line.h"
#include "kiln/workloads.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Parse ----

struct BenchOptions {
  std::string workload;
  std::string device = "cpu";
  std::string backend;  // "" = TrainingArguments' own (auto, or KILN_BACKEND)
  std::string mode = "default";
  std::string optimizer;
  std::string dtype;
  std::string attention;  // "" = math under --check, else LibTorch's choice
  std::vector<std::string> plugin_dirs;
  int steps = 20;
  int64_t batch = 0;      // 0 = the workload's size for the device
  double tolerance = -1;  // < 0: the default for the precision
  bool check = false, check_grads = false, json = false, interleave = false, trace = false, kernels = false;
  bool profiler_range = false;
  int nproc = 0;            // > 0: data-parallel ranks (bench_ddp.h)
  std::string ddp_backend;  // --ddp-backend
  bool ddp_child = false;   // one process of a --nproc run
  std::string dynamic;      // --dynamic MIN:MAX ("" = the fixed batch)
  int64_t min_length = 0, max_length = 0;
  uint64_t dynamic_seed = 1234;
  int same_length_rounds = 8;  // --same-length-rounds (with --dynamic)
};

// Fills `o` from the command line. Returns nothing when the benchmark is to run, else the exit
// status (0 after --help, 2 after a usage error, said on stderr).
std::optional<int> parse(int argc, char** argv, BenchOptions& o) {
  CLI::App app;
  setup_command(
      app, "kiln bench",
      "usage: kiln bench WORKLOAD [--backend B] [--mode M] [--device cpu|cuda] [--plugin-dir DIR]... "
      "[--steps N] [--batch N] [--optimizer O] [--dtype D] [--check] [--check-grads] [--tolerance X] [--attention A] "
      "[--trace] [--interleave] [--kernels] [--nproc N [--ddp-backend B]] [--dynamic MIN:MAX [--dynamic-seed S] "
      "[--same-length-rounds N]] "
      "[--json]",
      "Runs a reference workload (mlp, cnn, gpt, gpt-medium; docs/workloads.md in the kiln sources) with\n"
      "LibTorch eager and with kiln in this process and prints ms per step for both, the ratio, kiln's\n"
      "first-step time, and which nodes and groups the backend's own code ran and which fell back to eager,\n"
      "and why.");
  app.add_option("workload", o.workload, "mlp, cnn, gpt or gpt-medium")->type_name("WORKLOAD");
  app.add_option("--backend", o.backend,
                 "backend to ask for (default: auto; KILN_BACKEND, when set, wins as everywhere in kiln)")
      ->type_name("B");
  app.add_option("--mode", o.mode, "default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs")
      ->type_name("M");
  app.add_option("--device", o.device, "cpu (default) or cuda")->type_name("D");
  app.add_option("--plugin-dir", o.plugin_dirs,
                 "also look for backend plugins in D (repeatable; searched after KILN_PLUGIN_PATH)")
      ->option_text("D")
      ->allow_extra_args(false);
  CLI::Option* steps = app.add_option("--steps", o.steps,
                                      "steps per run (default 20, with --dynamic 120; at least 4: the eager warm-up,\n"
                                      "the capture, two timed)")
                           ->type_name("N")
                           ->transform(integer<int>(4));
  app.add_option("--batch", o.batch, "batch size (default: the workload's size for the device)")
      ->type_name("N")
      ->transform(integer<int64_t>(1));
  app.add_option("--optimizer", o.optimizer,
                 "sgd or adamw instead of the workload's own (to tell a model's effect from an\n"
                 "optimizer's)")
      ->type_name("O");
  app.add_option("--dtype", o.dtype,
                 "f32 (no autocast) or bf16 (bf16 autocast on the device; parameters and optimizer\n"
                 "stay float32) instead of the workload's own (gpt and gpt-medium on CUDA: bf16; else f32)")
      ->type_name("D");
  app.add_flag("--check", o.check,
               "also compare losses and final parameters; exit 1 beyond tolerance (and beyond ten\n"
               "times LibTorch eager's own spread from weights one ulp away), or when a step\n"
               "ran eagerly, or the backend's claimed groups failed to compile or all fell back,\n"
               "or the backend ran nothing of the step (everything on eager; --backend eager aside)");
  app.add_flag("--check-grads", o.check_grads, "--check, and the last step's gradients too");
  app.add_option("--tolerance", o.tolerance,
                 "relative error allowed by --check (default: float32 1e-5, or 1e-4 when the\n"
                 "backend runs generated kernels (inductor); bf16 autocast 1e-2)")
      ->type_name("X")
      ->transform(non_negative_number());
  app.add_option("--attention", o.attention,
                 "on CUDA, the attention kernels both sides may use: math, flash, efficient, cudnn or\n"
                 "all (LibTorch's own choice). Default: math under --check (deterministic, so eager\n"
                 "matches itself), else all. With another under --check, the fast kernels a real\n"
                 "step runs are checked against the noise floor")
      ->type_name("A");
  app.add_flag("--trace", o.trace, "print both losses of every step on stderr (how a difference starts and grows)");
  app.add_flag("--interleave", o.interleave,
               "run eager and kiln steps in turn (fairer on a machine whose load changes)");
  app.add_flag("--kernels", o.kernels,
               "after the timed steps (and --check), profile 5 more steady-state steps of each side\n"
               "with LibTorch's profiler (Kineto) and report, on CUDA: kernels per step, eager and\n"
               "kiln, with memcpy/memset and the host's launch calls (one cudaGraphLaunch per\n"
               "replayed CUDA graph; its kernels are counted one by one), GPU busy time per step,\n"
               "the share of the kernels' time in kiln's generated kernels (kiln_k<N>, kiln_h<N>) and\n"
               "the longest kernels, and the device's idle time inside the steps with its largest\n"
               "gaps by the pair of activities around them. On the CPU kiln's generated kernels are\n"
               "plain functions the profiler does not see: it reports ATen operator calls per step\n"
               "(outermost) and their host time instead. Without a working profiler (no Kineto, or no CUPTI for\n"
               "CUDA) it says so and the rest of the report stands. Profiling slows the steps:\n"
               "its times are not the ms/step above");
  app.add_flag("--profiler-range", o.profiler_range,
               "last, run one more kiln step between cudaProfilerStart and cudaProfilerStop, so\n"
               "that `ncu --profile-from-start off kiln bench ...` profiles exactly one steady-state\n"
               "step (CUDA only)");
  app.add_option("--nproc", o.nproc,
                 "data parallelism: train through kiln::Trainer on N ranks of this machine (Gloo on the\n"
                 "CPU, NCCL with a GPU per rank), next to one process on the same batch a process, eager\n"
                 "and compiled; report ms per step, examples per second and communication's share of\n"
                 "the step. Not with --check, --kernels, --interleave, --trace or --profiler-range")
      ->type_name("N")
      ->transform(integer<int>(1, 64));
  app.add_option("--ddp-backend", o.ddp_backend, "with --nproc: gloo or nccl (default: nccl on CUDA, else gloo)")
      ->type_name("B");
  app.add_flag("--ddp-child", o.ddp_child)->group("");  // a process of a --nproc run (the launcher passes it)
  app.add_option("--dynamic", o.dynamic,
                 "gpt or gpt-medium at a sequence length drawn per step, uniformly from [MIN, MAX] (MAX at\n"
                 "most the block size: gpt 64 on the CPU, 256 on CUDA; gpt-medium 128 and 1024) from a\n"
                 "fixed seed that bench/reference.py --dynamic draws alike. Compares, in tokens per\n"
                 "second with warm-up and steady state apart: LibTorch eager, kiln with the\n"
                 "configuration's dynamic setting (KILN_DYNAMIC), kiln with dynamic = false (one plan per\n"
                 "shape), and kiln at the mean length every step. Not with --interleave, --kernels,\n"
                 "--profiler-range or --nproc")
      ->type_name("MIN:MAX");
  app.add_option("--dynamic-seed", o.dynamic_seed, "with --dynamic: the seed of the lengths (default 1234)")
      ->type_name("S")
      ->transform(integer<uint64_t>());
  app.add_option("--same-length-rounds", o.same_length_rounds,
                 "with --dynamic: rounds per length of the same-length comparison at MIN, the mean and\n"
                 "MAX (the dynamic step against a static plan made for that length; default 8, 0: none)")
      ->type_name("N")
      ->transform(integer<int>(0, 1000));
  app.add_flag("--json", o.json, "one JSON object on stdout");
  if (auto status = parse_command_line(app, argc, argv)) return status;
  o.check = o.check || o.check_grads;
  const auto& names = workload_names();
  std::string valid;  // "mlp, cnn, gpt, gpt-medium"
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  if (o.workload.empty()) return usage_error(app, "which workload? (" + valid + ")");
  if (std::find(names.begin(), names.end(), o.workload) == names.end())
    return usage_error(app, "unknown workload '" + o.workload + "'; valid workloads: " + valid);
  if (o.device != "cpu" && o.device != "cuda") return usage_error(app, "--device '" + o.device + "': use cpu or cuda");
  if (!o.optimizer.empty() && o.optimizer != "sgd" && o.optimizer != "adamw")
    return usage_error(app, "--optimizer '" + o.optimizer + "': use sgd or adamw");
  if (!o.attention.empty() && o.attention != "math" && o.attention != "flash" && o.attention != "efficient" &&
      o.attention != "cudnn" && o.attention != "all")
    return usage_error(app, "--attention '" + o.attention + "': use math, flash, efficient, cudnn or all");
  if (!o.dtype.empty() && o.dtype != "f32" && o.dtype != "bf16")
    return usage_error(app, "--dtype '" + o.dtype + "': use f32 or bf16");
  if (!o.ddp_backend.empty() && o.ddp_backend != "gloo" && o.ddp_backend != "nccl")
    return usage_error(app, "--ddp-backend '" + o.ddp_backend + "': use gloo or nccl");
  if (!o.ddp_backend.empty() && o.nproc == 0 && !o.ddp_child) return usage_error(app, "--ddp-backend needs --nproc");
  if (o.nproc > 0 && (o.check || o.kernels || o.interleave || o.trace || o.profiler_range))
    return usage_error(app,
                       "--nproc measures time only: not with --check, --kernels, --interleave, --trace or "
                       "--profiler-range");
  if (app.count("--dynamic-seed") > 0 && app.count("--dynamic") == 0)
    return usage_error(app, "--dynamic-seed needs --dynamic");
  if (app.count("--same-length-rounds") > 0 && app.count("--dynamic") == 0)
    return usage_error(app, "--same-length-rounds needs --dynamic");
  if (app.count("--dynamic") > 0) {
    if (const std::string bad = parse_dynamic_range(o.dynamic, &o.min_length, &o.max_length); !bad.empty())
      return usage_error(app, bad);
    const int64_t block = workload_block_size(o.workload, o.device);
    if (block == 0)
      return usage_error(app, "--dynamic '" + o.dynamic + "': " + o.workload +
                                  " has no sequence length; --dynamic is for gpt and gpt-medium");
    if (o.max_length > block)
      return usage_error(app, "--dynamic '" + o.dynamic + "': MAX (" + std::to_string(o.max_length) + ") is above " +
                                  o.workload + "'s block size on " + o.device + " (" + std::to_string(block) + ")");
    if (o.nproc > 0 || o.interleave || o.kernels || o.profiler_range)
      return usage_error(app, "--dynamic: not with --interleave, --kernels, --profiler-range or --nproc");
    if (steps->count() == 0) o.steps = 120;
  }
  return std::nullopt;
}

// ---- Run ----

struct Run {
  std::vector<double> ms;      // the first kFirstSteps steps, each synchronised, then one entry per block
  std::vector<float> losses;   // every step's
  double faults_per_step = 0;  // minor page faults of the process per steady-state step
  double peak_mb = 0;          // peak allocated above what was allocated when the side started
  double retained_mb = 0;      // allocated after its last step, above the same start (held between steps)
  double first_peak_mb = 0;    // the peak during the first steps (warm-up, capture, compile), above the start
  double steady_peak_mb = 0;   // the peak during the steps after them, above the start
  double host_ms = 0;          // CUDA: the host's time per step within a block, before its sync (median block)
};

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Peak allocated memory of one side's run, above what was allocated when it started, and what it
// still holds after its last step: CUDA's caching allocator's statistics, or on the CPU kiln's
// counting (cpu_block_cache.h: the bench runs under a ScopedCpuMemoryMeter, so that both sides'
// tensors, the model and optimizer state included, are counted the same way).
struct PeakMemory {
  bool cuda;
  int64_t base = 0;
  int64_t allocated() const { return cuda ? cuda_allocated_bytes(0) : cpu_allocated_bytes(); }
  void start() {
    if (cuda) {
      torch::cuda::synchronize();
      cuda_reset_peak_allocated(0);
    } else {
      cpu_reset_peak_allocated();
    }
    base = allocated();
  }
  // The peak since start() or the last steady(), above the start, in MiB.
  double peak_mb() const {
    if (cuda) torch::cuda::synchronize();
    const int64_t peak = cuda ? cuda_peak_allocated_bytes(0) : cpu_peak_allocated_bytes();
    return static_cast<double>(peak - base) / (1 << 20);
  }
  // After the first steps (warm-up, capture, compile): the peak from here on is the steady state's.
  void steady(Run& r) const {
    r.first_peak_mb = peak_mb();
    if (cuda) cuda_reset_peak_allocated(0);
    else cpu_reset_peak_allocated();
  }
  void finish(Run& r) const {
    r.steady_peak_mb = peak_mb();
    r.peak_mb = std::max(r.first_peak_mb, r.steady_peak_mb);
    r.retained_mb = static_cast<double>(allocated() - base) / (1 << 20);
  }
};

// Steps timed one by one (the eager warm-up, the capture and compile, a CUDA graph's recording).
constexpr int kFirstSteps = 3;

// Runs `steps` steps as docs/workloads.md measures: the first kFirstSteps one at a time, each ending
// in a device sync; the rest in (up to) five timed blocks, each ending in one sync, so that the host
// may run ahead of the device within a block as it does in a training loop. The losses are read
// after each block (kiln's results are copies, an eager step's loss is a new tensor).
template <class F>
Run run_steps(F&& step, Workload& w, int steps, const PeakMemory* mem = nullptr) {
  Run r;
  int s = 0;
  for (; s < std::min(steps, kFirstSteps); ++s) {
    const auto t = Clock::now();
    auto loss = step(std::vector<at::Tensor>{w.input, w.target})[0];
    r.losses.push_back(loss.template item<float>());
    r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  if (mem) mem->steady(r);
  const int rest = steps - s, blocks = std::min(5, rest);
  const long f0 = minor_faults();
  std::vector<double> host;
  for (int b = 0; b < blocks; ++b) {
    const int n = rest / blocks + (b < rest % blocks ? 1 : 0);
    std::vector<at::Tensor> losses;
    const auto t = Clock::now();
    for (int k = 0; k < n; ++k) losses.push_back(step(std::vector<at::Tensor>{w.input, w.target})[0]);
    if (losses.back().is_cuda()) {
      // What the host spent issuing the block: close to the step time, the side is bound by the host.
      host.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count() / n);
      torch::cuda::synchronize();
    }
    r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count() / n);
    for (const auto& l : losses) r.losses.push_back(l.template item<float>());
  }
  if (!host.empty()) {
    std::sort(host.begin(), host.end());
    r.host_ms = host[host.size() / 2];
  }
  if (rest > 0) r.faults_per_step = static_cast<double>(minor_faults() - f0) / rest;
  return r;
}

// The same, eager and kiln taking turns step by step, so that a machine whose load changes during
// the run slows both sides alike (--interleave).
template <class E, class K>
void run_interleaved(E&& eager_step, Workload& ew, K&& kiln_step, Workload& kw, int steps, Run* eager, Run* kiln) {
  for (int s = 0; s < steps; ++s) {
    for (int side = 0; side < 2; ++side) {
      Run& r = side == 0 ? *eager : *kiln;
      Workload& w = side == 0 ? ew : kw;
      const auto t = Clock::now();
      auto loss = (side == 0 ? eager_step(std::vector<at::Tensor>{w.input, w.target})
                             : kiln_step(std::vector<at::Tensor>{w.input, w.target}))[0];
      r.losses.push_back(loss.template item<float>());
      r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    }
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct BenchRun {
  std::string requested;  // the backend asked for, after the environment
  std::string chosen;     // the backend the selection chose ("eager" when none)
  std::string why;        // the selection's reasons
  // The workloads stay alive for compare(): the final parameters and gradients of both sides.
  std::unique_ptr<ScopedCpuMemoryMeter> cpu_meter;  // first, so that it outlives the workloads
  std::unique_ptr<Workload> eager_w, kiln_w;
  // --check: LibTorch eager again from weights one unit in the last place away, the trajectory's
  // own conditioning (the noise floor compare() judges against).
  std::unique_ptr<Workload> noisy_w;
  // Both steps stay alive for --kernels, which runs more of them after the report's numbers.
  WorkloadStep eager_step;
  std::unique_ptr<CompiledStep> compiled;
  Run eager, kiln, noisy;
  StepStats stats;
  int phase_nodes[3] = {0, 0, 0};  // captured forward, backward, optimizer
  size_t compiled_nodes = 0;       // the compiled (pure) graph's nodes
};

BenchRun run(const BenchOptions& o) {
  if (o.device == "cuda" && o.check) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);  // before the first cuBLAS handle
    auto& ctx = at::globalContext();
    ctx.setDeterministicCuDNN(true);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  const std::string attention = !o.attention.empty() ? o.attention : o.check ? "math" : "all";
  if (o.device == "cuda" && attention != "all") {
    auto& ctx = at::globalContext();
    ctx.setSDPUseMath(attention == "math");
    ctx.setSDPUseFlash(attention == "flash");
    ctx.setSDPUseMemEfficient(attention == "efficient");
    ctx.setSDPUseCuDNN(attention == "cudnn");
  }
  TrainingArguments args;
  args.torch_compile = true;
  args.log_level = "warn";  // the report is the output; KILN_LOG_LEVEL still overrides
  if (!o.backend.empty()) args.torch_compile_backend = o.backend;
  args.torch_compile_mode = o.mode;
  args.runtime.plugin_dirs = o.plugin_dirs;
  // The environment wins over code, as in compile_step (docs/config.md): applied here too so that
  // the report names the backend that was really asked for.
  args.apply_env();
  args.validate();

  BenchRun r;
  // On the CPU, every tensor of the run (both sides' models, optimizer states and steps) is
  // allocated through kiln's counting allocator, so that the peaks below are measured alike.
  r.cpu_meter = std::make_unique<ScopedCpuMemoryMeter>();
  r.requested = args.torch_compile_backend;
  const uint64_t seed = 1234;
  r.eager_w = std::make_unique<Workload>(make_workload(o.workload, {o.device, seed, o.batch, o.optimizer, o.dtype}));
  r.kiln_w = std::make_unique<Workload>(make_workload(o.workload, {o.device, seed, o.batch, o.optimizer, o.dtype}));
  r.eager_step = workload_step(*r.eager_w);
  r.compiled = std::make_unique<CompiledStep>(
      compile_step(workload_step(*r.kiln_w), {{r.kiln_w->model}, {r.kiln_w->optimizer.get()}}, args));
  auto& eager_step = r.eager_step;
  auto& compiled = *r.compiled;
  r.chosen = compiled.backend();
  for (const auto& reason : compiled.backend_reasons()) r.why += (r.why.empty() ? "" : "; ") + reason;

  if (o.interleave) {
    run_interleaved(eager_step, *r.eager_w, compiled, *r.kiln_w, o.steps, &r.eager, &r.kiln);
  } else {
    PeakMemory mem{o.device == "cuda"};
    mem.start();
    r.eager = run_steps(eager_step, *r.eager_w, o.steps, &mem);
    mem.finish(r.eager);
    mem.start();
    r.kiln = run_steps(compiled, *r.kiln_w, o.steps, &mem);
    mem.finish(r.kiln);
  }
  if (o.check) {
    r.noisy_w = std::make_unique<Workload>(make_workload(o.workload, {o.device, seed, o.batch, o.optimizer, o.dtype}));
    {
      at::NoGradGuard no_grad;
      for (auto& p : r.noisy_w->model->parameters())
        if (at::isFloatingType(p.scalar_type())) p.mul_(1 + std::ldexp(1.0, -23) * (2 * at::rand_like(p) - 1));
    }
    r.noisy = run_steps(workload_step(*r.noisy_w), *r.noisy_w, o.steps);
  }
  r.stats = compiled.stats();
  if (const auto* graph = compiled.captured_graph())
    for (const auto& n : graph->nodes)
      r.phase_nodes[n.phase == ir::Phase::Forward ? 0 : n.phase == ir::Phase::Backward ? 1 : 2]++;
  r.compiled_nodes = compiled.compiled_graph() ? compiled.compiled_graph()->nodes.size() : 0;
  return r;
}

// ---- Compare ----

// What of the compiled step the backend's own code ran, and everything that fell back to eager.
struct BackendUse {
  size_t groups = 0;         // groups the backend claimed
  size_t groups_run = 0;     // of them, compiled: the backend's code runs them
  size_t nodes_run = 0;      // nodes in those groups
  size_t groups_failed = 0;  // compile failed with an error other than a decline
  std::vector<GroupOutcome> fell_back;
  bool ran = false;      // any of the backend's code ran (groups, or whole-step device graphs)
  std::string runs_on;   // the backend's name when its code ran, else "eager"
  std::string fallback;  // everything that fell back and why; "" only when nothing did
};

BackendUse backend_use(const BenchOptions& o, const BenchRun& r) {
  const StepStats& st = r.stats;
  BackendUse u;
  std::map<std::string, std::pair<size_t, size_t>> by_reason;  // reason -> (groups, nodes)
  for (const auto& g : st.groups) {
    ++u.groups;
    if (g.compiled) {
      ++u.groups_run;
      u.nodes_run += g.nodes;
      continue;
    }
    if (!g.declined) ++u.groups_failed;
    u.fell_back.push_back(g);
    auto& [n_groups, n_nodes] = by_reason[g.reason];
    ++n_groups;
    n_nodes += g.nodes;
  }
  const bool steps_compiled = st.compiled_steps > 0;
  u.ran = r.chosen != "eager" && steps_compiled && (u.groups_run > 0 || st.graphs_recorded > 0);
  u.runs_on = u.ran ? r.chosen : "eager";

  std::vector<std::string> parts;
  if (r.chosen == "eager" && r.requested != "eager")
    parts.push_back("no backend runs here (" + (r.why.empty() ? std::string("none chosen") : r.why) + ")");
  if (st.compiled_steps < o.steps - 2)
    parts.push_back(std::to_string(o.steps - 2 - st.compiled_steps) + " of " + std::to_string(o.steps - 2) +
                    " steps after the capture ran eagerly" + (st.last_fallback.empty() ? "" : ": " + st.last_fallback));
  else if (!st.last_fallback.empty()) parts.push_back(st.last_fallback);
  if (!u.fell_back.empty()) {
    std::string s = std::to_string(u.fell_back.size()) + " of " + std::to_string(u.groups) +
                    " groups ran on kiln's eager executor:";
    for (const auto& [reason, counts] : by_reason)
      s +=
          " " + std::to_string(counts.first) + " (" + std::to_string(counts.second) + " nodes) because " + reason + ";";
    s.pop_back();
    parts.push_back(s);
  }
  if (r.chosen != "eager" && steps_compiled && u.groups == 0 && st.graphs_recorded == 0)
    parts.push_back(r.chosen + " claimed none of the " + std::to_string(r.compiled_nodes) +
                    " nodes: kiln's eager executor ran the whole step");
  if (!st.last_graph_skip.empty()) parts.push_back(st.last_graph_skip);
  for (const auto& p : parts) u.fallback += (u.fallback.empty() ? "" : "; ") + p;
  return u;
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  auto o = out.detach().to(at::kDouble).cpu(), r = ref.detach().to(at::kDouble).cpu();
  const double num = (o - r).norm().item<double>();
  const double den = r.norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return den == 0 ? num : num / den;
}

struct Comparison {
  bool ok = true;
  std::string failure;  // why --check failed ("" when it passed)
  double tolerance = 0;
  double worst_loss = 0, worst_param = 0;
  // The noise floor (LibTorch eager from weights one ulp away) at the worst loss and parameter.
  double worst_loss_floor = 0, worst_param_floor = 0;
  std::string worst_param_name;
  int first_loss_diff = -1;  // the first step whose losses are not bit-identical (1-based)
};

Comparison compare(const BenchOptions& o, const BenchRun& r, const BackendUse& u) {
  Comparison c;
  // Generated kernels (inductor's, on the CPU and on CUDA) fuse and reorder float arithmetic: kiln
  // holds them to 1e-4 over 20 steps; ATen's own kernels (the eager executor, CUDA graphs of it)
  // to 1e-5.
  // inductor's kernels or XLA's (neuron, through PJRT), alone or composed ("ipex+inductor").
  bool generated_code = false;
  for (const auto& part : split_backends(u.runs_on))
    generated_code = generated_code || part == "inductor" || part == "neuron";
  c.tolerance = o.tolerance >= 0 ? o.tolerance : r.kiln_w->autocast_bf16 ? 1e-2 : generated_code ? 1e-4 : 1e-5;
  // A loss or parameter whose trajectory is ill-conditioned is judged against the noise floor:
  // ten times how far LibTorch eager itself moves from weights one ulp away. A parameter whose
  // gradient is zero in exact arithmetic (the key bias of attention: softmax ignores a shift
  // common to every key) has a gradient of pure rounding noise, which AdamW scales up to full
  // updates, so any reordering moves it as far as the learning rate; the conformance suite's
  // workload cases judge the same way. With --tolerance given, the tolerance alone decides.
  const bool floor_applies = o.tolerance < 0 && r.noisy_w != nullptr;
  double worst_excess = 0;  // the largest error / allowed error
  auto judge = [&](double err, double floor, double* worst, double* worst_floor, std::string* name,
                   const std::string& what) {
    const double allowed = floor_applies ? std::max(c.tolerance, 10 * floor) : c.tolerance;
    if (err > *worst) *worst = err, *worst_floor = floor, *name = what;
    worst_excess = std::max(worst_excess, std::isnan(err) ? INFINITY : err / allowed);
  };
  std::string unused;
  for (int s = 0; s < o.steps; ++s) {
    const size_t i = static_cast<size_t>(s);
    const double e = r.eager.losses[i], k = r.kiln.losses[i];
    auto rel = [e](double v) { return std::isnan(v) ? INFINITY : std::fabs(v - e) / std::max(std::fabs(e), 1e-12); };
    judge(rel(k), r.noisy_w ? rel(r.noisy.losses[i]) : 0.0, &c.worst_loss, &c.worst_loss_floor, &unused, "");
    if (c.first_loss_diff < 0 && e != k) c.first_loss_diff = s + 1;
  }
  auto pe = r.eager_w->model->named_parameters(), pk = r.kiln_w->model->named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> pn;
  if (r.noisy_w)
    for (const auto& p : r.noisy_w->model->named_parameters()) pn.emplace_back(p.key(), p.value());
  for (size_t i = 0; i < pe.size(); ++i) {
    const double floor = pn.empty() ? 0.0 : rel_err(pn[i].second, pe[i].value());
    judge(rel_err(pk[i].value(), pe[i].value()), floor, &c.worst_param, &c.worst_param_floor, &c.worst_param_name,
          pe[i].key());
    // --check-grads: the last step's gradients too (kiln puts them in .grad like an eager step).
    // Not by default: a last-step gradient can be ill-conditioned (cnn's after ~14 steps on one
    // batch: LibTorch eager on 1 thread against 2 threads differs by 5e-3 there), while the
    // losses and parameters stay within 1e-6.
    if (!o.check_grads) continue;
    const at::Tensor ge = pe[i].value().grad(), gk = pk[i].value().grad();
    if (ge.defined() != gk.defined()) {
      c.worst_param = INFINITY, c.worst_param_name = pe[i].key() + ".grad (defined on one side only)";
      worst_excess = INFINITY;
    } else if (ge.defined()) {
      const at::Tensor gn = pn.empty() ? at::Tensor() : pn[i].second.grad();
      judge(rel_err(gk, ge), gn.defined() ? rel_err(gn, ge) : 0.0, &c.worst_param, &c.worst_param_floor,
            &c.worst_param_name, pe[i].key() + ".grad");
    }
  }
  // The numbers prove something of the backend only when its code computed them.
  if (worst_excess > 1) c.failure = floor_applies ? "beyond tolerance and noise floor" : "beyond tolerance";
  else if (r.stats.compiled_steps != o.steps - 2) c.failure = "steps ran eagerly";
  else if (u.groups_failed > 0) c.failure = std::to_string(u.groups_failed) + " claimed groups failed to compile";
  else if (u.groups > 0 && u.groups_run == 0)
    c.failure = r.chosen + " compiled none of the " + std::to_string(u.groups) + " groups it claimed";
  // Nothing of the backend asked for ran (it claimed no node and recorded no device graph, or no
  // backend runs here): kiln's eager executor computed the whole step, so the numbers match eager
  // and prove nothing of it. Asking for eager itself is the one run where that is the point.
  else if (!u.ran && r.requested != "eager")
    c.failure = (r.chosen != "eager" ? r.chosen : "backend '" + r.requested + "'") +
                " ran nothing of the step (runs on: eager)" + (u.fallback.empty() ? "" : ": " + u.fallback);
  c.ok = c.failure.empty();
  return c;
}

// ---- Profile (--kernels) ----

constexpr int kKernelSteps = 5;    // profiled steps per side, after one lead-in step
constexpr size_t kTopKernels = 8;  // the longest kernels (CPU: operators) printed per side

struct KernelReport {
  bool cuda = false;
  bool ok = false;
  std::string reason;  // why there are no numbers (ok == false)
  KernelSummary eager, kiln;
  int kiln_eager_steps = 0;  // profiled kiln steps (lead-in included) that did not run the compiled step
};

KernelReport profile_kernels(const BenchOptions& o, BenchRun& r) {
  KernelReport k;
  k.cuda = o.device == "cuda";
  Workload& ew = *r.eager_w;
  Workload& kw = *r.kiln_w;
  const auto eager_one = [&] { (void)r.eager_step(std::vector<at::Tensor>{ew.input, ew.target}); };
  const auto kiln_one = [&] {
    (void)(*r.compiled)(std::vector<at::Tensor>{kw.input, kw.target});
    if (!r.compiled->last_step_compiled()) ++k.kiln_eager_steps;
  };
  const ProfileCapture ce = profile_steps(eager_one, k.cuda, 1, kKernelSteps);
  const ProfileCapture ck = ce.ok ? profile_steps(kiln_one, k.cuda, 1, kKernelSteps) : ce;
  k.eager = k.cuda ? summarize_cuda(ce, kTopKernels) : summarize_cpu(ce, kTopKernels);
  k.kiln = k.cuda ? summarize_cuda(ck, kTopKernels) : summarize_cpu(ck, kTopKernels);
  if (!ce.ok) k.reason = ce.error;
  else if (!ck.ok) k.reason = ck.error;
  else if (!k.eager.ok) k.reason = k.eager.note;
  else if (!k.kiln.ok)
    k.reason =
        "the profiler recorded eager's steps but nothing of kiln's" +
        std::string(r.stats.graphs_recorded > 0 ? ", which replay a CUDA graph: CUPTI reported none of its kernels"
                                                : "") +
        (k.kiln.note.empty() ? "" : " (" + k.kiln.note + ")");
  k.ok = k.reason.empty();
  return k;
}

// ---- One step for an external profiler (--profiler-range) ----

// cudaProfilerStart/Stop come from the CUDA runtime LibTorch has already loaded (looked up at run
// time: the command links no CUDA library of its own).
void profiler_range_step(const BenchOptions& o, BenchRun& r) {
  using Fn = int (*)();
  const auto start = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaProfilerStart"));
  const auto stop = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaProfilerStop"));
  if (o.device != "cuda" || !start || !stop) {
    std::fprintf(stderr, "kiln bench: --profiler-range: %s\n",
                 o.device != "cuda" ? "needs --device cuda" : "the CUDA runtime's cudaProfilerStart is not loaded");
    return;
  }
  Workload& kw = *r.kiln_w;
  torch::cuda::synchronize();
  start();
  (void)(*r.compiled)(std::vector<at::Tensor>{kw.input, kw.target});
  torch::cuda::synchronize();
  stop();
  std::fprintf(stderr, "kiln bench: --profiler-range: one %s step profiled\n",
               r.compiled->last_step_compiled() ? "compiled" : "eager (not compiled!)");
}

// ---- Print ----

void print_trace(const BenchOptions& o, const BenchRun& r) {
  for (int s = 0; s < o.steps; ++s) {
    const double e = r.eager.losses[static_cast<size_t>(s)], k = r.kiln.losses[static_cast<size_t>(s)];
    const double err = std::isnan(k) ? INFINITY : std::fabs(k - e) / std::max(std::fabs(e), 1e-12);
    if (r.noisy_w) {
      const double n = r.noisy.losses[static_cast<size_t>(s)];
      std::fprintf(stderr, "kiln bench: step %3d  eager %.9g  kiln %.9g  rel %.3e  (eager one ulp away: rel %.3e)\n",
                   s + 1, e, k, err, std::fabs(n - e) / std::max(std::fabs(e), 1e-12));
    } else {
      std::fprintf(stderr, "kiln bench: step %3d  eager %.9g  kiln %.9g  rel %.3e\n", s + 1, e, k, err);
    }
  }
}

struct Timing {
  double eager_ms, kiln_ms, first_s, probe_ms;
};

Timing timing(const BenchRun& r) {
  Timing t;
  // Steady state: the blocks (--interleave: every step after the first kFirstSteps).
  t.eager_ms = median(std::vector<double>(r.eager.ms.begin() + kFirstSteps, r.eager.ms.end()));
  t.kiln_ms = median(std::vector<double>(r.kiln.ms.begin() + kFirstSteps, r.kiln.ms.end()));
  // With a CUDA graph, the first compiled step also warms up and records it.
  t.first_s = (r.kiln.ms[0] + r.kiln.ms[1] + (r.stats.graphs_recorded > 0 ? r.kiln.ms[2] : 0.0)) / 1000.0;
  const auto& st = r.stats;
  t.probe_ms = st.compiled_steps > 1 ? 1000.0 * st.probe_seconds / (st.compiled_steps - 1) : 0.0;
  return t;
}

void print_json(const BenchOptions& o, const BenchRun& r, const BackendUse& u, const Comparison* c,
                const KernelReport* k) {
  const Timing t = timing(r);
  const auto& st = r.stats;
  Json j = {{"workload", o.workload},
            {"device", o.device},
            {"autocast_bf16", r.kiln_w->autocast_bf16},
            {"steps", o.steps},
            {"backend_requested", r.requested},
            {"backend_selected", r.chosen},
            {"backend_reasons", r.why},
            {"runs_on", u.runs_on},
            {"mode", o.mode},
            {"eager_ms", rounded(t.eager_ms, 4)},
            {"kiln_ms", rounded(t.kiln_ms, 4)},
            {"ratio", rounded(t.eager_ms / t.kiln_ms, 4)},
            {"kiln_first_step_s", rounded(t.first_s, 4)},
            {"compiled_steps", st.compiled_steps},
            {"compiles", st.compiles},
            {"rebuilds", st.rebuilds},
            {"captured_nodes",
             {{"forward", r.phase_nodes[0]}, {"backward", r.phase_nodes[1]}, {"optimizer", r.phase_nodes[2]}}},
            {"compiled_nodes", r.compiled_nodes},
            {"backend_nodes", u.nodes_run},
            {"backend_groups", u.groups_run},
            {"claimed_groups", u.groups}};
  j["fallback_groups"] = Json::array();
  for (const auto& g : u.fell_back)
    j["fallback_groups"].push_back(
        {{"nodes", g.nodes}, {"first_op", g.first_op}, {"declined", g.declined}, {"reason", g.reason}});
  j["fallback"] = u.fallback;
  j["graphs_recorded"] = st.graphs_recorded;
  j["graph_replays"] = st.graph_replays;
  j["graph_skip"] = st.last_graph_skip;
  j["eager_peak_mb"] = rounded(r.eager.peak_mb, 1);
  j["kiln_peak_mb"] = rounded(r.kiln.peak_mb, 1);
  j["eager_steady_peak_mb"] = rounded(r.eager.steady_peak_mb, 1);
  j["kiln_steady_peak_mb"] = rounded(r.kiln.steady_peak_mb, 1);
  j["eager_first_steps_peak_mb"] = rounded(r.eager.first_peak_mb, 1);
  j["kiln_first_steps_peak_mb"] = rounded(r.kiln.first_peak_mb, 1);
  j["eager_retained_mb"] = rounded(r.eager.retained_mb, 1);
  j["kiln_retained_mb"] = rounded(r.kiln.retained_mb, 1);
  j["eager_host_ms_per_step"] = rounded(r.eager.host_ms, 4);
  j["kiln_host_ms_per_step"] = rounded(r.kiln.host_ms, 4);
  j["probe_ms_per_step"] = rounded(t.probe_ms, 4);
  j["adopted_writebacks"] = static_cast<int64_t>(st.adopted_writebacks);
  j["copied_writebacks"] = static_cast<int64_t>(st.copied_writebacks);
  j["eager_page_faults_per_step"] = rounded(r.eager.faults_per_step, 0);
  j["kiln_page_faults_per_step"] = rounded(r.kiln.faults_per_step, 0);
  if (c)
    j["check"] = {{"ok", c->ok},
                  {"failure", c->failure},
                  {"tolerance", significant(c->tolerance, 6)},
                  {"max_loss_rel_err", significant(c->worst_loss, 4)},
                  {"max_param_rel_err", significant(c->worst_param, 4)},
                  {"worst_param", c->worst_param_name},
                  {"first_loss_diff_step", c->first_loss_diff},
                  {"loss_noise_floor", significant(c->worst_loss_floor, 4)},
                  {"param_noise_floor", significant(c->worst_param_floor, 4)}};
  if (k)
    j["kernels"] = {{"ok", k->ok},
                    {"reason", k->reason},
                    {"unit", k->cuda ? "cuda_kernels" : "aten_ops"},
                    {"profiled_steps", kKernelSteps},
                    {"kiln_eager_steps", k->kiln_eager_steps},
                    {"eager", summary_json(k->eager, k->cuda)},
                    {"kiln", summary_json(k->kiln, k->cuda)}};
  std::printf("%s\n", json_text(j).c_str());
}

std::string shorten(const std::string& name, size_t n = 100) {
  return name.size() <= n ? name : name.substr(0, n - 3) + "...";
}

void print_top(const char* side, const KernelSummary& s, bool cuda) {
  if (s.top.empty()) return;
  std::printf("    longest %s of %s (per step):\n", cuda ? "kernels" : "operators", side);
  for (const auto& t : s.top)
    std::printf("      %10.1f us %7.2f x  %-12s %s\n", t.us_per_step, t.per_step, cuda ? origin_name(t.origin) : "",
                shorten(t.name).c_str());
  if (!cuda || s.gaps.empty()) return;
  std::printf("    device idle inside %s's steps: %.1f us per step; the largest gaps (per step, after -> before):\n",
              side, s.idle_us_per_step);
  for (const auto& gap : s.gaps)
    std::printf("      %10.1f us %7.2f x  %s -> %s\n", gap.us_per_step, gap.per_step, shorten(gap.before, 60).c_str(),
                shorten(gap.after, 60).c_str());
}

void print_kernels(const KernelReport& k) {
  if (!k.ok) {
    std::printf("  kernels: not measured: %s\n", k.reason.c_str());
    return;
  }
  const KernelSummary &e = k.eager, &g = k.kiln;
  const char* how = e.windowed && g.windowed ? "" : " (see the notes)";
  if (!k.cuda) {
    std::printf(
        "  operators (LibTorch profiler, %d steady-state steps each side%s; the CPU has no kernel launches to count:\n"
        "  kiln's generated kernels are functions the profiler does not see):\n"
        "    ATen operator calls per step (outermost): eager %.1f, kiln %.1f\n"
        "    host time in them per step: eager %.3f ms, kiln %.3f ms\n",
        kKernelSteps, how, e.kernels_per_step, g.kernels_per_step, e.kernel_us_per_step / 1e3,
        g.kernel_us_per_step / 1e3);
  } else {
    std::printf(
        "  kernels (LibTorch profiler, %d steady-state steps each side%s; profiling slows the steps):\n"
        "                                 eager        kiln\n"
        "    kernels per step         %10.1f  %10.1f   (kiln: %.1f generated, %.1f kiln runtime)\n"
        "    memcpy/memset per step   %10.1f  %10.1f\n"
        "    launch calls per step    %10.1f  %10.1f   (graph launches: eager %.1f, kiln %.1f)\n"
        "    GPU busy per step        %10.3f  %10.3f ms\n"
        "    kernel time per step     %10.3f  %10.3f ms\n"
        "    generated kernels' share of kiln's kernel time: %.1f %% (%.3f ms per step)\n",
        kKernelSteps, how, e.kernels_per_step, g.kernels_per_step, g.generated_per_step, g.kiln_runtime_per_step,
        e.copies_per_step, g.copies_per_step, e.launch_calls_per_step, g.launch_calls_per_step,
        e.graph_launches_per_step, g.graph_launches_per_step, e.busy_us_per_step / 1e3, g.busy_us_per_step / 1e3,
        e.kernel_us_per_step / 1e3, g.kernel_us_per_step / 1e3, 100 * g.generated_share, g.generated_us_per_step / 1e3);
  }
  if (k.kiln_eager_steps > 0)
    std::printf("    note: %d of kiln's %d profiled steps did not run the compiled step\n", k.kiln_eager_steps,
                kKernelSteps + 1);
  if (!e.note.empty()) std::printf("    note (eager): %s\n", e.note.c_str());
  if (!g.note.empty()) std::printf("    note (kiln): %s\n", g.note.c_str());
  print_top("kiln", g, k.cuda);
  print_top("eager", e, k.cuda);
}

void print_text(const BenchOptions& o, const BenchRun& r, const BackendUse& u, const Comparison* c,
                const KernelReport* k) {
  const Timing t = timing(r);
  const auto& st = r.stats;
  std::printf("kiln bench %s on %s%s, %d steps; backend: %s, mode %s; runs on: %s\n", o.workload.c_str(),
              o.device.c_str(), r.kiln_w->autocast_bf16 ? " (bf16 autocast)" : "", o.steps, r.chosen.c_str(),
              o.mode.c_str(), u.runs_on.c_str());
  if (!r.why.empty()) std::printf("  why: %s\n", r.why.c_str());
  std::printf("  captured nodes: forward %d, backward %d, optimizer %d; compiled graph %zu nodes\n", r.phase_nodes[0],
              r.phase_nodes[1], r.phase_nodes[2], r.compiled_nodes);
  if (r.chosen != "eager")
    std::printf("  %s runs %zu of %zu nodes in %zu of %zu claimed groups\n", r.chosen.c_str(), u.nodes_run,
                r.compiled_nodes, u.groups_run, u.groups);
  std::printf("  eager  %9.3f ms/step\n  kiln   %9.3f ms/step   ratio %.3fx (eager/kiln)\n", t.eager_ms, t.kiln_ms,
              t.eager_ms / t.kiln_ms);
  std::printf("  kiln first step %.3f s (eager warm-up + capture + compile); %d of %d steps compiled\n", t.first_s,
              st.compiled_steps, o.steps);
  if (!o.interleave)
    std::printf("  minor page faults per step: eager %.0f, kiln %.0f\n", r.eager.faults_per_step,
                r.kiln.faults_per_step);
  if (t.probe_ms > 0)
    std::printf("  optimizer probe (host replay of step() for its per-step scalars): %.3f ms/step\n", t.probe_ms);
  if (!u.fallback.empty()) std::printf("  fallback: %s\n", u.fallback.c_str());
  if (st.graphs_recorded > 0)
    std::printf("  CUDA graphs: %d recorded, %d steps replayed (first step above includes the recording)\n",
                st.graphs_recorded, st.graph_replays);
  if (!o.interleave) {
    auto x = [](double k, double e) { return e > 0 ? k / e : 0.0; };
    std::printf("  peak allocated (above each side's start): eager %.1f MiB, kiln %.1f MiB (%.2fx eager's)\n",
                r.eager.peak_mb, r.kiln.peak_mb, x(r.kiln.peak_mb, r.eager.peak_mb));
    std::printf(
        "    first %d steps (warm-up, capture, compile): eager %.1f MiB, kiln %.1f MiB; the steps after them: "
        "eager %.1f MiB, kiln %.1f MiB (%.2fx eager's)\n",
        kFirstSteps, r.eager.first_peak_mb, r.kiln.first_peak_mb, r.eager.steady_peak_mb, r.kiln.steady_peak_mb,
        x(r.kiln.steady_peak_mb, r.eager.steady_peak_mb));
    std::printf(
        "  held between steps (gradients, optimizer state, the compiled step's own buffers): eager %.1f MiB, "
        "kiln %.1f MiB\n",
        r.eager.retained_mb, r.kiln.retained_mb);
  }
  if (o.device == "cuda") {
    if (!o.interleave)
      std::printf("  host time issuing a step (near the step time: bound by the host): eager %.3f ms, kiln %.3f ms\n",
                  r.eager.host_ms, r.kiln.host_ms);
  }
  if (c) {
    std::printf("  check: %s (max loss rel err %.3e, max parameter%s rel err %.3e%s%s, tolerance %g)%s%s\n",
                c->ok ? "PASS" : "FAIL", c->worst_loss, o.check_grads ? " or gradient" : "", c->worst_param,
                c->worst_param_name.empty() ? "" : " at ", c->worst_param_name.c_str(), c->tolerance, c->ok ? "" : ": ",
                c->failure.c_str());
    if (r.noisy_w)
      std::printf(
          "  noise floor (eager from weights one ulp away; 10x it is allowed%s): loss %.3e at the worst step, "
          "%.3e at the worst parameter\n",
          o.tolerance >= 0 ? ", not applied: --tolerance given" : "", c->worst_loss_floor, c->worst_param_floor);
    if (c->first_loss_diff > 0)
      std::printf("  losses first differ (not bit-identical) at step %d of %d\n", c->first_loss_diff, o.steps);
  }
  if (k) print_kernels(*k);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  BenchOptions o;
  if (auto status = parse(argc, argv, o)) return *status;
  if (o.nproc > 0 || o.ddp_child) {
    const DdpBenchOptions d{o.workload,    o.device,      o.backend, o.mode,  o.optimizer,          o.dtype,
                            o.ddp_backend, o.plugin_dirs, o.steps,   o.batch, std::max(o.nproc, 1), o.json};
    return o.ddp_child ? bench_ddp_child(d) : bench_ddp(d);
  }
  if (o.device == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "kiln bench: --device cuda but LibTorch sees no CUDA device\n");
    return 1;
  }
  if (!o.dynamic.empty()) {
    DynamicBenchOptions d;
    d.workload = o.workload, d.device = o.device, d.backend = o.backend, d.mode = o.mode;
    d.optimizer = o.optimizer, d.dtype = o.dtype, d.attention = o.attention, d.plugin_dirs = o.plugin_dirs;
    d.min_length = o.min_length, d.max_length = o.max_length, d.seed = o.dynamic_seed;
    d.steps = o.steps, d.batch = o.batch, d.tolerance = o.tolerance, d.same_length_rounds = o.same_length_rounds;
    d.check = o.check, d.check_grads = o.check_grads, d.json = o.json, d.trace = o.trace;
    return bench_dynamic(d);
  }
  BenchRun r = run(o);
  const BackendUse u = backend_use(o, r);
  Comparison c;
  if (o.check) c = compare(o, r, u);
  // After the comparison: the profiled steps train both sides further.
  KernelReport k;
  if (o.kernels) k = profile_kernels(o, r);
  if (o.profiler_range) profiler_range_step(o, r);
  if (o.trace) print_trace(o, r);
  if (o.json) print_json(o, r, u, o.check ? &c : nullptr, o.kernels ? &k : nullptr);
  else print_text(o, r, u, o.check ? &c : nullptr, o.kernels ? &k : nullptr);
  return o.check && !c.ok ? 1 : 0;
}

}  // namespace kiln::cli
