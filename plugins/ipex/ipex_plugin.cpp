// The ipex backend: what Intel Extension for PyTorch did for training on x86 CPUs, on oneDNN
// directly. It claims matmul (mm, addmm, bmm) with bias and the relu, gelu or add that follows
// fused in as post-ops, relu and gelu forward and backward, softmax and log-softmax forward and
// backward, layer norm forward and backward and 2-d convolution forward and backward (lowering.h),
// in float32 and, where the CPU has AVX-512-BF16 or AMX, in bfloat16. oneDNN is loaded at run
// time (dnnl_loader.h); no LibTorch.
#include <cstring>
#include <filesystem>

#include <kiln/plugin_api.hpp>

#include "dnnl_loader.h"
#include "lowering.h"

namespace {

using namespace kiln::plugin;
using kiln::ipex::dnnl_library;

constexpr uint64_t kBf16Isa = KILN_CPU_ISA_AVX512_BF16 | KILN_CPU_ISA_AMX_BF16;

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

  // oneDNN's x86 kernels need an Intel or AMD CPU, and the oneDNN library has to load.
  Availability available(const Devices& devices) override {
    const KilnDeviceInfo* cpu = devices.first(KILN_DEVICE_CPU);
    if (!cpu) return Availability::no("needs an x86 CPU; the device list has no CPU");
    const bool intel = std::strcmp(cpu->vendor, "GenuineIntel") == 0;
    const bool amd = std::strcmp(cpu->vendor, "AuthenticAMD") == 0;
    if (!intel && !amd)
      return Availability::no(std::string("needs an x86 CPU (GenuineIntel or AuthenticAMD); this CPU's vendor is '") +
                              cpu->vendor + "'");
    const auto& lib = dnnl_library();
    if (!lib.loaded) return Availability::no(lib.error);
    const bool bf16 = (cpu->cpu_isa & kBf16Isa) != 0;
    support_.bf16 = bf16;
    probed_ = true;
    const std::string reason = std::string(cpu->vendor) + " CPU, bf16 kernels " +
                               (bf16 ? "on (AVX-512-BF16/AMX)" : "off (no AVX-512-BF16 or AMX)");
    // A fallback below inductor (200) on a machine that trains on the CPU. Where a CUDA GPU is, the
    // step runs there: a CPU backend is used only when named.
    if (devices.first(KILN_DEVICE_CUDA))
      return Availability::yes(reason + "; a CUDA GPU is present, so only when named", 0);
    return Availability::yes(reason, 100);
  }

  std::vector<int64_t> claim(const Graph& g) override {
    if (!dnnl_library().loaded) return {};
    const kiln::ipex::Support s = support();
    std::vector<int64_t> taken;
    for (int64_t i = 0; i < static_cast<int64_t>(g.num_nodes()); ++i)
      if (kiln::ipex::why_not(g, i, s).empty()) taken.push_back(i);
    return taken;
  }

  std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& options) override {
    if (options.mode != KILN_MODE_DEFAULT && options.mode != KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS)
      throw Error(KILN_ERROR_INVALID_ARGUMENT,
                  std::string("mode ") + mode_name(options.mode) + " is not one the ipex backend lists");
    bool profile = false;
    for (const auto& [key, value] : options.options) {
      if (key != "profile")
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "unknown option '" + key + "' in [plugin.ipex] (it takes: profile)");
      if (value == "true" || value == "1") profile = true;
      else if (value != "false" && value != "0")
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "[plugin.ipex] profile = '" + value + "': expected true or false");
    }
    kiln::ipex::Tuning tuning;
    tuning.enabled = options.mode == KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS;
    if (tuning.enabled) {
      const std::string root = options.cache_dir.empty() ? host().cache_dir() : options.cache_dir;
      if (!root.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(root + "/ipex", ec);
        if (ec)
          host().warn("max-autotune: cannot create " + root + "/ipex (" + ec.message() + "): winners are not kept");
        else tuning.dir = root + "/ipex";
      }
      tuning.info = [this](const std::string& m) { host().info(m); };
      tuning.warn = [this](const std::string& m) { host().warn(m); };
    }
    return kiln::ipex::compile_group(g, support(), tuning, profile);
  }

 private:
  // bf16 from the hardware probe's CPU features (available); before any probe, from what oneDNN
  // itself dispatches to on this CPU.
  kiln::ipex::Support support() {
    if (!probed_) {
      support_.bf16 = kiln::ipex::cpu_has_bf16();
      probed_ = true;
    }
    return support_;
  }

  kiln::ipex::Support support_;
  bool probed_ = false;
};

}  // namespace

KILN_DEFINE_PLUGIN(IpexPlugin)
