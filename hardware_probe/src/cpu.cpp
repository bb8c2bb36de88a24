// The CPU as one device: what it is from /proc/cpuinfo, its shape and caches from
// /sys/devices/system/cpu, and its instruction sets from CPUID (live) or the kernel's flags (tree).
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "probe_internal.h"

namespace kiln::hw::detail {

namespace {

struct CpuinfoSummary {
  std::string vendor;
  std::string model_name;
  int processors = 0;
  std::set<int> physical_ids;
  std::set<std::pair<int, int>> cores;  // (physical id, core id)
  std::set<std::string> flags;          // of the first processor
};

CpuinfoSummary parse_cpuinfo(const std::string& text) {
  CpuinfoSummary s;
  std::istringstream in(text);
  std::string line;
  int phys = -1;
  bool first_flags = true;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon));
    std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      ++s.processors;
      phys = -1;
    } else if (key == "vendor_id" && s.vendor.empty()) {
      s.vendor = value;
    } else if (key == "model name" && s.model_name.empty()) {
      s.model_name = value;
    } else if (key == "physical id") {
      if (auto v = parse_int(value)) {
        phys = *v;
        s.physical_ids.insert(*v);
      }
    } else if (key == "core id") {
      if (auto v = parse_int(value)) s.cores.insert({phys, *v});
    } else if ((key == "flags" || key == "Features") && first_flags) {
      first_flags = false;
      std::istringstream f(value);
      std::string flag;
      while (f >> flag) s.flags.insert(flag);
    }
  }
  return s;
}

bool is_cpu_dir_name(const std::string& n) {
  if (n.size() < 4 || n.compare(0, 3, "cpu") != 0) return false;
  return std::all_of(n.begin() + 3, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void read_topology(const Tree& t, CpuProps& cpu) {
  const fs::path base = t.at("/sys/devices/system/cpu");
  std::set<int> packages;
  std::set<std::pair<int, int>> cores;
  int threads = 0;
  int bad = 0;
  for (const auto& name : list_dir(base)) {
    if (!is_cpu_dir_name(name)) continue;
    const fs::path topo = base / name / "topology";
    auto pkg_text = read_attr(t, topo / "physical_package_id");
    auto core_text = read_attr(t, topo / "core_id");
    if (!pkg_text || !core_text) continue;  // offline CPUs have no topology
    auto pkg = parse_int(*pkg_text);
    auto core = parse_int(*core_text);
    if (!pkg || !core) {
      if (bad++ == 0)
        t.warn("CPU topology in " + t.show(topo) + " is not numeric (physical_package_id " + printable(*pkg_text) +
               ", core_id " + printable(*core_text) + ")");
      continue;
    }
    ++threads;
    packages.insert(*pkg);
    cores.insert({*pkg, *core});
  }
  if (threads > 0) {
    cpu.threads = threads;
    cpu.sockets = static_cast<int>(packages.size());
    cpu.cores = static_cast<int>(cores.size());
  }
}

void read_caches(const Tree& t, CpuProps& cpu) {
  // cpu0 stands for all: kiln wants the per-core sizes that tiling decisions use.
  const fs::path base = t.at("/sys/devices/system/cpu/cpu0/cache");
  for (const auto& name : list_dir(base)) {
    if (name.rfind("index", 0) != 0) continue;
    const fs::path dir = base / name;
    auto level_text = read_attr(t, dir / "level");
    auto type_text = read_attr(t, dir / "type");
    auto size_text = read_attr(t, dir / "size");
    if (!level_text || !type_text || !size_text) continue;
    auto level = parse_int(*level_text);
    auto size = parse_size(*size_text);
    std::string type = trim(*type_text);
    if (!level || !size) {
      t.warn("cache description in " + t.show(dir) + " is malformed (level " + printable(*level_text) + ", size " +
             printable(*size_text) + ")");
      continue;
    }
    if (*level == 1 && type == "Data") cpu.l1d_bytes = *size;
    else if (*level == 2 && type != "Instruction") cpu.l2_bytes = *size;
    else if (*level == 3 && type != "Instruction") cpu.l3_bytes = *size;
  }
}

IsaFeatures isa_from_flags(const std::set<std::string>& flags) {
  // The kernel clears a flag when it has not enabled the matching XSAVE state, so these are
  // already OS-checked; AMX additionally needs the per-process permission, which a described
  // machine cannot be asked for.
  IsaFeatures f;
  f.fma = flags.count("fma") > 0;
  f.avx2 = flags.count("avx2") > 0;
  f.avx512f = flags.count("avx512f") > 0;
  f.avx512_bf16 = f.avx512f && flags.count("avx512_bf16") > 0;
  f.avx512_vnni = f.avx512f && flags.count("avx512_vnni") > 0;
  f.amx_tile = flags.count("amx_tile") > 0;
  f.amx_bf16 = f.amx_tile && flags.count("amx_bf16") > 0;
  f.amx_int8 = f.amx_tile && flags.count("amx_int8") > 0;
  return f;
}

}  // namespace

Device describe_cpu(const Tree& t, const ProbeOptions& options) {
  Device d;
  d.kind = DeviceKind::cpu;
  d.index = 0;
  CpuProps& cpu = d.cpu;

  CpuinfoSummary info;
  const fs::path cpuinfo_path = t.at("/proc/cpuinfo");
  std::string why;
  if (auto text = read_file(cpuinfo_path, &why)) {
    info = parse_cpuinfo(*text);
    if (info.processors == 0) t.warn(t.show(cpuinfo_path) + " lists no processor; the CPU description is incomplete");
  } else {
    t.warn("cannot read " + t.show(cpuinfo_path) + " (" + why + "); the CPU model is unknown");
  }
  cpu.vendor = info.vendor;
  cpu.model_name = info.model_name;

  read_topology(t, cpu);
  if (cpu.threads == 0 && info.processors > 0) {
    cpu.threads = info.processors;
    cpu.sockets = info.physical_ids.empty() ? 1 : static_cast<int>(info.physical_ids.size());
    cpu.cores = info.cores.empty() ? info.processors : static_cast<int>(info.cores.size());
  }
  read_caches(t, cpu);
  if (auto meminfo = read_attr(t, t.at("/proc/meminfo"))) {
    std::istringstream in(*meminfo);
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key) {
      if (key == "MemTotal:" && in >> kib >> unit) {
        cpu.memory_bytes = kib * 1024;
        break;
      }
      in.ignore(1 << 12, '\n');
    }
  }

  std::optional<CpuidLeaves> leaves = options.cpuid;
  if (!leaves && t.live) leaves = read_cpuid();
  if (leaves && leaves->valid) {
    cpu.isa = decode_isa(*leaves);
    cpu.isa_source = "cpuid";
    if (cpu.vendor.empty()) cpu.vendor = leaves->vendor;
  } else {
    cpu.isa = isa_from_flags(info.flags);
    cpu.isa_source = "proc/cpuinfo flags";
  }

  if (!cpu.model_name.empty()) d.name = cpu.model_name;
  else if (!cpu.vendor.empty()) d.name = cpu.vendor + " CPU";
  else d.name = "unknown CPU";
  return d;
}

}  // namespace kiln::hw::detail
