// The plugin loader: finds backend plugins (libkiln_<name>.so), loads them with Boost.DLL, checks the
// ABI handshake and everything a plugin hands back, and wraps each in a LoadedPlugin. No LibTorch.
//
// Lifetimes: a LoadedPlugin holds its library and the host table; every PluginExecutable holds its
// LoadedPlugin. So a library is unloaded only after the last object that could call into it is gone,
// whatever order the owners are destroyed in.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/internal/host_services.h"
#include "kiln/plugin_api.h"

namespace boost::dll {
class shared_library;
}

namespace kiln {

// A plugin call failed or the plugin returned malformed data. code() is the plugin's error code
// (KILN_ERROR_UNIMPLEMENTED from compile means "run these nodes eagerly"), or KILN_ERROR_INTERNAL
// when the host rejected what the plugin returned. what() is
// "<path>: plugin '<name>': <call> failed (<code>): <the plugin's message>".
class PluginError : public std::runtime_error {
 public:
  PluginError(KilnErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  KilnErrorCode code() const { return code_; }

 private:
  KilnErrorCode code_;
};

// One device as plugins see it (the C++ twin of KilnDeviceInfo, owning its strings). The hardware
// probe's devices are converted into these; see DeviceInfoArray for the C form.
struct PluginDevice {
  KilnDeviceKind kind = KILN_DEVICE_CPU;
  int32_t index = 0;
  std::string name;
  std::string vendor;
  std::string pci_bus_id;
  uint32_t pci_vendor_id = 0;
  uint32_t pci_device_id = 0;
  int32_t compute_capability_major = 0;
  int32_t compute_capability_minor = 0;
  uint64_t total_memory_bytes = 0;
  int32_t multiprocessor_count = 0;
  uint64_t cpu_isa = 0;  // KILN_CPU_ISA_* bits
};

// The C form of a device list, valid as long as this object (it points into `devices`).
class DeviceInfoArray {
 public:
  explicit DeviceInfoArray(std::vector<PluginDevice> devices);
  DeviceInfoArray(const DeviceInfoArray&) = delete;
  DeviceInfoArray& operator=(const DeviceInfoArray&) = delete;
  const KilnDeviceInfo* const* data() const { return pointers_.data(); }
  size_t size() const { return pointers_.size(); }

 private:
  std::vector<PluginDevice> devices_;
  std::vector<KilnDeviceInfo> infos_;
  std::vector<const KilnDeviceInfo*> pointers_;
};

// The CPU of this machine from /proc/cpuinfo and /proc/meminfo (vendor, model name, logical CPUs,
// memory, ISA flags): the device list `kiln plugins` uses. The hardware probe's full list (CUDA,
// Gaudi, Neuron) replaces it where the probe is linked.
std::vector<PluginDevice> basic_cpu_devices();
// Same, from a cpuinfo/meminfo text (tests).
PluginDevice cpu_device_from_proc(const std::string& cpuinfo, const std::string& meminfo);

std::string device_kinds_string(uint32_t mask);  // "cpu,cuda"
std::string modes_string(uint32_t mask);         // "default,reduce-overhead"

struct PluginAvailability {
  bool available = false;
  int32_t score = 0;
  std::string reason;
};

class PluginExecutable;
class PluginGraph;

class LoadedPlugin : public std::enable_shared_from_this<LoadedPlugin> {
 public:
  ~LoadedPlugin();
  LoadedPlugin(const LoadedPlugin&) = delete;
  LoadedPlugin& operator=(const LoadedPlugin&) = delete;

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& vendor() const { return vendor_; }
  const std::string& description() const { return description_; }
  const std::string& path() const { return path_; }
  uint32_t device_kinds() const { return device_kinds_; }  // KILN_DEVICE_MASK_*
  uint32_t modes() const { return modes_; }                // KILN_MODE_BIT(...)
  bool supports_mode(KilnMode mode) const { return (modes_ & KILN_MODE_BIT(mode)) != 0; }
  uint64_t capabilities() const { return capabilities_; }  // KILN_CAPABILITY_*
  bool concurrent_execution_safe() const { return (capabilities_ & KILN_CAPABILITY_CONCURRENT_EXECUTE) != 0; }
  // compile may run from several threads at once (ABI 2.1; a 2.0 plugin never has the bit).
  bool concurrent_compile_safe() const {
    return negotiated_minor_ >= 1 && (capabilities_ & KILN_CAPABILITY_CONCURRENT_COMPILE) != 0;
  }
  // Choosing this backend asks for the whole step to be recorded as one device graph in every mode.
  bool asks_whole_step_graph() const { return (capabilities_ & KILN_CAPABILITY_WHOLE_STEP_GRAPH) != 0; }
  int32_t default_score() const { return default_score_; }
  uint32_t abi_major() const { return abi_major_; }  // what the plugin was built for
  uint32_t abi_minor() const { return abi_minor_; }
  uint32_t negotiated_minor() const { return negotiated_minor_; }
  // The plugin takes nodes with run-time scalars and is executed with their values.
  bool accepts_runtime_scalars() const;
  // The plugin records and replays device graphs (the loader checked all four graph functions).
  bool provides_device_graphs() const;
  // Its graphs take copies whose addresses each launch re-points (ABI 2.3, KilnGraphCopy).
  bool repoints_graph_copies() const {
    return negotiated_minor_ >= 3 && provides_device_graphs() && (capabilities_ & KILN_CAPABILITY_GRAPH_COPIES) != 0;
  }
  // compile may be handed symbolic views, and may serve every size with one executable (ABI 2.4).
  bool symbolic_shapes() const {
    return negotiated_minor_ >= 4 && (capabilities_ & KILN_CAPABILITY_SYMBOLIC_SHAPES) != 0;
  }
  std::string abi_version() const { return std::to_string(abi_major_) + "." + std::to_string(abi_minor_); }

  // All calls are thread-safe (serialised as docs/abi.md says where the plugin needs it).
  // Never throws: an error from the plugin becomes "unavailable" with the plugin's message.
  PluginAvailability available(const KilnDeviceInfo* const* devices, size_t num_devices) const;
  PluginAvailability available(const std::vector<PluginDevice>& devices) const;

  // The node indices the plugin takes, checked: in range and each at most once. Throws PluginError.
  std::vector<int64_t> claim(const KilnGraphView& graph) const;

  // Compiles a subgraph. Throws PluginError; code() == KILN_ERROR_UNIMPLEMENTED means "run eagerly".
  // inplace_inputs (ABI 2.2; ignored for older plugins): empty, or by subgraph output, -1 or the
  // input it would like to write over (KilnPluginCompileArgs); what the plugin accepted comes back
  // as PluginExecutable::inplace_outputs().
  std::unique_ptr<PluginExecutable> compile(const KilnGraphView& subgraph, KilnMode mode,
                                            const std::map<std::string, std::string>& options,
                                            const std::string& cache_dir,
                                            const std::vector<int64_t>& inplace_inputs = {}) const;
  // Same, with the options and cache dir from the host (TrainingArguments' [plugin.<name>] table).
  std::unique_ptr<PluginExecutable> compile(const KilnGraphView& subgraph, KilnMode mode,
                                            const std::vector<int64_t>& inplace_inputs = {}) const;

  // Device graphs (provides_device_graphs()). Throw PluginError with the plugin's message.
  // graph_capture_end must follow every successful graph_capture_begin.
  void graph_capture_begin(DLDevice device, void* stream) const;
  // copies: the 1-D copies enqueued during the capture that launches re-point (only for a plugin
  // that repoints_graph_copies()).
  std::unique_ptr<PluginGraph> graph_capture_end(DLDevice device, void* stream,
                                                 const std::vector<KilnGraphCopy>& copies = {}) const;

  const KilnPluginApi* api() const { return api_; }

 private:
  friend class PluginLoader;
  friend class PluginExecutable;
  friend class PluginGraph;
  LoadedPlugin() = default;
  // "<path>: plugin '<name>'", the start of every message about this plugin.
  std::string where() const;
  // The one place a plugin call's error is handled: reads its code and message through the plugin's
  // table, frees it, and throws PluginError naming the plugin, its path and `call`. No-op on NULL.
  void check(KilnError* error, const char* call) const;
  // Throws PluginError(KILN_ERROR_INTERNAL) for something `call` returned that the host refuses.
  [[noreturn]] void reject(const char* call, const std::string& what) const;

  // Declared first so they are destroyed last: the host table and the library outlive the context.
  std::shared_ptr<boost::dll::shared_library> library_;
  std::shared_ptr<const HostServices> host_;
  const KilnPluginApi* api_ = nullptr;
  std::string name_, version_, vendor_, description_, path_;
  uint32_t device_kinds_ = 0, modes_ = 0;
  uint64_t capabilities_ = 0;
  int32_t default_score_ = 0;
  uint32_t abi_major_ = 0, abi_minor_ = 0, negotiated_minor_ = 0;
  // The ABI's threading rules, enforced here: available, claim, compile and graph_capture_begin/end
  // one at a time per context (call_mu_); execute and graph_launch one at a time per plugin
  // (execute_mu_) unless the plugin has KILN_CAPABILITY_CONCURRENT_EXECUTE.
  mutable std::mutex call_mu_;
  mutable std::mutex execute_mu_;
};

// A compiled subgraph. Keeps its plugin (and so its library) alive.
class PluginExecutable {
 public:
  ~PluginExecutable();
  PluginExecutable(const PluginExecutable&) = delete;
  PluginExecutable& operator=(const PluginExecutable&) = delete;

  // outputs preallocated by the caller. Throws PluginError.
  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               void* stream = nullptr) const;
  // With the step's run-time scalars (KilnArg BOOL/INT/DOUBLE, scalar k at index k). A plugin that
  // does not accept run-time scalars is called with none.
  void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
               const KilnArg* const* scalars, size_t num_scalars, void* stream = nullptr) const;
  // An executable that serves every size (serves_all_sizes()): with this call's symbol values.
  void execute_sized(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                     const KilnArg* const* scalars, size_t num_scalars, const int64_t* sizes, size_t num_sizes,
                     void* stream = nullptr) const;
  const LoadedPlugin& plugin() const { return *plugin_; }
  // By output: the input whose memory the plugin accepted to receive this output too (ABI 2.2),
  // or -1. Empty when nothing was proposed or accepted.
  const std::vector<int64_t>& inplace_outputs() const { return inplace_; }
  // ABI 2.5: an execute that fails has written into none of the inputs of inplace_outputs() (also
  // true of an executable without in-place outputs: it writes no input at all).
  bool failure_leaves_inputs() const { return inplace_.empty() || inplace_atomic_; }
  // Compiled from a symbolic view and accepted for every size (ABI 2.4).
  bool serves_all_sizes() const { return all_sizes_; }

 private:
  friend class LoadedPlugin;
  PluginExecutable(std::shared_ptr<const LoadedPlugin> plugin, KilnExecutable* exe)
      : plugin_(std::move(plugin)), exe_(exe) {}
  std::shared_ptr<const LoadedPlugin> plugin_;
  KilnExecutable* exe_;
  std::vector<int64_t> inplace_;
  bool inplace_atomic_ = false;
  bool all_sizes_ = false;
};

// An instantiated device graph. Keeps its plugin (and so its library) alive.
class PluginGraph {
 public:
  ~PluginGraph();
  PluginGraph(const PluginGraph&) = delete;
  PluginGraph& operator=(const PluginGraph&) = delete;
  // Enqueues one replay on `stream`. Throws PluginError. copies: empty (the addresses of the last
  // launch), or one entry per copy recorded with the graph, in its order: this replay's addresses.
  void launch(void* stream, const std::vector<KilnGraphCopy>& copies = {}) const;
  size_t num_copies() const { return num_copies_; }

 private:
  friend class LoadedPlugin;
  PluginGraph(std::shared_ptr<const LoadedPlugin> plugin, KilnGraphExec* exec)
      : plugin_(std::move(plugin)), exec_(exec) {}
  std::shared_ptr<const LoadedPlugin> plugin_;
  KilnGraphExec* exec_;
  size_t num_copies_ = 0;
};

// A file that was found but not loaded, or a duplicate that was ignored.
struct PluginLoadFailure {
  std::string path;
  std::string message;
};

struct PluginSearchOptions {
  // The configured plugin_dirs (args.runtime.plugin_dirs, where the configuration puts
  // KILN_PLUGIN_PATH's directories first), searched first.
  std::vector<std::string> dirs;
  bool use_builtin = true;          // then the install's own plugin folder
  bool search_current_dir = false;  // the working directory, last; never unless asked
};

// The install's own plugin folders that exist: <dir of the executable or libkiln>/../plugins (build
// tree) and <dir>/../lib/kiln/plugins (installed).
std::vector<std::string> builtin_plugin_dirs();
// The directories a search would visit, in order, without duplicates.
std::vector<std::string> plugin_search_dirs(const PluginSearchOptions& options);

class PluginRegistry {
 public:
  // Visits every directory, tries every regular file named libkiln_*.so (sorted by name), keeps the
  // first plugin of each name. Never throws for a bad file: it becomes a failure.
  static PluginRegistry load(const PluginSearchOptions& options, std::shared_ptr<const HostServices> host);
  static PluginRegistry load(const TrainingArguments& args, std::shared_ptr<const HostServices> host);

  // One file, whatever its name (kiln conformance). Throws PluginError(KILN_ERROR_UNAVAILABLE,
  // "<path>: <reason>").
  static std::shared_ptr<LoadedPlugin> load_file(const std::string& path, std::shared_ptr<const HostServices> host);

  const std::vector<std::shared_ptr<LoadedPlugin>>& plugins() const { return plugins_; }
  const std::vector<PluginLoadFailure>& failures() const { return failures_; }
  const std::vector<std::string>& searched_dirs() const { return dirs_; }
  std::shared_ptr<LoadedPlugin> find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::shared_ptr<LoadedPlugin>> plugins_;
  std::vector<PluginLoadFailure> failures_;
  std::vector<std::string> dirs_;
};

}  // namespace kiln
