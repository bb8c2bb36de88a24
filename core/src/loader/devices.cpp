// Device lists as plugins see them: the C form (KilnDeviceInfo) and the minimal CPU-only list that
// `kiln plugins` uses where the hardware probe's list is not at hand.
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/internal/plugin_registry.h"

namespace kiln {

DeviceInfoArray::DeviceInfoArray(std::vector<PluginDevice> devices) : devices_(std::move(devices)) {
  infos_.reserve(devices_.size());
  for (const auto& d : devices_) {
    KilnDeviceInfo info{};
    info.struct_size = KILN_DEVICE_INFO_STRUCT_SIZE;
    info.kind = d.kind;
    info.index = d.index;
    info.name = d.name.c_str();
    info.vendor = d.vendor.c_str();
    info.pci_bus_id = d.pci_bus_id.c_str();
    info.pci_vendor_id = d.pci_vendor_id;
    info.pci_device_id = d.pci_device_id;
    info.compute_capability_major = d.compute_capability_major;
    info.compute_capability_minor = d.compute_capability_minor;
    info.total_memory_bytes = d.total_memory_bytes;
    info.multiprocessor_count = d.multiprocessor_count;
    info.cpu_isa = d.cpu_isa;
    infos_.push_back(info);
  }
  for (const auto& i : infos_) pointers_.push_back(&i);
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

PluginDevice cpu_device_from_proc(const std::string& cpuinfo, const std::string& meminfo) {
  PluginDevice d;
  d.kind = KILN_DEVICE_CPU;
  d.index = 0;
  int processors = 0;
  std::istringstream in(cpuinfo);
  std::string line;
  bool flags_seen = false;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon));
    std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      ++processors;
    } else if (key == "vendor_id" && d.vendor.empty()) {
      d.vendor = value;
    } else if (key == "model name" && d.name.empty()) {
      d.name = value;
    } else if ((key == "flags") && !flags_seen) {
      // The kernel leaves out features whose register state it does not enable, so these flags
      // already include the OS-support check.
      flags_seen = true;
      std::istringstream fl(value);
      std::string f;
      while (fl >> f) {
        if (f == "avx2") d.cpu_isa |= KILN_CPU_ISA_AVX2;
        else if (f == "avx512f") d.cpu_isa |= KILN_CPU_ISA_AVX512F;
        else if (f == "avx512_bf16") d.cpu_isa |= KILN_CPU_ISA_AVX512_BF16;
        else if (f == "amx_bf16") d.cpu_isa |= KILN_CPU_ISA_AMX_BF16;
        else if (f == "amx_int8") d.cpu_isa |= KILN_CPU_ISA_AMX_INT8;
        else if (f == "amx_tile") d.cpu_isa |= KILN_CPU_ISA_AMX_TILE;
        else if (f == "fma") d.cpu_isa |= KILN_CPU_ISA_FMA;
        else if (f == "avx512_vnni") d.cpu_isa |= KILN_CPU_ISA_AVX512_VNNI;
      }
    } else if (key == "CPU implementer" && d.vendor.empty()) {
      d.vendor = "ARM implementer " + value;  // aarch64 has no vendor_id line
    }
  }
  d.multiprocessor_count = processors;
  std::istringstream mem(meminfo);
  while (std::getline(mem, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream v(line.substr(9));
      uint64_t kb = 0;
      v >> kb;
      d.total_memory_bytes = kb * 1024;
      break;
    }
  }
  return d;
}

std::vector<PluginDevice> basic_cpu_devices() {
  PluginDevice cpu = cpu_device_from_proc(read_file("/proc/cpuinfo"), read_file("/proc/meminfo"));
  if (cpu.multiprocessor_count == 0)
    cpu.multiprocessor_count = static_cast<int32_t>(std::thread::hardware_concurrency());
  return {cpu};
}

std::string device_kinds_string(uint32_t mask) {
  std::string s;
  for (KilnDeviceKind k : {KILN_DEVICE_CPU, KILN_DEVICE_CUDA, KILN_DEVICE_GAUDI, KILN_DEVICE_NEURON}) {
    if (mask & KILN_DEVICE_KIND_BIT(k)) {
      if (!s.empty()) s += ",";
      s += k == KILN_DEVICE_CPU ? "cpu" : k == KILN_DEVICE_CUDA ? "cuda" : k == KILN_DEVICE_GAUDI ? "gaudi" : "neuron";
    }
  }
  return s;
}

std::string modes_string(uint32_t mask) {
  static const char* names[] = {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"};
  std::string s;
  for (int m = 0; m < 4; ++m) {
    if (mask & KILN_MODE_BIT(m)) {
      if (!s.empty()) s += ",";
      s += names[m];
    }
  }
  return s;
}

}  // namespace kiln
