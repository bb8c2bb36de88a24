// A backend that claims the float32 element-wise nodes of a training step and compiles none of
// them: kiln runs every group it claimed eagerly, so training computes exactly eager's numbers while
// none of the plugin's code runs. Built twice (tests/conformance/CMakeLists.txt):
//   COMPILE_DECLINES  compile throws Unimplemented (KILN_ERROR_UNIMPLEMENTED), which the ABI allows
//                     for a group; declining every group of a step fails the whole-step cases
//   (neither)         compile throws KILN_ERROR_INTERNAL, a failure of the plugin: every case that
//                     compiles a claimed group fails
//   CONCURRENT_COMPILE (with COMPILE_DECLINES) says compile may run from several threads at once,
//                     takes 200 ms per compile and says in its message how many compiles ran at
//                     once at most (tests/unit/partition: kiln compiles a step's groups in parallel)
// check_verdicts.cmake asserts the verdict of each case.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "test_plugin_support.h"

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace test_plugin;

// Ops of the mlp step's forward, backward and SGD update, so that a step has groups to claim.
const std::set<std::string>& claimed_ops() {
  static const std::set<std::string> ops = {"aten::relu",       "aten::threshold_backward", "aten::add.Tensor",
                                            "aten::mul.Tensor", "aten::mul.Scalar",         "aten::neg"};
  return ops;
}

class CompileFails : public CpuPlugin {
 public:
  using CpuPlugin::CpuPlugin;
  static Descriptor describe() {
    Descriptor d = cpu_descriptor(PLUGIN_NAME, "claims float32 element-wise nodes and compiles none of them");
#if defined(CONCURRENT_COMPILE)
    d.concurrent_compile_safe = true;
#endif
    return d;
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    reject_unknown_options(options);
    const size_t n = g.num_nodes();
    const std::string what = "a group of " + std::to_string(n) + (n == 1 ? " node" : " nodes") +
                             (n ? " from " + g.node(0).op() : std::string());
#if defined(CONCURRENT_COMPILE)
    // How many compiles overlap: the most running at once while this one ran (reset when none runs).
    static std::atomic<int> running{0}, most{0};
    const int now = ++running;
    for (int m = most.load(); m < now && !most.compare_exchange_weak(m, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int seen = most.load();
    if (--running == 0) most = 0;
    throw Unimplemented("declines " + what + ": no code generator yet (" + std::to_string(seen) +
                        " compiling at once)");
#elif defined(COMPILE_DECLINES)
    throw Unimplemented("declines " + what + ": no code generator yet");
#else
    throw Error(KILN_ERROR_INTERNAL, "code generator crashed on " + what);
#endif
  }

 protected:
  bool takes(const Graph& g, const Node& n) const override {
    if (!claimed_ops().count(n.op()) || n.outputs().size() != 1) return false;
    for (size_t i = 0; i < n.num_args(); ++i)
      if (n.arg(i).is_tensor() && !plain_float(g.value(n.arg(i).tensor_index()))) return false;
    return plain_float(g.value(n.outputs()[0]));
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(CompileFails)
