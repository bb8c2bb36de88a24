#include "pjrt_runtime.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <map>

namespace kiln::neuron {

namespace {

template <class Args>
Args args_of(size_t struct_size) {
  Args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = struct_size;
  return a;
}

// Whether the plugin's PJRT_Api has the function at byte `offset` (its struct is as long as the
// API version it was built with) and sets it.
bool has_fn(const PJRT_Api* api, size_t offset) {
  if (api->struct_size < offset + sizeof(void*)) return false;
  void* fn = nullptr;
  std::memcpy(&fn, reinterpret_cast<const char*>(api) + offset, sizeof fn);
  return fn != nullptr;
}

#define KILN_PJRT_FN(name) \
  { #name, offsetof(PJRT_Api, name) }
const std::vector<std::pair<const char*, size_t>>& used_functions() {
  static const std::vector<std::pair<const char*, size_t>> fns = {
      KILN_PJRT_FN(PJRT_Error_Destroy),
      KILN_PJRT_FN(PJRT_Error_Message),
      KILN_PJRT_FN(PJRT_Error_GetCode),
      KILN_PJRT_FN(PJRT_Plugin_Initialize),
      KILN_PJRT_FN(PJRT_Event_Destroy),
      KILN_PJRT_FN(PJRT_Event_Await),
      KILN_PJRT_FN(PJRT_Client_Create),
      KILN_PJRT_FN(PJRT_Client_Destroy),
      KILN_PJRT_FN(PJRT_Client_PlatformName),
      KILN_PJRT_FN(PJRT_Client_AddressableDevices),
      KILN_PJRT_FN(PJRT_Client_Compile),
      KILN_PJRT_FN(PJRT_Client_BufferFromHostBuffer),
      KILN_PJRT_FN(PJRT_LoadedExecutable_Destroy),
      KILN_PJRT_FN(PJRT_LoadedExecutable_GetExecutable),
      KILN_PJRT_FN(PJRT_LoadedExecutable_Execute),
      KILN_PJRT_FN(PJRT_Executable_NumOutputs),
      KILN_PJRT_FN(PJRT_Executable_Destroy),
      KILN_PJRT_FN(PJRT_Buffer_Destroy),
      KILN_PJRT_FN(PJRT_Buffer_ToHostBuffer),
  };
  return fns;
}
#undef KILN_PJRT_FN

// Frees an error nobody reports (one from a destructor or cleanup); NULL is fine.
void drop(const PJRT_Api* api, PJRT_Error* e) {
  if (!e) return;
  auto d = args_of<PJRT_Error_Destroy_Args>(PJRT_Error_Destroy_Args_STRUCT_SIZE);
  d.error = e;
  api->PJRT_Error_Destroy(&d);
}

constexpr uintptr_t kViewAlignment = 64;

// Bytes of one element; 0 for a type kiln does not pass.
int64_t ty_bytes(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED:
    case PJRT_Buffer_Type_S8:
    case PJRT_Buffer_Type_U8: return 1;
    case PJRT_Buffer_Type_S16:
    case PJRT_Buffer_Type_U16:
    case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16: return 2;
    case PJRT_Buffer_Type_S32:
    case PJRT_Buffer_Type_U32:
    case PJRT_Buffer_Type_F32: return 4;
    case PJRT_Buffer_Type_S64:
    case PJRT_Buffer_Type_U64:
    case PJRT_Buffer_Type_F64: return 8;
    default: return 0;
  }
}

// The CUDA driver calls that move a CUDA client's results into LibTorch's tensors, from the
// driver library any CUDA process has loaded (the plugin links no CUDA library: on a Neuron machine
// there is none).
struct CudaDriver {
  using Sync = int (*)(void*);
  using CopyAsync = int (*)(unsigned long long, unsigned long long, size_t, void*);
  using ErrorName = int (*)(int, const char**);
  using Alloc = int (*)(unsigned long long*, size_t);
  using Free = int (*)(unsigned long long);
  Sync stream_synchronize = nullptr;
  CopyAsync memcpy_dtod_async = nullptr;
  ErrorName error_name = nullptr;
  Alloc mem_alloc = nullptr;
  Free mem_free = nullptr;
  std::string problem;  // why it cannot be used; empty when it can

  static const CudaDriver& get() {
    static const CudaDriver d = [] {
      CudaDriver r;
      void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* e = dlerror();
        r.problem = std::string("the CUDA driver (libcuda.so.1) cannot be loaded: ") + (e ? e : "unknown error");
        return r;
      }
      r.stream_synchronize = reinterpret_cast<Sync>(dlsym(h, "cuStreamSynchronize"));
      r.memcpy_dtod_async = reinterpret_cast<CopyAsync>(dlsym(h, "cuMemcpyDtoDAsync_v2"));
      r.error_name = reinterpret_cast<ErrorName>(dlsym(h, "cuGetErrorName"));
      r.mem_alloc = reinterpret_cast<Alloc>(dlsym(h, "cuMemAlloc_v2"));
      r.mem_free = reinterpret_cast<Free>(dlsym(h, "cuMemFree_v2"));
      if (!r.stream_synchronize || !r.memcpy_dtod_async || !r.error_name || !r.mem_alloc || !r.mem_free)
        r.problem =
            "the CUDA driver lacks cuStreamSynchronize, cuMemcpyDtoDAsync_v2, cuGetErrorName, cuMemAlloc_v2 or "
            "cuMemFree_v2";
      return r;
    }();
    return d;
  }
  void check(int rc, const std::string& what) const {
    if (rc == 0) return;
    const char* name = nullptr;
    error_name(rc, &name);
    throw PjrtError(what + " failed: " + (name ? name : "CUDA error " + std::to_string(rc)), -1);
  }
};

// A device buffer destroyed when it goes out of scope.
struct BufferGuard {
  const PJRT_Api* api;
  PJRT_Buffer* b = nullptr;
  ~BufferGuard() {
    if (!b) return;
    auto a = args_of<PJRT_Buffer_Destroy_Args>(PJRT_Buffer_Destroy_Args_STRUCT_SIZE);
    a.buffer = b;
    drop(api, api->PJRT_Buffer_Destroy(&a));
  }
};

}  // namespace

std::string single_device_compile_options() {
  // CompileOptionsProto field 3 (executable_build_options, length-delimited) holding
  // ExecutableBuildOptionsProto field 4 (num_replicas) = 1 and field 5 (num_partitions) = 1.
  return std::string("\x1a\x04\x20\x01\x28\x01", 6);
}

void PjrtClient::check(PJRT_Error* e, const char* call) const {
  if (!e) return;
  auto m = args_of<PJRT_Error_Message_Args>(PJRT_Error_Message_Args_STRUCT_SIZE);
  m.error = e;
  api_->PJRT_Error_Message(&m);
  std::string message = m.message ? std::string(m.message, m.message_size) : "(no message)";
  auto c = args_of<PJRT_Error_GetCode_Args>(PJRT_Error_GetCode_Args_STRUCT_SIZE);
  c.error = e;
  int code = -1;
  PJRT_Error* ce = api_->PJRT_Error_GetCode(&c);
  if (!ce) code = static_cast<int>(c.code);
  drop(api_, e);
  drop(api_, ce);
  throw PjrtError("PJRT plugin " + path_ + ": " + call + " failed" +
                      (code >= 0 ? " (PJRT error code " + std::to_string(code) + ")" : "") + ": " + message,
                  code);
}

std::shared_ptr<PjrtClient> PjrtClient::open(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<PjrtClient>> clients;
  std::lock_guard<std::mutex> lock(mu);
  if (auto c = clients[path].lock()) return c;
  // RTLD_NODELETE: XLA's plugins keep threads and static state that outlive a dlclose.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    const char* why = dlerror();
    throw PjrtError("cannot load the PJRT plugin " + path + ": " + (why ? why : "dlopen failed"), -1);
  }
  using GetApi = const PJRT_Api* (*)();
  auto get = reinterpret_cast<GetApi>(dlsym(h, "GetPjrtApi"));
  if (!get) throw PjrtError(path + " is not a PJRT plugin: it exports no GetPjrtApi", -1);
  const PJRT_Api* api = get();
  if (!api) throw PjrtError("PJRT plugin " + path + ": GetPjrtApi returned NULL", -1);
  if (api->pjrt_api_version.major_version != PJRT_API_MAJOR)
    throw PjrtError("PJRT plugin " + path + " has PJRT C API " + std::to_string(api->pjrt_api_version.major_version) +
                        "." + std::to_string(api->pjrt_api_version.minor_version) + "; kiln speaks " +
                        std::to_string(PJRT_API_MAJOR) + ".x (built against " + std::to_string(PJRT_API_MAJOR) + "." +
                        std::to_string(PJRT_API_MINOR) + ")",
                    -1);
  for (const auto& [name, offset] : used_functions())
    if (!has_fn(api, offset))
      throw PjrtError("PJRT plugin " + path + " (PJRT C API " + std::to_string(api->pjrt_api_version.major_version) +
                          "." + std::to_string(api->pjrt_api_version.minor_version) + ") lacks " + name +
                          ", which kiln needs",
                      -1);
  std::shared_ptr<PjrtClient> c(new PjrtClient(path, api));
  auto init = args_of<PJRT_Plugin_Initialize_Args>(PJRT_Plugin_Initialize_Args_STRUCT_SIZE);
  c->check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  // XLA's GPU client takes 75 % of the device's memory up front unless told otherwise
  // ("preallocate"), which would leave LibTorch, in the same process, a quarter of the GPU. Asked
  // to grow on demand. A plugin may refuse options it does not know (XLA's plugins check their
  // names; the CPU plugin of xla-cpu-pjrt takes this one and ignores it): then it is created
  // without options.
  PJRT_NamedValue grow{};
  grow.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  grow.name = "preallocate";
  grow.name_size = std::strlen(grow.name);
  grow.type = PJRT_NamedValue_kBool;
  grow.bool_value = false;
  grow.value_size = 1;
  auto create = args_of<PJRT_Client_Create_Args>(PJRT_Client_Create_Args_STRUCT_SIZE);
  create.create_options = &grow;
  create.num_options = 1;
  if (PJRT_Error* e = api->PJRT_Client_Create(&create)) {
    drop(api, e);
    create = args_of<PJRT_Client_Create_Args>(PJRT_Client_Create_Args_STRUCT_SIZE);
    c->check(api->PJRT_Client_Create(&create), "PJRT_Client_Create");
  }
  c->client_ = create.client;
  auto devs = args_of<PJRT_Client_AddressableDevices_Args>(PJRT_Client_AddressableDevices_Args_STRUCT_SIZE);
  devs.client = c->client_;
  c->check(api->PJRT_Client_AddressableDevices(&devs), "PJRT_Client_AddressableDevices");
  if (devs.num_addressable_devices == 0) throw PjrtError("PJRT plugin " + path + ": the client has no device", -1);
  c->device_ = devs.addressable_devices[0];
  c->views_ = has_fn(api, offsetof(PJRT_Api, PJRT_Client_CreateViewOfDeviceBuffer));
  auto name = args_of<PJRT_Client_PlatformName_Args>(PJRT_Client_PlatformName_Args_STRUCT_SIZE);
  name.client = c->client_;
  c->check(api->PJRT_Client_PlatformName(&name), "PJRT_Client_PlatformName");
  if (name.platform_name) c->platform_.assign(name.platform_name, name.platform_name_size);
  clients[path] = c;
  return c;
}

PjrtClient::~PjrtClient() {
  if (!client_) return;
  auto a = args_of<PJRT_Client_Destroy_Args>(PJRT_Client_Destroy_Args_STRUCT_SIZE);
  a.client = client_;
  drop(api_, api_->PJRT_Client_Destroy(&a));
}

std::unique_ptr<PjrtExecutable> PjrtClient::compile(const std::string& mlir) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string code = mlir;
  static const char kFormat[] = "mlir";
  auto program = args_of<PJRT_Program>(PJRT_Program_STRUCT_SIZE);
  program.code = code.data();
  program.code_size = code.size();
  program.format = kFormat;
  program.format_size = sizeof kFormat - 1;
  const std::string options = single_device_compile_options();
  auto a = args_of<PJRT_Client_Compile_Args>(PJRT_Client_Compile_Args_STRUCT_SIZE);
  a.client = client_;
  a.program = &program;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  check(api_->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  return wrap(a.executable);
}

std::unique_ptr<PjrtExecutable> PjrtClient::wrap(PJRT_LoadedExecutable* loaded) const {
  auto g = args_of<PJRT_LoadedExecutable_GetExecutable_Args>(PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE);
  g.loaded_executable = loaded;
  size_t n = 0;
  try {
    check(api_->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT_LoadedExecutable_GetExecutable");
    auto no = args_of<PJRT_Executable_NumOutputs_Args>(PJRT_Executable_NumOutputs_Args_STRUCT_SIZE);
    no.executable = g.executable;
    PJRT_Error* e = api_->PJRT_Executable_NumOutputs(&no);
    auto d = args_of<PJRT_Executable_Destroy_Args>(PJRT_Executable_Destroy_Args_STRUCT_SIZE);
    d.executable = g.executable;
    check(api_->PJRT_Executable_Destroy(&d), "PJRT_Executable_Destroy");
    check(e, "PJRT_Executable_NumOutputs");
    n = no.num_outputs;
  } catch (...) {
    auto d = args_of<PJRT_LoadedExecutable_Destroy_Args>(PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE);
    d.executable = loaded;
    drop(api_, api_->PJRT_LoadedExecutable_Destroy(&d));
    throw;
  }
  return std::unique_ptr<PjrtExecutable>(new PjrtExecutable(shared_from_this(), loaded, n));
}

bool PjrtClient::can_serialize() const {
  return has_fn(api_, offsetof(PJRT_Api, PJRT_Executable_Serialize)) &&
         has_fn(api_, offsetof(PJRT_Api, PJRT_Executable_DeserializeAndLoad));
}

std::unique_ptr<PjrtExecutable> PjrtClient::load(const std::string& serialized) const {
  if (!can_serialize()) throw PjrtError("PJRT plugin " + path_ + " cannot deserialize executables", -1);
  std::lock_guard<std::mutex> lock(mu_);
  auto a = args_of<PJRT_Executable_DeserializeAndLoad_Args>(PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE);
  a.client = client_;
  a.serialized_executable = serialized.data();
  a.serialized_executable_size = serialized.size();
  check(api_->PJRT_Executable_DeserializeAndLoad(&a), "PJRT_Executable_DeserializeAndLoad");
  return wrap(a.loaded_executable);
}

std::string PjrtExecutable::serialize() const {
  const PjrtClient& c = *client_;
  const PJRT_Api* api = c.api();
  if (!c.can_serialize()) throw PjrtError("PJRT plugin " + c.path() + " cannot serialize executables", -1);
  std::lock_guard<std::mutex> lock(c.mu_);
  auto g = args_of<PJRT_LoadedExecutable_GetExecutable_Args>(PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE);
  g.loaded_executable = exe_;
  c.check(api->PJRT_LoadedExecutable_GetExecutable(&g), "PJRT_LoadedExecutable_GetExecutable");
  auto s = args_of<PJRT_Executable_Serialize_Args>(PJRT_Executable_Serialize_Args_STRUCT_SIZE);
  s.executable = g.executable;
  PJRT_Error* e = api->PJRT_Executable_Serialize(&s);
  std::string bytes;
  if (!e && s.serialized_bytes) bytes.assign(s.serialized_bytes, s.serialized_bytes_size);
  if (!e && s.serialized_executable && s.serialized_executable_deleter)
    s.serialized_executable_deleter(s.serialized_executable);
  auto d = args_of<PJRT_Executable_Destroy_Args>(PJRT_Executable_Destroy_Args_STRUCT_SIZE);
  d.executable = g.executable;
  drop(api, api->PJRT_Executable_Destroy(&d));
  c.check(e, "PJRT_Executable_Serialize");
  return bytes;
}

PjrtExecutable::~PjrtExecutable() {
  const PJRT_Api* api = client_->api();
  auto d = args_of<PJRT_LoadedExecutable_Destroy_Args>(PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE);
  d.executable = exe_;
  drop(api, api->PJRT_LoadedExecutable_Destroy(&d));
}

void PjrtExecutable::run(const std::vector<HostTensor>& inputs, const std::vector<HostTensor>& outputs,
                         void* stream) const {
  const PjrtClient& c = *client_;
  const PJRT_Api* api = c.api();
  if (outputs.size() != num_outputs_)
    throw PjrtError("the executable has " + std::to_string(num_outputs_) + " results, " +
                        std::to_string(outputs.size()) + " outputs were given",
                    -1);
  // A CUDA client views only CUDA memory (a host pointer as a device buffer is an illegal address
  // in its kernels), a host client only host memory.
  const bool cuda_client = c.platform() == "cuda";
  bool cuda = false;
  for (const auto& t : inputs) cuda = cuda || t.on_device;
  for (const auto& t : outputs) cuda = cuda || t.on_device;
  const CudaDriver* driver = nullptr;
  if (cuda) {
    if (!cuda_client)
      throw PjrtError("PJRT plugin " + c.path() + " (platform " + c.platform() + ") was handed CUDA tensors", -1);
    for (const auto& [name, offset] : std::initializer_list<std::pair<const char*, size_t>>{
             {"PJRT_Client_CreateViewOfDeviceBuffer", offsetof(PJRT_Api, PJRT_Client_CreateViewOfDeviceBuffer)},
             {"PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
              offsetof(PJRT_Api, PJRT_Buffer_OpaqueDeviceMemoryDataPointer)},
             {"PJRT_Buffer_OnDeviceSizeInBytes", offsetof(PJRT_Api, PJRT_Buffer_OnDeviceSizeInBytes)}})
      if (!has_fn(api, offset))
        throw PjrtError("PJRT plugin " + c.path() + " lacks " + name + ", which CUDA tensors need", -1);
    driver = &CudaDriver::get();
    if (!driver->problem.empty()) throw PjrtError(driver->problem, -1);
  }
  // CUDA inputs the plugin cannot view where they lie (a tensor at an offset into its storage, off
  // the views' alignment; one without elements, whose address may be null) are copied first into a
  // device buffer of their own, on the step's stream: a copy on the device, never through the host.
  // Freed when this call ends, after the views of them are gone (declared before them).
  struct Staging {
    const CudaDriver* driver = nullptr;
    std::vector<unsigned long long> buffers;
    ~Staging() {
      for (unsigned long long p : buffers) driver->mem_free(p);
    }
  } staging{driver, {}};
  std::vector<HostTensor> staged_inputs;
  for (size_t i = 0; cuda && i < inputs.size(); ++i) {
    const HostTensor& t = inputs[i];
    if (!t.on_device || !t.byte_strides.empty()) continue;
    if (t.data && t.bytes > 0 && reinterpret_cast<uintptr_t>(t.data) % kViewAlignment == 0) continue;
    if (staged_inputs.empty()) staged_inputs = inputs;
    unsigned long long p = 0;
    driver->check(driver->mem_alloc(&p, std::max<size_t>(t.bytes, kViewAlignment)),
                  "cuMemAlloc (a buffer for CUDA input " + std::to_string(i) + ")");
    staging.buffers.push_back(p);
    if (t.bytes > 0)
      driver->check(driver->memcpy_dtod_async(p, reinterpret_cast<unsigned long long>(t.data), t.bytes, stream),
                    "cuMemcpyDtoDAsync (CUDA input " + std::to_string(i) + " into its buffer)");
    staged_inputs[i].data = reinterpret_cast<void*>(p);
  }
  const std::vector<HostTensor>& ins = staged_inputs.empty() ? inputs : staged_inputs;
  // The plugin reads the inputs on its own streams: what the step enqueued before must be done.
  if (cuda) driver->check(driver->stream_synchronize(stream), "cuStreamSynchronize (before the PJRT execution)");
  std::lock_guard<std::mutex> lock(c.mu_);
  auto await_event = [&](PJRT_Event* ev, const char* what) {
    if (!ev) return;
    auto w = args_of<PJRT_Event_Await_Args>(PJRT_Event_Await_Args_STRUCT_SIZE);
    w.event = ev;
    PJRT_Error* e = api->PJRT_Event_Await(&w);
    auto d = args_of<PJRT_Event_Destroy_Args>(PJRT_Event_Destroy_Args_STRUCT_SIZE);
    d.event = ev;
    PJRT_Error* de = api->PJRT_Event_Destroy(&d);
    c.check(e, what);
    c.check(de, "PJRT_Event_Destroy");
  };
  std::vector<BufferGuard> in(inputs.size(), BufferGuard{api});
  std::vector<PJRT_Buffer*> args;
  // A view of a dense row-major tensor's own memory, where the plugin makes one: nullptr where it
  // does not (a plugin without the call, or one that refuses this tensor: alignment, layout).
  auto view_of = [&](const HostTensor& t) -> PJRT_Buffer* {
    // XLA's CPU code may assume its buffers 64-byte aligned (vector loads): others are copied,
    // which aligns them. LibTorch's allocations are; a view of a tensor at an offset may not be.
    if (!c.views_.load() || !t.data || reinterpret_cast<uintptr_t>(t.data) % kViewAlignment != 0) return nullptr;
    if (t.on_device != cuda_client) return nullptr;
    int64_t stride = ty_bytes(t.type);
    if (stride <= 0) return nullptr;
    for (size_t d = t.byte_strides.size(); d-- > 0;) {
      if (t.dims[d] != 1 && t.byte_strides[d] != stride) return nullptr;
      stride *= t.dims[d];
    }
    auto v = args_of<PJRT_Client_CreateViewOfDeviceBuffer_Args>(PJRT_Client_CreateViewOfDeviceBuffer_Args_STRUCT_SIZE);
    v.client = c.raw();
    v.device_buffer_ptr = t.data;
    v.dims = t.dims.data();
    v.num_dims = t.dims.size();
    v.element_type = t.type;
    v.device = c.device();
    // The memory stays the caller's. A callback is set even so: XLA's CPU plugin calls whatever it
    // was given when the view is destroyed (an empty one throws inside it).
    v.on_delete_callback = [](void*, void*) {};
    PJRT_Error* e = api->PJRT_Client_CreateViewOfDeviceBuffer(&v);
    if (!e) return v.buffer;
    auto code = args_of<PJRT_Error_GetCode_Args>(PJRT_Error_GetCode_Args_STRUCT_SIZE);
    code.error = e;
    PJRT_Error* ce = api->PJRT_Error_GetCode(&code);
    if (!ce && code.code == PJRT_Error_Code_UNIMPLEMENTED) c.views_ = false;
    drop(api, ce);
    drop(api, e);
    return nullptr;
  };
  for (size_t i = 0; i < ins.size(); ++i) {
    const HostTensor& t = ins[i];
    if (PJRT_Buffer* view = view_of(t)) {
      in[i].b = view;
      args.push_back(view);
      ++c.inputs_viewed_;
      continue;
    }
    if (t.on_device)
      throw PjrtError("PJRT plugin " + c.path() + " makes no view of CUDA input " + std::to_string(i) +
                          (t.byte_strides.empty() ? " (the plugin refused it)" : " (it is not dense)"),
                      -1);
    ++c.inputs_copied_;
    auto b = args_of<PJRT_Client_BufferFromHostBuffer_Args>(PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE);
    b.client = c.raw();
    b.data = t.data;
    b.type = t.type;
    b.dims = t.dims.data();
    b.num_dims = t.dims.size();
    b.byte_strides = t.byte_strides.empty() ? nullptr : t.byte_strides.data();
    b.num_byte_strides = t.byte_strides.size();
    // The data is copied before the call returns (or its event fires): the tensor may change after.
    b.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
    b.device = c.device();
    c.check(api->PJRT_Client_BufferFromHostBuffer(&b), "PJRT_Client_BufferFromHostBuffer");
    in[i].b = b.buffer;
    await_event(b.done_with_host_buffer, "PJRT_Event_Await (input copy)");
    args.push_back(b.buffer);
  }
  std::vector<PJRT_Buffer*> results(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** out_list = results.data();
  PJRT_Event* done = nullptr;
  auto opts = args_of<PJRT_ExecuteOptions>(PJRT_ExecuteOptions_STRUCT_SIZE);
  auto x = args_of<PJRT_LoadedExecutable_Execute_Args>(PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE);
  x.executable = exe_;
  x.options = &opts;
  x.argument_lists = &arg_list;
  x.num_devices = 1;
  x.num_args = args.size();
  x.output_lists = &out_list;
  x.device_complete_events = &done;
  c.check(api->PJRT_LoadedExecutable_Execute(&x), "PJRT_LoadedExecutable_Execute");
  std::vector<BufferGuard> out(num_outputs_, BufferGuard{api});
  for (size_t k = 0; k < num_outputs_; ++k) out[k].b = results[k];
  await_event(done, "PJRT_Event_Await (execution)");
  // A result into host memory: its size asked first, then copied and waited for.
  auto to_host = [&](size_t k) {
    auto h = args_of<PJRT_Buffer_ToHostBuffer_Args>(PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE);
    h.src = results[k];
    h.dst = nullptr;  // first: ask for the size
    c.check(api->PJRT_Buffer_ToHostBuffer(&h), "PJRT_Buffer_ToHostBuffer (size)");
    if (h.dst_size != outputs[k].bytes)
      throw PjrtError("result " + std::to_string(k) + " has " + std::to_string(h.dst_size) + " bytes, its output " +
                          std::to_string(outputs[k].bytes),
                      -1);
    h.dst = outputs[k].data;
    h.event = nullptr;
    c.check(api->PJRT_Buffer_ToHostBuffer(&h), "PJRT_Buffer_ToHostBuffer");
    await_event(h.event, "PJRT_Event_Await (result copy)");
  };
  if (!cuda) {
    for (size_t k = 0; k < num_outputs_; ++k) to_host(k);
    return;
  }
  // Results on the device: copied device to device into LibTorch's tensors on the step's stream,
  // which is waited for before the plugin's buffers are destroyed (at the end of this call).
  for (size_t k = 0; k < num_outputs_; ++k) {
    const HostTensor& o = outputs[k];
    if (!o.on_device) {
      to_host(k);
      continue;
    }
    auto sz = args_of<PJRT_Buffer_OnDeviceSizeInBytes_Args>(PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE);
    sz.buffer = results[k];
    c.check(api->PJRT_Buffer_OnDeviceSizeInBytes(&sz), "PJRT_Buffer_OnDeviceSizeInBytes");
    if (sz.on_device_size_in_bytes != o.bytes)
      throw PjrtError("result " + std::to_string(k) + " has " + std::to_string(sz.on_device_size_in_bytes) +
                          " bytes on the device, its output " + std::to_string(o.bytes),
                      -1);
    if (has_fn(api, offsetof(PJRT_Api, PJRT_Buffer_GetMemoryLayout)) && o.dims.size() > 1) {
      // Row-major: minor_to_major n-1, ..., 0 and no tiles (a plugin may pick another layout).
      auto l = args_of<PJRT_Buffer_GetMemoryLayout_Args>(PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE);
      l.buffer = results[k];
      c.check(api->PJRT_Buffer_GetMemoryLayout(&l), "PJRT_Buffer_GetMemoryLayout");
      bool row_major = l.layout.type == PJRT_Buffer_MemoryLayout_Type_Tiled &&
                       l.layout.tiled.minor_to_major_size == o.dims.size() && l.layout.tiled.num_tiles == 0;
      for (size_t d = 0; row_major && d < o.dims.size(); ++d)
        row_major = l.layout.tiled.minor_to_major[d] == static_cast<int64_t>(o.dims.size() - 1 - d);
      if (!row_major) throw PjrtError("result " + std::to_string(k) + " is not row-major on the device", -1);
    }
    if (o.bytes == 0) continue;
    auto p = args_of<PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args>(
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE);
    p.buffer = results[k];
    c.check(api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&p), "PJRT_Buffer_OpaqueDeviceMemoryDataPointer");
    driver->check(driver->memcpy_dtod_async(reinterpret_cast<unsigned long long>(o.data),
                                            reinterpret_cast<unsigned long long>(p.device_memory_ptr), o.bytes, stream),
                  "cuMemcpyDtoDAsync (result " + std::to_string(k) + ")");
  }
  driver->check(driver->stream_synchronize(stream), "cuStreamSynchronize (after the result copies)");
}

}  // namespace kiln::neuron
