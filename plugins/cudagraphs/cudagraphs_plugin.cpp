// The cudagraphs backend: no fusion; captures the step into a CUDA graph with static input and
// output buffers and replays it. This file is its ABI surface; the capture runtime lands with its
// own issue, and until then compile answers "unimplemented" so kiln runs the nodes eagerly.
#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

class CudaGraphsPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "cudagraphs";
    d.version = "0.1.0";
    d.vendor = "kiln";
    d.description = "CUDA graph capture and replay of the whole step, no fusion";
    d.device_kinds = KILN_DEVICE_MASK_CUDA;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_REDUCE_OVERHEAD);
    d.concurrent_execution_safe = false;
    return d;
  }

  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* gpu = devices.first(KILN_DEVICE_CUDA);
    if (!gpu) return Availability::no("needs a CUDA device; none found");
    return Availability::yes(std::to_string(devices.count(KILN_DEVICE_CUDA)) + " CUDA device(s), first " +
                             gpu->name);
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("CUDA graph capture is not built yet; kiln runs these nodes eagerly");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(CudaGraphsPlugin)
