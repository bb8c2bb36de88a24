// The hpu_backend: lowers claimed subgraphs to a Synapse graph (synapse_lower.h), compiles a recipe
// and launches it on Intel Gaudi (synapse_runtime.h). libSynapse.so is opened at run time, so the
// plugin loads everywhere and says why it is unavailable where there is no Gaudi;
// `[plugin.hpu_backend] synapse_library = "<path>"` points it at another library with the same
// entry points, which is how the tests run all of kiln's side against a stand-in where there is
// no Gaudi. kiln's tensors are LibTorch CPU tensors: each launch copies the inputs into device
// buffers the executable owns and the outputs back.
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <iterator>
#include <map>
#include <mutex>

#include <kiln/plugin_api.hpp>

#include "synapse_lower.h"
#include "synapse_runtime.h"

namespace {

using namespace kiln::plugin;
using kiln::hpu::Device;
using kiln::hpu::DeviceBuffer;
using kiln::hpu::HostBuffer;
using kiln::hpu::Recipe;
using kiln::hpu::SynapseError;
using kiln::hpu::SynapseLibrary;
using kiln::hpu::SynGraph;
using kiln::hpu::SynTensor;
namespace syn = kiln::hpu::syn;

constexpr const char* kRuntime = "libSynapse.so";

// "" when the library opens; otherwise the loader's reason.
std::string try_open(const char* lib) {
  void* h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    return "";
  }
  const char* why = dlerror();
  return why ? why : "unknown dlopen error";
}

// A Synapse call's failure as the host's error: out of device or host memory is out of memory.
Error to_error(const SynapseError& e) {
  return Error(e.out_of_memory() ? KILN_ERROR_OUT_OF_MEMORY : KILN_ERROR_INTERNAL,
               std::string("hpu_backend: ") + e.what());
}

// float -> bfloat16 bits, rounding to nearest even (as ATen rounds).
uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  b += 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

// Visits every element of a tensor of `shape` with element strides `strides`, in row-major order:
// f(element offset in the strided tensor, its index in the dense one).
template <class F>
void for_each_element(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, F f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    f(off, i);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A group's executable for one recipe: a device buffer and a mapped host buffer per persistent
// tensor that holds data (of its largest sizes), and the workspace. Each launch copies inputs,
// run-time scalars and size scalars in, launches, copies the outputs out and waits for the stream.
// A recipe for a range of sizes (kiln::hpu::dynamic_graph) is launched with the lowering at the
// call's own sizes, which gives each persistent tensor's actual sizes and each size scalar's value.
class HpuGroup : public Executable {
 public:
  HpuGroup(std::shared_ptr<Recipe> recipe, SynGraph g, std::shared_ptr<Device> device)
      : recipe_(std::move(recipe)), g_(std::move(g)), device_(std::move(device)) {
    persistent_ = kiln::hpu::persistent_tensors(g_);
    for (const SynTensor& t : g_.tensors) needs_sizes_ = needs_sizes_ || t.dynamic();
    needs_sizes_ = needs_sizes_ || !g_.size_scalars.empty();
    for (size_t k = 0; k < persistent_.size(); ++k) {
      const SynTensor& t = g_.tensors[static_cast<size_t>(persistent_[k])];
      if (t.kind == SynTensor::Kind::kShape) {  // no data: its sizes are all a launch gives
        device_buffers_.push_back(nullptr);
        host_buffers_.push_back(nullptr);
        continue;
      }
      const uint64_t bytes = kiln::hpu::device_bytes(t.shape, t.dtype);
      const std::string what = "tensor \"" + t.name + "\" of " + recipe_->name();
      device_buffers_.push_back(std::make_unique<DeviceBuffer>(device_, bytes, what));
      host_buffers_.push_back(std::make_unique<HostBuffer>(device_, bytes, what));
    }
    if (recipe_->workspace_size() > 0)
      workspace_ =
          std::make_unique<DeviceBuffer>(device_, recipe_->workspace_size(), "the workspace of " + recipe_->name());
  }

  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               void* stream) override {
    execute_with_scalars(inputs, num_inputs, outputs, num_outputs, Scalars(), stream);
  }

  void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                            const Scalars& scalars, void*) override {
    launch(inputs, num_inputs, outputs, num_outputs, scalars, nullptr);
  }

  // Whether a launch needs the lowering at its own sizes (a recipe for a range of sizes).
  bool needs_sizes() const { return needs_sizes_; }

  // `actual`: the lowering at this call's sizes, for a recipe compiled for a range of them.
  void launch(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs, const Scalars& scalars,
              const SynGraph* actual) {
    if (needs_sizes_ && !actual)
      throw Error(KILN_ERROR_INTERNAL, "hpu_backend: " + recipe_->name() +
                                           " serves a range of sizes and was launched without the call's own");
    if (num_inputs != g_.inputs.size() || num_outputs != g_.outputs.size())
      throw Error(KILN_ERROR_INTERNAL, "hpu_backend: " + recipe_->name() + " was compiled for " +
                                           std::to_string(g_.inputs.size()) + " inputs and " +
                                           std::to_string(g_.outputs.size()) + " outputs, and is run with " +
                                           std::to_string(num_inputs) + " and " + std::to_string(num_outputs));
    const SynapseLibrary& lib = device_->lib();
    std::lock_guard<std::mutex> lock(device_->mutex());
    std::vector<syn::LaunchTensorInfo> launch(persistent_.size());
    std::vector<std::vector<int64_t>> shapes(persistent_.size());
    try {
      for (size_t k = 0; k < persistent_.size(); ++k) {
        const SynTensor& t = g_.tensors[static_cast<size_t>(persistent_[k])];
        const bool shape_tensor = t.kind == SynTensor::Kind::kShape;
        // The sizes at this call: those compiled for, or those of the lowering at its sizes.
        shapes[k] = !actual        ? t.shape
                    : shape_tensor ? actual->tensors.at(static_cast<size_t>(t.index)).shape
                                   : actual->tensors.at(static_cast<size_t>(persistent_[k])).shape;
        if (!shape_tensor) {
          char* host = host_buffers_[k]->data();
          if (t.kind == SynTensor::Kind::kInput) {
            pack(inputs[static_cast<size_t>(t.index)], t, shapes[k], host);
          } else if (t.kind == SynTensor::Kind::kScalar) {
            write_number(scalars.number(static_cast<int32_t>(t.index)), t.dtype, host);
          } else if (t.kind == SynTensor::Kind::kSizeScalar) {
            const auto& node = actual->nodes.at(static_cast<size_t>(t.index));
            write_number(kiln::hpu::constant_value(*actual, node), t.dtype, host);
          }
          if (t.kind != SynTensor::Kind::kOutput)
            lib.check(lib.mem_copy_async(device_->stream(), reinterpret_cast<uint64_t>(host),
                                         kiln::hpu::device_bytes(shapes[k], t.dtype), device_buffers_[k]->address(),
                                         syn::kHostToDram),
                      "synMemCopyAsync", "copying \"" + t.name + "\" in for " + recipe_->name());
        }
        syn::LaunchTensorInfo& info = launch[k];
        info = syn::LaunchTensorInfo{};
        info.tensor_name = t.name.c_str();
        info.device_address = shape_tensor ? 0 : device_buffers_[k]->address();
        info.tensor_type = shape_tensor ? syn::kShapeTensor : syn::kDataTensor;
        const auto& shape = shapes[k];
        for (size_t d = 0; d < shape.size(); ++d)
          info.tensor_size[d] = static_cast<uint64_t>(shape[shape.size() - 1 - d]);
        if (shape.empty()) info.tensor_size[0] = 1;
        info.tensor_id = recipe_->ids()[k];
      }
      lib.check(lib.launch(device_->stream(), launch.data(), static_cast<uint32_t>(launch.size()),
                           workspace_ ? workspace_->address() : 0, recipe_->handle(), 0),
                "synLaunchExt", "launching " + recipe_->name());
      for (size_t k = 0; k < persistent_.size(); ++k) {
        const SynTensor& t = g_.tensors[static_cast<size_t>(persistent_[k])];
        if (t.kind != SynTensor::Kind::kOutput) continue;
        lib.check(lib.mem_copy_async(device_->stream(), device_buffers_[k]->address(),
                                     kiln::hpu::device_bytes(shapes[k], t.dtype),
                                     reinterpret_cast<uint64_t>(host_buffers_[k]->data()), syn::kDramToHost),
                  "synMemCopyAsync", "copying \"" + t.name + "\" out of " + recipe_->name());
      }
      lib.check(lib.stream_synchronize(device_->stream()), "synStreamSynchronize", "waiting for " + recipe_->name());
    } catch (const SynapseError& e) {
      // Whatever was queued is waited for, so no copy lands in a buffer after this returns.
      lib.stream_synchronize(device_->stream());
      throw to_error(e);
    }
    for (size_t k = 0; k < persistent_.size(); ++k) {
      const SynTensor& t = g_.tensors[static_cast<size_t>(persistent_[k])];
      if (t.kind == SynTensor::Kind::kOutput)
        unpack(host_buffers_[k]->data(), t, shapes[k], outputs[static_cast<size_t>(t.index)]);
    }
  }

 private:
  // A number as the one element of a tensor of `dtype`.
  static void write_number(double x, syn::DataType dtype, char* dst) {
    if (dtype == syn::kTypeInt32) {
      const int32_t v = static_cast<int32_t>(x);
      std::memcpy(dst, &v, 4);
    } else if (dtype == syn::kTypeBf16) {
      const uint16_t b = to_bf16(static_cast<float>(x));
      std::memcpy(dst, &b, 2);
    } else {
      const float v = static_cast<float>(x);
      std::memcpy(dst, &v, 4);
    }
  }

  // The tensor kiln hands in, dense in row-major order (Synapse's layout with its dims reversed);
  // int64 targets narrowed to the device's int32.
  void pack(const DLTensor& in, const SynTensor& t, const std::vector<int64_t>& want, char* dst) const {
    check_shape(in, t, want, "input");
    const Tensor v(&in);
    const char* src = v.data<char>();
    const auto shape = v.shape(), strides = v.strides();
    if (t.widened) {
      for_each_element(shape, strides, [&](int64_t off, int64_t i) {
        int64_t x;
        std::memcpy(&x, src + off * 8, 8);
        if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
          throw Error(KILN_ERROR_INVALID_ARGUMENT,
                      "hpu_backend: input " + std::to_string(t.index) + " of " + recipe_->name() + " holds " +
                          std::to_string(x) + ", beyond the int32 the device reads targets, indices and counters as");
        const int32_t y = static_cast<int32_t>(x);
        std::memcpy(dst + i * 4, &y, 4);
      });
      return;
    }
    const int64_t es = in.dtype.bits / 8;
    if (v.is_contiguous()) {
      std::memcpy(dst, src, static_cast<size_t>(v.numel() * es));
      return;
    }
    for_each_element(shape, strides, [&](int64_t off, int64_t i) {
      std::memcpy(dst + i * es, src + off * es, static_cast<size_t>(es));
    });
  }

  void unpack(const char* src, const SynTensor& t, const std::vector<int64_t>& want, DLTensor& out) const {
    check_shape(out, t, want, "output");
    const Tensor v(&out);
    char* dst = v.data<char>();
    const auto shape = v.shape(), strides = v.strides();
    if (t.widened) {
      for_each_element(shape, strides, [&](int64_t off, int64_t i) {
        int32_t y;
        std::memcpy(&y, src + i * 4, 4);
        const int64_t x = y;
        std::memcpy(dst + off * 8, &x, 8);
      });
      return;
    }
    const int64_t es = out.dtype.bits / 8;
    if (v.is_contiguous()) {
      std::memcpy(dst, src, static_cast<size_t>(v.numel() * es));
      return;
    }
    for_each_element(shape, strides, [&](int64_t off, int64_t i) {
      std::memcpy(dst + off * es, src + i * es, static_cast<size_t>(es));
    });
  }

  // The tensor kiln hands in must be what the recipe was compiled for (at these sizes): packing
  // another dtype or shape would read or write past the staging buffers.
  void check_shape(const DLTensor& d, const SynTensor& t, const std::vector<int64_t>& want_shape,
                   const char* what) const {
    const std::vector<int64_t> shape(d.shape, d.shape + d.ndim);
    const std::string which =
        std::string("hpu_backend: ") + what + " " + std::to_string(t.index) + " of " + recipe_->name();
    if (d.device.device_type != kDLCPU) throw Error(KILN_ERROR_INVALID_ARGUMENT, which + " is not a CPU tensor");
    DLDataType want{};
    want.lanes = 1;
    if (t.widened) want.code = kDLInt, want.bits = 64;
    else if (t.dtype == syn::kTypeBf16) want.code = kDLBfloat, want.bits = 16;
    else if (t.dtype == syn::kTypeInt32) want.code = kDLInt, want.bits = 32;
    else want.code = kDLFloat, want.bits = 32;
    if (!same_dtype(d.dtype, want))
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  which + " is " + dtype_name(d.dtype) + ", and it was compiled for " + dtype_name(want));
    if (shape != want_shape)
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  which + " has shape " + dims(shape) + ", and it was compiled for " + dims(want_shape));
  }

  static std::string dims(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  }

  std::shared_ptr<Recipe> recipe_;
  SynGraph g_;
  std::shared_ptr<Device> device_;
  std::vector<int32_t> persistent_;
  std::vector<std::unique_ptr<DeviceBuffer>> device_buffers_;
  std::vector<std::unique_ptr<HostBuffer>> host_buffers_;
  std::unique_ptr<DeviceBuffer> workspace_;
  bool needs_sizes_ = false;
};

// A group whose sizes change (a symbolic view): one recipe per range of sizes (a bucket under
// `[plugin.hpu_backend] buckets`, "pow2" by default), compiled from the lowerings at the range's
// smallest and largest sizes with Synapse's dynamic shapes (kiln::hpu::dynamic_graph), and
// launched at each call with the lowering at the call's own sizes (the last 64 kept). A range whose
// two lowerings differ other than in sizes is compiled per size instead, with a warning once.
class HpuSymbolicGroup : public Executable {
 public:
  using CompileFn = std::function<std::unique_ptr<HpuGroup>(SynGraph)>;
  using LogFn = std::function<void(const std::string&)>;

  HpuSymbolicGroup(const Graph& symbolic, std::string policy, CompileFn compile, LogFn debug, LogFn warn)
      : graph_(std::make_unique<SymbolicGraphCopy>(symbolic)),
        policy_(std::move(policy)),
        compile_(std::move(compile)),
        debug_(std::move(debug)),
        warn_(std::move(warn)),
        relations_(kiln::hpu::symbol_relations(symbolic)) {
    serves_all_sizes = true;
    at(symbolic.symbol_hints());  // the view's own sizes now, so that a recipe that fails fails the compile
  }

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    execute_sized(in, n_in, out, n_out, Scalars(), sizes_of(in, n_in), stream);
  }
  void execute_with_scalars(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                            void* stream) override {
    execute_sized(in, n_in, out, n_out, scalars, sizes_of(in, n_in), stream);
  }
  void execute_sized(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                     const std::vector<int64_t>& sizes, void*) override {
    const auto [exe, actual] = at(sizes);
    exe->launch(in, n_in, out, n_out, scalars, actual.get());
  }

 private:
  Graph symbolic() const { return graph_->graph(); }

  std::vector<int64_t> sizes_of(const DLTensor* in, size_t n_in) const {
    std::vector<int64_t> v;
    for (const KilnSizeSymbol& s : graph_->symbols()) {
      if (s.input < 0 || static_cast<size_t>(s.input) >= n_in || s.dim < 0 || s.dim >= in[s.input].ndim)
        throw Error(KILN_ERROR_INTERNAL, "hpu_backend: a size symbol on input " + std::to_string(s.input) + " dim " +
                                             std::to_string(s.dim) + " the call does not have");
      v.push_back(in[s.input].shape[s.dim]);
    }
    return v;
  }

  static std::string sizes_text(const std::vector<int64_t>& v) {
    std::string t = "[";
    for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
    return t + "]";
  }

  template <class V>
  static void keep_recent(V& list, size_t i) {
    std::rotate(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(i),
                list.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }

  // The executable for `sizes`, and the lowering at them where it serves a range.
  std::pair<std::shared_ptr<HpuGroup>, std::shared_ptr<const SynGraph>> at(const std::vector<int64_t>& sizes) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string nodes = std::to_string(symbolic().num_nodes()) + " nodes";
    const std::optional<SizeBucket> b = kiln::hpu::size_range(relations_, policy_, sizes);
    auto range = b ? ranges_.find(b->high) : ranges_.end();
    if (b && range == ranges_.end()) {
      std::string why;
      std::optional<SynGraph> dyn;
      try {
        ConcreteGraph low(symbolic(), &b->low), high(symbolic(), &b->high);
        dyn = kiln::hpu::dynamic_graph(kiln::hpu::lower(low.graph()), kiln::hpu::lower(high.graph()), &why);
      } catch (const Error& e) {
        why = std::string("its lowering at the range's ends: ") + e.what();
      }
      std::shared_ptr<HpuGroup> exe;
      if (dyn) {
        exe = compile_(std::move(*dyn));
        debug_("hpu_backend: a group of " + nodes + " compiled for the sizes " + sizes_text(b->low) + " to " +
               sizes_text(b->high) + " (first met at " + sizes_text(sizes) + ")");
      } else if (!warned_) {
        warn_("hpu_backend: a group of " + nodes + " is compiled for each size it meets, not once per range: " + why);
        warned_ = true;
      }
      range = ranges_.emplace(b->high, exe).first;
    } else if (!b && !warned_) {
      warn_("hpu_backend: a group of " + nodes + " is compiled for each size it meets, not once per range: its sizes " +
            sizes_text(sizes) + " do not follow the relations its reshapes set between them");
      warned_ = true;
    }
    if (b && range->second) {
      if (!range->second->needs_sizes()) return {range->second, nullptr};
      for (size_t i = 0; i < lowered_.size(); ++i)
        if (lowered_[i].first == sizes) {
          keep_recent(lowered_, i);
          return {range->second, lowered_.front().second};
        }
      ConcreteGraph concrete(symbolic(), &sizes);
      auto g = std::make_shared<const SynGraph>(kiln::hpu::lower(concrete.graph()));
      lowered_.insert(lowered_.begin(), {sizes, g});
      if (lowered_.size() > 64) lowered_.pop_back();
      return {range->second, g};
    }
    for (size_t i = 0; i < exact_.size(); ++i)
      if (exact_[i].first == sizes) {
        keep_recent(exact_, i);
        return {exact_.front().second, nullptr};
      }
    ConcreteGraph concrete(symbolic(), &sizes);
    std::shared_ptr<HpuGroup> exe = compile_(kiln::hpu::lower(concrete.graph()));
    exact_.insert(exact_.begin(), {sizes, exe});
    if (exact_.size() > 64) exact_.pop_back();
    return {exe, nullptr};
  }

  std::unique_ptr<SymbolicGraphCopy> graph_;
  std::string policy_;
  CompileFn compile_;
  LogFn debug_, warn_;
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::shared_ptr<HpuGroup>> ranges_;  // by the range's largest sizes; null: per size
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<const SynGraph>>> lowered_;  // most recent first
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<HpuGroup>>> exact_;          // most recent first
  bool warned_ = false;
  std::vector<kiln::hpu::SymbolRelation> relations_;
};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

// Recipes of this process's live executables, by library and graph text: a group met again while
// one is alive (another input signature with the same shapes, a recapture) launches the recipe it
// has. Held weakly: once no executable uses the recipes (nor the device), the device is released,
// and the recipe cache on disk serves the next compile.
std::shared_ptr<Recipe> cached_recipe(const std::string& key, std::shared_ptr<Recipe> put = nullptr) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Recipe>> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = cache.begin(); it != cache.end();) it = it->second.expired() ? cache.erase(it) : std::next(it);
  if (put) cache[key] = put;
  auto it = cache.find(key);
  return it == cache.end() ? nullptr : it->second.lock();
}

class HpuPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "hpu_backend";
    d.version = "0.3.0";
    d.vendor = "kiln";
    d.description = "Intel Gaudi through the Synapse runtime (libSynapse.so, or [plugin.hpu_backend] synapse_library)";
    // CPU: LibTorch CPU tensors copied to the Gaudi and back; with synapse_library set on a machine
    // without a Gaudi, the named library runs them (the stand-in of the tests).
    d.device_kinds = KILN_DEVICE_MASK_GAUDI | KILN_DEVICE_MASK_CPU;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = false;
    d.runtime_scalars = true;  // the optimizers' changing values are persistent tensors of the recipe
    d.symbolic_shapes = true;  // a recipe per range of sizes (Synapse's dynamic shapes)
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* dev = devices.first(KILN_DEVICE_GAUDI);
    const auto configured = host().option("synapse_library");
    if (configured) {
      try {
        SynapseLibrary::open(*configured);
      } catch (const SynapseError& e) {
        return Availability::no(e.what());
      }
      if (!dev) {
        if (!devices.first(KILN_DEVICE_CPU))
          return Availability::no("no Intel Gaudi device, and no CPU device offered");
        // Only when named: a library named on a machine without a Gaudi is a test bed.
        return Availability::yes("Synapse library " + *configured + " set by [plugin.hpu_backend] synapse_library", 0);
      }
    }
    const std::string runtime_error = configured ? "" : try_open(kRuntime);
    if (!dev && !runtime_error.empty())
      return Availability::no(std::string("no Intel Gaudi device found, and ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    if (!dev) return Availability::no(std::string("no Intel Gaudi device found (") + kRuntime + " loads)");
    if (!runtime_error.empty())
      return Availability::no(std::string("Intel Gaudi device found, but ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    // The device's own compiler comes before any general one (inductor scores 200).
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_GAUDI)) + " Gaudi device(s), first " + dev->name +
                                 "; " + configured.value_or(kRuntime) + " loads",
                             400);
  }

  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> taken;
    const std::string path = host().option("synapse_library").value_or(kRuntime);
    try {
      SynapseLibrary::open(path);
    } catch (const SynapseError& e) {
      host().debug(std::string("hpu_backend: claims nothing: ") + e.what());
      return taken;
    }
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      const Node n = g.node(static_cast<int64_t>(i));
      std::string why;
      for (int64_t v : n.inputs())
        if (why.empty() && g.value(v).device().device_type != kDLCPU) why = "a tensor that is not on the CPU";
      for (int64_t v : n.outputs())
        if (why.empty() && v >= 0 && g.value(v).device().device_type != kDLCPU) why = "a result not on the CPU";
      if (why.empty()) why = kiln::hpu::why_not_lowered(g, n);
      if (why.empty()) taken.push_back(static_cast<int64_t>(i));
      else host().debug("hpu_backend: node " + std::to_string(i) + " (" + n.op() + ") stays eager: " + why);
    }
    return taken;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    for (const auto& [key, value] : options.options)
      if (key != "synapse_library" && key != "buckets")
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "unknown option '" + key + "' in [plugin.hpu_backend] (it takes: synapse_library, buckets)");
    auto it = options.options.find("synapse_library");
    const std::string path = it != options.options.end() ? it->second : kRuntime;
    auto b = options.options.find("buckets");
    const std::string policy = b != options.options.end() ? b->second : "pow2";
    check_size_bucket_policy(policy, "[plugin.hpu_backend] buckets");
    const std::string dir = options.cache_dir.empty() ? host().cache_dir() : options.cache_dir;
    SynGraph sg = kiln::hpu::lower(g);  // Unimplemented: these nodes run eagerly
    if (!g.symbolic()) return compile_group(std::move(sg), path, dir);
    return std::make_unique<HpuSymbolicGroup>(
        g, policy, [this, path, dir](SynGraph s) { return compile_group(std::move(s), path, dir); },
        [this](const std::string& m) { host().debug(m); }, [this](const std::string& m) { host().warn(m); });
  }

 private:
  // A recipe for `sg` (from the caches in memory or on disk, or compiled) and its executable.
  std::unique_ptr<HpuGroup> compile_group(SynGraph sg, const std::string& path, const std::string& dir) {
    const std::string text = sg.dump();
    std::shared_ptr<SynapseLibrary> lib;
    std::shared_ptr<Device> device;
    // No library: these nodes run eagerly, as where no plugin claims them. A library without a
    // device to acquire is a device problem worth the warning the host gives an error.
    try {
      lib = SynapseLibrary::open(path);
    } catch (const SynapseError& e) {
      throw Unimplemented(std::string("hpu_backend: ") + e.what() + "; these nodes run eagerly");
    }
    try {
      device = Device::get(lib);
    } catch (const SynapseError& e) {
      throw Error(KILN_ERROR_UNAVAILABLE, std::string("hpu_backend: ") + e.what());
    }
    // A recipe is for one library and one device type.
    const uint64_t h = fnv1a(text, fnv1a(path + "\n" + std::to_string(device->type())));
    const std::string name = "kiln_hpu_" + hex(h);
    const std::string key = path + "\n" + text;
    std::shared_ptr<Recipe> recipe = cached_recipe(key);
    // The disk cache: <cache_dir>/hpu_backend/<hash>.recipe, as synRecipeSerialize wrote it, beside
    // the graph's text (a hash collision reads as a miss).
    const std::string file = dir.empty() ? "" : dir + "/hpu_backend/" + hex(h) + ".recipe";
    try {
      if (!recipe && !file.empty() && read_text(file + ".graph") == text) {
        std::string why;
        recipe = kiln::hpu::deserialize_recipe(device, file, name, &why);
        if (recipe) {
          std::vector<std::string> names;
          for (int32_t t : kiln::hpu::persistent_tensors(sg)) names.push_back(sg.tensors[static_cast<size_t>(t)].name);
          recipe->query(names);
        } else {
          host().debug("hpu_backend: compiling " + name + " again: " + why);
        }
      }
      if (!recipe) {
        recipe = kiln::hpu::compile_graph(device, sg, name);
        if (!file.empty()) {
          std::string why;
          if (!kiln::hpu::serialize_recipe(*recipe, file, &why) || !write_text(file + ".graph", text))
            host().debug("hpu_backend: recipe " + name + " not cached on disk: " + (why.empty() ? file : why));
        }
      }
      cached_recipe(key, recipe);
      return std::make_unique<HpuGroup>(recipe, std::move(sg), device);
    } catch (const SynapseError& e) {
      throw to_error(e);
    }
  }

  static std::string read_text(const std::string& file) {
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (!f) return "";
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
    return s;
  }

  // Written to a temporary name and renamed, so a reader sees the old text or the new, whole.
  static bool write_text(const std::string& file, const std::string& text) {
    const std::string dir = file.substr(0, file.rfind('/'));
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) return std::remove(tmp.c_str()), false;
    std::filesystem::rename(tmp, file, ec);
    if (ec) std::remove(tmp.c_str());
    return !ec;
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(HpuPlugin)
