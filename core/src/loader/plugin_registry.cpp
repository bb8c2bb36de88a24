// Loading plugins: search directories, Boost.DLL, the ABI handshake, and the checks on everything a
// plugin returns. Every problem with a file becomes a PluginLoadFailure naming the file and the
// reason; nothing a plugin does wrong is trusted or allowed to crash the host.
#include "kiln/internal/plugin_registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <type_traits>

#include <filesystem>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "kiln/internal/elf_check.h"
#include "kiln/internal/plugin_crash.h"

#include "kiln/log.h"
#include "kiln/plugin_api.hpp"

namespace fs = std::filesystem;  // Boost.DLL speaks std::filesystem too (BOOST_DLL_USE_STD_FS)

namespace kiln {

namespace {

// The smallest tables a 2.x plugin may return: the 2.0 layouts. A later minor keeps accepting
// these and checks KILN_HAS_FIELD before reading anything newer.
constexpr size_t kPluginApiSize_2_0 = KILN_STRUCT_SIZE(KilnPluginApi, graph_destroy);
constexpr size_t kDescriptorSize_2_0 = KILN_STRUCT_SIZE(KilnPluginDescriptor, reserved0);

// Libraries whose init handed back a table of another ABI major. Nothing past the table's frozen
// first fields may be read or called (a table that says 1.x may have any layout, and a 2.x table
// claiming 1.x would have its executable_destroy called as 1.x's shutdown), so their context cannot
// be ended; they stay mapped for the life of the process, as unloading code that may still run
// (a thread the plugin's init started) would crash the host later, far from the cause.
std::mutex g_foreign_mu;
std::vector<std::shared_ptr<boost::dll::shared_library>>& foreign_libraries() {
  static auto* kept = new std::vector<std::shared_ptr<boost::dll::shared_library>>();
  return *kept;
}
void keep_mapped(std::shared_ptr<boost::dll::shared_library> lib) {
  std::lock_guard<std::mutex> lock(g_foreign_mu);
  foreign_libraries().push_back(std::move(lib));
}

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// Directory scans open only files named like plugins, so that a library folder on the search path
// does not run every library's static constructors; a file named explicitly loads whatever its name.
bool named_like_a_plugin(const fs::path& p) {
  const std::string f = p.filename().string();
  return f.size() > 11 && f.rfind("libkiln_", 0) == 0 && f.compare(f.size() - 3, 3, ".so") == 0;
}

// A string a plugin gave, as a message may show it: printable ASCII as it is, other bytes as \xNN
// (a name with control characters would otherwise reach the user's terminal), at most 64 bytes.
std::string shown(const char* text) {
  std::string out;
  size_t n = 0;
  for (const char* c = text; *c && n < 64; ++c, ++n) {
    const auto b = static_cast<unsigned char>(*c);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      out += static_cast<char>(b);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
    }
  }
  if (text[n]) out += "...";
  return out;
}

bool valid_plugin_name(const char* name) {
  if (!name || !*name) return false;
  for (const char* c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

// Canonical form for de-duplicating directories and files; the path as given when that fails.
std::string canonical_or_same(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::canonical(p, ec);
  return ec ? fs::path(p).lexically_normal().string() : c.string();
}

void add_unique(std::vector<std::string>& dirs, std::set<std::string>& seen, const std::string& d) {
  if (d.empty()) return;
  if (seen.insert(canonical_or_same(d)).second) dirs.push_back(d);
}

}  // namespace

// Reads a plugin's error through its own table and frees it: "<call> failed (<code>): <message>".
std::string take_plugin_error(const KilnPluginApi& api, KilnError* error, const std::string& call,
                              KilnErrorCode* code = nullptr);

// ---- search paths -------------------------------------------------------------------------------

std::vector<std::string> builtin_plugin_dirs() {
  std::vector<fs::path> bases;
  std::error_code ec;
  fs::path exe = boost::dll::program_location(ec);
  if (!ec) bases.push_back(exe.parent_path());
  // The library or executable this loader is linked into (libkiln.so when installed).
  ec.clear();
  fs::path self = boost::dll::this_line_location(ec);
  if (!ec) bases.push_back(self.parent_path());
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& b : bases) {
    for (const fs::path& cand : {b / ".." / "plugins", b / ".." / "lib" / "kiln" / "plugins"}) {
      std::error_code e2;
      if (fs::is_directory(cand, e2)) add_unique(out, seen, cand.lexically_normal().string());
    }
  }
  return out;
}

std::vector<std::string> plugin_search_dirs(const PluginSearchOptions& options) {
  std::vector<std::string> dirs;
  std::set<std::string> seen;
  for (const auto& d : options.dirs) add_unique(dirs, seen, d);
  if (options.use_builtin)
    for (const auto& d : builtin_plugin_dirs()) add_unique(dirs, seen, d);
  if (options.search_current_dir) {
    std::error_code ec;
    fs::path cwd = fs::current_path(ec);
    if (!ec) add_unique(dirs, seen, cwd.string());
  }
  return dirs;
}

// ---- loading one file ---------------------------------------------------------------------------

class PluginLoader {
 public:
  // The plugin, or nullptr with *error set to the reason (without the path).
  static std::shared_ptr<LoadedPlugin> load(const std::string& path, const std::shared_ptr<const HostServices>& host,
                                            std::string* error);
};

std::shared_ptr<LoadedPlugin> PluginLoader::load(const std::string& path,
                                                 const std::shared_ptr<const HostServices>& host, std::string* error) {
  // dlopen maps what the file's headers describe: a file cut short would be mapped past its end
  // and kill the process with SIGBUS on first touch. Nothing unchecked reaches it.
  if (std::string why = elf_precheck(path); !why.empty()) {
    *error = "not a loadable library: " + why;
    return nullptr;
  }
  auto lib = std::make_shared<boost::dll::shared_library>();
  std::error_code ec;
  dlerror();  // clear any stale text
  lib->load(fs::path(path), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib->is_loaded()) {
    const char* why = dlerror();
    *error = std::string("not a loadable library: ") + (why ? why : ec.message());
    return nullptr;
  }
  if (!lib->has(KILN_PLUGIN_INIT_SYMBOL)) {
    *error = "not a kiln plugin: no symbol 'kiln_plugin_init'";
    return nullptr;
  }
  auto& init = lib->get<std::remove_pointer_t<KilnPluginInitFn>>(KILN_PLUGIN_INIT_SYMBOL);

  const KilnPluginApi* api = nullptr;
  KilnError* err = nullptr;
  {
    PluginCallScope in_plugin("", path.c_str(), "kiln_plugin_init");
    err = init(host->api(), KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR, &api);
  }

  const std::string host_version = version_string(KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR);
  // The frozen header (struct_size, version, error functions) is all we may read before checking
  // the major version.
  const bool header_ok = api && api->struct_size >= KILN_PLUGIN_API_HEADER_SIZE;
  const bool errors_readable = header_ok && api->error_code && api->error_message && api->error_destroy;
  auto take = [&](KilnError* e) {
    if (!errors_readable) return std::string("no message: the plugin returned no error functions");
    return take_plugin_error(*api, e, "kiln_plugin_init");
  };

  if (header_ok && api->abi_major != KILN_ABI_VERSION_MAJOR) {
    // Only the frozen fields are touched: the version just read, and the error functions when
    // init failed. The context a successful init made is left alone (see keep_mapped).
    std::string init_said;
    if (err) init_said = " (" + take(err) + ")";
    else keep_mapped(lib);
    *error = "plugin was built for kiln plugin ABI " + version_string(api->abi_major, api->abi_minor) +
             "; this kiln speaks " + host_version + " — rebuild it against the kiln " +
             std::to_string(KILN_ABI_VERSION_MAJOR) + ".x SDK" + init_said;
    return nullptr;
  }
  if (err) {
    *error = take(err);
    return nullptr;
  }
  if (!api) {
    *error = "kiln_plugin_init returned no function table";
    return nullptr;
  }

  // From here on the plugin has a live context; any rejection must shut it down.
  auto reject = [&](const std::string& why) -> std::shared_ptr<LoadedPlugin> {
    if (api->struct_size >= KILN_STRUCT_SIZE(KilnPluginApi, shutdown) && api->shutdown) {
      KilnPluginShutdownArgs a{KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE, api->plugin_ctx};
      PluginCallScope in_plugin("", path.c_str(), "shutdown");
      api->shutdown(&a);
    }
    *error = why;
    return nullptr;
  };
  if (api->struct_size < kPluginApiSize_2_0)
    return reject("function table too small: struct_size " + std::to_string(api->struct_size) + ", ABI " +
                  host_version + " needs " + std::to_string(kPluginApiSize_2_0));
  if (!errors_readable) return reject("required function 'error_message', 'error_code' or 'error_destroy' is NULL");
  const KilnPluginDescriptor* d = api->descriptor;
  if (!d) return reject("descriptor is NULL");
  if (d->struct_size < kDescriptorSize_2_0)
    return reject("descriptor too small: struct_size " + std::to_string(d->struct_size) + ", ABI " + host_version +
                  " needs " + std::to_string(kDescriptorSize_2_0));
  if (!d->name) return reject("descriptor.name is NULL");
  if (!valid_plugin_name(d->name))
    return reject("descriptor.name '" + shown(d->name) + "' is not a valid plugin name ([a-z0-9_]+)");
  if (!d->version) return reject("descriptor.version is NULL");
  if (!d->vendor) return reject("descriptor.vendor is NULL");
  if (d->device_kinds == 0) return reject("descriptor.device_kinds is empty");
  if ((d->modes & KILN_MODE_BIT(KILN_MODE_DEFAULT)) == 0) return reject("descriptor.modes does not include 'default'");
  if (d->modes & ~KILN_MODE_MASK_ALL) return reject("descriptor.modes has unknown bits");
  const bool graph_fns = api->graph_capture_begin || api->graph_capture_end || api->graph_launch || api->graph_destroy;
  const bool all_graph_fns =
      api->graph_capture_begin && api->graph_capture_end && api->graph_launch && api->graph_destroy;
  if ((d->capabilities & KILN_CAPABILITY_DEVICE_GRAPHS) && !all_graph_fns)
    return reject(
        "descriptor.capabilities has KILN_CAPABILITY_DEVICE_GRAPHS, but not all four graph functions are set");
  if (!(d->capabilities & KILN_CAPABILITY_DEVICE_GRAPHS) && graph_fns)
    return reject("graph functions are set, but descriptor.capabilities lacks KILN_CAPABILITY_DEVICE_GRAPHS");
  if ((d->capabilities & KILN_CAPABILITY_GRAPH_COPIES) && !(d->capabilities & KILN_CAPABILITY_DEVICE_GRAPHS))
    return reject(
        "descriptor.capabilities has KILN_CAPABILITY_GRAPH_COPIES without KILN_CAPABILITY_DEVICE_GRAPHS (the "
        "copies are re-pointed by graph_launch)");
  const struct {
    const void* fn;
    const char* name;
  } required[] = {{reinterpret_cast<const void*>(api->claim), "claim"},
                  {reinterpret_cast<const void*>(api->compile), "compile"},
                  {reinterpret_cast<const void*>(api->execute), "execute"},
                  {reinterpret_cast<const void*>(api->executable_destroy), "executable_destroy"}};
  for (const auto& r : required)
    if (!r.fn) return reject(std::string("required function '") + r.name + "' is NULL");

  std::shared_ptr<LoadedPlugin> p(new LoadedPlugin());
  p->library_ = std::move(lib);
  p->host_ = host;
  p->api_ = api;
  p->name_ = d->name;
  p->version_ = d->version;
  p->vendor_ = d->vendor;
  p->description_ = d->description ? d->description : "";
  p->path_ = path;
  p->device_kinds_ = d->device_kinds;
  p->modes_ = d->modes;
  p->capabilities_ = d->capabilities;
  p->default_score_ = d->default_score;
  p->abi_major_ = api->abi_major;
  p->abi_minor_ = api->abi_minor;
  p->negotiated_minor_ = std::min<uint32_t>(api->abi_minor, KILN_ABI_VERSION_MINOR);
  return p;
}

// ---- errors -------------------------------------------------------------------------------------

std::string take_plugin_error(const KilnPluginApi& api, KilnError* error, const std::string& call,
                              KilnErrorCode* code) {
  const KilnErrorCode c = api.error_code(error);
  const char* m = api.error_message(error);
  std::string message = call + " failed (" + plugin::error_code_name(c) + "): " + (m ? m : "");
  api.error_destroy(error);
  if (code) *code = c;
  return message;
}

std::string LoadedPlugin::where() const { return path_ + ": plugin '" + name_ + "'"; }

void LoadedPlugin::check(KilnError* error, const char* call) const {
  if (!error) return;
  KilnErrorCode code = KILN_ERROR_UNKNOWN;
  std::string message = take_plugin_error(*api_, error, call, &code);
  throw PluginError(code, where() + ": " + message);
}

void LoadedPlugin::reject(const char* call, const std::string& what) const {
  throw PluginError(KILN_ERROR_INTERNAL, where() + ": " + call + " " + what);
}

// ---- LoadedPlugin -------------------------------------------------------------------------------

LoadedPlugin::~LoadedPlugin() {
  if (api_ && api_->shutdown) {
    KilnPluginShutdownArgs a{KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE, api_->plugin_ctx};
    PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "shutdown");
    api_->shutdown(&a);
  }
  api_ = nullptr;
  // library_ is released after this body: the plugin's code stays mapped through shutdown.
}

PluginAvailability LoadedPlugin::available(const KilnDeviceInfo* const* devices, size_t num_devices) const {
  PluginAvailability result;
  if (!api_->available) {
    // No check of its own: available wherever a device of a kind it serves is present.
    for (size_t i = 0; i < num_devices; ++i) {
      if (devices[i] && (device_kinds_ & KILN_DEVICE_KIND_BIT(devices[i]->kind))) {
        result.available = true;
        result.score = default_score_;
        result.reason = "a device of a kind it serves is present (" + device_kinds_string(device_kinds_) + ")";
        return result;
      }
    }
    result.reason = "no device of a kind it serves (" + device_kinds_string(device_kinds_) + ")";
    return result;
  }
  std::vector<char> reason(512, '\0');
  KilnPluginAvailableArgs a{};
  a.struct_size = KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.devices = devices;
  a.num_devices = num_devices;
  a.reason = reason.data();
  a.reason_capacity = reason.size();
  try {
    std::lock_guard<std::mutex> lock(call_mu_);
    KilnError* err = nullptr;
    {
      PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "available");
      err = api_->available(&a);
    }
    check(err, "available");
  } catch (const PluginError& e) {
    result.available = false;
    result.reason = e.what();
    return result;
  }
  reason.back() = '\0';  // whatever the plugin wrote, the string ends inside the buffer
  result.available = a.available != 0;
  result.score = a.score;
  result.reason = reason.data();
  return result;
}

PluginAvailability LoadedPlugin::available(const std::vector<PluginDevice>& devices) const {
  DeviceInfoArray arr(devices);
  return available(arr.data(), arr.size());
}

std::vector<int64_t> LoadedPlugin::claim(const KilnGraphView& graph) const {
  const size_t n = graph.num_nodes;
  // One spare slot past the capacity, so that a plugin that writes one claim too many is caught
  // rather than corrupting the heap silently.
  std::vector<int64_t> claimed(n + 1, -1);
  KilnPluginClaimArgs a{};
  a.struct_size = KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.graph = &graph;
  a.claimed_nodes = claimed.data();
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    KilnError* err = nullptr;
    {
      PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "claim");
      err = api_->claim(&a);
    }
    check(err, "claim");
  }
  const size_t count = a.num_claimed;
  if (count > n)
    reject("claim", "returned " + std::to_string(count) + " claims for a graph of " + std::to_string(n) + " nodes");
  std::vector<char> seen(n, 0);
  std::vector<int64_t> result(claimed.begin(), claimed.begin() + static_cast<std::ptrdiff_t>(count));
  for (int64_t idx : result) {
    if (idx < 0 || static_cast<size_t>(idx) >= n)
      reject("claim", "returned node " + std::to_string(idx) + ", but the graph has " + std::to_string(n) + " nodes" +
                          (n ? " (0.." + std::to_string(n - 1) + ")" : std::string()));
    if (seen[static_cast<size_t>(idx)]++) reject("claim", "returned node " + std::to_string(idx) + " twice");
  }
  return result;
}

std::unique_ptr<PluginExecutable> LoadedPlugin::compile(const KilnGraphView& subgraph, KilnMode mode,
                                                        const std::map<std::string, std::string>& options,
                                                        const std::string& cache_dir,
                                                        const std::vector<int64_t>& inplace_inputs) const {
  if (!supports_mode(mode))
    throw PluginError(KILN_ERROR_INVALID_ARGUMENT, where() + " does not support mode '" + plugin::mode_name(mode) +
                                                       "' (it supports " + modes_string(modes_) + ")");
  std::vector<KilnOption> kvs;
  kvs.reserve(options.size());
  for (const auto& [k, v] : options) kvs.push_back(KilnOption{KILN_OPTION_STRUCT_SIZE, k.c_str(), v.c_str()});
  std::vector<const KilnOption*> kv_ptrs;
  for (const auto& kv : kvs) kv_ptrs.push_back(&kv);
  KilnPluginCompileArgs a{};
  a.struct_size = KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.subgraph = &subgraph;
  a.mode = mode;
  a.options = kv_ptrs.data();
  a.num_options = kv_ptrs.size();
  a.cache_dir = cache_dir.c_str();
  // In-place outputs: only offered to a plugin that knows the fields (2.2), for a whole proposal.
  const bool inplace = negotiated_minor_ >= 2 && inplace_inputs.size() == subgraph.num_outputs &&
                       std::any_of(inplace_inputs.begin(), inplace_inputs.end(), [](int64_t j) { return j >= 0; });
  std::vector<int64_t> accepted(inplace ? inplace_inputs.size() : 0, -1);
  if (inplace) {
    a.inplace_inputs = inplace_inputs.data();
    a.inplace_accepted = accepted.data();
  }
  KilnError* err = nullptr;
  {
    // Serialised like every other call of the context, unless the plugin says compile is safe to
    // run from several threads at once.
    std::unique_lock<std::mutex> lock(call_mu_, std::defer_lock);
    if (!concurrent_compile_safe()) lock.lock();
    PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "compile");
    err = api_->compile(&a);
  }
  if (err && a.executable) {
    KilnExecutableDestroyArgs d{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, a.executable};
    PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "executable_destroy");
    api_->executable_destroy(&d);
  }
  check(err, "compile");
  if (!a.executable) reject("compile", "returned neither an executable nor an error");
  std::unique_ptr<PluginExecutable> exe(new PluginExecutable(shared_from_this(), a.executable));
  for (size_t k = 0; k < accepted.size(); ++k)
    if (accepted[k] != -1 && accepted[k] != inplace_inputs[k])
      reject("compile", "accepted input " + std::to_string(accepted[k]) + " in place of output " + std::to_string(k) +
                            ", where kiln offered " + std::to_string(inplace_inputs[k]) +
                            " (inplace_accepted may only repeat inplace_inputs or keep -1)");
  if (std::any_of(accepted.begin(), accepted.end(), [](int64_t j) { return j >= 0; })) {
    exe->inplace_ = accepted;
    // 2.5: a failed execute wrote into none of them (reserved, so 0, in an older plugin).
    if (a.inplace_atomic != 0 && a.inplace_atomic != 1)
      reject("compile", "set inplace_atomic to " + std::to_string(a.inplace_atomic) + " (0 or 1)");
    exe->inplace_atomic_ = a.inplace_atomic == 1;
  }
  const bool symbolic = KILN_HAS_FIELD(&subgraph, KilnGraphView, size_sites) && subgraph.num_symbols > 0;
  if (a.symbolic_accepted != 0 && a.symbolic_accepted != 1)
    reject("compile", "set symbolic_accepted to " + std::to_string(a.symbolic_accepted) + " (0 or 1)");
  if (a.symbolic_accepted && !symbolic) reject("compile", "accepted a view without size symbols for every size");
  exe->all_sizes_ = symbolic && a.symbolic_accepted == 1 && symbolic_shapes();
  return exe;
}

std::unique_ptr<PluginExecutable> LoadedPlugin::compile(const KilnGraphView& subgraph, KilnMode mode,
                                                        const std::vector<int64_t>& inplace_inputs) const {
  std::map<std::string, std::string> options;
  if (auto it = host_->plugin_options().find(name_); it != host_->plugin_options().end()) options = it->second;
  return compile(subgraph, mode, options, host_->cache_dir(), inplace_inputs);
}

bool LoadedPlugin::accepts_runtime_scalars() const { return (capabilities_ & KILN_CAPABILITY_RUNTIME_SCALARS) != 0; }

bool LoadedPlugin::provides_device_graphs() const { return (capabilities_ & KILN_CAPABILITY_DEVICE_GRAPHS) != 0; }

void LoadedPlugin::graph_capture_begin(DLDevice device, void* stream) const {
  if (!provides_device_graphs())
    throw PluginError(KILN_ERROR_UNIMPLEMENTED, where() + " does not record device graphs");
  KilnGraphCaptureBeginArgs a{};
  a.struct_size = KILN_GRAPH_CAPTURE_BEGIN_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.device = device;
  a.stream = stream;
  std::lock_guard<std::mutex> lock(call_mu_);
  KilnError* err = nullptr;
  {
    PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "graph_capture_begin");
    err = api_->graph_capture_begin(&a);
  }
  check(err, "graph_capture_begin");
}

std::unique_ptr<PluginGraph> LoadedPlugin::graph_capture_end(DLDevice device, void* stream,
                                                             const std::vector<KilnGraphCopy>& copies) const {
  if (!provides_device_graphs())
    throw PluginError(KILN_ERROR_UNIMPLEMENTED, where() + " does not record device graphs");
  KilnGraphCaptureEndArgs a{};
  a.struct_size = KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.device = device;
  a.stream = stream;
  if (!copies.empty()) {
    // The capture must still end (the ABI's rule) before the host gives up on it.
    if (!repoints_graph_copies()) {
      a.struct_size = KILN_STRUCT_SIZE(KilnGraphCaptureEndArgs, graph);
      {
        std::lock_guard<std::mutex> lock(call_mu_);
        PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "graph_capture_end");
        if (KilnError* e = api_->graph_capture_end(&a)) api_->error_destroy(e);
        if (a.graph) {
          KilnGraphDestroyArgs d{KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, a.graph};
          api_->graph_destroy(&d);
        }
      }
      throw PluginError(KILN_ERROR_UNIMPLEMENTED, where() + " does not re-point graph copies (ABI 2.3)");
    }
    a.copies = copies.data();
    a.num_copies = copies.size();
  }
  KilnError* err = nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    PluginCallScope in_plugin(name_.c_str(), path_.c_str(), "graph_capture_end");
    err = api_->graph_capture_end(&a);
    if (err && a.graph) {
      KilnGraphDestroyArgs d{KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, a.graph};
      api_->graph_destroy(&d);
    }
  }
  check(err, "graph_capture_end");
  if (!a.graph) reject("graph_capture_end", "returned no graph");
  auto g = std::unique_ptr<PluginGraph>(new PluginGraph(shared_from_this(), a.graph));
  g->num_copies_ = copies.size();
  return g;
}

// ---- PluginExecutable, PluginGraph --------------------------------------------------------------

PluginExecutable::~PluginExecutable() {
  if (exe_) {
    KilnExecutableDestroyArgs a{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, exe_};
    PluginCallScope in_plugin(plugin_->name_.c_str(), plugin_->path_.c_str(), "executable_destroy");
    plugin_->api_->executable_destroy(&a);
  }
}

void PluginExecutable::execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                               void* stream) const {
  execute(inputs, num_inputs, outputs, num_outputs, nullptr, 0, stream);
}

void PluginExecutable::execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                               const KilnArg* const* scalars, size_t num_scalars, void* stream) const {
  execute_sized(inputs, num_inputs, outputs, num_outputs, scalars, num_scalars, nullptr, 0, stream);
}

void PluginExecutable::execute_sized(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                                     const KilnArg* const* scalars, size_t num_scalars, const int64_t* sizes,
                                     size_t num_sizes, void* stream) const {
  KilnExecutableExecuteArgs a{};
  a.struct_size = KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE;
  a.executable = exe_;
  a.inputs = inputs;
  a.num_inputs = num_inputs;
  a.outputs = outputs;
  a.num_outputs = num_outputs;
  // A plugin that does not take run-time scalars gets none (it is never handed a node that has one).
  if (plugin_->accepts_runtime_scalars()) {
    a.scalars = num_scalars ? scalars : nullptr;
    a.num_scalars = num_scalars;
  }
  a.stream = stream;
  // Sizes go only to an executable that serves every size (it was compiled by a 2.4 plugin).
  if (all_sizes_ && num_sizes > 0) {
    a.symbol_values = sizes;
    a.num_symbol_values = num_sizes;
  }
  KilnError* err = nullptr;
  {
    std::unique_lock<std::mutex> lock(plugin_->execute_mu_, std::defer_lock);
    if (!plugin_->concurrent_execution_safe()) lock.lock();
    PluginCallScope in_plugin(plugin_->name_.c_str(), plugin_->path_.c_str(), "execute");
    err = plugin_->api_->execute(&a);
  }
  plugin_->check(err, "execute");
}

PluginGraph::~PluginGraph() {
  if (exec_) {
    KilnGraphDestroyArgs a{KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, exec_};
    PluginCallScope in_plugin(plugin_->name_.c_str(), plugin_->path_.c_str(), "graph_destroy");
    plugin_->api_->graph_destroy(&a);
  }
}

void PluginGraph::launch(void* stream, const std::vector<KilnGraphCopy>& copies) const {
  if (!copies.empty() && copies.size() != num_copies_)
    throw PluginError(KILN_ERROR_INVALID_ARGUMENT, plugin_->where() + ": graph_launch with " +
                                                       std::to_string(copies.size()) + " copies, the graph recorded " +
                                                       std::to_string(num_copies_));
  KilnGraphLaunchArgs a{KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE, exec_, stream, nullptr, 0};
  if (!copies.empty()) {
    a.copies = copies.data();
    a.num_copies = copies.size();
  }
  KilnError* err = nullptr;
  // Launches enqueue work like execute does, under the same rule.
  {
    std::unique_lock<std::mutex> lock(plugin_->execute_mu_, std::defer_lock);
    if (!plugin_->concurrent_execution_safe()) lock.lock();
    PluginCallScope in_plugin(plugin_->name_.c_str(), plugin_->path_.c_str(), "graph_launch");
    err = plugin_->api_->graph_launch(&a);
  }
  plugin_->check(err, "graph_launch");
}

// ---- PluginRegistry -----------------------------------------------------------------------------

std::shared_ptr<LoadedPlugin> PluginRegistry::load_file(const std::string& path,
                                                        std::shared_ptr<const HostServices> host) {
  std::string error;
  auto p = PluginLoader::load(path, host, &error);
  if (!p) throw PluginError(KILN_ERROR_UNAVAILABLE, path + ": " + error);
  return p;
}

PluginRegistry PluginRegistry::load(const PluginSearchOptions& options, std::shared_ptr<const HostServices> host) {
  PluginRegistry reg;
  reg.dirs_ = plugin_search_dirs(options);
  std::set<std::string> seen_files;
  for (const auto& dir : reg.dirs_) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      log_debug("plugin directory " + dir + " does not exist; skipped");
      continue;
    }
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      std::error_code e2;
      if (named_like_a_plugin(p) && fs::is_regular_file(p, e2)) files.push_back(p);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const std::string path = f.string();
      if (!seen_files.insert(canonical_or_same(path)).second) continue;  // same file via another dir
      std::string error;
      auto plugin = PluginLoader::load(path, host, &error);
      if (!plugin) {
        log_debug("plugin " + path + " not loaded: " + error);
        reg.failures_.push_back({path, error});
        continue;
      }
      if (auto kept = reg.find(plugin->name())) {
        std::string msg = "duplicate plugin name '" + plugin->name() + "': kept " + kept->path() + ", ignored this one";
        log_warn("plugin " + path + ": " + msg);
        reg.failures_.push_back({path, msg});
        continue;
      }
      log_debug("plugin '" + plugin->name() + "' " + plugin->version() + " loaded from " + path);
      reg.plugins_.push_back(std::move(plugin));
    }
  }
  return reg;
}

PluginRegistry PluginRegistry::load(const TrainingArguments& args, std::shared_ptr<const HostServices> host) {
  // The configuration has already merged KILN_PLUGIN_PATH into plugin_dirs (environment first).
  PluginSearchOptions o;
  o.dirs = args.runtime.plugin_dirs;
  return load(o, std::move(host));
}

std::shared_ptr<LoadedPlugin> PluginRegistry::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p->name() == name) return p;
  return nullptr;
}

std::vector<std::string> PluginRegistry::names() const {
  std::vector<std::string> n;
  for (const auto& p : plugins_) n.push_back(p->name());
  return n;
}

}  // namespace kiln
