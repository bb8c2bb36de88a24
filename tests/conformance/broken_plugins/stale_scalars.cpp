// A float32 element-wise backend (add, sub with alpha; mul; mul and div by a Scalar) that declares
// KILN_CAPABILITY_RUNTIME_SCALARS and reads each run-time scalar from the execute's scalars, but
// only at an executable's first execute: it keeps that value for every later call, as a code
// generator that specializes its kernels on the first call's arguments would. Right in every case
// whose scalars never change (the numeric cases' constant alphas, a step compared over a few steps
// with a constant learning rate); wrong as soon as a learning-rate schedule or Adam's bias
// corrections move a scalar. check_verdicts.cmake asserts that the run-time scalar cases fail it,
// naming the op and the execute, while the cases without run-time scalars pass.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "test_plugin_support.h"

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace test_plugin;

enum class Op { add, sub, mul, mul_scalar, div_scalar };

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> m = {{"aten::add.Tensor", Op::add},
                                              {"aten::sub.Tensor", Op::sub},
                                              {"aten::mul.Tensor", Op::mul},
                                              {"aten::mul.Scalar", Op::mul_scalar},
                                              {"aten::div.Scalar", Op::div_scalar}};
  return m;
}

// The scalar argument of each op: alpha of add and sub, other of mul and div by a Scalar.
const char* scalar_arg(Op op) {
  switch (op) {
    case Op::add:
    case Op::sub: return "alpha";
    case Op::mul_scalar:
    case Op::div_scalar: return "other";
    default: return nullptr;
  }
}

// One node: its op, tensor inputs (b is -1 for a Scalar op), output, and its scalar: the value in
// the graph, or run-time scalar `k` (>= 0).
struct ScalarStep {
  Op op;
  int64_t a, b, out;
  double value = 1;
  int32_t k = -1;
};

class StaleProgram : public Executable {
 public:
  StaleProgram(std::vector<ScalarStep> steps, std::vector<int64_t> inputs, std::vector<int64_t> outputs,
               std::map<int64_t, int64_t> numel)
      : steps_(std::move(steps)), inputs_(std::move(inputs)), outputs_(std::move(outputs)), numel_(std::move(numel)) {}

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    execute_with_scalars(in, n_in, out, n_out, Scalars(), stream);
  }

  void execute_with_scalars(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                            void*) override {
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
    for (const ScalarStep& s : steps_) {
      if (!buf.count(s.out)) {
        scratch.emplace_back(static_cast<size_t>(numel_.at(s.out)));
        buf[s.out] = scratch.back().data();
      }
      const float c = static_cast<float>(scalar(s, scalars));
      const float* a = buf.at(s.a);
      const float* b = s.b >= 0 ? buf.at(s.b) : nullptr;
      float* y = buf.at(s.out);
      for (int64_t e = 0; e < numel_.at(s.out); ++e) {
        switch (s.op) {
          case Op::add: y[e] = a[e] + c * b[e]; break;
          case Op::sub: y[e] = a[e] - c * b[e]; break;
          case Op::mul: y[e] = a[e] * b[e]; break;
          case Op::mul_scalar: y[e] = a[e] * c; break;
          case Op::div_scalar: y[e] = a[e] / c; break;
        }
      }
    }
    for (size_t i = 0; i < n_out; ++i)
      for (size_t j = 0; j < n_in; ++j)
        if (outputs_[i] == inputs_[j])
          for (int64_t e = 0; e < numel_.at(outputs_[i]); ++e)
            Tensor(&out[i]).data<float>()[e] = Tensor(&in[j]).data<float>()[e];
  }

 private:
  // The defect: a run-time scalar's value is read at the first execute that needs it and kept.
  double scalar(const ScalarStep& s, const Scalars& scalars) {
    if (s.k < 0) return s.value;
    auto seen = first_seen_.find(s.k);
    if (seen == first_seen_.end()) seen = first_seen_.emplace(s.k, scalars.number(s.k)).first;
    return seen->second;
  }

  std::vector<ScalarStep> steps_;
  std::vector<int64_t> inputs_, outputs_;
  std::map<int64_t, int64_t> numel_;
  std::map<int32_t, double> first_seen_;
};

class StaleScalars : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() {
    Descriptor d = cpu_descriptor(PLUGIN_NAME, "float32 element-wise ops that keep the first run-time scalar values");
    d.runtime_scalars = true;
    return d;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    std::map<int64_t, int64_t> numel;
    for (int64_t v : g.inputs()) numel[v] = g.value(v).numel();
    for (int64_t v : g.outputs()) numel[v] = g.value(v).numel();
    std::vector<ScalarStep> steps;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      const Node n = g.node(static_cast<int64_t>(i));
      if (!takes(g, n)) throw Unimplemented("node " + std::to_string(i) + " (" + n.op() + ") is not mine");
      ScalarStep s{ops().at(n.op()), n.arg(0).tensor_index(), -1, n.outputs()[0]};
      if (n.arg(1).is_tensor()) s.b = n.arg(1).tensor_index();
      if (const char* name = scalar_arg(s.op)) {
        const Arg c = *n.find_arg(name);
        s.value = c.as_double();  // the capture's value; stale when c is a run-time scalar
        s.k = c.runtime_scalar();
      }
      numel[s.out] = g.value(s.out).numel();
      steps.push_back(s);
    }
    return std::make_unique<StaleProgram>(std::move(steps), g.inputs(), g.outputs(), std::move(numel));
  }

 protected:
  bool takes(const Graph& g, const Node& n) const override {
    auto it = ops().find(n.op());
    if (it == ops().end() || n.outputs().size() != 1 || n.num_args() < 2) return false;
    const Value out = g.value(n.outputs()[0]);
    if (!plain_float(out)) return false;
    const bool scalar_op = it->second == Op::mul_scalar || it->second == Op::div_scalar;
    for (size_t i = 0; i < (scalar_op ? 1u : 2u); ++i) {
      if (!n.arg(i).is_tensor()) return false;
      const Value in = g.value(n.arg(i).tensor_index());
      if (!plain_float(in) || in.shape() != out.shape()) return false;
    }
    if (const char* name = scalar_arg(it->second)) {
      auto c = n.find_arg(name);
      if (!c || (c->tag() != KILN_ARG_INT && c->tag() != KILN_ARG_DOUBLE)) return false;
    }
    return true;
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(StaleScalars)
