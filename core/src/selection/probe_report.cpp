// What `kiln probe` prints: a readable table or one JSON object. The JSON is written by hand with
// a small writer (kiln takes no JSON dependency); every string goes through one escaping function.
#include <cstdio>
#include <sstream>

#include "kiln/internal/json_text.h"
#include "kiln/internal/selection.h"

namespace kiln {

namespace {

// Bytes that are not valid UTF-8 (a garbage model name in a described machine) become U+FFFD so
// the document stays valid JSON.
std::string valid_utf8(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

// Objects and arrays with commas and indentation handled in one place.
class JsonWriter {
 public:
  std::string str() const { return out_.str(); }
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(const std::string& k) {
    item();
    out_ << json_quote(k) << ": ";
    after_key_ = true;
  }
  void value(const std::string& v) { raw(json_quote(valid_utf8(v))); }
  void value(const char* v) { value(std::string(v)); }
  void value(bool v) { raw(v ? "true" : "false"); }
  void value(int v) { raw(std::to_string(v)); }
  void value(uint64_t v) { raw(std::to_string(v)); }
  template <typename T>
  void field(const std::string& k, const T& v) {
    key(k);
    value(v);
  }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k);
    begin_array();
    for (const auto& s : v) value(s);
    end_array();
  }

 private:
  void raw(const std::string& s) {
    item();
    out_ << s;
  }
  void item() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ << ",";
      first_.back() = false;
      out_ << "\n" << std::string(2 * first_.size(), ' ');
    }
  }
  void open(char c) {
    item();
    out_ << c;
    first_.push_back(true);
  }
  void close(char c) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) out_ << "\n" << std::string(2 * first_.size(), ' ');
    out_ << c;
  }
  std::ostringstream out_;
  std::vector<bool> first_;  // per open container: no item written yet
  bool after_key_ = false;
};

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

void write_device(JsonWriter& w, const hw::Device& d) {
  w.begin_object();
  w.field("kind", hw::to_string(d.kind));
  w.field("index", d.index);
  w.field("name", d.name);
  if (!d.pci_bus_id.empty()) w.field("pci_bus_id", d.pci_bus_id);
  switch (d.kind) {
    case hw::DeviceKind::cpu: {
      const auto& c = d.cpu;
      w.field("vendor", c.vendor);
      w.field("model_name", c.model_name);
      w.field("sockets", c.sockets);
      w.field("cores", c.cores);
      w.field("threads", c.threads);
      w.field("memory_bytes", c.memory_bytes);
      w.field("l1d_bytes", c.l1d_bytes);
      w.field("l2_bytes", c.l2_bytes);
      w.field("l3_bytes", c.l3_bytes);
      w.key("isa");
      w.begin_object();
      w.field("fma", c.isa.fma);
      w.field("avx2", c.isa.avx2);
      w.field("avx512f", c.isa.avx512f);
      w.field("avx512_bf16", c.isa.avx512_bf16);
      w.field("avx512_vnni", c.isa.avx512_vnni);
      w.field("amx_tile", c.isa.amx_tile);
      w.field("amx_bf16", c.isa.amx_bf16);
      w.field("amx_int8", c.isa.amx_int8);
      w.end_object();
      w.field("isa_source", c.isa_source);
      w.strings("isa_disabled_by_os", c.isa.disabled_by_os);
      break;
    }
    case hw::DeviceKind::cuda:
      w.field("compute_capability", std::to_string(d.cuda.cc_major) + "." + std::to_string(d.cuda.cc_minor));
      w.field("total_memory_bytes", d.cuda.total_memory_bytes);
      w.field("multiprocessor_count", d.cuda.multiprocessor_count);
      break;
    case hw::DeviceKind::gaudi:
    case hw::DeviceKind::neuron:
      w.field("generation", d.accel.generation);
      w.field("pci_vendor_id", hex4(d.accel.pci_vendor_id));
      w.field("pci_device_id", hex4(d.accel.pci_device_id));
      w.field("driver", d.accel.driver);
      w.field("class_node", d.accel.class_node);
      w.field("dev_node", d.accel.dev_node);
      break;
  }
  w.end_object();
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
  JsonWriter w;
  w.begin_object();
  w.field("sysfs_root", r.probe.root);
  w.field("live", r.probe.live);
  w.field("cuda_driver", r.probe.cuda_status);
  w.key("devices");
  w.begin_array();
  for (const auto& d : r.probe.devices) write_device(w, d);
  w.end_array();
  w.field("default_backend", r.choice.backend);
  w.field("requested_backend", r.choice.requested);
  w.strings("reasons", r.choice.reasons);
  w.strings("runners_up", r.choice.runners_up);
  w.strings("order", r.choice.order);
  w.key("plugins");
  w.begin_array();
  for (const auto& p : r.plugins) {
    w.begin_object();
    w.field("name", p.name);
    w.field("available", p.available);
    w.field("score", static_cast<int>(p.score));
    w.field("reason", p.reason);
    w.end_object();
  }
  w.end_array();
  w.strings("plugin_notes", r.plugin_notes);
  w.strings("warnings", r.probe.warnings);
  w.end_object();
  return w.str() + "\n";
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
