// `kiln bench --kernels` (bench_kernels.h): LibTorch's Kineto profiler around a few steady-state
// steps, and the per-step arithmetic over what it recorded.
//
// What CUPTI reports (CUDA 13.0, the CUPTI of the torch==2.11.0+cu130 wheel): Kineto enables
// CUPTI's CONCURRENT_KERNEL activity (not GRAPH_TRACE), so every kernel node of a replayed CUDA graph
// comes as its own kernel record (with the graph's and the node's ids), the same as a kernel launched
// from the host; kernels launched through the driver API (cuLaunchKernel: kiln's NVRTC-compiled
// kernels) are recorded like the runtime's. The host side shows one cudaGraphLaunch per replay.
// CUPTI before CUDA 13.1 Update 1 gives wrong correlation ids to cudaGraphLaunch calls and their
// kernels in every profiling run after the first; nothing here uses correlation ids: device records are
// counted by the time they started, inside the range of the profiled steps.
#include "bench_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <set>
#include <utility>

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#if __has_include(<kineto/ActivityType.h>)
#include <kineto/ActivityType.h>
#define KILN_HAVE_KINETO_ACTIVITY_TYPE 1
#endif

namespace kiln::cli {
namespace {

// KinetoEvent::activityType() is libkineto::ActivityType as a byte.
constexpr uint8_t kCpuOp = 0, kUserAnnotation = 1, kGpuMemcpy = 3, kGpuMemset = 4, kKernel = 5, kCudaRuntime = 7,
                  kCudaDriver = 8;
#ifdef KILN_HAVE_KINETO_ACTIVITY_TYPE
static_assert(kCpuOp == static_cast<uint8_t>(libkineto::ActivityType::CPU_OP));
static_assert(kUserAnnotation == static_cast<uint8_t>(libkineto::ActivityType::USER_ANNOTATION));
static_assert(kGpuMemcpy == static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMCPY));
static_assert(kGpuMemset == static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMSET));
static_assert(kKernel == static_cast<uint8_t>(libkineto::ActivityType::CONCURRENT_KERNEL));
static_assert(kCudaRuntime == static_cast<uint8_t>(libkineto::ActivityType::CUDA_RUNTIME));
static_assert(kCudaDriver == static_cast<uint8_t>(libkineto::ActivityType::CUDA_DRIVER));
#endif

constexpr const char* kWindowName = "kiln_bench::profiled_steps";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Time covered by at least one of the intervals.
uint64_t union_ns(std::vector<std::pair<uint64_t, uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  uint64_t total = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : iv) {
    if (e <= s) continue;
    if (!open || s > cur_end) {
      if (open) total += cur_end - cur_start;
      cur_start = s, cur_end = e, open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += cur_end - cur_start;
  return total;
}

// The activities to count: those that started inside the window, or all when there is no usable
// window (then `s.note` says so and `s.steps` is the whole profile's).
std::vector<const ProfiledActivity*> in_window(const ProfileCapture& c, const std::vector<ProfiledActivity>& all,
                                               KernelSummary& s) {
  std::vector<const ProfiledActivity*> out;
  if (c.window_end > c.window_start)
    for (const auto& a : all)
      if (a.start_ns >= c.window_start && a.start_ns <= c.window_end) out.push_back(&a);
  if (!out.empty() || all.empty()) {
    s.windowed = c.window_end > c.window_start;
    s.steps = c.steps;
    // Steady-state steps are alike, so the range should hold its steps' share of the whole profile's
    // records; when it does not, say so (host and device clocks apart, or records dropped).
    const double expected = static_cast<double>(all.size()) * c.steps / std::max(c.total_steps, 1);
    if (s.windowed && std::abs(static_cast<double>(out.size()) - expected) > 0.05 * expected + 1)
      s.note = std::to_string(out.size()) + " of the profile's " + std::to_string(all.size()) +
               " records fell inside the range of the " + std::to_string(c.steps) + " profiled steps, where alike " +
               "steps would put " + fmt("%.0f", expected) + ": the clocks may be apart, or records were dropped";
    return out;
  }
  for (const auto& a : all) out.push_back(&a);
  s.windowed = false;
  s.steps = c.total_steps;
  s.note = c.window_end > c.window_start ? "no activity started inside the profiled steps' range (clocks apart?): "
                                           "counted over the whole profile, the lead-in step included"
                                         : "the profiled steps' range was not recorded: counted over the whole "
                                           "profile, the lead-in step included";
  return out;
}

std::vector<KernelTotal> top_by_time(const std::vector<const ProfiledActivity*>& acts, int steps, size_t top_n) {
  std::map<std::string, std::pair<size_t, uint64_t>> by_name;  // name -> (calls, ns)
  for (const auto* a : acts) {
    auto& [n, ns] = by_name[a->name];
    ++n;
    ns += a->end_ns > a->start_ns ? a->end_ns - a->start_ns : 0;
  }
  std::vector<KernelTotal> out;
  for (const auto& [name, v] : by_name)
    out.push_back(
        KernelTotal{name, classify_kernel(name), static_cast<double>(v.first) / steps, v.second / 1e3 / steps});
  std::sort(out.begin(), out.end(), [](const KernelTotal& a, const KernelTotal& b) {
    return a.us_per_step != b.us_per_step ? a.us_per_step > b.us_per_step : a.name < b.name;
  });
  if (out.size() > top_n) out.resize(top_n);
  return out;
}

// Idle time between consecutive device activities (by start), by the pair of names around it.
std::vector<IdleGap> idle_gaps(std::vector<const ProfiledActivity*> acts, int steps, size_t top_n, double& idle_us) {
  std::sort(acts.begin(), acts.end(),
            [](const ProfiledActivity* a, const ProfiledActivity* b) { return a->start_ns < b->start_ns; });
  std::map<std::pair<std::string, std::string>, std::pair<size_t, uint64_t>> by_pair;
  uint64_t end = 0, idle = 0;
  const ProfiledActivity* last = nullptr;  // the activity that ends at `end`
  for (const auto* a : acts) {
    if (last && a->start_ns > end) {
      auto& [n, ns] = by_pair[{last->name, a->name}];
      ++n;
      ns += a->start_ns - end;
      idle += a->start_ns - end;
    }
    if (!last || a->end_ns >= end) end = a->end_ns, last = a;
  }
  idle_us = idle / 1e3 / steps;
  std::vector<IdleGap> out;
  for (const auto& [names, v] : by_pair)
    out.push_back(IdleGap{names.first, names.second, static_cast<double>(v.first) / steps, v.second / 1e3 / steps});
  std::sort(out.begin(), out.end(), [](const IdleGap& a, const IdleGap& b) {
    return a.us_per_step != b.us_per_step ? a.us_per_step > b.us_per_step : a.before + a.after < b.before + b.after;
  });
  if (out.size() > top_n) out.resize(top_n);
  return out;
}

}  // namespace

KernelOrigin classify_kernel(const std::string& name) {
  // kiln_k<N>: a kernel plan's; kiln_h<N>: several of them fused into one launch.
  if ((starts_with(name, "kiln_k") || starts_with(name, "kiln_h")) && name.size() > 6 && name[6] >= '0' &&
      name[6] <= '9')
    return KernelOrigin::Generated;
  if (starts_with(name, "kiln_")) return KernelOrigin::KilnRuntime;
  return KernelOrigin::Library;
}

const char* origin_name(KernelOrigin origin) {
  switch (origin) {
    case KernelOrigin::Generated: return "generated";
    case KernelOrigin::KilnRuntime: return "kiln_runtime";
    case KernelOrigin::Library: break;
  }
  return "library";
}

const char* launch_kind(const std::string& api) {
  if (starts_with(api, "cudaGraphLaunch") || starts_with(api, "cuGraphLaunch")) return "graph";
  if (starts_with(api, "cudaLaunchKernel") || starts_with(api, "cuLaunchKernel") ||
      starts_with(api, "cudaLaunchCooperativeKernel") || starts_with(api, "cuLaunchCooperativeKernel") ||
      starts_with(api, "cudaLaunchKernelExC") || starts_with(api, "cuLaunchKernelEx"))
    return "kernel";
  return "";
}

std::vector<ProfiledActivity> outermost(std::vector<ProfiledActivity> calls) {
  // Per thread, by start (the longer first when two start together): a call is outermost when it
  // starts after every earlier outermost call on its thread has ended.
  std::sort(calls.begin(), calls.end(), [](const ProfiledActivity& a, const ProfiledActivity& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;
  });
  std::vector<ProfiledActivity> out;
  bool have = false;
  uint64_t thread = 0, open_until = 0;
  for (auto& c : calls) {
    if (!have || c.thread != thread || c.start_ns >= open_until) {
      have = true, thread = c.thread, open_until = c.end_ns;
      out.push_back(std::move(c));
    }
  }
  return out;
}

KernelSummary summarize_cuda(const ProfileCapture& c, size_t top_n) {
  KernelSummary s;
  if (!c.ok) {
    s.note = c.error;
    return s;
  }
  const auto device = in_window(c, c.device, s);
  if (s.steps <= 0) {
    s.note = "no profiled steps";
    return s;
  }
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  std::vector<const ProfiledActivity*> kernels;
  double kernel_ns = 0, gen_ns = 0, rt_ns = 0;
  size_t n_kernels = 0, n_copies = 0, n_gen = 0, n_rt = 0;
  for (const auto* a : device) {
    intervals.emplace_back(a->start_ns, a->end_ns);
    const double ns = a->end_ns > a->start_ns ? static_cast<double>(a->end_ns - a->start_ns) : 0.0;
    if (!a->is_kernel) {
      ++n_copies;
      continue;
    }
    ++n_kernels;
    kernel_ns += ns;
    kernels.push_back(a);
    switch (classify_kernel(a->name)) {
      case KernelOrigin::Generated: ++n_gen, gen_ns += ns; break;
      case KernelOrigin::KilnRuntime: ++n_rt, rt_ns += ns; break;
      case KernelOrigin::Library: break;
    }
  }
  const double n = s.steps;
  s.kernels_per_step = n_kernels / n;
  s.copies_per_step = n_copies / n;
  s.generated_per_step = n_gen / n;
  s.kiln_runtime_per_step = n_rt / n;
  s.busy_us_per_step = union_ns(intervals) / 1e3 / n;
  s.kernel_us_per_step = kernel_ns / 1e3 / n;
  s.generated_us_per_step = gen_ns / 1e3 / n;
  s.kiln_runtime_us_per_step = rt_ns / 1e3 / n;
  s.generated_share = kernel_ns > 0 ? gen_ns / kernel_ns : 0;
  // Launch calls are host events: inside the window by their own start, like the device's.
  KernelSummary unused;
  size_t n_launch = 0, n_graph = 0;
  for (const auto* a : in_window(c, c.launches, unused)) {
    const std::string kind = launch_kind(a->name);
    n_launch += kind == "kernel";
    n_graph += kind == "graph";
  }
  s.launch_calls_per_step = n_launch / n;
  s.graph_launches_per_step = n_graph / n;
  s.top = top_by_time(device, s.steps, top_n);
  s.gaps = idle_gaps(device, s.steps, top_n, s.idle_us_per_step);
  s.ok = n_kernels > 0;
  if (!s.ok && s.note.empty())
    s.note = "the profiler recorded no CUDA kernel (no CUPTI in this LibTorch, or CUPTI could not start)";
  return s;
}

KernelSummary summarize_cpu(const ProfileCapture& c, size_t top_n) {
  KernelSummary s;
  if (!c.ok) {
    s.note = c.error;
    return s;
  }
  const std::vector<ProfiledActivity> top_level = outermost(c.cpu_ops);
  const auto calls = in_window(c, top_level, s);
  if (s.steps <= 0) {
    s.note = "no profiled steps";
    return s;
  }
  double ns = 0;
  for (const auto* a : calls) ns += a->end_ns > a->start_ns ? static_cast<double>(a->end_ns - a->start_ns) : 0.0;
  s.kernels_per_step = calls.size() / static_cast<double>(s.steps);
  s.kernel_us_per_step = ns / 1e3 / s.steps;
  s.top = top_by_time(calls, s.steps, top_n);
  s.ok = !calls.empty();
  if (!s.ok && s.note.empty()) s.note = "the profiler recorded no operator call";
  return s;
}

double rounded(double v, int decimals) {
  char buf[512];  // %f of the largest double: 309 digits
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return std::strtod(buf, nullptr);
}

double significant(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
  return std::strtod(buf, nullptr);
}

Json summary_json(const KernelSummary& s, bool cuda) {
  Json j = {{"ok", s.ok}, {"note", s.note}, {"windowed", s.windowed}, {"steps", s.steps}};
  if (cuda) {
    j["kernels_per_step"] = rounded(s.kernels_per_step, 2);
    j["copies_per_step"] = rounded(s.copies_per_step, 2);
    j["generated_kernels_per_step"] = rounded(s.generated_per_step, 2);
    j["kiln_runtime_kernels_per_step"] = rounded(s.kiln_runtime_per_step, 2);
    j["gpu_busy_us_per_step"] = rounded(s.busy_us_per_step, 3);
    j["kernel_us_per_step"] = rounded(s.kernel_us_per_step, 3);
    j["generated_us_per_step"] = rounded(s.generated_us_per_step, 3);
    j["kiln_runtime_us_per_step"] = rounded(s.kiln_runtime_us_per_step, 3);
    j["generated_share"] = rounded(s.generated_share, 4);
    j["launch_calls_per_step"] = rounded(s.launch_calls_per_step, 2);
    j["graph_launches_per_step"] = rounded(s.graph_launches_per_step, 2);
    j["idle_us_per_step"] = rounded(s.idle_us_per_step, 3);
    j["idle_gaps"] = Json::array();
    for (const auto& gap : s.gaps)
      j["idle_gaps"].push_back({{"before", gap.before},
                                {"after", gap.after},
                                {"per_step", rounded(gap.per_step, 2)},
                                {"us_per_step", rounded(gap.us_per_step, 3)}});
  } else {
    j["op_calls_per_step"] = rounded(s.kernels_per_step, 2);
    j["op_us_per_step"] = rounded(s.kernel_us_per_step, 3);
  }
  j["top"] = Json::array();
  for (const auto& t : s.top)
    j["top"].push_back({{"name", t.name},
                        {"origin", origin_name(t.origin)},
                        {"per_step", rounded(t.per_step, 2)},
                        {"us_per_step", rounded(t.us_per_step, 3)}});
  return j;
}

ProfileCapture profile_steps(const std::function<void()>& step, bool cuda, int lead_in, int steps) {
  namespace prof = torch::autograd::profiler;
  ProfileCapture c;
  c.steps = steps;
  c.total_steps = lead_in + steps;
  std::unique_ptr<prof::ProfilerResult> result;
  try {
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (cuda) activities.insert(prof::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    c.error = std::string("LibTorch's profiler could not start: ") + e.what();
    return c;
  }
  try {
    for (int i = 0; i < lead_in; ++i) step();
    if (cuda) torch::cuda::synchronize();
    {
      RECORD_USER_SCOPE(kWindowName);
      for (int i = 0; i < steps; ++i) step();
      if (cuda) torch::cuda::synchronize();
    }
    result = prof::disableProfiler();
  } catch (const std::exception& e) {
    try {
      (void)prof::disableProfiler();
    } catch (const std::exception&) {
    }
    c.error = std::string("a profiled step failed: ") + e.what();
    return c;
  }
  if (!result) {
    c.error = "LibTorch's profiler returned no result";
    return c;
  }
  for (const auto& e : result->events()) {
    const uint8_t type = e.activityType();
    ProfiledActivity a{e.name(), e.startNs(), e.endNs(), e.startThreadId(), type == kKernel};
    if (a.name == kWindowName) {
      // The host's range (a GPU-side annotation of the same name, if any, is left out).
      if (type == kUserAnnotation || type == kCpuOp) c.window_start = a.start_ns, c.window_end = a.end_ns;
    } else if (type == kKernel || type == kGpuMemcpy || type == kGpuMemset) {
      c.device.push_back(std::move(a));
    } else if (type == kCudaRuntime || type == kCudaDriver) {
      c.launches.push_back(std::move(a));
    } else if (type == kCpuOp && e.deviceType() == c10::DeviceType::CPU) {
      c.cpu_ops.push_back(std::move(a));
    }
  }
  c.ok = true;
  return c;
}

}  // namespace kiln::cli
