#include "synapse_runtime.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

namespace kiln::hpu {

namespace {

// Looks `name` up in `h` into `fn`; the missing names are collected for one message.
template <class F>
void bind(void* h, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  if (!*fn) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

std::string dims_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

std::shared_ptr<SynapseLibrary> SynapseLibrary::open(const std::string& path) {
  // Opened once per path and never closed: recipes and devices outlive any one compile, and the
  // library's own threads must not lose their code.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<SynapseLibrary>> opened;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = opened.find(path); it != opened.end()) return it->second;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    throw SynapseError("the Synapse library " + path + " cannot be loaded (" + (why ? why : "unknown dlopen error") +
                       ")");
  }
  auto lib = std::shared_ptr<SynapseLibrary>(new SynapseLibrary());
  lib->path_ = path;
  lib->handle_ = h;
  std::string missing;
  bind(h, "synInitialize", &lib->initialize, &missing);
  bind(h, "synDestroy", &lib->destroy, &missing);
  bind(h, "synDeviceAcquire", &lib->device_acquire, &missing);
  bind(h, "synDeviceRelease", &lib->device_release, &missing);
  bind(h, "synDeviceGetInfo", &lib->device_get_info, &missing);
  bind(h, "synStreamCreateGeneric", &lib->stream_create, &missing);
  bind(h, "synStreamDestroy", &lib->stream_destroy, &missing);
  bind(h, "synStreamSynchronize", &lib->stream_synchronize, &missing);
  bind(h, "synGraphCreate", &lib->graph_create, &missing);
  bind(h, "synGraphDestroy", &lib->graph_destroy, &missing);
  bind(h, "synSectionCreate", &lib->section_create, &missing);
  bind(h, "synSectionDestroy", &lib->section_destroy, &missing);
  bind(h, "synTensorHandleCreate", &lib->tensor_create, &missing);
  bind(h, "synTensorAssignToSection", &lib->tensor_assign_to_section, &missing);
  bind(h, "synTensorSetGeometry", &lib->tensor_set_geometry, &missing);
  bind(h, "synTensorSetDeviceDataType", &lib->tensor_set_device_data_type, &missing);
  bind(h, "synTensorDestroy", &lib->tensor_destroy, &missing);
  bind(h, "synNodeCreate", &lib->node_create, &missing);
  bind(h, "synGraphCompile", &lib->graph_compile, &missing);
  bind(h, "synRecipeDestroy", &lib->recipe_destroy, &missing);
  bind(h, "synWorkspaceGetSize", &lib->workspace_get_size, &missing);
  bind(h, "synTensorRetrieveIds", &lib->tensor_retrieve_ids, &missing);
  bind(h, "synDeviceMalloc", &lib->device_malloc, &missing);
  bind(h, "synDeviceFree", &lib->device_free, &missing);
  bind(h, "synHostMap", &lib->host_map, &missing);
  bind(h, "synHostUnmap", &lib->host_unmap, &missing);
  bind(h, "synMemCopyAsync", &lib->mem_copy_async, &missing);
  bind(h, "synLaunchExt", &lib->launch, &missing);
  if (!missing.empty()) {
    dlclose(h);
    throw SynapseError("the Synapse library " + path + " lacks entry points the hpu_backend calls: " + missing);
  }
  // Optional: the recipe cache on disk, and statuses in words.
  lib->recipe_serialize = reinterpret_cast<syn::RecipeSerializeFn>(dlsym(h, "synRecipeSerialize"));
  lib->recipe_deserialize = reinterpret_cast<syn::RecipeDeserializeFn>(dlsym(h, "synRecipeDeSerialize"));
  lib->status_description =
      reinterpret_cast<syn::StatusGetBriefDescriptionFn>(dlsym(h, "synStatusGetBriefDescription"));
  opened[path] = lib;
  return lib;
}

std::string SynapseLibrary::describe(syn::Status s) const {
  std::string text = "synStatus " + std::to_string(static_cast<int>(s));
  if (status_description) {
    char buf[128] = {0};
    if (status_description(s, buf, sizeof buf - 1) == syn::kSuccess && buf[0]) text += " (" + std::string(buf) + ")";
  }
  return text;
}

void SynapseLibrary::check(syn::Status s, const char* call, const std::string& what) const {
  if (s == syn::kSuccess) return;
  const bool oom =
      s == syn::kOutOfDeviceMemory || s == syn::kFailedToAllocateDeviceMemory || s == syn::kOutOfHostMemory;
  throw SynapseError(std::string(call) + " failed (" + what + "): " + describe(s), oom);
}

Device::Device(std::shared_ptr<SynapseLibrary> lib) : lib_(std::move(lib)) {}

std::shared_ptr<Device> Device::get(const std::shared_ptr<SynapseLibrary>& lib) {
  // One device per process: a second synDeviceAcquire of the same Gaudi fails, and every recipe
  // and buffer of the process belongs to the one acquired first. Kept while anything uses it.
  static std::mutex mu;
  static std::weak_ptr<Device> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto d = current.lock()) {
    if (d->lib_->path() != lib->path())
      throw SynapseError("the Gaudi of this process was acquired through " + d->lib_->path() +
                         "; a second Synapse library (" + lib->path() + ") cannot acquire it too");
    return d;
  }
  auto d = std::make_shared<Device>(lib);
  const syn::Status init = lib->initialize();
  if (init != syn::kAlreadyInitialized && init != 5 /* object already initialized */)
    lib->check(init, "synInitialize", "starting the Synapse runtime");
  d->initialized_ = init == syn::kSuccess;
  lib->check(lib->device_acquire(&d->id_, nullptr), "synDeviceAcquire", "acquiring the first Gaudi");
  d->acquired_ = true;
  syn::DeviceInfo info{};
  lib->check(lib->device_get_info(d->id_, &info), "synDeviceGetInfo", "the acquired Gaudi's type");
  d->type_ = info.device_type;
  lib->check(lib->stream_create(&d->stream_, d->id_, 0), "synStreamCreateGeneric", "the backend's stream");
  current = d;
  return d;
}

Device::~Device() {
  // Teardown cannot report errors to anyone; statuses are ignored.
  if (stream_) lib_->stream_destroy(stream_);
  if (acquired_) lib_->device_release(id_);
  if (initialized_) lib_->destroy();
}

Recipe::~Recipe() {
  if (handle_) device_->lib().recipe_destroy(handle_);
}

void Recipe::query(const std::vector<std::string>& names) {
  const auto& lib = device_->lib();
  lib.check(lib.workspace_get_size(&workspace_, handle_), "synWorkspaceGetSize", "recipe " + name_);
  std::vector<const char*> ptrs;
  for (const auto& n : names) ptrs.push_back(n.c_str());
  ids_.assign(names.size(), 0);
  if (!names.empty())
    lib.check(lib.tensor_retrieve_ids(handle_, ptrs.data(), ids_.data(), static_cast<uint32_t>(ptrs.size())),
              "synTensorRetrieveIds", "the persistent tensors of recipe " + name_);
}

std::vector<int32_t> persistent_tensors(const SynGraph& g) {
  std::vector<int32_t> p;
  for (int32_t t : g.inputs)
    if (t >= 0 && std::find(p.begin(), p.end(), t) == p.end()) p.push_back(t);
  for (int32_t t : g.scalars) p.push_back(t);
  for (int32_t t : g.size_scalars) p.push_back(t);
  for (int32_t t : g.shape_tensors) p.push_back(t);
  for (int32_t t : g.outputs) p.push_back(t);
  return p;
}

uint64_t device_bytes(const std::vector<int64_t>& shape, syn::DataType dtype) {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  const uint64_t es = dtype == syn::kTypeBf16 || dtype == syn::kTypeInt16 ? 2 : dtype == syn::kTypeInt8 ? 1 : 4;
  return n * es;
}

namespace {

// Everything synGraphCreate started, destroyed in reverse whatever happens.
struct GraphScope {
  explicit GraphScope(const SynapseLibrary& l) : lib(l) {}
  const SynapseLibrary& lib;
  syn::GraphHandle graph = nullptr;
  std::vector<syn::TensorHandle> tensors;
  std::vector<syn::SectionHandle> sections;
  ~GraphScope() {
    for (auto t : tensors)
      if (t) lib.tensor_destroy(t);
    for (auto s : sections)
      if (s) lib.section_destroy(s);
    if (graph) lib.graph_destroy(graph);
  }
};

}  // namespace

std::shared_ptr<Recipe> compile_graph(const std::shared_ptr<Device>& device, const SynGraph& g,
                                      const std::string& name) {
  const SynapseLibrary& lib = device->lib();
  GraphScope s(lib);
  lib.check(lib.graph_create(&s.graph, device->type()), "synGraphCreate", "graph " + name);
  const auto persistent = persistent_tensors(g);
  s.tensors.assign(g.tensors.size(), nullptr);
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const SynTensor& t = g.tensors[i];
    const std::string what =
        "tensor " + std::to_string(i) + " \"" + t.name + "\" " + dims_text(t.shape) + " of graph " + name;
    const bool shape_tensor = t.kind == SynTensor::Kind::kShape;
    lib.check(
        lib.tensor_create(&s.tensors[i], s.graph, shape_tensor ? syn::kShapeTensor : syn::kDataTensor, t.name.c_str()),
        "synTensorHandleCreate", what);
    lib.check(lib.tensor_set_device_data_type(s.tensors[i], t.dtype), "synTensorSetDeviceDataType", what);
    // Sizes fastest first; a rank-0 value is a tensor of one element. A tensor whose sizes change
    // has its largest sizes and its smallest.
    auto geometry = [](const std::vector<int64_t>& shape) {
      syn::TensorGeometry geo{};
      geo.dims = shape.empty() ? 1 : static_cast<uint32_t>(shape.size());
      geo.sizes[0] = 1;
      for (size_t d = 0; d < shape.size(); ++d) geo.sizes[d] = static_cast<uint64_t>(shape[shape.size() - 1 - d]);
      return geo;
    };
    const syn::TensorGeometry max = geometry(t.shape);
    lib.check(lib.tensor_set_geometry(s.tensors[i], &max, t.dynamic() ? syn::kGeometryMaxSizes : syn::kGeometrySizes),
              "synTensorSetGeometry", what);
    if (t.dynamic()) {
      const syn::TensorGeometry min = geometry(t.min_shape);
      lib.check(lib.tensor_set_geometry(s.tensors[i], &min, syn::kGeometryMinSizes), "synTensorSetGeometry",
                what + " (its smallest sizes " + dims_text(t.min_shape) + ")");
    }
    if (!shape_tensor && std::find(persistent.begin(), persistent.end(), static_cast<int32_t>(i)) != persistent.end()) {
      // Each persistent tensor in a section of its own: its device buffer is given at launch.
      syn::SectionHandle sec = nullptr;
      lib.check(lib.section_create(&sec, 0, s.graph), "synSectionCreate", what);
      s.sections.push_back(sec);
      lib.check(lib.tensor_assign_to_section(s.tensors[i], sec, 0), "synTensorAssignToSection", what);
    }
  }
  for (const SynNode& n : g.nodes) {
    std::vector<syn::TensorHandle> ins, outs;
    for (int32_t t : n.inputs) ins.push_back(s.tensors[static_cast<size_t>(t)]);
    for (int32_t t : n.outputs) outs.push_back(s.tensors[static_cast<size_t>(t)]);
    lib.check(lib.node_create(s.graph, ins.data(), outs.data(), static_cast<uint32_t>(ins.size()),
                              static_cast<uint32_t>(outs.size()), n.params.empty() ? nullptr : n.params.data(),
                              static_cast<unsigned>(n.params.size()), n.guid.c_str(), n.name.c_str(), nullptr, nullptr),
              "synNodeCreate", "node " + n.name + " (" + n.guid + ") of graph " + name);
  }
  syn::RecipeHandle h = nullptr;
  lib.check(lib.graph_compile(&h, s.graph, name.c_str(), nullptr), "synGraphCompile", "graph " + name);
  auto recipe = std::make_shared<Recipe>(device, h, name);
  std::vector<std::string> names;
  for (int32_t t : persistent) names.push_back(g.tensors[static_cast<size_t>(t)].name);
  recipe->query(names);
  return recipe;
}

bool serialize_recipe(const Recipe& r, const std::string& file, std::string* why) {
  const SynapseLibrary& lib = r.device().lib();
  if (!lib.recipe_serialize) {
    *why = lib.path() + " has no synRecipeSerialize";
    return false;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  const syn::Status st = lib.recipe_serialize(r.handle(), tmp.c_str());
  if (st != syn::kSuccess) {
    std::filesystem::remove(tmp, ec);
    *why = "synRecipeSerialize failed: " + lib.describe(st);
    return false;
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    *why = "renaming " + tmp + " to " + file + ": " + ec.message();
    return false;
  }
  return true;
}

std::shared_ptr<Recipe> deserialize_recipe(const std::shared_ptr<Device>& device, const std::string& file,
                                           const std::string& name, std::string* why) {
  const SynapseLibrary& lib = device->lib();
  if (!lib.recipe_deserialize) {
    *why = lib.path() + " has no synRecipeDeSerialize";
    return nullptr;
  }
  syn::RecipeHandle h = nullptr;
  const syn::Status st = lib.recipe_deserialize(&h, file.c_str());
  if (st != syn::kSuccess || !h) {
    *why = "synRecipeDeSerialize failed: " + lib.describe(st);
    return nullptr;
  }
  return std::make_shared<Recipe>(device, h, name);
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<Device> device, uint64_t bytes, const std::string& what)
    : device_(std::move(device)), bytes_(bytes) {
  const auto& lib = device_->lib();
  lib.check(lib.device_malloc(device_->id(), bytes ? bytes : 1, 0, 0, &address_), "synDeviceMalloc",
            std::to_string(bytes) + " bytes for " + what);
}

DeviceBuffer::~DeviceBuffer() {
  if (address_) device_->lib().device_free(device_->id(), address_, 0);
}

HostBuffer::HostBuffer(std::shared_ptr<Device> device, uint64_t bytes, const std::string& what)
    : device_(std::move(device)), data_(bytes ? bytes : 1) {
  const auto& lib = device_->lib();
  lib.check(lib.host_map(device_->id(), data_.size(), data_.data()), "synHostMap",
            std::to_string(bytes) + " bytes of host memory for " + what);
  mapped_ = true;
}

HostBuffer::~HostBuffer() {
  if (mapped_) device_->lib().host_unmap(device_->id(), data_.data());
}

}  // namespace kiln::hpu
