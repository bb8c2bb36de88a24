// The run stage: executes a StepPlan. Owns what changes from call to call: the executor (eager, or
// split with a backend plugin), the environment of values, the lifted run-time scalars' device
// buffers, the write-backs (a copy, or the target adopting the value's storage), the parameters'
// new gradients, and the whole-step CUDA graph (warm-up, record, replay; recorded again when a
// tensor it reads in place got new memory). Internal to the runtime.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "kiln/compile.h"
#include "kiln/plugin_api.h"
#include "plan_step.h"

namespace kiln {

class LoadedPlugin;
namespace cudagraph {
class Step;
class GraphPool;
}  // namespace cudagraph

// The memory pool the CUDA graphs of one step's shapes share (cudagraph::GraphPool), made by the
// first of their runners to record a graph.
struct SharedGraphPool {
  std::shared_ptr<cudagraph::GraphPool> pool;
};

struct RunOptions {
  bool cpu_block_cache = true;  // [runtime] cpu_block_cache
  int64_t cpu_block_cache_max_mb = 2048;
  bool check_meta = false;     // [debug] check_meta
  bool verify_groups = false;  // [debug] verify_groups
  bool graph_copies = true;    // [runtime] graph_copies
  // The pool this plan's CUDA graph records into, shared with the step's other shapes (null: a
  // pool of its own).
  std::shared_ptr<SharedGraphPool> graph_pool;
};

// A compiled step that failed (a plugin's execute threw) before it had written into any tensor it
// was given: parameters, buffers, optimizer state and gradients are as they were before the step,
// so the step can run eagerly in its place.
class StepFailedUntouched : public std::runtime_error {
 public:
  // `restored`: it had written, and what it wrote was put back from a copy taken before.
  StepFailedUntouched(const std::string& what, bool restored) : std::runtime_error(what), restored_(restored) {}
  bool restored() const { return restored_; }

 private:
  bool restored_;
};

class StepRunner {
 public:
  using Warn = std::function<void(const std::string&)>;
  // graph_plugin records the CUDA graph (null: plans with cuda_graph run without one). Counts go
  // to `stats`, which outlives the runner.
  StepRunner(std::shared_ptr<const StepPlan> plan, std::shared_ptr<const LoadedPlugin> graph_plugin,
             const RunOptions& options, StepStats& stats, Warn warn_once);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // One compiled step: `scalars` holds the current run-time scalars (StepPlan::num_scalars).
  // Returns the step's results; the parameters' .grad and every written tensor are updated.
  // Throws StepFailedUntouched when it fails before writing into any tensor it was given, or after
  // with what it wrote put back (outside CUDA graphs, and in the step that warms a graph up: a
  // replay cannot be undone), anything else when it fails otherwise.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<c10::IValue>& scalars);

  const StepPlan& plan() const { return *plan_; }

 private:
  struct Executor;
  void fill_scalars(const std::vector<c10::IValue>& scalars);
  // The values of scalar buffer `b` in pinned host memory (plain host memory off CUDA).
  at::Tensor scalar_values(size_t b, const std::vector<c10::IValue>& scalars) const;
  // This replay's addresses of the graph's copies; copies of inputs that cannot be read where they
  // are, and everything the graph does not copy itself, enqueued before the launch.
  std::vector<KilnGraphCopy> graph_copies(const std::vector<at::Tensor>& inputs,
                                          const std::vector<c10::IValue>& scalars);
  void bind(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* statics = nullptr);
  void run_body(const std::vector<c10::IValue>& scalars, void* stream, bool undoable = false);
  std::vector<at::Tensor> finish(bool clone_results);
  std::vector<at::Tensor> warm_up_and_record(const std::vector<at::Tensor>& inputs,
                                             const std::vector<c10::IValue>& scalars);
  std::vector<at::Tensor> replay(const std::vector<at::Tensor>& inputs, const std::vector<c10::IValue>& scalars);
  void skip_graph(const std::string& why);

  std::shared_ptr<const StepPlan> plan_;
  std::shared_ptr<const LoadedPlugin> graph_plugin_;
  RunOptions options_;
  StepStats& stats_;
  int counted_failed_groups_ = 0;  // the executor's in-run group failures already in stats_
  Warn warn_once_;
  std::unique_ptr<Executor> exec_;
  std::vector<at::Tensor> env_;
  std::vector<at::Tensor> scalar_buffers_;  // one device buffer per dtype of lifted scalars
  bool graphs_ = false;                     // the plan's cuda_graph, until a capture fails
  std::unique_ptr<cudagraph::Step> cg_;
  // Under a CUDA graph, the address of every tensor the graph reads in place at the recording (a
  // parameter's gradient, when `grad`): torch::load gives a parameter new memory (Tensor::set_),
  // and a loop may give a gradient a new tensor, which a replay would not see.
  struct GraphAddress {
    at::Tensor tensor;
    const void* address;
    bool grad;
  };
  std::vector<GraphAddress> graph_addresses_;
  // The copies inside the recorded graph (RunOptions::graph_copies, a plugin that re-points them):
  // each vector by user input, scalar buffer or plan output, holding the graph's copy index or -1
  // (copied around the launch, as without them), with what the recording copied from or into.
  struct GraphCopies {
    std::vector<int> input, scalar, result;
    std::vector<at::Tensor> input_source;  // the recorded source; where an input that cannot be read
                                           // in place (strided, another dtype) is copied first
    std::vector<at::Tensor> scalar_host;   // the pinned values the graph copies from now
    std::vector<at::Tensor> result_target;
  };
  GraphCopies gc_;
  std::vector<at::Tensor> fresh_results_;  // by plan output: this replay's copy of a result, or undefined
};

}  // namespace kiln
