// Runs a pure graph split between a backend plugin and the eager executor: the plugin claims
// nodes through the C ABI, the core forms convex groups (partition.h), the plugin compiles each
// group, and every node outside a compiled group runs eagerly. A group the plugin declines
// (KILN_ERROR_UNIMPLEMENTED) runs eagerly without a word; a group whose compile fails runs
// eagerly with one warning naming the plugin and its message. Nothing is lost either way, and
// groups() says which groups the plugin's code runs and why the others do not.
//
// KILN_VERIFY_GROUPS=1 checks every compiled group against the eager executor as it runs and logs
// each output's relative error: the way to find which group of a backend computes a wrong number.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "kiln/executor.h"
#include "kiln/group_outcome.h"
#include "kiln/ir.h"
#include "kiln/partition.h"
#include "kiln/plugin_api.h"

namespace kiln {

class LoadedPlugin;
class PluginExecutable;

struct PartitionStats {
  size_t nodes = 0;
  size_t claimed = 0;           // what the plugin claimed
  size_t claims_dropped = 0;    // claims the host does not hand out (see node_can_be_claimed)
  size_t groups = 0;
  size_t groups_compiled = 0;   // run by the plugin
  size_t nodes_compiled = 0;
  std::vector<std::string> compile_errors;  // one per group that failed (not UNIMPLEMENTED)
};

class PartitionedExecutor {
 public:
  // `keep`: values that must survive the run (graph outputs are always kept). Writes the partition
  // to <debug_dir>/partition.txt when debug_dir is set.
  PartitionedExecutor(const ir::Graph& graph, std::shared_ptr<const LoadedPlugin> plugin, KilnMode mode,
                      const std::string& debug_dir = "", std::vector<ir::ValueId> keep = {});
  ~PartitionedExecutor();
  PartitionedExecutor(const PartitionedExecutor&) = delete;
  PartitionedExecutor& operator=(const PartitionedExecutor&) = delete;

  // Same contract as EagerExecutor::run. `stream` is handed to the plugin (NULL on CPU).
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars = nullptr,
           void* stream = nullptr) const;

  const PartitionStats& stats() const { return stats_; }
  // Every group the plugin claimed, in partition order: compiled, declined or failed, and why.
  const std::vector<GroupOutcome>& groups() const { return outcomes_; }

 private:
  struct Group {
    std::unique_ptr<PluginExecutable> exe;
    std::vector<ir::ValueId> inputs, outputs;
    std::vector<ir::TensorMeta> output_meta;
    std::vector<ir::Node> nodes;  // for KILN_VERIFY_GROUPS: the same work on the eager executor
  };
  // KILN_VERIFY_GROUPS=1: after each group, run its nodes eagerly from the same inputs and log the
  // relative error of every output (a backend author's first tool when a step goes wrong).
  void verify_group(const Group& grp, int32_t index, const std::vector<at::Tensor>& env,
                    const std::vector<c10::IValue>* scalars) const;
  bool verify_groups_ = false;
  struct Unit {
    std::unique_ptr<PreparedNode> node;  // eager
    int32_t group = -1;                  // or a compiled group
    std::vector<ir::ValueId> free_after;
  };
  std::vector<Group> groups_;
  std::vector<GroupOutcome> outcomes_;
  bool pass_scalars_ = false;
  std::vector<Unit> units_;
  PartitionStats stats_;
};

// Whether the host may hand a node to a plugin: nodes with undefined results stay eager, and so do
// nodes with run-time scalars unless the plugin takes them (ABI 1.1 execute_with_scalars).
bool node_can_be_claimed(const ir::Node& node, bool plugin_takes_runtime_scalars);

}  // namespace kiln
