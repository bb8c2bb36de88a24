// A float32 element-wise backend (add, sub, mul, relu, neg on contiguous CPU tensors of one shape)
// whose add and sub kernels ignore `alpha`: a plausible bug that only some inputs expose. With
// alpha 1 it is right; aten::add.Tensor(x, y, alpha=0.5) and SGD's parameter update
// add(p, buf, alpha=-lr) come out wrong. check_verdicts.cmake asserts that the numeric case of the
// binary ops and the whole-step case fail, naming the op and the step, while the cases whose ops it
// computes right pass.
#include <map>
#include <string>

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

class WrongKernel : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() {
    return cpu_descriptor(PLUGIN_NAME, "float32 element-wise ops whose add and sub ignore alpha");
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    return program(g, [](const Step& s, const float* a, const float* b, float* y, int64_t n) {
      const Op op = ops().at(s.op);
      for (int64_t k = 0; k < n; ++k) {
        switch (op) {
          case Op::add: y[k] = a[k] + b[k]; break;  // the defect: alpha is never applied
          case Op::sub: y[k] = a[k] - b[k]; break;  // here too
          case Op::mul: y[k] = a[k] * b[k]; break;
          case Op::relu: y[k] = a[k] > 0.f ? a[k] : 0.f; break;
          case Op::neg: y[k] = -a[k]; break;
        }
      }
    });
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
};

}  // namespace

KILN_DEFINE_PLUGIN(WrongKernel)
