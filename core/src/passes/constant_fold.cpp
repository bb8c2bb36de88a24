// Constant folding: a pure node whose tensor inputs were all folded here (or that reads no
// tensor, like aten::full or aten::arange) is evaluated once, here, and its results become
// Constant graph inputs. Constant inputs that capture bound are not folded through: they are read
// in place on every step (optimizer state kiln has no name for, for instance) and may change. Large results are left to
// be computed every step: holding them costs memory that a cheap fill does not. A node with a run-time scalar ($N) is
// never folded.
#include <ATen/core/function_schema.h>

#include "kiln/internal/executor.h"
#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {
namespace {
constexpr int64_t kMaxFoldedElements = 1 << 16;
}

void fold_constants(ir::Graph& g, ConstantTensors& constants) {
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  std::vector<at::Tensor> env(g.values.size());
  std::vector<char> folded_here(g.values.size(), 0);
  int folded = 0;
  for (auto& n : g.nodes) {
    bool foldable = op_is_pure(op_info(n.op)) && !n.outputs.empty();
    for (const auto& a : n.args) foldable = foldable && a.scalar_input < 0;  // changes every call
    for (auto v : ir::Graph::node_inputs(n)) foldable = foldable && folded_here[v];
    for (auto v : n.outputs) foldable = foldable && v != ir::kNoValue && g.value(v).meta.numel() <= kMaxFoldedElements;
    if (foldable) {
      try {
        EagerExecutor::run_node(n, env);
      } catch (const std::exception&) {
        foldable = false;  // leave it to run every step, where a failure is reported properly
      }
      if (foldable) {
        for (size_t k = 0; k < n.outputs.size(); ++k) {
          const ir::ValueId v = n.outputs[k];
          constants[v] = env[v];
          folded_here[v] = 1;
          g.inputs.push_back({v, ir::InputRole::Constant, "folded." + std::to_string(folded++)});
        }
        continue;
      }
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  g.reindex();
}

}  // namespace kiln
