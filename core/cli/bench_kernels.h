// `kiln bench --kernels`: what a steady-state step launches, from LibTorch's profiler (Kineto).
//
// On CUDA: the kernels a step runs on the device (CUPTI's kernel records, which include the kernels
// launched through the driver API and every kernel node of a CUDA graph replay), their GPU time, the
// share of kiln's generated kernels (named kiln_k<N>... by the inductor plugin) and the host's launch
// calls. On the CPU there are no kernel launches to count: kiln's generated kernels are functions the
// plugin calls, which the profiler does not see, so the report counts the ATen operator calls a step
// makes instead (the outermost ones, as the dispatcher records them).
//
// The profiler part (profile_steps) needs LibTorch; the rest is plain data, so that the tests can
// check the classification and the arithmetic without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/internal/json_text.h"

namespace kiln::cli {

// Where a kernel comes from, by its name.
enum class KernelOrigin {
  Generated,    // kiln's generated kernels: kiln_k<N>, kiln_k<N>_<M> (plugins/inductor/codegen_cuda.cpp)
  KilnRuntime,  // the plugin's own support kernels, from its prelude: kiln_set_scalars, kiln_strided_copy, ...
  Library,      // everything else: ATen, cuBLAS, cuDNN, flash attention, memcpy and memset
};
KernelOrigin classify_kernel(const std::string& name);
const char* origin_name(KernelOrigin origin);  // "generated", "kiln_runtime", "library"

// One activity the profiler recorded: a device activity (a kernel, or a memcpy/memset on the device),
// a host launch call (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...), or a CPU operator call.
struct ProfiledActivity {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t thread = 0;     // CPU operator calls: the thread that made the call
  bool is_kernel = false;  // device activities: a kernel (not a memcpy/memset)
};

// What one side's profiled steps recorded.
struct ProfileCapture {
  bool ok = false;
  std::string error;                          // why nothing could be recorded (ok == false)
  std::vector<ProfiledActivity> device;       // CUDA: kernels, memcpy and memset on the device
  std::vector<ProfiledActivity> launches;     // CUDA: the host's launch calls (runtime and driver API)
  std::vector<ProfiledActivity> cpu_ops;      // CPU operator calls (every one, nested ones included)
  uint64_t window_start = 0, window_end = 0;  // the profiled steps' range (0, 0: not found)
  int steps = 0;                              // steps in the window
  int total_steps = 0;                        // steps in the whole profile (the lead-in step included)
};

// Runs `lead_in` steps and then `steps` steps under the profiler (CPU, and CUDA when `cuda`), the
// latter inside a range marker that ends after a device synchronisation, and returns what it recorded.
// Never throws: a profiler that cannot start gives ok == false and the reason.
ProfileCapture profile_steps(const std::function<void()>& step, bool cuda, int lead_in, int steps);

struct KernelTotal {
  std::string name;
  KernelOrigin origin = KernelOrigin::Library;
  double per_step = 0;     // calls per step
  double us_per_step = 0;  // time per step (device time for kernels, host time for CPU operators)
};

// CUDA: the device idle between one activity's end and the next one's start (in start order, after
// every earlier activity has ended), summed per pair of names: where a step's time goes that no
// kernel takes (a CUDA graph's node-to-node latency, a memcpy node, the host between two replays).
struct IdleGap {
  std::string before, after;  // the activity that ended last, the one that started next
  double per_step = 0;        // gaps per step
  double us_per_step = 0;     // idle time per step
};

// The per-step numbers of one side.
struct KernelSummary {
  bool ok = false;
  std::string note;             // how the numbers were taken when not from the marked steps, or why none
  bool windowed = false;        // counted inside the profiled steps' range (else over the whole profile)
  int steps = 0;                // steps the numbers are divided by
  double kernels_per_step = 0;  // CUDA: kernels; CPU: outermost operator calls
  double copies_per_step = 0;   // CUDA: memcpy and memset on the device
  double generated_per_step = 0, kiln_runtime_per_step = 0;
  double busy_us_per_step = 0;    // CUDA: time the device ran anything (union of the activities)
  double kernel_us_per_step = 0;  // CUDA: sum of kernel durations; CPU: of outermost operator calls
  double generated_us_per_step = 0, kiln_runtime_us_per_step = 0;
  double generated_share = 0;          // generated_us / kernel_us
  double launch_calls_per_step = 0;    // CUDA host calls that launch one kernel
  double graph_launches_per_step = 0;  // CUDA host calls that launch a graph
  std::vector<KernelTotal> top;        // by time, longest first
  double idle_us_per_step = 0;         // CUDA: the device idle inside the profiled steps' range
  std::vector<IdleGap> gaps;           // CUDA: the largest idle gaps by pair, longest first
};

// Activities of `capture` that started inside its window; the whole profile when the window was not
// recorded or holds nothing while the profile does (the summary's note then says so).
KernelSummary summarize_cuda(const ProfileCapture& capture, size_t top_n);
KernelSummary summarize_cpu(const ProfileCapture& capture, size_t top_n);

// The calls that no other call on the same thread encloses.
std::vector<ProfiledActivity> outermost(std::vector<ProfiledActivity> calls);

// Host API calls that launch device work: "kernel", "graph" or "" (not a launch).
const char* launch_kind(const std::string& api_name);

// The JSON object of a summary.
Json summary_json(const KernelSummary& s, bool cuda);

// `v` as printf's "%.<decimals>f" and "%.<digits - 1>e" round it: the JSON reports carry the digits a
// measurement has (0.01, not 0.010000000000000009). Not finite stays so (JSON null).
double rounded(double v, int decimals);
double significant(double v, int digits);

}  // namespace kiln::cli
