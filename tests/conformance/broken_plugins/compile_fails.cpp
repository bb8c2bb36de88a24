// A backend that claims the float32 element-wise nodes of a training step and compiles none of
// them: kiln runs every group it claimed eagerly, so training computes exactly eager's numbers while
// none of the plugin's code runs. Built twice (tests/conformance/CMakeLists.txt):
//   COMPILE_DECLINES  compile throws Unimplemented (KILN_ERROR_UNIMPLEMENTED), which the ABI allows
//                     for a group; declining every group of a step fails the whole-step cases
//   (neither)         compile throws KILN_ERROR_INTERNAL, a failure of the plugin: every case that
//                     compiles a claimed group fails
// check_verdicts.cmake asserts the verdict of each case.
#include <set>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#ifndef PLUGIN_NAME
#error "define PLUGIN_NAME"
#endif

namespace {

using namespace kiln::plugin;

// Ops of the mlp step's forward, backward and SGD update, so that a step has groups to claim.
const std::set<std::string>& claimed_ops() {
  static const std::set<std::string> ops = {"aten::relu", "aten::threshold_backward", "aten::add.Tensor",
                                            "aten::mul.Tensor", "aten::mul.Scalar", "aten::neg"};
  return ops;
}

bool plain_float(const Value& v) {
  return is_float32(v.dtype()) && v.device().device_type == kDLCPU && v.is_contiguous();
}

bool takes(const Graph& g, const Node& n) {
  if (!claimed_ops().count(n.op()) || n.outputs().size() != 1) return false;
  for (size_t i = 0; i < n.num_args(); ++i)
    if (n.arg(i).is_tensor() && !plain_float(g.value(n.arg(i).tensor_index()))) return false;
  return plain_float(g.value(n.outputs()[0]));
}

class CompileFails : public Plugin {
 public:
  using Plugin::Plugin;
  static Descriptor describe() {
    Descriptor d;
    d.name = PLUGIN_NAME;
    d.version = "0.0.1";
    d.vendor = "kiln conformance tests";
    d.description = "claims float32 element-wise nodes and compiles none of them";
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
    for (const auto& kv : options.options) throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + kv.first + "'");
    const size_t n = g.num_nodes();
    const std::string what = "a group of " + std::to_string(n) + (n == 1 ? " node" : " nodes") +
                             (n ? " from " + g.node(0).op() : std::string());
#if defined(COMPILE_DECLINES)
    throw Unimplemented("declines " + what + ": no code generator yet");
#else
    throw Error(KILN_ERROR_INTERNAL, "code generator crashed on " + what);
#endif
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(CompileFails)
