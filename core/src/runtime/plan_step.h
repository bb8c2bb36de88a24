// The plan stage: from a captured step to an immutable plan that the runner executes.
//
// plan_step runs every pass in order, verifying the graph after each and dumping it into the debug
// directory ([debug] dump_dir) as it goes:
//
//   run-time scalar slots -> functionalize -> decompose -> dce -> cse -> constant_fold -> dce_final
//   -> overlap_collectives (data parallelism) -> lift_runtime_scalars (whole-step CUDA graphs) -> batch_optimizer
//   ([experimental])
//   -> native_batch_norm, channels_last (CUDA, with a backend)
//   -> partition (the backend claims and compiles its groups) -> writebacks_in_place
//   -> write-back planning (bindings, storage adoption)
//
// The plan says how every graph input is bound (a user input, a tensor read in place, a lifted
// run-time scalar), what every output is (a result, a parameter's gradient, a write-back), which
// groups a plugin runs, and whether the step is recorded as one CUDA graph. Internal to the
// runtime; docs/architecture.md describes the stages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "kiln/internal/backend.h"
#include "kiln/ir.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/passes.h"
#include "kiln/internal/symbolic_groups.h"
#include "optimizer_probe.h"
#include "step_capture.h"

namespace kiln {

struct PlanOptions {
  std::string dump_dir;                   // [debug] dump_dir: every pass's IR, the partition, the plan
  bool lift_runtime_scalars = false;      // [debug]: lift run-time scalars without a CUDA graph too
  bool batch_optimizer = false;           // [experimental]
  bool overlap_collectives = true;        // all_reduces as early as their gradients allow (debug.no_comm_overlap off)
  bool writeback_copy = false;            // [runtime]: write-backs always copy (no storage adoption)
  double activation_memory_budget = 1.0;  // [runtime]: rematerialize's budget (1: nothing recomputed)
  int compile_threads = 1;                // [runtime]: groups the backend compiles at once (resolved, >= 1)
  std::string channels_last = "auto";     // [runtime]: CUDA convolutions on channels-last activations (with a backend)
  // The compiled groups shared by the plans of one family of shapes (dynamic shapes, backends with
  // symbolic shapes); null: every group is compiled for this plan.
  std::shared_ptr<SymbolicGroups> symbolic_groups;
};

struct InputBinding {
  ir::ValueId value = ir::kNoValue;
  int user = -1;       // a user input: its index among the step's inputs
  int lifted = -1;     // a lifted run-time scalar: StepPlan::lifted[lifted]
  at::Tensor tensor;   // otherwise: the tensor read in place (parameter, state, buffer, constant)
  at::Tensor grad_of;  // set: read this parameter's gradient of the call instead of `tensor`
};

struct OutputBinding {
  ir::OutputRole role = ir::OutputRole::Result;
  ir::ValueId value = ir::kNoValue;
  int32_t index = -1;  // Result: the result's index; Gradient: the parameter's index
  at::Tensor target;   // WriteBack: the tensor written; Gradient: the parameter
  bool adopt = false;  // WriteBack: the target may take the value's storage (see the runner)
  at::Tensor grad_of;  // WriteBack: set when the target is this parameter's gradient of the call
};

struct StepPlan {
  ir::Graph graph;      // pure, after the graph passes and lifting: what the backend saw
  ir::Graph run_graph;  // the same with write-backs planned in place: what the executors run
  ConstantTensors constants;
  std::vector<InputBinding> inputs;  // parallel to graph.inputs
  std::vector<OutputBinding> outputs;
  size_t num_results = 0;
  size_t num_scalars = 0;  // run-time scalars bound per call (ir::Graph::scalar_inputs)
  // The backend's groups; null when no backend runs any node (every node on the eager executor).
  std::shared_ptr<const CompiledPartition> partition;
  c10::Device device = c10::Device(c10::kCPU);  // the step's device
  // Whole-step CUDA graph: recorded when true. graph_skip says why not when one was asked for on a
  // CUDA step and this plan cannot be recorded ("cpu device (input ...)").
  bool cuda_graph = false;
  std::string graph_skip;
  bool draws_random = false;         // the plan has a random op: its graph registers the CUDA generator
  std::vector<LiftedScalar> lifted;  // run-time scalars as 0-dim device tensors
  std::vector<std::pair<c10::ScalarType, int64_t>> scalar_buffers;  // per dtype of lifted scalars: count
  std::vector<std::pair<size_t, int64_t>> lifted_at;                // per lifted scalar: (buffer, index)
  std::vector<PassRecord> passes;

  // Whether a plugin runs some of the nodes (else the eager executor runs them all).
  bool backend_runs_nodes() const { return partition && partition->stats.groups_compiled > 0; }
};

// Throws (naming the pass or the input) when the step cannot be planned; the caller falls back.
std::shared_ptr<const StepPlan> plan_step(const CapturedStep& captured, const ScalarSlots& slots,
                                          const ResolvedBackend& backend, const PlanOptions& options);

}  // namespace kiln
