// The SDK example (samples/custom_backend), built out of tree against the installed SDK by the
// Sdk.InstalledSdkBuildsCustomBackendOutOfTree fixture, loaded from its build folder and driven
// through the ABI on hand-built graph views; outputs are checked against plain C++ on fresh random
// inputs.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "graph_builder.h"
#include "kiln/internal/plugin_registry.h"

using kiln::test::GraphBuilder;

namespace {

const std::string kDir = KILN_CUSTOM_BACKEND_DIR;

std::shared_ptr<const kiln::LoadedPlugin> load_sample(kiln::PluginRegistry& keep) {
  kiln::PluginSearchOptions o;
  o.dirs = {kDir};
  o.use_builtin = false;
  keep = kiln::PluginRegistry::load(o, kiln::HostServices::basic("/tmp/kiln-custom-backend-cache", {}));
  return keep.find("custom_elementwise");
}

DLTensor dl(std::vector<float>& data, std::vector<int64_t>& shape) {
  return DLTensor{
      data.data(), {kDLCPU, 0}, static_cast<int32_t>(shape.size()), {kDLFloat, 32, 1}, shape.data(), nullptr, 0};
}

double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace

TEST(CustomBackend, LoadsFromItsBuildFolderWithItsDescriptor) {
  kiln::PluginRegistry reg;
  auto p = load_sample(reg);
  ASSERT_TRUE(p) << "not loaded from " << kDir;
  EXPECT_TRUE(reg.failures().empty());
  EXPECT_EQ(p->version(), "0.1.0");
  EXPECT_EQ(p->vendor(), "kiln samples");
  EXPECT_EQ(p->abi_version(), "2." + std::to_string(KILN_ABI_VERSION_MINOR));
  EXPECT_EQ(kiln::device_kinds_string(p->device_kinds()), "cpu");
  auto a = p->available(kiln::basic_cpu_devices());
  EXPECT_TRUE(a.available) << a.reason;
  EXPECT_EQ(p->available(std::vector<kiln::PluginDevice>{}).reason, "needs a CPU; the device list has none");
}

TEST(CustomBackend, ClaimsOnlySameShapeContiguousFloat32ElementwiseNodes) {
  kiln::PluginRegistry reg;
  auto p = load_sample(reg);
  ASSERT_TRUE(p);
  GraphBuilder g;
  int64_t a = g.value({4, 3}), b = g.value({4, 3}), row = g.value({3});
  int64_t d64a = g.value({4, 3}, GraphBuilder::f64()), d64b = g.value({4, 3}, GraphBuilder::f64());
  int64_t o0 = g.value({4, 3}), o1 = g.value({4, 3}), o2 = g.value({4, 3}, GraphBuilder::f64()), o3 = g.value({4, 3}),
          o4 = g.value({4, 3}), o5 = g.value({4, 4});
  g.node("aten::add.Tensor",
         {GraphBuilder::tensor("self", a), GraphBuilder::tensor("other", b), GraphBuilder::integer("alpha", 1)},
         {o0});  // 0: yes
  g.node("aten::add.Tensor",
         {GraphBuilder::tensor("self", a), GraphBuilder::tensor("other", row), GraphBuilder::integer("alpha", 1)},
         {o1});  // 1: broadcast
  g.node("aten::mul.Tensor", {GraphBuilder::tensor("self", d64a), GraphBuilder::tensor("other", d64b)},
         {o2});                                                    // 2: f64
  g.node("aten::relu", {GraphBuilder::tensor("self", o0)}, {o3});  // 3: yes
  g.node("aten::mul.Scalar", {GraphBuilder::tensor("self", a), GraphBuilder::number("other", 2.0)},
         {o4});                                                                                  // 4: other op
  g.node("aten::mm", {GraphBuilder::tensor("self", a), GraphBuilder::tensor("mat2", b)}, {o5});  // 5: not elementwise
  g.node("aten::sigmoid", {GraphBuilder::tensor("self", o3)}, {o4});                             // 6: yes
  EXPECT_EQ(p->claim(*g.view()), (std::vector<int64_t>{0, 3, 6}));
}

TEST(CustomBackend, ComputesAChainOfElementwiseOpsLikePlainCpp) {
  kiln::PluginRegistry reg;
  auto p = load_sample(reg);
  ASSERT_TRUE(p);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> dim(1, 37);
  std::uniform_real_distribution<float> val(-3.f, 3.f), pos(0.5f, 3.f), alpha(-2.f, 2.f);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int64_t> shape = {dim(rng), dim(rng)};
    const size_t n = static_cast<size_t>(shape[0] * shape[1]);
    const double al1 = alpha(rng), al2 = alpha(rng);

    GraphBuilder g;
    int64_t a = g.value(shape), b = g.value(shape), c = g.value(shape), d = g.value(shape);
    int64_t t1 = g.value(shape), t2 = g.value(shape), t3 = g.value(shape), t4 = g.value(shape), t5 = g.value(shape),
            t6 = g.value(shape), t7 = g.value(shape), t8 = g.value(shape);
    g.node("aten::add.Tensor",
           {GraphBuilder::tensor("self", a), GraphBuilder::tensor("other", b), GraphBuilder::number("alpha", al1)},
           {t1});
    g.node("aten::mul.Tensor", {GraphBuilder::tensor("self", t1), GraphBuilder::tensor("other", c)}, {t2});
    g.node("aten::relu", {GraphBuilder::tensor("self", t2)}, {t3});
    g.node("aten::sub.Tensor",
           {GraphBuilder::tensor("self", t3), GraphBuilder::tensor("other", a), GraphBuilder::number("alpha", al2)},
           {t4});
    g.node("aten::neg", {GraphBuilder::tensor("self", t4)}, {t5});
    g.node("aten::div.Tensor", {GraphBuilder::tensor("self", t5), GraphBuilder::tensor("other", d)}, {t6});
    g.node("aten::sigmoid", {GraphBuilder::tensor("self", t6)}, {t7});
    g.node("aten::tanh", {GraphBuilder::tensor("self", t1)}, {t8});
    g.inputs({a, b, c, d});
    g.outputs({t7, t8, t3, b});  // b: a graph input passed straight through
    ASSERT_EQ(p->claim(*g.view()).size(), 8u);
    auto exe = p->compile(*g.view(), KILN_MODE_DEFAULT);

    std::vector<float> va(n), vb(n), vc(n), vd(n);
    for (size_t i = 0; i < n; ++i) {
      va[i] = val(rng);
      vb[i] = val(rng);
      vc[i] = val(rng);
      vd[i] = pos(rng) * (i % 2 ? -1.f : 1.f);
    }
    std::vector<float> o7(n, NAN), o8(n, NAN), o3(n, NAN), ob(n, NAN);
    DLTensor ins[] = {dl(va, shape), dl(vb, shape), dl(vc, shape), dl(vd, shape)};
    DLTensor outs[] = {dl(o7, shape), dl(o8, shape), dl(o3, shape), dl(ob, shape)};
    exe->execute(ins, 4, outs, 4);

    std::vector<float> r7(n), r8(n), r3(n);
    for (size_t i = 0; i < n; ++i) {
      float x1 = va[i] + float(al1) * vb[i];
      float x3 = std::max(x1 * vc[i], 0.f);
      float x6 = -(x3 - float(al2) * va[i]) / vd[i];
      r7[i] = 1.f / (1.f + std::exp(-x6));
      r8[i] = std::tanh(x1);
      r3[i] = x3;
    }
    EXPECT_LT(relative_error(o7, r7), 1e-5) << "sigmoid output, shape " << shape[0] << "x" << shape[1];
    EXPECT_LT(relative_error(o8, r8), 1e-5) << "tanh output";
    EXPECT_LT(relative_error(o3, r3), 1e-5) << "relu output";
    EXPECT_EQ(ob, vb) << "passthrough output";
  }
}

TEST(CustomBackend, RejectsUnknownOptionsAndMismatchedTensors) {
  kiln::PluginRegistry reg;
  auto p = load_sample(reg);
  ASSERT_TRUE(p);
  GraphBuilder g;
  int64_t a = g.value({8}), o = g.value({8});
  g.node("aten::neg", {GraphBuilder::tensor("self", a)}, {o});
  g.inputs({a});
  g.outputs({o});
  try {
    p->compile(*g.view(), KILN_MODE_DEFAULT, {{"unroll", "4"}}, "/tmp");
    FAIL() << "unknown option accepted";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), p->path() +
                                         ": plugin 'custom_elementwise': compile failed (invalid argument): "
                                         "unknown option 'unroll' in [plugin.custom_elementwise]");
  }
  auto exe = p->compile(*g.view(), KILN_MODE_DEFAULT);
  std::vector<float> in(8, 1.f), out(7);
  std::vector<int64_t> s8 = {8}, s7 = {7};
  DLTensor ti = dl(in, s8), to = dl(out, s7);
  try {
    exe->execute(&ti, 1, &to, 1);
    FAIL() << "wrong-sized output accepted";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), p->path() +
                                         ": plugin 'custom_elementwise': execute failed (invalid argument): "
                                         "output tensor 1 must be a contiguous float32 CPU tensor of 8 elements");
  }
}
