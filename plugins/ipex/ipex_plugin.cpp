// The ipex backend: linear/matmul/convolution on oneDNN with fused post-ops, bf16 where the CPU
// has AVX-512-BF16 or AMX. This file is its ABI surface; the oneDNN lowering is not written
// yet, and until then compile answers "unimplemented" so kiln runs the nodes eagerly.
#include <cstring>

#include <kiln/plugin_api.hpp>

namespace {

using namespace kiln::plugin;

class IpexPlugin : public Plugin {
 public:
  using Plugin::Plugin;

  static Descriptor describe() {
    Descriptor d;
    d.name = "ipex";
    d.version = "0.1.0";
    d.vendor = "kiln";
    d.description = "oneDNN kernels with fused post-ops for x86 CPUs, bf16 on AVX-512-BF16/AMX";
    d.device_kinds = KILN_DEVICE_MASK_CPU;
    d.modes = KILN_MODE_BIT(KILN_MODE_DEFAULT) | KILN_MODE_BIT(KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS);
    d.concurrent_execution_safe = false;
    return d;
  }

  // oneDNN's x86 kernels need an Intel or AMD CPU.
  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* cpu = devices.first(KILN_DEVICE_CPU);
    if (!cpu) return Availability::no("needs an x86 CPU; the device list has no CPU");
    const bool intel = std::strcmp(cpu->vendor, "GenuineIntel") == 0;
    const bool amd = std::strcmp(cpu->vendor, "AuthenticAMD") == 0;
    if (!intel && !amd)
      return Availability::no(std::string("needs an x86 CPU (GenuineIntel or AuthenticAMD); this CPU's vendor is '") +
                              cpu->vendor + "'");
    const bool bf16 = (cpu->cpu_isa & (KILN_CPU_ISA_AVX512_BF16 | KILN_CPU_ISA_AMX_BF16)) != 0;
    const std::string reason = std::string(cpu->vendor) + " CPU, bf16 kernels " +
                               (bf16 ? "on (AVX-512-BF16/AMX)" : "off (no AVX-512-BF16 or AMX)");
    // A fallback below inductor (200) on a machine that trains on the CPU. Where a CUDA GPU is, the
    // step runs there: a CPU backend is used only when named.
    if (devices.first(KILN_DEVICE_CUDA))
      return Availability::yes(reason + "; a CUDA GPU is present, so only when named", 0);
    return Availability::yes(reason, 100);
  }

  std::vector<int64_t> claim(const Graph&) override { return {}; }

  std::unique_ptr<Executable> compile(const Graph&, const CompileOptions&) override {
    throw Unimplemented("the oneDNN lowering is not built yet; kiln runs these nodes eagerly");
  }
};

}  // namespace

KILN_DEFINE_PLUGIN(IpexPlugin)
