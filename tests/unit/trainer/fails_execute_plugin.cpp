// A correct float32 element-wise backend (relu, neg, mul, and add/sub with alpha 1, on contiguous
// CPU tensors of one shape) whose execute fails on one call: KILN_TEST_FAIL_EXECUTE_AT="<tag>:<n>"
// makes the nth execute since the variable last changed fail (unset or n = 0: never). The trainer tests inject a plugin
// failure in the middle of training with it and check that nothing is lost. KILN_TEST_EXECUTE_COUNT_FILE, when set,
// gets the count of executes since the variable last changed after each one (how many calls a step makes).
// KILN_TEST_CRASH_EXECUTE_AT=<n> makes the nth execute of the process crash with SIGSEGV, as a plugin
// with a memory bug does.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "test_plugin_support.h"

namespace {

using namespace test_plugin;

const std::map<std::string, int>& ops() {
  static const std::map<std::string, int> m = {
      {"aten::relu", 0}, {"aten::neg", 1}, {"aten::mul.Tensor", 2}, {"aten::add.Tensor", 3}, {"aten::sub.Tensor", 4}};
  return m;
}

void crash_at_call() {
  static std::atomic<long> calls{0};
  const char* at = std::getenv("KILN_TEST_CRASH_EXECUTE_AT");
  if (at && ++calls == std::atol(at)) {
    volatile uintptr_t nowhere = 8;  // hidden from the compiler, which would refuse a constant
    *reinterpret_cast<volatile int*>(nowhere) = 1;
  }
}

class FailsOnce : public Executable {
 public:
  explicit FailsOnce(std::unique_ptr<Executable> inner) : inner_(std::move(inner)) {}
  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    crash_at_call();
    count_execute_or_fail();
    inner_->execute(in, n_in, out, n_out, stream);
  }

 private:
  std::unique_ptr<Executable> inner_;
};

class FailsExecute : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() {
    return cpu_descriptor("fails_execute", "float32 element-wise ops; execute fails on call KILN_TEST_FAIL_EXECUTE_AT");
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    return std::make_unique<FailsOnce>(
        program(g, [](const Step& s, const float* a, const float* b, float* y, int64_t n) {
          const int op = ops().at(s.op);
          for (int64_t k = 0; k < n; ++k) {
            switch (op) {
              case 0: y[k] = a[k] > 0.f ? a[k] : 0.f; break;
              case 1: y[k] = -a[k]; break;
              case 2: y[k] = a[k] * b[k]; break;
              case 3: y[k] = a[k] + b[k]; break;
              case 4: y[k] = a[k] - b[k]; break;
            }
          }
        }));
  }

 protected:
  bool takes(const Graph& g, const Node& n) const override {
    auto it = ops().find(n.op());
    if (it == ops().end() || n.outputs().size() != 1) return false;
    const Value out = g.value(n.outputs()[0]);
    if (!plain_float(out)) return false;
    const bool binary = it->second >= 2;
    for (size_t i = 0; i < (binary ? 2u : 1u); ++i) {
      if (i >= n.num_args() || !n.arg(i).is_tensor()) return false;
      const Value in = g.value(n.arg(i).tensor_index());
      if (!plain_float(in) || in.shape() != out.shape()) return false;
    }
    if (it->second >= 3) {
      auto alpha = n.find_arg("alpha");
      if (!alpha || alpha->is_tensor() || alpha->runtime_scalar() >= 0 || alpha->as_double() != 1.0) return false;
    }
    return true;
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(FailsExecute)
