// Availability cases: whether the plugin says truthfully, and cheaply, where it can run.
#include <gtest/gtest.h>

#include <chrono>

#include "harness.h"
#include "kiln/hardware_probe.h"
#include "kiln/internal/selection.h"

namespace kiln::conformance {
namespace {

TEST(Availability, UnavailablePluginSaysWhyAndDeclinesEveryCompile) {
  const auto& a = availability();
  if (a.available) GTEST_SKIP() << "the plugin is available here (" << a.reason << ")";
  EXPECT_FALSE(a.reason.empty()) << "unavailable without a reason: `kiln plugins` would show nothing";
  // kiln never compiles with an unavailable plugin, but a plugin must not fall over when asked.
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  size_t declined = 0;
  for (const auto& s : sample_graphs()) {
    GraphView view(s.graph);
    std::vector<int64_t> claims;
    progress("claim " + s.label);
    auto st = ctx.claim(&view.view(), &claims);
    EXPECT_TRUE(st.ok || !st.message.empty()) << s.label << ": claim error without a message";
    KilnExecutable* exe = nullptr;
    progress("compile " + s.label);
    auto c = ctx.compile(&view.view(), KILN_MODE_DEFAULT, {}, &exe);
    EXPECT_FALSE(c.ok) << s.label << ": an unavailable plugin compiled a graph (it cannot run it here)";
    if (!c.ok) {
      ++declined;
      EXPECT_FALSE(c.message.empty()) << s.label << ": declined without a message";
    }
    EXPECT_EQ(exe, nullptr) << s.label << ": an error came back with an executable";
    if (c.ok) ctx.destroy(exe);
  }
  note("unavailable: " + a.reason + "; declined " + std::to_string(declined) + " compiles");
}

TEST(Availability, AgreesWithTheHardwareProbe) {
  auto p = loaded_plugin();
  const auto& devices = probe_devices();
  const auto& a = availability();
  uint32_t kinds_here = 0;
  for (const auto& d : devices) kinds_here |= KILN_DEVICE_KIND_BIT(d.kind);
  EXPECT_FALSE(a.reason.empty()) << "available() gave no reason; `kiln plugins` shows it";
  if (a.available) {
    EXPECT_NE(kinds_here & p->device_kinds(), 0u)
        << "says it is available, but the probe found no device of its kinds ("
        << device_kinds_string(p->device_kinds()) << "; found " << device_kinds_string(kinds_here) << ")";
  }
  // With no device at all, and with only devices of kinds it does not serve, it cannot run.
  const auto none = p->available(std::vector<PluginDevice>{});
  EXPECT_FALSE(none.available) << "says it is available on a machine with no devices: " << none.reason;
  EXPECT_FALSE(none.reason.empty()) << "unavailable on no devices, without a reason";
  std::vector<PluginDevice> foreign;
  for (KilnDeviceKind k : {KILN_DEVICE_CPU, KILN_DEVICE_CUDA, KILN_DEVICE_GAUDI, KILN_DEVICE_NEURON}) {
    if (p->device_kinds() & KILN_DEVICE_KIND_BIT(k)) continue;
    PluginDevice d;
    d.kind = k;
    d.name = "conformance stand-in";
    d.vendor = "kiln";
    foreign.push_back(d);
  }
  if (!foreign.empty()) {
    const auto f = p->available(foreign);
    EXPECT_FALSE(f.available) << "says it is available on devices of kinds it does not serve: " << f.reason;
  }
  // Cheap and repeatable: the same answer twice, quickly.
  const auto t0 = std::chrono::steady_clock::now();
  const auto again = p->available(devices);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(again.available, a.available) << "a second call answered differently";
  EXPECT_EQ(again.reason, a.reason);
  EXPECT_LT(ms, 1000.0) << "available() took " << ms << " ms; it must be cheap (no device contexts, no compiling)";
  note(std::string(a.available ? "available: " : "unavailable: ") + a.reason +
       " (probe: " + describe_devices(hw::probe().devices) + ")");
}

}  // namespace
}  // namespace kiln::conformance
