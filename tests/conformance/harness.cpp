#include "harness.h"

#include "kiln/internal/elf_check.h"
#include "op_catalogue.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "kiln/config.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/json_text.h"
#include "kiln/hardware_probe.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/selection.h"

namespace kiln::conformance {

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

const Settings& settings() {
  static const Settings s = [] {
    Settings r;
    r.plugin_path = env_or("KILN_CONFORMANCE_PLUGIN", "");
    r.device = env_or("KILN_CONFORMANCE_DEVICE", "cpu");
    r.result_file = env_or("KILN_CONFORMANCE_RESULT", "");
    r.workload_steps = std::max(1, std::atoi(env_or("KILN_CONFORMANCE_STEPS", "3").c_str()));
    return r;
  }();
  return s;
}

void append_result_line(const std::string& kind, const std::string& text) {
  if (settings().result_file.empty()) return;
  FILE* f = std::fopen(settings().result_file.c_str(), "a");
  if (!f) return;
  const std::string line = json_text(Json{{"kind", kind}, {"text", text}}) + "\n";
  std::fwrite(line.data(), 1, line.size(), f);  // the whole line in one write
  std::fclose(f);
}

void progress(const std::string& what) { append_result_line("progress", what); }
void note(const std::string& text) { append_result_line("note", text); }

// ---- Through kiln's loader ----

const TrainingArguments& host_args() {
  static const TrainingArguments args = [] {
    TrainingArguments a;
    a.runtime.cache_dir = "/tmp/kiln-conformance-cache-" + std::to_string(::getuid());
    // The plugin's options from KILN_PLUGIN_OPTIONS, as everywhere in kiln ("inductor.cuda=false"
    // checks the inductor with its CUDA nodes left to ATen, with --device cuda); nothing else of the
    // environment: the cases choose their backend, mode and cache themselves.
    TrainingArguments env;
    env.apply_env();
    a.plugin_options = env.plugin_options;
    return a;
  }();
  return args;
}

std::shared_ptr<HostServices> torch_host() {
  static std::shared_ptr<HostServices> host = torch_host_services(host_args());
  return host;
}

std::shared_ptr<LoadedPlugin> loaded_plugin() {
  static std::shared_ptr<LoadedPlugin> plugin = PluginRegistry::load_file(settings().plugin_path, torch_host());
  return plugin;
}

const std::vector<PluginDevice>& probe_devices() {
  static const std::vector<PluginDevice> devices = to_plugin_devices(hw::probe().devices);
  return devices;
}

const PluginAvailability& availability() {
  static const PluginAvailability a = loaded_plugin()->available(probe_devices());
  return a;
}

c10::Device case_device() { return settings().device == "cuda" ? c10::Device("cuda:0") : c10::Device(c10::kCPU); }
KilnDeviceKind case_device_kind() { return settings().device == "cuda" ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU; }

bool plugin_serves_case_device() {
  return (loaded_plugin()->device_kinds() & KILN_DEVICE_KIND_BIT(case_device_kind())) != 0;
}

std::string reason_to_skip_execution() {
  const auto& a = availability();
  if (!a.available) return "the plugin is unavailable here: " + a.reason;
  if (!plugin_serves_case_device())
    return "the plugin does not compile for " + settings().device +
           " (its device kinds: " + device_kinds_string(loaded_plugin()->device_kinds()) + "); try --device";
  if (settings().device == "cuda" && !torch::cuda::is_available())
    return "--device cuda, but LibTorch sees no CUDA device";
  return "";
}

// ---- By hand ----

const char* error_code_name(KilnErrorCode code) {
  switch (code) {
    case KILN_ERROR_UNKNOWN: return "unknown";
    case KILN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KILN_ERROR_UNIMPLEMENTED: return "unimplemented";
    case KILN_ERROR_UNAVAILABLE: return "unavailable";
    case KILN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case KILN_ERROR_INTERNAL: return "internal";
    case KILN_ERROR_ABI_MISMATCH: return "ABI mismatch";
    default: return "not a KilnErrorCode";
  }
}

std::string take_error(const KilnPluginApi* api, KilnError* error, KilnErrorCode* code) {
  if (!error) return "";
  const KilnErrorCode c = api->error_code(error);
  const char* m = api->error_message(error);
  std::string text = std::string(error_code_name(c)) + " (" + std::to_string(c) + "): " + (m ? m : "(NULL message)");
  api->error_destroy(error);
  if (code) *code = c;
  return text;
}

Arena::~Arena() { release(); }

void* Arena::guarded(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t data_pages = (bytes + page - 1) / page;
  const size_t length = (data_pages + 1) * page;
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  char* guard = static_cast<char*>(base) + data_pages * page;
  ::mprotect(guard, page, PROT_NONE);
  maps_.push_back({base, length});
  // 8-byte aligned, ending as close to the guard page as alignment allows.
  const size_t aligned = (bytes + 7) / 8 * 8;
  return guard - aligned;
}

void* Arena::plain(size_t bytes) {
  heap_.emplace_back(new char[bytes == 0 ? 1 : bytes]());
  return heap_.back().get();
}

void Arena::release() {
  for (auto& m : maps_) ::munmap(m.base, m.length);
  maps_.clear();
  heap_.clear();
}

namespace {

struct Copier {
  Arena& arena;
  StructLayout layout;

  template <class T>
  T* alloc_struct(size_t size) {
    const size_t total = layout == StructLayout::Padded ? size + 64 : size;
    char* p = static_cast<char*>(arena.guarded(total));
    std::memset(p, 0, total);
    if (layout == StructLayout::Padded) std::memset(p + size, 0xA5, 64);
    return reinterpret_cast<T*>(p);
  }
  template <class T>
  void finish(T* s, size_t size) {
    s->struct_size = layout == StructLayout::Padded ? size + 64 : size;
  }
  template <class T>
  const T* array(const T* src, size_t n) {
    if (!src) return nullptr;
    T* dst = static_cast<T*>(arena.guarded(sizeof(T) * (n == 0 ? 1 : n)));
    if (n) std::memcpy(dst, src, sizeof(T) * n);
    return dst;
  }
  const char* str(const char* s) {
    if (!s) return nullptr;
    const size_t n = std::strlen(s) + 1;
    char* d = static_cast<char*>(arena.guarded(n));
    std::memcpy(d, s, n);
    return d;
  }
};

}  // namespace

const KilnGraphView* copy_view(const KilnGraphView& v, Arena& arena, StructLayout layout) {
  Copier c{arena, layout};
  // A 2.3 host's view has no symbol fields: the struct ends at `outputs`, against the guard page.
  const size_t view_size =
      layout == StructLayout::Minor3 ? KILN_STRUCT_SIZE(KilnGraphView, outputs) : KILN_GRAPH_VIEW_STRUCT_SIZE;
  auto* g = c.alloc_struct<KilnGraphView>(view_size);
  std::memcpy(g, &v, view_size);
  c.finish(g, view_size);

  std::vector<const KilnValue*> values(v.num_values);
  for (size_t i = 0; i < v.num_values; ++i) {
    const KilnValue* src = v.values[i];
    auto* d = c.alloc_struct<KilnValue>(KILN_VALUE_STRUCT_SIZE);
    std::memcpy(d, src, KILN_VALUE_STRUCT_SIZE);
    c.finish(d, KILN_VALUE_STRUCT_SIZE);
    d->shape = c.array(src->shape, static_cast<size_t>(std::max(src->ndim, 0)));
    d->strides = c.array(src->strides, static_cast<size_t>(std::max(src->ndim, 0)));
    values[i] = d;
  }
  g->values = c.array(values.data(), values.size());

  std::vector<const KilnNode*> nodes(v.num_nodes);
  for (size_t i = 0; i < v.num_nodes; ++i) {
    const KilnNode* src = v.nodes[i];
    auto* d = c.alloc_struct<KilnNode>(KILN_NODE_STRUCT_SIZE);
    std::memcpy(d, src, KILN_NODE_STRUCT_SIZE);
    c.finish(d, KILN_NODE_STRUCT_SIZE);
    d->op = c.str(src->op);
    d->name = c.str(src->name);
    d->overload = c.str(src->overload);
    std::vector<const KilnArg*> args(src->num_args);
    for (size_t k = 0; k < src->num_args; ++k) {
      const KilnArg* sa = src->args[k];
      const size_t arg_size = KILN_ARG_STRUCT_SIZE;
      auto* a = c.alloc_struct<KilnArg>(arg_size);
      std::memcpy(a, sa, arg_size);
      c.finish(a, arg_size);
      a->name = c.str(sa->name);
      a->s = c.str(sa->s);
      a->ints = c.array(sa->ints, sa->len);
      a->doubles = c.array(sa->doubles, sa->len);
      args[k] = a;
    }
    d->args = c.array(args.data(), args.size());
    d->inputs = c.array(src->inputs, src->num_inputs);
    d->outputs = c.array(src->outputs, src->num_outputs);
    nodes[i] = d;
  }
  g->nodes = c.array(nodes.data(), nodes.size());
  g->inputs = c.array(v.inputs, v.num_inputs);
  g->outputs = c.array(v.outputs, v.num_outputs);
  return g;
}

RawLibrary::RawLibrary(const std::string& path) {
  // The loader's checks first: a library cut short would be mapped past its end (SIGBUS).
  if (std::string why = kiln::elf_precheck(path); !why.empty())
    throw std::runtime_error(path + ": not a loadable library: " + why);
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* e = ::dlerror();
    throw std::runtime_error("dlopen(" + path + "): " + (e ? e : "unknown error"));
  }
  init_ = reinterpret_cast<KilnPluginInitFn>(::dlsym(handle_, KILN_PLUGIN_INIT_SYMBOL));
  if (!init_) {
    ::dlclose(handle_);
    handle_ = nullptr;
    throw std::runtime_error(path + " does not export " KILN_PLUGIN_INIT_SYMBOL);
  }
}

RawLibrary::~RawLibrary() {
  if (handle_) ::dlclose(handle_);
}

RawContext::RawContext(const RawLibrary& lib, const HostTableSpec& spec) {
  const KilnHostApi* base = torch_host()->api();
  auto* t = static_cast<char*>(arena_.guarded(spec.struct_size));
  std::memset(t, 0, spec.struct_size);
  std::memcpy(t, base, std::min(spec.struct_size, sizeof(KilnHostApi)));
  auto* host = reinterpret_cast<KilnHostApi*>(t);
  host->struct_size = spec.struct_size;
  host->abi_major = spec.abi_major;
  host->abi_minor = spec.abi_minor;
  host_minor_ = spec.abi_minor;
  if (spec.null_optionals && spec.struct_size >= KILN_HOST_API_STRUCT_SIZE) {
    host->device_alloc = nullptr;
    host->device_free = nullptr;
    host->call_eager = nullptr;
  }
  host_table_ = host;
  const KilnPluginApi* out = nullptr;
  KilnError* err = lib.init()(host, spec.abi_major, spec.abi_minor, &out);
  api_ = out;
  if (err) {
    if (out && out->error_code && out->error_message && out->error_destroy) {
      error_ = take_error(out, err, &error_code_);
    } else {
      error_ = "init returned an error but no table to read it with (leaked)";
      error_code_ = KILN_ERROR_UNKNOWN;
    }
    api_ = nullptr;
    return;
  }
  if (!out) {
    error_ = "init returned no error and no table";
    return;
  }
  ok_ = true;
}

RawContext::~RawContext() {
  if (ok_ && api_ && api_->struct_size >= KILN_PLUGIN_API_STRUCT_SIZE && api_->shutdown) {
    KilnPluginShutdownArgs a{KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE, api_->plugin_ctx};
    api_->shutdown(&a);
  }
}

RawContext::Status RawContext::status_of(KilnError* error) const {
  Status s;
  if (!error) return s;
  s.ok = false;
  const char* m = api_->error_message(error);
  s.code = api_->error_code(error);
  s.message = m ? m : "";
  api_->error_destroy(error);
  return s;
}

RawContext::Status RawContext::claim(const KilnGraphView* view, std::vector<int64_t>* claimed) const {
  std::vector<int64_t> buf(std::max<size_t>(view->num_nodes, 1), -1);
  KilnPluginClaimArgs a{};
  a.struct_size = KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE;
  a.plugin_ctx = api_->plugin_ctx;
  a.graph = view;
  a.claimed_nodes = buf.data();
  Status s = status_of(api_->claim(&a));
  const size_t n = a.num_claimed;
  if (s.ok) claimed->assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(std::min(n, view->num_nodes)));
  if (s.ok && n > view->num_nodes) {
    s.ok = false;
    s.code = -1;
    s.message = "claimed " + std::to_string(n) + " nodes of a graph of " + std::to_string(view->num_nodes);
  }
  return s;
}

RawContext::Status RawContext::compile(const KilnGraphView* view, KilnMode mode,
                                       const std::map<std::string, std::string>& options, KilnExecutable** exe) const {
  std::vector<KilnOption> kv;
  for (const auto& [k, v] : options) kv.push_back({KILN_OPTION_STRUCT_SIZE, k.c_str(), v.c_str()});
  std::vector<const KilnOption*> ptrs;
  for (auto& o : kv) ptrs.push_back(&o);
  // A host older than 2.4 writes the args without symbolic_accepted: cut there, against a guard
  // page (a plugin that writes the field without KILN_HAS_FIELD faults).
  const size_t size = host_minor_ < 4 ? KILN_STRUCT_SIZE(KilnPluginCompileArgs, inplace_accepted)
                                      : KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE;
  Arena args_arena;
  auto* a = static_cast<KilnPluginCompileArgs*>(args_arena.guarded(size));
  std::memset(static_cast<void*>(a), 0, size);
  a->struct_size = size;
  a->plugin_ctx = api_->plugin_ctx;
  a->subgraph = view;
  a->mode = mode;
  a->num_options = ptrs.size();
  a->options = ptrs.data();
  const std::string cache = torch_host()->cache_dir();
  a->cache_dir = cache.c_str();
  Status s = status_of(api_->compile(a));
  *exe = a->executable;
  return s;
}

RawContext::Status RawContext::execute(KilnExecutable* exe, const std::vector<DLTensor>& inputs,
                                       std::vector<DLTensor>& outputs) const {
  const size_t size =
      host_minor_ < 4 ? KILN_STRUCT_SIZE(KilnExecutableExecuteArgs, stream) : KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE;
  Arena args_arena;
  auto* a = static_cast<KilnExecutableExecuteArgs*>(args_arena.guarded(size));
  std::memset(static_cast<void*>(a), 0, size);
  a->struct_size = size;
  a->executable = exe;
  a->inputs = inputs.data();
  a->num_inputs = inputs.size();
  a->outputs = outputs.data();
  a->num_outputs = outputs.size();
  return status_of(api_->execute(a));
}

void RawContext::destroy(KilnExecutable* exe) const {
  if (!exe) return;
  KilnExecutableDestroyArgs a{KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, exe};
  api_->executable_destroy(&a);
}

// ---- Numerics ----

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  if (!out.defined() || !ref.defined()) return out.defined() == ref.defined() ? 0.0 : INFINITY;
  if (out.sizes() != ref.sizes()) return INFINITY;
  if (out.numel() == 0) return 0.0;
  if (!at::isFloatingType(ref.scalar_type()) && !at::isComplexType(ref.scalar_type()))
    return at::equal(out.cpu().to(ref.scalar_type()), ref.cpu()) ? 0.0 : INFINITY;
  const at::Tensor o = out.detach().cpu().to(at::kDouble), r = ref.detach().cpu().to(at::kDouble);
  const at::Tensor nan_o = at::isnan(o), nan_r = at::isnan(r);
  if (!at::equal(nan_o, nan_r)) return INFINITY;
  const at::Tensor inf_r = at::isinf(r);
  if (inf_r.any().item<bool>() && !at::equal(o.masked_select(inf_r), r.masked_select(inf_r))) return INFINITY;
  const at::Tensor fin = at::isfinite(r);
  const at::Tensor d = (o - r).masked_select(fin);
  if (!at::isfinite(d).all().item<bool>()) return INFINITY;
  const double num = d.norm().item<double>();
  const double den = r.masked_select(fin).norm().item<double>();
  return den == 0 ? num : num / den;
}

double tolerance(c10::ScalarType dtype, bool matmul_like) {
  switch (dtype) {
    case c10::ScalarType::Float: return matmul_like && settings().device == "cuda" ? 1e-3 : 1e-5;
    case c10::ScalarType::Double: return 1e-10;
    case c10::ScalarType::Half: return 1e-3;
    case c10::ScalarType::BFloat16: return 1e-2;
    default: return 0.0;
  }
}

at::Tensor poisoned(const ir::TensorMeta& m) {
  at::Tensor t = at::empty_strided(m.shape, m.strides, at::TensorOptions(m.dtype).device(m.device));
  if (at::isFloatingType(m.dtype)) t.fill_(std::numeric_limits<double>::quiet_NaN());
  else if (m.dtype == c10::ScalarType::Bool) t.fill_(true);
  else t.fill_(0x5A);
  return t;
}

std::vector<at::Tensor> eager_env(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  for (const auto& n : g.nodes) EagerExecutor::run_node(n, env);
  return env;
}

std::vector<PartitionGroup> groups_of(const ir::Graph& g, std::vector<int64_t> claims) {
  std::vector<int64_t> kept;
  for (auto c : claims)
    if (c >= 0 && static_cast<size_t>(c) < g.nodes.size() &&
        node_can_be_claimed(g.nodes[static_cast<size_t>(c)], false))
      kept.push_back(c);
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return partition_graph(g, kept).groups;
}

std::vector<SampleGraph> sample_graphs() {
  const c10::Device dev =
      settings().device == "cuda" && torch::cuda::is_available() ? case_device() : c10::Device(c10::kCPU);
  std::vector<SampleGraph> out;
  for (const auto& v : op_catalogue("FusedChains")) {
    auto sample = make_inputs(v, dev);
    out.push_back({v.op, build_graph(v, sample), make_inputs(v, dev)});
  }
  return out;
}

std::vector<at::Tensor> run_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                                  const std::vector<c10::IValue>* scalars) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  EagerExecutor(g).run(env, scalars);
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

PluginProgram::PluginProgram(const ir::Graph& g, KilnMode mode) : graph_(g) {
  auto plugin = loaded_plugin();
  std::vector<int64_t> claimed;
  {
    GraphView view(g);
    for (auto c : plugin->claim(view.view()))
      if (node_can_be_claimed(g.nodes[static_cast<size_t>(c)], plugin->accepts_runtime_scalars())) claimed.push_back(c);
  }
  claimed_ = claimed.size();
  std::sort(claimed.begin(), claimed.end());
  // Views at a group's end stay the plugin's here: the suite checks its own views too.
  part_ = partition_graph(g, claimed, {}, /*views_at_ends_run_eagerly=*/false);
  exes_.resize(part_.groups.size());
  for (size_t gi = 0; gi < part_.groups.size(); ++gi) {
    const auto& pg = part_.groups[gi];
    GraphView sub(g, pg.nodes, pg.inputs, pg.outputs);
    try {
      exes_[gi] = plugin->compile(sub.view(), mode);
      nodes_compiled_ += pg.nodes.size();
    } catch (const PluginError& e) {
      if (e.code() != KILN_ERROR_UNIMPLEMENTED) compile_errors_.push_back(e.what());
      else ++groups_declined_;
    }
  }
}

PluginProgram::~PluginProgram() = default;

namespace {

// The run-time scalars as the pipeline hands them to execute: scalar k is a BOOL, INT or DOUBLE
// KilnArg with runtime_scalar k (PartitionedExecutor::run).
struct ScalarArgs {
  std::vector<KilnArg> args;
  std::vector<const KilnArg*> ptrs;
  explicit ScalarArgs(const std::vector<c10::IValue>* scalars) {
    if (!scalars) return;
    args.resize(scalars->size());
    for (size_t k = 0; k < scalars->size(); ++k) {
      KilnArg& a = args[k];
      a.struct_size = KILN_ARG_STRUCT_SIZE;
      a.name = "";
      a.runtime_scalar = static_cast<int32_t>(k);
      const c10::IValue& v = (*scalars)[k];
      if (v.isBool()) a.tag = KILN_ARG_BOOL, a.i = v.toBool();
      else if (v.isInt()) a.tag = KILN_ARG_INT, a.i = v.toInt();
      else a.tag = KILN_ARG_DOUBLE, a.d = v.toScalar().toDouble();
      ptrs.push_back(&a);
    }
  }
};

}  // namespace

std::vector<at::Tensor> PluginProgram::run(const std::vector<at::Tensor>& inputs,
                                           const std::vector<c10::IValue>* scalars) const {
  const ir::Graph& g = graph_;
  const ScalarArgs scalar_args(scalars);
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  for (auto u : part_.order) {
    if (u >= 0) {
      EagerExecutor::run_node(g.nodes[static_cast<size_t>(u)], env, scalars);
      continue;
    }
    const size_t gi = static_cast<size_t>(-u - 1);
    const auto& pg = part_.groups[gi];
    if (!exes_[gi]) {
      for (auto ni : pg.nodes) EagerExecutor::run_node(g.nodes[static_cast<size_t>(ni)], env, scalars);
      continue;
    }
    std::vector<DLTensor> in, out;
    for (auto v : pg.inputs) in.push_back(to_dl_tensor(env[v]));
    for (auto v : pg.outputs) {
      env[v] = poisoned(g.value(v).meta);
      out.push_back(to_dl_tensor(env[v]));
    }
    // (PluginExecutable passes no scalars to a plugin without KILN_CAPABILITY_RUNTIME_SCALARS.)
    exes_[gi]->execute(in.data(), in.size(), out.data(), out.size(), scalar_args.ptrs.data(), scalar_args.ptrs.size());
  }
  if (case_device().is_cuda()) torch::cuda::synchronize();
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

}  // namespace kiln::conformance
