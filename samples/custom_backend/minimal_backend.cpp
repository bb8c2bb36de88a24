// minimal_relu: the smallest complete kiln backend, the one docs/writing-a-backend.md shows in
// full. It takes aten::relu and aten::mul.Scalar on contiguous float32 CPU tensors and runs each
// node of a compiled subgraph as one loop. mul.Scalar's factor may be a run-time scalar (AdamW's
// bias corrections are): then it is read from every execute's scalars, never baked in.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

bool plain_float(const Value& v) {
  return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous();
}

// Whether this backend runs node `i`: relu or mul.Scalar from one plain float tensor to another of
// the same shape. Graph and Node check every index and throw Error for a malformed view.
bool takes(const Graph& g, int64_t i) {
  const Node n = g.node(i);
  const bool relu = n.op() == "aten::relu", mul = n.op() == "aten::mul.Scalar";
  if (!(relu || mul) || n.inputs().size() != 1 || n.outputs().size() != 1) return false;
  // `self` is argument 0 of both; its value must be the node's one tensor input.
  const Value x = g.value(n.arg(0).tensor_index()), y = g.value(n.outputs()[0]);
  if (x.index() != n.inputs()[0])
    throw Error(KILN_ERROR_INVALID_ARGUMENT, n.op() + ": argument 'self' and the node's input disagree");
  if (!plain_float(x) || !plain_float(y) || x.shape() != y.shape()) return false;
  if (!mul) return true;
  const std::optional<Arg> other = n.find_arg("other");
  return other && (other->tag() == KILN_ARG_INT || other->tag() == KILN_ARG_DOUBLE);
}

// One node of a compiled subgraph, on slots: inputs first, then outputs, then temporaries.
struct Step {
  bool relu = true;     // otherwise mul.Scalar
  double factor = 1.0;  // mul.Scalar's `other` as captured
  int32_t scalar = -1;  // >= 0: `other` is this run-time scalar instead
  size_t in = 0, out = 0;
};

class Program : public Executable {
 public:
  Program(std::vector<Step> steps, std::vector<int64_t> numel, size_t n_in, size_t n_out)
      : steps_(std::move(steps)), numel_(std::move(numel)), n_in_(n_in), n_out_(n_out) {}

  // Called only if the host has no scalars to give; every node then has a constant factor.
  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    execute_with_scalars(in, n_in, out, n_out, Scalars(), stream);
  }

  void execute_with_scalars(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                            void*) override {
    if (n_in != n_in_ || n_out != n_out_)
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  "expected " + std::to_string(n_in_) + " inputs and " + std::to_string(n_out_) + " outputs");
    // Slot pointers: the host's tensors, then temporaries that live for this call only.
    std::vector<float*> slot(numel_.size(), nullptr);
    std::vector<std::vector<float>> temps;
    for (size_t i = 0; i < slot.size(); ++i) {
      const DLTensor* t = i < n_in ? &in[i] : i < n_in + n_out ? &out[i - n_in] : nullptr;
      if (t) {
        Tensor view(t);
        if (!is_float32(view.dtype()) || !view.is_contiguous() || view.numel() != numel_[i])
          throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor " + std::to_string(i) +
                                                       " must be a contiguous float32 "
                                                       "tensor of " +
                                                       std::to_string(numel_[i]) + " elements");
        slot[i] = view.data<float>();
      } else {
        temps.emplace_back(static_cast<size_t>(numel_[i]));
        slot[i] = temps.back().data();
      }
    }
    for (const Step& s : steps_) {
      const float* x = slot[s.in];
      float* y = slot[s.out];
      const float k = static_cast<float>(s.scalar >= 0 ? scalars.number(s.scalar) : s.factor);
      for (int64_t e = 0; e < numel_[s.out]; ++e) y[e] = s.relu ? (x[e] > 0.f ? x[e] : 0.f) : x[e] * k;
    }
  }

 private:
  std::vector<Step> steps_;
  std::vector<int64_t> numel_;
  size_t n_in_, n_out_;
};

class MinimalRelu : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "minimal_relu";
    d.version = "0.1.0";
    d.vendor = "Example Corp";
    d.description = "relu and mul.Scalar as plain loops on the CPU";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.runtime_scalars = true;  // mul.Scalar's factor may change every step
    return d;
  }

  // Score 0: used when named (backend = "minimal_relu"), never chosen over kiln's own backends.
  Availability available(const Devices& devices) override {
    if (!devices.first(KILN_DEVICE_CPU)) return Availability::no("needs a CPU; the device list has none");
    return Availability::yes("runs on the CPU", 0);
  }

  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> taken;
    for (int64_t i = 0; i < static_cast<int64_t>(g.num_nodes()); ++i)
      if (takes(g, i)) taken.push_back(i);
    return taken;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    if (options.mode != KILN_MODE_DEFAULT)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "mode " + std::to_string(options.mode) + " is not one it lists");
    if (!options.options.empty())
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  "unknown option '" + options.options.begin()->first + "' in [plugin.minimal_relu] (it takes none)");
    // compile may be handed any subgraph, also one with nodes claim would not take.
    for (int64_t i = 0; i < static_cast<int64_t>(g.num_nodes()); ++i)
      if (!takes(g, i))
        throw Unimplemented("node " + std::to_string(i) + " (" + g.node(i).op() + ") is not relu or mul.Scalar");
    // Slots: subgraph inputs, subgraph outputs, then every other value a node writes.
    std::vector<int64_t> slot_of(g.num_values(), -1), numel;
    auto add_slot = [&](int64_t v) {
      const int64_t elements = g.value(v).numel();  // throws for an index outside the graph
      if (slot_of[static_cast<size_t>(v)] < 0) {
        slot_of[static_cast<size_t>(v)] = static_cast<int64_t>(numel.size());
        numel.push_back(elements);
      }
      return static_cast<size_t>(slot_of[static_cast<size_t>(v)]);
    };
    for (int64_t v : g.inputs()) add_slot(v);
    for (int64_t v : g.outputs()) add_slot(v);
    // The host may ask for one value under two output positions, or for an input as an output;
    // this example compiles only the plain case and leaves the rest to ATen.
    if (numel.size() != g.inputs().size() + g.outputs().size())
      throw Unimplemented("an output that is also an input or another output");
    std::vector<Step> steps;
    for (int64_t i = 0; i < static_cast<int64_t>(g.num_nodes()); ++i) {
      const Node n = g.node(i);
      Step s;
      s.relu = n.op() == "aten::relu";
      if (!s.relu) {
        const Arg other = *n.find_arg("other");
        s.scalar = other.runtime_scalar();
        s.factor = other.as_double();  // the captured value; stale when s.scalar >= 0
      }
      s.in = add_slot(n.inputs()[0]);
      s.out = add_slot(n.outputs()[0]);
      steps.push_back(s);
    }
    return std::make_unique<Program>(std::move(steps), std::move(numel), g.inputs().size(), g.outputs().size());
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(MinimalRelu)
