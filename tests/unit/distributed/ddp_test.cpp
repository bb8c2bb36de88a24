// Data-parallel training on c10d with Gloo over loopback: 2 and 3 worker processes (ddp_worker,
// the torchrun environment) train through kiln::Trainer, compiled and eager, and must end with the
// parameters one process reaches on the whole batch, every rank's equal to rank 0's bit for bit.
// Then the faults: a rank that dies, a rank that hangs, ranks that captured different steps.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/serialize.h>

#include "ddp_scenario.h"
#include "kiln/config.h"
#include "kiln/distributed.h"
#include "kiln/trainer.h"

namespace fs = std::filesystem;
namespace ddp = kiln::test::ddp;

namespace {

// A loopback port nothing listens on now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Ranks {
  std::vector<int> status;  // exit status per rank; -1 when killed at the time limit
  std::vector<std::string> out, err;
  std::vector<double> seconds;  // when each rank ended, from the start
  std::string prefix;           // <prefix>.rank<r>: the parameters a rank saved
};

// Starts `world` workers with `args` and the torchrun environment; a worker still running after
// `limit_s` seconds is killed (the test then fails, it never hangs), and so is every worker still
// running once rank `until_rank` has ended (when >= 0).
Ranks launch(int world, const std::vector<std::string>& args, double limit_s, int until_rank = -1) {
  static int runs = 0;
  Ranks run;
  const std::string dir =
      ::testing::TempDir() + "kiln_ddp_" + std::to_string(::getpid()) + "_" + std::to_string(++runs);
  fs::create_directories(dir);
  run.prefix = dir + "/params";
  const std::string worker = (fs::read_symlink("/proc/self/exe").parent_path() / "ddp_worker").string();
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv_s{worker, "out=" + run.prefix};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string k = kv.substr(0, kv.find('='));
      if (k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "MASTER_ADDR" || k == "MASTER_PORT" ||
          k.rfind("TORCHELASTIC", 0) == 0)
        continue;
      env_s.push_back(kv);
    }
    env_s.push_back("RANK=" + std::to_string(r));
    env_s.push_back("LOCAL_RANK=" + std::to_string(r));
    env_s.push_back("WORLD_SIZE=" + std::to_string(world));
    env_s.push_back("MASTER_ADDR=127.0.0.1");
    env_s.push_back("MASTER_PORT=" + std::to_string(port));
    env_s.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string out = dir + "/out" + std::to_string(r), err = dir + "/err" + std::to_string(r);
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::execve(worker.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  run.status.assign(static_cast<size_t>(world), -1);
  run.seconds.assign(static_cast<size_t>(world), limit_s);
  const auto t0 = std::chrono::steady_clock::now();
  size_t left = pids.size();
  while (left > 0) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] == 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        run.status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        run.seconds[r] = t;
        pids[r] = 0;
        --left;
      }
    }
    const bool stop = until_rank >= 0 && pids[static_cast<size_t>(until_rank)] == 0;
    if (left > 0 && (t > limit_s || stop)) {
      for (auto& p : pids)
        if (p != 0) {
          ::kill(p, SIGKILL);
          ::waitpid(p, nullptr, 0);
          p = 0;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    run.out.push_back(read_file(dir + "/out" + std::to_string(r)));
    run.err.push_back(read_file(dir + "/err" + std::to_string(r)));
  }
  return run;
}

std::vector<at::Tensor> load_params(const std::string& path) {
  std::vector<at::Tensor> p;
  torch::load(p, path);
  return p;
}

// One process: rank 0's initial model, every step on all ranks' examples, the loss the mean of the
// ranks' mean losses (what averaging the ranks' gradients computes; with equal shares, the mean
// over the whole batch).
std::vector<at::Tensor> reference(uint64_t seed, bool adamw, int64_t steps, const std::vector<int64_t>& sizes,
                                  const at::Device& device = at::kCPU) {
  // One thread, as every worker (OMP_NUM_THREADS=1): AdamW turns the rounding of a matmul summed in
  // another order into whole updates wherever a gradient is near zero.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  ddp::Setup s = ddp::make(seed, adamw);
  s.net->to(device);
  const bool equal = std::all_of(sizes.begin(), sizes.end(), [&](int64_t b) { return b == sizes[0]; });
  for (int64_t step = 0; step < steps; ++step) {
    auto b = ddp::batches(seed, step, sizes);
    for (auto& [x, y] : b) x = x.to(device), y = y.to(device);
    s.opt->zero_grad();
    at::Tensor loss;
    if (equal) {
      std::vector<at::Tensor> xs, ys;
      for (const auto& [x, y] : b) {
        xs.push_back(x);
        ys.push_back(y);
      }
      loss = ddp::loss(s.net->forward(at::cat(xs)), at::cat(ys));
    } else {
      for (const auto& [x, y] : b) {
        auto l = ddp::loss(s.net->forward(x), y) / static_cast<double>(b.size());
        loss = loss.defined() ? loss + l : l;
      }
    }
    loss.backward();
    s.opt->step();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : s.net->parameters()) out.push_back(p.detach().cpu().clone());
  at::set_num_threads(threads);
  return out;
}

std::string describe(const Ranks& run) {
  std::string s;
  for (size_t r = 0; r < run.status.size(); ++r)
    s += "rank " + std::to_string(r) + " status " + std::to_string(run.status[r]) + "\nstdout: " + run.out[r] +
         "\nstderr: " + run.err[r].substr(run.err[r].size() > 4000 ? run.err[r].size() - 4000 : 0) + "\n";
  return s;
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::string s;
  for (auto b : sizes) s += (s.empty() ? "" : ",") + std::to_string(b);
  return s;
}

// Runs the training on sizes.size() ranks and checks it against the one-process reference.
// `extra`: more worker arguments; `device`: where the workers and the reference train. Returns the
// workers' outputs for more checks (empty when a fatal failure was recorded or the test skipped).
Ranks expect_matches_one_process(bool adamw, bool compile, const std::vector<int64_t>& sizes, int64_t steps = 5,
                                 const std::string& backend = "eager", const std::vector<std::string>& extra = {},
                                 const at::Device& device = at::kCPU, double tolerance = 1e-5) {
  const uint64_t seed = 17;
  const int world = static_cast<int>(sizes.size());
  std::vector<std::string> args{"seed=" + std::to_string(seed),
                                "steps=" + std::to_string(steps),
                                std::string("adamw=") + (adamw ? "1" : "0"),
                                std::string("compile=") + (compile ? "1" : "0"),
                                "backend=" + backend,
                                "sizes=" + sizes_text(sizes)};
  args.insert(args.end(), extra.begin(), extra.end());
  Ranks run = launch(world, args, 120);
  for (int r = 0; r < world; ++r)
    if (run.err[static_cast<size_t>(r)].find("built without NCCL") != std::string::npos) {
      ADD_FAILURE() << "kiln was built without NCCL on a machine with a GPU\n" << describe(run);
      return {};
    }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(run.status[static_cast<size_t>(r)], 0) << describe(run);
    if (run.status[static_cast<size_t>(r)] != 0) return {};
  }
  for (int r = 0; r < world && !compile; ++r)
    EXPECT_NE(run.out[static_cast<size_t>(r)].find("compiled_steps=0 "), std::string::npos) << describe(run);
  for (int r = 0; r < world && compile; ++r)
    EXPECT_NE(run.out[static_cast<size_t>(r)].find("compiled_steps=" + std::to_string(steps - 2)), std::string::npos)
        << "every step after the warm-up and the capture runs compiled\n"
        << describe(run);
  // Two buckets (c10d's first of 1 MiB closes after the second layer's weight, then
  // ddp_bucket_cap_mb = 1): two all_reduce nodes and their waits.
  for (int r = 0; r < world && compile; ++r)
    EXPECT_NE(run.out[static_cast<size_t>(r)].find("all_reduce_nodes=2 wait_tensor_nodes=2"), std::string::npos)
        << describe(run);
  // The first bucket's all_reduce is issued before the backward ends (overlap_collectives).
  const bool no_overlap = std::find(extra.begin(), extra.end(), "no_overlap=1") != extra.end();
  for (int r = 0; r < world && compile; ++r)
    EXPECT_NE(run.out[static_cast<size_t>(r)].find(no_overlap ? "overlapped=0" : "overlapped=1"), std::string::npos)
        << describe(run);
  // A backend's compiled groups ran around the collectives, which stay with the eager executor.
  for (int r = 0; r < world && backend != "eager" && backend != "cudagraphs"; ++r)
    EXPECT_EQ(run.out[static_cast<size_t>(r)].find("backend_groups=0 "), std::string::npos) << describe(run);
  const auto want = reference(seed, adamw, steps, sizes, device);
  const auto rank0 = load_params(run.prefix + ".rank0");
  EXPECT_EQ(rank0.size(), want.size());
  if (rank0.size() != want.size()) return {};
  // Each parameter's relative error (norm of the difference over the norm), as kiln bench judges:
  // AdamW turns a gradient that is rounding noise into a whole update of the learning rate, so one
  // element may differ by more while the parameter as a whole agrees to the float's precision.
  double worst = 0, worst_element = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, (rank0[i] - want[i]).norm().item<double>() / want[i].norm().item<double>());
    worst_element = std::max(worst_element, (rank0[i] - want[i]).abs().max().item<double>());
  }
  std::cout << "[ddp] " << world << " ranks, " << (adamw ? "AdamW" : "SGD") << ", " << (compile ? "compiled" : "eager")
            << ", sizes " << sizes_text(sizes) << ": largest relative difference to one process " << worst
            << " (largest element difference " << worst_element << ")\n";
  EXPECT_LT(worst, tolerance);
  // The one-process run really trained: the parameters moved from their start.
  const auto start = ddp::make(seed, adamw);
  EXPECT_GT((start.net->parameters()[0] - want[0]).abs().max().item<double>(), 1e-4);
  for (int r = 1; r < world; ++r) {
    const auto other = load_params(run.prefix + ".rank" + std::to_string(r));
    EXPECT_EQ(other.size(), rank0.size());
    if (other.size() != rank0.size()) return {};
    for (size_t i = 0; i < other.size(); ++i)
      EXPECT_TRUE(other[i].equal(rank0[i])) << "rank " << r << "'s parameter " << i << " differs from rank 0's";
  }
  return run;
}

}  // namespace

TEST(Ddp, TwoRanksSgdCompiledMatchOneProcess) { expect_matches_one_process(false, true, {8, 8}); }
TEST(Ddp, TwoRanksAdamWCompiledMatchOneProcess) { expect_matches_one_process(true, true, {8, 8}); }
TEST(Ddp, TwoRanksSgdEagerMatchOneProcess) { expect_matches_one_process(false, false, {8, 8}); }
TEST(Ddp, ThreeRanksAdamWCompiledMatchOneProcess) { expect_matches_one_process(true, true, {6, 6, 6}); }
TEST(Ddp, ThreeRanksSgdEagerMatchOneProcess) { expect_matches_one_process(false, false, {6, 6, 6}); }
// With the inductor backend the collectives run on the eager executor between inductor's groups.
TEST(Ddp, TwoRanksAdamWInductorMatchOneProcess) { expect_matches_one_process(true, true, {8, 8}, 5, "inductor"); }
// A process group the program made itself, handed over with set_process_group (and its store).
TEST(Ddp, OwnProcessGroupHandedToTheTrainer) {
  expect_matches_one_process(false, true, {8, 8}, 5, "eager", {"own_group=1"});
}
// A rank with another batch size: every rank's gradient counts alike (DistributedDataParallel's
// average), and the ranks still agree; the sizes are no part of what the ranks compare.
TEST(Ddp, RankWithAnotherBatchSizeAveragesTheRanks) { expect_matches_one_process(false, true, {8, 5, 8}); }
// With the overlap turned off (debug.no_comm_overlap) the all_reduces stay after the backward, and
// the result is the same.
TEST(Ddp, TwoRanksWithoutOverlapMatchOneProcess) {
  expect_matches_one_process(true, true, {8, 8}, 5, "inductor", {"no_overlap=1"});
}
// WORLD_SIZE=1 with ddp_backend named: a group of one rank, the collectives still in the step.
TEST(Ddp, WorldOfOneWithABackendNamedRunsTheCollectives) {
  expect_matches_one_process(true, true, {8}, 5, "eager", {"ddp_backend=gloo"});
}

// NCCL on this machine's GPU: one rank (a group of one, WORLD_SIZE=1 and ddp_backend = "nccl"), or
// one per GPU when there are more (up to two). The collectives run on NCCL inside the compiled step;
// under reduce-overhead the whole step, all_reduce included, is one CUDA graph launch.
void expect_nccl(const std::string& backend, const std::string& mode, int64_t steps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA GPU on this machine: NCCL is checked on the GPU machine";
  const int gpus = std::min<int>(2, static_cast<int>(at::detail::getCUDAHooks().deviceCount()));
  const std::vector<int64_t> sizes(static_cast<size_t>(gpus), 8);
  // Generated kernels (inductor) reorder float arithmetic: 1e-4 over the steps, as kiln bench holds them.
  const Ranks run =
      expect_matches_one_process(true, true, sizes, steps, backend, {"device=cuda", "ddp_backend=nccl", "mode=" + mode},
                                 at::Device(at::kCUDA, 0), backend == "inductor" ? 1e-4 : 1e-5);
  if (run.status.empty()) return;
  for (int r = 0; r < gpus; ++r) {
    const std::string& out = run.out[static_cast<size_t>(r)];
    EXPECT_NE(out.find("backend=" + backend), std::string::npos) << describe(run);
    if (mode == "reduce-overhead") {
      // Recorded once, then every compiled step after the recording is one replay.
      EXPECT_NE(out.find("graphs_recorded=1 "), std::string::npos) << describe(run);
      EXPECT_EQ(out.find("graph_replays=0 "), std::string::npos) << describe(run);
      EXPECT_EQ(out.find("graph_skip:"), std::string::npos) << describe(run);
    }
  }
  std::cout << "[ddp] NCCL, " << gpus << " rank(s), " << backend << " " << mode << ":\n" << run.out[0];
}

TEST(DdpCuda, NcclInductorDefaultModeMatchesOneProcess) { expect_nccl("inductor", "default", 6); }
TEST(DdpCuda, NcclAllReduceInsideTheWholeStepCudaGraph) { expect_nccl("inductor", "reduce-overhead", 8); }
TEST(DdpCuda, NcclCudagraphsBackendMatchesOneProcess) { expect_nccl("cudagraphs", "default", 8); }

// The logged losses of a metrics file, by step.
std::vector<double> logged_losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"loss\":");
    if (k != std::string::npos) out.push_back(std::stod(line.substr(k + 7)));
  }
  return out;
}

// Trainer::train on two ranks of 4 examples a micro-batch against one process of 8: each rank's
// share of every step's examples (DistributedSampler's) is half of what the one process takes, so
// the parameters and the logged losses (the mean over the ranks) agree; rank 0 alone writes the
// metrics and the checkpoint and logs the progress.
TEST(Ddp, TrainDealsEachRankItsShareAndMatchesOneProcess) {
  const uint64_t seed = 17;
  for (int64_t ga : {1, 2}) {
    SCOPED_TRACE("gradient_accumulation_steps " + std::to_string(ga));
    const int64_t steps = 5;
    Ranks run = launch(2,
                       {"seed=" + std::to_string(seed), "train=1", "steps=" + std::to_string(steps), "compile=1",
                        "sizes=4,4", "ga=" + std::to_string(ga)},
                       120);
    ASSERT_EQ(run.status[0], 0) << describe(run);
    ASSERT_EQ(run.status[1], 0) << describe(run);
    // With accumulation, the micro-steps and the updates: each's first two calls run eagerly.
    const int64_t compiled = ga == 1 ? steps - 2 : (steps * ga - 2) + (steps - 2);
    EXPECT_NE(run.out[0].find("compiled_steps=" + std::to_string(compiled)), std::string::npos) << describe(run);

    ddp::Setup s = ddp::make(seed, false);
    auto [xs, ys] = ddp::examples(seed, 48);
    kiln::TensorDataset data({xs}, ys);
    kiln::TrainingArguments a;
    const std::string dir = run.prefix + "_reference";
    ddp::train_settings(a, 8, ga, steps, dir);
    kiln::Trainer one(s.net, *s.opt, ddp::loss, a);
    one.train(data);

    const auto rank0 = load_params(run.prefix + ".rank0"), rank1 = load_params(run.prefix + ".rank1");
    double worst = 0;
    for (size_t i = 0; i < rank0.size(); ++i) {
      worst = std::max(worst, (rank0[i] - s.net->parameters()[i].detach()).abs().max().item<double>());
      EXPECT_TRUE(rank0[i].equal(rank1[i])) << "parameter " << i;
    }
    std::cout << "[ddp] train(), 2 ranks x 4 against 1 x 8, gradient_accumulation_steps " << ga
              << ": largest difference " << worst << "\n";
    EXPECT_LT(worst, 1e-5);
    // Rank 0 alone writes the metrics and the checkpoint, and logs its progress.
    EXPECT_TRUE(fs::exists(run.prefix + "_run0/checkpoint-" + std::to_string(steps)));
    EXPECT_FALSE(fs::exists(run.prefix + "_run1")) << "rank 1 wrote files";
    EXPECT_NE(run.err[0].find("step 1/" + std::to_string(steps)), std::string::npos) << describe(run);
    EXPECT_EQ(run.err[1].find("step 1/"), std::string::npos) << describe(run);
    const auto want = logged_losses(dir + "/metrics.jsonl"), got = logged_losses(run.prefix + "_run0/metrics.jsonl");
    ASSERT_EQ(want.size(), static_cast<size_t>(steps));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "step " << i + 1;
  }
}

TEST(Ddp, KilledRankFailsTheOthersNamingIt) {
  // Rank 2 exits at step 3 (after the step was compiled): ranks 0 and 1 fail in the compiled
  // step's all_reduce, well within the limit, naming rank 2.
  Ranks run = launch(3, {"steps=6", "compile=1", "sizes=4,4,4", "timeout=10", "die_rank=2", "die_step=3"}, 60);
  EXPECT_EQ(run.status[2], 3) << describe(run);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(run.status[r], 4) << "rank " << r << " must end with a DistributedError\n" << describe(run);
    EXPECT_NE(run.err[r].find("rank " + std::to_string(r) + ": step"), std::string::npos) << describe(run);
    EXPECT_NE(run.err[r].find("all_reduce"), std::string::npos) << describe(run);
    EXPECT_NE(run.err[r].find("rank 2 did not answer"), std::string::npos) << describe(run);
    EXPECT_LT(run.seconds[r], 30.0);
  }
}

TEST(Ddp, KilledRankDuringEagerStepFailsTheOthers) {
  Ranks run = launch(2, {"steps=4", "compile=0", "sizes=4,4", "timeout=10", "die_rank=1", "die_step=1"}, 60);
  EXPECT_EQ(run.status[1], 3) << describe(run);
  EXPECT_EQ(run.status[0], 4) << describe(run);
  EXPECT_NE(run.err[0].find("all_reduce of gradient bucket"), std::string::npos) << describe(run);
  EXPECT_NE(run.err[0].find("rank 1 did not answer"), std::string::npos) << describe(run);
}

TEST(Ddp, KilledRankZeroIsNamedThroughItsStoreBeingGone) {
  // Rank 0 hosts the store: when it dies the others cannot ask who is alive, and say why.
  Ranks run = launch(2, {"steps=6", "compile=1", "sizes=4,4", "timeout=10", "die_rank=0", "die_step=3"}, 60);
  EXPECT_EQ(run.status[0], 3) << describe(run);
  EXPECT_EQ(run.status[1], 4) << describe(run);
  EXPECT_NE(run.err[1].find("rank 1: step 4 failed in the compiled step"), std::string::npos) << describe(run);
  EXPECT_NE(run.err[1].find("the store on rank 0 does not answer: rank 0 died"), std::string::npos) << describe(run);
  EXPECT_LT(run.seconds[1], 30.0);
}

TEST(Ddp, HungRankFailsTheOthersWithinTheTimeout) {
  // Rank 1 sleeps before step 3; rank 0 gives up after ddp_timeout (3 s) and names it.
  const auto t0 = std::chrono::steady_clock::now();
  Ranks run = launch(2, {"steps=5", "compile=1", "sizes=4,4", "timeout=3", "hang_rank=1", "hang_step=3"}, 40, 0);
  (void)t0;
  EXPECT_EQ(run.status[0], 4) << describe(run);
  EXPECT_EQ(run.status[1], -1) << "the hung rank is still asleep when rank 0 has given up";
  EXPECT_NE(run.err[0].find("rank 1 did not answer"), std::string::npos) << describe(run);
  EXPECT_LT(run.seconds[0], 25.0) << describe(run);
}

TEST(Ddp, RanksThatCapturedDifferentStepsAreStoppedBeforeTheirCollectives) {
  // Rank 1 clips its gradients (another step function): after the capture the ranks compare their
  // compiled steps and both stop, before any compiled collective runs.
  Ranks run = launch(2, {"steps=4", "compile=1", "sizes=4,4", "timeout=10", "clip_rank=1"}, 60);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(run.status[r], 4) << describe(run);
    EXPECT_NE(run.err[r].find("captured different steps"), std::string::npos) << describe(run);
  }
}

TEST(Ddp, RankWithAnotherModelIsNamedBeforeAnyCollective) {
  Ranks run = launch(3, {"steps=2", "compile=1", "sizes=4,4,4", "timeout=10", "other_model_rank=2"}, 60);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(run.status[r], 4) << describe(run);
    EXPECT_NE(run.err[r].find("the ranks' models differ (rank 2 against rank 0)"), std::string::npos) << describe(run);
  }
  EXPECT_NE(run.err[2].find("extra [3] Float cpu"), std::string::npos) << describe(run);
}

TEST(Ddp, ParameterWithoutGradientIsAnErrorUnlessFindUnused) {
  // Rank 1's forward leaves the head out: its head gets no gradient.
  Ranks run = launch(2, {"steps=3", "compile=0", "sizes=4,4", "timeout=5", "unused_rank=1"}, 60);
  EXPECT_EQ(run.status[1], 4) << describe(run);
  EXPECT_NE(run.err[1].find("the parameter '4.bias' got no gradient"), std::string::npos) << describe(run);
  EXPECT_NE(run.err[1].find("ddp_find_unused_parameters"), std::string::npos) << describe(run);
  EXPECT_EQ(run.status[0], 4) << describe(run);
  // With ddp_find_unused_parameters its gradient counts as zero: the ranks train on and agree.
  run = launch(2, {"steps=4", "compile=0", "sizes=4,4", "timeout=5", "unused_rank=1", "find_unused=1"}, 60);
  ASSERT_EQ(run.status[0], 0) << describe(run);
  ASSERT_EQ(run.status[1], 0) << describe(run);
  const auto a = load_params(run.prefix + ".rank0"), b = load_params(run.prefix + ".rank1");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
  // Compiled, the two ranks' steps differ (one leaves the head out): stopped after the capture.
  run = launch(2, {"steps=4", "compile=1", "sizes=4,4", "timeout=5", "unused_rank=1", "find_unused=1"}, 60);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(run.status[r], 4) << describe(run);
    EXPECT_NE(run.err[r].find("captured different steps"), std::string::npos) << describe(run);
  }
}

// ---- in this process: the environment ------------------------------------------------------------

namespace {
struct Env {
  std::vector<std::string> names;
  void set(const std::string& k, const std::string& v) {
    ::setenv(k.c_str(), v.c_str(), 1);
    names.push_back(k);
  }
  ~Env() {
    for (const auto& k : names) ::unsetenv(k.c_str());
  }
};
}  // namespace

TEST(DdpEnvironment, WorldOfOneMakesNoGroup) {
  Env env;
  env.set("WORLD_SIZE", "1");
  env.set("RANK", "3");  // means nothing without a world
  ddp::Setup s = ddp::make(1, false);
  kiln::Trainer t(s.net, *s.opt, ddp::loss);
  EXPECT_EQ(t.world_size(), 1);
  EXPECT_EQ(t.process_index(), 0);
  EXPECT_TRUE(t.is_world_process_zero());
}

TEST(DdpEnvironment, MissingOrBadVariablesAreNamed) {
  {
    Env env;
    env.set("WORLD_SIZE", "2");
    env.set("RANK", "0");
    try {
      kiln::distributed::world_from_env();
      FAIL() << "no MASTER_ADDR";
    } catch (const kiln::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
    }
  }
  {
    Env env;
    env.set("WORLD_SIZE", "2");
    env.set("RANK", "2");
    try {
      kiln::distributed::world_from_env();
      FAIL() << "RANK out of range";
    } catch (const kiln::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos) << e.what();
    }
  }
  {
    Env env;
    env.set("WORLD_SIZE", "two");
    EXPECT_THROW(kiln::distributed::world_from_env(), kiln::ConfigError);
  }
}

TEST(DdpEnvironment, NcclWithoutGpuFailsClearly) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has a CUDA GPU";
  Env env;
  env.set("WORLD_SIZE", "2");
  env.set("RANK", "0");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(free_port()));
  kiln::TrainingArguments args;
  args.ddp_backend = "nccl";
  try {
    kiln::distributed::group_from_env(args);
    FAIL() << "nccl without a GPU";
  } catch (const kiln::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA GPU"), std::string::npos) << e.what();
  }
}
