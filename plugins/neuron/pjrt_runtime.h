// A PJRT client inside the neuron plugin: any PJRT plugin (Neuron's libneuronpjrt.so on Trainium
// and Inferentia, XLA's CPU or CUDA plugin elsewhere) opened at run time through its one exported
// symbol, GetPjrtApi, and driven through the PJRT C API (pjrt_c_api.h, the header PyPI's
// xla-cpu-pjrt ships). Every PJRT_Error becomes a PjrtError carrying PJRT's own message and code,
// the plugin's path and the call that failed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "pjrt_c_api.h"

namespace kiln::neuron {

class PjrtError : public std::runtime_error {
 public:
  PjrtError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }  // PJRT_Error_Code, or -1 when the failure is not PJRT's

 private:
  int code_;
};

// A tensor handed to or taken from an executable: dense, row-major strides given in bytes. In host
// memory, or (on_device) in CUDA memory of the client's device, for a client of platform "cuda"
// in the same process as LibTorch's CUDA (both on the device's primary context).
struct HostTensor {
  PJRT_Buffer_Type type = PJRT_Buffer_Type_F32;
  std::vector<int64_t> dims;
  std::vector<int64_t> byte_strides;  // empty: row-major contiguous
  void* data = nullptr;
  size_t bytes = 0;  // of the dense data (outputs: the destination's size)
  bool on_device = false;
};

class PjrtClient;

// A compiled StableHLO module on the client's first device.
class PjrtExecutable {
 public:
  ~PjrtExecutable();
  PjrtExecutable(const PjrtExecutable&) = delete;
  PjrtExecutable& operator=(const PjrtExecutable&) = delete;
  size_t num_outputs() const { return num_outputs_; }
  // Hands the inputs to the plugin, runs, and copies each result into outputs[k] (dense,
  // row-major; its bytes must be the result's). Waits for the copies back. A dense row-major
  // input is passed as a view of its own memory where the plugin makes one
  // (PJRT_Client_CreateViewOfDeviceBuffer: no copy; the plugin reads it while this call runs),
  // else copied into a device buffer. With CUDA tensors (on_device; a "cuda" client): the work
  // enqueued on `stream` (the step's cudaStream_t) is waited for first, the inputs are views of
  // the tensors' memory (never a host round trip), and each result is copied device to device
  // into its output on `stream`, which is waited for before the plugin's buffers go.
  void run(const std::vector<HostTensor>& inputs, const std::vector<HostTensor>& outputs, void* stream = nullptr) const;
  // The plugin's own serialization (PJRT_Executable_Serialize): for PjrtClient::load in a later
  // process with the same plugin. Throws PjrtError where the plugin cannot.
  std::string serialize() const;

 private:
  friend class PjrtClient;
  PjrtExecutable(std::shared_ptr<const PjrtClient> client, PJRT_LoadedExecutable* exe, size_t num_outputs)
      : client_(std::move(client)), exe_(exe), num_outputs_(num_outputs) {}
  std::shared_ptr<const PjrtClient> client_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_;
};

class PjrtClient : public std::enable_shared_from_this<PjrtClient> {
 public:
  // Opens the PJRT plugin at `path` (kept loaded for the life of the process), checks that its API
  // is version 0.x with every function used here, initializes it and creates a client. One client
  // per path per process (PJRT plugins may not take a second).
  static std::shared_ptr<PjrtClient> open(const std::string& path);
  ~PjrtClient();

  const std::string& path() const { return path_; }
  const std::string& platform() const { return platform_; }  // "cpu", "cuda", "neuron", ... (read at open)
  int api_major() const { return api_->pjrt_api_version.major_version; }
  int api_minor() const { return api_->pjrt_api_version.minor_version; }
  // Compiles a StableHLO module in MLIR text for one replica and one partition.
  std::unique_ptr<PjrtExecutable> compile(const std::string& mlir) const;
  // Whether the plugin serializes and deserializes executables; load() deserializes one.
  bool can_serialize() const;
  std::unique_ptr<PjrtExecutable> load(const std::string& serialized) const;

  // Throws PjrtError for a non-null error, destroying it.
  void check(PJRT_Error* e, const char* call) const;
  const PJRT_Api* api() const { return api_; }
  PJRT_Client* raw() const { return client_; }
  PJRT_Device* device() const { return device_; }
  // Inputs passed as views of their memory, and copied, since the client opened.
  uint64_t inputs_viewed() const { return inputs_viewed_.load(); }
  uint64_t inputs_copied() const { return inputs_copied_.load(); }
  // Whether inputs are tried as views: the plugin has the call, and has not answered it
  // "unimplemented" (after which every input is copied).
  bool makes_views() const { return views_.load(); }

 private:
  PjrtClient(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {}
  std::unique_ptr<PjrtExecutable> wrap(PJRT_LoadedExecutable* loaded) const;  // counts its outputs
  std::string path_;
  const PJRT_Api* api_;
  PJRT_Client* client_ = nullptr;
  PJRT_Device* device_ = nullptr;
  mutable std::mutex mu_;  // executions and compiles one at a time
  mutable std::atomic<bool> views_{false};
  std::string platform_;
  mutable std::atomic<uint64_t> inputs_viewed_{0}, inputs_copied_{0};
  friend class PjrtExecutable;
};

// CompileOptionsProto with executable_build_options { num_replicas: 1, num_partitions: 1 },
// serialized (XLA's CPU plugin needs the build options; it is reported to crash on an empty message).
std::string single_device_compile_options();

}  // namespace kiln::neuron
