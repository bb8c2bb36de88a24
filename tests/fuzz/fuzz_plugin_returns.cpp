// libFuzzer target: the host's checks of what a plugin returns. A plugin built for the purpose
// (fuzzed_plugin.c) answers every call from the input's bytes: its function table (sizes, versions,
// missing functions), its descriptor (name, version, vendor, device kinds, modes, capabilities),
// availability (flags, scores, a reason without its NUL), claims (counts, indices out of range or
// repeated), compile results (an executable, none, both, in-place acceptances) and errors (any
// code, no message). Loading it, asking it, compiling and running must end in a loaded plugin and
// answers, or a refusal / PluginError that says what was wrong - never a crash, an overrun, a leak
// or another exception.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph_builder.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/plugin_registry.h"

struct KilnFuzzInput {
  const uint8_t* data;
  size_t size;
  size_t at;
};
extern "C" __attribute__((visibility("default"))) KilnFuzzInput kiln_fuzz_plugin_input{nullptr, 0, 0};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The fuzzed plugin: built next to this target (KILN_FUZZED_PLUGIN_PATH), or $KILN_FUZZED_PLUGIN.
  static const std::string path =
      std::getenv("KILN_FUZZED_PLUGIN") ? std::getenv("KILN_FUZZED_PLUGIN") : KILN_FUZZED_PLUGIN_PATH;
  static const auto host = kiln::HostServices::basic("/tmp/kiln-fuzz-cache", {});
  kiln_fuzz_plugin_input = KilnFuzzInput{data, size, 0};
  std::shared_ptr<kiln::LoadedPlugin> plugin;
  try {
    plugin = kiln::PluginRegistry::load_file(path, host);
  } catch (const kiln::PluginError& e) {
    if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "refused: %s\n", e.what());
    // A refusal names the file and says why.
    if (std::string(e.what()).size() <= path.size() + 2) {
      std::fprintf(stderr, "refused without a reason: %s\n", e.what());
      std::abort();
    }
    return 0;
  }
  try {
    std::vector<kiln::PluginDevice> devices(1);
    devices[0].name = "fuzz CPU";
    (void)plugin->available(devices);
    kiln::test::GraphBuilder g;
    const int64_t a = g.value({8}), b = g.value({8}), c = g.value({8});
    g.node("aten::neg", {kiln::test::GraphBuilder::tensor("self", a)}, {b});
    g.node("aten::relu", {kiln::test::GraphBuilder::tensor("self", b)}, {c});
    g.inputs({a});
    g.outputs({c});
    const auto claimed = plugin->claim(*g.view());
    if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "loaded; %zu claimed\n", claimed.size());
    auto exe = plugin->compile(*g.view(), KILN_MODE_DEFAULT, {}, "/tmp/kiln-fuzz-cache", {0});
    std::vector<float> x(8, 1.f), y(8);
    std::vector<int64_t> shape{8};
    DLTensor tx{}, ty{};
    tx.data = x.data(), ty.data = y.data();
    tx.device = ty.device = DLDevice{kDLCPU, 0};
    tx.ndim = ty.ndim = 1;
    tx.dtype = ty.dtype = DLDataType{kDLFloat, 32, 1};
    tx.shape = ty.shape = shape.data();
    exe->execute(&tx, 1, &ty, 1);
    if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "executed\n");
  } catch (const kiln::PluginError& e) {
    if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "PluginError: %s\n", e.what());
  }
  return 0;
}
