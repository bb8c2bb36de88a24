// The hpu_backend: lowers claimed subgraphs to a Synapse graph, compiles a recipe and launches it on
// Intel Gaudi. libSynapse.so is opened at run time, so the plugin loads everywhere and says why it
// is unavailable where there is no Gaudi. The lowering is not written yet; until then compile
// answers "unimplemented" so kiln runs the nodes eagerly.
#include <dlfcn.h>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

constexpr const char* kRuntime = "libSynapse.so";

// "" when the library opens; otherwise the loader's reason.
std::string try_open(const char* lib) {
  void* h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    return "";
  }
  const char* why = dlerror();
  return why ? why : "unknown dlopen error";
}

class HpuPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "hpu_backend";
    d.version = "0.1.0";
    d.vendor = "kiln";
    d.description = "Intel Gaudi through the Synapse runtime (libSynapse.so, loaded at run time)";
    d.device_kinds = KILN_DEVICE_MASK_GAUDI;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);
    d.concurrent_execution_safe = false;
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* dev = devices.first(KILN_DEVICE_GAUDI);
    const std::string runtime_error = try_open(kRuntime);
    if (!dev && !runtime_error.empty())
      return Availability::no(std::string("no Intel Gaudi device found, and ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    if (!dev) return Availability::no(std::string("no Intel Gaudi device found (") + kRuntime + " loads)");
    if (!runtime_error.empty())
      return Availability::no(std::string("Intel Gaudi device found, but ") + kRuntime + " cannot be loaded (" +
                              runtime_error + ")");
    // The device's own compiler comes before any general one (inductor scores 200).
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_GAUDI)) + " Gaudi device(s), first " + dev->name +
                                 "; " + kRuntime + " loads",
                             400);
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("the Synapse lowering is not built yet; kiln runs these nodes eagerly");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(HpuPlugin)
