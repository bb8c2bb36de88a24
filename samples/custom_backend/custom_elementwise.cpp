// custom_elementwise: a small third-party kiln backend. It takes float32 elementwise nodes whose
// tensors all have the same shape and are contiguous on the CPU (no broadcasting, no strides) and
// runs a compiled subgraph as plain loops over the DLTensors, one loop per node.
//
// Supported ops: aten::add.Tensor and aten::sub.Tensor (with alpha), aten::mul.Tensor,
// aten::div.Tensor, aten::relu, aten::neg, aten::sigmoid, aten::tanh.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

enum class OpCode { add, sub, mul, div, relu, neg, sigmoid, tanh };

struct OpInfo {
  OpCode code;
  size_t num_args;  // the schema's full argument count
  bool binary;
};

const std::map<std::string, OpInfo>& supported_ops() {
  static const std::map<std::string, OpInfo> ops = {
      {"aten::add.Tensor", {OpCode::add, 3, true}},   {"aten::sub.Tensor", {OpCode::sub, 3, true}},
      {"aten::mul.Tensor", {OpCode::mul, 2, true}},   {"aten::div.Tensor", {OpCode::div, 2, true}},
      {"aten::relu", {OpCode::relu, 1, false}},       {"aten::neg", {OpCode::neg, 1, false}},
      {"aten::sigmoid", {OpCode::sigmoid, 1, false}}, {"aten::tanh", {OpCode::tanh, 1, false}},
  };
  return ops;
}

bool is_plain_cpu_float(const Value& v) {
  return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous();
}

// Whether this backend takes `node`: a supported op over same-shape contiguous float32 CPU tensors.
bool takes(const Graph& g, const Node& node) {
  auto it = supported_ops().find(node.op());
  if (it == supported_ops().end() || node.num_args() != it->second.num_args) return false;
  if (node.outputs().size() != 1) return false;
  const Value out = g.value(node.outputs()[0]);
  if (!is_plain_cpu_float(out)) return false;
  const size_t tensor_args = it->second.binary ? 2 : 1;
  for (size_t i = 0; i < tensor_args; ++i) {
    Arg a = node.arg(i);
    if (!a.is_tensor()) return false;  // e.g. a Scalar `other`
    const Value in = g.value(a.tensor_index());
    if (!is_plain_cpu_float(in) || in.shape() != out.shape()) return false;
  }
  if (it->second.num_args == 3) {  // alpha must be a number
    Arg alpha = node.arg(2);
    if (alpha.tag() != KILN_ARG_INT && alpha.tag() != KILN_ARG_DOUBLE) return false;
  }
  return true;
}

// One loop of the compiled program; operands are slots (see Program).
struct Step {
  OpCode code;
  int a = -1, b = -1, out = -1;
  float alpha = 1.f;
  int32_t alpha_scalar = -1;  // >= 0: alpha is this run-time scalar, read on every call
};

// A compiled subgraph. Slots 0..n_in-1 are the inputs, then the outputs, then intermediates, which
// live in `scratch_` for the life of the executable (hence not safe for concurrent execution).
class Program : public Executable {
 public:
  Program(std::vector<Step> steps, std::vector<int64_t> slot_numel, size_t n_in, size_t n_out,
          std::vector<std::pair<int, int>> copies)
      : steps_(std::move(steps)),
        numel_(std::move(slot_numel)),
        n_in_(n_in),
        n_out_(n_out),
        copies_(std::move(copies)) {
    for (size_t s = n_in_ + n_out_; s < numel_.size(); ++s) scratch_.emplace_back(static_cast<size_t>(numel_[s]));
  }

  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               void* stream) override {
    execute_with_scalars(inputs, num_inputs, outputs, num_outputs, Scalars(), stream);
  }

  void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                            const Scalars& scalars, void*) override {
    if (num_inputs != n_in_ || num_outputs != n_out_)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "expected " + std::to_string(n_in_) + " inputs and " +
                                                   std::to_string(n_out_) + " outputs, got " +
                                                   std::to_string(num_inputs) + " and " + std::to_string(num_outputs));
    std::vector<float*> slot(numel_.size());
    for (size_t i = 0; i < n_in_; ++i) slot[i] = checked(&inputs[i], i, "input");
    for (size_t i = 0; i < n_out_; ++i) slot[n_in_ + i] = checked(&outputs[i], n_in_ + i, "output");
    for (size_t i = 0; i < scratch_.size(); ++i) slot[n_in_ + n_out_ + i] = scratch_[i].data();

    for (const Step& s : steps_) {
      const int64_t n = numel_[static_cast<size_t>(s.out)];
      const float* x = slot[static_cast<size_t>(s.a)];
      const float* y = s.b >= 0 ? slot[static_cast<size_t>(s.b)] : nullptr;
      float* o = slot[static_cast<size_t>(s.out)];
      const float alpha = s.alpha_scalar >= 0 ? static_cast<float>(scalars.number(s.alpha_scalar)) : s.alpha;
      switch (s.code) {
        case OpCode::add:
          for (int64_t k = 0; k < n; ++k) o[k] = x[k] + alpha * y[k];
          break;
        case OpCode::sub:
          for (int64_t k = 0; k < n; ++k) o[k] = x[k] - alpha * y[k];
          break;
        case OpCode::mul:
          for (int64_t k = 0; k < n; ++k) o[k] = x[k] * y[k];
          break;
        case OpCode::div:
          for (int64_t k = 0; k < n; ++k) o[k] = x[k] / y[k];
          break;
        case OpCode::relu:
          for (int64_t k = 0; k < n; ++k) o[k] = x[k] > 0.f ? x[k] : 0.f;
          break;
        case OpCode::neg:
          for (int64_t k = 0; k < n; ++k) o[k] = -x[k];
          break;
        case OpCode::sigmoid:
          for (int64_t k = 0; k < n; ++k) o[k] = 1.f / (1.f + std::exp(-x[k]));
          break;
        case OpCode::tanh:
          for (int64_t k = 0; k < n; ++k) o[k] = std::tanh(x[k]);
          break;
      }
    }
    // Outputs that are graph inputs (or another output) passed through unchanged.
    for (const auto& [from, to] : copies_) {
      const int64_t n = numel_[static_cast<size_t>(to)];
      for (int64_t k = 0; k < n; ++k) slot[static_cast<size_t>(to)][k] = slot[static_cast<size_t>(from)][k];
    }
  }

  const std::vector<std::pair<int, int>>& copies() const { return copies_; }

 private:
  float* checked(const DLTensor* t, size_t s, const char* what) const {
    Tensor v(t);
    if (!is_float32(v.dtype()) || v.device().device_type != kDLCPU || !v.is_contiguous() || v.numel() != numel_[s])
      throw Error(KILN_ERROR_INVALID_ARGUMENT, std::string(what) + " tensor " + std::to_string(s) +
                                                   " must be a contiguous float32 CPU tensor of " +
                                                   std::to_string(numel_[s]) + " elements");
    return v.data<float>();
  }

  std::vector<Step> steps_;
  std::vector<int64_t> numel_;
  size_t n_in_, n_out_;
  std::vector<std::pair<int, int>> copies_;
  std::vector<std::vector<float>> scratch_;
};

class CustomElementwise : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "custom_elementwise";
    d.version = "0.1.0";
    d.vendor = "kiln samples";
    d.description = "float32 elementwise ops as plain CPU loops (the SDK example)";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = false;
    d.runtime_scalars = true;  // alpha may change every call
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* cpu = devices.first(KILN_DEVICE_CPU);
    if (!cpu) return Availability::no("needs a CPU; the device list has none");
    return Availability::yes(std::string("runs on the CPU (") + cpu->name + ")");
  }

  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> taken;
    for (size_t i = 0; i < g.num_nodes(); ++i)
      if (takes(g, g.node(static_cast<int64_t>(i)))) taken.push_back(static_cast<int64_t>(i));
    host().debug("claimed " + std::to_string(taken.size()) + " of " + std::to_string(g.num_nodes()) + " nodes");
    return taken;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    for (const auto& [key, value] : options.options)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + key + "' in [plugin.custom_elementwise]");

    // Slots: inputs, then outputs, then one per intermediate value.
    std::map<int64_t, int> slot_of;
    std::vector<int64_t> numel;
    const auto ins = g.inputs(), outs = g.outputs();
    for (int64_t v : ins) {
      slot_of.emplace(v, static_cast<int>(numel.size()));
      numel.push_back(g.value(v).numel());
    }
    std::vector<std::pair<int, int>> copies;
    for (int64_t v : outs) {
      const int out_slot = static_cast<int>(numel.size());
      numel.push_back(g.value(v).numel());
      auto [it, fresh] = slot_of.emplace(v, out_slot);
      if (!fresh) copies.emplace_back(it->second, out_slot);  // passthrough
    }
    std::vector<Step> steps;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      Node node = g.node(static_cast<int64_t>(i));
      if (!takes(g, node))
        throw Error(KILN_ERROR_INVALID_ARGUMENT,
                    "node " + std::to_string(i) + " (" + node.op() + ") is not a same-shape float32 elementwise op");
      const OpInfo& info = supported_ops().at(node.op());
      auto slot = [&](int64_t value) {
        auto it = slot_of.find(value);
        if (it != slot_of.end()) return it->second;
        int s = static_cast<int>(numel.size());
        numel.push_back(g.value(value).numel());
        slot_of.emplace(value, s);
        return s;
      };
      Step s;
      s.code = info.code;
      s.a = slot(node.arg(0).tensor_index());
      if (info.binary) s.b = slot(node.arg(1).tensor_index());
      if (info.num_args == 3) {
        s.alpha = static_cast<float>(node.arg(2).as_double());
        s.alpha_scalar = node.arg(2).runtime_scalar();
      }
      s.out = slot(node.outputs()[0]);
      steps.push_back(s);
    }
    auto program = std::make_unique<Program>(steps, std::move(numel), ins.size(), outs.size(), std::move(copies));
    // In-place outputs (ABI 2.2): kiln offers to pass a write-back's input memory as its output too.
    // Each loop reads its operands at the element it writes, so output k may overwrite input j when
    // the loop that writes it is the last to read input j (and no pass-through copies input j).
    if (!options.inplace_inputs.empty()) {
      program->inplace_outputs.assign(outs.size(), -1);
      for (size_t k = 0; k < outs.size(); ++k) {
        const int64_t j = options.inplace_inputs[k];
        if (j < 0) continue;
        const int out = static_cast<int>(ins.size() + k), in = static_cast<int>(j);
        bool writer_seen = false, safe = true;
        for (const Step& s : steps) {
          if (writer_seen && (s.a == in || s.b == in)) safe = false;
          if (s.out == out) writer_seen = true;
        }
        for (const auto& [from, to] : program->copies()) safe = safe && from != in;
        if (writer_seen && safe) program->inplace_outputs[k] = j;
      }
    }
    return program;
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(CustomElementwise)
