// `kiln bench WORKLOAD --nproc N` (bench_ddp.h): the launcher and its processes.
//
// Weak scaling, as data parallelism is used: every rank trains the workload's batch, so N ranks
// train N times the examples of one process in a step. The one-process run trains the same batch
// with no process group; the difference between its step and the N ranks' step is what the
// gradients' all_reduce (and waiting for the slowest rank) adds, reported as communication's share
// of the N-rank step. Both runs use the same threads per process.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>

#include "bench_ddp.h"
#include "kiln/compile.h"
#include "kiln/distributed.h"
#include "kiln/internal/json_text.h"
#include "kiln/ir.h"
#include "kiln/trainer.h"
#include "kiln/workloads.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double round_to(double v, int decimals) {
  const double f = std::pow(10.0, decimals);
  return std::round(v * f) / f;
}

// ---- One process ----

struct Side {
  double ms = 0;       // median ms per step over the timed blocks
  double first_s = 0;  // the first steps (warm-up, capture, compile, a CUDA graph's recording)
  int compiled_steps = 0, graphs_recorded = 0, graph_replays = 0, all_reduce_nodes = 0;
  std::string runs_on;
  int64_t batch = 0;
  double grad_mib = 0;
};

// Trains the workload through a Trainer (compiled or not) for o.steps steps, timed as kiln bench times
// (three steps one by one, each synchronised, then up to five blocks ending in one sync each).
Side train_side(const DdpBenchOptions& o, bool compile, const std::string& device) {
  Workload w = make_workload(o.workload, {device, 1234, o.batch, o.optimizer, o.dtype});
  TrainingArguments a;
  a.log_level = "warn";
  a.torch_compile = compile;
  if (compile && !o.backend.empty()) a.torch_compile_backend = o.backend;
  a.torch_compile_mode = o.mode;
  a.runtime.plugin_dirs = o.plugin_dirs;
  a.ddp_backend = o.ddp_backend;
  a.apply_env();
  if (!compile) a.torch_compile = false;  // the eager side stays eager whatever the environment names
  a.validate();
  // The workload's precision: the forward and the loss under bf16 autocast on its device (gpt and gpt-medium on CUDA).
  const at::DeviceType dev = w.input.is_cuda() ? at::kCUDA : at::kCPU;
  Workload* wp = &w;
  ForwardFn forward = [wp, dev](const at::Tensor& x) {
    if (wp->autocast_bf16) {
      at::autocast::set_autocast_enabled(dev, true);
      at::autocast::set_autocast_dtype(dev, at::kBFloat16);
    }
    return wp->forward(x);
  };
  LossFn loss = [wp, dev](const at::Tensor& out, const at::Tensor& y) {
    at::Tensor l = wp->loss_fn(out, y);
    if (wp->autocast_bf16) {
      at::autocast::set_autocast_enabled(dev, false);
      at::autocast::clear_cache();
    }
    return l;
  };
  Trainer t(w.model, forward, *w.optimizer, loss, a);
  const bool cuda = dev == at::kCUDA;
  auto sync = [cuda](const at::Tensor& l) {
    if (cuda) torch::cuda::synchronize();
    (void)l.item<float>();
  };
  Side s;
  int done = 0;
  for (; done < std::min(o.steps, 3); ++done) {
    const auto t0 = Clock::now();
    sync(t.step(w.input, w.target));
    s.first_s += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const int rest = o.steps - done, blocks = std::min(5, rest);
  std::vector<double> ms;
  for (int b = 0; b < blocks; ++b) {
    const int n = rest / blocks + (b < rest % blocks ? 1 : 0);
    const auto t0 = Clock::now();
    at::Tensor last;
    for (int k = 0; k < n; ++k) last = t.step(w.input, w.target);
    sync(last);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / n);
  }
  std::sort(ms.begin(), ms.end());
  s.ms = ms.empty() ? 0 : ms[ms.size() / 2];
  const StepStats& st = t.stats();
  s.compiled_steps = st.compiled_steps;
  s.graphs_recorded = st.graphs_recorded;
  s.graph_replays = st.graph_replays;
  s.runs_on = compile ? t.backend() : "eager";
  if (const ir::Graph* g = t.compiled_step().compiled_graph())
    for (const auto& n : g->nodes) s.all_reduce_nodes += n.op == "_c10d_functional::all_reduce";
  s.batch = w.input.size(0);
  for (const auto& p : w.model->parameters())
    if (p.requires_grad()) s.grad_mib += static_cast<double>(p.numel() * p.element_size()) / (1 << 20);
  return s;
}

Json side_json(const Side& s) {
  return Json{{"ms", round_to(s.ms, 4)},
              {"first_s", round_to(s.first_s, 3)},
              {"compiled_steps", s.compiled_steps},
              {"graphs_recorded", s.graphs_recorded},
              {"graph_replays", s.graph_replays},
              {"all_reduce_nodes", s.all_reduce_nodes},
              {"runs_on", s.runs_on},
              {"batch", s.batch},
              {"grad_mib", round_to(s.grad_mib, 3)}};
}

// ---- The launcher ----

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail(const std::string& s, size_t n = 3000) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

struct Proc {
  int status = -1;  // exit status; -1 when killed at the time limit
  std::string out, err;
  Json result;  // the JSON line it printed (null when none)
};

// Starts `n` copies of this executable with `args`; with `world`, each gets the torchrun
// environment of rank r of n. Waits for all (a limit of `limit_s`); when one fails the others are
// stopped after a grace period, so that a dead rank never leaves the launcher waiting.
std::vector<Proc> start(int n, bool world, const std::vector<std::string>& args, int threads, double limit_s) {
  static int runs = 0;
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_bench_ddp_" + std::to_string(::getpid()) + "_" + std::to_string(++runs));
  fs::create_directories(dir);
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const int port = world ? free_port() : 0;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv_s{exe};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e, k = kv.substr(0, kv.find('='));
      if (k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE" || k == "MASTER_ADDR" ||
          k == "MASTER_PORT" || k == "OMP_NUM_THREADS" || k.rfind("TORCHELASTIC", 0) == 0)
        continue;
      env_s.push_back(kv);
    }
    env_s.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
    if (world) {
      for (const auto& [k, v] : std::vector<std::pair<std::string, int>>{
               {"RANK", r}, {"LOCAL_RANK", r}, {"WORLD_SIZE", n}, {"LOCAL_WORLD_SIZE", n}, {"MASTER_PORT", port}})
        env_s.push_back(k + "=" + std::to_string(v));
      env_s.push_back("MASTER_ADDR=127.0.0.1");
    }
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string out = (dir / ("out" + std::to_string(r))).string(),
                      err = (dir / ("err" + std::to_string(r))).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fo, 1);
      ::dup2(fe, 2);
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<Proc> procs(static_cast<size_t>(n));
  const auto t0 = Clock::now();
  double failed_at = -1;
  for (size_t left = pids.size(); left > 0;) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t r = 0; r < pids.size(); ++r) {
      int st = 0;
      if (pids[r] == 0 || ::waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      procs[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (procs[r].status != 0 && failed_at < 0) failed_at = t;
      pids[r] = 0;
      --left;
    }
    // A failed rank's peers fail on their own within ddp_timeout; 60 s later they are stopped.
    if (left > 0 && (t > limit_s || (failed_at >= 0 && t > failed_at + 60))) {
      for (auto& p : pids)
        if (p != 0) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0), p = 0;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    Proc& p = procs[static_cast<size_t>(r)];
    p.out = read_all((dir / ("out" + std::to_string(r))).string());
    p.err = read_all((dir / ("err" + std::to_string(r))).string());
    std::istringstream lines(p.out);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && line[0] == '{') p.result = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return procs;
}

bool report_failures(const std::vector<Proc>& procs, const char* what) {
  bool failed = false;
  for (size_t r = 0; r < procs.size(); ++r) {
    const Proc& p = procs[r];
    if (p.status == 0 && p.result.is_object()) continue;
    failed = true;
    std::fprintf(stderr, "kiln bench --nproc: %s%s failed (%s):\n%s\n", what,
                 procs.size() > 1 ? (", rank " + std::to_string(r)).c_str() : "",
                 p.status < 0 ? "stopped" : ("exit status " + std::to_string(p.status)).c_str(), tail(p.err).c_str());
  }
  return failed;
}

// The slowest rank's value: the ranks wait for each other at every all_reduce.
double slowest(const std::vector<Proc>& procs, const char* side) {
  double v = 0;
  for (const auto& p : procs) v = std::max(v, p.result[side]["ms"].get<double>());
  return v;
}

}  // namespace

int bench_ddp_child(const DdpBenchOptions& o) {
  try {
    const char* local = std::getenv("LOCAL_RANK");
    const std::string device = o.device == "cuda" ? "cuda:" + std::string(local ? local : "0") : o.device;
    const Side eager = train_side(o, false, device);
    const Side kiln = train_side(o, true, device);
    const char* rank = std::getenv("RANK");
    std::printf(
        "%s\n",
        json_text(Json{{"rank", rank ? std::atoi(rank) : 0}, {"eager", side_json(eager)}, {"kiln", side_json(kiln)}})
            .c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

int bench_ddp(const DdpBenchOptions& o) {
  const bool cuda = o.device == "cuda";
  if (cuda) {
    const int gpus = static_cast<int>(at::detail::getCUDAHooks().deviceCount());
    if (gpus < o.nproc) {
      std::fprintf(stderr,
                   "kiln bench: --nproc %d on CUDA needs a GPU per rank and this machine has %d (NCCL refuses two "
                   "ranks on one GPU)\n",
                   o.nproc, gpus);
      return 2;
    }
  }
  const std::string ddp_backend = !o.ddp_backend.empty() ? o.ddp_backend : cuda ? "nccl" : "gloo";
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int threads = omp && std::atoi(omp) > 0
                          ? std::atoi(omp)
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o.nproc);
  std::vector<std::string> args{"bench",  o.workload, "--device",   o.device, "--steps", std::to_string(o.steps),
                                "--mode", o.mode,     "--ddp-child"};
  if (o.batch > 0) args.insert(args.end(), {"--batch", std::to_string(o.batch)});
  if (!o.backend.empty()) args.insert(args.end(), {"--backend", o.backend});
  if (!o.optimizer.empty()) args.insert(args.end(), {"--optimizer", o.optimizer});
  if (!o.dtype.empty()) args.insert(args.end(), {"--dtype", o.dtype});
  for (const auto& d : o.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
  std::vector<std::string> world_args = args;
  world_args.insert(world_args.end(), {"--ddp-backend", ddp_backend});
  const double limit_s = 1800;
  const std::vector<Proc> one = start(1, false, args, threads, limit_s);
  if (report_failures(one, "the one-process run")) return 1;
  const std::vector<Proc> ranks = start(o.nproc, true, world_args, threads, limit_s);
  if (report_failures(ranks, "the data-parallel run")) return 1;

  const Json& r0 = ranks[0].result;
  const double e1 = one[0].result["eager"]["ms"].get<double>(), k1 = one[0].result["kiln"]["ms"].get<double>();
  const double en = slowest(ranks, "eager"), kn = slowest(ranks, "kiln");
  const int64_t batch = r0["kiln"]["batch"].get<int64_t>();
  const double mib = r0["kiln"]["grad_mib"].get<double>();
  const int buckets = r0["kiln"]["all_reduce_nodes"].get<int>();
  auto share = [](double single, double world) { return world > 0 ? 1 - single / world : 0.0; };
  auto per_s = [&](double ms, int procs) { return ms > 0 ? 1000.0 * static_cast<double>(batch) * procs / ms : 0.0; };
  if (o.json) {
    Json j{{"workload", o.workload},
           {"device", o.device},
           {"nproc", o.nproc},
           {"ddp_backend", ddp_backend},
           {"threads_per_process", threads},
           {"steps", o.steps},
           {"mode", o.mode},
           {"batch_per_rank", batch},
           {"gradient_mib", round_to(mib, 3)},
           {"all_reduce_nodes", buckets},
           {"runs_on", r0["kiln"]["runs_on"]},
           {"one_process", one[0].result},
           {"eager_ms_one", round_to(e1, 4)},
           {"eager_ms_ranks", round_to(en, 4)},
           {"kiln_ms_one", round_to(k1, 4)},
           {"kiln_ms_ranks", round_to(kn, 4)},
           {"eager_comm_share", round_to(share(e1, en), 4)},
           {"kiln_comm_share", round_to(share(k1, kn), 4)},
           {"eager_samples_per_s", round_to(per_s(en, o.nproc), 1)},
           {"kiln_samples_per_s", round_to(per_s(kn, o.nproc), 1)},
           {"ratio", round_to(kn > 0 ? en / kn : 0, 4)}};
    j["ranks"] = Json::array();
    for (const auto& p : ranks) j["ranks"].push_back(p.result);
    std::printf("%s\n", json_text(j).c_str());
    return 0;
  }
  std::printf("kiln bench %s --nproc %d on %s (%s, %d thread%s a process), %d steps; kiln: %s, mode %s\n",
              o.workload.c_str(), o.nproc, o.device.c_str(), ddp_backend.c_str(), threads, threads == 1 ? "" : "s",
              o.steps, r0["kiln"]["runs_on"].get<std::string>().c_str(), o.mode.c_str());
  std::printf("  each rank trains %lld examples a step (%lld in all); %.2f MiB of gradients all-reduced a step",
              static_cast<long long>(batch), static_cast<long long>(batch) * o.nproc, mib);
  if (buckets > 0) std::printf(" in %d bucket%s, inside kiln's compiled step", buckets, buckets == 1 ? "" : "s");
  std::printf("\n");
  std::printf("                         1 process   %2d rank%s   examples/s (%d rank%s)   communication's share\n",
              o.nproc, o.nproc == 1 ? " " : "s", o.nproc, o.nproc == 1 ? "" : "s");
  std::printf("  LibTorch eager      %9.3f ms %9.3f ms   %12.0f            %5.1f %%\n", e1, en, per_s(en, o.nproc),
              100 * share(e1, en));
  std::printf("  kiln                %9.3f ms %9.3f ms   %12.0f            %5.1f %%\n", k1, kn, per_s(kn, o.nproc),
              100 * share(k1, kn));
  std::printf("  kiln over eager with %d rank%s: %.3fx; compiled steps %d of %d (rank 0)", o.nproc,
              o.nproc == 1 ? "" : "s", kn > 0 ? en / kn : 0.0, r0["kiln"]["compiled_steps"].get<int>(), o.steps);
  if (r0["kiln"]["graphs_recorded"].get<int>() > 0)
    std::printf(", %d CUDA graph replays (the all_reduce inside)", r0["kiln"]["graph_replays"].get<int>());
  std::printf("\n  (communication's share: 1 - one process's step / the slowest rank's step, same batch a process)\n");
  return 0;
}

}  // namespace kiln::cli
