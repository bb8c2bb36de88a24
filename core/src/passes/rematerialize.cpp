// Rematerialization under an activation memory budget ([runtime] activation_memory_budget,
// PyTorch's torch._functorch.config.activation_memory_budget): forward values the backward reads
// (the activations the step keeps from its forward to its backward) are computed again in the
// backward instead of kept, where that is cheap and exact.
//
// What is kept: the memory of every value a forward node produced and a backward node reads, by
// the tensor it is memory of (a view counts as its base). A kept tensor r may be dropped when every
// value the backward reads of it can be computed again, in the backward, from what stays kept:
// graph inputs (parameters, the batch) and the other kept tensors. Computed again means the same
// ops on the same inputs: element-wise ops, views, dtype casts and layer norm (whose mean and
// rstd the backward keeps anyway): cheap next to the matmuls and attention, which are never
// recomputed, and exact. Ops that draw random numbers (dropout) are never recomputed: their masks
// stay kept, so the step draws what eager draws.
//
// Greedy, largest first: tensors are dropped while the kept bytes exceed budget x what the
// forward keeps without the pass (budget 0: every tensor that can be dropped is). The copies of
// the forward nodes are Phase::Recompute nodes placed just before the first backward node that
// reads them; the backward nodes read the copies. The partitioner never puts a Recompute node in a
// group with forward nodes (it would compute it in the forward and keep it again).
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <c10/core/ScalarType.h>

#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {

namespace {

const std::unordered_set<std::string>& recomputable_ops() {
  static const std::unordered_set<std::string> ops = {"aten::gelu",
                                                      "aten::relu",
                                                      "aten::silu",
                                                      "aten::sigmoid",
                                                      "aten::tanh",
                                                      "aten::neg",
                                                      "aten::exp",
                                                      "aten::log",
                                                      "aten::abs",
                                                      "aten::erf",
                                                      "aten::sqrt",
                                                      "aten::rsqrt",
                                                      "aten::add.Tensor",
                                                      "aten::sub.Tensor",
                                                      "aten::mul.Tensor",
                                                      "aten::div.Tensor",
                                                      "aten::add.Scalar",
                                                      "aten::mul.Scalar",
                                                      "aten::pow.Tensor_Scalar",
                                                      "aten::where.self",
                                                      "aten::clone",
                                                      "aten::_to_copy",
                                                      "aten::threshold",
                                                      "aten::leaky_relu",
                                                      "aten::hardtanh",
                                                      "aten::native_layer_norm"};
  return ops;
}

bool recomputable(const ir::Node& n) {
  const OpInfo& info = op_info(n.op);
  if (!op_is_pure(info) || node_draws_random_numbers(n)) return false;
  for (const auto& a : n.args)
    if (a.scalar_input >= 0) return false;  // a run-time scalar's slot: keep it out of the copies
  return info.is_view || recomputable_ops().count(n.op) > 0;
}

int64_t bytes_of(const ir::TensorMeta& m) { return m.numel() * static_cast<int64_t>(c10::elementSize(m.dtype)); }

}  // namespace

RematerializeResult rematerialize(ir::Graph& g, double budget) {
  RematerializeResult r;
  const size_t n_values = g.values.size();
  // The tensor each value is memory of (a view's base, through views).
  std::vector<ir::ValueId> root(n_values);
  for (size_t v = 0; v < n_values; ++v) root[v] = static_cast<ir::ValueId>(v);
  for (const auto& n : g.nodes) {
    if (!op_info(n.op).is_view) continue;
    const auto ins = ir::Graph::node_inputs(n);
    if (ins.empty()) continue;
    for (auto o : n.outputs)
      if (o != ir::kNoValue) root[static_cast<size_t>(o)] = root[static_cast<size_t>(ins.front())];
  }
  auto producer = [&](ir::ValueId v) -> const ir::Node* {
    const int32_t p = g.value(v).producer;
    return p < 0 ? nullptr : &g.nodes[static_cast<size_t>(p)];
  };
  auto forward_value = [&](ir::ValueId v) {
    const ir::Node* p = producer(v);
    return p && p->phase == ir::Phase::Forward;
  };
  // What the backward reads of the forward, by kept tensor; and where it first reads it.
  std::map<ir::ValueId, std::set<ir::ValueId>> read_of;  // kept tensor -> the values read
  std::map<ir::ValueId, size_t> first_read;              // kept tensor -> first backward node
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].phase != ir::Phase::Backward) continue;
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) {
      if (v == ir::kNoValue || !forward_value(v)) continue;
      const ir::ValueId t = root[static_cast<size_t>(v)];
      if (!forward_value(t)) continue;  // a view of a graph input: nothing kept
      read_of[t].insert(v);
      first_read.emplace(t, i);
    }
  }
  // A tensor the step returns stays alive whatever the backward does.
  std::set<ir::ValueId> returned;
  for (const auto& o : g.outputs) returned.insert(root[static_cast<size_t>(o.value)]);
  std::set<ir::ValueId> kept;
  for (const auto& [t, reads] : read_of) {
    kept.insert(t);
    r.kept_bytes_before += bytes_of(g.value(t).meta);
  }
  r.kept_bytes_after = r.kept_bytes_before;
  if (budget >= 1.0 || kept.empty()) return r;
  const double target = std::max(0.0, budget) * static_cast<double>(r.kept_bytes_before);

  // Whether `v` can be computed in the backward from graph inputs and kept tensors other than
  // `dropping`, and the forward nodes that computing it repeats (inputs first), within `depth`.
  // `leaves`: the kept tensors it reads as they are.
  std::function<bool(ir::ValueId, ir::ValueId, int, std::vector<int32_t>&, std::set<int32_t>&, std::set<ir::ValueId>&)>
      plan;
  plan = [&](ir::ValueId v, ir::ValueId dropping, int depth, std::vector<int32_t>& order, std::set<int32_t>& seen,
             std::set<ir::ValueId>& leaves) -> bool {
    const int32_t p = g.value(v).producer;
    if (p < 0) return true;  // a graph input
    if (!forward_value(v)) return false;
    const ir::ValueId t = root[static_cast<size_t>(v)];
    if (t != dropping && kept.count(t)) {  // still kept: read as it is
      leaves.insert(t);
      return true;
    }
    if (seen.count(p)) return true;
    const ir::Node& n = g.nodes[static_cast<size_t>(p)];
    if (depth <= 0 || !recomputable(n)) return false;
    for (auto in : ir::Graph::node_inputs(n))
      if (in != ir::kNoValue && !plan(in, dropping, depth - 1, order, seen, leaves)) return false;
    seen.insert(p);
    order.push_back(p);
    return true;
  };

  // Largest first.
  std::vector<ir::ValueId> by_size(kept.begin(), kept.end());
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](ir::ValueId a, ir::ValueId b) { return bytes_of(g.value(a).meta) > bytes_of(g.value(b).meta); });
  struct Drop {
    ir::ValueId tensor;
    std::vector<int32_t> nodes;  // forward nodes to repeat, inputs first
    size_t before;               // the first backward node that reads the tensor
  };
  std::vector<Drop> drops;
  std::set<ir::ValueId> pinned;  // kept tensors the copies read: they stay kept
  for (ir::ValueId t : by_size) {
    if (static_cast<double>(r.kept_bytes_after) <= target) break;
    if (pinned.count(t) || returned.count(t)) continue;
    std::vector<int32_t> order;
    std::set<int32_t> seen;
    std::set<ir::ValueId> leaves;
    bool ok = true;
    for (auto v : read_of[t]) ok = ok && plan(v, t, /*depth=*/8, order, seen, leaves);
    if (!ok || order.empty()) continue;
    pinned.insert(leaves.begin(), leaves.end());
    kept.erase(t);
    r.kept_bytes_after -= bytes_of(g.value(t).meta);
    drops.push_back({t, std::move(order), first_read[t]});
  }
  if (drops.empty()) return r;

  // The copies, each group placed before the first backward node that reads its tensor.
  std::map<size_t, std::vector<ir::Node>> insert_before;
  for (const Drop& d : drops) {
    std::unordered_map<ir::ValueId, ir::ValueId> copy_of;
    auto renamed = [&](ir::ValueId v) {
      auto it = copy_of.find(v);
      return it == copy_of.end() ? v : it->second;
    };
    for (int32_t p : d.nodes) {
      ir::Node c = g.nodes[static_cast<size_t>(p)];
      c.phase = ir::Phase::Recompute;
      for (auto& a : c.args) {
        if (a.kind == ir::Arg::Kind::Tensor && a.value != ir::kNoValue) a.value = renamed(a.value);
        if (a.kind == ir::Arg::Kind::TensorList)
          for (auto& v : a.values)
            if (v != ir::kNoValue) v = renamed(v);
      }
      for (auto& o : c.outputs) {
        if (o == ir::kNoValue) continue;
        ir::Value nv = g.value(o);
        nv.id = static_cast<ir::ValueId>(g.values.size());
        nv.producer = -1;  // reindex() sets it
        g.values.push_back(nv);
        copy_of[o] = nv.id;
        o = nv.id;
      }
      insert_before[d.before].push_back(std::move(c));
      ++r.recomputed_nodes;
    }
    // The backward reads the copies (every backward node: each read value is either kept or copied).
    for (auto& n : g.nodes) {
      if (n.phase != ir::Phase::Backward) continue;
      for (auto& a : n.args) {
        if (a.kind == ir::Arg::Kind::Tensor && a.value != ir::kNoValue &&
            root[static_cast<size_t>(a.value)] == d.tensor && copy_of.count(a.value))
          a.value = copy_of[a.value];
        if (a.kind == ir::Arg::Kind::TensorList)
          for (auto& v : a.values)
            if (v != ir::kNoValue && root[static_cast<size_t>(v)] == d.tensor && copy_of.count(v)) v = copy_of[v];
      }
    }
    ++r.dropped_tensors;
  }
  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size() + static_cast<size_t>(r.recomputed_nodes));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = insert_before.find(i); it != insert_before.end())
      for (auto& c : it->second) nodes.push_back(std::move(c));
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.reindex();
  return r;
}

}  // namespace kiln
