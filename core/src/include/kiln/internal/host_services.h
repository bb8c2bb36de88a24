// The host side of the plugin ABI: the KilnHostApi table kiln hands to every plugin, and the
// objects behind it (logger, cache directory, [plugin.<name>] options, device memory, call_eager).
//
// Two hosts exist. HostServices::basic() lives in kiln_support and needs no LibTorch: logging,
// options, the cache directory and CPU memory from malloc; no call_eager. torch_host_services()
// lives in the kiln library (core/src/host): device memory from LibTorch's allocators and
// call_eager through the c10 dispatcher. The pipeline uses the torch host; `kiln plugins` may use
// either.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/config.h"
#include "kiln/plugin_api.h"

namespace kiln {

class HostServices {
 public:
  using Options = std::map<std::string, std::map<std::string, std::string>>;

  // Logging, cache_dir, get_option; device_alloc/free for CPU only (aligned malloc); no call_eager.
  static std::shared_ptr<HostServices> basic(const TrainingArguments& args);
  static std::shared_ptr<HostServices> basic(std::string cache_dir, Options plugin_options);

  virtual ~HostServices() = default;
  HostServices(const HostServices&) = delete;
  HostServices& operator=(const HostServices&) = delete;

  // The table handed to plugins; valid as long as this object lives.
  const KilnHostApi* api() const { return &api_; }
  const std::string& cache_dir() const { return cache_dir_; }
  const Options& plugin_options() const { return options_; }

 protected:
  HostServices(std::string cache_dir, Options plugin_options);
  // The table, with host_ctx pointing at this object; subclasses replace entries.
  KilnHostApi api_;

 private:
  std::string cache_dir_;
  Options options_;
};

// Errors the host returns through KilnHostApi (freed by the plugin with api()->error_destroy).
KilnError* make_host_error(KilnErrorCode code, const std::string& message);

// The full host: LibTorch allocators and call_eager. Defined in the kiln library, not kiln_support.
std::shared_ptr<HostServices> torch_host_services(const TrainingArguments& args);

}  // namespace kiln
