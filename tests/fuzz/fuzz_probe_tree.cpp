// libFuzzer target: the hardware probe's readers of /proc and /sys (probe() under a root other than
// "/", as `kiln probe --sysfs-root DIR` and the tests use it). Each input becomes a machine's tree:
// a fixed skeleton (two PCI functions linked from /sys/bus/pci/devices, their driver links, an
// accel class device and a neuron_device entry, device nodes) whose files' contents come from the
// input. The probe must never throw or crash (malformed entries become warnings), and what it
// reports must keep its contract: the CPU first, then CUDA, Gaudi and Neuron devices, each kind
// numbered 0, 1, ...
//
// Input: a first byte choosing the two functions' drivers (2 bits each: none, nvidia, habanalabs,
// neuron) and whether the class links exist (bits 4, 5); then records, each a slot byte ('a' to
// 'p', or any byte modulo 16) followed by the file's bytes up to a NUL or the end.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/hardware_probe.h"

namespace fs = std::filesystem;

namespace {

const char* const kSlots[16] = {
    "proc/cpuinfo",
    "proc/meminfo",
    "sys/devices/system/cpu/cpu0/topology/physical_package_id",
    "sys/devices/system/cpu/cpu0/topology/core_id",
    "sys/devices/system/cpu/cpu1/topology/physical_package_id",
    "sys/devices/system/cpu/cpu1/topology/core_id",
    "sys/devices/system/cpu/cpu0/cache/index0/level",
    "sys/devices/system/cpu/cpu0/cache/index0/type",
    "sys/devices/system/cpu/cpu0/cache/index0/size",
    "sys/devices/system/cpu/cpu0/cache/index1/size",
    "sys/devices/pci0000:00/0000:17:00.0/vendor",
    "sys/devices/pci0000:00/0000:17:00.0/device",
    "sys/devices/pci0000:00/0000:17:00.0/class",
    "sys/devices/pci0000:00/0000:18:00.0/vendor",
    "sys/devices/pci0000:00/0000:18:00.0/device",
    "sys/devices/pci0000:00/0000:18:00.0/class",
};
const char* const kDrivers[4] = {"", "nvidia", "habanalabs", "neuron"};
const char* const kBuses[2] = {"0000:17:00.0", "0000:18:00.0"};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

void link(const std::string& target, const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::error_code ec;
  fs::create_symlink(target, p, ec);
}

std::string base_dir() {
  static const std::string dir = [] {
    std::string tmpl = (fs::exists("/dev/shm") ? std::string("/dev/shm") : fs::temp_directory_path().string()) +
                       "/kiln-fuzz-probe-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    return tmpl;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 1 << 14) return 0;
  const fs::path root = fs::path(base_dir()) / "root";
  std::error_code ec;
  fs::remove_all(root, ec);
  const unsigned config = data[0];
  for (int f = 0; f < 2; ++f) {
    const std::string bus = kBuses[f], dev = "sys/devices/pci0000:00/" + bus;
    fs::create_directories(root / dev);
    link("../../../devices/pci0000:00/" + bus, root / "sys/bus/pci/devices" / bus);
    const char* driver = kDrivers[(config >> (2 * f)) & 3];
    if (*driver) {
      fs::create_directories(root / "sys/bus/pci/drivers" / driver);
      link(std::string("../../../bus/pci/drivers/") + driver, root / dev / "driver");
    }
  }
  if (config & 16) {
    const fs::path cls = root / "sys/devices/pci0000:00/0000:17:00.0/accel/accel0";
    fs::create_directories(cls);
    link("../../../0000:17:00.0", cls / "device");
    link("../../devices/pci0000:00/0000:17:00.0/accel/accel0", root / "sys/class/accel/accel0");
    write(root / "dev/accel/accel0", "");
  }
  if (config & 32) {
    link("../../../devices/pci0000:00/0000:18:00.0", root / "sys/class/neuron_device/neuron0/device");
    write(root / "dev/neuron0", "");
  }
  for (size_t i = 1; i < size;) {
    const unsigned char k = data[i++];
    const int slot = k >= 'a' && k <= 'p' ? k - 'a' : k % 16;
    size_t end = i;
    while (end < size && data[end] != 0) ++end;
    write(root / kSlots[slot], std::string(reinterpret_cast<const char*>(data + i), end - i));
    i = end + 1;
  }
  kiln::hw::ProbeOptions options;
  options.root = root.string();
  options.cuda_library = "/nonexistent/libcuda.so.1";
  const kiln::hw::ProbeResult r = kiln::hw::probe(options);  // documented never to throw
  if (std::getenv("KILN_FUZZ_VERBOSE")) {
    for (const auto& d : r.devices)
      std::fprintf(stderr, "%s %d: %s\n", kiln::hw::to_string(d.kind), d.index, d.name.c_str());
    for (const auto& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  int next[4] = {0, 0, 0, 0};
  int last_kind = -1;
  for (const auto& d : r.devices) {
    const int kind = static_cast<int>(d.kind);
    if (kind < last_kind || d.index != next[kind]) {
      std::fprintf(stderr, "device order or numbering broken at %s %d (%s)\n", kiln::hw::to_string(d.kind), d.index,
                   d.name.c_str());
      std::abort();
    }
    last_kind = kind;
    ++next[kind];
  }
  if (r.devices.empty() || r.devices[0].kind != kiln::hw::DeviceKind::cpu) {
    std::fprintf(stderr, "no CPU first among %zu devices\n", r.devices.size());
    std::abort();
  }
  return 0;
}
