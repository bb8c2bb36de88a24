// The neuron backend: claimed subgraphs become StableHLO (stablehlo_emit.h), compiled and run
// through a PJRT plugin (pjrt_runtime.h) - Neuron's libneuronpjrt.so on Trainium and Inferentia, the
// way JAX programs them. `[plugin.neuron] pjrt_plugin = "<path>"` points the backend at any other
// PJRT plugin (XLA's CPU plugin in the tests, JAX's CUDA plugin), which is how all of kiln's side is
// tested where there is no Neuron device. LibTorch's CPU tensors are moved by the PJRT client to its
// device and back; with a CUDA PJRT plugin, LibTorch's CUDA tensors are viewed where they are and
// results copied on the device. libnrt.so and the PJRT plugin are opened at run time, so the plugin
// loads everywhere and says why it is unavailable.
#include <dlfcn.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <kiln/plugin_api.hpp>

#include "boundary.h"
#include "cache_entry.h"
#include "padding.h"
#include "pjrt_runtime.h"
#include "stablehlo_emit.h"

namespace {

using namespace kiln::plugin;
using kiln::neuron::HostTensor;
using kiln::neuron::PaddedDim;
using kiln::neuron::PaddingPlan;
using kiln::neuron::PjrtClient;
using kiln::neuron::PjrtError;
using kiln::neuron::PjrtExecutable;
using kiln::neuron::read_cache_entry;
using kiln::neuron::write_cache_entry;

constexpr const char* kRuntime = "libnrt.so";
constexpr const char* kNeuronPjrt = "libneuronpjrt.so";  // in Neuron's libneuronxla package

// "" when the runtime opens (its versioned soname first, as installed by aws-neuronx-runtime-lib).
std::string try_open_runtime() {
  for (const char* lib : {"libnrt.so.1", kRuntime}) {
    if (void* h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL)) {
      dlclose(h);
      return "";
    }
  }
  const char* why = dlerror();
  return why ? why : "unknown dlopen error";
}

// A DLTensor's strides in elements (dense row-major where it has none).
std::vector<int64_t> strides_of(const DLTensor& t) {
  std::vector<int64_t> s(static_cast<size_t>(t.ndim));
  int64_t acc = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    s[static_cast<size_t>(d)] = t.strides ? t.strides[d] : acc;
    acc *= t.shape[d];
  }
  return s;
}

// Copies the box `extent` (in elements) from `src` to `dst`, each laid out by its own byte strides.
void copy_box(const char* src, const std::vector<int64_t>& src_strides, char* dst,
              const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& extent, size_t es) {
  const size_t rank = extent.size();
  for (int64_t e : extent)
    if (e <= 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  const int64_t elem = static_cast<int64_t>(es);
  const bool run = src_strides[rank - 1] == elem && dst_strides[rank - 1] == elem;  // the last dim at once
  const size_t outer = run ? rank - 1 : rank;
  const size_t chunk = run ? static_cast<size_t>(extent[rank - 1]) * es : es;
  int64_t count = 1;
  for (size_t d = 0; d < outer; ++d) count *= extent[d];
  std::vector<int64_t> idx(outer, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t so = 0, dof = 0;
    for (size_t d = 0; d < outer; ++d) so += idx[d] * src_strides[d], dof += idx[d] * dst_strides[d];
    std::memcpy(dst + dof, src + so, chunk);
    for (size_t d = outer; d-- > 0;) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
  }
}

// A zeroed host buffer 64-byte aligned, as LibTorch's allocations are: the PJRT plugin views it
// where it lies (XLA's CPU code assumes that alignment) rather than copying it once more.
class PaddedBuffer {
 public:
  void zero(size_t size) {
    if (size != size_) {
      bytes_.assign(size + 64, 0);
      p_ = bytes_.data() + (64 - reinterpret_cast<uintptr_t>(bytes_.data()) % 64) % 64;
      size_ = size;
    } else {
      std::memset(p_, 0, size_);
    }
  }
  char* data() { return p_; }
  size_t size() const { return size_; }

 private:
  std::vector<char> bytes_;
  char* p_ = nullptr;
  size_t size_ = static_cast<size_t>(-1);
};

// How a group padded to a bucket of sizes takes its inputs and gives its results (padding.h): each
// dim's factors, and how many size symbols follow the run-time scalars among @main's parameters.
struct PaddedBoundary {
  std::vector<std::vector<PaddedDim>> inputs, outputs;
  size_t num_symbols = 0;
};

// The strides of a group's inputs and outputs as captured (those its module was emitted for).
struct CapturedStrides {
  std::vector<std::vector<int64_t>> inputs, outputs;
  explicit CapturedStrides(const Graph& g) {
    for (int64_t v : g.inputs()) inputs.push_back(g.value(v).strides());
    for (int64_t v : g.outputs()) outputs.push_back(g.value(v).strides());
  }
};

class PjrtGroup : public Executable {
 public:
  // `layout`: the storage order @main takes each input and returns each output in (emit_stablehlo).
  PjrtGroup(std::shared_ptr<const PjrtExecutable> exe, std::vector<int32_t> runtime_scalars,
            kiln::neuron::BoundaryLayout layout, CapturedStrides captured,
            std::optional<PaddedBoundary> padded = std::nullopt)
      : exe_(std::move(exe)),
        runtime_scalars_(std::move(runtime_scalars)),
        layout_(std::move(layout)),
        captured_(std::move(captured)),
        padded_(std::move(padded)) {}

  bool padded() const { return padded_.has_value(); }

  // A group compiled at a bucket of sizes run at `sizes` (the size symbols' values, each within
  // the bucket): each input copied into a zeroed buffer of the bucket's shape, the sizes passed
  // after the run-time scalars, and each result's real part copied out of the padded one.
  void execute_padded(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                      const Scalars& scalars, const std::vector<int64_t>& sizes, void* stream) {
    const PaddedBoundary& p = *padded_;
    if (num_inputs != p.inputs.size() || num_outputs != p.outputs.size() || sizes.size() != p.num_symbols)
      throw Error(KILN_ERROR_INTERNAL, "neuron: a padded group of " + std::to_string(p.inputs.size()) + " inputs, " +
                                           std::to_string(p.outputs.size()) + " outputs and " +
                                           std::to_string(p.num_symbols) + " size symbols run with " +
                                           std::to_string(num_inputs) + ", " + std::to_string(num_outputs) + " and " +
                                           std::to_string(sizes.size()));
    // A tensor's dims in the module and, per factor, its real size at these sizes; checked against
    // the tensor's own shape.
    auto shapes = [&](const DLTensor& t, const std::vector<PaddedDim>& dims, const char* what, size_t i,
                      std::vector<int64_t>* bucket, std::vector<int64_t>* real_factors,
                      std::vector<int64_t>* factors_per_dim) {
      if (static_cast<size_t>(t.ndim) != dims.size())
        throw Error(KILN_ERROR_INTERNAL, std::string("neuron: padded ") + what + " " + std::to_string(i) + " has " +
                                             std::to_string(t.ndim) + " dims, compiled for " +
                                             std::to_string(dims.size()));
      for (size_t d = 0; d < dims.size(); ++d) {
        int64_t b = 1, r = 1;
        for (const auto& s : dims[d]) {
          b *= s.bucket;
          const int64_t rs = s.real.at(sizes);
          if (rs < 0 || rs > s.bucket)
            throw Error(KILN_ERROR_INTERNAL, std::string("neuron: ") + what + " " + std::to_string(i) + " dim " +
                                                 std::to_string(d) + ": a real size of " + std::to_string(rs) +
                                                 " in a bucket of " + std::to_string(s.bucket));
          r *= rs;
          real_factors->push_back(rs);
        }
        factors_per_dim->push_back(static_cast<int64_t>(dims[d].size()));
        if (r != t.shape[d])
          throw Error(KILN_ERROR_INTERNAL, std::string("neuron: ") + what + " " + std::to_string(i) + " dim " +
                                               std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                                               ", and the sizes " + kiln::neuron::ints_text(sizes) + " give " +
                                               std::to_string(r));
        bucket->push_back(b);
      }
    };
    auto dense_bytes = [](const std::vector<int64_t>& shape, size_t es) {
      std::vector<int64_t> st(shape.size());
      int64_t acc = static_cast<int64_t>(es);
      for (size_t d = shape.size(); d-- > 0;) st[d] = acc, acc *= shape[d];
      return st;
    };
    std::lock_guard<std::mutex> lock(pad_mu_);
    turn_ ^= 1;
    std::vector<PaddedBuffer>& bufs = pad_bufs_[turn_];
    bufs.resize(num_inputs + num_outputs);
    std::vector<HostTensor> ins, outs;
    for (size_t i = 0; i < num_inputs; ++i) {
      const DLTensor& t = inputs[i];
      const HostTensor b = kiln::neuron::boundary_tensor(t, {});
      std::vector<int64_t> bucket, real, per_dim;
      shapes(t, p.inputs[i], "input", i, &bucket, &real, &per_dim);
      const size_t es = (static_cast<size_t>(t.dtype.bits) * t.dtype.lanes + 7) / 8;
      int64_t n = 1;
      for (int64_t s : bucket) n *= s;
      bufs[i].zero(static_cast<size_t>(n) * es);
      std::vector<int64_t> src = strides_of(t);
      for (auto& s : src) s *= static_cast<int64_t>(es);
      const std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
      copy_box(static_cast<const char*>(t.data) + t.byte_offset, src, bufs[i].data(), dense_bytes(bucket, es), shape,
               es);
      ins.push_back(HostTensor{b.type, bucket, {}, bufs[i].data(), bufs[i].size()});
    }
    std::vector<float> values(runtime_scalars_.size());
    for (size_t k = 0; k < runtime_scalars_.size(); ++k) {
      values[k] = static_cast<float>(scalars.number(runtime_scalars_[k]));
      ins.push_back(HostTensor{PJRT_Buffer_Type_F32, {}, {}, &values[k], sizeof(float)});
    }
    std::vector<int64_t> size_values = sizes;
    for (auto& v : size_values) ins.push_back(HostTensor{PJRT_Buffer_Type_S64, {}, {}, &v, sizeof(int64_t)});
    struct Out {
      std::vector<int64_t> real, per_dim, bucket_factors;
      size_t es;
    };
    std::vector<Out> shapes_out(num_outputs);
    for (size_t k = 0; k < num_outputs; ++k) {
      const DLTensor& t = outputs[k];
      const HostTensor b = kiln::neuron::boundary_tensor(t, {});
      Out& o = shapes_out[k];
      std::vector<int64_t> bucket;
      shapes(t, p.outputs[k], "output", k, &bucket, &o.real, &o.per_dim);
      for (const auto& dim : p.outputs[k])
        for (const auto& s : dim) o.bucket_factors.push_back(s.bucket);
      o.es = (static_cast<size_t>(t.dtype.bits) * t.dtype.lanes + 7) / 8;
      int64_t n = 1;
      for (int64_t s : bucket) n *= s;
      bufs[num_inputs + k].zero(static_cast<size_t>(n) * o.es);
      outs.push_back(HostTensor{b.type, bucket, {}, bufs[num_inputs + k].data(), bufs[num_inputs + k].size()});
    }
    try {
      exe_->run(ins, outs, stream);
    } catch (const PjrtError& e) {
      throw Error(KILN_ERROR_INTERNAL, e.what());
    }
    // Each result's real part, factor by factor: the padded result is dense over the factors'
    // buckets; the output takes factor j of dim d at its stride times the real factors inside it.
    for (size_t k = 0; k < num_outputs; ++k) {
      const DLTensor& t = outputs[k];
      const Out& o = shapes_out[k];
      const std::vector<int64_t> src = dense_bytes(o.bucket_factors, o.es);
      std::vector<int64_t> dst;
      const std::vector<int64_t> st = strides_of(t);
      size_t j = 0;
      for (size_t d = 0; d < o.per_dim.size(); ++d) {
        const size_t first = j, count = static_cast<size_t>(o.per_dim[d]);
        for (size_t f = first; f < first + count; ++f) {
          int64_t inner = 1;
          for (size_t m = f + 1; m < first + count; ++m) inner *= o.real[m];
          dst.push_back(st[d] * inner * static_cast<int64_t>(o.es));
        }
        j += count;
      }
      copy_box(bufs[num_inputs + k].data(), src, static_cast<char*>(t.data) + t.byte_offset, dst, o.real, o.es);
    }
  }

  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               void* stream) override {
    execute_with_scalars(inputs, num_inputs, outputs, num_outputs, Scalars(), stream);
  }

  void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                            const Scalars& scalars, void* stream) override {
    if (num_inputs != layout_.inputs.size() || num_outputs != layout_.outputs.size())
      throw Error(KILN_ERROR_INTERNAL, "neuron: the group was compiled for " + std::to_string(layout_.inputs.size()) +
                                           " inputs and " + std::to_string(layout_.outputs.size()) +
                                           " outputs, and is run with " + std::to_string(num_inputs) + " and " +
                                           std::to_string(num_outputs));
    std::vector<HostTensor> ins, outs;
    // Each input as @main takes it: its dims in the storage order compiled for, over its own memory
    // where its strides are still dense in that order. A host tensor whose strides changed since
    // the capture is copied in with its byte strides; a CUDA one cannot be (PJRT views dense
    // memory only), and is an error here rather than a wrong read.
    for (size_t i = 0; i < num_inputs; ++i) {
      ins.push_back(kiln::neuron::boundary_tensor(inputs[i], layout_.inputs[i]));
      if (ins.back().on_device && !ins.back().byte_strides.empty())
        throw Error(KILN_ERROR_INTERNAL, "neuron: " + changed_layout("input", i, inputs[i], captured_.inputs[i]));
    }
    // The run-time scalars' current values: rank-0 f32 parameters after the inputs (ATen computes a
    // float32 op with a Scalar in float32 too).
    std::vector<float> values(runtime_scalars_.size());
    for (size_t k = 0; k < runtime_scalars_.size(); ++k) {
      values[k] = static_cast<float>(scalars.number(runtime_scalars_[k]));
      ins.push_back(HostTensor{PJRT_Buffer_Type_F32, {}, {}, &values[k], sizeof(float)});
    }
    // Results come back dense in the storage order compiled for: an output whose strides are not
    // dense in it (one with gaps, or overlapping) gets a dense copy, scattered after.
    std::vector<std::vector<char>> dense(num_outputs);
    std::vector<HostTensor> scattered(num_outputs);
    for (size_t k = 0; k < num_outputs; ++k) {
      HostTensor o = kiln::neuron::boundary_tensor(outputs[k], layout_.outputs[k]);
      if (!o.byte_strides.empty() && o.on_device)
        throw Error(KILN_ERROR_INTERNAL, "neuron: " + changed_layout("output", k, outputs[k], captured_.outputs[k]));
      if (!o.byte_strides.empty()) {
        scattered[k] = o;
        dense[k].resize(o.bytes);
        o.data = dense[k].data();
        o.byte_strides.clear();
      }
      outs.push_back(o);
    }
    try {
      exe_->run(ins, outs, stream);
    } catch (const PjrtError& e) {
      throw Error(KILN_ERROR_INTERNAL, e.what());
    }
    for (size_t k = 0; k < num_outputs; ++k)
      if (!dense[k].empty()) scatter(dense[k].data(), scattered[k]);
  }

 private:
  // Why a CUDA tensor cannot be handed to PJRT: its strides are not dense in the order compiled for.
  static std::string changed_layout(const char* what, size_t i, const DLTensor& t,
                                    const std::vector<int64_t>& captured) {
    using kiln::neuron::ints_text;
    return std::string("CUDA ") + what + " " + std::to_string(i) + " of shape " +
           ints_text(std::vector<int64_t>(t.shape, t.shape + t.ndim)) + " has strides " + ints_text(strides_of(t)) +
           ", and the group was compiled for the strides it was captured with, " + ints_text(captured) +
           " (PJRT takes a CUDA tensor where it is only as the dense layout its module was compiled for)";
  }

  // Dense data in `t`'s dims order, written element by element where `t`'s byte strides say.
  static void scatter(const char* src, const HostTensor& t) {
    const size_t rank = t.dims.size();
    int64_t n = 1;
    for (int64_t s : t.dims) n *= s;
    if (n == 0) return;
    const int64_t es = static_cast<int64_t>(t.bytes) / n;
    char* base = static_cast<char*>(t.data);
    std::vector<int64_t> idx(rank, 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < rank; ++d) off += idx[d] * t.byte_strides[d];
      std::memcpy(base + off, src + i * es, static_cast<size_t>(es));
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < t.dims[d]) break;
        idx[d] = 0;
      }
    }
  }
  std::shared_ptr<const PjrtExecutable> exe_;
  std::vector<int32_t> runtime_scalars_;
  kiln::neuron::BoundaryLayout layout_;
  CapturedStrides captured_;
  std::optional<PaddedBoundary> padded_;
  // The padded inputs and results, in two sets used in turn: a call's buffers stay as they are
  // through the next call. XLA's CPU executables were seen to reach a call's input buffers during
  // the next call: with the buffers freed after each call, or one set rewritten every call,
  // parameters ended 1e-4 to 2e-3 from eager's after a few steps (varying from run to run); with
  // the previous call's buffers kept, exactly as with LibTorch's own tensors.
  std::mutex pad_mu_;
  std::vector<PaddedBuffer> pad_bufs_[2];
  size_t turn_ = 0;
};

// A symbolic group (ABI 2.4's size symbols) for every size: XLA compiles static shapes, so each
// size runs a module compiled for its bucket (padding.h), padded inside the plugin; a group the
// padding plan does not cover runs a module compiled for each size it meets (the last 64 kept).
class SymbolicGroup : public Executable {
 public:
  using CompileFn = std::function<std::unique_ptr<PjrtGroup>(const Graph&, const PaddingPlan*)>;
  using LogFn = std::function<void(const std::string&)>;

  SymbolicGroup(const Graph& symbolic, std::string policy, CompileFn compile, LogFn debug, LogFn warn)
      : graph_(std::make_unique<SymbolicGraphCopy>(symbolic)),
        policy_(std::move(policy)),
        compile_(std::move(compile)),
        debug_(std::move(debug)),
        warn_(std::move(warn)) {
    serves_all_sizes = true;
    at(symbolic.symbol_hints());  // the view's own sizes now, so that a module that fails fails the compile
  }

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    execute_sized(in, n_in, out, n_out, Scalars(), sizes_of(in, n_in), stream);
  }
  void execute_with_scalars(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                            void* stream) override {
    execute_sized(in, n_in, out, n_out, scalars, sizes_of(in, n_in), stream);
  }
  void execute_sized(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                     const std::vector<int64_t>& sizes, void* stream) override {
    const std::shared_ptr<PjrtGroup> exe = at(sizes);
    if (exe->padded()) exe->execute_padded(in, n_in, out, n_out, scalars, sizes, stream);
    else exe->execute_with_scalars(in, n_in, out, n_out, scalars, stream);
  }

 private:
  Graph symbolic() const { return graph_->graph(); }

  std::vector<int64_t> sizes_of(const DLTensor* in, size_t n_in) const {
    std::vector<int64_t> v;
    for (const KilnSizeSymbol& s : graph_->symbols()) {
      if (s.input < 0 || static_cast<size_t>(s.input) >= n_in || s.dim < 0 || s.dim >= in[s.input].ndim)
        throw Error(KILN_ERROR_INTERNAL, "neuron: a size symbol on input " + std::to_string(s.input) + " dim " +
                                             std::to_string(s.dim) + " the call does not have");
      v.push_back(in[s.input].shape[s.dim]);
    }
    return v;
  }

  std::shared_ptr<PjrtGroup> at(const std::vector<int64_t>& sizes) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::vector<int64_t> bucket = kiln::neuron::bucket_sizes(policy_, sizes);
    const std::string nodes = std::to_string(symbolic().num_nodes()) + " nodes";
    if (policy_ != "exact") {
      if (auto it = padded_.find(bucket); it != padded_.end()) return it->second;
      if (!refused_.count(bucket)) {
        std::string why;
        std::optional<PaddingPlan> plan;
        std::unique_ptr<ConcreteGraph> at_bucket;
        try {
          at_bucket = std::make_unique<ConcreteGraph>(symbolic(), &bucket);
          plan = kiln::neuron::plan_padding(symbolic(), at_bucket->graph(), &why);
        } catch (const Error& e) {
          why = std::string("its sizes at the bucket: ") + e.what();
        }
        if (plan) {
          std::shared_ptr<PjrtGroup> exe = compile_(at_bucket->graph(), &*plan);
          padded_[bucket] = exe;
          debug_("neuron: a group of " + nodes + " compiled padded to the sizes " + kiln::neuron::ints_text(bucket) +
                 " (first met at " + kiln::neuron::ints_text(sizes) + ")");
          return exe;
        }
        refused_[bucket] = why;
        if (!warned_)
          warn_("neuron: a group of " + nodes + " is compiled for each size it meets, not padded to a bucket: " + why);
        warned_ = true;
      }
    }
    for (size_t i = 0; i < exact_.size(); ++i) {
      if (exact_[i].first != sizes) continue;
      std::rotate(exact_.begin(), exact_.begin() + static_cast<std::ptrdiff_t>(i),
                  exact_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return exact_.front().second;
    }
    ConcreteGraph concrete(symbolic(), &sizes);
    std::shared_ptr<PjrtGroup> exe = compile_(concrete.graph(), nullptr);
    exact_.insert(exact_.begin(), {sizes, exe});
    if (exact_.size() > 64) exact_.pop_back();
    return exe;
  }

  std::unique_ptr<SymbolicGraphCopy> graph_;
  std::string policy_;
  CompileFn compile_;
  LogFn debug_, warn_;
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::shared_ptr<PjrtGroup>> padded_;  // by bucket
  std::map<std::vector<int64_t>, std::string> refused_;                // buckets without a plan, and why
  bool warned_ = false;
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<PjrtGroup>>> exact_;  // most recent first
};

// The compile cache on disk: <cache_dir>/neuron/<hash>.pjrt holds a format tag, the module's text
// (to tell a hash collision from a hit), and the executable as the PJRT plugin serialized it with
// its size and FNV-1a hash, checked before the bytes reach the plugin's deserializer (which need not
// survive damaged input: a flipped byte may still parse). The key covers the plugin's path,
// platform and API version, and the module; a file that does not read back whole, or that the
// plugin does not deserialize (another XLA build), is compiled again and replaced.
std::string cache_file(const std::string& dir, const PjrtClient& client, const std::string& module) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](const std::string& s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  mix(client.path());
  mix(client.platform());
  mix(std::to_string(client.api_major()) + "." + std::to_string(client.api_minor()));
  mix(module);
  char name[32];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  return dir + "/neuron/" + name + ".pjrt";
}

class NeuronPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "neuron";
    d.version = "0.3.0";
    d.vendor = "kiln";
    d.description =
        "AWS Trainium/Inferentia: StableHLO through PJRT (libneuronpjrt.so, or [plugin.neuron] pjrt_plugin)";
    // CPU: with pjrt_plugin set, any PJRT plugin runs the groups of a step on LibTorch CPU tensors;
    // CUDA: a CUDA PJRT plugin (XLA's, JAX's) runs them on LibTorch's CUDA tensors where they are.
    d.device_kinds = KILN_DEVICE_MASK_NEURON | KILN_DEVICE_MASK_CPU | KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = false;
    d.runtime_scalars = true;  // the optimizers' changing values are parameters of @main
    d.symbolic_shapes = true;  // compiled per bucket of sizes, padded inside the plugin
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* dev = devices.first(KILN_DEVICE_NEURON);
    const auto configured = host().option("pjrt_plugin");
    if (!dev) {
      if (configured && !devices.first(KILN_DEVICE_CPU) && !devices.first(KILN_DEVICE_CUDA))
        return Availability::no(
            "no AWS Neuron device, and no CPU or CUDA device offered (pjrt_plugin runs groups of CPU tensors, or of "
            "CUDA tensors with a CUDA PJRT plugin)");
      if (!configured) {
        const std::string runtime_error = try_open_runtime();
        if (!runtime_error.empty())
          return Availability::no(std::string("no AWS Neuron device found, and ") + kRuntime + " cannot be loaded (" +
                                  runtime_error + ")");
        return Availability::no(std::string("no AWS Neuron device found (") + kRuntime + " loads)");
      }
      // Only when named: a CPU PJRT plugin is a test bed, not a better backend for the CPU.
      try {
        auto client = PjrtClient::open(*configured);
        return Availability::yes("PJRT plugin " + *configured + " (platform " + client->platform() + ", PJRT C API " +
                                     std::to_string(client->api_major()) + "." + std::to_string(client->api_minor()) +
                                     ") set by [plugin.neuron] pjrt_plugin",
                                 0);
      } catch (const PjrtError& e) {
        return Availability::no(e.what());
      }
    }
    const std::string runtime_error = try_open_runtime();
    if (!runtime_error.empty())
      return Availability::no(std::string("AWS Neuron device found, but ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    // The device's own compiler comes before any general one (inductor scores 200); a Gaudi's
    // (hpu_backend, 400) before it on a machine with both.
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_NEURON)) + " Neuron device(s), first " +
                                 dev->name + "; " + kRuntime + " loads; PJRT plugin " +
                                 configured.value_or(kNeuronPjrt),
                             300);
  }

  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> taken;
    // Nothing to claim for where no PJRT plugin opens (it is named by pjrt_plugin, or Neuron's).
    std::shared_ptr<PjrtClient> client;
    try {
      client = PjrtClient::open(host().option("pjrt_plugin").value_or(kNeuronPjrt));
    } catch (const PjrtError& e) {
      host().debug(std::string("neuron: claims nothing: ") + e.what());
      return taken;
    }
    // Where the tensors may be: host memory (copied in and out, or viewed), or with a CUDA PJRT
    // plugin the first GPU's memory, the client's device, viewed in place and copied out on the
    // device; those must be dense (PJRT's views and results are), row-major or in another order of
    // their dims, which the module transposes from or to at its boundary (boundary.h).
    const bool cuda_client = client->platform() == "cuda";
    auto where = [&](const Value& v) -> std::string {
      const DLDevice d = v.device();
      if (d.device_type == kDLCPU) return "";
      if (d.device_type != kDLCUDA) return "tensors on a device PJRT is not given";
      if (!cuda_client) return "CUDA tensors, and the PJRT plugin's platform is " + client->platform();
      if (d.device_id != 0)
        return "a tensor on cuda:" + std::to_string(d.device_id) + " (the client runs on the first GPU)";
      if (!kiln::neuron::storage_order(v.shape(), v.strides()))
        return "a CUDA tensor of strides " + kiln::neuron::ints_text(v.strides()) + " for shape " +
               kiln::neuron::ints_text(v.shape()) +
               ", no permutation of a dense layout (PJRT views CUDA memory only as dense tensors)";
      return "";
    };
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      const Node n = g.node(static_cast<int64_t>(i));
      std::string why;
      for (int64_t v : n.outputs())
        if (v < 0) why = "an undefined result";
      bool on_cpu = false, on_cuda = false;
      for (int64_t v : n.outputs())
        if (why.empty() && v >= 0) why = where(g.value(v));
      for (int64_t v : n.inputs())
        if (why.empty()) why = where(g.value(v));
      for (int64_t v : n.outputs())
        if (v >= 0) (g.value(v).device().device_type == kDLCUDA ? on_cuda : on_cpu) = true;
      for (int64_t v : n.inputs()) (g.value(v).device().device_type == kDLCUDA ? on_cuda : on_cpu) = true;
      if (why.empty() && on_cpu && on_cuda) why = "CPU and CUDA tensors in one node";
      if (why.empty()) why = kiln::neuron::why_not_emitted(g, n);
      if (why.empty()) taken.push_back(static_cast<int64_t>(i));
      else host().debug("neuron: node " + std::to_string(i) + " (" + n.op() + ") stays eager: " + why);
    }
    return taken;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    for (const auto& [key, value] : options.options)
      if (key != "pjrt_plugin" && key != "buckets")
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "unknown option '" + key + "' in [plugin.neuron] (it takes: pjrt_plugin, buckets)");
    auto it = options.options.find("pjrt_plugin");
    const std::string path = it != options.options.end() ? it->second : kNeuronPjrt;
    auto b = options.options.find("buckets");
    const std::string policy = b != options.options.end() ? b->second : "pow2";
    kiln::neuron::check_bucket_policy(policy);
    const std::string dir = options.cache_dir.empty() ? host().cache_dir() : options.cache_dir;
    if (!g.symbolic()) return compile_one(g, nullptr, path, dir);
    return std::make_unique<SymbolicGroup>(
        g, policy,
        [this, path, dir](const Graph& c, const PaddingPlan* plan) { return compile_one(c, plan, path, dir); },
        [this](const std::string& m) { host().debug(m); }, [this](const std::string& m) { host().warn(m); });
  }

 private:
  // One module: `g` as it is, or (with a plan) a symbolic group made concrete at a bucket of sizes,
  // padded. Loaded from the compile cache on disk where it was compiled before.
  std::unique_ptr<PjrtGroup> compile_one(const Graph& g, const PaddingPlan* plan, const std::string& path,
                                         const std::string& dir) {
    std::vector<int32_t> runtime_scalars;
    kiln::neuron::BoundaryLayout layout;
    const std::string module = kiln::neuron::emit_stablehlo(g, &runtime_scalars, &layout, plan);
    std::optional<PaddedBoundary> padded;
    if (plan) {
      padded.emplace();
      for (int64_t v : g.inputs()) padded->inputs.push_back(plan->values.at(static_cast<size_t>(v)));
      for (int64_t v : g.outputs()) padded->outputs.push_back(plan->values.at(static_cast<size_t>(v)));
      padded->num_symbols = plan->num_symbols;
    }
    std::shared_ptr<PjrtClient> client;
    try {
      client = PjrtClient::open(path);
    } catch (const PjrtError& e) {
      throw Unimplemented(std::string(e.what()) + "; these nodes run eagerly");
    }
    const bool cached = !dir.empty() && client->can_serialize();
    const std::string file = cached ? cache_file(dir, *client, module) : "";
    if (cached) {
      std::string damaged;
      if (auto bytes = read_cache_entry(file, module, &damaged)) {
        try {
          return std::make_unique<PjrtGroup>(client->load(*bytes), std::move(runtime_scalars), std::move(layout),
                                             CapturedStrides(g), std::move(padded));
        } catch (const PjrtError& e) {
          host().debug(std::string("neuron: compiling again: the cached executable ") + file +
                       " does not load: " + e.what());
        }
      } else if (!damaged.empty()) {
        host().warn("neuron: the compile cache entry " + file + " is damaged (" + damaged +
                    "); it is not loaded, and this group is compiled again and the entry replaced");
      }
    }
    std::unique_ptr<PjrtExecutable> exe;
    try {
      exe = client->compile(module);
    } catch (const PjrtError& e) {
      throw Error(KILN_ERROR_INTERNAL, std::string(e.what()) + "\nthe module:\n" + module);
    }
    if (cached) {
      try {
        if (!write_cache_entry(file, module, exe->serialize()))
          host().debug("neuron: could not write the compile cache file " + file);
      } catch (const PjrtError& e) {
        host().debug(std::string("neuron: executable not cached: ") + e.what());
      }
    }
    return std::make_unique<PjrtGroup>(std::move(exe), std::move(runtime_scalars), std::move(layout),
                                       CapturedStrides(g), std::move(padded));
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(NeuronPlugin)
