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

void shutdown(const KilnPluginApi* api) {
  KilnPluginShutdownArgs a{KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE, api->plugin_ctx};
  api->shutdown(&a);
}

KilnPluginCompileArgs compile_args(const KilnPluginApi* api, const KilnGraphView* g) {
  KilnPluginCompileArgs a{};
  a.struct_size = KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api->plugin_ctx;
  a.subgraph = g;
  a.cache_dir = "/tmp";
  return a;
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
  KilnError* e = kp::detail::init<TestPlugin>(&host, 3, 1, &api);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->struct_size, KILN_PLUGIN_API_HEADER_SIZE);
  EXPECT_EQ(api->abi_major, 2u);
  auto [code, msg] = take(api, e);
  EXPECT_EQ(code, KILN_ERROR_ABI_MISMATCH);
  EXPECT_EQ(msg, "plugin built for kiln plugin ABI 2." + std::to_string(KILN_ABI_VERSION_MINOR) + ", host speaks 3.1");
}

TEST(PluginApiHpp, InitFillsEveryFieldOfTheTableAndDescriptor) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 2, 0, &api), nullptr);
  EXPECT_EQ(api->struct_size, KILN_PLUGIN_API_STRUCT_SIZE);
  EXPECT_EQ(api->abi_major, 2u);
  EXPECT_EQ(api->abi_minor, static_cast<uint32_t>(KILN_ABI_VERSION_MINOR));
  // No device graphs unless the descriptor says so.
  EXPECT_EQ(api->graph_capture_begin, nullptr);
  EXPECT_EQ(api->graph_destroy, nullptr);
  for (const void* fn : {(const void*)api->available, (const void*)api->claim, (const void*)api->compile,
                         (const void*)api->execute, (const void*)api->executable_destroy, (const void*)api->shutdown})
    EXPECT_NE(fn, nullptr);
  EXPECT_STREQ(api->descriptor->name, "hpp_test");
  EXPECT_STREQ(api->descriptor->version, "9.8.7");
  EXPECT_EQ(api->descriptor->struct_size, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE);
  EXPECT_EQ(api->descriptor->capabilities, KILN_CAPABILITY_CONCURRENT_EXECUTE);
  EXPECT_EQ(api->descriptor->default_score, 0);
  shutdown(api);
}

TEST(PluginApiHpp, AvailabilityReasonIsTruncatedToTheHostBuffer) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 2, 0, &api), nullptr);
  KilnDeviceInfo cpu{};
  cpu.struct_size = KILN_DEVICE_INFO_STRUCT_SIZE;
  cpu.kind = KILN_DEVICE_CPU;
  const KilnDeviceInfo* devs[] = {&cpu};
  char reason[8];
  KilnPluginAvailableArgs out{};
  out.struct_size = KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE;
  out.plugin_ctx = api->plugin_ctx;
  out.devices = devs;
  out.num_devices = 1;
  out.reason = reason;
  out.reason_capacity = sizeof reason;
  ASSERT_EQ(api->available(&out), nullptr);
  EXPECT_EQ(out.available, 1);
  EXPECT_EQ(out.score, 7);
  EXPECT_STREQ(reason, "a long ");
  shutdown(api);
}

TEST(PluginApiHpp, ClaimCompileExecuteThroughTheCTable) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 2, 0, &api), nullptr);
  Node1 g;
  int64_t claimed[1] = {-1};
  KilnPluginClaimArgs c{KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE, api->plugin_ctx, &g.view, claimed, 99};
  ASSERT_EQ(api->claim(&c), nullptr);
  ASSERT_EQ(c.num_claimed, 1u);
  EXPECT_EQ(claimed[0], 0);

  g_behaviour = CompileBehaviour::ok;
  KilnOption opt{KILN_OPTION_STRUCT_SIZE, "extra_factor", "2"};
  const KilnOption* opts[] = {&opt};
  KilnPluginCompileArgs o = compile_args(api, &g.view);
  o.num_options = 1;
  o.options = opts;
  ASSERT_EQ(api->compile(&o), nullptr);
  KilnExecutable* exe = o.executable;
  ASSERT_NE(exe, nullptr);

  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  float in[5], out[5];
  for (float& v : in) v = dist(rng);
  int64_t shape[1] = {5};
  DLTensor tin{in, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  DLTensor tout{out, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  KilnExecutableExecuteArgs x{};
  x.struct_size = KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE;
  x.executable = exe;
  x.inputs = &tin;
  x.num_inputs = 1;
  x.outputs = &tout;
  x.num_outputs = 1;
  ASSERT_EQ(api->execute(&x), nullptr);
  for (int k = 0; k < 5; ++k) EXPECT_FLOAT_EQ(out[k], static_cast<float>(in[k] * 5.0));
  KilnExecutableDestroyArgs d{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, exe};
  api->executable_destroy(&d);
  shutdown(api);
}

TEST(PluginApiHpp, ExceptionsBecomeErrorsWithMatchingCodes) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<TestPlugin>(&host, 2, 0, &api), nullptr);
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
    KilnPluginCompileArgs o = compile_args(api, &g.view);
    o.executable = reinterpret_cast<KilnExecutable*>(0x1);
    auto [code, msg] = take(api, api->compile(&o));
    EXPECT_EQ(code, c.code) << c.message;
    EXPECT_EQ(msg, c.message);
    EXPECT_EQ(o.executable, nullptr);
  }
  g_behaviour = CompileBehaviour::ok;
  shutdown(api);
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
  ASSERT_EQ(kp::detail::init<GraphPlugin>(&host, 2, 0, &api), nullptr);
  EXPECT_EQ(api->descriptor->capabilities, KILN_CAPABILITY_DEVICE_GRAPHS);
  ASSERT_NE(api->graph_capture_begin, nullptr);
  ASSERT_NE(api->graph_capture_end, nullptr);
  ASSERT_NE(api->graph_launch, nullptr);
  ASSERT_NE(api->graph_destroy, nullptr);
  KilnGraphCaptureBeginArgs begin{KILN_GRAPH_CAPTURE_BEGIN_ARGS_STRUCT_SIZE, api->plugin_ctx, DLDevice{kDLCUDA, 0},
                                  nullptr};
  EXPECT_EQ(api->graph_capture_begin(&begin), nullptr);
  KilnGraphCaptureEndArgs end{
      KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE, api->plugin_ctx, DLDevice{kDLCUDA, 0}, nullptr, nullptr, nullptr, 0};
  ASSERT_EQ(api->graph_capture_end(&end), nullptr);
  ASSERT_NE(end.graph, nullptr);
  KilnGraphLaunchArgs launch{KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE, end.graph, nullptr, nullptr, 0};
  EXPECT_EQ(api->graph_launch(&launch), nullptr);
  EXPECT_EQ(FakeGraph::launched, 1);
  KilnGraphDestroyArgs destroy{KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, end.graph};
  api->graph_destroy(&destroy);
  begin.device = DLDevice{kDLCUDA, 3};
  auto [code, msg] = take(api, api->graph_capture_begin(&begin));
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(msg, "cudaErrorInvalidDevice: bad device");
  shutdown(api);
}

namespace {
// Records the copies it was given and re-points them at each launch, as a device would.
struct CopyingGraph : kp::GraphExec {
  std::vector<KilnGraphCopy> now;
  int launches = 0;
  void launch(void*) override { ++launches; }
  void launch_with_copies(void* stream, const KilnGraphCopy* copies, size_t n) override {
    now.assign(copies, copies + n);
    launch(stream);
  }
};
CopyingGraph* last_copying_graph = nullptr;
class CopyingGraphPlugin : public GraphPlugin {
 public:
  using GraphPlugin::GraphPlugin;
  static kp::Descriptor describe() {
    kp::Descriptor d = GraphPlugin::describe();
    d.name = "graph_copies_test";
    d.graph_copies = true;
    return d;
  }
  std::unique_ptr<kp::GraphExec> graph_capture_end_with_copies(DLDevice, void*,
                                                               const std::vector<KilnGraphCopy>& copies) override {
    auto g = std::make_unique<CopyingGraph>();
    g->now = copies;
    last_copying_graph = g.get();
    return g;
  }
};
}  // namespace

TEST(PluginApiHpp, GraphCopiesReachThePluginAndALaunchWithTheWrongCountIsRefused) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<CopyingGraphPlugin>(&host, 2, 3, &api), nullptr);
  EXPECT_EQ(api->descriptor->capabilities, KILN_CAPABILITY_DEVICE_GRAPHS | KILN_CAPABILITY_GRAPH_COPIES);
  char a[16], b[16], c[16], d[16];
  const KilnGraphCopy recorded[2] = {{a, b, 16}, {c, d, 8}};
  KilnGraphCaptureEndArgs end{};
  end.struct_size = KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE;
  end.plugin_ctx = api->plugin_ctx;
  end.device = DLDevice{kDLCUDA, 0};
  end.copies = recorded;
  end.num_copies = 2;
  ASSERT_EQ(api->graph_capture_end(&end), nullptr);
  ASSERT_NE(end.graph, nullptr);
  ASSERT_NE(last_copying_graph, nullptr);
  ASSERT_EQ(last_copying_graph->now.size(), 2u);
  EXPECT_EQ(last_copying_graph->now[1].dst, c);
  EXPECT_EQ(last_copying_graph->now[1].bytes, 8u);

  // This launch's addresses reach the graph, in the recorded order.
  const KilnGraphCopy next[2] = {{a, d, 16}, {b, c, 8}};
  KilnGraphLaunchArgs launch{KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE, end.graph, nullptr, next, 2};
  EXPECT_EQ(api->graph_launch(&launch), nullptr);
  EXPECT_EQ(last_copying_graph->launches, 1);
  EXPECT_EQ(last_copying_graph->now[0].src, d);
  EXPECT_EQ(last_copying_graph->now[1].dst, b);
  // Without copies (or from a 2.2 host, whose struct ends at `stream`): the last addresses again.
  launch.struct_size = KILN_STRUCT_SIZE(KilnGraphLaunchArgs, stream);
  EXPECT_EQ(api->graph_launch(&launch), nullptr);
  EXPECT_EQ(last_copying_graph->launches, 2);
  EXPECT_EQ(last_copying_graph->now[0].src, d);
  // One copy for a graph of two: refused, nothing launched.
  launch.struct_size = KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE;
  launch.num_copies = 1;
  auto [code, msg] = take(api, api->graph_launch(&launch));
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("1 copies given, the graph recorded 2"), std::string::npos) << msg;
  EXPECT_EQ(last_copying_graph->launches, 2);
  KilnGraphDestroyArgs destroy{KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, end.graph};
  api->graph_destroy(&destroy);
  last_copying_graph = nullptr;
  shutdown(api);
}

TEST(PluginApiHpp, CopiesGivenToAPluginThatDoesNotRepointThemFailTheCaptureAfterEndingIt) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<GraphPlugin>(&host, 2, 3, &api), nullptr);
  char a[4], b[4];
  const KilnGraphCopy recorded[1] = {{a, b, 4}};
  KilnGraphCaptureEndArgs end{};
  end.struct_size = KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE;
  end.plugin_ctx = api->plugin_ctx;
  end.device = DLDevice{kDLCUDA, 0};
  end.copies = recorded;
  end.num_copies = 1;
  auto [code, msg] = take(api, api->graph_capture_end(&end));
  EXPECT_EQ(code, KILN_ERROR_INTERNAL);
  EXPECT_NE(msg.find("re-points no copies"), std::string::npos) << msg;
  EXPECT_EQ(end.graph, nullptr);
  shutdown(api);
}

namespace {
// Reads run-time scalar 0 as its factor on every call.
struct ScalarScale : kp::Executable {
  void execute(const DLTensor*, size_t, DLTensor*, size_t, void*) override {
    throw kp::Error(KILN_ERROR_INTERNAL, "the layer must call execute_with_scalars");
  }
  void execute_with_scalars(const DLTensor* in, size_t, DLTensor* out, size_t, const kp::Scalars& scalars,
                            void*) override {
    kp::Tensor i(in), o(out);
    const double factor = scalars.number(0);
    for (int64_t k = 0; k < i.numel(); ++k) o.data<float>()[k] = static_cast<float>(i.data<float>()[k] * factor);
  }
};
class ScalarPlugin : public kp::Plugin {
 public:
  using Plugin::Plugin;
  static kp::Descriptor describe() {
    kp::Descriptor d;
    d.name = "scalar_test";
    d.version = "1.0.0";
    d.vendor = "tests";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.runtime_scalars = true;
    d.whole_step_graph = true;
    d.default_score = 42;
    return d;
  }
  std::vector<int64_t> claim(const kp::Graph&) override { return {0}; }
  std::unique_ptr<kp::Executable> compile(const kp::Graph&, const kp::CompileOptions&) override {
    return std::make_unique<ScalarScale>();
  }
};
}  // namespace

// execute carries the run-time scalars in its args; the layer hands them to execute_with_scalars.
TEST(PluginApiHpp, ExecuteArgsCarryRunTimeScalarsToTheExecutable) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<ScalarPlugin>(&host, 2, 0, &api), nullptr);
  EXPECT_EQ(api->descriptor->capabilities, KILN_CAPABILITY_RUNTIME_SCALARS | KILN_CAPABILITY_WHOLE_STEP_GRAPH);
  Node1 g;
  KilnPluginCompileArgs o = compile_args(api, &g.view);
  ASSERT_EQ(api->compile(&o), nullptr);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  float in[5], out[5];
  for (float& v : in) v = dist(rng);
  const double factor = dist(rng);
  int64_t shape[1] = {5};
  DLTensor tin{in, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  DLTensor tout{out, {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
  KilnArg scalar = kp::double_arg("value", factor);
  const KilnArg* scalars[] = {&scalar};
  KilnExecutableExecuteArgs x{
      KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE, o.executable, &tin, 1, &tout, 1, scalars, 1, nullptr, nullptr, 0};
  ASSERT_EQ(api->execute(&x), nullptr);
  for (int k = 0; k < 5; ++k) EXPECT_FLOAT_EQ(out[k], static_cast<float>(in[k] * factor));
  x.scalars = nullptr;
  x.num_scalars = 0;
  auto [code, msg] = take(api, api->execute(&x));
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(msg, "run-time scalar 0 not passed (0 given)");
  KilnExecutableDestroyArgs d{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, o.executable};
  api->executable_destroy(&d);
  shutdown(api);
}

// A plugin that does not override available answers with its descriptor's default score.
TEST(PluginApiHpp, DefaultAvailabilityUsesTheDescriptorsDefaultScore) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<ScalarPlugin>(&host, 2, 0, &api), nullptr);
  EXPECT_EQ(api->descriptor->default_score, 42);
  char reason[16] = "unwritten";
  KilnPluginAvailableArgs a{
      KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE, api->plugin_ctx, nullptr, 0, 0, 0, reason, sizeof reason};
  ASSERT_EQ(api->available(&a), nullptr);
  EXPECT_EQ(a.available, 1);
  EXPECT_EQ(a.score, 42);
  EXPECT_STREQ(reason, "");
  shutdown(api);
}

namespace {
// Computes `y = x * other` over the element count of the graph it was compiled for (not the
// tensor's), as generated code with its sizes baked in would; refuses tensors of another count.
struct BakedScale : kp::Executable {
  BakedScale(int64_t n, double factor) : n_(n), factor_(factor) {}
  void execute(const DLTensor* in, size_t, DLTensor* out, size_t, void*) override {
    kp::Tensor i(in), o(out);
    if (i.numel() != n_ || o.numel() != n_)
      throw kp::Error(KILN_ERROR_INVALID_ARGUMENT,
                      "compiled for " + std::to_string(n_) + " elements, given " + std::to_string(i.numel()));
    for (int64_t k = 0; k < n_; ++k) o.data<float>()[k] = static_cast<float>(i.data<float>()[k] * factor_);
  }
  int64_t n_;
  double factor_;
};
int g_sized_compiles = 0;
class SymbolicPlugin : public kp::Plugin {
 public:
  using Plugin::Plugin;
  static kp::Descriptor describe() {
    kp::Descriptor d;
    d.name = "symbolic_test";
    d.version = "1.0.0";
    d.vendor = "tests";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.symbolic_shapes = true;
    return d;
  }
  std::vector<int64_t> claim(const kp::Graph&) override { return {0}; }
  static std::unique_ptr<kp::Executable> baked(const kp::Graph& g) {
    ++g_sized_compiles;
    return std::make_unique<BakedScale>(g.value(g.outputs()[0]).numel(), g.node(0).find_arg("other")->as_double());
  }
  std::unique_ptr<kp::Executable> compile(const kp::Graph& g, const kp::CompileOptions&) override {
    if (!g.symbolic()) return baked(g);
    return std::make_unique<kp::ExecutableForEverySize>(g, baked(g), &baked);
  }
};
}  // namespace

// A symbolic view: the plugin accepts it for every size, each call's sizes reach execute_sized,
// and a size it has not met is compiled once from the view's size sites (ConcreteGraph).
TEST(PluginApiHpp, ASymbolicViewIsServedAtSizesItWasNotCompiledFor) {
  KilnHostApi host = test_host_table();
  const KilnPluginApi* api = nullptr;
  ASSERT_EQ(kp::detail::init<SymbolicPlugin>(&host, 2, KILN_ABI_VERSION_MINOR, &api), nullptr);
  EXPECT_EQ(api->descriptor->capabilities, KILN_CAPABILITY_SYMBOLIC_SHAPES);
  g_sized_compiles = 0;
  // A concrete view: an executable for its own size only.
  Node1 plain;
  KilnPluginCompileArgs c = compile_args(api, &plain.view);
  c.symbolic_accepted = 1;  // the layer writes what is true
  ASSERT_EQ(api->compile(&c), nullptr);
  EXPECT_EQ(c.symbolic_accepted, 0);
  KilnExecutableDestroyArgs d0{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, c.executable};
  api->executable_destroy(&d0);

  // The same node with its length s0 = input 0 dim 0, and both values' lengths following it.
  Node1 g;
  const KilnSizeSymbol symbols[] = {{0, 0}};
  KilnSizeSite sites[2]{};
  for (int32_t v = 0; v < 2; ++v) {
    KilnSizeSite& site = sites[v];
    site.kind = KILN_SIZE_SITE_SHAPE;
    site.at = v;
    site.arg = -1;
    site.elem = 0;
    site.num_factors = 1;
    site.factors[0] = 0;
    site.factors[1] = -1;
    site.num = 1;
    site.den = 1;
  }
  g.view.num_symbols = 1;
  g.view.symbols = symbols;
  g.view.num_size_sites = 2;
  g.view.size_sites = sites;
  KilnPluginCompileArgs o = compile_args(api, &g.view);
  ASSERT_EQ(api->compile(&o), nullptr);
  EXPECT_EQ(o.symbolic_accepted, 1);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (int64_t n : {5, 9, 2, 9, 5}) {
    std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1.f);
    for (float& v : in) v = dist(rng);
    int64_t shape[1] = {n};
    DLTensor tin{in.data(), {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
    DLTensor tout{out.data(), {kDLCPU, 0}, 1, kp::dtype_float32(), shape, nullptr, 0};
    KilnExecutableExecuteArgs x{
        KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE, o.executable, &tin, 1, &tout, 1, nullptr, 0, nullptr, &n, 1};
    ASSERT_EQ(take(api, api->execute(&x)).second, "") << "length " << n;
    for (int64_t k = 0; k < n; ++k) EXPECT_FLOAT_EQ(out[static_cast<size_t>(k)], in[static_cast<size_t>(k)] * 2.5f);
  }
  EXPECT_EQ(g_sized_compiles, 1 + 1 + 2);  // the concrete view, the symbolic one at 5, then 9 and 2 once each
  // A symbol below 2 is refused: such sizes get graphs of their own.
  int64_t one = 1;
  float in1 = 1, out1 = 0;
  DLTensor t1{&in1, {kDLCPU, 0}, 1, kp::dtype_float32(), &one, nullptr, 0};
  DLTensor o1{&out1, {kDLCPU, 0}, 1, kp::dtype_float32(), &one, nullptr, 0};
  KilnExecutableExecuteArgs x1{
      KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE, o.executable, &t1, 1, &o1, 1, nullptr, 0, nullptr, &one, 1};
  auto [code, msg] = take(api, api->execute(&x1));
  EXPECT_EQ(code, KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("symbols are >= 2"), std::string::npos) << msg;
  KilnExecutableDestroyArgs d{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, o.executable};
  api->executable_destroy(&d);
  shutdown(api);
}

// ConcreteGraph evaluates every kind of size site, and keeps implicit strides contiguous.
TEST(PluginApiHpp, AConcreteGraphOfASymbolicViewHoldsTheNumbersOfItsSizes) {
  Node1 g;  // y = x * other over [5]; `other` stands for 1/(2*s0) here, as a mean's factor would
  const KilnSizeSymbol symbols[] = {{0, 0}};
  KilnSizeSite sites[2]{};
  sites[0] = {KILN_SIZE_SITE_SHAPE, 1, -1, 0, 1, {0, -1}, 0, 1, 1, 0};
  sites[1] = {KILN_SIZE_SITE_DOUBLE, 0, 1, -1, 1, {0, -1}, 1, 2, 1, 0};
  g.view.num_symbols = 1;
  g.view.symbols = symbols;
  g.view.num_size_sites = 2;
  g.view.size_sites = sites;
  // The view's own numbers must be its sizes': x has [5] (shared shape array), so s0 = 5.
  const kp::Graph view(&g.view);
  EXPECT_TRUE(view.symbolic());
  EXPECT_EQ(view.symbol_hints(), std::vector<int64_t>{5});
  std::vector<int64_t> at{12};
  kp::ConcreteGraph c(view, &at);
  const kp::Graph cg = c.graph();
  EXPECT_FALSE(cg.symbolic());
  EXPECT_EQ(cg.value(1).shape(), std::vector<int64_t>{12});
  EXPECT_EQ(cg.value(1).strides(), std::vector<int64_t>{1});
  EXPECT_DOUBLE_EQ(cg.node(0).find_arg("other")->as_double(), 1.0 / 24);
  EXPECT_EQ(cg.node(0).op(), "aten::mul.Scalar");
  std::vector<int64_t> bad{1};
  EXPECT_THROW(kp::ConcreteGraph(view, &bad), kp::Error);
  KilnSizeSite odd = {KILN_SIZE_SITE_SHAPE, 1, -1, 0, 1, {0, -1}, 0, 1, 2, 0};  // s0 / 2
  EXPECT_EQ(kp::size_site_integer(odd, {12}), 6);
  EXPECT_THROW(kp::size_site_integer(odd, {13}), kp::Error);
}
