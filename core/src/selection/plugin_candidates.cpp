// The bridge between the hardware probe, the plugin loader and the selection: the probe's devices
// in the ABI's form, and each loaded plugin's answer to "can you run here?".
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/selection.h"

namespace kiln {

namespace {

uint64_t isa_bits(const hw::IsaFeatures& f) {
  uint64_t bits = 0;
  if (f.avx2) bits |= KILN_CPU_ISA_AVX2;
  if (f.avx512f) bits |= KILN_CPU_ISA_AVX512F;
  if (f.avx512_bf16) bits |= KILN_CPU_ISA_AVX512_BF16;
  if (f.amx_bf16) bits |= KILN_CPU_ISA_AMX_BF16;
  if (f.amx_int8) bits |= KILN_CPU_ISA_AMX_INT8;
  if (f.fma) bits |= KILN_CPU_ISA_FMA;
  if (f.avx512_vnni) bits |= KILN_CPU_ISA_AVX512_VNNI;
  if (f.amx_tile) bits |= KILN_CPU_ISA_AMX_TILE;
  return bits;
}

}  // namespace

std::vector<PluginDevice> to_plugin_devices(const std::vector<hw::Device>& devices) {
  std::vector<PluginDevice> out;
  for (const auto& d : devices) {
    PluginDevice p;
    p.index = d.index;
    p.name = d.name;
    p.pci_bus_id = d.pci_bus_id;
    switch (d.kind) {
      case hw::DeviceKind::cpu:
        p.kind = KILN_DEVICE_CPU;
        p.vendor = d.cpu.vendor;
        p.total_memory_bytes = d.cpu.memory_bytes;
        p.multiprocessor_count = d.cpu.threads;
        p.cpu_isa = isa_bits(d.cpu.isa);
        break;
      case hw::DeviceKind::cuda:
        p.kind = KILN_DEVICE_CUDA;
        p.vendor = "NVIDIA";
        p.pci_vendor_id = hw::kPciVendorNvidia;
        p.compute_capability_major = d.cuda.cc_major;
        p.compute_capability_minor = d.cuda.cc_minor;
        p.total_memory_bytes = d.cuda.total_memory_bytes;
        p.multiprocessor_count = d.cuda.multiprocessor_count;
        break;
      case hw::DeviceKind::gaudi:
      case hw::DeviceKind::neuron:
        p.kind = d.kind == hw::DeviceKind::gaudi ? KILN_DEVICE_GAUDI : KILN_DEVICE_NEURON;
        p.vendor = d.kind == hw::DeviceKind::gaudi ? "Habana" : "AWS";
        p.pci_vendor_id = d.accel.pci_vendor_id;
        p.pci_device_id = d.accel.pci_device_id;
        break;
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<BackendCandidate> plugin_candidates(const PluginRegistry& registry,
                                                const std::vector<hw::Device>& devices) {
  const auto plugin_devices = to_plugin_devices(devices);
  std::vector<BackendCandidate> out;
  for (const auto& plugin : registry.plugins()) {
    PluginAvailability a = plugin->available(plugin_devices);  // never throws
    out.push_back({plugin->name(), a.available, a.reason, a.score});
  }
  return out;
}

std::vector<RefusedPlugin> refused_plugins(const PluginRegistry& registry) {
  std::vector<RefusedPlugin> out;
  for (const auto& f : registry.failures()) {
    const std::string file = f.path.substr(f.path.find_last_of('/') + 1);
    if (file.size() <= 11 || file.rfind("libkiln_", 0) != 0 || file.compare(file.size() - 3, 3, ".so") != 0) continue;
    const std::string name = file.substr(8, file.size() - 11);
    if (registry.find(name)) continue;  // a duplicate, or another file of a name that did load
    out.push_back({name, f.path, f.message});
  }
  return out;
}

}  // namespace kiln
