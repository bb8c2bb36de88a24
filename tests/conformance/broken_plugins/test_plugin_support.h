// What the conformance suite's test plugins (this folder) share, so that each of them shows only
// what makes it broken: the descriptor, availability on the CPU, claiming node by node, the checks of
// the compile options, and a program that runs a group's element-wise nodes over float32 buffers.
// LibTorch-free like any plugin. Everything here is inline and the plugins link with kiln's version
// script, so kiln_plugin_init stays the only exported symbol.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace test_plugin {

using namespace kiln::plugin;

// A CPU backend's descriptor, from the test plugins' vendor.
inline Descriptor cpu_descriptor(std::string name, std::string description) {
  Descriptor d;
  d.name = std::move(name);
  d.version = "0.0.1";
  d.vendor = "kiln conformance tests";
  d.description = std::move(description);
  d.device_kinds = KILN_DEVICE_MASK_CPU;
  return d;
}

// A contiguous float32 value on the CPU: the only kind these plugins take.
inline bool plain_float(const Value& v) {
  return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous();
}

// [plugin.<name>] options: these plugins have none.
inline void reject_unknown_options(const CompileOptions& options) {
  for (const auto& kv : options.options) throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + kv.first + "'");
}

// The default mode only, and no options.
inline void check_options(const CompileOptions& options) {
  if (options.mode != KILN_MODE_DEFAULT) throw Error(KILN_ERROR_INVALID_ARGUMENT, "only the default mode");
  reject_unknown_options(options);
}

// One node of a compiled group: its op, its tensor inputs and its output (value indices; b is -1
// for a unary op).
struct Step {
  std::string op;
  int64_t a, b, out;
};

// Computes one step over n elements (b is null for a unary op).
using Kernel = std::function<void(const Step& s, const float* a, const float* b, float* y, int64_t n)>;

// A compiled group: each execute binds the group's inputs and outputs, gives every intermediate a
// scratch buffer, runs the kernel on each step in order, and copies through an output that is a
// group input.
class Program : public Executable {
 public:
  Program(std::vector<Step> steps, std::vector<int64_t> inputs, std::vector<int64_t> outputs,
          std::map<int64_t, int64_t> numel, Kernel kernel)
      : steps_(std::move(steps)),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        numel_(std::move(numel)),
        kernel_(std::move(kernel)) {}

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    if (n_in != inputs_.size() || n_out != outputs_.size())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "wrong number of inputs or outputs");
    std::map<int64_t, float*> buf;
    std::vector<std::vector<float>> scratch;
    auto bind = [&](const DLTensor* t, int64_t v) {
      Tensor x(t);
      if (!is_float32(x.dtype()) || !x.is_contiguous() || x.numel() != numel_.at(v))
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "tensor for value " + std::to_string(v) + " has the wrong dtype or shape");
      buf[v] = x.data<float>();
    };
    for (size_t i = 0; i < n_in; ++i) bind(&in[i], inputs_[i]);
    for (size_t i = 0; i < n_out; ++i) bind(&out[i], outputs_[i]);
    for (const Step& s : steps_) {
      if (!buf.count(s.out)) {
        scratch.emplace_back(static_cast<size_t>(numel_.at(s.out)));
        buf[s.out] = scratch.back().data();
      }
      kernel_(s, buf.at(s.a), s.b >= 0 ? buf.at(s.b) : nullptr, buf.at(s.out), numel_.at(s.out));
    }
    for (size_t i = 0; i < n_out; ++i)
      for (size_t j = 0; j < n_in; ++j)
        if (outputs_[i] == inputs_[j])
          for (int64_t k = 0; k < numel_.at(outputs_[i]); ++k)
            Tensor(&out[i]).data<float>()[k] = Tensor(&in[j]).data<float>()[k];
  }

 private:
  std::vector<Step> steps_;
  std::vector<int64_t> inputs_, outputs_;
  std::map<int64_t, int64_t> numel_;
  Kernel kernel_;
};

// Fault injection for a plugin's execute: KILN_TEST_FAIL_EXECUTE_AT="<tag>:<n>" makes the nth call
// since the variable last changed throw (unset or n = 0: never); KILN_TEST_EXECUTE_COUNT_FILE, when
// set, gets the count after each call (how many calls a step makes). Call it first in execute.
inline void count_execute_or_fail() {
  static std::mutex mu;
  static std::string seen;
  static long executes = 0;
  long n = 0, at = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const char* v = std::getenv("KILN_TEST_FAIL_EXECUTE_AT");
    const std::string now = v ? v : "";
    if (now != seen) seen = now, executes = 0;
    n = ++executes;
    const size_t colon = now.rfind(':');
    at = colon == std::string::npos ? 0 : std::atol(now.c_str() + colon + 1);
    if (const char* f = std::getenv("KILN_TEST_EXECUTE_COUNT_FILE")) std::ofstream(f) << n << "\n";
  }
  if (n == at) throw Error(KILN_ERROR_INTERNAL, "injected failure in execute call " + std::to_string(n));
}

// A CPU plugin that claims each node `takes` accepts.
class CpuPlugin : public Plugin {
 public:
  using Plugin::Plugin;
  Availability available(const Devices& devices) override {
    if (!devices.first(KILN_DEVICE_CPU)) return Availability::no("needs a CPU");
    return Availability::yes("CPU");
  }
  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> out;
    for (size_t i = 0; i < g.num_nodes(); ++i)
      if (takes(g, g.node(static_cast<int64_t>(i)))) out.push_back(static_cast<int64_t>(i));
    return out;
  }

 protected:
  virtual bool takes(const Graph& g, const Node& n) const = 0;

  // A group of nodes this plugin takes, each one a step of a Program that runs `kernel`. A node's
  // tensor inputs are its first argument and, if it is a tensor, its second.
  std::unique_ptr<Executable> program(const Graph& g, Kernel kernel) const {
    std::map<int64_t, int64_t> numel;
    for (int64_t v : g.inputs()) numel[v] = g.value(v).numel();
    for (int64_t v : g.outputs()) numel[v] = g.value(v).numel();
    std::vector<Step> steps;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      Node n = g.node(static_cast<int64_t>(i));
      if (!takes(g, n))
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "node " + std::to_string(i) + " (" + n.op() + ") is not mine");
      const int64_t out = n.outputs()[0];
      numel[out] = g.value(out).numel();
      const int64_t b = n.num_args() > 1 && n.arg(1).is_tensor() ? n.arg(1).tensor_index() : -1;
      steps.push_back({n.op(), n.arg(0).tensor_index(), b, out});
    }
    return std::make_unique<Program>(std::move(steps), g.inputs(), g.outputs(), std::move(numel), std::move(kernel));
  }
};

}  // namespace test_plugin
