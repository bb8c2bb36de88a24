// A small float32 relu/neg backend built three times, each with one deliberate defect, to prove
// that the conformance suite reports each defect for what it is and still finishes:
//   BROKEN_WRONG_RESULT  relu returns its input unchanged       -> Numeric.UnaryPointwise failed
//   BROKEN_CRASH         execute writes through a null pointer  -> crashed
//   BROKEN_HANG          execute never returns                  -> hung
// Apart from its defect it is a conforming plugin (tests/conformance/CMakeLists.txt checks that
// the cases that do not execute still pass).
#include <chrono>
#include <thread>

#include "test_plugin_support.h"

#ifndef BROKEN_NAME
#error "define BROKEN_NAME"
#endif

namespace {

using namespace test_plugin;

class Broken : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() { return cpu_descriptor(BROKEN_NAME, "a relu/neg backend with a deliberate defect"); }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    check_options(options);
    return program(g, [](const Step& s, const float* x, const float*, float* y, int64_t n) {
#if defined(BROKEN_CRASH)
      *static_cast<volatile float*>(nullptr) = 1.f;
#elif defined(BROKEN_HANG)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
#endif
      const bool relu = s.op == "aten::relu";
      for (int64_t k = 0; k < n; ++k) {
#if defined(BROKEN_WRONG_RESULT)
        y[k] = relu ? x[k] : -x[k];
#else
        y[k] = relu ? (x[k] > 0.f ? x[k] : 0.f) : -x[k];
#endif
      }
    });
  }

 protected:
  bool takes(const Graph& g, const Node& n) const override {
    if ((n.op() != "aten::relu" && n.op() != "aten::neg") || n.num_args() != 1 || n.outputs().size() != 1) return false;
    if (!n.arg(0).is_tensor()) return false;
    const Value in = g.value(n.arg(0).tensor_index()), out = g.value(n.outputs()[0]);
    return plain_float(in) && plain_float(out) && in.shape() == out.shape();
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(Broken)
