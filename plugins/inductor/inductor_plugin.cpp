// The inductor backend: claims pointwise ops, reductions, views and the optimizer's pointwise
// chains (lowering.h) and fuses them into loop nests (schedule.h). On the CPU it compiles the
// generated C++ (codegen.h) with the system compiler into a cached shared library (toolchain.h)
// and runs it; on CUDA it generates CUDA kernels (codegen_cuda.h), compiles them with NVRTC into a
// cached cubin and launches them through the driver API (cuda_nvrtc.h, cuda_driver.h: both
// dlopened). Matmul, convolution and attention inside a group run through the host's call_eager
// ("extern kernels"). Links only the plugin API, libdl and pthreads; the generated C++ links
// OpenMP.
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <exception>
#include <thread>

#include <kiln/plugin_api.hpp>

#include "codegen.h"
#include "codegen_cuda.h"
#include "gemm_fold.h"
#include "cublaslt.h"
#include "cuda_driver.h"
#include "cuda_nvrtc.h"
#include "lowering.h"
#include "scratch_plan.h"
#include "toolchain.h"

namespace {

using namespace kiln::plugin;
using namespace kiln::inductor;

using KernelFn = void (*)(void**, const double*, int);

struct Settings {
  int threads = 0;              // resolved: 0 in the options becomes the OpenMP runtime's count at compile time
  bool follow_runtime = false;  // threads = 0: each execute uses the OpenMP runtime's current count
  std::string cxx;
  std::vector<std::string> cflags;
  bool extern_kernels = true;
  bool profile = false;
  std::string nvrtc;               // libnvrtc, or its directory (empty: searched; cuda_nvrtc.h)
  bool cuda = true;                // generate CUDA kernels; false leaves the nodes on CUDA to ATen
  bool horizontal_fusion = true;   // small independent CUDA launches become one (fuse_small_launches)
  bool sibling_reductions = true;  // CUDA column reductions over the same rows share a kernel
  // CUDA matmuls through cuBLASLt (else ATen's, through call_eager), and their neighbours folded
  // into the GEMMs' epilogues (gemm_fold.h).
  // Off by default until the folds have run on a GPU (docs/backends/inductor.md).
  std::string gemm = "aten";  // epilogues | cublaslt | aten
  // Kernels whose numbers are arguments (CPU: hoist_literals; CUDA: resolve_sizes): "auto" from
  // the second shape of the same kernels on (the first is compiled with its sizes as constants),
  // "always", "never".
  std::string size_args = "auto";
  // Debugging the scratch plan (scratch_plan.h): after each step, the scratch slots whose last
  // step it was are filled with 0xFF bytes (NaN in every float type), so that a slot read after
  // it is dead, or two live slots planned onto the same bytes, give NaN instead of a quiet error.
  bool poison_scratch = false;
};

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream ss(s);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return false;
  throw Error(KILN_ERROR_INVALID_ARGUMENT, "[plugin.inductor] " + key + " = '" + v + "' is not a boolean");
}

// Only without an OpenMP runtime to ask (runtime_threads): the CPUs this process may run on (its
// affinity mask, so `taskset` is honoured). The runtime itself reads OMP_NUM_THREADS.
int default_threads() {
  int n = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::max<long>(sysconf(_SC_NPROCESSORS_ONLN), 1));
  return n;
}

using OmpMaxThreads = int (*)();
int runtime_threads(OmpMaxThreads from_library);

// Whether kernels with these hoisted numbers were compiled in this process before for other
// numbers (another shape): the first shape is compiled with its sizes as constants, as a static
// step would be, and the second turns the numbers into arguments, once for every later shape.
bool second_shape_of(const std::string& hoisted, const std::string& source) {
  static std::mutex m;
  static std::map<std::string, std::string> first;  // hash of the hoisted text -> of the first source
  const std::string h = hash_hex(hoisted), src = hash_hex(source);
  std::lock_guard<std::mutex> lock(m);
  auto [it, fresh] = first.emplace(h, src);
  return !fresh && it->second != src;
}

// Which of a CUDA program's marked numbers (size_literals) its kernels read from their module's
// table. The first shape of a skeleton (size_skeleton) is compiled with every number a constant, as
// a static step would be; a later shape of it makes the numbers that differ from the first shape's
// table entries (and keeps those of earlier shapes: the set only grows), so every shape after
// that gives the same source and NVRTC runs no more. The numbers no shape changed (a model's
// width, a head's size, the constants of GELU) stay constants the compiler folds.
std::vector<bool> cuda_size_hoist(const CudaProgram& prog, const std::string& mode) {
  const std::vector<std::string> numbers = size_literals(prog);
  if (mode == "always") return std::vector<bool>(numbers.size(), true);
  struct Seen {
    std::vector<std::string> first;
    std::vector<bool> hoist;
  };
  static std::mutex m;
  static std::map<std::string, Seen> seen;  // by hash of the skeleton
  const std::string key = hash_hex(size_skeleton(prog));
  std::lock_guard<std::mutex> lock(m);
  auto [it, fresh] = seen.emplace(key, Seen{numbers, std::vector<bool>(numbers.size(), false)});
  if (fresh || it->second.first == numbers) return {};
  Seen& s = it->second;
  for (size_t k = 0; k < numbers.size(); ++k)
    if (numbers[k] != s.first[k]) s.hoist[k] = true;
  return s.hoist;
}

Settings parse_settings(const std::map<std::string, std::string>& options) {
  Settings s;
  for (const auto& [key, value] : options) {
    if (key == "poison_scratch") {
      s.poison_scratch = parse_bool(key, value);
    } else if (key == "threads") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end || n < 0 || n > 4096)
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "[plugin.inductor] threads = '" + value + "' is not a thread count (0 = all)");
      s.threads = static_cast<int>(n);
    } else if (key == "cxx") {
      if (value.empty()) throw Error(KILN_ERROR_INVALID_ARGUMENT, "[plugin.inductor] cxx is empty");
      s.cxx = value;
    } else if (key == "cflags") {
      s.cflags = split_words(value);
    } else if (key == "extern_kernels") {
      s.extern_kernels = parse_bool(key, value);
    } else if (key == "profile") {
      s.profile = parse_bool(key, value);
    } else if (key == "cuda") {
      s.cuda = parse_bool(key, value);
    } else if (key == "horizontal_fusion") {
      s.horizontal_fusion = parse_bool(key, value);
    } else if (key == "sibling_reductions") {
      s.sibling_reductions = parse_bool(key, value);
    } else if (key == "gemm") {
      if (value != "epilogues" && value != "cublaslt" && value != "aten")
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "[plugin.inductor] gemm = '" + value + "' is not one of epilogues, cublaslt, aten");
      s.gemm = value;
    } else if (key == "size_args") {
      if (value != "auto" && value != "always" && value != "never")
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "[plugin.inductor] size_args = '" + value + "' is not one of auto, always, never");
      s.size_args = value;
    } else if (key == "nvrtc") {
      if (value.empty()) throw Error(KILN_ERROR_INVALID_ARGUMENT, "[plugin.inductor] nvrtc is empty");
      s.nvrtc = value;
    } else {
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + key +
                                                   "' in [plugin.inductor] (known: threads, cxx, cflags, "
                                                   "extern_kernels, profile, cuda, nvrtc, horizontal_fusion, "
                                                   "sibling_reductions, size_args, gemm, poison_scratch)");
    }
  }
  if (s.threads == 0) {
    s.threads = runtime_threads(nullptr);  // what max-autotune tunes for
    s.follow_runtime = true;
  }
  return s;
}

// The thread count the process's OpenMP runtime would use on the calling thread now: LibTorch's
// intra-op thread count (ATen applies at::set_num_threads and its own default, the physical cores,
// with omp_set_num_threads). Generated kernels run with the same team size as ATen's kernels:
// libgomp keeps one pool, and teams of different sizes make it resize at every switch between a
// generated kernel and an ATen op, with the extra threads spinning on cores (or SMT siblings)
// ATen's threads are using. The plugin does not link OpenMP itself: the runtime is looked up in
// the process (LibTorch loaded it), else through a generated library, whose libgomp dependency
// binds to the copy already loaded; without one, default_threads().
int runtime_threads(OmpMaxThreads from_library) {
  static const auto global = reinterpret_cast<OmpMaxThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  static const int fallback = default_threads();
  if (OmpMaxThreads fn = global ? global : from_library) {
    const int n = fn();
    if (n > 0) return std::min(n, 4096);
  }
  return fallback;
}

// `profile = true` in [plugin.inductor]: time every kernel, extern call and layout copy of the groups
// compiled with it, and print where the time went when the process exits (stderr). Off by default:
// a clock read per step otherwise.
struct Profile {
  struct Entry {
    double ms = 0;
    int64_t calls = 0;
    std::vector<double> samples;
    double median() const {
      if (samples.empty()) return 0;
      std::vector<double> v = samples;
      std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
      return v[v.size() / 2];
    }
  };
  std::mutex mu;
  std::map<std::string, Entry> by_name;  // "kernel <shape>", "extern aten::mm [..]"
  std::map<std::string, Entry> by_kind;  // kernels, externs, relayout, execute
  // One for the process, made by the first group compiled with the option. Printed, then
  // destroyed, when the process exits or the plugin is unloaded (exit handlers run in reverse: the
  // print is registered after the profile's destructor). A profile made with `new` and never freed
  // was lost when the plugin was unloaded (LeakSanitizer).
  static Profile* enable() {
    static Profile p;
    static const bool printed_at_exit = std::atexit([] { p.print(); }) == 0;
    (void)printed_at_exit;
    return &p;
  }
  void add(const std::string& kind, const std::string& name, double ms) {
    std::lock_guard<std::mutex> lock(mu);
    by_kind[kind].ms += ms;
    by_kind[kind].calls++;
    by_kind[kind].samples.push_back(ms);
    if (!name.empty()) {
      by_name[name].ms += ms;
      by_name[name].calls++;
      by_name[name].samples.push_back(ms);
    }
  }
  void print() {
    std::lock_guard<std::mutex> lock(mu);
    // Median per call times calls: robust against a few slow calls on a busy machine.
    std::fprintf(stderr, "inductor profile (all executions of the process; median ms per call x calls):\n");
    for (const auto& [k, e] : by_kind)
      std::fprintf(stderr, "  %-10s %10.1f ms (sum %10.1f)  %8lld calls\n", k.c_str(),
                   e.median() * static_cast<double>(e.calls), e.ms, static_cast<long long>(e.calls));
    std::vector<std::pair<std::string, Entry>> v(by_name.begin(), by_name.end());
    auto est = [](const Entry& e) { return e.median() * static_cast<double>(e.calls); };
    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return est(a.second) > est(b.second); });
    for (size_t i = 0; i < v.size() && i < 40; ++i)
      std::fprintf(stderr, "  %10.1f ms %7lld x %8.3f ms  %s\n", est(v[i].second),
                   static_cast<long long>(v[i].second.calls), v[i].second.median(), v[i].first.c_str());
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A 64-byte aligned block (scratch and relayout buffers): extern kernels (MKL, oneDNN) run slower on
// buffers that are only malloc-aligned, and ATen's own tensors are 64-byte aligned.
struct AlignedBuf {
  std::unique_ptr<char, void (*)(void*)> p{nullptr, std::free};
  size_t n = 0;
  AlignedBuf() = default;
  explicit AlignedBuf(size_t bytes) {
    resize(bytes);
    std::memset(p.get(), 0, n);
  }
  void resize(size_t bytes) {
    if (bytes <= n && p) return;
    const size_t r = std::max<size_t>((bytes + 63) / 64 * 64, 64);
    char* q = static_cast<char*>(std::aligned_alloc(64, r));
    if (!q) throw std::bad_alloc();
    p.reset(q);
    n = r;
  }
  char* data() const { return p.get(); }
};

// A KilnArg of an extern call with everything it points to owned here.
struct OwnedArg {
  KilnArg arg{};
  int value = -1;  // TENSOR: the subgraph value
  std::string name, str;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
};

struct ExternCall {
  std::string op;
  std::deque<OwnedArg> args;
  std::vector<int> outputs;  // values
};

// Where a value lives at run time: a slot and an element offset, with its own shape and strides.
struct Placement {
  int slot = -1;
  int64_t offset = 0;
  DLDataType dtype{};
  std::vector<int64_t> shape, strides;
};

// What a compiled group has on either device: where each value lives, its extern calls, and the
// checks of execute's tensors against what was compiled.
class GroupBase : public Executable {
 public:
  const KilnHostApi* host_api = nullptr;
  DLDevice device{kDLCPU, 0};
  Profile* profile = nullptr;           // the `profile` option
  std::vector<std::string> step_names;  // for the profile
  std::map<int, ExternCall> externs;    // by node
  // The matmuls a CUDA group runs through cuBLASLt (by node), with what folded into them.
  struct GemmCall {
    std::shared_ptr<CublasLt::Gemm> gemm;
    GemmFold fold;
  };
  std::map<int, GemmCall> gemms;
  std::vector<Placement> place;  // by value
  std::vector<ScalarParam> params;
  size_t n_in = 0, n_out = 0;
  std::vector<Placement> in_meta, out_meta;

  void check_counts(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs) const {
    if (num_inputs != n_in || num_outputs != n_out)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "expected " + std::to_string(n_in) + " inputs and " +
                                                   std::to_string(n_out) + " outputs, got " +
                                                   std::to_string(num_inputs) + " and " + std::to_string(num_outputs));
    if (n_in && !inputs) throw Error(KILN_ERROR_INVALID_ARGUMENT, "inputs is NULL");
    if (n_out && !outputs) throw Error(KILN_ERROR_INVALID_ARGUMENT, "outputs is NULL");
  }

  static std::string type_str(DLDataType dt, int32_t ndim, const int64_t* shape) {
    std::string r = dtype_name(dt) + "[";
    for (int32_t d = 0; shape && d < ndim; ++d) r += (d ? "," : "") + std::to_string(shape[d]);
    return r + "]";
  }

  // The kernels were generated for one dtype and shape per input and output, on one device;
  // anything else would be read or written as if it were that one. Runs for every tensor of every
  // execute: the messages are only built on failure.
  void check_tensor(const DLTensor& t, const Placement& m, const char* what, size_t i) const {
    auto fail = [&](const std::string& why) {
      const std::string expected = type_str(m.dtype, static_cast<int32_t>(m.shape.size()), m.shape.data());
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  std::string(what) + " " + std::to_string(i) + ": " + why + " (compiled for " + expected + ")");
    };
    if (device.device_type == kDLCPU && t.device.device_type != kDLCPU)
      fail("on device type " + std::to_string(t.device.device_type) + ", not the CPU");
    if (device.device_type == kDLCUDA && (t.device.device_type != kDLCUDA || t.device.device_id != device.device_id))
      fail("on device type " + std::to_string(t.device.device_type) + " index " + std::to_string(t.device.device_id) +
           ", not CUDA device " + std::to_string(device.device_id));
    if (t.ndim < 0 || (t.ndim > 0 && !t.shape)) fail("rank " + std::to_string(t.ndim) + " without a shape");
    auto got = [&] { return type_str(t.dtype, t.ndim, t.shape); };
    if (t.dtype.code != m.dtype.code || t.dtype.bits != m.dtype.bits || t.dtype.lanes != m.dtype.lanes)
      fail("got " + got() + ", another dtype");
    if (t.ndim != static_cast<int32_t>(m.shape.size())) fail("got " + got() + ", another rank");
    for (int32_t d = 0; d < t.ndim; ++d)
      if (t.shape[d] != m.shape[static_cast<size_t>(d)]) fail("got " + got() + ", another shape");
    int64_t numel = 1;
    for (int32_t d = 0; d < t.ndim; ++d) numel *= t.shape[d];
    if (numel > 0 && !t.data) fail("data is NULL");
  }

  static void* data_of(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

  static bool same_layout(const DLTensor& t, const Placement& m) {
    if (t.ndim != static_cast<int32_t>(m.shape.size())) return false;
    int64_t acc = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != m.shape[static_cast<size_t>(d)]) return false;
      const int64_t st = t.strides ? t.strides[d] : acc;
      if (t.shape[d] != 1 && st != m.strides[static_cast<size_t>(d)]) return false;
      acc *= t.shape[d];
    }
    return true;
  }

  DLTensor dl_of(int value, const std::vector<void*>& B) const {
    const Placement& p = place.at(static_cast<size_t>(value));
    DLTensor t{};
    t.data = static_cast<char*>(B.at(static_cast<size_t>(p.slot))) + p.offset * (p.dtype.bits / 8);
    t.device = device;
    t.ndim = static_cast<int32_t>(p.shape.size());
    t.dtype = p.dtype;
    t.shape = const_cast<int64_t*>(p.shape.data());
    t.strides = const_cast<int64_t*>(p.strides.data());
    return t;
  }

  // Runs an extern kernel on the buffers `B` through the host (on CUDA: on ATen's current stream).
  void call_extern(const ExternCall& call, const std::vector<void*>& B) const {
    std::deque<DLTensor> tensors;
    std::vector<const KilnArg*> ptrs;
    std::deque<KilnArg> args;
    for (const auto& oa : call.args) {
      KilnArg a = oa.arg;
      if (a.tag == KILN_ARG_TENSOR) {
        tensors.push_back(dl_of(oa.value, B));
        a.tensor = &tensors.back();
      }
      args.push_back(a);
      ptrs.push_back(&args.back());
    }
    std::vector<DLTensor> outs;
    for (int v : call.outputs) outs.push_back(dl_of(v, B));
    KilnHostCallEagerArgs ca{};
    ca.struct_size = KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE;
    ca.host_ctx = host_api->host_ctx;
    ca.op = call.op.c_str();
    ca.args = ptrs.data();
    ca.num_args = ptrs.size();
    ca.outputs = outs.data();
    ca.num_outputs = outs.size();
    KilnError* e = host_api->call_eager(&ca);
    if (e) {
      const std::string msg = host_api->error_message(e);
      const KilnErrorCode code = host_api->error_code(e);
      host_api->error_destroy(e);
      throw Error(code, "extern kernel " + call.op + ": " + msg);
    }
  }
};

// The block a CPU scratch arena asks the host for: its size rounded up to a quarter of the power of
// two below it (at most 25% more), so that the arenas of a step whose sizes keep changing a little
// (a batch that grows by one example) ask for the same few sizes, which the host's block cache
// hands out again, instead of a new size each step that it keeps alongside the old ones.
size_t arena_request(size_t bytes) {
  if (bytes <= 4096) return 4096;
  size_t top = 1;
  while (top <= bytes / 2) top <<= 1;  // the power of two at or below bytes
  const size_t quarter = top / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

// A group on the CPU: the C++ kernels of one shared library.
class CompiledGroup : public GroupBase {
 public:
  std::string host_name;
  std::shared_ptr<Library> lib;
  std::vector<KernelFn> kernels;
  std::vector<int> kernel_threads;
  std::vector<char> kernel_threads_follow;  // threads = 0 and not tuned to one thread: runtime_threads()
  OmpMaxThreads omp_max_threads = nullptr;  // the generated library's view of the OpenMP runtime
  std::vector<Step> steps;
  std::vector<double> param_values;  // the scalars, then the kernels' numbers when they are arguments
  std::vector<double> literals;      // the kernels' numbers (hoist_literals); empty when compiled in
  // Scratch: one arena per execute, each slot at its planned offset (scratch_plan.h), from the
  // host's memory (kiln's block cache, so between steps it serves other groups), or this group's
  // own block where the host offers none.
  ScratchPlan scratch;
  std::vector<int64_t> scratch_bytes;  // per slot
  AlignedBuf own_scratch;
  bool poison_scratch = false;
  std::unique_ptr<Host> host;
  std::vector<AlignedBuf> relayout;  // inputs/outputs whose strides are not the expected ones

  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs, void*) override {
    run(inputs, num_inputs, outputs, num_outputs);
  }
  void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                            const Scalars& scalars, void*) override {
    for (size_t k = 0; k < params.size(); ++k)
      if (params[k].runtime_scalar >= 0) param_values[k] = scalars.number(params[k].runtime_scalar);
    run(inputs, num_inputs, outputs, num_outputs);
  }

  void run(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs) {
    check_counts(inputs, num_inputs, outputs, num_outputs);
    Profile* prof = profile;
    const auto t_start = std::chrono::steady_clock::now();
    std::vector<void*> B(n_in + n_out + scratch_bytes.size());
    std::vector<std::pair<size_t, void*>> copy_back;  // outputs computed in a relayout buffer
    for (size_t i = 0; i < n_in; ++i) check_tensor(inputs[i], in_meta[i], "input", i);
    for (size_t j = 0; j < n_out; ++j) check_tensor(outputs[j], out_meta[j], "output", j);
    if (relayout.size() < n_in + n_out) relayout.resize(n_in + n_out);
    for (size_t i = 0; i < n_in; ++i) B[i] = bind(inputs[i], in_meta[i], i, true);
    for (size_t j = 0; j < n_out; ++j) {
      B[n_in + j] = bind(outputs[j], out_meta[j], n_in + j, false);
      if (B[n_in + j] != data_of(outputs[j])) copy_back.push_back({j, B[n_in + j]});
    }
    if (prof) prof->add("relayout", "", ms_since(t_start));
    const Host& h = *host;
    const bool from_host = scratch.bytes > 0 && h.has_device_memory();
    char* arena = nullptr;
    if (from_host) {
      arena = static_cast<char*>(h.alloc(device, arena_request(static_cast<size_t>(scratch.bytes))));
    } else if (scratch.bytes > 0) {
      own_scratch.resize(static_cast<size_t>(scratch.bytes));
      arena = own_scratch.p.get();
    }
    struct Release {
      const Host& h;
      DLDevice device;
      void* p;
      ~Release() {
        if (p) h.free(device, p);
      }
    } release{h, device, from_host ? arena : nullptr};
    for (size_t s = 0; s < scratch_bytes.size(); ++s) B[n_in + n_out + s] = arena + scratch.offset[s];
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const auto t0 = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if (st.kernel >= 0) {
        const auto k = static_cast<size_t>(st.kernel);
        kernels[k](B.data(), param_values.data(),
                   kernel_threads_follow[k] ? runtime_threads(omp_max_threads) : kernel_threads[k]);
      } else {
        call_extern(externs.at(st.extern_node), B);
      }
      if (poison_scratch && i < scratch.last_use.size())
        for (int slot : scratch.last_use[i])
          std::memset(B[n_in + n_out + static_cast<size_t>(slot)], 0xFF,
                      static_cast<size_t>(scratch_bytes[static_cast<size_t>(slot)]));
      if (prof)
        prof->add(st.kernel >= 0 ? "kernels" : "externs", step_names.size() > i ? step_names[i] : "", ms_since(t0));
    }
    const auto t_back = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    for (const auto& [j, buf] : copy_back) strided_copy(buf, out_meta[j], outputs[j], false);
    if (prof) {
      prof->add("relayout", "", ms_since(t_back));
      prof->add("execute", "", ms_since(t_start));
    }
  }

  // The pointer the kernels use for a tensor; a copy in the compiled layout when its strides differ.
  void* bind(const DLTensor& t, const Placement& m, size_t slot, bool is_input) {
    if (same_layout(t, m)) return data_of(t);
    if (t.ndim != static_cast<int32_t>(m.shape.size()))
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor " + std::to_string(slot) + " has the wrong rank");
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] != m.shape[static_cast<size_t>(d)])
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor " + std::to_string(slot) + " has the wrong shape");
    int64_t extent = 1;
    for (size_t d = 0; d < m.shape.size(); ++d) extent += (m.shape[d] - 1) * std::max<int64_t>(m.strides[d], 0);
    relayout[slot].resize(static_cast<size_t>(std::max<int64_t>(extent, 1)) * (m.dtype.bits / 8));
    void* buf = relayout[slot].data();
    if (is_input) strided_copy(buf, m, t, true);
    return buf;
  }

  // Copies between a buffer in the compiled layout `m` and a tensor with its own strides.
  static void strided_copy(void* buf, const Placement& m, const DLTensor& t, bool into_buf) {
    const size_t es = m.dtype.bits / 8;
    const int nd = t.ndim;
    int64_t n = 1;
    for (int d = 0; d < nd; ++d) n *= t.shape[d];
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0), ts(static_cast<size_t>(nd));
    int64_t acc = 1;
    for (int d = nd - 1; d >= 0; --d) {
      ts[static_cast<size_t>(d)] = t.strides ? t.strides[d] : acc;
      acc *= t.shape[d];
    }
    char* tb = static_cast<char*>(data_of(t));
    char* bb = static_cast<char*>(buf);
    for (int64_t i = 0; i < n; ++i) {
      int64_t to = 0, bo = 0;
      for (int d = 0; d < nd; ++d) {
        to += idx[static_cast<size_t>(d)] * ts[static_cast<size_t>(d)];
        bo += idx[static_cast<size_t>(d)] * m.strides[static_cast<size_t>(d)];
      }
      if (into_buf) std::memcpy(bb + bo * static_cast<int64_t>(es), tb + to * static_cast<int64_t>(es), es);
      else std::memcpy(tb + to * static_cast<int64_t>(es), bb + bo * static_cast<int64_t>(es), es);
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[static_cast<size_t>(d)] < t.shape[d]) break;
        idx[static_cast<size_t>(d)] = 0;
      }
    }
  }
};

// The host side of the CUDA prelude's structs (cuda_prelude.h), byte for byte.
struct KilnScalarChunk {
  int32_t n;
  int32_t index[16];
  double value[16];
};
static_assert(sizeof(KilnScalarChunk) == 200 && offsetof(KilnScalarChunk, value) == 72, "KilnScalarChunk layout");
struct KilnCopyDesc {
  int32_t ndim;
  int32_t elem_bytes;
  int64_t numel;
  int64_t size[8];
  int64_t dst_stride[8];
  int64_t src_stride[8];
};
static_assert(sizeof(KilnCopyDesc) == 208 && offsetof(KilnCopyDesc, size) == 16, "KilnCopyDesc layout");

// A group on a CUDA device: the kernels of one cubin (codegen_cuda.h), launched on the stream
// execute is given, in the device's primary context (LibTorch's). Scratch and relayout buffers
// come from the host's device allocator (LibTorch's caching allocator) for one execute and are
// given back as soon as the work is enqueued: the host allocates on its current stream, which is
// the stream kiln's runtime passes to execute (LibTorch's current stream; the capture stream
// inside a CUDA graph), so a later allocation that reuses the memory is ordered after these
// kernels. Extern kernels run through call_eager on ATen's current stream: the same stream, for
// the same reason.
class CudaGroup : public GroupBase {
 public:
  std::shared_ptr<CudaDriver> driver;
  std::unique_ptr<Host> host;
  int multiprocessors = 1;
  std::vector<CudaDriver::CUmodule> modules;  // one per part of the program (split_program)
  std::string key;                            // the compile cache key, for messages
  std::vector<CudaLaunch> launches;
  std::vector<CudaDriver::CUfunction> fns;  // by launch
  CudaDriver::CUfunction set_scalars = nullptr, copy = nullptr;
  std::vector<CudaStep> steps;
  std::vector<int64_t> scratch_bytes;  // per scratch slot
  ScratchPlan scratch;                 // their places in each execute's one block (scratch_plan.h)
  bool poison_scratch = false;
  // The run-time scalar table: P[k] is run-time scalar k, in device memory for the life of the
  // group. Each execute writes the scalars' current values into it with a kernel launch that
  // carries them as arguments (kiln_set_scalars): ordered before the group's kernels on the same
  // stream, no host buffer and no host sync. It is skipped when the values and the stream are
  // those of the last write.
  //
  // CUDA graphs: a launch recorded into a graph keeps the arguments it was recorded with, so a
  // replay would write this step's values again, not the next step's (a host write inside a
  // captured region is not replayed either). There is no graph-safe way for the plugin to see a
  // replay's values, so execute refuses run-time scalars while the stream is capturing.
  // kiln's runtime never gets here: before it records a step as a CUDA graph it turns the
  // run-time scalars into device tensors the step reads (lift_runtime_scalars), which it refills
  // before every replay.
  CudaDriver::CUdeviceptr table = 0;
  std::vector<int32_t> table_entries;  // the run-time scalars the kernels read
  std::vector<double> table_defaults;  // their values at capture time, for execute without scalars
  std::vector<double> table_last;
  void* table_last_stream = nullptr;
  bool table_written = false;

  ~CudaGroup() override {
    if (!driver) return;
    try {
      CudaDriver::Scope scope(*driver, device.device_id);
      for (auto m : modules) driver->unload_module(m);
      driver->free(table);
    } catch (...) {
      // Tearing down after the context is gone: nothing left to free.
    }
  }

  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               void* stream) override {
    run(inputs, num_inputs, outputs, num_outputs, table_defaults, stream);
  }
  void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                            const Scalars& scalars, void* stream) override {
    std::vector<double> values(table_entries.size());
    for (size_t k = 0; k < table_entries.size(); ++k) values[k] = scalars.number(table_entries[k]);
    run(inputs, num_inputs, outputs, num_outputs, values, stream);
  }

 private:
  // Device memory for one execute, given back (stream-ordered) when it ends, also on an error.
  struct Blocks {
    const Host& host;
    DLDevice device;
    std::vector<void*> ptrs;
    void* get(size_t bytes, void* stream) {
      ptrs.push_back(host.alloc(device, std::max<size_t>(bytes, 1), stream));
      return ptrs.back();
    }
    ~Blocks() {
      for (void* p : ptrs) host.free(device, p);
    }
  };

  void run_gemm(const GemmCall& c, const std::vector<void*>& B, Blocks& mem, void* stream) {
    auto ptr = [&](int64_t v) -> void* { return v < 0 ? nullptr : dl_of(static_cast<int>(v), B).data; };
    CublasLt::Gemm::Ptrs p;
    p.x = ptr(c.fold.x), p.y = ptr(c.fold.y), p.bias = ptr(c.fold.bias), p.c = ptr(c.fold.c);
    p.d = ptr(c.fold.d), p.bias_grad = ptr(c.fold.bias_grad);
    p.aux = c.fold.aux_in >= 0 ? ptr(c.fold.aux_in) : ptr(c.fold.aux_out);
    c.gemm->run(p, stream, [&](size_t bytes) { return mem.get(bytes, stream); });
  }

  void launch(size_t i, const std::vector<void*>& B, void* stream) {
    const CudaLaunch& l = launches[i];
    std::vector<void*> vals;
    vals.reserve(l.buffers.size() + 1);
    for (int b : l.buffers) vals.push_back(B.at(static_cast<size_t>(b)));
    if (l.scalars) vals.push_back(reinterpret_cast<void*>(table));
    std::vector<void*> args;
    for (auto& v : vals) args.push_back(&v);
    const unsigned grid[3] = {l.grid, 1, 1}, block[3] = {l.block, 1, 1};
    driver->launch(fns[i], grid, block, 0, stream, args.data(), l.name + " (" + l.what + ", cache entry " + key + ")");
  }

  // Copies between a buffer in the compiled layout `m` and a tensor with its own strides.
  void strided_copy(void* buf, const Placement& m, const DLTensor& t, bool into_buf, void* stream) {
    if (t.ndim > 8)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "a tensor of rank " + std::to_string(t.ndim) +
                                                   " with other strides than compiled (at most 8 dims are copied)");
    KilnCopyDesc d{};
    d.ndim = t.ndim;
    d.elem_bytes = static_cast<int32_t>(m.dtype.bits / 8);
    d.numel = 1;
    int64_t acc = 1;
    for (int k = t.ndim - 1; k >= 0; --k) {
      d.size[k] = t.shape[k];
      const int64_t ts = t.strides ? t.strides[k] : acc;
      d.dst_stride[k] = into_buf ? m.strides[static_cast<size_t>(k)] : ts;
      d.src_stride[k] = into_buf ? ts : m.strides[static_cast<size_t>(k)];
      acc *= t.shape[k];
      d.numel *= t.shape[k];
    }
    if (d.numel == 0) return;
    void* dst = into_buf ? buf : data_of(t);
    void* src = into_buf ? data_of(t) : buf;
    void* args[] = {&dst, &src, &d};
    const unsigned grid[3] = {
        static_cast<unsigned>(std::min<int64_t>((d.numel + 255) / 256, int64_t{16} * multiprocessors)), 1, 1};
    const unsigned block[3] = {256, 1, 1};
    driver->launch(copy, grid, block, 0, stream, args, "kiln_strided_copy");
  }

  void write_scalars(const std::vector<double>& values, void* stream) {
    if (table_written && stream == table_last_stream && values == table_last) return;
    for (size_t first = 0; first < table_entries.size(); first += 16) {
      KilnScalarChunk c{};
      c.n = static_cast<int32_t>(std::min<size_t>(16, table_entries.size() - first));
      for (int32_t i = 0; i < c.n; ++i) {
        c.index[i] = table_entries[first + static_cast<size_t>(i)];
        c.value[i] = values[first + static_cast<size_t>(i)];
      }
      void* P = reinterpret_cast<void*>(table);
      void* args[] = {&P, &c};
      const unsigned grid[3] = {1, 1, 1}, block[3] = {16, 1, 1};
      driver->launch(set_scalars, grid, block, 0, stream, args, "kiln_set_scalars");
    }
    table_last = values;
    table_last_stream = stream;
    table_written = true;
  }

  void run(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
           const std::vector<double>& scalars, void* stream) {
    check_counts(inputs, num_inputs, outputs, num_outputs);
    for (size_t i = 0; i < n_in; ++i) check_tensor(inputs[i], in_meta[i], "input", i);
    for (size_t j = 0; j < n_out; ++j) check_tensor(outputs[j], out_meta[j], "output", j);
    CudaDriver::Scope scope(*driver, device.device_id);
    if (!table_entries.empty() && driver->capturing(stream))
      throw Error(KILN_ERROR_UNIMPLEMENTED,
                  "a CUDA graph is being recorded on this stream, and this group reads run-time scalars: a replay "
                  "would repeat this step's values (kiln's runtime turns run-time scalars into device tensors before "
                  "it records a graph)");
    Blocks mem{*host, device, {}};
    std::vector<void*> B(n_in + n_out + scratch_bytes.size(), nullptr);
    std::vector<std::pair<size_t, void*>> copy_back;  // outputs computed in a relayout buffer
    auto bind = [&](const DLTensor& t, const Placement& m, bool is_input) -> void* {
      if (same_layout(t, m)) return data_of(t);
      int64_t extent = 1;
      for (size_t d = 0; d < m.shape.size(); ++d) extent += (m.shape[d] - 1) * std::max<int64_t>(m.strides[d], 0);
      void* buf = mem.get(static_cast<size_t>(std::max<int64_t>(extent, 1)) * (m.dtype.bits / 8), stream);
      if (is_input) strided_copy(buf, m, t, true, stream);
      return buf;
    };
    for (size_t i = 0; i < n_in; ++i) B[i] = bind(inputs[i], in_meta[i], true);
    for (size_t j = 0; j < n_out; ++j) {
      B[n_in + j] = bind(outputs[j], out_meta[j], false);
      if (B[n_in + j] != data_of(outputs[j])) copy_back.push_back({j, B[n_in + j]});
    }
    if (!scratch_bytes.empty()) {
      // One block for every scratch buffer, each at its planned offset (256-byte aligned).
      char* base = static_cast<char*>(mem.get(static_cast<size_t>(std::max<int64_t>(scratch.bytes, 1)), stream));
      for (size_t k = 0; k < scratch_bytes.size(); ++k) B[n_in + n_out + k] = base + scratch.offset[k];
    }
    if (!table_entries.empty()) write_scalars(scalars, stream);
    for (size_t i = 0; i < steps.size(); ++i) {
      const CudaStep& st = steps[i];
      if (st.launch >= 0) launch(static_cast<size_t>(st.launch), B, stream);
      else if (auto g = gemms.find(st.extern_node); g != gemms.end()) run_gemm(g->second, B, mem, stream);
      else call_extern(externs.at(st.extern_node), B);
      if (poison_scratch && i < scratch.last_use.size())
        for (int slot : scratch.last_use[i]) {
          const auto k = static_cast<size_t>(slot);
          driver->memset_async(static_cast<CudaDriver::CUdeviceptr>(reinterpret_cast<uintptr_t>(B[n_in + n_out + k])),
                               0xFF, static_cast<size_t>(scratch_bytes[k]), stream);
        }
    }
    for (const auto& [j, buf] : copy_back) strided_copy(buf, out_meta[j], outputs[j], false, stream);
  }
};

// Device memory and modules a max-autotune run owns: freed, once the device has finished with
// them, when the run ends (also on an error).
struct TuningScratch {
  const CudaDriver& d;
  std::vector<CudaDriver::CUdeviceptr> ptrs;
  std::vector<CudaDriver::CUmodule> modules;
  ~TuningScratch() {
    try {
      d.synchronize();
    } catch (...) {
    }
    for (auto m : modules) d.unload_module(m);
    for (auto p : ptrs) d.free(p);
  }
};

DLDataType dl_of_ty(Ty t) {
  switch (t) {
    case Ty::f32: return {kDLFloat, 32, 1};
    case Ty::f64: return {kDLFloat, 64, 1};
    case Ty::i64: return {kDLInt, 64, 1};
    case Ty::i32: return {kDLInt, 32, 1};
    case Ty::b8: return {KILN_DL_BOOL, 8, 1};
    case Ty::bf16: return {kDLBfloat, 16, 1};
  }
  return {};
}

// NVRTC and the driver, loaded once per process (per `nvrtc` option), or why not.
struct CudaRuntime {
  std::shared_ptr<Nvrtc> nvrtc;
  std::shared_ptr<CudaDriver> driver;
  std::string why;  // empty when both loaded
  bool ok() const { return why.empty(); }
  // The reason's first line (NVRTC's lists every place it looked).
  std::string short_why() const { return why.substr(0, why.find('\n')); }
};

const CudaRuntime& cuda_runtime(const std::string& nvrtc_option) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<CudaRuntime>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto& rt = loaded[nvrtc_option];
  if (rt) return *rt;
  rt = std::make_unique<CudaRuntime>();
  try {
    static const std::shared_ptr<CudaDriver> driver = CudaDriver::load();
    rt->driver = driver;
    rt->nvrtc = Nvrtc::load(nvrtc_option);
  } catch (const Error& e) {
    rt->why = e.what();
  }
  return *rt;
}

class InductorPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "inductor";
    d.version = "0.2.0";
    d.vendor = "kiln";
    d.description =
        "fused C++/OpenMP kernels from the system compiler (CPU) and CUDA kernels from NVRTC (CUDA), like "
        "torch.compile's default";
    d.device_kinds = KILN_DEVICE_MASK_CPU | KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_MASK_ALL;
    d.concurrent_execution_safe = false;
    // Groups compile in parallel: each compile has its own lowering, program and executable; the
    // shared pieces (the CUDA runtime table, the compile cache, one-time notes) are locked or
    // atomic, and max-autotune's timing runs one group at a time (below).
    d.concurrent_compile_safe = true;
    d.runtime_scalars = true;
    // A symbolic CPU group compiles once into a library whose kernels read their sizes at run
    // time; each size then costs a lowering, not a compile (CUDA groups compile per size).
    d.symbolic_shapes = true;
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* cpu = devices.first(KILN_DEVICE_CPU);
    const KilnDeviceInfo* gpu = devices.first(KILN_DEVICE_CUDA);
    if (!cpu && !gpu) return Availability::no("no CPU or CUDA device in the device list");
    std::string reason;
    if (gpu) {
      const int arch = gpu->compute_capability_major * 10 + gpu->compute_capability_minor;
      const CudaRuntime& rt = cuda_runtime(host().option("nvrtc").value_or(""));
      std::string kernels;
      if (!rt.ok()) kernels = "CPU nodes only: " + rt.short_why();
      else if (!rt.nvrtc->supports(arch))
        kernels = "CPU nodes only: NVRTC " + rt.nvrtc->version() + " cannot compile for sm_" + std::to_string(arch);
      else kernels = "CUDA kernels by NVRTC " + rt.nvrtc->version() + ", driver " + rt.driver->version_string();
      reason = std::to_string(devices.count(KILN_DEVICE_CUDA)) + " CUDA device(s), first " + gpu->name + " (sm_" +
               std::to_string(arch) + "; " + kernels + ")";
    }
    if (cpu) reason += std::string(reason.empty() ? "" : "; ") + "CPU " + (*cpu->name ? cpu->name : "(unnamed)");
    // The general compiler: after a device's own (hpu_backend 400, neuron 300), before the
    // fallbacks that do not fuse (cudagraphs, ipex: 100).
    return Availability::yes(reason, 200);
  }

  LoweringOptions lowering_options(Target target) const {
    LoweringOptions o;
    o.target = target;
    auto ext = host().option("extern_kernels");
    o.extern_kernels = ext ? parse_bool("extern_kernels", *ext) : true;
    o.extern_kernels = o.extern_kernels && host().has_call_eager();
    o.runtime_scalars = true;
    return o;
  }

  std::vector<int64_t> claim(const Graph& g) override {
    validate_graph(g);
    const LoweringOptions cpu_opts = lowering_options(Target::Cpu), cuda_opts = lowering_options(Target::Cuda);
    const size_t nn = g.num_nodes();
    // CUDA nodes are taken only where kernels can be built and run for their device.
    std::map<int, std::string> cuda_why;  // by device ordinal
    auto why_not_cuda = [&](const Node& n) -> const std::string& {
      int64_t v = -1;  // a value of the node (target_of found one on CUDA)
      for (int64_t o : n.outputs())
        if (v < 0 && o >= 0) v = o;
      for (int64_t i : n.inputs())
        if (v < 0 && i >= 0) v = i;
      const int dev = g.value(v).device().device_id;
      auto it = cuda_why.find(dev);
      if (it == cuda_why.end()) it = cuda_why.emplace(dev, cuda_unavailable(dev)).first;
      return it->second;
    };
    std::vector<char> take(nn, 0);
    std::vector<int64_t> producer(g.num_values(), -1);
    std::vector<std::vector<int64_t>> users(g.num_values());
    enum Kind : char { Compute, View, Extern };
    std::vector<char> kind(nn, Compute);
    for (size_t i = 0; i < nn; ++i) {
      Node n = g.node(static_cast<int64_t>(i));
      const std::optional<Target> target = target_of(g, n);
      if (!target || (*target == Target::Cuda && !why_not_cuda(n).empty())) take[i] = 0;
      else take[i] = why_not_claimed(g, n, *target == Target::Cuda ? cuda_opts : cpu_opts).empty();
      kind[i] = is_view_op(n.op()) ? View : is_extern_node(g, n, target ? *target : Target::Cpu) ? Extern : Compute;
      for (int64_t v : n.outputs())
        if (v >= 0) producer[static_cast<size_t>(v)] = static_cast<int64_t>(i);
      for (int64_t v : n.inputs()) users[static_cast<size_t>(v)].push_back(static_cast<int64_t>(i));
    }
    // What pays: a claimed node that would sit in a group with nothing to fuse only adds copies
    // (a group's outputs are written into the host's buffers). So
    //  - a view is taken only when a taken node reads it, and either its source comes from a taken
    //    node or only generated code (no extern kernel, no eager node) reads it: otherwise it would
    //    be a group of its own or a group output, i.e. a copy of a tensor that eager gets for free
    //    (the weights' transposes fed to matmuls, detach of a gradient, a transposed result);
    //  - an extern kernel is taken only next to generated code (a taken pointwise/reduction node
    //    reads its result or makes one of its arguments, through views): alone, it is the same
    //    ATen call as eager plus a copy.
    auto root_producer = [&](int64_t v) {  // through taken views
      int64_t p = producer[static_cast<size_t>(v)];
      while (p >= 0 && take[static_cast<size_t>(p)] && kind[static_cast<size_t>(p)] == View)
        p = producer[static_cast<size_t>(g.node(p).arg(0).tensor_index())];
      return p;
    };
    std::function<bool(int64_t, int)> read_by_compute = [&](int64_t v, int depth) {
      for (int64_t u : users[static_cast<size_t>(v)]) {
        if (!take[static_cast<size_t>(u)]) continue;
        if (kind[static_cast<size_t>(u)] == Compute) return true;
        if (kind[static_cast<size_t>(u)] == View && depth < 16)
          for (int64_t o : g.node(u).outputs())
            if (o >= 0 && read_by_compute(o, depth + 1)) return true;
      }
      return false;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < nn; ++i) {
        if (!take[i] || kind[i] == Compute) continue;
        Node n = g.node(static_cast<int64_t>(i));
        bool keep = false;
        if (kind[i] == View) {
          const int64_t p = producer[static_cast<size_t>(n.arg(0).tensor_index())];
          const auto& us = users[static_cast<size_t>(n.outputs()[0])];
          bool read = false, all_fused = !us.empty();
          for (int64_t u : us) {
            read = read || take[static_cast<size_t>(u)];
            all_fused = all_fused && take[static_cast<size_t>(u)] && kind[static_cast<size_t>(u)] != Extern;
          }
          // Of a taken producer and read by taken code, or (a view of an input or an eager result)
          // read only by generated code, which then does the index math. A view of a graph input
          // read only by taken nodes (a weight's transpose for its matmuls) costs nothing inside
          // the group either (the extern gets the input's memory with the view's strides), and
          // then the group reads the parameter through one input only: kiln can let the group
          // write the parameter's update over it (a view of it as a second input would forbid it).
          bool all_taken = !us.empty();
          for (int64_t u : us) all_taken = all_taken && take[static_cast<size_t>(u)];
          const bool of_input = p < 0 && g.value(n.arg(0).tensor_index()).device().device_type == kDLCUDA;
          keep = read && ((p >= 0 && take[static_cast<size_t>(p)]) || all_fused || (of_input && all_taken));
        } else {
          for (int64_t v : n.inputs()) {
            const int64_t p = root_producer(v);
            keep = keep || (p >= 0 && take[static_cast<size_t>(p)] && kind[static_cast<size_t>(p)] == Compute);
          }
          for (int64_t v : n.outputs()) keep = keep || (v >= 0 && read_by_compute(v, 0));
        }
        if (!keep) {
          take[i] = 0;
          changed = true;
        }
      }
    }
    std::vector<int64_t> taken;
    for (size_t i = 0; i < nn; ++i)
      if (take[i]) taken.push_back(static_cast<int64_t>(i));
    host().debug("claimed " + std::to_string(taken.size()) + " of " + std::to_string(nn) + " nodes");
    for (const auto& [dev, why] : cuda_why)
      if (!why.empty()) host().debug("nodes on CUDA device " + std::to_string(dev) + " run on ATen: " + why);
    return taken;
  }

  // Sizes an executable for every size keeps lowered (each with its buffers); another costs a
  // lowering again (milliseconds), never the C++ compiler.
  static constexpr size_t kSizesKept = 16;

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    if (!g.symbolic()) return compile_sized(g, options, false);
    // A view with size symbols: on the CPU, outside max-autotune (which tunes per size) and unless
    // size_args = never, one library with the sizes as arguments serves every size, each size
    // getting its own lowering and its own numbers (ExecutableForEverySize). Otherwise this
    // executable serves the view's own sizes, and kiln compiles the others one by one.
    const Settings s = parse_settings(options.options);
    const bool autotune =
        options.mode == KILN_MODE_MAX_AUTOTUNE || options.mode == KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS;
    bool cpu = true;
    for (size_t v = 0; v < g.num_values(); ++v)
      cpu = cpu && g.value(static_cast<int64_t>(v)).device().device_type == kDLCPU;
    if (!cpu || autotune || s.size_args == "never") return compile_sized(g, options, false);
    auto first = compile_sized(g, options, true);
    const CompileOptions at_other_sizes = options;
    return std::make_unique<ExecutableForEverySize>(
        g, std::move(first),
        [this, at_other_sizes](const Graph& at) {
          host().debug("a size not met before: lowering the group again for its library");
          return compile_sized(at, at_other_sizes, true);
        },
        kSizesKept);
  }

 private:
  // `generic`: the kernels take their sizes as arguments even at the first size of their kind.
  std::unique_ptr<Executable> compile_sized(const Graph& g, const CompileOptions& options, bool generic) {
    validate_graph(g);
    const Settings s = parse_settings(options.options);
    // The group's device: every value on the CPU, or every value on one CUDA device.
    std::optional<DLDevice> device;
    for (size_t v = 0; v < g.num_values(); ++v) {
      const DLDevice d = g.value(static_cast<int64_t>(v)).device();
      if (d.device_type != kDLCPU && d.device_type != kDLCUDA)
        throw Unimplemented("a value on device type " + std::to_string(d.device_type) + "; these nodes run eagerly");
      if (device &&
          (device->device_type != d.device_type || (d.device_type == kDLCUDA && device->device_id != d.device_id)))
        throw Unimplemented("a group with values on two devices; these nodes run eagerly");
      device = d;
    }
    if (device && device->device_type == kDLCUDA) return compile_cuda(g, options, s, device->device_id);
    if (options.mode == KILN_MODE_REDUCE_OVERHEAD) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        host().info("reduce-overhead needs CUDA graphs, which need a CUDA device; on the CPU it compiles as 'default'");
    }
    const bool autotune =
        options.mode == KILN_MODE_MAX_AUTOTUNE || options.mode == KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS;
    // max-autotune times kernel variants on this machine's cores: one group at a time, so that the
    // groups compiling beside it (the host may compile several at once) do not skew the timings.
    static std::mutex tuning;
    std::unique_lock<std::mutex> one_at_a_time(tuning, std::defer_lock);
    if (autotune) one_at_a_time.lock();
    LoweringOptions lo = lowering_options(Target::Cpu);
    lo.extern_kernels = lo.extern_kernels && s.extern_kernels;
    std::unique_ptr<LoweredGraph> L = lower(g, lo);
    Program P = schedule(*L);
    walk_stores_in_memory_order(*L, P);

    std::vector<std::vector<Variant>> variants;
    for (const auto& k : P.kernels) variants.push_back(variants_for(k, autotune));
    // In-place outputs the host offers (a write-back's new value over the input it replaces) that
    // the kernels compute correctly over the input's memory; those buffers lose __restrict.
    std::vector<int64_t> inplace;
    std::set<int> may_alias;
    if (!options.inplace_inputs.empty()) {
      inplace = cpu_inplace_outputs(*L, P, options.inplace_inputs, cpu_touches(g, *L, P));
      for (size_t k = 0; k < inplace.size(); ++k)
        if (inplace[k] >= 0) {
          may_alias.insert(static_cast<int>(inplace[k]));
          may_alias.insert(static_cast<int>(L->num_inputs + k));
        }
    }
    auto exe = std::make_unique<CompiledGroup>();
    exe->inplace_outputs = inplace;
    // Only kernels run after the first write into an input, and they cannot fail (cpu_inplace_outputs).
    exe->inplace_atomic = !may_alias.empty();
    exe->host_api = host().raw();
    exe->host = std::make_unique<Host>(host());
    exe->poison_scratch = s.poison_scratch;
    if (!P.kernels.empty()) {
      const std::string source = generate_source(*L, P, variants, may_alias);
      const Toolchain tc = make_toolchain(s.cxx, s.cflags);
      const std::string root = usable_cache_root(
          inductor_cache_dir(options.cache_dir.empty() ? host().cache_dir() : options.cache_dir), host());
      // A shape of kernels compiled before for another shape: the library whose numbers are
      // arguments serves both, so a new batch size or sequence length compiles nothing.
      // max-autotune keeps its tuned constants per shape.
      std::string lib_source = source;
      bool size_args = false;
      if (!autotune && s.size_args != "never") {
        HoistedSource h = hoist_literals(source, L->params.size());
        if (!h.values.empty()) {
          size_args = generic || s.size_args == "always" || cache_has(h.text, tc, root);
          if (!size_args) size_args = second_shape_of(h.text, source);
          if (size_args) {
            lib_source = std::move(h.text);
            exe->literals = std::move(h.values);
          }
        }
      }
      std::string key;
      CacheStats stats;
      exe->lib = compile_cached(lib_source, tc, root, host(), &key, &stats);
      host().debug(std::string(stats.hit ? "cache hit " : "compiled ") + key + " (" + std::to_string(P.kernels.size()) +
                   " kernels" + (size_args ? ", sizes as arguments" : "") +
                   (stats.hit ? "" : ", " + std::to_string(stats.compile_seconds) + " s") + ")");
      std::vector<std::pair<int, int>> winners(P.kernels.size(), {0, s.threads});
      if (autotune && !read_tune(root + "/" + key + ".tune", &winners, P.kernels.size())) {
        prepare_cpu(*exe, g, *L, P);
        winners = tune(*exe, *L, P, variants, s.threads);
        write_tune(root + "/" + key + ".tune", winners);
      } else if (autotune) {
        host().info("max-autotune: using the tuned kernels of " + key + " from the cache");
      }
      for (size_t k = 0; k < P.kernels.size(); ++k) {
        exe->kernels.push_back(reinterpret_cast<KernelFn>(
            exe->lib->symbol("kiln_k" + std::to_string(k) + "_v" + std::to_string(winners[k].first))));
        exe->kernel_threads.push_back(std::min(winners[k].second, s.threads));
        // Untuned kernels always follow the runtime: a compile on a thread where LibTorch runs one
        // thread says nothing about the threads the step will run with.
        exe->kernel_threads_follow.push_back(s.follow_runtime && (!autotune || winners[k].second > 1));
      }
      try {
        exe->omp_max_threads = reinterpret_cast<OmpMaxThreads>(exe->lib->symbol("omp_get_max_threads"));
      } catch (const Error&) {
        exe->omp_max_threads = nullptr;  // runtime_threads() falls back
      }
    }
    if (exe->place.empty()) prepare_cpu(*exe, g, *L, P);
    exe->steps = P.steps;
    if (s.profile) {
      exe->profile = Profile::enable();
      for (const Step& st : P.steps) {
        std::string nm;
        auto shape_str = [](const std::vector<int64_t>& s) {
          std::string r = "[";
          for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
          return r + "]";
        };
        if (st.kernel >= 0) {
          const KernelPlan& k = P.kernels[static_cast<size_t>(st.kernel)];
          nm = std::string(k.column ? "column" : "rows") + " kernel outer " + shape_str(k.outer) + " stages " +
               std::to_string(k.stages.size()) + " first " +
               shape_str(L->values[static_cast<size_t>(k.stages[0])].shape);
        } else {
          Node n = g.node(st.extern_node);
          nm = "extern " + n.op() + " -> " + shape_str(g.value(n.outputs()[0] >= 0 ? n.outputs()[0] : 0).shape());
        }
        exe->step_names.push_back(nm);
      }
    }
    return exe;
  }

 private:
  // Why nodes on CUDA device `device` cannot be compiled here ("" when they can).
  std::string cuda_unavailable(int device, const std::string* nvrtc_option = nullptr) const {
    // On unless turned off ([plugin.inductor] cuda = false leaves the nodes on CUDA to ATen).
    if (auto on = host().option("cuda"); on && !parse_bool("cuda", *on)) return "[plugin.inductor] cuda = false";
    const CudaRuntime& rt = cuda_runtime(nvrtc_option ? *nvrtc_option : host().option("nvrtc").value_or(""));
    if (!rt.ok()) return rt.why;
    if (!host().has_device_memory()) return "the host offers no device memory (for scratch buffers)";
    int arch = 0;
    try {
      arch = rt.driver->compute_capability(device);
    } catch (const Error& e) {
      return e.what();
    }
    if (!rt.nvrtc->supports(arch))
      return "NVRTC " + rt.nvrtc->version() + " (" + rt.nvrtc->library_path() + ") cannot compile for sm_" +
             std::to_string(arch);
    return "";
  }

  std::unique_ptr<Executable> compile_cuda(const Graph& g, const CompileOptions& options, const Settings& s,
                                           int device) {
    if (!s.cuda) throw Unimplemented("[plugin.inductor] cuda = false; these nodes run eagerly");
    if (const std::string why = cuda_unavailable(device, &s.nvrtc); !why.empty())
      throw Unimplemented("no CUDA kernels here (" + why + "); these nodes run eagerly");
    if (s.profile) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) host().info("profile times the C++ kernels; CUDA groups are not timed");
    }
    const CudaRuntime& rt = cuda_runtime(s.nvrtc);
    const int arch = rt.driver->compute_capability(device);
    LoweringOptions lo = lowering_options(Target::Cuda);
    lo.extern_kernels = lo.extern_kernels && s.extern_kernels;
    // Matmuls through cuBLASLt, with what folds into their epilogues (gemm_fold.h). The GEMMs
    // the heuristics were asked about are kept, by their description, for the group to run.
    GemmPlan gemm_plan;
    std::map<std::string, std::shared_ptr<CublasLt::Gemm>> gemm_objects;
    if (lo.extern_kernels && s.gemm != "aten") gemm_plan = plan_cuda_gemms(g, s, device, &gemm_objects);
    if (!gemm_plan.empty()) lo.gemms = &gemm_plan;
    std::unique_ptr<LoweredGraph> L = lower(g, lo);
    Program P = schedule(*L);
    if (s.sibling_reductions) join_sibling_columns(*L, P);
    CudaOptions co;
    co.multiprocessors = rt.driver->multiprocessors(device);
    co.compute_capability = arch;
    // max-autotune keeps its tuned kernels per shape, with their sizes as constants.
    const bool tuning = options.mode == KILN_MODE_MAX_AUTOTUNE || options.mode == KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS;
    co.size_markers = !tuning && s.size_args != "never";
    // In-place outputs the host offers (a write-back's new value over the input it replaces).
    const std::vector<int64_t>& wanted = options.inplace_inputs;
    for (size_t k = 0; k < wanted.size(); ++k)
      if (wanted[k] >= 0) {
        co.may_alias.insert(static_cast<int>(wanted[k]));
        co.may_alias.insert(static_cast<int>(g.inputs().size() + k));
      }
    CudaProgram prog = generate_cuda(*L, P, co);
    const std::string root = usable_cache_root(
        inductor_cache_dir(options.cache_dir.empty() ? host().cache_dir() : options.cache_dir), host());
    if (tuning) {
      // The winners are kept per default program, architecture and size of the GPU.
      const std::string tune_key =
          hash_hex(prog.source + "\ncuda-tune 2 sm_" + std::to_string(arch) + " " + std::to_string(co.multiprocessors));
      const std::string tune_path = root + "/" + tune_key + ".cutune";
      std::vector<std::vector<CudaChoice>> variants;
      for (size_t k = 0; k < P.kernels.size(); ++k) variants.push_back(cuda_variants(*L, P, k, co));
      std::vector<std::pair<int, int>> winners;
      bool cached = read_tune(tune_path, &winners, P.kernels.size());
      for (size_t k = 0; cached && k < winners.size(); ++k)
        cached = static_cast<size_t>(winners[k].first) < variants[k].size();
      if (cached) {
        host().info("max-autotune: using the tuned CUDA kernels of " + tune_key.substr(0, 12) + " from the cache");
      } else {
        try {
          winners = tune_cuda(*L, P, co, variants, rt, device, arch, root);
          write_tune(tune_path, winners);
        } catch (const Error& e) {
          host().warn(std::string("max-autotune: cannot time this group's CUDA kernels (") + e.what() +
                      "); it runs with the default kernels");
          winners.assign(P.kernels.size(), {0, 1});
        }
      }
      bool tuned = false;
      co.choice.assign(P.kernels.size(), CudaChoice{});
      for (size_t k = 0; k < winners.size(); ++k) {
        co.choice[k] = variants[k][static_cast<size_t>(winners[k].first)];
        tuned = tuned || winners[k].first != 0;
      }
      if (tuned) prog = generate_cuda(*L, P, co);
    }
    if (tuning && !gemm_plan.empty()) tune_gemms(gemm_plan, gemm_objects, rt, device, arch, co.multiprocessors, root);
    // What each extern step reads (its arguments' buffers, through the views they are) and writes
    // (its results'); -1 where a value has no buffer to name.
    auto buffer_of = [&](int64_t v) {
      if (v < 0) return -1;
      size_t r = static_cast<size_t>(v);
      while (L->values[r].buffer < 0 && L->values[r].src >= 0) r = static_cast<size_t>(L->values[r].src);
      return L->values[r].buffer;
    };
    std::vector<std::set<int>> extern_reads(prog.steps.size()), extern_touches(prog.steps.size());
    for (size_t k = 0; k < prog.steps.size(); ++k) {
      if (prog.steps[k].extern_node < 0) continue;
      const Node n = g.node(prog.steps[k].extern_node);
      auto fold = gemm_plan.gemms.find(n.index());
      const bool folded = fold != gemm_plan.gemms.end();
      for (int64_t v : folded ? fold->second.inputs() : n.inputs()) {
        if (v < 0) continue;
        extern_reads[k].insert(buffer_of(v));
        extern_touches[k].insert(buffer_of(v));
      }
      for (int64_t v : folded ? fold->second.outputs() : n.outputs())
        if (v >= 0 && !L->values[static_cast<size_t>(v)].dead) extern_touches[k].insert(buffer_of(v));
    }
    std::vector<int64_t> inplace;
    if (!wanted.empty()) inplace = inplace_outputs(prog, g.inputs().size(), wanted, extern_reads);
    if (s.horizontal_fusion) {
      // After the in-place analysis, which reads single kernels; an in-place output and the input
      // it may replace count as one buffer when launches move.
      std::map<int, int> same_memory;
      for (size_t k = 0; k < wanted.size(); ++k)
        if (wanted[k] >= 0) same_memory[static_cast<int>(g.inputs().size() + k)] = static_cast<int>(wanted[k]);
      FuseLimits limits;
      limits.multiprocessors = co.multiprocessors;
      const size_t before = prog.launches.size();
      if (const int saved = fuse_small_launches(prog, extern_touches, same_memory, limits); saved > 0)
        host().debug("horizontal fusion: " + std::to_string(before) + " CUDA launches a run -> " +
                     std::to_string(prog.launches.size()));
    }

    // A shape whose kernels were compiled for another shape reads its sizes from a table.
    const size_t size_args =
        resolve_sizes(prog, prog.marked ? cuda_size_hoist(prog, s.size_args) : std::vector<bool>{});

    auto exe = std::make_unique<CudaGroup>();
    exe->host_api = host().raw();
    exe->device = DLDevice{kDLCUDA, device};
    exe->host = std::make_unique<Host>(host());
    exe->multiprocessors = co.multiprocessors;
    // A large program compiles as several NVRTC programs at once (each its own cache entry).
    const std::vector<CudaPart> parts = split_program(prog, kCudaPartBytes);
    std::vector<std::string> cubins(parts.size()), keys(parts.size());
    std::vector<CacheStats> stats(parts.size());
    build_cubins(parts, rt, arch, root, &cubins, &keys, &stats);
    exe->key = keys[0] + (parts.size() > 1 ? " (+" + std::to_string(parts.size() - 1) + " more)" : "");
    for (size_t p = 0; p < parts.size(); ++p)
      host().debug(std::string(stats[p].hit ? "cache hit " : "compiled ") + keys[p] + ".cubin (" +
                   std::to_string(parts[p].launches.size()) + " CUDA kernels" +
                   (parts.size() > 1 ? ", part " + std::to_string(p + 1) + " of " + std::to_string(parts.size()) : "") +
                   ", sm_" + std::to_string(arch) +
                   (size_args ? ", " + std::to_string(size_args) + " sizes as arguments" : "") +
                   (stats[p].hit ? "" : ", " + std::to_string(stats[p].compile_seconds) + " s") + ")");
    {
      CudaDriver::Scope scope(*rt.driver, device);
      exe->driver = rt.driver;  // from here on the destructor unloads what is loaded
      exe->fns.resize(prog.launches.size());
      for (size_t p = 0; p < parts.size(); ++p) {
        exe->modules.push_back(rt.driver->load_module(cubins[p], root + "/" + keys[p] + ".cubin"));
        if (!prog.size_table.empty())
          rt.driver->write_global(exe->modules.back(), "kiln_sz", prog.size_table.data(),
                                  prog.size_table.size() * sizeof(uint64_t), keys[p] + ".cubin");
        for (int l : parts[p].launches)
          exe->fns[static_cast<size_t>(l)] =
              rt.driver->function(exe->modules.back(), prog.launches[static_cast<size_t>(l)].name);
      }
      exe->set_scalars = rt.driver->function(exe->modules.front(), "kiln_set_scalars");
      exe->copy = rt.driver->function(exe->modules.front(), "kiln_strided_copy");
      if (prog.scalar_table > 0)
        exe->table = rt.driver->alloc(static_cast<size_t>(prog.scalar_table) * sizeof(double), "run-time scalars");
    }
    prepare(*exe, g, *L, P);
    for (const auto& [node, fold] : gemm_plan.gemms) {
      for (int64_t v : fold.inputs())
        if (exe->place.at(static_cast<size_t>(v)).slot < 0)
          throw Error(KILN_ERROR_INTERNAL, "a matmul's operand without a buffer (" + fold.spec.describe() + ")");
      for (int64_t v : fold.outputs())
        if (exe->place.at(static_cast<size_t>(v)).slot < 0)
          throw Error(KILN_ERROR_INTERNAL, "a matmul's result without a buffer (" + fold.spec.describe() + ")");
      exe->gemms[static_cast<int>(node)] = GroupBase::GemmCall{gemm_objects.at(gemm_key(fold.spec)), fold};
    }
    if (!wanted.empty()) exe->inplace_outputs = inplace;
    exe->launches = prog.launches;
    exe->steps = prog.steps;
    exe->scratch_bytes = L->scratch_bytes;
    exe->scratch_bytes.insert(exe->scratch_bytes.end(), prog.extra_scratch_bytes.begin(),
                              prog.extra_scratch_bytes.end());
    {
      // The scratch slots' places from their lifetimes over the final steps (after horizontal
      // fusion moved launches): a launch touches every buffer it is passed, an extern step its
      // arguments' and results' buffers.
      std::vector<std::set<int>> touches(prog.steps.size());
      for (size_t k = 0; k < prog.steps.size(); ++k) {
        const CudaStep& st = prog.steps[k];
        if (st.launch >= 0) {
          const CudaLaunch& l = prog.launches[static_cast<size_t>(st.launch)];
          touches[k].insert(l.buffers.begin(), l.buffers.end());
          touches[k].insert(l.reads.begin(), l.reads.end());
          touches[k].insert(l.writes.begin(), l.writes.end());
          continue;
        }
        const Node n = g.node(st.extern_node);
        auto fold = gemm_plan.gemms.find(n.index());
        const bool folded = fold != gemm_plan.gemms.end();
        for (int64_t v : folded ? fold->second.inputs() : n.inputs())
          if (v >= 0) touches[k].insert(buffer_of(v));
        for (int64_t v : folded ? fold->second.outputs() : n.outputs())
          if (v >= 0 && !L->values[static_cast<size_t>(v)].dead) touches[k].insert(buffer_of(v));
      }
      exe->scratch = plan_scratch(exe->scratch_bytes, L->num_inputs + L->num_outputs, touches, /*align=*/256,
                                  /*slack=*/0);
      exe->poison_scratch = s.poison_scratch;
      host().debug("scratch of " + std::to_string(exe->scratch_bytes.size()) +
                   " buffers: " + std::to_string(exe->scratch.bytes >> 10) + " KiB planned from their lifetimes (" +
                   std::to_string(exe->scratch.unplanned >> 10) + " KiB one place each)" +
                   (exe->scratch.planned ? "" : "; not planned: a step touches a buffer that has no name"));
    }
    for (const ScalarParam& p : L->params) {
      if (p.runtime_scalar < 0 || p.runtime_scalar >= prog.scalar_table) continue;
      if (std::find(exe->table_entries.begin(), exe->table_entries.end(), p.runtime_scalar) != exe->table_entries.end())
        continue;
      exe->table_entries.push_back(p.runtime_scalar);
      exe->table_defaults.push_back(p.value);
    }
    return exe;
  }

  static std::string gemm_key(const GemmSpec& t) {
    return t.describe() + " " + std::to_string(t.x_rs) + "," + std::to_string(t.x_cs) + "," + std::to_string(t.y_rs) +
           "," + std::to_string(t.y_cs) + "," + std::to_string(t.d_ld) + "," + std::to_string(t.c_ld) + "," +
           std::to_string(t.aux_ld);
  }

  // Which of the group's matmuls cuBLASLt runs, and what folds into them (gemm_fold.h), asking
  // cuBLASLt's heuristics about each candidate on `device`. Empty without cuBLASLt (the matmuls
  // then go to ATen through call_eager, as `gemm = "aten"` does).
  GemmPlan plan_cuda_gemms(const Graph& g, const Settings& s, int device,
                           std::map<std::string, std::shared_ptr<CublasLt::Gemm>>* objects) const {
    std::string why;
    std::shared_ptr<CublasLt> lt = cublaslt(&why);
    if (!lt) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) host().info("matmuls on CUDA run through ATen: " + why);
      return {};
    }
    const CudaRuntime& rt = cuda_runtime(s.nvrtc);
    CudaDriver::Scope scope(*rt.driver, device);
    auto supported = [&](const GemmSpec& t) -> std::string {
      const std::string key = gemm_key(t);
      auto it = objects->find(key);
      if (it == objects->end()) {
        try {
          auto gemm = std::make_shared<CublasLt::Gemm>(lt, t);
          if (std::string no = gemm->why_unsupported(); !no.empty()) return no;
          it = objects->emplace(key, std::move(gemm)).first;
        } catch (const Error& e) {
          return e.what();
        }
      }
      return "";
    };
    GemmPlan plan = plan_gemms(g, s.gemm == "epilogues", supported);
    size_t folded = 0;
    std::map<std::string, int> kinds;
    for (const auto& [node, f] : plan.gemms) {
      folded += f.folded.size();
      const std::string d = f.spec.describe();
      kinds[d.substr(d.find("] ") + 2)]++;
    }
    std::string summary;
    for (const auto& [k, n] : kinds) summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " " + k;
    if (!plan.gemms.empty())
      host().debug("cuBLASLt " + lt->version() + ": " + std::to_string(plan.gemms.size()) + " matmuls (" + summary +
                   "), " + std::to_string(folded) + " nodes folded into their epilogues");
    return plan;
  }

  // max-autotune for the group's GEMMs: each distinct GEMM times the first algorithms cuBLASLt's
  // heuristics give (at most 8) on buffers of its sizes and keeps the fastest, unless the
  // heuristics' own first is within 3% of it. The winner goes into the compile cache (by the GEMM,
  // cuBLASLt's version and the GPU), so a later compile reads it instead of timing again.
  void tune_gemms(const GemmPlan& plan, const std::map<std::string, std::shared_ptr<CublasLt::Gemm>>& objects,
                  const CudaRuntime& rt, int device, int arch, int multiprocessors, const std::string& root) {
    std::shared_ptr<CublasLt> lt = cublaslt(nullptr);
    if (!lt) return;
    std::vector<std::pair<std::string, CublasLt::Gemm*>> todo;
    for (const auto& [node, f] : plan.gemms) {
      const std::string key = gemm_key(f.spec);
      bool seen = false;
      for (const auto& t : todo) seen = seen || t.first == key;
      if (!seen) todo.push_back({key, objects.at(key).get()});
    }
    static std::mutex gpu;  // one group times at a time, as for the kernels
    std::lock_guard<std::mutex> one_at_a_time(gpu);
    const CudaDriver& drv = *rt.driver;
    CudaDriver::Scope scope(drv, device);
    constexpr int kCandidates = 8;
    size_t from_cache = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t t = 0; t < todo.size(); ++t) {
      CublasLt::Gemm& gemm = *todo[t].second;
      const GemmSpec& sp = gemm.spec();
      const std::string path = root + "/" +
                               hash_hex(todo[t].first + "\ncublaslt " + lt->version() + " sm_" + std::to_string(arch) +
                                        " " + std::to_string(multiprocessors)) +
                               ".gemmtune";
      const size_t n = gemm.candidates(kCandidates);
      if (n == 0) continue;
      std::vector<std::pair<int, int>> cached;
      if (read_tune(path, &cached, 1) && cached[0].second == static_cast<int>(n) && cached[0].first >= 0 &&
          static_cast<size_t>(cached[0].first) < n) {
        gemm.choose(static_cast<size_t>(cached[0].first));
        ++from_cache;
        continue;
      }
      TuningScratch own{drv, {}, {}};
      const size_t elem = sp.bf16 ? 2 : 4;
      auto buffer = [&](int64_t elements) -> void* {
        const size_t words = (static_cast<size_t>(std::max<int64_t>(elements, 1)) * elem + 3) / 4;
        own.ptrs.push_back(drv.alloc(words * 4, "max-autotune GEMM buffers"));
        drv.fill32(own.ptrs.back(), sp.bf16 ? 0x3f003f00u : 0x3f000000u, words);
        return reinterpret_cast<void*>(own.ptrs.back());
      };
      CublasLt::Gemm::Ptrs p;
      p.x = buffer((sp.m - 1) * sp.x_rs + (sp.k - 1) * sp.x_cs + 1);
      p.y = buffer((sp.k - 1) * sp.y_rs + (sp.n - 1) * sp.y_cs + 1);
      p.d = buffer((sp.m - 1) * sp.d_ld + sp.n);
      if (sp.c) p.c = buffer((sp.m - 1) * sp.c_ld + sp.n);
      if (sp.bias) p.bias = buffer(sp.n);
      if (sp.aux) p.aux = buffer((sp.m - 1) * sp.aux_ld + sp.n);
      if (sp.bias_grad != GemmBiasGrad::None) p.bias_grad = buffer(std::max(sp.m, sp.n));
      size_t ws_bytes = 0;
      for (size_t i = 0; i < n; ++i) ws_bytes = std::max(ws_bytes, gemm.candidate_workspace(i));
      void* ws = nullptr;
      if (ws_bytes) {
        own.ptrs.push_back(drv.alloc(ws_bytes, "max-autotune GEMM workspace"));
        ws = reinterpret_cast<void*>(own.ptrs.back());
      }
      std::vector<double> cost(n, 1e30);
      for (size_t i = 0; i < n; ++i) {
        try {
          auto run = [&](int times) {
            for (int r = 0; r < times; ++r) gemm.run_candidate(i, p, nullptr, ws);
          };
          const double first = drv.time_ms([&] { run(1); }, nullptr);
          const int reps = static_cast<int>(std::clamp(0.5 / std::max(first, 1e-4), 2.0, 100.0));
          for (int b = 0; b < 3; ++b) cost[i] = std::min(cost[i], drv.time_ms([&] { run(reps); }, nullptr) / reps);
        } catch (const Error& e) {
          host().debug("max-autotune: " + sp.describe() + " algorithm " + std::to_string(i + 1) +
                       " does not run: " + e.what());
        }
      }
      size_t best = 0;
      for (size_t i = 1; i < n; ++i)
        if (cost[i] < cost[best] && cost[i] < 0.97 * cost[0]) best = i;
      gemm.choose(best);
      write_tune(path, {{static_cast<int>(best), static_cast<int>(n)}});
      auto us = [](double ms) { return ms >= 1e29 ? std::string("cannot run") : std::to_string(ms * 1e3) + " us"; };
      host().info("max-autotune: gemm " + std::to_string(t + 1) + "/" + std::to_string(todo.size()) + " " +
                  sp.describe() + ": algorithm " + std::to_string(best + 1) + " of " + std::to_string(n) + ", " +
                  us(cost[best]) + (best ? " (the heuristics' first " + us(cost[0]) + ")" : ""));
    }
    if (from_cache)
      host().info("max-autotune: " + std::to_string(from_cache) + " of " + std::to_string(todo.size()) +
                  " GEMMs' algorithms from the cache");
    host().debug("max-autotune: " + std::to_string(todo.size()) + " GEMMs in " +
                 std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s");
  }

  // NVRTC on each part (from the cache when it is there), the parts at once in threads (at most
  // as many as the machine has cores); rethrows the first part's error.
  void build_cubins(const std::vector<CudaPart>& parts, const CudaRuntime& rt, int arch, const std::string& root,
                    std::vector<std::string>* cubins, std::vector<std::string>* keys,
                    std::vector<CacheStats>* stats) const {
    cubins->assign(parts.size(), "");
    keys->assign(parts.size(), "");
    stats->assign(parts.size(), CacheStats{});
    std::vector<std::exception_ptr> errors(parts.size());
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t p = next++; p < parts.size(); p = next++) {
        try {
          (*cubins)[p] = cubin_cached(parts[p].source, *rt.nvrtc, arch, root, host(), &(*keys)[p], &(*stats)[p]);
        } catch (...) {
          errors[p] = std::current_exception();
        }
      }
    };
    const size_t cores = std::max<size_t>(std::thread::hardware_concurrency(), 1);
    std::vector<std::thread> threads;
    for (size_t t = 1; t < std::min(parts.size(), cores); ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  // max-autotune on CUDA: every variant of every kernel plan (cuda_variants) is generated into
  // trial programs (trial t holds the plans that have a variant t, each plan's text only once),
  // compiled, and each launch timed on the device with scratch buffers of the group's sizes.
  // Returns by plan (variant, 1): the fastest, the defaults unless another is 3% faster.
  std::vector<std::pair<int, int>> tune_cuda(const LoweredGraph& L, const Program& P, const CudaOptions& co,
                                             const std::vector<std::vector<CudaChoice>>& variants,
                                             const CudaRuntime& rt, int device, int arch, const std::string& root) {
    const size_t nk = P.kernels.size();
    size_t trials = 1, total = 0;
    for (const auto& v : variants) trials = std::max(trials, v.size()), total += v.size();
    // Which trial holds each plan's variant (or the earlier variant with the same text).
    std::vector<std::vector<int>> same_as(nk);
    std::vector<std::vector<std::string>> texts(nk);
    std::vector<CudaProgram> programs;
    std::vector<std::vector<CudaPart>> trial_parts;
    std::vector<std::string> what(nk);
    for (size_t t = 0; t < trials; ++t) {
      CudaOptions o = co;
      o.absorb_epilogues = false;
      o.choice.assign(nk, CudaChoice{});
      o.only.assign(nk, false);
      for (size_t k = 0; k < nk; ++k)
        if (t < variants[k].size()) o.choice[k] = variants[k][t], o.only[k] = true;
      CudaProgram prog = generate_cuda(L, P, o);
      std::vector<std::string> plan_text(nk);
      for (const CudaLaunch& l : prog.launches) plan_text[static_cast<size_t>(l.plan)] += l.text;
      std::vector<bool> keep(nk, false);
      for (size_t k = 0; k < nk; ++k) {
        if (t >= variants[k].size()) continue;
        if (what[k].empty())
          for (const CudaLaunch& l : prog.launches)
            if (l.plan == static_cast<int>(k) && what[k].empty()) what[k] = l.what;
        const auto earlier =
            static_cast<size_t>(std::find(texts[k].begin(), texts[k].end(), plan_text[k]) - texts[k].begin());
        const bool fresh = earlier == texts[k].size();
        same_as[k].push_back(static_cast<int>(fresh ? t : earlier));
        texts[k].push_back(plan_text[k]);
        keep[k] = fresh && !plan_text[k].empty();
      }
      CudaProgram kept = prog;
      kept.launches.clear();
      for (const CudaLaunch& l : prog.launches)
        if (keep[static_cast<size_t>(l.plan)]) kept.launches.push_back(l);
      kept.source = std::string(cuda_prelude()) + "\n";
      for (const CudaLaunch& l : kept.launches) kept.source += l.text;
      trial_parts.push_back(split_program(kept, kCudaPartBytes));
      programs.push_back(std::move(kept));
    }
    std::vector<CudaPart> all_parts;
    for (const auto& tp : trial_parts) all_parts.insert(all_parts.end(), tp.begin(), tp.end());
    std::vector<std::string> cubins, keys;
    std::vector<CacheStats> stats;
    const auto t0 = std::chrono::steady_clock::now();
    build_cubins(all_parts, rt, arch, root, &cubins, &keys, &stats);
    const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // One group times at a time: kernels of groups compiling beside it would skew the timings.
    static std::mutex gpu;
    std::lock_guard<std::mutex> one_at_a_time(gpu);
    const CudaDriver& drv = *rt.driver;
    CudaDriver::Scope scope(drv, device);
    TuningScratch own{drv, {}, {}};
    // The group's inputs and outputs, filled with 0.5 (floats) or 0 (integers, booleans: valid
    // indices), and its scratch.
    const size_t n_io = L.num_inputs + L.num_outputs;
    std::vector<int64_t> io_bytes(n_io, 1);
    std::vector<unsigned> io_fill(n_io, 0);
    for (const ValueInfo& v : L.values) {
      if (v.buffer < 0 || static_cast<size_t>(v.buffer) >= n_io) continue;
      const auto b = static_cast<size_t>(v.buffer);
      io_bytes[b] = std::max<int64_t>(
          io_bytes[b], (v.storage_offset + std::max<int64_t>(v.extent(), 1)) * static_cast<int64_t>(ty_size(v.ty)));
      io_fill[b] = v.ty == Ty::f32 ? 0x3f000000u : v.ty == Ty::bf16 ? 0x3f003f00u : v.ty == Ty::f64 ? 0x3fe00000u : 0u;
    }
    auto alloc = [&](int64_t bytes, unsigned fill, const std::string& what) {
      const size_t words = (static_cast<size_t>(std::max<int64_t>(bytes, 4)) + 3) / 4 + 4;
      own.ptrs.push_back(drv.alloc(words * 4, what));
      drv.fill32(own.ptrs.back(), fill, words);
      return own.ptrs.back();
    };
    std::vector<CudaDriver::CUdeviceptr> base;
    for (size_t b = 0; b < n_io; ++b) base.push_back(alloc(io_bytes[b], io_fill[b], "max-autotune buffers"));
    for (int64_t bytes : L.scratch_bytes) base.push_back(alloc(bytes, 0, "max-autotune scratch"));
    CudaDriver::CUdeviceptr table = 0;
    int entries = 0;
    for (const auto& prog : programs) entries = std::max(entries, prog.scalar_table);
    if (entries > 0) table = alloc(int64_t{8} * entries, 0x3fe00000u, "max-autotune scalars");
    std::vector<std::vector<double>> cost(nk);
    for (size_t k = 0; k < nk; ++k) cost[k].assign(variants[k].size(), 0.0);
    size_t part = 0;
    for (size_t t = 0; t < trials; ++t) {
      const CudaProgram& prog = programs[t];
      std::vector<CudaDriver::CUdeviceptr> B = base;
      for (int64_t bytes : prog.extra_scratch_bytes) B.push_back(alloc(bytes, 0, "max-autotune partial results"));
      std::map<std::string, CudaDriver::CUfunction> fns;
      for (size_t p = 0; p < trial_parts[t].size(); ++p, ++part) {
        own.modules.push_back(drv.load_module(cubins[part], root + "/" + keys[part] + ".cubin"));
        for (int l : trial_parts[t][p].launches)
          fns[prog.launches[static_cast<size_t>(l)].name] =
              drv.function(own.modules.back(), prog.launches[static_cast<size_t>(l)].name);
      }
      for (const CudaLaunch& l : prog.launches) {
        std::vector<void*> vals;
        for (int b : l.buffers) vals.push_back(reinterpret_cast<void*>(B.at(static_cast<size_t>(b))));
        if (l.scalars) vals.push_back(reinterpret_cast<void*>(table));
        std::vector<void*> args;
        for (auto& v : vals) args.push_back(&v);
        const unsigned grid[3] = {l.grid, 1, 1}, block[3] = {l.block, 1, 1};
        auto run = [&](int times) {
          for (int r = 0; r < times; ++r) drv.launch(fns.at(l.name), grid, block, 0, nullptr, args.data(), l.name);
        };
        double ms = 1e30;
        try {
          const double first = drv.time_ms([&] { run(1); }, nullptr);
          // Batches of about 0.2 ms; the best of three.
          const int reps = static_cast<int>(std::clamp(0.2 / std::max(first, 1e-4), 2.0, 200.0));
          for (int b = 0; b < 3; ++b) ms = std::min(ms, drv.time_ms([&] { run(reps); }, nullptr) / reps);
        } catch (const Error& e) {
          // Too many registers for a block this large, say: this variant cannot run here.
          host().debug("max-autotune: " + l.name + " (" + l.what + ") does not run: " + e.what());
          ms = 1e30;
        }
        cost[static_cast<size_t>(l.plan)][t] += ms;
      }
    }
    std::vector<std::pair<int, int>> winners(nk, {0, 1});
    for (size_t k = 0; k < nk; ++k) {
      // A variant with the text of an earlier one was not compiled again: it costs what that did.
      for (size_t v = 0; v < variants[k].size(); ++v) cost[k][v] = cost[k][static_cast<size_t>(same_as[k][v])];
      size_t best = 0;
      for (size_t v = 1; v < variants[k].size(); ++v)
        if (cost[k][v] < cost[k][best] && cost[k][v] < 0.97 * cost[k][0]) best = v;
      winners[k] = {static_cast<int>(best), 1};
      if (what[k].empty()) continue;  // a plan with nothing to run (no elements)
      auto us = [](double ms) { return ms >= 1e29 ? std::string("cannot run") : std::to_string(ms * 1e3) + " us"; };
      host().info("max-autotune: CUDA kernel " + std::to_string(k + 1) + "/" + std::to_string(nk) + " (" + what[k] +
                  "): " + kiln::inductor::describe(variants[k][best]) + ", " + us(cost[k][best]) +
                  (best ? " (defaults " + us(cost[k][0]) + ")" : "") + "; " + std::to_string(variants[k].size()) +
                  " variants");
    }
    host().debug("max-autotune: " + std::to_string(total) + " variants of " + std::to_string(nk) + " kernels in " +
                 std::to_string(trials) + " trial programs, compiled in " + std::to_string(compile_s) + " s");
    return winners;
  }

  // The buffers each step of a CPU program reads or writes (scratch_plan.h).
  static std::vector<std::set<int>> cpu_touches(const Graph& g, const LoweredGraph& L, const Program& P) {
    std::vector<std::vector<int64_t>> reads(g.num_nodes()), writes(g.num_nodes());
    for (const Step& st : P.steps) {
      if (st.kernel >= 0) continue;
      const Node n = g.node(st.extern_node);
      auto folded = L.extern_inputs.find(st.extern_node);
      reads[static_cast<size_t>(st.extern_node)] = folded != L.extern_inputs.end() ? folded->second : n.inputs();
      writes[static_cast<size_t>(st.extern_node)] = n.outputs();
    }
    return cpu_step_touches(L, P, reads, writes);
  }

  // The CPU's buffers and parameters, then everything else but the kernels (prepare).
  void prepare_cpu(CompiledGroup& exe, const Graph& g, const LoweredGraph& L, const Program& P) {
    exe.param_values.clear();
    for (const auto& p : L.params) exe.param_values.push_back(p.value);
    // Kernels with their numbers as arguments read them after the scalars (hoist_literals).
    exe.param_values.insert(exe.param_values.end(), exe.literals.begin(), exe.literals.end());
    // Each slot 64 bytes longer than its value (vector code may read past a row's end), 64-byte
    // aligned, as the blocks of AlignedBuf.
    exe.scratch_bytes = L.scratch_bytes;
    exe.scratch = plan_scratch(L.scratch_bytes, L.num_inputs + L.num_outputs, cpu_touches(g, L, P),
                               /*align=*/64, /*slack=*/64);
    exe.own_scratch = AlignedBuf();
    if (!exe.scratch_bytes.empty())
      host().debug("scratch of " + std::to_string(exe.scratch_bytes.size()) +
                   " buffers: " + std::to_string(exe.scratch.bytes >> 10) + " KiB planned from their lifetimes (" +
                   std::to_string(exe.scratch.unplanned >> 10) + " KiB one place each)" +
                   (exe.scratch.planned ? "" : "; not planned: a step touches a buffer that has no name"));
    prepare(exe, g, L, P);
  }

  // Placements and extern calls.
  void prepare(GroupBase& exe, const Graph& g, const LoweredGraph& L, const Program& P) {
    exe.n_in = L.num_inputs;
    exe.n_out = L.num_outputs;
    exe.params = L.params;
    exe.place.assign(L.values.size(), Placement{});
    for (size_t v = 0; v < L.values.size(); ++v) {
      const ValueInfo& info = L.values[v];
      Placement& p = exe.place[v];
      p.dtype = dl_of_ty(info.ty);
      p.shape = info.shape;
      p.strides = info.strides;
      int root = static_cast<int>(v);
      while (!L.values[static_cast<size_t>(root)].materialized &&
             (L.values[static_cast<size_t>(root)].kind == ValueInfo::Kind::View ||
              L.values[static_cast<size_t>(root)].kind == ValueInfo::Kind::Reshape))
        root = L.values[static_cast<size_t>(root)].src;
      const ValueInfo& r = L.values[static_cast<size_t>(root)];
      if (r.materialized) {
        p.slot = r.buffer;
        p.offset = info.storage_offset - r.storage_offset;
      }
    }
    exe.in_meta.clear();
    exe.out_meta.clear();
    for (int64_t v : g.inputs()) exe.in_meta.push_back(exe.place[static_cast<size_t>(v)]);
    for (int64_t v : g.outputs()) exe.out_meta.push_back(exe.place[static_cast<size_t>(v)]);
    exe.externs.clear();
    for (const Step& st : P.steps) {
      if (st.extern_node < 0) continue;
      Node n = g.node(st.extern_node);
      ExternCall call;
      call.op = n.op();
      for (size_t i = 0; i < n.num_args(); ++i) {
        const KilnArg* a = n.arg(i).raw();
        call.args.emplace_back();
        OwnedArg& oa = call.args.back();
        // Only the bytes the host wrote: an older host's KilnArg may end before fields a newer
        // header adds, and reading sizeof(KilnArg) would run past it.
        std::memcpy(&oa.arg, a, std::min<size_t>(a->struct_size, sizeof(KilnArg)));
        oa.arg.struct_size = KILN_ARG_STRUCT_SIZE;
        oa.name = a->name ? a->name : "";
        oa.arg.name = oa.name.c_str();
        if (a->tag == KILN_ARG_TENSOR) {
          oa.value = static_cast<int>(a->i);
          if (exe.place[static_cast<size_t>(oa.value)].slot < 0)
            throw Error(KILN_ERROR_INTERNAL, "extern argument without a buffer");
        }
        if (a->s) {
          oa.str = a->s;
          oa.arg.s = oa.str.c_str();
        }
        if (a->ints) {
          oa.ints.assign(a->ints, a->ints + a->len);
          oa.arg.ints = oa.ints.data();
        }
        if (a->doubles) {
          oa.doubles.assign(a->doubles, a->doubles + a->len);
          oa.arg.doubles = oa.doubles.data();
        }
        oa.arg.runtime_scalar = -1;
      }
      for (int64_t v : n.outputs()) call.outputs.push_back(static_cast<int>(v));
      exe.externs.emplace(st.extern_node, std::move(call));
    }
  }

  // max-autotune: times every variant of every kernel at 1 and at all threads on scratch data.
  std::vector<std::pair<int, int>> tune(CompiledGroup& exe, const LoweredGraph& L, const Program& P,
                                        const std::vector<std::vector<Variant>>& variants, int threads) {
    std::vector<std::vector<char>> bufs;
    std::vector<void*> B(L.num_inputs + L.num_outputs + exe.scratch_bytes.size());
    for (size_t v = 0; v < L.values.size(); ++v) {
      const ValueInfo& info = L.values[v];
      if (info.buffer < 0 || static_cast<size_t>(info.buffer) >= L.num_inputs + L.num_outputs) continue;
      bufs.emplace_back(static_cast<size_t>(std::max<int64_t>(info.extent(), 1)) * ty_size(info.ty) + 64, 0);
      if (info.ty == Ty::f32) {
        float* f = reinterpret_cast<float*>(bufs.back().data());
        for (int64_t i = 0; i < info.extent(); ++i) f[i] = 0.5f;
      }
      B[static_cast<size_t>(info.buffer)] = bufs.back().data();
    }
    // The planned arena (slots one kernel touches never share bytes), zeroed.
    AlignedBuf arena(static_cast<size_t>(std::max<int64_t>(exe.scratch.bytes, 1)));
    for (size_t s = 0; s < exe.scratch_bytes.size(); ++s)
      B[L.num_inputs + L.num_outputs + s] = arena.p.get() + exe.scratch.offset[s];
    for (auto& p : B)
      if (!p) {
        bufs.emplace_back(64, 0);
        p = bufs.back().data();
      }
    std::vector<std::pair<int, int>> winners;
    for (size_t k = 0; k < P.kernels.size(); ++k) {
      double best = 1e30;
      std::pair<int, int> win{0, threads};
      std::vector<int> thread_options = {threads};
      if (threads > 1) thread_options.push_back(1);
      for (size_t v = 0; v < variants[k].size(); ++v) {
        auto fn = reinterpret_cast<KernelFn>(exe.lib->symbol("kiln_k" + std::to_string(k) + "_v" + std::to_string(v)));
        for (int t : thread_options) {
          fn(B.data(), exe.param_values.data(), t);  // warm up
          std::vector<double> times;
          for (int rep = 0; rep < 5; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            fn(B.data(), exe.param_values.data(), t);
            times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          }
          std::sort(times.begin(), times.end());
          const double ms = times[times.size() / 2];
          if (ms < best) {
            best = ms;
            win = {static_cast<int>(v), t};
          }
        }
      }
      winners.push_back(win);
      host().info("max-autotune: kernel " + std::to_string(k + 1) + "/" + std::to_string(P.kernels.size()) + " (" +
                  std::to_string(P.kernels[k].stages.size()) + " stages" + (P.kernels[k].column ? ", column" : "") +
                  "): best " + variants[k][static_cast<size_t>(win.first)].name() + " x" + std::to_string(win.second) +
                  " threads, " + std::to_string(best) + " ms");
    }
    return winners;
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(InductorPlugin)
