// `kiln bench gpt --dynamic MIN:MAX`: the gpt workload (or gpt-medium, the same model at GPT-2 small's
// size) trained at a sequence length that changes every step, drawn uniformly from [MIN, MAX] by dynamic_lengths
// (kiln/workloads.h) from a fixed seed, so that bench/reference.py --dynamic trains PyTorch on exactly the same
// lengths. In one process, one after the other and each from the same initial weights, four modes:
//
//   LibTorch eager            the workload's step as it is
//   kiln dynamic=<config>     kiln::compile_step with the configuration's [runtime] dynamic
//                             (TrainingArguments::runtime.dynamic, KILN_DYNAMIC; "auto" by default)
//   kiln dynamic=false        the same with dynamic = "false": one plan per shape
//   kiln static T=<mean>      kiln with every step at the lengths' mean (rounded): one shape, the
//                             bar a dynamic step is measured against
//
// Then, unless the configuration's dynamic is "false", the same-length comparison: at MIN, the mean
// and MAX, the dynamic mode's compiled step against a static plan made for that length alone
// (dynamic = "false"), one step of each per round (--same-length-rounds, 8 by default), which is
// how the dynamic step's speed is judged against a static plan at the same length.
//
// Every step is timed alone and ends in a device sync. A step is warm-up when it is a mode's first
// (kiln's eager step; LibTorch's first allocations) or when it captured, compiled, re-planned or
// specialised a plan (StepStats' compiles, shape_specialisations, rebuilds, recaptures or
// graphs_recorded changed during it); every other step is steady. The report gives both apart and
// together, in tokens per second (batch x length summed over the steps, over their time), so that
// no compile is hidden from the total and none inflates the steady figure. Each kiln mode compiles
// into a cache folder of its own (<cache_dir>/bench-dynamic-<mode>), so that none loads kernels
// another one compiled in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

struct DynamicBenchOptions {
  std::string workload, device, backend, mode, optimizer, dtype, attention;
  std::vector<std::string> plugin_dirs;
  int64_t min_length = 0, max_length = 0;
  uint64_t seed = 1234;  // of the lengths (the weights and the batch are kiln bench's seed 1234 always)
  int steps = 120;
  int64_t batch = 0;
  int same_length_rounds = 8;  // rounds per length of the same-length comparison (0: none)
  double tolerance = -1;
  bool check = false, check_grads = false, json = false, trace = false;
};

// "MIN:MAX" into *min and *max; returns what is wrong with `text` ("" when it is right): two
// integers, 1 <= MIN <= MAX.
std::string parse_dynamic_range(const std::string& text, int64_t* min, int64_t* max);

// Runs the benchmark and prints its report; returns the exit status (1 when --check failed).
int bench_dynamic(const DynamicBenchOptions& o);

}  // namespace kiln::cli
