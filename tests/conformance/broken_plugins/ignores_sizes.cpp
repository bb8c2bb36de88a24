// A float32 element-wise backend (add, sub, mul, relu, neg on contiguous CPU tensors of one shape)
// that ignores the sizes of the graphs it is given after the first: it keeps one compiled program
// per sequence of ops and hands that program back for a graph of the same ops at other sizes, as a
// code generator whose cache key forgot the shapes would. Each program runs over the element count
// it was first compiled for (never past the buffers it is given). Right while every step has one
// shape; wrong as soon as a dynamic step hands it a larger batch, the numeric cases compile one
// op at several sizes, or the symbolic-shape case runs its executable for every size (which it
// accepts, ABI 2.4) at a size it was not compiled for. check_verdicts.cmake asserts that those cases fail it, naming
// the step and the size or the op and its shape, while a whole step of one shape passes.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "test_plugin_support.h"

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace test_plugin;

enum class Op { add, sub, mul, relu, neg };

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> m = {{"aten::add.Tensor", Op::add},
                                              {"aten::sub.Tensor", Op::sub},
                                              {"aten::mul.Tensor", Op::mul},
                                              {"aten::relu", Op::relu},
                                              {"aten::neg", Op::neg}};
  return m;
}

bool binary(Op op) { return op == Op::add || op == Op::sub || op == Op::mul; }

struct OneStep {
  Op op;
  int64_t a, b, out;
  double alpha = 1;
};

// The program of the first graph with these ops: its element counts are that graph's.
struct Compiled {
  std::vector<OneStep> steps;
  std::vector<int64_t> inputs, outputs;
  std::map<int64_t, int64_t> numel;
};

class SizeBlindProgram : public Executable {
 public:
  explicit SizeBlindProgram(std::shared_ptr<const Compiled> c) : c_(std::move(c)) {}

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    if (n_in != c_->inputs.size() || n_out != c_->outputs.size())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "wrong number of inputs or outputs");
    std::map<int64_t, float*> buf;
    std::map<int64_t, int64_t> have;  // elements each bound buffer really holds
    std::vector<std::vector<float>> scratch;
    auto bind = [&](const DLTensor* t, int64_t v) {
      Tensor x(t);
      if (!is_float32(x.dtype()) || !x.is_contiguous())
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "tensor for value " + std::to_string(v) + " has the wrong dtype");
      buf[v] = x.data<float>();
      have[v] = x.numel();
    };
    for (size_t i = 0; i < n_in; ++i) bind(&in[i], c_->inputs[i]);
    for (size_t i = 0; i < n_out; ++i) bind(&out[i], c_->outputs[i]);
    auto count = [&](int64_t v) {  // the defect: the first graph's count, bounded by the buffer
      const int64_t n = c_->numel.at(v);
      auto h = have.find(v);
      return h == have.end() ? n : std::min(n, h->second);
    };
    for (const OneStep& s : c_->steps) {
      if (!buf.count(s.out)) {
        scratch.emplace_back(static_cast<size_t>(c_->numel.at(s.out)));
        buf[s.out] = scratch.back().data();
      }
      int64_t n = count(s.out);
      n = std::min(n, count(s.a));
      if (s.b >= 0) n = std::min(n, count(s.b));
      const float* a = buf.at(s.a);
      const float* b = s.b >= 0 ? buf.at(s.b) : nullptr;
      float* y = buf.at(s.out);
      const float alpha = static_cast<float>(s.alpha);
      for (int64_t k = 0; k < n; ++k) {
        switch (s.op) {
          case Op::add: y[k] = a[k] + alpha * b[k]; break;
          case Op::sub: y[k] = a[k] - alpha * b[k]; break;
          case Op::mul: y[k] = a[k] * b[k]; break;
          case Op::relu: y[k] = a[k] > 0.f ? a[k] : 0.f; break;
          case Op::neg: y[k] = -a[k]; break;
        }
      }
    }
  }

 private:
  std::shared_ptr<const Compiled> c_;
};

class IgnoresSizes : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() {
    Descriptor d =
        cpu_descriptor(PLUGIN_NAME, "float32 element-wise ops, compiled once per sequence of ops whatever the sizes");
    d.symbolic_shapes = true;  // and it says every executable serves every size
    return d;
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    auto c = std::make_shared<Compiled>();
    std::string key;  // the ops and how they connect; no sizes
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      Node n = g.node(static_cast<int64_t>(i));
      if (!takes(g, n))
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "node " + std::to_string(i) + " (" + n.op() + ") is not mine");
      OneStep s{ops().at(n.op()), n.arg(0).tensor_index(),
                n.num_args() > 1 && n.arg(1).is_tensor() ? n.arg(1).tensor_index() : -1, n.outputs()[0]};
      if (auto alpha = n.find_arg("alpha")) s.alpha = alpha->as_double();
      c->steps.push_back(s);
      key += n.op() + "(" + std::to_string(s.a) + "," + std::to_string(s.b) + ")->" + std::to_string(s.out) + ";";
      for (int64_t v : {s.a, s.b, s.out})
        if (v >= 0) c->numel[v] = g.value(v).numel();
    }
    c->inputs = g.inputs();
    c->outputs = g.outputs();
    for (int64_t v : g.inputs()) c->numel[v] = g.value(v).numel();
    for (int64_t v : g.outputs()) c->numel[v] = g.value(v).numel();
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = cache_.emplace(key, c);
    auto exe = std::make_unique<SizeBlindProgram>(it->second);
    exe->serves_all_sizes = g.symbolic();  // the defect again: it reads no symbol values
    return exe;
  }

 protected:
  bool takes(const Graph& g, const Node& n) const override {
    auto it = ops().find(n.op());
    if (it == ops().end() || n.outputs().size() != 1) return false;
    const Value out = g.value(n.outputs()[0]);
    if (!plain_float(out)) return false;
    for (size_t i = 0; i < (binary(it->second) ? 2u : 1u); ++i) {
      if (i >= n.num_args() || !n.arg(i).is_tensor()) return false;
      const Value in = g.value(n.arg(i).tensor_index());
      if (!plain_float(in) || in.shape() != out.shape()) return false;
    }
    if (it->second == Op::add || it->second == Op::sub) {
      auto alpha = n.find_arg("alpha");
      if (!alpha || alpha->is_tensor() || alpha->runtime_scalar() >= 0) return false;
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Compiled>> cache_;
};

}  // namespace

KILN_DEFINE_PLUGIN(IgnoresSizes)
