// Loading plugins: search directories, Boost.DLL, the ABI handshake, and the checks on everything a
// plugin returns. Every problem with a file becomes a PluginLoadFailure naming the file and the
// reason; nothing a plugin does wrong is trusted or allowed to crash the host.
#include "kiln/plugin_registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <type_traits>

#include <filesystem>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "kiln/log.h"
#include "kiln/plugin_api.hpp"

namespace fs = std::filesystem;  // Boost.DLL speaks std::filesystem too (BOOST_DLL_USE_STD_FS)

namespace kiln {

namespace {

// The smallest tables a 1.x plugin may return: the 1.0 layouts. A later minor keeps accepting
// these and checks KILN_HAS_FIELD before reading anything newer.
constexpr size_t kPluginApiSize_1_0 = KILN_STRUCT_SIZE(KilnPluginApi, shutdown);
constexpr size_t kDescriptorSize_1_0 = KILN_STRUCT_SIZE(KilnPluginDescriptor, reserved0);

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
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
  if (options.use_env) {
    if (const char* env = std::getenv("KILN_PLUGIN_PATH"); env && *env) {
      std::string all = env;
      size_t start = 0;
      while (start <= all.size()) {
        size_t end = all.find(':', start);
        if (end == std::string::npos) end = all.size();
        add_unique(dirs, seen, all.substr(start, end - start));
        start = end + 1;
      }
    }
  }
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
  static std::shared_ptr<LoadedPlugin> load(const std::string& path,
                                            const std::shared_ptr<const HostServices>& host,
                                            std::string* error);
};

std::shared_ptr<LoadedPlugin> PluginLoader::load(const std::string& path,
                                                 const std::shared_ptr<const HostServices>& host,
                                                 std::string* error) {
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
  KilnError* err = init(host->api(), KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR, &api);

  const std::string host_version = version_string(KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR);
  // The frozen header (struct_size, version, error functions) is all we may read before checking
  // the major version.
  const size_t header_size = offsetof(KilnPluginApi, plugin_ctx);
  const bool header_ok = api && api->struct_size >= header_size;
  const bool errors_readable = header_ok && api->error_code && api->error_message && api->error_destroy;
  auto take = [&](KilnError* e) {
    std::string m = errors_readable ? std::string(api->error_message(e) ? api->error_message(e) : "")
                                    : std::string("(no message: the plugin returned no error functions)");
    std::string code = errors_readable ? plugin::error_code_name(api->error_code(e)) : "unknown";
    if (errors_readable) api->error_destroy(e);
    return code + ": " + m;
  };

  if (header_ok && api->abi_major != KILN_ABI_VERSION_MAJOR) {
    if (err) take(err);
    *error = "plugin ABI " + version_string(api->abi_major, api->abi_minor) + " does not match kiln's plugin ABI " +
             host_version + " (major versions must be equal)";
    return nullptr;
  }
  if (err) {
    *error = "kiln_plugin_init failed (" + take(err) + ")";
    return nullptr;
  }
  if (!api) {
    *error = "kiln_plugin_init returned no function table";
    return nullptr;
  }

  // From here on the plugin has a live context; any rejection must shut it down.
  auto reject = [&](const std::string& why) -> std::shared_ptr<LoadedPlugin> {
    if (api->struct_size >= KILN_STRUCT_SIZE(KilnPluginApi, shutdown) && api->shutdown)
      api->shutdown(api->plugin_ctx);
    *error = why;
    return nullptr;
  };
  if (api->struct_size < kPluginApiSize_1_0)
    return reject("function table too small: struct_size " + std::to_string(api->struct_size) + ", ABI " +
                  host_version + " needs " + std::to_string(kPluginApiSize_1_0));
  if (!errors_readable) return reject("required function 'error_message', 'error_code' or 'error_destroy' is NULL");
  const KilnPluginDescriptor* d = api->descriptor;
  if (!d) return reject("descriptor is NULL");
  if (d->struct_size < kDescriptorSize_1_0)
    return reject("descriptor too small: struct_size " + std::to_string(d->struct_size) + ", ABI " + host_version +
                  " needs " + std::to_string(kDescriptorSize_1_0));
  if (!d->name) return reject("descriptor.name is NULL");
  if (!valid_plugin_name(d->name))
    return reject(std::string("descriptor.name '") + d->name + "' is not a valid plugin name ([a-z0-9_]+)");
  if (!d->version) return reject("descriptor.version is NULL");
  if (!d->vendor) return reject("descriptor.vendor is NULL");
  if (d->device_kinds == 0) return reject("descriptor.device_kinds is empty");
  if ((d->modes & KILN_MODE_BIT(KILN_MODE_DEFAULT)) == 0)
    return reject("descriptor.modes does not include 'default'");
  if (d->modes & ~KILN_MODE_MASK_ALL) return reject("descriptor.modes has unknown bits");
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
  p->concurrent_ = d->concurrent_execution_safe != 0;
  p->abi_major_ = api->abi_major;
  p->abi_minor_ = api->abi_minor;
  p->negotiated_minor_ = std::min<uint32_t>(api->abi_minor, KILN_ABI_VERSION_MINOR);
  return p;
}

// ---- LoadedPlugin -------------------------------------------------------------------------------

LoadedPlugin::~LoadedPlugin() {
  if (api_ && api_->shutdown) api_->shutdown(api_->plugin_ctx);
  api_ = nullptr;
  // library_ is released after this body: the plugin's code stays mapped through shutdown.
}

std::string LoadedPlugin::take_error(KilnError* error, KilnErrorCode* code) const {
  KilnErrorCode c = api_->error_code(error);
  const char* m = api_->error_message(error);
  std::string message = m ? m : "";
  api_->error_destroy(error);
  if (code) *code = c;
  return message;
}

PluginAvailability LoadedPlugin::available(const KilnDeviceInfo* const* devices, size_t num_devices) const {
  PluginAvailability result;
  if (!api_->available) {
    // No check of its own: available wherever a device of a kind it serves is present.
    for (size_t i = 0; i < num_devices; ++i) {
      if (devices[i] && (device_kinds_ & KILN_DEVICE_KIND_BIT(devices[i]->kind))) {
        result.available = true;
        result.reason = "a device of a kind it serves is present (" + device_kinds_string(device_kinds_) + ")";
        return result;
      }
    }
    result.reason = "no device of a kind it serves (" + device_kinds_string(device_kinds_) + ")";
    return result;
  }
  std::vector<char> reason(512, '\0');
  KilnAvailability out{};
  out.struct_size = KILN_AVAILABILITY_STRUCT_SIZE;
  out.reason = reason.data();
  out.reason_capacity = reason.size();
  KilnError* err = nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    err = api_->available(api_->plugin_ctx, devices, num_devices, &out);
  }
  reason.back() = '\0';  // whatever the plugin wrote, the string ends inside the buffer
  if (err) {
    KilnErrorCode code = 0;
    std::string m = take_error(err, &code);
    result.available = false;
    result.reason = "availability check failed (" + std::string(plugin::error_code_name(code)) + "): " + m;
    return result;
  }
  result.available = out.available != 0;
  result.score = out.score;
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
  size_t count = 0;
  KilnError* err = nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    err = api_->claim(api_->plugin_ctx, &graph, claimed.data(), &count);
  }
  if (err) {
    KilnErrorCode code = 0;
    std::string m = take_error(err, &code);
    throw PluginError(code, "plugin '" + name_ + "': claim failed (" + plugin::error_code_name(code) + "): " + m);
  }
  if (count > n)
    throw PluginError(KILN_ERROR_INTERNAL, "plugin '" + name_ + "' returned " + std::to_string(count) +
                                               " claims for a graph of " + std::to_string(n) + " nodes");
  std::vector<char> seen(n, 0);
  std::vector<int64_t> result(claimed.begin(), claimed.begin() + static_cast<std::ptrdiff_t>(count));
  for (int64_t idx : result) {
    if (idx < 0 || static_cast<size_t>(idx) >= n)
      throw PluginError(KILN_ERROR_INTERNAL,
                        "plugin '" + name_ + "' claimed node " + std::to_string(idx) + ", but the graph has " +
                            std::to_string(n) + " nodes" +
                            (n ? " (0.." + std::to_string(n - 1) + ")" : std::string()));
    if (seen[static_cast<size_t>(idx)]++)
      throw PluginError(KILN_ERROR_INTERNAL, "plugin '" + name_ + "' claimed node " + std::to_string(idx) + " twice");
  }
  return result;
}

std::unique_ptr<PluginExecutable> LoadedPlugin::compile(const KilnGraphView& subgraph, KilnMode mode,
                                                        const std::map<std::string, std::string>& options,
                                                        const std::string& cache_dir) const {
  if (!supports_mode(mode))
    throw PluginError(KILN_ERROR_INVALID_ARGUMENT, "plugin '" + name_ + "' does not support mode '" +
                                                       plugin::mode_name(mode) + "' (it supports " +
                                                       modes_string(modes_) + ")");
  std::vector<KilnOption> kvs;
  kvs.reserve(options.size());
  for (const auto& [k, v] : options) kvs.push_back(KilnOption{KILN_OPTION_STRUCT_SIZE, k.c_str(), v.c_str()});
  std::vector<const KilnOption*> kv_ptrs;
  for (const auto& kv : kvs) kv_ptrs.push_back(&kv);
  KilnCompileOptions o{};
  o.struct_size = KILN_COMPILE_OPTIONS_STRUCT_SIZE;
  o.mode = mode;
  o.num_options = kv_ptrs.size();
  o.options = kv_ptrs.data();
  o.cache_dir = cache_dir.c_str();
  KilnExecutable* exe = nullptr;
  KilnError* err = nullptr;
  {
    std::lock_guard<std::mutex> lock(call_mu_);
    err = api_->compile(api_->plugin_ctx, &subgraph, &o, &exe);
  }
  if (err) {
    if (exe) api_->executable_destroy(exe);
    KilnErrorCode code = 0;
    std::string m = take_error(err, &code);
    throw PluginError(code, "plugin '" + name_ + "': compile failed (" + plugin::error_code_name(code) + "): " + m);
  }
  if (!exe)
    throw PluginError(KILN_ERROR_INTERNAL, "plugin '" + name_ + "': compile returned neither an executable nor an error");
  return std::unique_ptr<PluginExecutable>(new PluginExecutable(shared_from_this(), exe));
}

std::unique_ptr<PluginExecutable> LoadedPlugin::compile(const KilnGraphView& subgraph, KilnMode mode) const {
  std::map<std::string, std::string> options;
  if (auto it = host_->plugin_options().find(name_); it != host_->plugin_options().end()) options = it->second;
  return compile(subgraph, mode, options, host_->cache_dir());
}

// ---- PluginExecutable ---------------------------------------------------------------------------

PluginExecutable::~PluginExecutable() {
  if (exe_) plugin_->api_->executable_destroy(exe_);
}

bool LoadedPlugin::accepts_runtime_scalars() const {
  return negotiated_minor_ >= 1 && KILN_HAS_FIELD(api_, KilnPluginApi, execute_with_scalars) &&
         api_->execute_with_scalars != nullptr;
}

bool LoadedPlugin::provides_device_graphs() const {
  return negotiated_minor_ >= 2 && KILN_HAS_FIELD(api_, KilnPluginApi, graph_destroy) && api_->graph_capture_begin &&
         api_->graph_capture_end && api_->graph_launch && api_->graph_destroy;
}

void LoadedPlugin::graph_capture_begin(DLDevice device, void* stream) const {
  if (!provides_device_graphs()) throw PluginError(KILN_ERROR_UNIMPLEMENTED, name_ + " does not record device graphs");
  if (KilnError* err = api_->graph_capture_begin(api_->plugin_ctx, device, stream)) {
    KilnErrorCode code = 0;
    std::string message = take_error(err, &code);
    throw PluginError(code, name_ + ": " + message);
  }
}

std::unique_ptr<PluginGraph> LoadedPlugin::graph_capture_end(DLDevice device, void* stream) const {
  if (!provides_device_graphs()) throw PluginError(KILN_ERROR_UNIMPLEMENTED, name_ + " does not record device graphs");
  KilnGraphExec* exec = nullptr;
  if (KilnError* err = api_->graph_capture_end(api_->plugin_ctx, device, stream, &exec)) {
    if (exec) api_->graph_destroy(exec);
    KilnErrorCode code = 0;
    std::string message = take_error(err, &code);
    throw PluginError(code, name_ + ": " + message);
  }
  if (!exec) throw PluginError(KILN_ERROR_INTERNAL, name_ + ": graph_capture_end returned no graph");
  return std::unique_ptr<PluginGraph>(new PluginGraph(shared_from_this(), exec));
}

PluginGraph::~PluginGraph() {
  if (exec_) plugin_->api_->graph_destroy(exec_);
}

void PluginGraph::launch(void* stream) const {
  if (KilnError* err = plugin_->api_->graph_launch(exec_, stream)) {
    KilnErrorCode code = 0;
    std::string message = plugin_->take_error(err, &code);
    throw PluginError(code, plugin_->name_ + ": " + message);
  }
}

void PluginExecutable::execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs,
                               size_t num_outputs, void* stream) const {
  execute(inputs, num_inputs, outputs, num_outputs, nullptr, 0, stream);
}

void PluginExecutable::execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                               const KilnArg* const* scalars, size_t num_scalars, void* stream) const {
  const bool with_scalars = plugin_->accepts_runtime_scalars();
  auto call = [&] {
    return with_scalars ? plugin_->api_->execute_with_scalars(exe_, inputs, num_inputs, outputs, num_outputs,
                                                              scalars, num_scalars, stream)
                        : plugin_->api_->execute(exe_, inputs, num_inputs, outputs, num_outputs, stream);
  };
  KilnError* err = nullptr;
  if (plugin_->concurrent_) {
    err = call();
  } else {
    std::lock_guard<std::mutex> lock(plugin_->execute_mu_);
    err = call();
  }
  if (err) {
    KilnErrorCode code = 0;
    std::string m = plugin_->take_error(err, &code);
    throw PluginError(code, "plugin '" + plugin_->name_ + "': execute failed (" + plugin::error_code_name(code) +
                                "): " + m);
  }
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
      if (p.extension() == ".so" && fs::is_regular_file(p, e2)) files.push_back(p);
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
