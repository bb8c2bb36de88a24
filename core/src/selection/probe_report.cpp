// What `kiln probe` prints: a readable table, or one JSON object (nlohmann/json, through
// kiln/internal/json_text.h, which also keeps a garbage model name from a described machine from
// making the document invalid).
#include <cstdio>
#include <sstream>

#include "kiln/internal/json_text.h"
#include "kiln/internal/selection.h"

namespace kiln {

namespace {

std::string hex4(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%04x", v);
  return b;
}

std::string bytes_text(uint64_t b) {
  if (b == 0) return "-";
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.0f MiB", b / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024.0);
  return buf;
}

std::vector<std::string> isa_list(const hw::IsaFeatures& f) {
  std::vector<std::string> v;
  if (f.fma) v.push_back("fma");
  if (f.avx2) v.push_back("avx2");
  if (f.avx512f) v.push_back("avx512f");
  if (f.avx512_bf16) v.push_back("avx512_bf16");
  if (f.avx512_vnni) v.push_back("avx512_vnni");
  if (f.amx_tile) v.push_back("amx_tile");
  if (f.amx_bf16) v.push_back("amx_bf16");
  if (f.amx_int8) v.push_back("amx_int8");
  return v;
}

Json device_json(const hw::Device& d) {
  Json j;
  j["kind"] = hw::to_string(d.kind);
  j["index"] = d.index;
  j["name"] = d.name;
  if (!d.pci_bus_id.empty()) j["pci_bus_id"] = d.pci_bus_id;
  switch (d.kind) {
    case hw::DeviceKind::cpu: {
      const auto& c = d.cpu;
      j["vendor"] = c.vendor;
      j["model_name"] = c.model_name;
      j["sockets"] = c.sockets;
      j["cores"] = c.cores;
      j["threads"] = c.threads;
      j["memory_bytes"] = c.memory_bytes;
      j["l1d_bytes"] = c.l1d_bytes;
      j["l2_bytes"] = c.l2_bytes;
      j["l3_bytes"] = c.l3_bytes;
      j["isa"] = {{"fma", c.isa.fma},
                  {"avx2", c.isa.avx2},
                  {"avx512f", c.isa.avx512f},
                  {"avx512_bf16", c.isa.avx512_bf16},
                  {"avx512_vnni", c.isa.avx512_vnni},
                  {"amx_tile", c.isa.amx_tile},
                  {"amx_bf16", c.isa.amx_bf16},
                  {"amx_int8", c.isa.amx_int8}};
      j["isa_source"] = c.isa_source;
      j["isa_disabled_by_os"] = c.isa.disabled_by_os;
      break;
    }
    case hw::DeviceKind::cuda:
      j["compute_capability"] = std::to_string(d.cuda.cc_major) + "." + std::to_string(d.cuda.cc_minor);
      j["total_memory_bytes"] = d.cuda.total_memory_bytes;
      j["multiprocessor_count"] = d.cuda.multiprocessor_count;
      break;
    case hw::DeviceKind::gaudi:
    case hw::DeviceKind::neuron:
      j["generation"] = d.accel.generation;
      j["pci_vendor_id"] = hex4(d.accel.pci_vendor_id);
      j["pci_device_id"] = hex4(d.accel.pci_device_id);
      j["driver"] = d.accel.driver;
      j["class_node"] = d.accel.class_node;
      j["dev_node"] = d.accel.dev_node;
      break;
  }
  return j;
}

std::string details(const hw::Device& d) {
  std::string s;
  switch (d.kind) {
    case hw::DeviceKind::cpu: {
      const auto& c = d.cpu;
      s = std::to_string(c.sockets) + " socket(s), " + std::to_string(c.cores) + " cores, " +
          std::to_string(c.threads) + " threads; L1d " + bytes_text(c.l1d_bytes) + ", L2 " + bytes_text(c.l2_bytes) +
          ", L3 " + bytes_text(c.l3_bytes) + "; memory " + bytes_text(c.memory_bytes);
      auto isa = isa_list(c.isa);
      std::string joined;
      for (const auto& f : isa) joined += (joined.empty() ? "" : " ") + f;
      s += "; ISA: " + (joined.empty() ? std::string("none of kiln's") : joined);
      break;
    }
    case hw::DeviceKind::cuda:
      s = "cc " + std::to_string(d.cuda.cc_major) + "." + std::to_string(d.cuda.cc_minor) + ", " +
          bytes_text(d.cuda.total_memory_bytes) + ", " +
          (d.cuda.multiprocessor_count ? std::to_string(d.cuda.multiprocessor_count) : std::string("-")) + " SMs";
      break;
    case hw::DeviceKind::gaudi:
    case hw::DeviceKind::neuron:
      s = "device id " + hex4(d.accel.pci_device_id) + ", driver " +
          (d.accel.driver.empty() ? std::string("none") : d.accel.driver) +
          (d.accel.dev_node.empty() ? "" : ", " + d.accel.dev_node);
      break;
  }
  return s;
}

}  // namespace

std::string probe_report_json(const ProbeReport& r) {
  Json j;
  j["sysfs_root"] = r.probe.root;
  j["live"] = r.probe.live;
  j["cuda_driver"] = r.probe.cuda_status;
  j["devices"] = Json::array();
  for (const auto& d : r.probe.devices) j["devices"].push_back(device_json(d));
  j["default_backend"] = r.choice.backend;
  j["requested_backend"] = r.choice.requested;
  j["reasons"] = r.choice.reasons;
  j["runners_up"] = r.choice.runners_up;
  j["order"] = r.choice.order;
  j["plugins"] = Json::array();
  for (const auto& p : r.plugins)
    j["plugins"].push_back(
        {{"name", p.name}, {"available", p.available}, {"score", static_cast<int>(p.score)}, {"reason", p.reason}});
  j["plugin_notes"] = r.plugin_notes;
  j["warnings"] = r.probe.warnings;
  return json_text(j, 2) + "\n";
}

std::string probe_report_text(const ProbeReport& r, bool explain) {
  std::ostringstream out;
  out << "Devices" << (r.probe.live ? "" : " (described by " + r.probe.root + ")") << ":\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-7s %-3s %-40s %-13s %s\n", "KIND", "#", "NAME", "PCI", "DETAILS");
  out << line;
  for (const auto& d : r.probe.devices) {
    std::snprintf(line, sizeof line, "  %-7s %-3d %-40s %-13s ", hw::to_string(d.kind), d.index, d.name.c_str(),
                  d.pci_bus_id.empty() ? "-" : d.pci_bus_id.c_str());
    out << line << details(d) << "\n";
  }
  out << "  CUDA: " << r.probe.cuda_status << "\n\n";
  out << "Default backend: " << r.choice.backend << "\n";
  if (explain) {
    for (const auto& reason : r.choice.reasons) out << "  - " << reason << "\n";
  } else if (!r.choice.reasons.empty()) {
    out << "  because " << r.choice.reasons.back() << "\n";
  }
  out << "  runners-up: ";
  if (r.choice.runners_up.empty()) out << "none";
  for (size_t i = 0; i < r.choice.runners_up.size(); ++i) out << (i ? ", " : "") << r.choice.runners_up[i];
  out << "\n";
  if (explain) {
    out << "\nPlugins:\n";
    if (r.plugins.empty()) out << "  none installed\n";
    for (const auto& p : r.plugins)
      out << "  " << p.name << ": " << (p.available ? "available" : "unavailable")
          << (p.reason.empty() ? "" : " (" + p.reason + ")") << "\n";
    for (const auto& n : r.plugin_notes) out << "  note: " << n << "\n";
  } else {
    out << "  (kiln probe --explain shows every reason)\n";
  }
  if (!r.probe.warnings.empty()) {
    out << "\nWarnings:\n";
    for (const auto& wmsg : r.probe.warnings) out << "  " << wmsg << "\n";
  }
  return out.str();
}

}  // namespace kiln
