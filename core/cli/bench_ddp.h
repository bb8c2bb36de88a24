// `kiln bench WORKLOAD --nproc N`: data-parallel training of a reference workload through
// kiln::Trainer, N ranks on this machine (torchrun's environment, Gloo on CPUs, NCCL on GPUs), next
// to one process training the same per-rank batch. Each side is LibTorch eager (the Trainer with
// torch_compile off: the same bucketed all_reduce, run as it comes) and kiln (the compiled step, the
// collectives inside it). Reports ms per step, throughput, scaling and the share of the N-rank step
// that communication adds (1 - one process's step / N ranks' step).
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

struct DdpBenchOptions {
  std::string workload, device, backend, mode, optimizer, dtype, ddp_backend;
  std::vector<std::string> plugin_dirs;
  int steps = 20;
  int64_t batch = 0;
  int nproc = 1;
  bool json = false;
};

// The launcher: starts the one-process run, then the N ranks (this executable again, with --ddp-child),
// collects what each printed and prints the report. Returns the exit status.
int bench_ddp(const DdpBenchOptions& o);

// One process of it (under the torchrun environment for the ranks, without it for the one-process
// run): trains eager then compiled and prints one JSON line.
int bench_ddp_child(const DdpBenchOptions& o);

}  // namespace kiln::cli
