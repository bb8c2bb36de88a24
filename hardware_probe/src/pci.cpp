// Accelerators found on PCI: Intel Gaudi (vendor 0x1da3), AWS Neuron (0x1d0f) and, for a
// described machine, NVIDIA GPUs (0x10de). IDs are those the vendors' own drivers match on
// (habanalabs' and the Neuron driver's PCI id tables); see docs/hardware-probe.md.
#include <algorithm>
#include <map>

#include "probe_internal.h"

namespace kiln::hw {

std::optional<std::string> gaudi_generation(uint16_t id) {
  switch (id) {
    case 0x1000:  // HL-2000
    case 0x1001:  // HL-2000M
    case 0x1010:  // secured
    case 0x1011:  // HL-2000M secured
      return "Gaudi";
    case 0x1020:
    case 0x1021:  // HL-288
      return "Gaudi2";
    case 0x1060:
    case 0x1062:  // single die
    case 0x1063:  // HL-338
      return "Gaudi3";
    default: return std::nullopt;
  }
}

std::optional<std::string> neuron_generation(uint16_t id) {
  switch (id) {
    case 0x7064:
    case 0x7065:
    case 0x7066:
    case 0x7067: return "Inferentia";
    case 0x7264: return "Inferentia2";
    case 0x7164: return "Trainium";
    case 0x7364: return "Trainium2";
    default: return std::nullopt;
  }
}

namespace {
struct NvidiaModel {
  uint16_t id;
  const char* name;  // as the CUDA driver names it
  int cc_major, cc_minor;
};
// A few data-centre parts, so a described machine reads like the real one; any other NVIDIA
// display-class function is still a CUDA device, named by its id.
constexpr NvidiaModel kNvidiaModels[] = {
    {0x2335, "NVIDIA H200", 9, 0},           {0x2330, "NVIDIA H100 80GB HBM3", 9, 0},
    {0x2331, "NVIDIA H100 PCIe", 9, 0},      {0x20b0, "NVIDIA A100-SXM4-40GB", 8, 0},
    {0x20b2, "NVIDIA A100-SXM4-80GB", 8, 0}, {0x20f1, "NVIDIA A100-PCIE-40GB", 8, 0},
    {0x26b9, "NVIDIA L40S", 8, 9},           {0x1db1, "Tesla V100-SXM2-16GB", 7, 0},
};
const NvidiaModel* nvidia_model(uint16_t id) {
  for (const auto& m : kNvidiaModels)
    if (m.id == id) return &m;
  return nullptr;
}
}  // namespace

std::optional<std::string> nvidia_name(uint16_t id) {
  if (const auto* m = nvidia_model(id)) return std::string(m->name);
  return std::nullopt;
}

namespace detail {

std::vector<PciFunction> scan_pci(const Tree& t) {
  std::vector<PciFunction> out;
  const fs::path base = t.at("/sys/bus/pci/devices");
  std::string why;
  auto names = list_dir(base, &why);
  if (names.empty() && !why.empty() && why != "missing") t.warn("cannot list " + t.show(base) + ": " + why);
  for (const auto& name : names) {
    PciFunction f;
    f.bus_id = name;
    f.dir = base / name;
    std::string err;
    auto vendor_text = read_file(f.dir / "vendor", &err);
    if (!vendor_text) {
      t.warn("PCI device " + name + ": cannot read its vendor (" + err + "); skipped");
      continue;
    }
    auto vendor = parse_hex(*vendor_text);
    if (!vendor || *vendor > 0xffff) {
      t.warn("PCI device " + name + ": vendor file holds " + printable(*vendor_text) +
             ", not a 16-bit hex id; skipped");
      continue;
    }
    f.vendor = static_cast<uint16_t>(*vendor);
    // Only the vendors kiln cares about need a device id; others are not even read.
    if (f.vendor != kPciVendorNvidia && f.vendor != kPciVendorHabana && f.vendor != kPciVendorAmazon) continue;
    auto device_text = read_file(f.dir / "device", &err);
    if (!device_text) {
      t.warn("PCI device " + name + " (vendor " + hex4(f.vendor) + "): cannot read its device id (" + err +
             "); skipped");
      continue;
    }
    auto device = parse_hex(*device_text);
    if (!device || *device > 0xffff) {
      t.warn("PCI device " + name + " (vendor " + hex4(f.vendor) + "): device file holds " + printable(*device_text) +
             ", not a 16-bit hex id; skipped");
      continue;
    }
    f.device = static_cast<uint16_t>(*device);
    if (auto cls = read_attr(t, f.dir / "class")) {
      if (auto c = parse_hex(*cls)) f.class_code = *c;
      else t.warn("PCI device " + name + ": class file holds " + printable(*cls) + "; ignored");
    }
    if (auto drv = link_target_name(f.dir / "driver")) {
      if (path_exists(f.dir / "driver")) f.driver = *drv;
      else t.warn("PCI device " + name + ": its driver link does not resolve; taken as unbound");
    }
    out.push_back(std::move(f));
  }
  return out;
}

bool is_nvidia_gpu(const PciFunction& f) {
  if (f.vendor != kPciVendorNvidia) return false;
  // Display controllers (class 0x03xxxx): VGA 0x0300 and 3D 0x0302. NVIDIA's HDMI audio
  // functions and NVSwitch bridges share the vendor id and are not GPUs.
  if (!f.class_code) return true;
  return ((*f.class_code >> 16) & 0xff) == 0x03;
}

std::vector<Device> cuda_from_pci(const Tree&, const std::vector<PciFunction>& pci) {
  std::vector<Device> out;
  for (const auto& f : pci) {
    if (!is_nvidia_gpu(f)) continue;
    Device d;
    d.kind = DeviceKind::cuda;
    d.index = static_cast<int>(out.size());
    d.pci_bus_id = f.bus_id;
    if (const auto* m = nvidia_model(f.device)) {
      d.name = m->name;
      d.cuda.cc_major = m->cc_major;
      d.cuda.cc_minor = m->cc_minor;
    } else {
      d.name = "NVIDIA GPU " + hex4(f.device);
    }
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

// Maps PCI bus id -> class device name ("accel0") from /sys/class/<cls>/<prefix>N/device links.
std::map<std::string, std::string> class_nodes(const Tree& t, const std::string& cls, const std::string& prefix) {
  std::map<std::string, std::string> by_bus;
  const fs::path base = t.at("/sys/class/" + cls);
  for (const auto& name : list_dir(base)) {
    if (name.rfind(prefix, 0) != 0) continue;
    if (auto bus = link_target_name(base / name / "device")) by_bus.emplace(*bus, name);
  }
  return by_bus;
}

struct AccelFamily {
  DeviceKind kind;
  uint16_t vendor;
  const char* vendor_name;  // "Intel", "AWS"
  const char* driver;       // expected kernel driver
  std::optional<std::string> (*generation)(uint16_t);
  const char* class_dir;     // /sys/class/<class_dir>
  const char* class_prefix;  // entry prefix in it
  const char* dev_dir;       // where the node lives: /dev/accel/accelN or /dev/neuronN
};

std::vector<Device> accelerators(const Tree& t, const std::vector<PciFunction>& pci, const AccelFamily& fam) {
  std::vector<Device> out;
  auto nodes = class_nodes(t, fam.class_dir, fam.class_prefix);
  for (const auto& f : pci) {
    if (f.vendor != fam.vendor) continue;
    auto gen = fam.generation(f.device);
    if (!gen) {
      if (fam.kind == DeviceKind::gaudi) {
        // Goya (0x0001) is Habana's inference card: habanalabs drives it but nothing trains on it.
        t.warn("PCI device " + f.bus_id + ": Habana device id " + hex4(f.device) +
               (f.device == 0x0001 ? " is Goya, an inference-only accelerator; ignored"
                                   : " is not a Gaudi generation kiln knows; ignored"));
      }
      // Amazon's vendor id also covers ENA NICs and EBS NVMe controllers: silently not Neuron.
      continue;
    }
    Device d;
    d.kind = fam.kind;
    d.index = static_cast<int>(out.size());
    d.pci_bus_id = f.bus_id;
    d.name = std::string(fam.vendor_name) + " " + *gen;
    d.accel.generation = *gen;
    d.accel.pci_vendor_id = f.vendor;
    d.accel.pci_device_id = f.device;
    d.accel.driver = f.driver;

    // The class device: a subdirectory of the PCI device (as the kernel lays it out) or a link
    // from /sys/class back to it.
    for (const auto& sub : list_dir(f.dir / fam.class_dir)) {
      if (sub.rfind(fam.class_prefix, 0) == 0) {
        d.accel.class_node = sub;
        break;
      }
    }
    if (d.accel.class_node.empty()) {
      auto it = nodes.find(f.bus_id);
      if (it != nodes.end()) d.accel.class_node = it->second;
    }
    if (!d.accel.class_node.empty()) {
      std::string dev = std::string(fam.dev_dir) + d.accel.class_node;
      if (path_exists(t.at(dev))) d.accel.dev_node = dev;
    }

    if (f.driver.empty()) {
      t.warn(d.name + " at " + f.bus_id + " is not bound to a driver (expected " + fam.driver +
             "); the runtime will not see it");
    } else if (f.driver != fam.driver) {
      t.warn(d.name + " at " + f.bus_id + " is bound to '" + f.driver + "', not " + fam.driver);
    } else if (d.accel.dev_node.empty()) {
      t.warn(d.name + " at " + f.bus_id + " has no device node under " + fam.dev_dir +
             (d.accel.class_node.empty() ? "" : " for " + d.accel.class_node));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

std::vector<Device> gaudi_from_pci(const Tree& t, const std::vector<PciFunction>& pci) {
  static const AccelFamily fam{DeviceKind::gaudi, kPciVendorHabana, "Intel", "habanalabs",
                               &gaudi_generation, "accel",          "accel", "/dev/accel/"};
  return accelerators(t, pci, fam);
}

std::vector<Device> neuron_from_pci(const Tree& t, const std::vector<PciFunction>& pci) {
  static const AccelFamily fam{DeviceKind::neuron, kPciVendorAmazon, "AWS",    "neuron",
                               &neuron_generation, "neuron_device",  "neuron", "/dev/"};
  return accelerators(t, pci, fam);
}

}  // namespace detail
}  // namespace kiln::hw
