// The backend selection rule, branch by branch, over plain structs; the `kiln probe` report it
// feeds; and the conversion of probed devices into the plugin ABI's device records.
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>

#include "../hardware_probe/fake_machine.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/logger.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/selection.h"

namespace {

using kiln::BackendCandidate;
using kiln::BackendSelectionError;
using kiln::select_backend;
using kiln::hw::Device;
using kiln::hw::DeviceKind;
using Json = nlohmann::json;

Device cpu() {
  Device d;
  d.kind = DeviceKind::cpu;
  d.name = "Intel(R) Xeon(R) Platinum 8480+";
  d.cpu.vendor = "GenuineIntel";
  d.cpu.threads = 224;
  d.cpu.memory_bytes = 2ull << 40;
  d.cpu.isa.avx2 = d.cpu.isa.avx512f = d.cpu.isa.amx_bf16 = true;
  return d;
}
Device accel(DeviceKind kind, int index, const std::string& gen, uint16_t vendor, uint16_t id) {
  Device d;
  d.kind = kind;
  d.index = index;
  d.name = (kind == DeviceKind::gaudi ? "Intel " : "AWS ") + gen;
  d.pci_bus_id = kiln::testing::FakeMachine::bus_id(0x20 + index);
  d.accel.generation = gen;
  d.accel.pci_vendor_id = vendor;
  d.accel.pci_device_id = id;
  return d;
}
Device cuda(int index) {
  Device d;
  d.kind = DeviceKind::cuda;
  d.index = index;
  d.name = "NVIDIA H200";
  d.pci_bus_id = kiln::testing::FakeMachine::bus_id(0x17 + index);
  d.cuda.cc_major = 9;
  d.cuda.total_memory_bytes = 150109880320ull;
  d.cuda.multiprocessor_count = 132;
  return d;
}

std::vector<Device> cpu_only() { return {cpu()}; }
std::vector<Device> gaudi2_x8() {
  std::vector<Device> v{cpu()};
  for (int i = 0; i < 8; ++i) v.push_back(accel(DeviceKind::gaudi, i, "Gaudi2", 0x1da3, 0x1020));
  return v;
}
std::vector<Device> trainium_x16() {
  std::vector<Device> v{cpu()};
  for (int i = 0; i < 16; ++i) v.push_back(accel(DeviceKind::neuron, i, "Trainium", 0x1d0f, 0x7164));
  return v;
}
std::vector<Device> two_h200() { return {cpu(), cuda(0), cuda(1)}; }

// Every in-tree backend installed and available, each with the score it gives on `devices`: a
// device's own compiler first (hpu_backend 400 on a Gaudi, neuron 300 on a Neuron device), then
// inductor (200), then the fallbacks that do not fuse (cudagraphs 100 on a CUDA GPU, ipex 100 where
// there is none); 0 means "only when named".
std::vector<BackendCandidate> all_available(const std::vector<Device>& devices) {
  auto has = [&](DeviceKind k) {
    return std::any_of(devices.begin(), devices.end(), [&](const Device& d) { return d.kind == k; });
  };
  const bool cuda = has(DeviceKind::cuda);
  return {{"inductor", true, "generates C++/CUDA", 200},
          {"cudagraphs", true, "", cuda ? 100 : 0},
          {"ipex", true, "", cuda ? 0 : 100},
          {"hpu_backend", true, "8 Gaudi devices", has(DeviceKind::gaudi) ? 400 : 0},
          {"neuron", true, "libnrt loads", has(DeviceKind::neuron) ? 300 : 0}};
}
std::vector<BackendCandidate> with(std::vector<BackendCandidate> v, const std::string& name, bool available,
                                   const std::string& reason) {
  for (auto& c : v)
    if (c.name == name) {
      c.available = available;
      c.reason = reason;
    }
  return v;
}
std::vector<BackendCandidate> without(std::vector<BackendCandidate> v, const std::string& name) {
  v.erase(std::remove_if(v.begin(), v.end(), [&](const BackendCandidate& c) { return c.name == name; }), v.end());
  return v;
}
bool has_reason(const kiln::BackendChoice& c, const std::string& needle) {
  return std::any_of(c.reasons.begin(), c.reasons.end(),
                     [&](const std::string& r) { return r.find(needle) != std::string::npos; });
}
std::string reasons(const kiln::BackendChoice& c) {
  std::string s;
  for (const auto& r : c.reasons) s += "  " + r + "\n";
  return s;
}

// ---- "auto" ----

TEST(Selection, GaudiMachinePicksHpuBackend) {
  auto c = select_backend(gaudi2_x8(), all_available(gaudi2_x8()));
  EXPECT_EQ(c.backend, "hpu_backend");
  EXPECT_EQ(c.requested, "auto");
  EXPECT_EQ(c.order, (std::vector<std::string>{"hpu_backend", "inductor", "ipex"}));
  EXPECT_EQ(c.runners_up, (std::vector<std::string>{"inductor", "ipex", "cudagraphs", "neuron"}));
  ASSERT_EQ(c.reasons.size(), 2u) << reasons(c);
  EXPECT_EQ(c.reasons[0],
            "ranked the available backends by the score each gave for 8 × Intel Gaudi2, CPU Intel(R) Xeon(R) "
            "Platinum 8480+: hpu_backend 400, inductor 200, ipex 100; used only when named (score 0): cudagraphs, "
            "neuron");
  EXPECT_EQ(c.reasons[1], "chose hpu_backend: installed and available (8 Gaudi devices)");
}

TEST(Selection, GaudiMachineFallsBackToInductorWhenHpuBackendIsUnavailable) {
  auto c = select_backend(gaudi2_x8(), with(all_available(gaudi2_x8()), "hpu_backend", false,
                                            "Intel Gaudi device found, but libSynapse.so cannot be loaded"));
  EXPECT_EQ(c.backend, "inductor");
  ASSERT_EQ(c.reasons.size(), 3u) << reasons(c);
  EXPECT_EQ(c.reasons[1],
            "skipped hpu_backend: installed but unavailable here (Intel Gaudi device found, but "
            "libSynapse.so cannot be loaded)");
  EXPECT_EQ(c.reasons[2], "chose inductor: installed and available (generates C++/CUDA)");
  EXPECT_EQ(c.runners_up.front(), "ipex");
  EXPECT_EQ(std::count(c.runners_up.begin(), c.runners_up.end(), "hpu_backend"), 0);
}

// kiln knows no plugin by name, so a missing one is simply not ranked.
TEST(Selection, GaudiMachineFallsBackWhenHpuBackendIsNotInstalled) {
  auto c = select_backend(gaudi2_x8(), without(all_available(gaudi2_x8()), "hpu_backend"));
  EXPECT_EQ(c.backend, "inductor");
  EXPECT_EQ(c.order, (std::vector<std::string>{"inductor", "ipex"}));
  EXPECT_FALSE(has_reason(c, "hpu_backend")) << reasons(c);
}

TEST(Selection, GaudiMachineFallsBackPastInductorToIpex) {
  auto plugins = with(without(all_available(gaudi2_x8()), "hpu_backend"), "inductor", false, "no C++ compiler found");
  auto c = select_backend(gaudi2_x8(), plugins);
  EXPECT_EQ(c.backend, "ipex");
  EXPECT_TRUE(has_reason(c, "skipped inductor: installed but unavailable here (no C++ compiler found)")) << reasons(c);
}

TEST(Selection, NeuronMachinePicksNeuron) {
  auto c = select_backend(trainium_x16(), all_available(trainium_x16()));
  EXPECT_EQ(c.backend, "neuron");
  EXPECT_EQ(c.order, (std::vector<std::string>{"neuron", "inductor", "ipex"}));
  EXPECT_EQ(c.reasons[0],
            "ranked the available backends by the score each gave for 16 × AWS Trainium, CPU Intel(R) Xeon(R) "
            "Platinum 8480+: neuron 300, inductor 200, ipex 100; used only when named (score 0): cudagraphs, "
            "hpu_backend");
}

TEST(Selection, NeuronMachineFallsBackToInductorWhenNeuronIsUnavailable) {
  auto c =
      select_backend(trainium_x16(), with(all_available(trainium_x16()), "neuron", false, "libnrt.so.1 not found"));
  EXPECT_EQ(c.backend, "inductor");
  EXPECT_TRUE(has_reason(c, "skipped neuron: installed but unavailable here (libnrt.so.1 not found)")) << reasons(c);
}

TEST(Selection, CudaMachinePicksInductorThenCudagraphs) {
  auto c = select_backend(two_h200(), all_available(two_h200()));
  EXPECT_EQ(c.backend, "inductor");
  EXPECT_EQ(c.order, (std::vector<std::string>{"inductor", "cudagraphs"}));
  EXPECT_EQ(c.reasons[0],
            "ranked the available backends by the score each gave for 2 × NVIDIA H200, CPU Intel(R) Xeon(R) "
            "Platinum 8480+: inductor 200, cudagraphs 100; used only when named (score 0): ipex, hpu_backend, "
            "neuron");
  EXPECT_EQ(c.runners_up.front(), "cudagraphs");
}

TEST(Selection, CudaMachineFallsBackToCudagraphsWhenInductorIsUnavailable) {
  auto c = select_backend(two_h200(), with(all_available(two_h200()), "inductor", false, "NVRTC not found"));
  EXPECT_EQ(c.backend, "cudagraphs");
  EXPECT_TRUE(has_reason(c, "skipped inductor: installed but unavailable here (NVRTC not found)"));
}

TEST(Selection, CpuMachinePicksInductorThenIpex) {
  auto c = select_backend(cpu_only(), all_available(cpu_only()));
  EXPECT_EQ(c.backend, "inductor");
  EXPECT_EQ(c.order, (std::vector<std::string>{"inductor", "ipex"}));
  EXPECT_EQ(c.reasons[0],
            "ranked the available backends by the score each gave for CPU Intel(R) Xeon(R) Platinum 8480+: "
            "inductor 200, ipex 100; used only when named (score 0): cudagraphs, hpu_backend, neuron");
}

TEST(Selection, CpuMachineFallsBackToIpexWhenInductorIsMissing) {
  auto c = select_backend(cpu_only(), without(all_available(cpu_only()), "inductor"));
  EXPECT_EQ(c.backend, "ipex");
}

TEST(Selection, NothingAvailableMeansEagerWithAReason) {
  std::vector<BackendCandidate> plugins{{"inductor", false, "no compiler", 0}, {"ipex", false, "no oneDNN", 0}};
  auto c = select_backend(cpu_only(), plugins);
  EXPECT_EQ(c.backend, "eager");
  EXPECT_TRUE(c.runners_up.empty());
  EXPECT_EQ(c.reasons.back(),
            "no installed plugin is available here with a positive score, so steps run eagerly (uncompiled); "
            "install or fix a backend for CPU Intel(R) Xeon(R) Platinum 8480+, or name one");
  EXPECT_TRUE(has_reason(c, "skipped ipex: installed but unavailable here (no oneDNN)"));
}

TEST(Selection, NoPluginsAtAllMeansEager) {
  auto c = select_backend(gaudi2_x8(), {});
  EXPECT_EQ(c.backend, "eager");
  EXPECT_TRUE(c.order.empty());
  EXPECT_TRUE(has_reason(c, "none has a positive score")) << reasons(c);
}

TEST(Selection, NvidiaPlusGaudiMachinePrefersHpuBackend) {
  auto devices = gaudi2_x8();
  devices.push_back(cuda(0));
  auto c = select_backend(devices, all_available(devices));
  EXPECT_EQ(c.backend, "hpu_backend");
  EXPECT_EQ(c.order, (std::vector<std::string>{"hpu_backend", "inductor", "cudagraphs"}));
}

TEST(Selection, GaudiPlusNeuronMachineTriesBothAccelerators) {
  auto devices = gaudi2_x8();
  devices.push_back(accel(DeviceKind::neuron, 0, "Trainium2", 0x1d0f, 0x7364));
  auto c = select_backend(devices, with(all_available(devices), "hpu_backend", false, "no Synapse"));
  EXPECT_EQ(c.order, (std::vector<std::string>{"neuron", "inductor", "ipex"}));
  EXPECT_EQ(c.backend, "neuron");
  EXPECT_TRUE(has_reason(c, "skipped hpu_backend: installed but unavailable here (no Synapse)")) << reasons(c);
}

TEST(Selection, PluginThatScoresZeroIsNeverPickedAutomaticallyButIsARunnerUp) {
  std::vector<BackendCandidate> plugins{{"acme_npu", true, "", 0}, {"inductor", true, "", 200}};
  auto c = select_backend(cpu_only(), plugins);
  EXPECT_EQ(c.backend, "inductor");
  EXPECT_EQ(c.runners_up, (std::vector<std::string>{"acme_npu"}));
  auto none = select_backend(cpu_only(), {{"acme_npu", true, ""}});
  EXPECT_EQ(none.backend, "eager");
}

TEST(Selection, HighestScoreWinsWhateverTheNameAndTiesGoToTheFirstName) {
  auto c =
      select_backend(cpu_only(), {{"zeta", true, "", 50}, {"acme_npu", true, "", 900}, {"inductor", true, "", 200}});
  EXPECT_EQ(c.backend, "acme_npu");
  EXPECT_EQ(c.order, (std::vector<std::string>{"acme_npu", "inductor", "zeta"}));
  auto tie = select_backend(cpu_only(), {{"beta", true, "", 100}, {"alpha", true, "", 100}});
  EXPECT_EQ(tie.backend, "alpha");
  EXPECT_EQ(tie.runners_up, (std::vector<std::string>{"beta"}));
}

TEST(Selection, EmptyRequestMeansAuto) {
  auto c = select_backend(trainium_x16(), all_available(trainium_x16()), "");
  EXPECT_EQ(c.requested, "auto");
  EXPECT_EQ(c.backend, "neuron");
}

TEST(Selection, FirstPluginOfANameWins) {
  std::vector<BackendCandidate> plugins{{"inductor", false, "first copy: broken", 200},
                                        {"inductor", true, "second", 200}};
  auto c = select_backend(cpu_only(), plugins);
  EXPECT_EQ(c.backend, "eager");
  EXPECT_TRUE(has_reason(c, "first copy: broken"));
}

// ---- A named backend ----

TEST(Selection, NamedAvailableBackendIsUsedEvenAgainstTheDefault) {
  auto c = select_backend(gaudi2_x8(), all_available(gaudi2_x8()), "ipex");
  EXPECT_EQ(c.backend, "ipex");
  EXPECT_EQ(c.requested, "ipex");
  ASSERT_EQ(c.reasons.size(), 1u);
  EXPECT_EQ(c.reasons[0], "ipex was named and is available");
  EXPECT_EQ(c.runners_up.front(), "hpu_backend");
}

TEST(Selection, NamedUnavailableBackendIsAnErrorWithThePluginsReason) {
  auto plugins = with(all_available(cpu_only()), "hpu_backend", false, "no Intel Gaudi device found");
  try {
    select_backend(cpu_only(), plugins, "hpu_backend");
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()),
              "backend 'hpu_backend' was named but is unavailable here: no Intel Gaudi device found. "
              "Available backends: inductor, cudagraphs, ipex, neuron (or \"auto\" to pick one)");
    EXPECT_EQ(e.available().size(), 4u);
  }
}

TEST(Selection, UnknownNameIsAnErrorWithDidYouMean) {
  try {
    select_backend(cpu_only(), all_available(cpu_only()), "indcutor");
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown backend 'indcutor'; did you mean 'inductor'? Available backends: inductor, "
              "cudagraphs, ipex, hpu_backend, neuron (or \"auto\" to pick one)");
  }
}

TEST(Selection, UnknownNameFarFromEverythingHasNoSuggestion) {
  try {
    select_backend(cpu_only(), {{"inductor", true, ""}}, "tensorrt_llm_xyz");
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown backend 'tensorrt_llm_xyz'. Available backends: inductor (or \"auto\" to pick one)");
  }
}

TEST(Selection, InTreeBackendThatIsNotInstalledSaysSo) {
  try {
    select_backend(trainium_x16(), {{"inductor", true, ""}}, "neuron");
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()),
              "backend 'neuron' is not installed (no plugin of that name was found). Available "
              "backends: inductor (or \"auto\" to pick one)");
  }
}

TEST(Selection, NamedBackendWhosePluginFileWasRefusedGivesTheLoadersReason) {
  const std::vector<kiln::RefusedPlugin> refused = {
      {"vecops", "/opt/plugins/libkiln_vecops.so",
       "plugin was built for kiln plugin ABI 1.2; this kiln speaks 2.5 — rebuild it against the kiln 2.x SDK"}};
  try {
    select_backend(cpu_only(), {{"inductor", true, ""}}, "vecops", refused);
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()),
              "backend 'vecops' was found, but kiln refused its plugin file /opt/plugins/libkiln_vecops.so: plugin was "
              "built for kiln plugin ABI 1.2; this kiln speaks 2.5 — rebuild it against the kiln 2.x SDK. Available "
              "backends: inductor (or \"auto\" to pick one)");
  }
  // Another name still gets the usual answer.
  try {
    select_backend(cpu_only(), {{"inductor", true, ""}}, "vecop", refused);
    FAIL() << "expected BackendSelectionError";
  } catch (const BackendSelectionError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("unknown backend 'vecop'", 0), 0u) << e.what();
  }
}

TEST(Selection, EagerCanAlwaysBeNamed) {
  auto c = select_backend(cpu_only(), {}, "eager");
  EXPECT_EQ(c.backend, "eager");
  EXPECT_EQ(c.reasons[0], "eager was named: every step runs uncompiled through ATen");
}

TEST(Selection, LogsTheChoiceAtInfoWithTheRunnersUp) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto log = kiln::logger();
  log->sinks().push_back(sink);
  const auto old_level = log->level();
  log->set_level(spdlog::level::info);
  select_backend(gaudi2_x8(), with(all_available(gaudi2_x8()), "hpu_backend", false, "no Synapse"));
  log->sinks().pop_back();
  log->set_level(old_level);
  auto lines = sink->last_raw();
  ASSERT_FALSE(lines.empty());
  std::string msg(lines.back().payload.begin(), lines.back().payload.end());
  EXPECT_EQ(lines.back().level, spdlog::level::info);
  EXPECT_EQ(msg, "backend: inductor (chosen automatically); runners-up: ipex, cudagraphs, neuron");
}

// ---- Conversion into the plugin ABI's device records ----

TEST(PluginDevices, CarriesEveryFieldPluginsRead) {
  auto devices = gaudi2_x8();
  devices.push_back(cuda(0));
  devices.push_back(accel(DeviceKind::neuron, 0, "Trainium2", 0x1d0f, 0x7364));
  auto p = kiln::to_plugin_devices(devices);
  ASSERT_EQ(p.size(), devices.size());
  EXPECT_EQ(p[0].kind, KILN_DEVICE_CPU);
  EXPECT_EQ(p[0].vendor, "GenuineIntel");
  EXPECT_EQ(p[0].multiprocessor_count, 224);
  EXPECT_EQ(p[0].total_memory_bytes, 2ull << 40);
  EXPECT_EQ(p[0].cpu_isa, KILN_CPU_ISA_AVX2 | KILN_CPU_ISA_AVX512F | KILN_CPU_ISA_AMX_BF16);
  EXPECT_EQ(p[8].kind, KILN_DEVICE_GAUDI);
  EXPECT_EQ(p[8].index, 7);
  EXPECT_EQ(p[8].vendor, "Habana");
  EXPECT_EQ(p[8].pci_vendor_id, 0x1da3u);
  EXPECT_EQ(p[8].pci_device_id, 0x1020u);
  EXPECT_EQ(p[8].pci_bus_id, devices[8].pci_bus_id);
  EXPECT_EQ(p[9].kind, KILN_DEVICE_CUDA);
  EXPECT_EQ(p[9].name, "NVIDIA H200");
  EXPECT_EQ(p[9].compute_capability_major, 9);
  EXPECT_EQ(p[9].multiprocessor_count, 132);
  EXPECT_EQ(p[9].total_memory_bytes, 150109880320ull);
  EXPECT_EQ(p[10].kind, KILN_DEVICE_NEURON);
  EXPECT_EQ(p[10].vendor, "AWS");
  EXPECT_EQ(p[10].pci_device_id, 0x7364u);
  // And the C form plugins actually receive.
  kiln::DeviceInfoArray arr(p);
  ASSERT_EQ(arr.size(), p.size());
  EXPECT_EQ(arr.data()[9]->compute_capability_major, 9);
  EXPECT_STREQ(arr.data()[8]->vendor, "Habana");
}

// ---- The `kiln probe` report ----

kiln::ProbeReport report_for(const kiln::testing::FakeMachine& m, std::vector<BackendCandidate> plugins) {
  kiln::ProbeReport r;
  kiln::hw::ProbeOptions o;
  o.root = m.root();
  r.probe = kiln::hw::probe(o);
  r.plugins = std::move(plugins);
  r.choice = select_backend(r.probe.devices, r.plugins);
  return r;
}

TEST(ProbeReport, JsonIsValidAndCarriesDevicesBackendAndReasons) {
  kiln::testing::FakeMachine m;
  m.cpu();
  for (int i = 0; i < 8; ++i) m.gaudi(kiln::testing::FakeMachine::bus_id(0x19 + i), 0x1020, i);
  auto r = report_for(m, with(all_available(gaudi2_x8()), "hpu_backend", false, "libSynapse.so: \"not found\"\n"));
  Json j = Json::parse(kiln::probe_report_json(r));
  ASSERT_EQ(j["devices"].size(), 9u);
  EXPECT_EQ(j["devices"][0]["kind"].get<std::string>(), "cpu");
  EXPECT_FALSE(j["devices"][0].contains("pci_bus_id"));
  EXPECT_EQ(j["devices"][0]["threads"].get<double>(), 16);
  EXPECT_TRUE(j["devices"][0]["isa"]["avx512f"].get<bool>());
  EXPECT_EQ(j["devices"][3]["kind"].get<std::string>(), "gaudi");
  EXPECT_EQ(j["devices"][3]["index"].get<double>(), 2);
  EXPECT_EQ(j["devices"][3]["name"].get<std::string>(), "Intel Gaudi2");
  EXPECT_EQ(j["devices"][3]["pci_bus_id"].get<std::string>(), "0000:1b:00.0");
  EXPECT_EQ(j["devices"][3]["generation"].get<std::string>(), "Gaudi2");
  EXPECT_EQ(j["devices"][3]["pci_device_id"].get<std::string>(), "0x1020");
  EXPECT_EQ(j["devices"][3]["dev_node"].get<std::string>(), "/dev/accel/accel2");
  EXPECT_EQ(j["default_backend"].get<std::string>(), "inductor");
  ASSERT_TRUE(j["reasons"].is_array());
  ASSERT_EQ(j["reasons"].size(), r.choice.reasons.size());
  EXPECT_EQ(j["reasons"][1].get<std::string>(),
            "skipped hpu_backend: installed but unavailable here (libSynapse.so: \"not found\"\n)");
  EXPECT_EQ(j["plugins"].size(), 5u);
  EXPECT_FALSE(j["live"].get<bool>());
}

TEST(ProbeReport, JsonEscapesQuotesControlBytesAndInvalidUtf8) {
  kiln::testing::FakeMachine m;
  kiln::testing::CpuSpec spec;
  spec.model = "Evil \"CPU\" \\ with\ttab \x01 and \xff\xfe bytes";
  m.cpu(spec);
  auto r = report_for(m, all_available(cpu_only()));
  Json j = Json::parse(kiln::probe_report_json(r));
  EXPECT_EQ(j["devices"][0]["name"].get<std::string>(),
            "Evil \"CPU\" \\ with\ttab \x01 and \xef\xbf\xbd\xef\xbf\xbd bytes");
}

TEST(ProbeReport, JsonCarriesTheProbesWarnings) {
  kiln::testing::FakeMachine m;
  m.cpu();
  m.pci("0000:20:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  m.write("/sys/devices/pci0000:00/0000:20:00.0/vendor", "zzz\n");
  auto r = report_for(m, all_available(cpu_only()));
  Json j = Json::parse(kiln::probe_report_json(r));
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["warnings"][0].get<std::string>(),
            "PCI device 0000:20:00.0: vendor file holds 'zzz\\x0a', not a 16-bit hex id; skipped");
}

TEST(ProbeReport, TextShowsATableThenTheBackendAndWhy) {
  kiln::testing::FakeMachine m;
  m.cpu();
  m.nvidia_gpu("0000:17:00.0");
  auto r = report_for(m, all_available(two_h200()));
  auto text = kiln::probe_report_text(r, false);
  EXPECT_NE(text.find("KIND"), std::string::npos) << text;
  EXPECT_NE(text.find("cuda    0   NVIDIA H200"), std::string::npos) << text;
  EXPECT_NE(text.find("0000:17:00.0"), std::string::npos) << text;
  EXPECT_NE(text.find("Default backend: inductor\n  because chose inductor"), std::string::npos) << text;
  auto explained = kiln::probe_report_text(r, true);
  EXPECT_NE(explained.find("  - ranked the available backends by the score each gave for NVIDIA H200"),
            std::string::npos)
      << explained;
  EXPECT_NE(explained.find("Plugins:\n  inductor: available"), std::string::npos) << explained;
}

}  // namespace

namespace {

// The live machine with the in-tree plugins: what `kiln probe --json` prints, without LibTorch.
// Printed so a run on a GPU machine shows the report; checked for shape, since the machine varies.
TEST(ProbeReport, ThisMachineWithTheInTreePlugins) {
  kiln::ProbeReport r;
  r.probe = kiln::hw::probe({});
  kiln::PluginSearchOptions search;
  const char* dir = std::getenv("KILN_TEST_PLUGIN_DIR");
  search.dirs = {dir && *dir ? dir : KILN_INTREE_PLUGIN_DIR};
  search.use_builtin = false;
  auto registry = kiln::PluginRegistry::load(search, kiln::HostServices::basic(kiln::TrainingArguments{}));
  r.plugins = kiln::plugin_candidates(registry, r.probe.devices);
  r.choice = select_backend(r.probe.devices, r.plugins);
  const std::string json = kiln::probe_report_json(r);
  std::cout << json;
  Json j = Json::parse(json);
  EXPECT_EQ(j["devices"][0]["kind"].get<std::string>(), "cpu");
  EXPECT_EQ(j["default_backend"].get<std::string>(), r.choice.backend);
  EXPECT_GE(j["reasons"].size(), 2u);
  for (const auto& d : j["devices"]) {
    if (d["kind"].get<std::string>() == "cuda") {
      EXPECT_FALSE(d["pci_bus_id"].get<std::string>().empty());
    }
  }
}

}  // namespace
