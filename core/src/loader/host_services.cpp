// The LibTorch-free host: logging into kiln's logger, the cache directory, [plugin.<name>] options
// and CPU memory. The torch host (core/src/host) starts from this one and adds the rest.
#include "kiln/internal/host_services.h"

#include <cstdlib>
#include <cstring>

#include "kiln/log.h"
#include "kiln/plugin_api.hpp"

namespace kiln {

namespace {

HostServices* self(void* ctx) { return static_cast<HostServices*>(ctx); }

LogLevel to_log_level(KilnLogLevel level) {
  switch (level) {
    case KILN_LOG_TRACE: return LogLevel::trace;
    case KILN_LOG_DEBUG: return LogLevel::debug;
    case KILN_LOG_INFO: return LogLevel::info;
    case KILN_LOG_WARN: return LogLevel::warn;
    case KILN_LOG_ERROR: return LogLevel::error;
    default: return LogLevel::critical;
  }
}

void host_log(KilnHostLogArgs* a) {
  try {
    log_plugin(a->plugin && *a->plugin ? a->plugin : "unnamed", to_log_level(a->level), a->message ? a->message : "");
  } catch (...) {
    // A logging failure must not cross into the plugin.
  }
}

// CPU memory, 64-byte aligned (a cache line and an AVX-512 vector).
KilnError* host_cpu_alloc(KilnHostDeviceAllocArgs* a) {
  if (!a) return make_host_error(KILN_ERROR_INVALID_ARGUMENT, "device_alloc: args is NULL");
  a->ptr = nullptr;
  if (a->device.device_type != kDLCPU)
    return make_host_error(KILN_ERROR_UNAVAILABLE, "device_alloc: this host only allocates CPU memory (device type " +
                                                       std::to_string(static_cast<int>(a->device.device_type)) + ")");
  size_t rounded = (a->nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p)
    return make_host_error(KILN_ERROR_OUT_OF_MEMORY,
                           "device_alloc: cannot allocate " + std::to_string(a->nbytes) + " bytes");
  a->ptr = p;
  return nullptr;
}

void host_cpu_free(KilnHostDeviceFreeArgs* a) { std::free(a->ptr); }

void host_cache_dir(KilnHostCacheDirArgs* a) { a->cache_dir = self(a->host_ctx)->cache_dir().c_str(); }

void host_get_option(KilnHostGetOptionArgs* a) {
  a->value = nullptr;
  if (!a->plugin || !a->key) return;
  const auto& all = self(a->host_ctx)->plugin_options();
  auto p = all.find(a->plugin);
  if (p == all.end()) return;
  auto v = p->second.find(a->key);
  if (v != p->second.end()) a->value = v->second.c_str();
}

}  // namespace

KilnError* make_host_error(KilnErrorCode code, const std::string& message) {
  return plugin::detail::make_error(code, message);
}

HostServices::HostServices(std::string cache_dir, Options plugin_options)
    : cache_dir_(std::move(cache_dir)), options_(std::move(plugin_options)) {
  std::memset(&api_, 0, sizeof api_);
  api_.struct_size = KILN_HOST_API_STRUCT_SIZE;
  api_.abi_major = KILN_ABI_VERSION_MAJOR;
  api_.abi_minor = KILN_ABI_VERSION_MINOR;
  api_.error_code = &plugin::detail::error_code;
  api_.error_message = &plugin::detail::error_message;
  api_.error_destroy = &plugin::detail::error_destroy;
  api_.host_ctx = this;
  api_.log = &host_log;
  api_.device_alloc = &host_cpu_alloc;
  api_.device_free = &host_cpu_free;
  api_.cache_dir = &host_cache_dir;
  api_.get_option = &host_get_option;
  api_.call_eager = nullptr;
}

std::shared_ptr<HostServices> HostServices::basic(std::string cache_dir, Options plugin_options) {
  return std::shared_ptr<HostServices>(new HostServices(std::move(cache_dir), std::move(plugin_options)));
}

std::shared_ptr<HostServices> HostServices::basic(const TrainingArguments& args) {
  return basic(args.runtime.cache_dir, args.plugin_options);
}

}  // namespace kiln
