// libSynapse.so opened at run time, the one Gaudi the process acquires, and what the hpu_backend
// does with them: compile a SynGraph into a recipe, and launch a recipe on buffers in device
// memory with host copies in and out. Every call that does not return synSuccess becomes a
// SynapseError naming the call, what it was for, and the status as the library describes it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "synapse_abi.h"
#include "synapse_lower.h"

namespace kiln::hpu {

class SynapseError : public std::runtime_error {
 public:
  SynapseError(const std::string& m, bool out_of_memory = false)
      : std::runtime_error(m), out_of_memory_(out_of_memory) {}
  bool out_of_memory() const { return out_of_memory_; }

 private:
  bool out_of_memory_;
};

// The entry points of one libSynapse.so (or a library standing in for it), looked up once.
class SynapseLibrary {
 public:
  // The library at `path` (a file name is searched as dlopen searches), opened once per process
  // and kept open. Throws SynapseError when it does not open or lacks an entry point.
  static std::shared_ptr<SynapseLibrary> open(const std::string& path);
  const std::string& path() const { return path_; }

  // Throws SynapseError("<call> failed (<what>): <status>") unless `s` is synSuccess.
  void check(syn::Status s, const char* call, const std::string& what) const;
  std::string describe(syn::Status s) const;

  syn::InitializeFn initialize = nullptr;
  syn::DestroyFn destroy = nullptr;
  syn::DeviceAcquireFn device_acquire = nullptr;
  syn::DeviceReleaseFn device_release = nullptr;
  syn::DeviceGetInfoFn device_get_info = nullptr;
  syn::StreamCreateGenericFn stream_create = nullptr;
  syn::StreamDestroyFn stream_destroy = nullptr;
  syn::StreamSynchronizeFn stream_synchronize = nullptr;
  syn::GraphCreateFn graph_create = nullptr;
  syn::GraphDestroyFn graph_destroy = nullptr;
  syn::SectionCreateFn section_create = nullptr;
  syn::SectionDestroyFn section_destroy = nullptr;
  syn::TensorHandleCreateFn tensor_create = nullptr;
  syn::TensorAssignToSectionFn tensor_assign_to_section = nullptr;
  syn::TensorSetGeometryFn tensor_set_geometry = nullptr;
  syn::TensorSetDeviceDataTypeFn tensor_set_device_data_type = nullptr;
  syn::TensorDestroyFn tensor_destroy = nullptr;
  syn::NodeCreateFn node_create = nullptr;
  syn::GraphCompileFn graph_compile = nullptr;
  syn::RecipeDestroyFn recipe_destroy = nullptr;
  syn::RecipeSerializeFn recipe_serialize = nullptr;
  syn::RecipeDeserializeFn recipe_deserialize = nullptr;
  syn::WorkspaceGetSizeFn workspace_get_size = nullptr;
  syn::TensorRetrieveIdsFn tensor_retrieve_ids = nullptr;
  syn::DeviceMallocFn device_malloc = nullptr;
  syn::DeviceFreeFn device_free = nullptr;
  syn::HostMapFn host_map = nullptr;
  syn::HostUnmapFn host_unmap = nullptr;
  syn::MemCopyAsyncFn mem_copy_async = nullptr;
  syn::LaunchExtFn launch = nullptr;
  syn::StatusGetBriefDescriptionFn status_description = nullptr;

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// The process's Gaudi: synInitialize, the first device synDeviceAcquire gives, its type, and one
// stream; released (stream, device, synDestroy) when the last recipe and buffer let go of it.
class Device {
 public:
  // The device of `lib`, acquired on first use. Throws SynapseError.
  static std::shared_ptr<Device> get(const std::shared_ptr<SynapseLibrary>& lib);
  ~Device();
  const SynapseLibrary& lib() const { return *lib_; }
  syn::DeviceId id() const { return id_; }
  int32_t type() const { return type_; }
  syn::StreamHandle stream() const { return stream_; }
  std::mutex& mutex() { return mu_; }

  Device(std::shared_ptr<SynapseLibrary> lib);

 private:
  std::shared_ptr<SynapseLibrary> lib_;
  syn::DeviceId id_ = 0;
  int32_t type_ = 0;
  syn::StreamHandle stream_ = nullptr;
  bool acquired_ = false, initialized_ = false;
  std::mutex mu_;
};

// A compiled recipe, with the ids of its persistent tensors and the workspace it needs.
class Recipe {
 public:
  Recipe(std::shared_ptr<Device> device, syn::RecipeHandle h, std::string name)
      : device_(std::move(device)), handle_(h), name_(std::move(name)) {}
  ~Recipe();
  Recipe(const Recipe&) = delete;
  Recipe& operator=(const Recipe&) = delete;
  syn::RecipeHandle handle() const { return handle_; }
  const std::string& name() const { return name_; }
  Device& device() const { return *device_; }
  // Fills the persistent tensors' ids and the workspace size (after compile or deserialize).
  void query(const std::vector<std::string>& persistent_names);
  const std::vector<uint64_t>& ids() const { return ids_; }
  uint64_t workspace_size() const { return workspace_; }

 private:
  std::shared_ptr<Device> device_;
  syn::RecipeHandle handle_;
  std::string name_;
  std::vector<uint64_t> ids_;
  uint64_t workspace_ = 0;
};

// The persistent tensors of a graph, in the order a launch lists them: inputs, scalars, outputs.
std::vector<int32_t> persistent_tensors(const SynGraph& g);

// synGraphCreate, a section and synTensor per persistent tensor, a synTensor per workspace
// tensor, synNodeCreate per node, synGraphCompile; the graph, its tensors and sections are
// destroyed whether it compiles or not. `name` names the recipe and every error.
std::shared_ptr<Recipe> compile_graph(const std::shared_ptr<Device>& device, const SynGraph& g,
                                      const std::string& name);

// synRecipeSerialize into `file` through a temporary name renamed over it (a reader never sees a
// partial file); false with `why` set where it could not be written.
bool serialize_recipe(const Recipe& r, const std::string& file, std::string* why);
// synRecipeDeSerialize of `file`; null with `why` set where the library did not take it.
std::shared_ptr<Recipe> deserialize_recipe(const std::shared_ptr<Device>& device, const std::string& file,
                                           const std::string& name, std::string* why);

// A synDeviceMalloc'd buffer, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(std::shared_ptr<Device> device, uint64_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint64_t address() const { return address_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Device> device_;
  uint64_t address_ = 0, bytes_ = 0;
};

// Host memory mapped for the device's DMA (synHostMap), unmapped with the object.
class HostBuffer {
 public:
  HostBuffer(std::shared_ptr<Device> device, uint64_t bytes, const std::string& what);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* data() { return data_.data(); }
  uint64_t bytes() const { return data_.size(); }

 private:
  std::shared_ptr<Device> device_;
  std::vector<char> data_;
  bool mapped_ = false;
};

// Bytes of a tensor of `shape` and `dtype` on the device (a rank-0 tensor holds one element).
uint64_t device_bytes(const std::vector<int64_t>& shape, syn::DataType dtype);

}  // namespace kiln::hpu
