// Dead-code elimination: a node stays when a graph output or a kept node reads one of its
// results, or when it has an effect (mutates, draws random numbers, or is unknown to the
// dispatcher, so kiln cannot tell).
#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {

void eliminate_dead_code(ir::Graph& g) {
  std::vector<char> live_value(g.values.size(), 0);
  for (const auto& out : g.outputs) live_value[out.value] = 1;
  std::vector<char> keep(g.nodes.size(), 0);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const auto& n = g.nodes[i];
    bool needed = !op_is_pure(op_info(n.op));
    for (auto v : n.outputs) needed = needed || (v != ir::kNoValue && live_value[v]);
    if (!needed) continue;
    keep[i] = 1;
    for (auto v : ir::Graph::node_inputs(n)) live_value[v] = 1;
  }
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (keep[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  g.reindex();
}

}  // namespace kiln
