// The C++ layer for plugin authors: exceptions become KilnErrors with the right code at the
// boundary, init checks the major version, the C table it fills is complete, and the views check
// what a plugin reads.
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "kiln/plugin_api.hpp"

namespace kp = kiln::plugin;

namespace {

// What the test plugin does when asked to compile.
enum class CompileBehaviour { ok, unimplemented, bad_alloc, std_exception, unknown_exception };
CompileBehaviour g_behaviour = CompileBehaviour::ok;

class ScaleExecutable : public kp::Executable {
 public:
  explicit ScaleExecutable(double factor) : factor_(factor) {}
  void execute(const DLTensor* in, size_t, DLTensor* out, size_t, void*) override {
    kp::Tensor i(&in[0]), o(&out[0]);
    for (int64_t k = 0; k < i.numel(); ++k) o.data<float>()[k] = static_cast<float>(i.data<float>()[k] * factor_);
  }

 private:
  double factor_;
};

class TestPlugin : public kp::Plugin {
 public:
  using Plugin::Plugin;
  static kp::Descriptor describe() {
    kp::Descriptor d;
    d.name = "hpp_test";
    d.version = "9.8.7";
    d.vendor = "tests";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = true;
    return d;
  }
  kp::Availability available(const kp::Devices& devices) override {
    if (!devices.first(KILN_DEVICE_CPU)) return kp::Availability::no("no CPU");
    return kp::Availability::yes("a long reason that will not fit in a tiny buffer", 7);
  }
  std::vector<int64_t> claim(const kp::Graph& g) override {
    std::vector<int64_t> out;
    for (size_t i = 0; i < g.num_nodes(); ++i)
      if (g.node(static_cast<int64_t>(i)).op() == "aten::mul.Scalar") out.push_back(static_cast<int64_t>(i));
    return out;
  }
  std::unique_ptr<kp::Executable> compile(const kp::Graph& g, const kp::CompileOptions& o) override {
    switch (g_behaviour) {
      case CompileBehaviour::unimplemented: throw kp::Unimplemented("not yet");
      case CompileBehaviour::bad_alloc: throw std::bad_alloc();
      case CompileBehaviour::std_exception: throw std::out_of_range("vector index 9");
      case CompileBehaviour::unknown_exception: throw 42;
      case CompileBehaviour::ok: break;
    }
    double factor = g.node(0).find_arg("other")->as_double();
    if (auto it = o.options.find("extra_factor"); it != o.options.end()) factor *= std::stod(it->second);
    return std::make_unique<ScaleExecutable>(factor);
  }
};

KilnHostApi test_host_table() {
  KilnHostApi h;
  std::memset(&h, 0, sizeof h);
  h.struct_size = KILN_HOST_API_STRUCT_SIZE;
  h.abi_major = KILN_ABI_VERSION_MAJOR;
  h.abi_minor = KILN_ABI_VERSION_MINOR;
  h.error_code = &kp::detail::error_code;
  h.error_message = &kp::detail::error_message;
  h.error_destroy = &kp::detail::error_destroy;
  return h;
}

std::pair<KilnErrorCode, std::string> take(const KilnPluginApi* api, KilnError* e) {
  if (!e) return {0, ""};
  std::pair<KilnErrorCode, std::string> r{api->error_code(e), api->error_message(e)};
  api->error_destroy(e);
  return r;
}

struct Node1 {
  // One node: out = mul.Scalar(x, other=2.5) over a [5] float tensor.
  int64_t shape[1] = {5};
  KilnValue x{}, y{};
  KilnArg self_arg{}, other_arg{};
  const KilnArg* args[2];
  int64_t in_idx[1] = {0}, out_idx[1] = {1};
  KilnNode node{};
  const KilnValue* values[2];
  const KilnNode* nodes[1];
  KilnGraphView view{};
  Node1() {
    for (KilnValue* v : {&x, &y}) {
      v->struct_size = KILN_VALUE_STRUCT_SIZE;
      v->dtype = kp::dtype_float32();
      v->ndim = 1;
      v->device = DLDevice{kDLCPU, 0};
      v->shape = shape;
    }
    self_arg = kp::make_arg(KILN_ARG_TENSOR, "self");
    self_arg.i = 0;
    other_arg = kp::double_arg("other", 2.5);
    args[0] = &self_arg;
    args[1] = &other_arg;
    node.struct_size = KILN_NODE_STRUCT_SIZE;
    node.op = "aten::mul.Scalar";
    node.name = "aten::mul";
    node.overload = "Scalar";
    node.num_args = 2;
    node.args = args;
    node.num_inputs = 1;
    node.inputs = in_idx;
    node.num_outputs = 1;
    node.outputs = out_idx;
    values[0] = &x;
    values[1] = &y;
    nodes[0] = &node;
    view.struct_size = KILN_GRAPH_VIEW_STRUCT_SIZE;
    view.num_values = 2;
    view.values = values;
    view.num_nodes = 1;
    view.nodes = nodes;
    view.num_inputs = 1;
    view.inputs = in_idx;
    view.num_outputs = 1;
    view.outputs = out_idx;
  }
};

}  // namespace

TEST(PluginApiHpp, InitRejectsHostWithAnotherMajorAndStillReturnsErrorFunctions) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  KilnError* e = kp::detail::init<TestPlugin>(&host, 2, 3, &api);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->struct_size, offsetof(KilnPluginApi, plugin_ctx));
  auto [code, msg] = take(api, e);
  EXPECT_EQ(code, KILN_ERROR_ABI_MISMATCH);
  EXPECT_EQ(msg, "plugin built for kiln plugin ABI 1.2, host speaks 2.3");
}

TEST(PluginApiHpp, InitFillsEveryFieldOfTheTableAndDescriptor) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 1, 0, &api), nullptr);
  EXPECT_EQ(api->struct_size, KILN_PLUGIN_API_STRUCT_SIZE);
  EXPECT_EQ(api->abi_major, 1u);
  EXPECT_EQ(api->abi_minor, 2u);
  // ABI 1.2: no device graphs unless the descriptor says so.
  EXPECT_EQ(api->graph_capture_begin, nullptr);
  EXPECT_EQ(api->graph_destroy, nullptr);
  for (const void* fn : {(const void*)api->available, (const void*)api->claim, (const void*)api->compile,
                         (const void*)api->execute, (const void*)api->executable_destroy, (const void*)api->shutdown})
    EXPECT_NE(fn, nullptr);
  EXPECT_STREQ(api->descriptor->name, "hpp_test");
  EXPECT_STREQ(api->descriptor->version, "9.8.7");
  EXPECT_EQ(api->descriptor->struct_size, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE);
  EXPECT_EQ(api->descriptor->concurrent_execution_safe, 1u);
  api->shutdown(api->plugin_ctx);
}

TEST(PluginApiHpp, AvailabilityReasonIsTruncatedToTheHostBuffer) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 1, 0, &api), nullptr);
  KilnDeviceInfo cpu{};
  cpu.struct_size = KILN_DEVICE_INFO_STRUCT_SIZE;
  cpu.kind = KILN_DEVICE_CPU;
  const KilnDeviceInfo* devs[] = {&cpu};
  char reason[8];
  KilnAvailability out{};
  out.struct_size = KILN_AVAILABILITY_STRUCT_SIZE;
  out.reason = reason;
  out.reason_capacity = sizeof reason;
  ASSERT_EQ(api->available(api->plugin_ctx, devs, 1, &out), nullptr);
  EXPECT_EQ(out.available, 1);
  EXPECT_EQ(out.score, 7);
  EXPECT_STREQ(reason, "a long ");
  api->shutdown(api->plugin_ctx);
}

TEST(PluginApiHpp, ClaimCompileExecuteThroughTheCTable) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 1, 0, &api), nullptr);
  Node1 g;
  int64_t claimed[1] = {-1};
  size_t n = 99;
  ASSERT_EQ(api->claim(api->plugin_ctx, &g.view, claimed, &n), nullptr);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(claimed[0], 0);

  g_behaviour = CompileBehaviour::ok;
  KilnOption opt{KILN_OPTION_STRUCT_SIZE, "extra_factor", "2"};
  const KilnOption* opts[] = {&opt};
  KilnCompileOptions o{};
  o.struct_size = KILN_COMPILE_OPTIONS_STRUCT_SIZE;
  o.num_options = 1;
  o.options = opts;
  o.cache_dir = "/tmp";
  KilnExecutable* exe = nullptr;
  ASSERT_EQ(api->compile(api->plugin_ctx, &g.view, &o, &exe), nullptr);
  ASSERT_NE(exe, nullptr);

  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  float in[5], out[5];
  for (float& v : in) v = dist(rng);
  int64_t shape[1] = {5};
  DLTensor tin{in, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  DLTensor tout{out, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  ASSERT_EQ(api->execute(exe, &tin, 1, &tout, 1, nullptr), nullptr);
  for (int k = 0; k < 5; ++k) EXPECT_FLOAT_EQ(out[k], static_cast<float>(in[k] * 5.0));
  api->executable_destroy(exe);
  api->shutdown(api->plugin_ctx);
}

TEST(PluginApiHpp, ExceptionsBecomeErrorsWithMatchingCodes) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 1, 0, &api), nullptr);
  Node1 g;
  struct Case {
    CompileBehaviour b;
    KilnErrorCode code;
    const char* message;
  } cases[] = {
      {CompileBehaviour::unimplemented, KILN_ERROR_UNIMPLEMENTED, "not yet"},
      {CompileBehaviour::bad_alloc, KILN_ERROR_OUT_OF_MEMORY, "out of memory"},
      {CompileBehaviour::std_exception, KILN_ERROR_INTERNAL, "vector index 9"},
      {CompileBehaviour::unknown_exception, KILN_ERROR_INTERNAL, "unknown exception"},
  };
  for (const auto& c : cases) {
    g_behaviour = c.b;
    KilnExecutable* exe = reinterpret_cast<KilnExecutable*>(0x1);
    auto [code, msg] = take(api, api->compile(api->plugin_ctx, &g.view, nullptr, &exe));
    EXPECT_EQ(code, c.code) << c.message;
    EXPECT_EQ(msg, c.message);
    EXPECT_EQ(exe, nullptr);
  }
  g_behaviour = CompileBehaviour::ok;
  api->shutdown(api->plugin_ctx);
}

TEST(PluginApiHpp, ViewsRejectOutOfRangeIndicesAndWrongTags) {
  Node1 g;
  kp::Graph graph(&g.view);
  try {
    graph.value(2);
    FAIL();
  } catch (const kp::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "value index 2 out of range (graph has 2 values)");
  }
  try {
    graph.node(0).arg(0).as_int();
    FAIL();
  } catch (const kp::Error& e) {
    EXPECT_STREQ(e.what(), "argument 'self' is not an int (tag 1)");
  }
  EXPECT_EQ(graph.node(0).arg(0).tensor_index(), 0);
  EXPECT_DOUBLE_EQ(graph.node(0).find_arg("other")->as_double(), 2.5);
  EXPECT_FALSE(graph.node(0).find_arg("alpha").has_value());
  EXPECT_EQ(graph.value(1).shape(), (std::vector<int64_t>{5}));
  EXPECT_EQ(kp::dtype_name(graph.value(1).dtype()), "float32");
}

TEST(PluginApiHpp, TensorViewComputesStridesAndContiguity) {
  float data[12];
  int64_t shape[2] = {3, 4};
  int64_t transposed[2] = {1, 3};
  DLTensor t{data, {kDLCPU, 0}, 2, kp::dtype_float32(), shape, nullptr, 8};
  kp::Tensor v(&t);
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 12);
  EXPECT_EQ(v.data<float>(), data + 2);  // byte_offset 8 = two floats
  t.strides = transposed;
  EXPECT_FALSE(v.is_contiguous());
}

namespace {
struct FakeGraph : kp::GraphExec {
  static inline int launched = 0;
  void launch(void*) override { ++launched; }
};
class GraphPlugin : public kp::Plugin {
 public:
  using Plugin::Plugin;
  static kp::Descriptor describe() {
    kp::Descriptor d;
    d.name = "graph_test";
    d.version = "1.0.0";
    d.vendor = "tests";
    d.device_kinds = KILN_DEVICE_MASK_CUDA;
    d.device_graphs = true;
    return d;
  }
  std::vector<int64_t> claim(const kp::Graph&) override { return {}; }
  std::unique_ptr<kp::Executable> compile(const kp::Graph&, const kp::CompileOptions&) override {
    throw kp::Unimplemented("no");
  }
  void graph_capture_begin(DLDevice d, void*) override {
    if (d.device_id != 0) throw kp::Error(KILN_ERROR_INVALID_ARGUMENT, "cudaErrorInvalidDevice: bad device");
  }
  std::unique_ptr<kp::GraphExec> graph_capture_end(DLDevice, void*) override { return std::make_unique<FakeGraph>(); }
};
}  // namespace

TEST(PluginApiHpp, DeviceGraphFunctionsAreFilledAndTurnExceptionsIntoErrors) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<GraphPlugin>(&host, 1, 2, &api), nullptr);
  ASSERT_TRUE(KILN_HAS_FIELD(api, KilnPluginApi, graph_destroy));
  ASSERT_NE(api->graph_capture_begin, nullptr);
  ASSERT_NE(api->graph_capture_end, nullptr);
  ASSERT_NE(api->graph_launch, nullptr);
  ASSERT_NE(api->graph_destroy, nullptr);
  EXPECT_EQ(api->graph_capture_begin(api->plugin_ctx, DLDevice{kDLCUDA, 0}, nullptr), nullptr);
  KilnGraphExec* g = nullptr;
  ASSERT_EQ(api->graph_capture_end(api->plugin_ctx, DLDevice{kDLCUDA, 0}, nullptr, &g), nullptr);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(api->graph_launch(g, nullptr), nullptr);
  EXPECT_EQ(FakeGraph::launched, 1);
  api->graph_destroy(g);
  auto [code, msg] = take(api, api->graph_capture_begin(api->plugin_ctx, DLDevice{kDLCUDA, 3}, nullptr));
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(msg, "cudaErrorInvalidDevice: bad device");
  api->shutdown(api->plugin_ctx);
}
