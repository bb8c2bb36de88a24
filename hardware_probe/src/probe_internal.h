// Pieces of the probe shared between its source files; not installed, not part of the API.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kiln/hardware_probe.h"

namespace kiln::hw::detail {

namespace fs = std::filesystem;

// The machine being described: a root directory standing for "/", and where problems go.
struct Tree {
  fs::path root;
  bool live = false;
  std::vector<std::string>* warnings = nullptr;

  // `rel` is an absolute-looking path ("/sys/bus/pci/devices") placed under the root.
  fs::path at(const std::string& rel) const;
  // How a path is named in messages: as on the machine ("/sys/..."), whatever the root.
  std::string show(const fs::path& p) const;
  void warn(std::string message) const;
};

// Reads a regular file of at most `max_bytes`. On failure returns nullopt and says why in
// `why` ("missing", "a directory", "too many levels of symbolic links", ...). Never blocks on a
// FIFO or a device node: anything that is not a regular file is refused.
std::optional<std::string> read_file(const fs::path& p, std::string* why, std::size_t max_bytes = 16u << 20);
// Like read_file, but a failure other than "missing" is recorded as a warning.
std::optional<std::string> read_attr(const Tree& t, const fs::path& p);

// Entry names of a directory, sorted; empty when it cannot be listed (and `why` says why).
std::vector<std::string> list_dir(const fs::path& dir, std::string* why = nullptr);
bool path_exists(const fs::path& p);  // follows links; false on any error
// The last component of a symlink's target ("habanalabs" for .../drivers/habanalabs).
std::optional<std::string> link_target_name(const fs::path& link);

std::string trim(const std::string& s);
// "0x10de\n" or "10de" -> 0x10de; nullopt for anything else.
std::optional<uint32_t> parse_hex(const std::string& s);
// "32K", "1024K", "2M", "1048576" -> bytes; nullopt for anything else.
std::optional<uint64_t> parse_size(const std::string& s);
std::optional<int> parse_int(const std::string& s);
// Text from a file, shortened and with control bytes escaped, for a warning.
std::string printable(const std::string& s, std::size_t max_chars = 32);
std::string hex4(uint32_t v);  // "0x10de"

// ---- parts of the probe ----

struct PciFunction {
  std::string bus_id;  // directory name under /sys/bus/pci/devices
  fs::path dir;
  uint16_t vendor = 0;
  uint16_t device = 0;
  std::optional<uint32_t> class_code;
  std::string driver;  // empty when unbound
};

std::vector<PciFunction> scan_pci(const Tree& t);
Device describe_cpu(const Tree& t, const ProbeOptions& options);
// NVIDIA GPUs from the tree's PCI list (the non-live probe).
std::vector<Device> cuda_from_pci(const Tree& t, const std::vector<PciFunction>& pci);
// The live probe through libcuda; fills `status`, adds warnings for driver errors.
std::vector<Device> cuda_from_driver(const Tree& t, const std::string& library, std::string* status,
                                     bool* driver_found);
std::vector<Device> gaudi_from_pci(const Tree& t, const std::vector<PciFunction>& pci);
std::vector<Device> neuron_from_pci(const Tree& t, const std::vector<PciFunction>& pci);
bool is_nvidia_gpu(const PciFunction& f);

}  // namespace kiln::hw::detail
