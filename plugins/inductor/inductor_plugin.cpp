// The inductor backend: fuses pointwise ops and reductions into generated kernels (C++ with OpenMP
// on CPU, CUDA C through NVRTC on GPU). This file is its ABI surface: descriptor, availability,
// claims and compile; the code generator lands with its own issue, and until then compile answers
// "unimplemented" so kiln runs the nodes eagerly.
#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

class InductorPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "inductor";
    d.version = "0.1.0";
    d.vendor = "kiln";
    d.description = "fused C++/OpenMP (CPU) and NVRTC CUDA (GPU) kernels, like torch.compile's default";
    d.device_kinds = KILN_DEVICE_MASK_CPU | KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_MASK_ALL;
    d.concurrent_execution_safe = false;
    return d;
  }

  // Runs on any CPU; on CUDA devices too.
  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* cpu = devices.first(KILN_DEVICE_CPU);
    const KilnDeviceInfo* gpu = devices.first(KILN_DEVICE_CUDA);
    if (!cpu && !gpu) return Availability::no("no CPU or CUDA device in the device list");
    std::string reason;
    if (gpu) {
      reason = std::to_string(devices.count(KILN_DEVICE_CUDA)) + " CUDA device(s), first " + gpu->name +
               " (sm_" + std::to_string(gpu->compute_capability_major) +
               std::to_string(gpu->compute_capability_minor) + ")";
    }
    if (cpu) reason += std::string(reason.empty() ? "" : "; ") + "CPU " + (*cpu->name ? cpu->name : "(unnamed)");
    return Availability::yes(reason);
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("the inductor code generator is not built yet; kiln runs these nodes eagerly");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(InductorPlugin)
