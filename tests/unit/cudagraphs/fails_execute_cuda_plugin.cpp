// A correct CUDA backend for one op, aten::relu on float32 CUDA tensors, which it runs through the
// host's call_eager (ATen's kernel, on the stream the step runs on), and whose execute fails on one
// call: KILN_TEST_FAIL_EXECUTE_AT="<tag>:<n>" makes the nth execute since the variable last changed
// fail (unset or n = 0: never), as the trainer tests' CPU plugin does. The whole-step CUDA graph
// tests inject a failure while the graph warms up with it.
#include <memory>
#include <string>
#include <vector>

#include "test_plugin_support.h"

namespace {

using namespace test_plugin;

class Relu : public Executable {
 public:
  explicit Relu(const Host& host) : host_(host) {}
  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    count_execute_or_fail();
    if (n_in != 1 || n_out != 1) throw Error(KILN_ERROR_INVALID_ARGUMENT, "relu takes one tensor, gives one");
    host_.call_eager("aten::relu", {tensor_arg("self", &in[0])}, out, 1);
  }

 private:
  const Host& host_;
};

class FailsExecuteCuda : public Plugin {
 public:
  using Plugin::Plugin;
  static Descriptor describe() {
    Descriptor d;
    d.name = "fails_execute_cuda";
    d.version = "0.0.1";
    d.vendor = "kiln tests";
    d.description = "aten::relu on CUDA through call_eager; execute fails on call KILN_TEST_FAIL_EXECUTE_AT";
    d.device_kinds = KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_REDUCE_OVERHEAD);
    return d;
  }
  std::vector<int64_t> claim(const Graph& g) override {
    std::vector<int64_t> out;
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      const Node n = g.node(static_cast<int64_t>(i));
      if (n.op() != "aten::relu" || n.outputs().size() != 1) continue;
      const Value v = g.value(n.outputs()[0]);
      if (v.device().device_type == kDLCUDA && is_float32(v.dtype())) out.push_back(static_cast<int64_t>(i));
    }
    return out;
  }
  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions&) override {
    if (g.num_nodes() != 1) throw Unimplemented("one relu a group");
    return std::make_unique<Relu>(host());
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(FailsExecuteCuda)
