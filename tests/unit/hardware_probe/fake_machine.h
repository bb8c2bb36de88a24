// Builds a directory tree that describes a machine the way Linux's sysfs, procfs and /dev do, so
// the probe (and `kiln probe --sysfs-root`) can be tested on machines the CI does not have.
// The layout follows the kernel's: PCI functions live under /sys/devices/pci0000:00 and are
// linked from /sys/bus/pci/devices; drivers and class devices are links, as on a real system.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace kiln::testing {

struct CpuSpec {
  std::string vendor = "GenuineIntel";
  std::string model = "Intel(R) Xeon(R) Platinum 8480+";
  int sockets = 2;
  int cores_per_socket = 4;
  int threads_per_core = 2;
  std::string flags = "fpu sse sse2 avx avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8";
  std::string l1d = "48K", l2 = "2048K", l3 = "107520K";
  unsigned long long mem_kib = 2113470464ull;  // ~2 TiB
};

class FakeMachine {
 public:
  FakeMachine() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-fake-machine-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
  }
  ~FakeMachine() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  FakeMachine(const FakeMachine&) = delete;
  FakeMachine& operator=(const FakeMachine&) = delete;

  std::string root() const { return root_.string(); }
  std::filesystem::path path(const std::string& rel) const { return root_ / strip(rel); }

  void write(const std::string& rel, const std::string& text) {
    auto p = path(rel);
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void mkdir(const std::string& rel) { std::filesystem::create_directories(path(rel)); }
  // Creates `rel` as a symlink to `target` (taken literally, relative targets stay relative).
  void link(const std::string& target, const std::string& rel) {
    auto p = path(rel);
    std::filesystem::create_directories(p.parent_path());
    std::filesystem::create_symlink(target, p);
  }

  void cpu(const CpuSpec& s = {}) {
    std::string info;
    int cpu = 0;
    for (int t = 0; t < s.threads_per_core; ++t)
      for (int sock = 0; sock < s.sockets; ++sock)
        for (int core = 0; core < s.cores_per_socket; ++core, ++cpu) {
          info += "processor\t: " + std::to_string(cpu) + "\nvendor_id\t: " + s.vendor + "\nmodel name\t: " + s.model +
                  "\nphysical id\t: " + std::to_string(sock) + "\ncore id\t\t: " + std::to_string(core) +
                  "\nflags\t\t: " + s.flags + "\n\n";
          const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
          write(topo + "physical_package_id", std::to_string(sock) + "\n");
          write(topo + "core_id", std::to_string(core) + "\n");
        }
    write("/proc/cpuinfo", info);
    write("/proc/meminfo", "MemTotal:       " + std::to_string(s.mem_kib) + " kB\nMemFree:        1000 kB\n");
    cache(0, 1, "Data", s.l1d);
    cache(1, 1, "Instruction", "32K");
    cache(2, 2, "Unified", s.l2);
    cache(3, 3, "Unified", s.l3);
  }

  // One PCI function. `driver` empty: unbound.
  void pci(const std::string& bus, unsigned vendor, unsigned device, unsigned cls, const std::string& driver = "") {
    const std::string dev = "/sys/devices/pci0000:00/" + bus;
    write(dev + "/vendor", hex(vendor) + "\n");
    write(dev + "/device", hex(device) + "\n");
    write(dev + "/class", hex(cls, 6) + "\n");
    link("../../../devices/pci0000:00/" + bus, "/sys/bus/pci/devices/" + bus);
    if (!driver.empty()) {
      mkdir("/sys/bus/pci/drivers/" + driver);
      link("../../../bus/pci/drivers/" + driver, dev + "/driver");
    }
  }

  void nvidia_gpu(const std::string& bus, unsigned device_id = 0x2335) {
    pci(bus, 0x10de, device_id, 0x030200, "nvidia");
  }

  // A Gaudi as habanalabs presents it: the accel class device under the PCI function, linked
  // from /sys/class/accel, and its node in /dev/accel.
  void gaudi(const std::string& bus, unsigned device_id, int accel_index, bool dev_node = true) {
    pci(bus, 0x1da3, device_id, 0x120000, "habanalabs");
    const std::string name = "accel" + std::to_string(accel_index);
    const std::string cls = "/sys/devices/pci0000:00/" + bus + "/accel/" + name;
    mkdir(cls);
    link("../../../" + bus, cls + "/device");
    link("../../devices/pci0000:00/" + bus + "/accel/" + name, "/sys/class/accel/" + name);
    if (dev_node) write("/dev/accel/" + name, "");
  }

  // A Neuron device: class entry in /sys/class/neuron_device linking back to the PCI function.
  void neuron(const std::string& bus, unsigned device_id, int index) {
    pci(bus, 0x1d0f, device_id, 0x088000, "neuron");
    const std::string name = "neuron" + std::to_string(index);
    link("../../../devices/pci0000:00/" + bus, "/sys/class/neuron_device/" + name + "/device");
    write("/dev/" + name, "");
  }

  static std::string bus_id(int bus, int dev = 0, int fn = 0) {
    char b[32];
    std::snprintf(b, sizeof b, "0000:%02x:%02x.%x", bus, dev, fn);
    return b;
  }

 private:
  static std::string strip(std::string rel) {
    while (!rel.empty() && rel.front() == '/') rel.erase(rel.begin());
    return rel;
  }
  static std::string hex(unsigned v, int width = 4) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%0*x", width, v);
    return b;
  }
  void cache(int index, int level, const std::string& type, const std::string& size) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    write(dir + "level", std::to_string(level) + "\n");
    write(dir + "type", type + "\n");
    write(dir + "size", size + "\n");
  }

  std::filesystem::path root_;
};

}  // namespace kiln::testing
