// A float32 element-wise backend (add, sub, mul, relu, neg on contiguous CPU tensors of one shape)
// whose add and sub kernels ignore `alpha`: a plausible bug that only some inputs expose. With
// alpha 1 it is right; aten::add.Tensor(x, y, alpha=0.5) and SGD's parameter update
// add(p, buf, alpha=-lr) come out wrong. check_verdicts.cmake asserts that the numeric case of the
// binary ops and the whole-step case fail, naming the op and the step, while the cases whose ops it
// computes right pass.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace kiln::plugin;

enum class Op { add, sub, mul, relu, neg };

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> m = {{"aten::add.Tensor", Op::add}, {"aten::sub.Tensor", Op::sub},
                                              {"aten::mul.Tensor", Op::mul}, {"aten::relu", Op::relu},
                                              {"aten::neg", Op::neg}};
  return m;
}

bool binary(Op op) { return op == Op::add || op == Op::sub || op == Op::mul; }

bool plain(const Value& v) { return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous(); }

bool takes(const Graph& g, const Node& n) {
  auto it = ops().find(n.op());
  if (it == ops().end() || n.outputs().size() != 1) return false;
  const Value out = g.value(n.outputs()[0]);
  if (!plain(out)) return false;
  for (size_t i = 0; i < (binary(it->second) ? 2u : 1u); ++i) {
    if (i >= n.num_args() || !n.arg(i).is_tensor()) return false;
    const Value in = g.value(n.arg(i).tensor_index());
    if (!plain(in) || in.shape() != out.shape()) return false;
  }
  if (it->second == Op::add || it->second == Op::sub) {
    auto alpha = n.find_arg("alpha");
    if (!alpha || alpha->is_tensor() || alpha->runtime_scalar() >= 0) return false;
  }
  return true;
}

struct Step {
  Op op;
  int64_t a, b, out;  // value indices; b is -1 for unary ops
};

class Program : public Executable {
 public:
  Program(std::vector<Step> steps, std::vector<int64_t> inputs, std::vector<int64_t> outputs,
          std::map<int64_t, int64_t> numel)
      : steps_(std::move(steps)), inputs_(std::move(inputs)), outputs_(std::move(outputs)), numel_(std::move(numel)) {}

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    if (n_in != inputs_.size() || n_out != outputs_.size())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "wrong number of inputs or outputs");
    std::map<int64_t, float*> buf;
    std::vector<std::vector<float>> scratch;
    auto bind = [&](const DLTensor* t, int64_t v) {
      Tensor x(t);
      if (!is_float32(x.dtype()) || !x.is_contiguous() || x.numel() != numel_.at(v))
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor for value " + std::to_string(v) + " has the wrong dtype or shape");
      buf[v] = x.data<float>();
    };
    for (size_t i = 0; i < n_in; ++i) bind(&in[i], inputs_[i]);
    for (size_t i = 0; i < n_out; ++i) bind(&out[i], outputs_[i]);
    for (const Step& s : steps_) {
      if (!buf.count(s.out)) {
        scratch.emplace_back(static_cast<size_t>(numel_.at(s.out)));
        buf[s.out] = scratch.back().data();
      }
      const float* a = buf.at(s.a);
      const float* b = s.b >= 0 ? buf.at(s.b) : nullptr;
      float* y = buf.at(s.out);
      for (int64_t k = 0; k < numel_.at(s.out); ++k) {
        switch (s.op) {
          case Op::add: y[k] = a[k] + b[k]; break;  // the defect: alpha is never applied
          case Op::sub: y[k] = a[k] - b[k]; break;  // here too
          case Op::mul: y[k] = a[k] * b[k]; break;
          case Op::relu: y[k] = a[k] > 0.f ? a[k] : 0.f; break;
          case Op::neg: y[k] = -a[k]; break;
        }
      }
    }
    // An output that is a group input passes through.
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
};

class WrongKernel : public Plugin {
 public:
  using Plugin::Plugin;
  static Descriptor describe() {
    Descriptor d;
    d.name = PLUGIN_NAME;
    d.version = "0.0.1";
    d.vendor = "kiln conformance tests";
    d.description = "float32 element-wise ops whose add and sub ignore alpha";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    return d;
  }
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
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    if (options.mode != KILN_MODE_DEFAULT) throw Error(KILN_ERROR_INVALID_ARGUMENT, "only the default mode");
    for (const auto& kv : options.options) throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + kv.first + "'");
    std::map<int64_t, int64_t> numel;
    for (int64_t v : g.inputs()) numel[v] = g.value(v).numel();
    for (int64_t v : g.outputs()) numel[v] = g.value(v).numel();
    std::vector<Step> steps;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      Node n = g.node(static_cast<int64_t>(i));
      if (!takes(g, n)) throw Error(KILN_ERROR_INVALID_ARGUMENT, "node " + std::to_string(i) + " (" + n.op() + ") is not mine");
      const Op op = ops().at(n.op());
      const int64_t out = n.outputs()[0];
      numel[out] = g.value(out).numel();
      steps.push_back({op, n.arg(0).tensor_index(), binary(op) ? n.arg(1).tensor_index() : -1, out});
    }
    return std::make_unique<Program>(std::move(steps), g.inputs(), g.outputs(), std::move(numel));
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(WrongKernel)
