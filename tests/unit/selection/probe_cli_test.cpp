// `kiln probe` end to end: the real binary on machines described as trees, with stand-in plugins
// whose presence (the --plugin-dir) and availability (KILN_FAKE_UNAVAILABLE) the test decides.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "../hardware_probe/fake_machine.h"

namespace {

using kiln::testing::FakeMachine;
using Json = nlohmann::json;

using kiln::test::CliRun;
std::string quote(const std::string& s) { return kiln::test::shell_quote(s); }

CliRun kiln_cli(const std::string& args, const std::string& env = "") {
  return kiln::test::run_command(
      "env -u KILN_SYSFS_ROOT -u KILN_BACKEND -u KILN_PLUGIN_PATH -u KILN_FAKE_UNAVAILABLE " + env + " " +
          quote(KILN_CLI) + " " + args,
      "kiln_probe");
}

// `kiln probe --json --sysfs-root T --plugin-dir <stand-ins>`, parsed.
Json probe_json(const FakeMachine& m, const std::string& env = "", const std::string& extra = "") {
  CliRun r = kiln_cli(
      "probe --json --sysfs-root " + quote(m.root()) + " --plugin-dir " + quote(KILN_FAKE_PLUGIN_DIR) + " " + extra,
      env);
  EXPECT_EQ(r.status, 0) << r.err;
  try {
    return Json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what() << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err;
    return Json{};
  }
}

// Whether one of the report's reasons is exactly `reason` (skipped plugins come in load order).
bool has_reason(const Json& j, const std::string& reason) {
  for (const auto& r : j["reasons"])
    if (r.get<std::string>() == reason) return true;
  return false;
}

std::string reasons_of(const Json& j) {
  std::string s;
  if (!j.contains("reasons")) return "(no reasons)";
  for (const auto& r : j["reasons"]) s += "  " + r.get<std::string>() + "\n";
  return s;
}

int count_kind(const Json& j, const std::string& kind) {
  int n = 0;
  for (const auto& d : j["devices"]) n += d["kind"].get<std::string>() == kind;
  return n;
}

TEST(CliProbe, PicksHpuBackendOnEightGaudi2Tree) {
  FakeMachine m;
  m.cpu();
  for (int i = 0; i < 8; ++i) m.gaudi(FakeMachine::bus_id(0x19 + i), 0x1020, i);
  Json j = probe_json(m);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["default_backend"].get<std::string>(), "hpu_backend") << reasons_of(j);
  EXPECT_EQ(count_kind(j, "gaudi"), 8);
  EXPECT_EQ(j["devices"][1]["pci_bus_id"].get<std::string>(), "0000:19:00.0");
  EXPECT_EQ(j["reasons"][0].get<std::string>(),
            "ranked the available backends by the score each gave for 8 × Intel Gaudi2, CPU Intel(R) Xeon(R) "
            "Platinum 8480+: hpu_backend 400, inductor 200, ipex 100");
  EXPECT_EQ(j["reasons"].back().get<std::string>(),
            "chose hpu_backend: installed and available (fake, serving Intel Gaudi2)");
}

TEST(CliProbe, FallsBackFromUnavailableHpuBackendToInductorAndSaysWhy) {
  FakeMachine m;
  m.cpu();
  for (int i = 0; i < 8; ++i) m.gaudi(FakeMachine::bus_id(0x19 + i), 0x1020, i);
  Json j = probe_json(m, "KILN_FAKE_UNAVAILABLE=hpu_backend");
  EXPECT_EQ(j["default_backend"].get<std::string>(), "inductor") << reasons_of(j);
  EXPECT_TRUE(has_reason(j,
                         "skipped hpu_backend: installed but unavailable here (made unavailable by the test "
                         "(KILN_FAKE_UNAVAILABLE))"))
      << reasons_of(j);
  EXPECT_EQ(j["runners_up"][0].get<std::string>(), "ipex");
}

TEST(CliProbe, PicksHpuBackendOnGaudi3Tree) {
  FakeMachine m;
  m.cpu();
  m.gaudi("0000:4d:00.0", 0x1060, 0);
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "hpu_backend") << reasons_of(j);
  EXPECT_EQ(j["devices"][1]["generation"].get<std::string>(), "Gaudi3");
}

TEST(CliProbe, PicksNeuronOnInferentia2Tree) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:00:1e.0", 0x7264, 0);
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "neuron") << reasons_of(j);
  EXPECT_EQ(j["devices"][1]["name"].get<std::string>(), "AWS Inferentia2");
}

TEST(CliProbe, PicksNeuronOnSixteenTrainiumTree) {
  FakeMachine m;
  m.cpu();
  for (int i = 0; i < 16; ++i) m.neuron(FakeMachine::bus_id(0x10 + i, 0x1e), 0x7164, i);
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "neuron") << reasons_of(j);
  EXPECT_EQ(count_kind(j, "neuron"), 16);
  EXPECT_EQ(j["reasons"][0].get<std::string>(),
            "ranked the available backends by the score each gave for 16 × AWS Trainium, CPU Intel(R) Xeon(R) "
            "Platinum 8480+: neuron 300, inductor 200, ipex 100");
}

TEST(CliProbe, PicksNeuronOnTrainium2TreeAndFallsBackWhenUnavailable) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:a0:1e.0", 0x7364, 0);
  EXPECT_EQ(probe_json(m)["default_backend"].get<std::string>(), "neuron");
  Json j = probe_json(m, "KILN_FAKE_UNAVAILABLE=neuron,inductor");
  EXPECT_EQ(j["default_backend"].get<std::string>(), "ipex") << reasons_of(j);
}

TEST(CliProbe, PicksInductorOnCpuOnlyTree) {
  FakeMachine m;
  m.cpu();
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "inductor") << reasons_of(j);
  EXPECT_EQ(j["devices"].size(), 1u);
  EXPECT_EQ(j["devices"][0]["kind"].get<std::string>(), "cpu");
  EXPECT_EQ(j["order"][1].get<std::string>(), "ipex");
}

TEST(CliProbe, PicksInductorOnTwoNvidiaGpuTree) {
  FakeMachine m;
  m.cpu();
  m.nvidia_gpu("0000:17:00.0");
  m.nvidia_gpu("0000:65:00.0");
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "inductor") << reasons_of(j);
  ASSERT_EQ(count_kind(j, "cuda"), 2);
  EXPECT_EQ(j["devices"][1]["name"].get<std::string>(), "NVIDIA H200");
  EXPECT_EQ(j["devices"][2]["pci_bus_id"].get<std::string>(), "0000:65:00.0");
  EXPECT_EQ(j["devices"][2]["compute_capability"].get<std::string>(), "9.0");
  EXPECT_EQ(j["runners_up"][0].get<std::string>(), "cudagraphs");
}

TEST(CliProbe, PicksHpuBackendOnNvidiaPlusGaudiTree) {
  FakeMachine m;
  m.cpu();
  m.nvidia_gpu("0000:17:00.0", 0x2330);
  m.gaudi("0000:33:00.0", 0x1020, 0);
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "hpu_backend") << reasons_of(j);
  EXPECT_EQ(count_kind(j, "cuda"), 1);
  EXPECT_EQ(count_kind(j, "gaudi"), 1);
}

TEST(CliProbe, NoPluginsMeansEagerWithTheReason) {
  FakeMachine m;
  m.cpu();
  m.mkdir("/empty-plugins");
  CliRun r =
      kiln_cli("probe --json --sysfs-root " + quote(m.root()) + " --plugin-dir " + quote(m.root() + "/empty-plugins"));
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "eager");
  EXPECT_EQ(j["plugins"].size(), 0u);
}

TEST(CliProbe, NamedUnavailableBackendExitsWithThePluginsReason) {
  FakeMachine m;
  m.cpu();
  CliRun r = kiln_cli("probe --json --backend hpu_backend --sysfs-root " + quote(m.root()) + " --plugin-dir " +
                      quote(KILN_FAKE_PLUGIN_DIR));
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("kiln probe: backend 'hpu_backend' was named but is unavailable here: no device of its kind"),
            std::string::npos)
      << r.err;
}

TEST(CliProbe, UnknownBackendSuggestsTheNearestThroughKilnBackend) {
  FakeMachine m;
  m.cpu();
  CliRun r = kiln_cli("probe --sysfs-root " + quote(m.root()) + " --plugin-dir " + quote(KILN_FAKE_PLUGIN_DIR),
                      "KILN_BACKEND=nueron");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown backend 'nueron'; did you mean 'neuron'?"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Available backends: inductor, ipex"), std::string::npos) << r.err;
}

TEST(CliProbe, ReadsTheTreeFromKilnSysfsRoot) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:a0:1e.0", 0x7364, 0);
  CliRun r =
      kiln_cli("probe --json --plugins-dir " + quote(KILN_FAKE_PLUGIN_DIR), "KILN_SYSFS_ROOT=" + quote(m.root()));
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["sysfs_root"].get<std::string>(), m.root());
  EXPECT_EQ(j["default_backend"].get<std::string>(), "neuron");
}

TEST(CliProbe, TextOutputIsATableThenTheBackendAndWhy) {
  FakeMachine m;
  m.cpu();
  m.gaudi("0000:19:00.0", 0x1020, 0);
  CliRun r =
      kiln_cli("probe --explain --sysfs-root " + quote(m.root()) + " --plugin-dir " + quote(KILN_FAKE_PLUGIN_DIR));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("gaudi   0   Intel Gaudi2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Default backend: hpu_backend\n  - ranked the available backends by the score each gave for "
                       "Intel Gaudi2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Plugins:\n"), std::string::npos) << r.out;
}

TEST(CliProbe, MalformedTreeStillAnswersWithWarnings) {
  FakeMachine m;
  m.gaudi("0000:19:00.0", 0x1020, 0);
  m.write("/sys/devices/pci0000:00/0000:19:00.0/device", "\xff\xfe");
  m.link("loop", "/sys/bus/pci/devices/loop");
  Json j = probe_json(m);
  EXPECT_EQ(j["default_backend"].get<std::string>(), "inductor") << reasons_of(j);
  EXPECT_GE(j["warnings"].size(), 3u);  // no cpuinfo, bad device id, the loop
}

TEST(CliProbe, InTreeHpuBackendSaysWhyItCannotRunOnAGaudiWithoutSynapse) {
  const std::string plugin = std::string(KILN_INTREE_PLUGIN_DIR) + "/libkiln_hpu_backend.so";
  if (!std::ifstream(plugin)) GTEST_SKIP() << plugin << " is not built";
  FakeMachine m;
  m.cpu();
  m.gaudi("0000:19:00.0", 0x1020, 0);
  CliRun r =
      kiln_cli("probe --json --sysfs-root " + quote(m.root()) + " --plugin-dir " + quote(KILN_INTREE_PLUGIN_DIR));
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_NE(j["default_backend"].get<std::string>(), "hpu_backend");
  EXPECT_NE(reasons_of(j).find("skipped hpu_backend: installed but unavailable here (Intel Gaudi device found, but "
                               "libSynapse.so"),
            std::string::npos)
      << reasons_of(j);
}

TEST(CliProbe, LiveProbeOfThisMachineIsValidJson) {
  CliRun r = kiln_cli("probe --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_TRUE(j["live"].get<bool>());
  EXPECT_EQ(j["devices"][0]["kind"].get<std::string>(), "cpu");
  EXPECT_GT(j["devices"][0]["threads"].get<double>(), 0);
  EXPECT_FALSE(j["default_backend"].get<std::string>().empty());
  EXPECT_GE(j["reasons"].size(), 1u);
}

}  // namespace
