// Planning pass: a write-back whose value comes from an element-wise op that runs eagerly is
// computed straight into the written tensor by the op's out= variant (add.Tensor -> add.out), when
// nothing that runs later reads the tensor's old value and the layouts match. This saves a copy and
// an allocation per parameter and optimizer-state tensor per step. Element-wise ops may write an
// input they read (that is how add_ works), so the out= tensor may be one of the op's arguments.
//
// It runs after partitioning, on the order the step really runs in: `position[i]` is when node i
// runs (the nodes of one compiled group share their group's slot), encoded as -(slot + 1) for a
// node a plugin runs, which is never rewritten. The result is no longer pure: only executors run it, no pass after it.
#include <set>

#include <ATen/core/dispatch/Dispatcher.h>

#include "kiln/internal/passes.h"

namespace kiln {

void compute_writebacks_in_place(ir::Graph& g, const std::vector<int32_t>& position) {
  static const std::set<std::string> elementwise = {"aten::add",     "aten::sub",     "aten::mul",  "aten::div",
                                                    "aten::addcdiv", "aten::addcmul", "aten::lerp", "aten::sqrt",
                                                    "aten::neg",     "aten::clamp",   "aten::copy"};
  auto slot = [&](size_t node) {
    if (position.empty()) return static_cast<int32_t>(node);
    return position[node] >= 0 ? position[node] : -position[node] - 1;
  };
  auto eager = [&](size_t node) { return position.empty() || position[node] >= 0; };
  // When each value is last read, in run order.
  std::vector<int32_t> last_read(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int32_t at = slot(i);
    for (auto v : ir::Graph::node_inputs(g.nodes[i]))
      last_read[static_cast<size_t>(v)] = std::max(last_read[static_cast<size_t>(v)], at);
  }
  std::vector<int> output_uses(g.values.size(), 0);
  for (const auto& o : g.outputs) ++output_uses[static_cast<size_t>(o.value)];
  for (const auto& o : g.outputs) {
    if (o.role != ir::OutputRole::WriteBack) continue;
    const auto& val = g.value(o.value);
    const auto in = g.inputs[static_cast<size_t>(o.target)].value;
    if (val.producer < 0 || !eager(static_cast<size_t>(val.producer))) continue;
    if (output_uses[static_cast<size_t>(o.value)] != 1 || output_uses[static_cast<size_t>(in)] != 0) continue;
    auto& n = g.nodes[static_cast<size_t>(val.producer)];
    if (n.outputs.size() != 1 || n.returns_list ||
        last_read[static_cast<size_t>(in)] > slot(static_cast<size_t>(val.producer)))
      continue;
    if (val.meta != g.value(in).meta) continue;
    const auto dot = n.op.find('.', 6);
    const std::string name = n.op.substr(0, dot), overload = dot == std::string::npos ? "" : n.op.substr(dot + 1);
    if (!elementwise.count(name)) continue;
    const std::string out_overload = overload.empty() || overload == "Tensor" ? "out" : overload + "_out";
    auto h = c10::Dispatcher::singleton().findOp({name, out_overload});
    if (!h || h->schema().arguments().size() != n.args.size() + 1) continue;
    bool args_match = true;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const auto& a = h->schema().arguments()[i];
      args_match = args_match && !(a.alias_info() && a.alias_info()->isWrite());
    }
    if (!args_match) continue;
    n.op = name + "." + out_overload;
    n.args.push_back(ir::Arg::tensor(in));
  }
}

}  // namespace kiln
