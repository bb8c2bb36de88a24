// The probe itself: one pass over the machine (or a tree describing one), in a fixed order.
#include <cstdlib>

#include "probe_internal.h"

namespace kiln::hw {

const char* to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
    case DeviceKind::gaudi: return "gaudi";
    case DeviceKind::neuron: return "neuron";
  }
  return "unknown";
}

int ProbeResult::count(DeviceKind kind) const {
  int n = 0;
  for (const auto& d : devices) n += d.kind == kind;
  return n;
}

const Device* ProbeResult::first(DeviceKind kind) const {
  for (const auto& d : devices)
    if (d.kind == kind) return &d;
  return nullptr;
}

namespace {

bool is_real_root(const std::string& root) {
  std::error_code ec;
  auto canon = std::filesystem::canonical(root, ec);
  return !ec && canon == std::filesystem::path("/");
}

}  // namespace

ProbeResult probe(const ProbeOptions& options) {
  ProbeResult result;
  std::string root = options.root;
  if (root.empty()) {
    // The probe's one test seam, and the only environment variable kiln reads outside
    // TrainingArguments: the probe runs before any configuration exists (kiln probe, selection of
    // "auto"), and it describes the machine, not a training run.
    const char* env = std::getenv("KILN_SYSFS_ROOT");
    root = env && *env ? env : "/";
  }
  result.root = root;
  result.live = is_real_root(root);

  detail::Tree t;
  t.root = root;
  t.live = result.live;
  t.warnings = &result.warnings;

  std::error_code ec;
  if (!result.live && !std::filesystem::is_directory(root, ec))
    t.warn("sysfs root '" + root + "' is not a directory; nothing but an unknown CPU is reported");

  result.devices.push_back(detail::describe_cpu(t, options));
  auto pci = detail::scan_pci(t);

  std::vector<Device> cuda;
  if (result.live) {
    bool driver_found = false;
    cuda = detail::cuda_from_driver(t, options.cuda_library, &result.cuda_status, &driver_found);
    if (!driver_found) {
      for (const auto& f : pci)
        if (detail::is_nvidia_gpu(f))
          t.warn("NVIDIA GPU " + detail::hex4(f.device) + " at " + f.bus_id +
                 " is on the PCI bus, but there is no CUDA driver; it is not used");
    }
  } else {
    cuda = detail::cuda_from_pci(t, pci);
    result.cuda_status = std::to_string(cuda.size()) + " NVIDIA GPU" + (cuda.size() == 1 ? "" : "s") +
                         " from the tree's PCI list (root " + root + "; the driver is not asked)";
  }
  for (auto& d : cuda) result.devices.push_back(std::move(d));
  for (auto& d : detail::gaudi_from_pci(t, pci)) result.devices.push_back(std::move(d));
  for (auto& d : detail::neuron_from_pci(t, pci)) result.devices.push_back(std::move(d));
  return result;
}

}  // namespace kiln::hw
