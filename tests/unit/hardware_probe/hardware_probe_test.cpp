// The hardware probe on machines described as directory trees, the CPU ISA decision with its
// OS-support check, and the live CUDA probe (which skips, saying why, where there is no driver).
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "fake_machine.h"
#include "kiln/hardware_probe.h"

namespace {

using kiln::hw::CpuidLeaves;
using kiln::hw::Device;
using kiln::hw::DeviceKind;
using kiln::hw::ProbeOptions;
using kiln::hw::ProbeResult;
using kiln::testing::CpuSpec;
using kiln::testing::FakeMachine;

ProbeResult probe_tree(const FakeMachine& m) {
  ProbeOptions o;
  o.root = m.root();
  return kiln::hw::probe(o);
}

std::vector<const Device*> of_kind(const ProbeResult& r, DeviceKind k) {
  std::vector<const Device*> out;
  for (const auto& d : r.devices)
    if (d.kind == k) out.push_back(&d);
  return out;
}

bool any_warning_contains(const ProbeResult& r, const std::string& needle) {
  return std::any_of(r.warnings.begin(), r.warnings.end(),
                     [&](const std::string& w) { return w.find(needle) != std::string::npos; });
}

std::string all_warnings(const ProbeResult& r) {
  std::string s;
  for (const auto& w : r.warnings) s += "  " + w + "\n";
  return s;
}

// ---- Machines ----

TEST(Probe, ReportsOnlyTheCpuOnCpuOnlyTree) {
  FakeMachine m;
  CpuSpec spec;
  spec.model = "AMD EPYC 9654 96-Core Processor";
  spec.vendor = "AuthenticAMD";
  spec.sockets = 2;
  spec.cores_per_socket = 6;
  spec.threads_per_core = 2;
  spec.flags = "fpu sse2 avx avx2 avx512f avx512_bf16";
  spec.l1d = "32K";
  spec.l2 = "1024K";
  spec.l3 = "32768K";
  spec.mem_kib = 1584882688ull;
  m.cpu(spec);
  auto r = probe_tree(m);

  EXPECT_FALSE(r.live);
  ASSERT_EQ(r.devices.size(), 1u) << all_warnings(r);
  const Device& cpu = r.devices[0];
  EXPECT_EQ(cpu.kind, DeviceKind::cpu);
  EXPECT_EQ(cpu.index, 0);
  EXPECT_EQ(cpu.name, "AMD EPYC 9654 96-Core Processor");
  EXPECT_EQ(cpu.cpu.vendor, "AuthenticAMD");
  EXPECT_EQ(cpu.cpu.sockets, 2);
  EXPECT_EQ(cpu.cpu.cores, 12);
  EXPECT_EQ(cpu.cpu.threads, 24);
  EXPECT_EQ(cpu.cpu.l1d_bytes, 32u * 1024);
  EXPECT_EQ(cpu.cpu.l2_bytes, 1024u * 1024);
  EXPECT_EQ(cpu.cpu.l3_bytes, 32u * 1024 * 1024);
  EXPECT_EQ(cpu.cpu.memory_bytes, 1584882688ull * 1024);
  EXPECT_FALSE(cpu.cpu.isa.fma);  // not in this tree's flags
  EXPECT_TRUE(cpu.cpu.isa.avx2);
  EXPECT_TRUE(cpu.cpu.isa.avx512f);
  EXPECT_TRUE(cpu.cpu.isa.avx512_bf16);
  EXPECT_FALSE(cpu.cpu.isa.amx_bf16);
  EXPECT_FALSE(cpu.cpu.isa.amx_int8);
  EXPECT_EQ(cpu.cpu.isa_source, "proc/cpuinfo flags");
  EXPECT_TRUE(cpu.pci_bus_id.empty());
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
  EXPECT_NE(r.cuda_status.find("0 NVIDIA GPUs"), std::string::npos) << r.cuda_status;
}

TEST(Probe, ReportsTwoNvidiaGpusFromFakeTree) {
  FakeMachine m;
  m.cpu();
  m.nvidia_gpu("0000:17:00.0", 0x2335);
  m.nvidia_gpu("0000:65:00.0", 0x2bad);
  // The GPUs' HDMI audio function and a plain NIC: neither is a CUDA device.
  m.pci("0000:17:00.1", 0x10de, 0x22a3, 0x040300, "snd_hda_intel");
  m.pci("0000:03:00.0", 0x8086, 0x1572, 0x020000, "i40e");
  auto r = probe_tree(m);

  auto gpus = of_kind(r, DeviceKind::cuda);
  ASSERT_EQ(gpus.size(), 2u) << all_warnings(r);
  EXPECT_EQ(gpus[0]->index, 0);
  EXPECT_EQ(gpus[0]->name, "NVIDIA H200");
  EXPECT_EQ(gpus[0]->pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(gpus[0]->cuda.cc_major, 9);
  EXPECT_EQ(gpus[0]->cuda.cc_minor, 0);
  EXPECT_EQ(gpus[1]->index, 1);
  EXPECT_EQ(gpus[1]->name, "NVIDIA GPU 0x2bad");
  EXPECT_EQ(gpus[1]->pci_bus_id, "0000:65:00.0");
  EXPECT_EQ(r.count(DeviceKind::cpu), 1);
  EXPECT_EQ(r.devices.size(), 3u);
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
}

TEST(Probe, ReportsEightGaudi2FromFakeTree) {
  FakeMachine m;
  m.cpu();
  for (int i = 0; i < 8; ++i) m.gaudi(FakeMachine::bus_id(0x19 + 0x10 * i), 0x1020, i);
  auto r = probe_tree(m);

  auto g = of_kind(r, DeviceKind::gaudi);
  ASSERT_EQ(g.size(), 8u) << all_warnings(r);
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(g[i]->index, i);
    EXPECT_EQ(g[i]->name, "Intel Gaudi2");
    EXPECT_EQ(g[i]->accel.generation, "Gaudi2");
    EXPECT_EQ(g[i]->accel.pci_vendor_id, 0x1da3);
    EXPECT_EQ(g[i]->accel.pci_device_id, 0x1020);
    EXPECT_EQ(g[i]->accel.driver, "habanalabs");
    EXPECT_EQ(g[i]->pci_bus_id, FakeMachine::bus_id(0x19 + 0x10 * i));
    EXPECT_EQ(g[i]->accel.class_node, "accel" + std::to_string(i));
    EXPECT_EQ(g[i]->accel.dev_node, "/dev/accel/accel" + std::to_string(i));
  }
  EXPECT_EQ(r.count(DeviceKind::cuda), 0);
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
}

TEST(Probe, ReportsGaudi3FromFakeTree) {
  FakeMachine m;
  m.cpu();
  m.gaudi("0000:4d:00.0", 0x1060, 0);
  m.gaudi("0000:4e:00.0", 0x1063, 1);  // HL-338, the PCIe card
  auto r = probe_tree(m);
  auto g = of_kind(r, DeviceKind::gaudi);
  ASSERT_EQ(g.size(), 2u) << all_warnings(r);
  EXPECT_EQ(g[0]->accel.generation, "Gaudi3");
  EXPECT_EQ(g[0]->name, "Intel Gaudi3");
  EXPECT_EQ(g[1]->accel.generation, "Gaudi3");
  EXPECT_EQ(g[1]->accel.pci_device_id, 0x1063);
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
}

TEST(Probe, ReportsInferentia2FromFakeTree) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:00:1e.0", 0x7264, 0);
  // Amazon's vendor id also covers the ENA NIC and EBS NVMe: not Neuron devices, no warning.
  m.pci("0000:00:05.0", 0x1d0f, 0xec20, 0x020000, "ena");
  m.pci("0000:00:04.0", 0x1d0f, 0x8061, 0x010802, "nvme");
  auto r = probe_tree(m);
  auto n = of_kind(r, DeviceKind::neuron);
  ASSERT_EQ(n.size(), 1u) << all_warnings(r);
  EXPECT_EQ(n[0]->name, "AWS Inferentia2");
  EXPECT_EQ(n[0]->accel.generation, "Inferentia2");
  EXPECT_EQ(n[0]->accel.driver, "neuron");
  EXPECT_EQ(n[0]->accel.class_node, "neuron0");
  EXPECT_EQ(n[0]->accel.dev_node, "/dev/neuron0");
  EXPECT_EQ(n[0]->pci_bus_id, "0000:00:1e.0");
  EXPECT_EQ(r.devices.size(), 2u);
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
}

TEST(Probe, ReportsSixteenTrainiumFromTrn1Tree) {
  FakeMachine m;
  m.cpu();
  for (int i = 0; i < 16; ++i) m.neuron(FakeMachine::bus_id(0x10 + i, 0x1e), 0x7164, i);
  auto r = probe_tree(m);
  auto n = of_kind(r, DeviceKind::neuron);
  ASSERT_EQ(n.size(), 16u) << all_warnings(r);
  std::set<std::string> nodes;
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(n[i]->index, i);
    EXPECT_EQ(n[i]->accel.generation, "Trainium");
    EXPECT_EQ(n[i]->name, "AWS Trainium");
    nodes.insert(n[i]->accel.dev_node);
  }
  EXPECT_EQ(nodes.size(), 16u);
  EXPECT_TRUE(r.warnings.empty()) << all_warnings(r);
}

TEST(Probe, ReportsTrainium2FromFakeTree) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:a0:1e.0", 0x7364, 0);
  auto r = probe_tree(m);
  auto n = of_kind(r, DeviceKind::neuron);
  ASSERT_EQ(n.size(), 1u) << all_warnings(r);
  EXPECT_EQ(n[0]->accel.generation, "Trainium2");
  EXPECT_EQ(n[0]->accel.pci_device_id, 0x7364);
}

TEST(Probe, ReportsNvidiaAndGaudiInOneMachine) {
  FakeMachine m;
  m.cpu();
  m.nvidia_gpu("0000:17:00.0", 0x2330);
  m.gaudi("0000:33:00.0", 0x1020, 0);
  m.gaudi("0000:34:00.0", 0x1000, 1);
  auto r = probe_tree(m);
  ASSERT_EQ(r.count(DeviceKind::cuda), 1) << all_warnings(r);
  ASSERT_EQ(r.count(DeviceKind::gaudi), 2);
  EXPECT_EQ(r.first(DeviceKind::cuda)->name, "NVIDIA H100 80GB HBM3");
  auto g = of_kind(r, DeviceKind::gaudi);
  EXPECT_EQ(g[0]->accel.generation, "Gaudi2");
  EXPECT_EQ(g[1]->accel.generation, "Gaudi");
  // Order is fixed: CPU, CUDA, Gaudi, Neuron.
  EXPECT_EQ(r.devices[0].kind, DeviceKind::cpu);
  EXPECT_EQ(r.devices[1].kind, DeviceKind::cuda);
  EXPECT_EQ(r.devices[2].kind, DeviceKind::gaudi);
}

TEST(Probe, UsesKilnSysfsRootWhenNoRootIsGiven) {
  FakeMachine m;
  m.cpu();
  m.neuron("0000:00:1e.0", 0x7364, 0);
  ::setenv("KILN_SYSFS_ROOT", m.root().c_str(), 1);
  auto r = kiln::hw::probe(ProbeOptions{});
  ::unsetenv("KILN_SYSFS_ROOT");
  EXPECT_EQ(r.root, m.root());
  EXPECT_EQ(r.count(DeviceKind::neuron), 1);
}

// ---- Malformed trees: warnings, never a crash ----

TEST(ProbeMalformed, GarbageVendorFileIsWarnedAndSkipped) {
  FakeMachine m;
  m.cpu();
  m.gaudi("0000:19:00.0", 0x1020, 0);
  m.pci("0000:20:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  m.write("/sys/devices/pci0000:00/0000:20:00.0/vendor", "\x01\xffnot-hex\n");
  m.pci("0000:21:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  m.write("/sys/devices/pci0000:00/0000:21:00.0/device", "0x1020junk");
  m.pci("0000:22:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  m.write("/sys/devices/pci0000:00/0000:22:00.0/vendor", "0x123456789\n");
  auto r = probe_tree(m);
  EXPECT_EQ(r.count(DeviceKind::gaudi), 1) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:20:00.0: vendor file holds '\\x01\\xffnot-hex\\x0a'")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:21:00.0 (vendor 0x1da3): device file holds")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:22:00.0: vendor file holds")) << all_warnings(r);
}

TEST(ProbeMalformed, MissingFilesAreWarnedAndSkipped) {
  FakeMachine m;  // no CPU description at all
  m.pci("0000:20:00.0", 0x1d0f, 0x7164, 0x088000, "neuron");
  std::filesystem::remove(m.path("/sys/devices/pci0000:00/0000:20:00.0/device"));
  m.mkdir("/sys/devices/pci0000:00/0000:21:00.0");  // a PCI function with no files
  m.link("../../../devices/pci0000:00/0000:21:00.0", "/sys/bus/pci/devices/0000:21:00.0");
  auto r = probe_tree(m);
  EXPECT_EQ(r.count(DeviceKind::neuron), 0);
  ASSERT_EQ(r.count(DeviceKind::cpu), 1);
  EXPECT_EQ(r.first(DeviceKind::cpu)->name, "unknown CPU");
  EXPECT_TRUE(any_warning_contains(r, "cannot read /proc/cpuinfo (missing)")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:20:00.0 (vendor 0x1d0f): cannot read its device id (missing)"))
      << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:21:00.0: cannot read its vendor (missing)")) << all_warnings(r);
}

TEST(ProbeMalformed, UnreadableFilesAreWarnedNotFatal) {
  FakeMachine m;
  m.cpu();
  // A directory where the vendor file belongs, and a FIFO for a device id: neither may be read,
  // and the FIFO must not block the probe waiting for a writer.
  m.pci("0000:20:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  std::filesystem::remove(m.path("/sys/devices/pci0000:00/0000:20:00.0/vendor"));
  m.mkdir("/sys/devices/pci0000:00/0000:20:00.0/vendor");
  m.pci("0000:21:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  auto fifo = m.path("/sys/devices/pci0000:00/0000:21:00.0/device");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Permission bits; root reads through them, so this one only has to not crash.
  m.pci("0000:22:00.0", 0x1da3, 0x1020, 0x120000, "habanalabs");
  ::chmod(m.path("/sys/devices/pci0000:00/0000:22:00.0/device").c_str(), 0);
  // An unreadable cache size.
  std::filesystem::remove(m.path("/sys/devices/system/cpu/cpu0/cache/index2/size"));
  m.mkdir("/sys/devices/system/cpu/cpu0/cache/index2/size");

  auto r = probe_tree(m);
  EXPECT_TRUE(any_warning_contains(r, "0000:20:00.0: cannot read its vendor (a directory, not a file)"))
      << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:21:00.0 (vendor 0x1da3): cannot read its device id (not a regular file)"))
      << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "cannot read /sys/devices/system/cpu/cpu0/cache/index2/size")) << all_warnings(r);
  EXPECT_EQ(r.first(DeviceKind::cpu)->cpu.l2_bytes, 0u);
  EXPECT_EQ(r.first(DeviceKind::cpu)->cpu.l1d_bytes, 48u * 1024);
  if (::geteuid() != 0) {
    EXPECT_EQ(r.count(DeviceKind::gaudi), 0);
    EXPECT_TRUE(any_warning_contains(r, "0000:22:00.0 (vendor 0x1da3): cannot read its device id (Permission denied)"))
        << all_warnings(r);
  } else {
    EXPECT_EQ(r.count(DeviceKind::gaudi), 1);  // root reads through mode 000
  }
}

TEST(ProbeMalformed, SymlinkLoopsAreWarnedNotFollowedForever) {
  FakeMachine m;
  m.cpu();
  // A PCI entry that links to itself, a driver link that loops, a class link into a loop.
  m.link("0000:30:00.0", "/sys/bus/pci/devices/0000:30:00.0");
  m.link("loop-b", "/sys/loop-a");
  m.link("loop-a", "/sys/loop-b");
  m.link("../../../loop-a", "/sys/bus/pci/devices/0000:31:00.0");
  m.gaudi("0000:32:00.0", 0x1020, 0);
  std::filesystem::remove(m.path("/sys/devices/pci0000:00/0000:32:00.0/driver"));
  m.link("driver", "/sys/devices/pci0000:00/0000:32:00.0/driver");
  m.link("accel9", "/sys/class/accel/accel9");
  // The CPU directory itself loops.
  m.link("cpu99", "/sys/devices/system/cpu/cpu99");

  auto r = probe_tree(m);
  EXPECT_TRUE(any_warning_contains(r, "0000:30:00.0: cannot read its vendor (Too many levels of symbolic links)"))
      << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0000:31:00.0: cannot read its vendor")) << all_warnings(r);
  // The Gaudi whose driver link loops is still a Gaudi, reported as unbound.
  ASSERT_EQ(r.count(DeviceKind::gaudi), 1) << all_warnings(r);
  EXPECT_EQ(r.first(DeviceKind::gaudi)->accel.driver, "");
  EXPECT_TRUE(any_warning_contains(r, "0000:32:00.0: its driver link does not resolve")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "Intel Gaudi2 at 0000:32:00.0 is not bound to a driver")) << all_warnings(r);
  EXPECT_EQ(r.first(DeviceKind::cpu)->cpu.threads, 16);
}

TEST(ProbeMalformed, GarbageCpuTopologyAndCachesAreWarned) {
  FakeMachine m;
  m.cpu();
  m.write("/sys/devices/system/cpu/cpu3/topology/core_id", "three\n");
  m.write("/sys/devices/system/cpu/cpu0/cache/index3/size", "lots\n");
  m.write("/proc/cpuinfo", "this is not a cpuinfo file\n\x00\x01garbage");
  auto r = probe_tree(m);
  const Device* cpu = r.first(DeviceKind::cpu);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->name, "unknown CPU");
  EXPECT_EQ(cpu->cpu.threads, 15);  // cpu3 dropped
  EXPECT_EQ(cpu->cpu.l3_bytes, 0u);
  EXPECT_TRUE(any_warning_contains(r, "/sys/devices/system/cpu/cpu3/topology is not numeric")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "index3 is malformed")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "/proc/cpuinfo lists no processor")) << all_warnings(r);
}

TEST(ProbeMalformed, GoyaUnknownHabanaIdsAndUnboundDevicesAreWarned) {
  FakeMachine m;
  m.cpu();
  m.pci("0000:10:00.0", 0x1da3, 0x0001, 0x120000, "habanalabs");  // Goya
  m.pci("0000:11:00.0", 0x1da3, 0x7777, 0x120000, "habanalabs");
  m.pci("0000:12:00.0", 0x1da3, 0x1020, 0x120000);  // unbound Gaudi2
  m.gaudi("0000:13:00.0", 0x1020, 0, /*dev_node=*/false);
  m.pci("0000:14:00.0", 0x1d0f, 0x7364, 0x088000, "vfio-pci");  // passed through to a VM
  auto r = probe_tree(m);
  EXPECT_EQ(r.count(DeviceKind::gaudi), 2);
  EXPECT_EQ(r.count(DeviceKind::neuron), 1);
  EXPECT_TRUE(any_warning_contains(r, "0x0001 is Goya, an inference-only accelerator")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "0x7777 is not a Gaudi generation kiln knows")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "Intel Gaudi2 at 0000:12:00.0 is not bound to a driver")) << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "Intel Gaudi2 at 0000:13:00.0 has no device node under /dev/accel/ for accel0"))
      << all_warnings(r);
  EXPECT_TRUE(any_warning_contains(r, "AWS Trainium2 at 0000:14:00.0 is bound to 'vfio-pci', not neuron"))
      << all_warnings(r);
}

TEST(ProbeMalformed, MissingRootGivesAWarningAndAnUnknownCpu) {
  ProbeOptions o;
  o.root = "/nonexistent/kiln-probe-root";
  auto r = kiln::hw::probe(o);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].name, "unknown CPU");
  EXPECT_TRUE(any_warning_contains(r, "is not a directory")) << all_warnings(r);
}

TEST(ProbeMalformed, RandomBytesInEveryFileNeverCrash) {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 20; ++round) {
    FakeMachine m;
    m.cpu();
    m.nvidia_gpu("0000:17:00.0");
    m.gaudi("0000:19:00.0", 0x1020, 0);
    m.neuron("0000:1a:00.0", 0x7164, 0);
    std::vector<std::filesystem::path> files;
    for (auto it = std::filesystem::recursive_directory_iterator(m.root());
         it != std::filesystem::recursive_directory_iterator(); ++it)
      if (it->is_regular_file() && !it->is_symlink()) files.push_back(it->path());
    ASSERT_FALSE(files.empty());
    for (int k = 0; k < 10; ++k) {
      std::string junk(rng() % 64, '\0');
      for (auto& c : junk) c = static_cast<char>(rng());
      std::ofstream(files[rng() % files.size()], std::ios::binary) << junk;
    }
    auto r = probe_tree(m);
    ASSERT_EQ(r.count(DeviceKind::cpu), 1);
    EXPECT_LE(r.devices.size(), 4u);
  }
}

// ---- Instruction sets: a feature counts only when the OS enables its registers ----

CpuidLeaves sapphire_rapids(uint64_t xcr0, bool amx_permission = true) {
  CpuidLeaves l;
  l.valid = true;
  l.vendor = "GenuineIntel";
  l.max_leaf = 0x20;
  l.leaf1_ecx = (1u << 12) | (1u << 27) | (1u << 28);  // FMA, OSXSAVE, AVX
  l.leaf7_ebx = (1u << 5) | (1u << 16);                // AVX2, AVX512F
  l.leaf7_ecx = 1u << 11;                              // AVX512_VNNI
  l.leaf7_edx = (1u << 22) | (1u << 24) | (1u << 25);  // AMX-BF16, AMX-TILE, AMX-INT8
  l.leaf7_1_eax = 1u << 5;                             // AVX512_BF16
  l.xcr0 = xcr0;
  l.amx_permission = amx_permission;
  return l;
}
constexpr uint64_t kX87Sse = 0x3, kAvx = 0x4, kZmm = 0xe0, kTile = 0x60000;

TEST(Isa, Avx512FromCpuidWithoutXcr0ZmmStateIsNotReported) {
  auto f = kiln::hw::decode_isa(sapphire_rapids(kX87Sse | kAvx));
  EXPECT_TRUE(f.avx2);
  EXPECT_TRUE(f.fma);
  EXPECT_FALSE(f.avx512f);
  EXPECT_FALSE(f.avx512_vnni);
  EXPECT_FALSE(f.avx512_bf16);
  EXPECT_FALSE(f.amx_bf16);
  EXPECT_FALSE(f.amx_int8);
  ASSERT_FALSE(f.disabled_by_os.empty());
  EXPECT_EQ(f.disabled_by_os[0], "avx512f: CPUID reports it but XCR0 does not enable the opmask/ZMM state (bits 5-7)");
}

TEST(Isa, PartialZmmStateIsNotEnough) {
  // Opmask on, the upper ZMM halves off: still no AVX-512.
  auto f = kiln::hw::decode_isa(sapphire_rapids(kX87Sse | kAvx | 0x20));
  EXPECT_FALSE(f.avx512f);
  EXPECT_TRUE(f.avx2);
}

TEST(Isa, EverythingReportedWhenTheOsEnablesAllState) {
  auto f = kiln::hw::decode_isa(sapphire_rapids(kX87Sse | kAvx | kZmm | kTile));
  EXPECT_TRUE(f.fma);
  EXPECT_TRUE(f.avx2);
  EXPECT_TRUE(f.avx512f);
  EXPECT_TRUE(f.avx512_bf16);
  EXPECT_TRUE(f.avx512_vnni);
  EXPECT_TRUE(f.amx_tile);
  EXPECT_TRUE(f.amx_bf16);
  EXPECT_TRUE(f.amx_int8);
  EXPECT_TRUE(f.disabled_by_os.empty());
}

TEST(Isa, NothingVectorWithoutOsxsaveWhateverXcr0Says) {
  auto l = sapphire_rapids(kX87Sse | kAvx | kZmm | kTile);
  l.leaf1_ecx &= ~(1u << 27);
  auto f = kiln::hw::decode_isa(l);
  EXPECT_FALSE(f.avx2);
  EXPECT_FALSE(f.avx512f);
  EXPECT_FALSE(f.amx_bf16);
  EXPECT_NE(f.disabled_by_os[0].find("OSXSAVE = 0"), std::string::npos) << f.disabled_by_os[0];
}

TEST(Isa, AmxNeedsTileStateAndTheLinuxPermission) {
  auto no_perm = kiln::hw::decode_isa(sapphire_rapids(kX87Sse | kAvx | kZmm | kTile, false));
  EXPECT_TRUE(no_perm.avx512f);
  EXPECT_FALSE(no_perm.amx_bf16);
  EXPECT_FALSE(no_perm.amx_int8);
  EXPECT_NE(no_perm.disabled_by_os.back().find("ARCH_REQ_XCOMP_PERM"), std::string::npos);
  auto no_tile = kiln::hw::decode_isa(sapphire_rapids(kX87Sse | kAvx | kZmm | 0x20000, true));
  EXPECT_FALSE(no_tile.amx_bf16);
  EXPECT_NE(no_tile.disabled_by_os.back().find("bits 17-18"), std::string::npos);
}

TEST(Isa, InjectedCpuidWinsOverTheTreeFlags) {
  // /proc/cpuinfo says avx512f, but the injected CPU has an OS without ZMM state.
  FakeMachine m;
  m.cpu();
  ProbeOptions o;
  o.root = m.root();
  o.cpuid = sapphire_rapids(kX87Sse | kAvx);
  auto r = kiln::hw::probe(o);
  const auto& isa = r.first(DeviceKind::cpu)->cpu.isa;
  EXPECT_EQ(r.first(DeviceKind::cpu)->cpu.isa_source, "cpuid");
  EXPECT_TRUE(isa.avx2);
  EXPECT_FALSE(isa.avx512f);
  EXPECT_FALSE(isa.avx512_bf16);
  EXPECT_FALSE(isa.amx_bf16);
}

TEST(Isa, LiveCpuidAgreesWithTheKernelsFlags) {
  // Linux clears a flag in /proc/cpuinfo when it has not enabled the XSAVE state behind it, so
  // the OS-checked CPUID decision must agree with the kernel on this very machine.
  auto leaves = kiln::hw::read_cpuid();
  if (!leaves.valid) GTEST_SKIP() << "not an x86 CPU: CPUID is unavailable";
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  ASSERT_FALSE(flags.empty());
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  auto isa = kiln::hw::decode_isa(leaves);
  EXPECT_EQ(isa.avx2, has("avx2"));
  EXPECT_EQ(isa.avx512f, has("avx512f"));
  EXPECT_EQ(isa.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(isa.fma, has("fma"));
  EXPECT_EQ(isa.avx512_vnni, has("avx512_vnni"));
  EXPECT_EQ(isa.amx_bf16, has("amx_bf16") && has("amx_tile"));
}

// ---- CUDA through the driver ----

TEST(Cuda, MissingDriverLibrarySaysNoDriver) {
  ProbeOptions o;
  o.root = "/";
  o.cuda_library = "libkiln-no-such-cuda.so.1";
  auto r = kiln::hw::probe(o);
  EXPECT_TRUE(r.live);
  EXPECT_EQ(r.cuda_status, "no CUDA driver (libkiln-no-such-cuda.so.1 not found)");
  EXPECT_EQ(r.count(DeviceKind::cuda), 0);
  EXPECT_EQ(r.count(DeviceKind::cpu), 1);
}

// The GPU machine lends an H100 (80 GB HBM3) or an H200 (141 GB HBM3e), both Hopper SXM parts with
// 132 multiprocessors; the probe must report whichever it is with its real properties.
TEST(Cuda, FindsTheHopperGpuWithItsRealProperties) {
  ProbeOptions o;
  o.root = "/";
  auto r = kiln::hw::probe(o);
  if (r.cuda_status.rfind("no CUDA driver", 0) == 0) GTEST_SKIP() << r.cuda_status;
  auto gpus = of_kind(r, DeviceKind::cuda);
  ASSERT_FALSE(gpus.empty()) << r.cuda_status << "\n" << all_warnings(r);
  const Device& g = *gpus[0];
  std::cout << "[ probe    ] " << g.name << ", cc " << g.cuda.cc_major << "." << g.cuda.cc_minor << ", "
            << g.cuda.total_memory_bytes << " bytes, " << g.cuda.multiprocessor_count << " SMs, PCI " << g.pci_bus_id
            << " (" << r.cuda_status << ")\n";
  const bool h200 = g.name.find("H200") != std::string::npos, h100 = g.name.find("H100") != std::string::npos;
  ASSERT_TRUE(h200 || h100) << g.name;
  EXPECT_EQ(g.cuda.cc_major, 9);
  EXPECT_EQ(g.cuda.cc_minor, 0);
  if (h200) {
    // "141 GB" on the box; the driver reports the usable HBM3e, about 140 GiB.
    EXPECT_GT(g.cuda.total_memory_bytes, 130ull << 30);
    EXPECT_LT(g.cuda.total_memory_bytes, 150ull << 30);
  } else {
    // "80 GB" of HBM3; the driver reports about 79 GiB.
    EXPECT_GT(g.cuda.total_memory_bytes, 75ull << 30);
    EXPECT_LT(g.cuda.total_memory_bytes, 82ull << 30);
  }
  EXPECT_EQ(g.cuda.multiprocessor_count, 132);
  EXPECT_EQ(g.pci_bus_id.size(), 12u) << g.pci_bus_id;  // "0000:17:00.0"
  EXPECT_EQ(g.index, 0);
}

}  // namespace
