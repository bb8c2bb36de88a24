// The hardware probe: which devices this machine has, so that kiln can pick a backend and
// plugins can say whether they can run here. No LibTorch and no vendor headers: CUDA comes
// through the driver API loaded at run time, accelerators and the CPU description through sysfs
// and procfs, CPU instruction sets through CPUID with the OS-support check.
//
// Every file-system read goes through ProbeOptions::root, so a test (or a user with
// `kiln probe --sysfs-root DIR`) can describe any machine as a directory tree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::hw {

enum class DeviceKind { cpu, cuda, gaudi, neuron };

// "cpu", "cuda", "gaudi", "neuron": the names used in JSON and in the plugin ABI.
const char* to_string(DeviceKind kind);

// ---- CPU instruction sets ----

// The raw CPUID leaves and XCR0 the ISA decision is made from. The real machine fills this with
// read_cpuid(); tests build one by hand, e.g. "CPUID says AVX-512 but XCR0 leaves ZMM off".
struct CpuidLeaves {
  bool valid = false;           // false off x86 or when CPUID is unusable
  std::string vendor;           // leaf 0: "GenuineIntel", "AuthenticAMD"
  uint32_t max_leaf = 0;        // leaf 0 eax
  uint32_t leaf1_ecx = 0;       // bit 12 FMA, bit 27 OSXSAVE, bit 28 AVX
  uint32_t leaf7_ebx = 0;       // subleaf 0: bit 5 AVX2, bit 16 AVX512F
  uint32_t leaf7_ecx = 0;       // subleaf 0: bit 11 AVX512_VNNI
  uint32_t leaf7_edx = 0;       // subleaf 0: bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8
  uint32_t leaf7_1_eax = 0;     // subleaf 1: bit 5 AVX512_BF16
  uint64_t xcr0 = 0;            // xgetbv(0); meaningful only when OSXSAVE is set
  bool amx_permission = false;  // Linux granted ARCH_REQ_XCOMP_PERM for XTILEDATA
};

// CPUID, xgetbv and (when the CPU has AMX) the Linux AMX permission request for this process.
CpuidLeaves read_cpuid();

struct IsaFeatures {
  bool fma = false;
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
  // Features the CPU has but the OS has not enabled, each with why ("avx512f: CPUID reports it
  // but XCR0 does not enable the opmask/ZMM state (bits 5-7)").
  std::vector<std::string> disabled_by_os;
};

// A feature counts only when the CPU reports it AND the OS saves its registers: AVX needs XCR0
// bits 1-2, AVX-512 bits 5-7 as well, AMX bits 17-18 and the Linux permission.
IsaFeatures decode_isa(const CpuidLeaves& leaves);

// ---- Devices ----

struct CpuProps {
  std::string vendor;      // "GenuineIntel"
  std::string model_name;  // "Intel(R) Xeon(R) Platinum 8480+"
  int sockets = 0;
  int cores = 0;              // physical cores over all sockets
  int threads = 0;            // logical CPUs
  uint64_t l1d_bytes = 0;     // per core
  uint64_t l2_bytes = 0;      // per core (or per cluster, as sysfs reports it)
  uint64_t l3_bytes = 0;      // per cache instance, usually per socket or per CCX
  uint64_t memory_bytes = 0;  // installed system memory (MemTotal)
  IsaFeatures isa;
  std::string isa_source;  // "cpuid" (live, OS-checked) or "proc/cpuinfo flags" (a tree)
};

struct CudaProps {
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory_bytes = 0;  // 0 when read from a tree
  int multiprocessor_count = 0;     // 0 when read from a tree
};

// Gaudi and Neuron devices, as found on PCI.
struct AcceleratorProps {
  std::string generation;  // "Gaudi2", "Trainium2", ...
  uint16_t pci_vendor_id = 0;
  uint16_t pci_device_id = 0;
  std::string driver;      // bound kernel driver ("habanalabs", "neuron"); empty when unbound
  std::string class_node;  // "accel0" (/sys/class/accel) or "neuron3" (/sys/class/neuron_device)
  std::string dev_node;    // "/dev/accel/accel0" or "/dev/neuron3", relative to the root; empty if absent
};

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;           // per kind; CUDA ordinal for live CUDA devices, else by PCI bus id
  std::string name;        // "NVIDIA H200", "Intel Gaudi2", "AWS Trainium", the CPU model
  std::string pci_bus_id;  // "0000:17:00.0"; empty for the CPU
  CpuProps cpu;            // kind == cpu
  CudaProps cuda;          // kind == cuda
  AcceleratorProps accel;  // kind == gaudi or neuron
};

struct ProbeOptions {
  // The directory that stands for "/". Empty: $KILN_SYSFS_ROOT when set (the probe's test seam,
  // not a TrainingArguments setting), else "/". Any root other
  // than the real "/" describes a machine that is not this one, so CUDA devices then come from
  // the tree's PCI list (vendor 0x10de) rather than the driver, and the CPU's instruction sets
  // from the tree's /proc/cpuinfo flags.
  std::string root;
  // Overrides CPUID (tests). When set, it is used whatever the root.
  std::optional<CpuidLeaves> cpuid;
  // The CUDA driver library, for the live probe. Tests point it at a missing file.
  std::string cuda_library = "libcuda.so.1";
};

struct ProbeResult {
  std::string root;                   // the root actually used
  bool live = false;                  // root is the real "/": the driver and CPUID were asked
  std::vector<Device> devices;        // CPU first, then CUDA, Gaudi, Neuron, each by index
  std::string cuda_status;            // "2 devices (driver 12.4)" or "no CUDA driver (...)"
  std::vector<std::string> warnings;  // malformed or unreadable entries; never fatal

  int count(DeviceKind kind) const;
  const Device* first(DeviceKind kind) const;
};

// Never throws for anything found (or not found) on the machine; problems become warnings.
ProbeResult probe(const ProbeOptions& options = {});

// Names by PCI id, for the tree probe and for tests. nullopt for ids kiln does not know.
std::optional<std::string> gaudi_generation(uint16_t pci_device_id);
std::optional<std::string> neuron_generation(uint16_t pci_device_id);
std::optional<std::string> nvidia_name(uint16_t pci_device_id);

inline constexpr uint16_t kPciVendorNvidia = 0x10de;
inline constexpr uint16_t kPciVendorHabana = 0x1da3;
inline constexpr uint16_t kPciVendorAmazon = 0x1d0f;

}  // namespace kiln::hw
