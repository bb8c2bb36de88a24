// `kiln bench WORKLOAD [--backend B] [--mode M] [--device cpu|cuda] [--steps N] [--batch N] [--check]
// [--check-grads] [--tolerance X] [--interleave] [--json]`:
// LibTorch eager and kiln side by side in one process on a reference workload of
// shared/WORKLOADS.md. Prints eager and kiln ms per step (the median of five timed blocks of the
// steady state, each ending in one device sync, as WORKLOADS.md and bench/reference.py time), their
// ratio and kiln's first-step seconds (the eager warm-up plus the capture-and-compile step).
// --check trains both from the same initial weights for N steps and fails (exit 1) when a loss or
// a final parameter (with --check-grads: or its last gradient) differs beyond the tolerance for the precision (relative error; float32 1e-5,
// bf16 autocast 1e-2, generated CPU kernels 1e-4; --tolerance overrides it). On CUDA it also reports each side's peak allocated
// memory (LibTorch's caching allocator, above what was allocated when that side started), and
// --check makes CUDA deterministic (cuDNN's convolution backward, embedding backward's atomics and
// flash attention's backward are not, and eager would not even match itself): deterministic
// algorithms, math attention, CUBLAS_WORKSPACE_CONFIG. Time without --check.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include "commands.h"
#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/json_text.h"
#include "kiln/log.h"
#include "kiln/workloads.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

void usage(FILE* out) {
  std::fprintf(out,
               "usage: kiln bench WORKLOAD [--backend B] [--mode M] [--device cpu|cuda] [--steps N] "
               "[--batch N] [--check] [--check-grads] [--tolerance X] [--interleave] [--json]\n\n"
               "Runs a reference workload (mlp, cnn, gpt; shared/WORKLOADS.md) with LibTorch eager and with\n"
               "kiln in this process and prints ms per step for both, the ratio and kiln's first-step time.\n\n"
               "  --backend B   backend to ask for (default: KILN_BACKEND or auto)\n"
               "  --mode M      default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs\n"
               "  --device D    cpu (default) or cuda\n"
               "  --steps N     steps per run (default 20; at least 4)\n"
               "  --batch N     batch size (default: the WORKLOADS.md size for the device)\n"
               "  --optimizer O sgd or adamw instead of the workload's own (to tell a model's effect from an optimizer's)\n"
               "  --check       also compare losses and final parameters; exit 1 beyond tolerance\n"
               "  --check-grads --check, and the last step's gradients too\n"
               "  --tolerance X relative error allowed by --check (default: float32 1e-5, or 1e-4 when the\n"
               "                backend runs generated kernels (inductor on the CPU); bf16 autocast 1e-2)\n"
               "  --interleave  run eager and kiln steps in turn (fairer on a machine whose load changes)\n"
               "  --json        one JSON object on stdout\n");
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  auto o = out.detach().to(at::kDouble).cpu(), r = ref.detach().to(at::kDouble).cpu();
  const double num = (o - r).norm().item<double>();
  const double den = r.norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return den == 0 ? num : num / den;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Run {
  std::vector<double> ms;     // the first kFirstSteps steps, each synchronised, then one entry per block
  std::vector<float> losses;  // every step's
  double faults_per_step = 0;  // minor page faults of the process per steady-state step
};

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Steps timed one by one (the eager warm-up, the capture and compile, a CUDA graph's recording).
constexpr int kFirstSteps = 3;

// Runs `steps` steps as WORKLOADS.md measures: the first kFirstSteps one at a time, each ending in
// a device sync; the rest in (up to) five timed blocks, each ending in one sync, so that the host
// may run ahead of the device within a block as it does in a training loop. The losses are read
// after each block (kiln's results are copies, an eager step's loss is a new tensor).
template <class F>
Run run_steps(F&& step, Workload& w, int steps) {
  Run r;
  auto sync = [&](const at::Tensor& loss) {
    if (loss.is_cuda()) torch::cuda::synchronize();
  };
  int s = 0;
  for (; s < std::min(steps, kFirstSteps); ++s) {
    const auto t = Clock::now();
    auto loss = step(std::vector<at::Tensor>{w.input, w.target})[0];
    r.losses.push_back(loss.template item<float>());
    r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  const int rest = steps - s, blocks = std::min(5, rest);
  const long f0 = minor_faults();
  for (int b = 0; b < blocks; ++b) {
    const int n = rest / blocks + (b < rest % blocks ? 1 : 0);
    std::vector<at::Tensor> losses;
    const auto t = Clock::now();
    for (int k = 0; k < n; ++k) losses.push_back(step(std::vector<at::Tensor>{w.input, w.target})[0]);
    sync(losses.back());
    r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count() / n);
    for (const auto& l : losses) r.losses.push_back(l.template item<float>());
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

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::string workload, device = "cpu", backend, mode = "default";
  int steps = 20;
  int64_t batch = 0;
  std::string optimizer;
  double tolerance = -1;  // < 0: the default for the precision
  bool check = false, check_grads = false, json = false, interleave = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* opt) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln bench: %s needs a value\n", opt);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--backend") backend = value("--backend");
    else if (a == "--mode") mode = value("--mode");
    else if (a == "--device") device = value("--device");
    else if (a == "--steps") steps = std::atoi(value("--steps").c_str());
    else if (a == "--batch") batch = std::atoll(value("--batch").c_str());
    else if (a == "--optimizer") optimizer = value("--optimizer");
    else if (a == "--tolerance") {
      const std::string v = value("--tolerance");
      char* end = nullptr;
      tolerance = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(tolerance >= 0)) {
        std::fprintf(stderr, "kiln bench: --tolerance '%s' is not a non-negative number\n", v.c_str());
        return 2;
      }
    }
    else if (a == "--check") check = true;
    else if (a == "--check-grads") check = check_grads = true;
    else if (a == "--interleave") interleave = true;
    else if (a == "--json") json = true;
    else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (!a.empty() && a[0] != '-' && workload.empty()) {
      workload = a;
    } else {
      std::fprintf(stderr, "kiln bench: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (workload.empty()) {
    usage(stderr);
    return 2;
  }
  if (std::find(workload_names().begin(), workload_names().end(), workload) == workload_names().end()) {
    std::fprintf(stderr, "kiln bench: unknown workload '%s'; valid workloads: mlp, cnn, gpt\n", workload.c_str());
    return 2;
  }
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "kiln bench: unknown device '%s'; use cpu or cuda\n", device.c_str());
    return 2;
  }
  if (device == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "kiln bench: --device cuda but LibTorch sees no CUDA device\n");
    return 1;
  }
  if (steps < 4) steps = 4;
  if (backend.empty()) {
    const char* env = std::getenv("KILN_BACKEND");
    backend = env && *env ? env : "auto";
  }
  if (!std::getenv("KILN_LOG_LEVEL")) set_log_level("warn");
  if (device == "cuda" && check) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);  // before the first cuBLAS handle
    auto& ctx = at::globalContext();
    ctx.setDeterministicCuDNN(true);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
    ctx.setSDPUseFlash(false);
    ctx.setSDPUseMemEfficient(false);
    ctx.setSDPUseCuDNN(false);
  }
  // Peak allocated device memory of one side's run, above what was allocated when it started.
  int64_t peak_base = 0;
  auto mem_start = [&] {
    if (device != "cuda") return;
    torch::cuda::synchronize();
    cuda_reset_peak_allocated(0);
    peak_base = cuda_allocated_bytes(0);
  };
  auto mem_peak = [&]() -> double {
    if (device != "cuda") return 0;
    torch::cuda::synchronize();
    return static_cast<double>(cuda_peak_allocated_bytes(0) - peak_base) / (1 << 20);
  };
  double eager_peak_mb = 0, kiln_peak_mb = 0;

  TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = backend;
  args.torch_compile_mode = mode;
  args.validate();

  const uint64_t seed = 1234;
  if (batch < 0) {
    std::fprintf(stderr, "kiln bench: --batch must be positive\n");
    return 2;
  }
  auto eager_w = make_workload(workload, {device, seed, batch, optimizer});
  auto kiln_w = make_workload(workload, {device, seed, batch, optimizer});
  auto eager_step = workload_step(eager_w);
  auto compiled = compile_step(workload_step(kiln_w), {{kiln_w.model}, {kiln_w.optimizer.get()}}, args);
  const std::string chosen = compiled.backend();
  std::string why;
  for (const auto& r : compiled.backend_reasons()) why += (why.empty() ? "" : "; ") + r;
  const std::string& runs_on = chosen;

  Run eager, kiln;
  if (interleave) {
    run_interleaved(eager_step, eager_w, compiled, kiln_w, steps, &eager, &kiln);
  } else {
    mem_start();
    eager = run_steps(eager_step, eager_w, steps);
    eager_peak_mb = mem_peak();
    mem_start();
    kiln = run_steps(compiled, kiln_w, steps);
    kiln_peak_mb = mem_peak();
  }


  // Steady state: the blocks (--interleave: every step after the first kFirstSteps).
  const double eager_ms = median(std::vector<double>(eager.ms.begin() + kFirstSteps, eager.ms.end()));
  const double kiln_ms = median(std::vector<double>(kiln.ms.begin() + kFirstSteps, kiln.ms.end()));
  const auto& st = compiled.stats();
  // With a CUDA graph, the first compiled step also warms up and records it.
  const double first_s = (kiln.ms[0] + kiln.ms[1] + (st.graphs_recorded > 0 ? kiln.ms[2] : 0.0)) / 1000.0;
  const auto* graph = compiled.captured_graph();
  int phase_nodes[3] = {0, 0, 0};
  if (graph)
    for (const auto& n : graph->nodes)
      phase_nodes[n.phase == "forward" ? 0 : n.phase == "backward" ? 1 : 2]++;
  const size_t compiled_nodes = compiled.compiled_graph() ? compiled.compiled_graph()->nodes.size() : 0;

  const double probe_ms = st.compiled_steps > 1 ? 1000.0 * st.probe_seconds / (st.compiled_steps - 1) : 0.0;
  bool check_ok = true;
  double worst_loss = 0, worst_param = 0;
  std::string worst_param_name;
  int first_loss_diff = -1;  // the first step whose losses are not bit-identical (1-based)
  // Generated kernels (inductor on the CPU) fuse and reorder float arithmetic: kiln holds them
  // to 1e-4 over 20 steps; ATen's own kernels (the eager executor, CUDA graphs of it) to 1e-5.
  const bool generated_code = chosen == "inductor" && device == "cpu";
  const double tol = tolerance >= 0 ? tolerance : eager_w.autocast_bf16 ? 1e-2 : generated_code ? 1e-4 : 1e-5;
  if (check) {
    for (int s = 0; s < steps; ++s) {
      const double e = eager.losses[static_cast<size_t>(s)], k = kiln.losses[static_cast<size_t>(s)];
      const double err = std::isnan(k) ? INFINITY : std::fabs(k - e) / std::max(std::fabs(e), 1e-12);
      worst_loss = std::max(worst_loss, err);
      if (first_loss_diff < 0 && e != k) first_loss_diff = s + 1;
      // KILN_BENCH_TRACE=1: every step's two losses (how a difference starts and grows).
      if (const char* t = std::getenv("KILN_BENCH_TRACE"); t && *t && std::string(t) != "0")
        std::fprintf(stderr, "kiln bench: step %3d  eager %.9g  kiln %.9g  rel %.3e\n", s + 1, e, k, err);
    }
    auto pe = eager_w.model->named_parameters(), pk = kiln_w.model->named_parameters();
    for (size_t i = 0; i < pe.size(); ++i) {
      const double err = rel_err(pk[i].value(), pe[i].value());
      if (err > worst_param) worst_param = err, worst_param_name = pe[i].key();
      // --check-grads: the last step's gradients too (kiln puts them in .grad like an eager step).
      // Not by default: a last-step gradient can be ill-conditioned (cnn's after ~14 steps on one
      // batch: LibTorch eager on 1 thread against 2 threads differs by 5e-3 there), while the
      // losses and parameters stay within 1e-6.
      if (!check_grads) continue;
      const at::Tensor ge = pe[i].value().grad(), gk = pk[i].value().grad();
      if (ge.defined() != gk.defined()) {
        worst_param = INFINITY, worst_param_name = pe[i].key() + ".grad (defined on one side only)";
      } else if (ge.defined()) {
        const double gerr = rel_err(gk, ge);
        if (gerr > worst_param) worst_param = gerr, worst_param_name = pe[i].key() + ".grad";
      }
    }
    check_ok = worst_loss <= tol && worst_param <= tol && st.compiled_steps == steps - 2;
  }

  if (json) {
    std::printf("{\"workload\": %s, \"device\": %s, \"steps\": %d, \"backend_requested\": %s, "
                "\"backend_selected\": %s, \"backend_reasons\": %s, \"runs_on\": %s, \"mode\": %s, "
                "\"eager_ms\": %.4f, \"kiln_ms\": %.4f, \"ratio\": %.4f, \"kiln_first_step_s\": %.4f, "
                "\"compiled_steps\": %d, \"compiles\": %d, \"rebuilds\": %d, "
                "\"captured_nodes\": {\"forward\": %d, \"backward\": %d, \"optimizer\": %d}, \"compiled_nodes\": %zu, "
                "\"fallback\": %s, \"graphs_recorded\": %d, \"graph_replays\": %d, \"graph_skip\": %s, "
                "\"eager_peak_mb\": %.1f, \"kiln_peak_mb\": %.1f, \"probe_ms_per_step\": %.4f, \"adopted_writebacks\": %lld, "
                "\"eager_page_faults_per_step\": %.0f, \"kiln_page_faults_per_step\": %.0f",
                json_quote(workload).c_str(), json_quote(device).c_str(), steps, json_quote(backend).c_str(),
                json_quote(chosen).c_str(), json_quote(why).c_str(), json_quote(runs_on).c_str(), json_quote(mode).c_str(),
                eager_ms, kiln_ms, eager_ms / kiln_ms, first_s, st.compiled_steps, st.compiles, st.rebuilds,
                phase_nodes[0], phase_nodes[1], phase_nodes[2], compiled_nodes, json_quote(st.last_fallback).c_str(),
                st.graphs_recorded, st.graph_replays, json_quote(st.last_graph_skip).c_str(), eager_peak_mb, kiln_peak_mb,
                probe_ms, static_cast<long long>(st.adopted_writebacks), eager.faults_per_step, kiln.faults_per_step);
    if (check)
      std::printf(", \"check\": {\"ok\": %s, \"tolerance\": %g, \"max_loss_rel_err\": %.3e, "
                  "\"max_param_rel_err\": %.3e, \"worst_param\": %s, \"first_loss_diff_step\": %d}",
                  check_ok ? "true" : "false", tol, worst_loss, worst_param, json_quote(worst_param_name).c_str(),
                  first_loss_diff);
    std::printf("}\n");
  } else {
    std::printf("kiln bench %s on %s, %d steps; backend: %s, mode %s\n", workload.c_str(), device.c_str(), steps,
                chosen.c_str(), mode.c_str());
    if (!why.empty()) std::printf("  why: %s\n", why.c_str());
    std::printf("  captured nodes: forward %d, backward %d, optimizer %d; compiled graph %zu nodes\n",
                phase_nodes[0], phase_nodes[1], phase_nodes[2], compiled_nodes);
    std::printf("  eager  %9.3f ms/step\n  kiln   %9.3f ms/step   ratio %.3fx (eager/kiln)\n", eager_ms, kiln_ms,
                eager_ms / kiln_ms);
    std::printf("  kiln first step %.3f s (eager warm-up + capture + compile); %d of %d steps compiled\n", first_s,
                st.compiled_steps, steps);
    if (!interleave)
      std::printf("  minor page faults per step: eager %.0f, kiln %.0f\n", eager.faults_per_step, kiln.faults_per_step);
    if (probe_ms > 0)
      std::printf("  optimizer probe (host replay of step() for its per-step scalars): %.3f ms/step\n", probe_ms);
    if (!st.last_fallback.empty()) std::printf("  fallback: %s\n", st.last_fallback.c_str());
    if (st.graphs_recorded > 0)
      std::printf("  CUDA graphs: %d recorded, %d steps replayed (first step above includes the recording)\n",
                  st.graphs_recorded, st.graph_replays);
    if (!st.last_graph_skip.empty()) std::printf("  %s\n", st.last_graph_skip.c_str());
    if (device == "cuda")
      std::printf("  peak allocated (above each side's start): eager %.1f MiB, kiln %.1f MiB\n", eager_peak_mb,
                  kiln_peak_mb);
    if (check)
      std::printf("  check: %s (max loss rel err %.3e, max parameter%s rel err %.3e%s%s, tolerance %g)\n",
                  check_ok ? "PASS" : "FAIL", worst_loss, check_grads ? " or gradient" : "", worst_param,
                  worst_param_name.empty() ? "" : " at ",
                  worst_param_name.c_str(), tol);
    if (check && first_loss_diff > 0)
      std::printf("  losses first differ (not bit-identical) at step %d of %d\n", first_loss_diff, steps);
  }
  return check && !check_ok ? 1 : 0;
}

}  // namespace kiln::cli
