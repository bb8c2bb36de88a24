// Runs a pure graph split between a backend plugin and the eager executor: the plugin claims
// nodes through the C ABI, the core forms convex groups (partition.h), the plugin compiles each
// group, and every node outside a compiled group runs eagerly. A group the plugin declines
// (KILN_ERROR_UNIMPLEMENTED) runs eagerly without a word; a group whose compile fails runs
// eagerly with one warning naming the plugin and its message. Nothing is lost either way, and
// CompiledPartition::outcomes says which groups the plugin's code runs and why the others do not.
//
// With verify_groups ([debug] verify_groups), every compiled group is checked against the eager
// executor as it runs and each output's relative error is logged: the way to find which group of
// a backend computes a wrong number.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "kiln/internal/executor.h"
#include "kiln/group_outcome.h"
#include "kiln/ir.h"
#include "kiln/internal/partition.h"
#include "kiln/plugin_api.h"

namespace kiln {

class LoadedPlugin;
class PluginExecutable;
class SymbolicGroups;

struct PartitionStats {
  size_t nodes = 0;
  size_t claimed = 0;         // what the plugin claimed
  size_t claims_dropped = 0;  // claims the host does not hand out (node_can_be_claimed; views at a group's end)
  size_t groups = 0;
  size_t groups_compiled = 0;  // run by the plugin
  size_t nodes_compiled = 0;
  std::vector<std::string> compile_errors;  // one per group that failed (not UNIMPLEMENTED)
  size_t compile_threads = 1;               // groups that compiled at once (at most)
  size_t inplace_offered = 0;               // compiled groups' outputs offered their input's memory (ABI 2.2)
  size_t inplace_accepted = 0;              // of those, computed over it
  size_t groups_symbolic = 0;               // compiled from a symbolic view, serving every size (ABI 2.4)
  size_t groups_reused = 0;                 // run by an executable compiled for another size (ABI 2.4)
};

// One claimed group and what became of it.
struct CompiledGroup {
  PartitionGroup group;
  std::shared_ptr<PluginExecutable> exe;  // null: its nodes run eagerly; may serve other plans too
  // An executable that serves every size (ABI 2.4): the symbols each run's sizes are read from
  // (dimension `dim` of group input `input`). Empty otherwise.
  std::vector<KilnSizeSymbol> symbols;
  std::vector<ir::TensorMeta> output_meta;
  std::vector<ir::Node> nodes;  // the group's nodes, for verify_groups
};

// The partition stage of a plan: what the plugin claimed, the convex groups, and each group
// compiled. Immutable once made; executors share it.
struct CompiledPartition {
  std::shared_ptr<const LoadedPlugin> plugin;  // the chosen backend: plugins[0]
  // The backends that claimed nodes, in the order they were asked (PartitionGroup::backend): the
  // chosen one first, then those that take what it leaves ("ipex+inductor").
  std::vector<std::shared_ptr<const LoadedPlugin>> plugins;
  Partition partition;
  std::vector<CompiledGroup> groups;
  PartitionStats stats;
  // Every group the plugin claimed, in partition order: compiled, declined or failed, and why.
  std::vector<GroupOutcome> outcomes;
  // When each node runs: its slot, or -(slot + 1) for a node of a compiled group (what
  // compute_writebacks_in_place reads).
  std::vector<int32_t> position;
};

// Claims, partitions and compiles: a group the plugin declines (KILN_ERROR_UNIMPLEMENTED) runs
// eagerly without a word, a group whose compile fails runs eagerly with one warning naming the
// plugin and its message. With a plugin whose compile is safe to run concurrently
// (KILN_CAPABILITY_CONCURRENT_COMPILE), up to `compile_threads` groups compile at once; the outcome
// and the log are the same as one by one, in group order.
//
// `symbolic` (the plans of one family of shapes share it): for backends with symbolic shapes (ABI
// 2.4), a group met before at another size runs the executable compiled for every size, and a
// group met at its second size is offered to the backend in symbolic form (symbolic_groups.h).
std::shared_ptr<const CompiledPartition> compile_partition(const ir::Graph& graph,
                                                           std::shared_ptr<const LoadedPlugin> plugin, KilnMode mode,
                                                           int compile_threads = 1, SymbolicGroups* symbolic = nullptr);
// Several backends: each claims, in turn, among the nodes the ones before it left; a group holds
// one backend's nodes and is compiled by it. `modes[k]`: the mode backend k compiles in.
std::shared_ptr<const CompiledPartition> compile_partition(const ir::Graph& graph,
                                                           std::vector<std::shared_ptr<const LoadedPlugin>> plugins,
                                                           std::vector<KilnMode> modes, int compile_threads = 1,
                                                           SymbolicGroups* symbolic = nullptr);
// The partition and its outcome as text, for the debug dump.
std::string print_compiled_partition(const ir::Graph& graph, const CompiledPartition& partition);

class PartitionedExecutor {
 public:
  // Runs `graph` (the partitioned graph, its write-backs planned in place with the partition's
  // positions) as `partition` says. `keep`: values that must survive the run (graph outputs are
  // always kept). verify_groups: see verify_group.
  PartitionedExecutor(const ir::Graph& graph, std::shared_ptr<const CompiledPartition> partition,
                      bool verify_groups = false, std::vector<ir::ValueId> keep = {});
  // Partitions and compiles `graph` itself (tests and tools that run a pure graph).
  PartitionedExecutor(const ir::Graph& graph, std::shared_ptr<const LoadedPlugin> plugin, KilnMode mode);
  ~PartitionedExecutor();
  PartitionedExecutor(const PartitionedExecutor&) = delete;
  PartitionedExecutor& operator=(const PartitionedExecutor&) = delete;

  // Same contract as EagerExecutor::run. `stream` is handed to the plugin (NULL on CPU).
  // `reached`, when given, holds the index of the unit running (eager node or compiled group), so
  // that a caller who catches a failure knows how far the run got.
  // `saved`, when given, gets a copy of every tensor the run writes into, taken before the first
  // write, when a compiled group runs at or after it (a plugin may then fail after a write):
  // restore() puts them back, so that a failed run changed nothing it was given.
  // The copies are kept from run to run (one allocation, and one multi-tensor copy a run).
  struct Saved {
    std::vector<at::Tensor> targets, copies;  // the tensors written, their values before
    bool taken = false;                       // this run took the copy
    void take(const std::vector<at::Tensor>& written);
    void restore();
    void clear() {
      taken = false;
      targets.clear();
    }
  };
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars = nullptr, void* stream = nullptr,
           size_t* reached = nullptr, Saved* saved = nullptr) const;
  // The first unit that may write into memory the run did not allocate: an eager node that writes
  // an argument (a write-back computed in place with out=) or a group given an input's memory for
  // an output (in-place outputs). A run that fails before it has changed no tensor it was given.
  size_t first_writing_unit() const { return first_writing_unit_; }
  // A group whose executable computes outputs over its inputs' memory and promised that a failed
  // execute wrote none of them (ABI 2.5, inplace_atomic) needs no copy: if it fails, its nodes run
  // eagerly in its place, from the same inputs, and the run goes on; that group's nodes run
  // eagerly in every later run too. The failures so far, one message each ("" when none).
  size_t groups_failed_in_run() const;
  std::string last_group_failure() const;
  const PartitionStats& stats() const { return partition_->stats; }
  const std::vector<GroupOutcome>& groups() const { return partition_->outcomes; }

 private:
  void init(const ir::Graph& graph, std::vector<ir::ValueId> keep);
  // After each compiled group, runs its nodes eagerly from the same inputs and logs the relative
  // error of every output (a backend author's first tool when a step goes wrong).
  void verify_group(const CompiledGroup& grp, int32_t index, const std::vector<at::Tensor>& env,
                    const std::vector<c10::IValue>* scalars) const;
  bool group_runs_eagerly(int32_t group) const;
  void run_group_eagerly(const CompiledGroup& grp, std::vector<at::Tensor>& env,
                         const std::vector<c10::IValue>* scalars) const;

  struct Unit {
    std::unique_ptr<PreparedNode> node;  // eager
    int32_t group = -1;                  // or a compiled group
    std::vector<ir::ValueId> free_after;
  };
  std::shared_ptr<const CompiledPartition> partition_;
  bool verify_groups_ = false;
  bool pass_scalars_ = false;  // some backend of the partition takes run-time scalars
  std::vector<Unit> units_;
  size_t first_writing_unit_ = 0;
  size_t save_at_ = 0;                     // units_.size(): nothing to save
  std::vector<ir::ValueId> saved_values_;  // what the units from save_at_ on write into
  // By group: runs its nodes eagerly after a failure of its atomic in-place executable.
  struct Failures;
  std::unique_ptr<Failures> failures_;
};

// Whether the host may hand a node to a plugin: nodes with undefined results stay eager, and so do
// nodes with run-time scalars unless the plugin takes them (KILN_CAPABILITY_RUNTIME_SCALARS).
bool node_can_be_claimed(const ir::Node& node, bool plugin_takes_runtime_scalars);

}  // namespace kiln
