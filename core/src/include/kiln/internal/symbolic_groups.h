// Compiled groups that serve every size, for backends with symbolic shapes (ABI 2.4,
// KILN_CAPABILITY_SYMBOLIC_SHAPES).
//
// The shapes of a dynamic step are planned one by one (from its symbolic form), and each plan's
// partition has groups that differ from the same group at another shape only in their numbers.
// A SymbolicGroups cache, shared by the plans of one family of shapes, remembers each group the
// first time it is compiled. When the same group comes at a second shape, the two group graphs are
// unified (shape_unify.h) into a symbolic group: its symbols are dimensions of the group's own
// inputs, its size sites every number that follows them. The backend is handed that view once,
// and if it accepts it for every size, every later shape's group whose graph the symbolic group
// gives back exactly (checked text for text before each reuse) runs that one executable with its
// own sizes. A backend that declines (it compiles per shape), a group that does not unify, or a
// size the symbolic group does not give back is compiled per shape, as without the capability.
//
// Internal to kiln.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/internal/partition.h"
#include "kiln/internal/shape_unify.h"
#include "kiln/ir.h"
#include "kiln/plugin_api.h"

namespace kiln {

class PluginExecutable;

// The graph of one group on its own: its inputs first (user inputs "in.0", "in.1", ... in the
// group's input order), then its nodes' results in node order, so that value and node indices are
// those of the group's GraphView; the group's outputs are its results.
ir::Graph group_graph(const ir::Graph& graph, const PartitionGroup& group);

// The ABI form of a symbolic group's symbols and sites: symbol k is KilnSizeSymbol{input, dim} of
// the group graph's input named "in.<input>".
std::vector<KilnSizeSymbol> abi_symbols(const ir::SymbolicStep& sym);
std::vector<KilnSizeSite> abi_sites(const ir::SymbolicStep& sym);

class SymbolicGroups {
 public:
  // What to do with one group of a plan.
  struct Decision {
    enum class Kind { compile, compile_symbolic, reuse } kind = Kind::compile;
    std::string key;
    ir::Graph graph;                        // the group graph (compile, compile_symbolic)
    std::optional<ir::SymbolicStep> sym;    // compile_symbolic: the unified group
    std::shared_ptr<PluginExecutable> exe;  // reuse
    std::vector<KilnSizeSymbol> symbols;    // reuse, compile_symbolic
    size_t entry = 0;                       // compile_symbolic: the entry unified with
  };

  // `key_prefix` names the backend, its mode and the group's in-place offers (what else makes one
  // compile of the same graph differ from another).
  Decision decide(const ir::Graph& graph, const PartitionGroup& group, const std::string& key_prefix);
  // After the compile a decision asked for: `exe` null when it failed or was declined;
  // `accepted`: the backend serves every size with it (compile_symbolic only).
  void record(Decision& d, std::shared_ptr<PluginExecutable> exe, bool accepted);

  // The partition of an earlier plan of the family whose graph and claims had this partition_key
  // (partition.h), or null: shapes of one family differ in their numbers only, so most plans after
  // the first find theirs here instead of partitioning again.
  std::shared_ptr<const Partition> partition(const std::string& key);
  void keep_partition(std::string key, Partition partition);

 private:
  struct Entry {
    ir::Graph first;  // the group at the first size it was compiled for
    std::string first_text;
    std::optional<ir::SymbolicStep> sym;    // once unified with a second size
    std::shared_ptr<PluginExecutable> exe;  // the executable serving every size (accepted)
    bool per_shape = false;                 // the backend declined: compile each size
  };
  std::mutex mu_;
  std::map<std::string, std::vector<Entry>> entries_;  // by key: prefix + the graph's text without numbers
  // Recently made partitions by partition_key, the most recent first (a family has one or two).
  std::vector<std::pair<std::string, std::shared_ptr<const Partition>>> partitions_;
};

}  // namespace kiln
