// The conformance suite's host side: what every case uses to reach the plugin under test.
//
// Two ways in. Most cases go through kiln's own loader (PluginRegistry::load_file with the
// LibTorch host), exactly as the pipeline does. The ABI cases also open the library by hand and
// call kiln_plugin_init with a host table they control (another version, struct sizes larger or
// smaller than the plugin's own, optional functions left NULL), and hand the plugin graph views
// deep-copied into guarded memory, where a read past a struct's struct_size, or of a graph after
// its call returned, faults at once instead of reading stale bytes.
//
// Every case runs in its own process (runner.h); progress() leaves a trail that the runner shows
// when a case crashes or hangs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "kiln/config.h"
#include "kiln/internal/host_services.h"
#include "kiln/ir.h"
#include "kiln/internal/partition.h"
#include "kiln/plugin_api.h"
#include "kiln/internal/plugin_registry.h"

namespace kiln::conformance {

// What the runner hands each case through the environment.
struct Settings {
  std::string plugin_path;  // KILN_CONFORMANCE_PLUGIN
  std::string device;       // KILN_CONFORMANCE_DEVICE: "cpu" or "cuda"
  std::string result_file;  // KILN_CONFORMANCE_RESULT: where the case writes its trail
  int workload_steps = 3;   // KILN_CONFORMANCE_STEPS
};
const Settings& settings();

// Appends a "progress" line to the result file (flushed): the last one names what was running
// when a case crashed or hung.
void progress(const std::string& what);
// Appends a "note" line: what a passing case wants shown (the last note is its table message).
void note(const std::string& text);
// Appends {"kind": kind, "text": text} as one JSON line (the listener's failures, skip reason and
// result too): any text, newlines and all, reads back as it was written.
void append_result_line(const std::string& kind, const std::string& text);

// ---- Through kiln's loader ----

// What the host is made from: the conformance cache directory, and the plugin options of
// KILN_PLUGIN_OPTIONS (`<plugin>.<option>=<value>,...`), which reach the plugin as its host
// options and the whole-step cases' compile_step.
const TrainingArguments& host_args();
// The LibTorch host (call_eager, allocators); one per process.
std::shared_ptr<HostServices> torch_host();
// The plugin under test loaded by kiln's loader with the LibTorch host; one per process. Throws
// PluginError when the loader rejects it.
std::shared_ptr<LoadedPlugin> loaded_plugin();
// The devices of this machine from the hardware probe, in the plugin ABI's form.
const std::vector<PluginDevice>& probe_devices();
// Whether the plugin says it can run here (asked once).
const PluginAvailability& availability();
// c10 device of the cases ("cpu" or "cuda:0"), and whether the plugin serves its kind.
c10::Device case_device();
KilnDeviceKind case_device_kind();
bool plugin_serves_case_device();
// Why the numeric and use cases do not apply here ("" when they do): unavailable, another device
// kind, no CUDA device for --device cuda.
std::string reason_to_skip_execution();

// ---- By hand ----

// A plugin error as text ("invalid argument (2): message"), freed through the plugin's table.
std::string take_error(const KilnPluginApi* api, KilnError* error, KilnErrorCode* code = nullptr);
const char* error_code_name(KilnErrorCode code);

// Memory for structs handed to the plugin. guarded(): the block ends exactly at a page that
// faults on any access. release() unmaps everything, so a pointer kept past its call faults.
class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  void* guarded(size_t bytes);
  void* plain(size_t bytes);  // zeroed, heap; freed with the arena
  void release();

 private:
  struct Mapping {
    void* base;
    size_t length;
  };
  std::vector<Mapping> maps_;
  std::vector<std::unique_ptr<char[]>> heap_;
};

// How the structs of a copied graph view are laid out.
enum class StructLayout {
  Exact,   // struct_size as in this header, each struct against a guard page
  Padded,  // struct_size + 64, the 64 extra bytes filled with 0xA5: a newer host's layout
  // A 2.3 host's layout: the graph view ends before 2.4's symbol fields (72 bytes), against its
  // guard page, so a plugin that reads them without KILN_HAS_FIELD faults.
  Minor3,
};

// Deep-copies a view (every struct, array and string) into `arena`.
const KilnGraphView* copy_view(const KilnGraphView& view, Arena& arena, StructLayout layout);

// A host table handed to kiln_plugin_init: a copy of the LibTorch host's, with changes.
struct HostTableSpec {
  uint32_t abi_major = KILN_ABI_VERSION_MAJOR;
  uint32_t abi_minor = KILN_ABI_VERSION_MINOR;
  size_t struct_size = KILN_HOST_API_STRUCT_SIZE;  // larger: padded with zero fields; smaller: cut
  bool null_optionals = false;                     // device_alloc, device_free, call_eager NULL
};

// A library opened by hand (dlopen RTLD_NOW|RTLD_LOCAL) and its contexts.
class RawLibrary {
 public:
  explicit RawLibrary(const std::string& path);  // throws std::runtime_error with dlerror text
  ~RawLibrary();
  RawLibrary(const RawLibrary&) = delete;
  RawLibrary& operator=(const RawLibrary&) = delete;
  KilnPluginInitFn init() const { return init_; }

 private:
  void* handle_ = nullptr;
  KilnPluginInitFn init_ = nullptr;
};

// One context made by kiln_plugin_init with a host table from `spec`. ok() when init returned
// no error and a usable table; otherwise error() says what init said. Ends with shutdown.
class RawContext {
 public:
  RawContext(const RawLibrary& lib, const HostTableSpec& spec);
  ~RawContext();
  RawContext(const RawContext&) = delete;
  RawContext& operator=(const RawContext&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  KilnErrorCode error_code() const { return error_code_; }
  const KilnPluginApi* api() const { return api_; }
  const KilnHostApi* host_table() const { return host_table_; }

  // Calls through the table; errors become (code, text).
  struct Status {
    bool ok = true;
    KilnErrorCode code = 0;
    std::string message;
  };
  Status claim(const KilnGraphView* view, std::vector<int64_t>* claimed) const;
  Status compile(const KilnGraphView* view, KilnMode mode, const std::map<std::string, std::string>& options,
                 KilnExecutable** exe) const;
  Status execute(KilnExecutable* exe, const std::vector<DLTensor>& inputs, std::vector<DLTensor>& outputs) const;
  void destroy(KilnExecutable* exe) const;
  Status status_of(KilnError* error) const;

 private:
  // The host minor this context was made with: compile and execute args are written in its
  // layout (cut at the older size against a guard page when it is below this header's).
  uint32_t host_minor_ = KILN_ABI_VERSION_MINOR;
  Arena arena_;
  const KilnHostApi* host_table_ = nullptr;
  const KilnPluginApi* api_ = nullptr;
  bool ok_ = false;
  std::string error_;
  KilnErrorCode error_code_ = 0;
};

// ---- Numerics ----

// ‖out − ref‖ / ‖ref‖ in double (‖out − ref‖ when ref is 0); infinity when out has a NaN or an
// infinity that ref lacks, or the shapes differ.
double rel_err(const at::Tensor& out, const at::Tensor& ref);
// By dtype: float32 1e-5, float64 1e-10, float16 1e-3, bfloat16 1e-2 (tf32 1e-3 on CUDA for
// matmul-like ops), integers and bool exact (0).
double tolerance(c10::ScalarType dtype, bool matmul_like = false);
// A tensor of `meta`'s shape, strides and dtype full of NaN (floats) or a sentinel (integers), so
// that an output the plugin never writes cannot match by chance.
at::Tensor poisoned(const ir::TensorMeta& meta);

// A graph run through the plugin as the pipeline would: the plugin claims, the host partitions,
// every group compiles once (UNIMPLEMENTED groups and unclaimed nodes run eagerly), and each run()
// executes the groups with poisoned outputs. Nodes with run-time scalars are the plugin's only
// when it has KILN_CAPABILITY_RUNTIME_SCALARS, as in the pipeline.
class PluginProgram {
 public:
  // Throws PluginError from claim.
  explicit PluginProgram(const ir::Graph& graph, KilnMode mode = KILN_MODE_DEFAULT);
  ~PluginProgram();
  size_t claimed() const { return claimed_; }                                         // nodes the plugin claimed
  size_t nodes_compiled() const { return nodes_compiled_; }                           // nodes the plugin runs
  const std::vector<std::string>& compile_errors() const { return compile_errors_; }  // not UNIMPLEMENTED
  size_t groups_declined() const { return groups_declined_; }                         // KILN_ERROR_UNIMPLEMENTED
  // The graph outputs for `inputs`, with the graph's run-time scalars (Graph::scalar_inputs) at
  // `scalars` (null when it has none): each execute gets them as KilnArgs, as the pipeline passes
  // them. Throws PluginError from execute.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs,
                              const std::vector<c10::IValue>* scalars = nullptr) const;

 private:
  const ir::Graph& graph_;
  Partition part_;
  std::vector<std::unique_ptr<PluginExecutable>> exes_;
  size_t claimed_ = 0, nodes_compiled_ = 0, groups_declined_ = 0;
  std::vector<std::string> compile_errors_;
};

// Every value of the graph computed eagerly (nothing freed): the reference for any group.
std::vector<at::Tensor> eager_env(const ir::Graph& graph, const std::vector<at::Tensor>& inputs);
// The groups the host forms from `claims` (claims of unclaimable nodes dropped, as the pipeline does).
std::vector<PartitionGroup> groups_of(const ir::Graph& graph, std::vector<int64_t> claims);
// Small graphs every ABI, error and use case hands the plugin: the catalogue's chains (addmm,
// relu, mul, sum; a broadcast tanh chain; an SGD update), on the case device when usable.
struct SampleGraph {
  std::string label;
  ir::Graph graph;
  std::vector<at::Tensor> inputs;
};
std::vector<SampleGraph> sample_graphs();
// The eager executor's outputs (the reference), with the run-time scalars' values when the graph
// has some.
std::vector<at::Tensor> run_eager(const ir::Graph& graph, const std::vector<at::Tensor>& inputs,
                                  const std::vector<c10::IValue>* scalars = nullptr);

}  // namespace kiln::conformance
