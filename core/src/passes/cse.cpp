// Common-subexpression elimination: a pure node with the same op, the same arguments (after
// earlier merges) and the same result types as an earlier one is dropped, and its results are
// replaced by the earlier node's everywhere, graph outputs included. Run-time scalars compare by
// their slot ($N), never by the value seen at capture (print_arg prints both).
#include <unordered_map>

#include "kiln/internal/ir_text.h"
#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {

void eliminate_common_subexpressions(ir::Graph& g) {
  std::vector<ir::ValueId> replace(g.values.size());
  for (size_t v = 0; v < replace.size(); ++v) replace[v] = static_cast<ir::ValueId>(v);
  auto rewrite = [&](ir::Arg& a) {
    if (a.kind == ir::Arg::Kind::Tensor) a.value = replace[a.value];
    else if (a.kind == ir::Arg::Kind::TensorList)
      for (auto& v : a.values)
        if (v != ir::kNoValue) v = replace[v];
  };
  std::unordered_map<std::string, size_t> seen;  // key -> index in `kept`
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (auto& n : g.nodes) {
    for (auto& a : n.args) rewrite(a);
    if (!op_is_pure(op_info(n.op))) {
      kept.push_back(std::move(n));
      continue;
    }
    std::string key = n.op;
    for (const auto& a : n.args) key += "|" + ir::print_arg(a);
    for (auto v : n.outputs) key += "|" + (v == ir::kNoValue ? std::string("_") : ir::print_type(g.value(v).meta));
    auto [it, fresh] = seen.emplace(key, kept.size());
    if (fresh) {
      kept.push_back(std::move(n));
      continue;
    }
    const auto& earlier = kept[it->second];
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (n.outputs[k] != ir::kNoValue) replace[n.outputs[k]] = earlier.outputs[k];
  }
  for (auto& out : g.outputs) out.value = replace[out.value];
  g.nodes = std::move(kept);
  g.reindex();
}

}  // namespace kiln
