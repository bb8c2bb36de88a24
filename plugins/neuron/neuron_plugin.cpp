// The neuron backend: lowers claimed subgraphs to StableHLO, compiles a NEFF with neuronx-cc and
// runs it through the Neuron runtime on AWS Trainium/Inferentia. libnrt.so is opened at run time,
// so the plugin loads everywhere and says why it is unavailable where there is no Neuron device.
// The lowering is not written yet; until then compile answers "unimplemented".
#include <dlfcn.h>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

constexpr const char* kRuntime = "libnrt.so";

// "" when the runtime opens (its versioned soname first, as installed by aws-neuronx-runtime-lib).
std::string try_open_runtime() {
  for (const char* lib : {"libnrt.so.1", kRuntime}) {
    if (void* h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL)) {
      dlclose(h);
      return "";
    }
  }
  const char* why = dlerror();
  return why ? why : "unknown dlopen error";
}

class NeuronPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "neuron";
    d.version = "0.1.0";
    d.vendor = "kiln";
    d.description = "AWS Trainium/Inferentia: StableHLO, neuronx-cc, the Neuron runtime (libnrt.so)";
    d.device_kinds = KILN_DEVICE_MASK_NEURON;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = false;
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* dev = devices.first(KILN_DEVICE_NEURON);
    const std::string runtime_error = try_open_runtime();
    if (!dev && !runtime_error.empty())
      return Availability::no(std::string("no AWS Neuron device found, and ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    if (!dev) return Availability::no(std::string("no AWS Neuron device found (") + kRuntime + " loads)");
    if (!runtime_error.empty())
      return Availability::no(std::string("AWS Neuron device found, but ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    // The device's own compiler comes before any general one (inductor scores 200); a Gaudi's
    // (hpu_backend, 400) before it on a machine with both.
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_NEURON)) + " Neuron device(s), first " +
                                 dev->name + "; " + kRuntime + " loads",
                             300);
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("the StableHLO lowering is not built yet; kiln runs these nodes eagerly");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(NeuronPlugin)
