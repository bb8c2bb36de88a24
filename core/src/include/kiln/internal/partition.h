// Partitioning a pure graph between a backend plugin and the eager executor.
//
// The backend claims nodes through the C ABI (over a KilnGraphView of the whole graph); the core
// checks the claims and forms convex groups of claimed nodes: connected through direct edges, and
// never so that a path leaves a group and comes back (which would make the groups impossible to
// order). Each group becomes one subgraph the backend compiles; every other node runs eagerly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/ir.h"
#include "kiln/plugin_api.h"

namespace kiln {

// Owns the C structs of a KilnGraphView over an ir::Graph (or a group of its nodes) and keeps
// them alive for as long as a plugin may read them: the claim or compile call.
class GraphView {
 public:
  // The whole graph; value indices are value ids, node indices are positions in graph.nodes.
  explicit GraphView(const ir::Graph& graph);
  // A subgraph: the given nodes (in order), reading `inputs` and producing `outputs` (value ids of
  // `graph`). Value indices in the view are dense: inputs first, then node results.
  GraphView(const ir::Graph& graph, const std::vector<int32_t>& nodes, const std::vector<ir::ValueId>& inputs,
            const std::vector<ir::ValueId>& outputs);
  ~GraphView();
  GraphView(const GraphView&) = delete;
  GraphView& operator=(const GraphView&) = delete;

  const KilnGraphView& view() const { return view_; }
  // ABI 2.4: makes the view symbolic (its numbers are the sizes the sites give at the symbols'
  // values it already has).
  void set_symbols(std::vector<KilnSizeSymbol> symbols, std::vector<KilnSizeSite> sites);

 private:
  struct Storage;
  std::unique_ptr<Storage> s_;
  KilnGraphView view_{};
};

struct PartitionGroup {
  int32_t backend = 0;               // which of the claiming backends owns the group (claim order)
  std::vector<int32_t> nodes;        // indices into graph.nodes, in graph order
  std::vector<ir::ValueId> inputs;   // read by the group, defined outside it
  std::vector<ir::ValueId> outputs;  // defined in the group, read outside it or graph outputs
};

struct Partition {
  std::vector<PartitionGroup> groups;
  std::vector<int32_t> group_of;  // per node: its group, or -1 when it runs eagerly
  // The order to run in: a node index (>= 0) runs eagerly; -(g + 1) runs group g.
  std::vector<int32_t> order;
  // Claimed views left to run eagerly at their group's end (partition_graph's `views_at_ends_run_eagerly`).
  size_t views_left_eager = 0;
};

// Checks claimed node indices (in range, no duplicates); throws std::invalid_argument naming the
// plugin and the bad index.
void validate_claims(const ir::Graph& graph, const std::vector<int64_t>& claimed, const std::string& plugin);

// Forms convex groups from the claimed nodes. A pure function of the graph and the claims.
// `claimed_by[k]`: the backend (0, 1, ...) that claimed node claimed[k] when several backends
// share the graph (empty: all backend 0); a group holds the nodes of one backend only.
// `views_at_ends_run_eagerly`: a view that sees all of its base and whose result only leaves its
// group runs eagerly (metadata over the group's output) instead of being copied out by the plugin;
// the conformance suite turns it off to check a plugin's own views.
Partition partition_graph(const ir::Graph& graph, const std::vector<int64_t>& claimed,
                          const std::vector<int32_t>& claimed_by = {}, bool views_at_ends_run_eagerly = true);

// Everything partition_graph's result depends on, as bytes: each node's op, inputs and outputs, the
// graph's outputs, the claims and, for each claimed view, whether it sees all of its base. Two
// graphs with equal keys (one step at two sizes, whose numbers alone differ) have the same partition.
std::string partition_key(const ir::Graph& graph, const std::vector<int64_t>& claimed,
                          const std::vector<int32_t>& claimed_by = {}, bool views_at_ends_run_eagerly = true);

// Text for KILN_DEBUG_DIR: each group with its nodes, inputs and outputs, then the eager nodes.
std::string print_partition(const ir::Graph& graph, const Partition& partition);

// DLPack descriptions of tensors and metadata.
DLDataType to_dl_dtype(c10::ScalarType t);
DLDevice to_dl_device(const c10::Device& d);
// A DLTensor over `t` (borrowed: valid while `t` lives and is not resized).
DLTensor to_dl_tensor(const at::Tensor& t);

}  // namespace kiln
