// batch_optimizer_updates: see kiln/internal/passes.h. The multi-tensor ops are ATen's own `_foreach_*`
// functional ops, whose CUDA kernels apply the same per-element functor as the single ops (their
// bit-exactness against the single ops on CUDA is what scripts/device-check batch measures); on
// the CPU they loop over the single ops, so the CPU tests check the rewrite itself bit for bit.
#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "kiln/internal/ir_text.h"
#include "kiln/internal/passes.h"

namespace kiln {

namespace {

struct Spec {
  const char* foreach_op;
  std::vector<int> lists;       // argument positions that become Tensor[] (position 0 is self)
  std::vector<int> keep;        // argument positions kept as they are (constants), in schema order
  bool shared_operand = false;  // arg 1 is one 0-dim tensor shared by every member
};

// The single op -> its multi-tensor form. `shared` picks the shared-0-dim-operand form of mul.Tensor.
const Spec* spec_for(const std::string& op, bool shared) {
  static const std::map<std::string, Spec> specs = {
      {"aten::mul.Scalar", {"aten::_foreach_mul.Scalar", {0}, {1}}},
      {"aten::add.Scalar", {"aten::_foreach_add.Scalar", {0}, {1}}},
      {"aten::add.Tensor", {"aten::_foreach_add.List", {0, 1}, {2}}},
      {"aten::sub.Tensor", {"aten::_foreach_sub.List", {0, 1}, {2}}},
      {"aten::mul.Tensor", {"aten::_foreach_mul.List", {0, 1}, {}}},
      {"aten::div.Tensor", {"aten::_foreach_div.List", {0, 1}, {}}},
      {"aten::addcmul", {"aten::_foreach_addcmul.Scalar", {0, 1, 2}, {3}}},
      {"aten::addcdiv", {"aten::_foreach_addcdiv.Scalar", {0, 1, 2}, {3}}},
      {"aten::sqrt", {"aten::_foreach_sqrt", {0}, {}}},
      {"aten::lerp.Scalar", {"aten::_foreach_lerp.Scalar", {0, 1}, {2}}},
  };
  static const Spec shared_mul = {"aten::_foreach_mul.Tensor", {0}, {}, true};
  if (shared) return op == "aten::mul.Tensor" ? &shared_mul : nullptr;
  auto it = specs.find(op);
  return it == specs.end() ? nullptr : &it->second;
}

bool is_one(const ir::Arg& a) {
  return (a.kind == ir::Arg::Kind::Int && a.i == 1) || (a.kind == ir::Arg::Kind::Double && a.d == 1.0);
}

}  // namespace

size_t batch_optimizer_updates(ir::Graph& g) {
  const size_t n = g.nodes.size();
  // Values written back: their producers stay single (compute_writebacks_in_place writes them
  // straight into the target).
  std::set<ir::ValueId> outputs;
  for (const auto& o : g.outputs)
    if (o.role == ir::OutputRole::WriteBack) outputs.insert(o.value);
  // Depth within the optimizer phase: 1 + the deepest optimizer-phase producer of an input; values
  // from the forward and backward (the gradients) count as sources. The optimizer phase comes last,
  // so two nodes of equal depth never depend on each other, and every dependency between two folded
  // nodes runs from a lower depth to a higher one: folding cannot make a cycle. (Depth over the
  // whole graph would split AdamW's groups, since each parameter's gradient comes out of the
  // backward at its own depth.)
  std::vector<int> depth(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int d = 0;
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) {
      const auto p = g.value(v).producer;
      if (p >= 0 && g.nodes[static_cast<size_t>(p)].phase == ir::Phase::Optimizer)
        d = std::max(d, depth[static_cast<size_t>(p)] + 1);
    }
    depth[i] = d;
  }
  // Candidates, grouped by (op, constants, dtype, device, depth, shared operand).
  std::map<std::string, std::vector<size_t>> groups;
  std::vector<const Spec*> spec(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const auto& node = g.nodes[i];
    if (node.phase != ir::Phase::Optimizer || node.outputs.size() != 1 || node.returns_list) continue;
    const auto out = node.outputs[0];
    if (out == ir::kNoValue || outputs.count(out)) continue;
    bool runtime = false;
    for (const auto& a : node.args) runtime = runtime || a.scalar_input >= 0;
    if (runtime || node.args.empty() || node.args[0].kind != ir::Arg::Kind::Tensor) continue;
    const auto& self = g.value(node.args[0].value).meta;
    const auto& res = g.value(out).meta;
    if (res.shape != self.shape || res.dtype != self.dtype || res.device != self.device || self.numel() == 0) continue;
    bool shared = false;
    if (node.op == "aten::mul.Tensor" && node.args.size() == 2 && node.args[1].kind == ir::Arg::Kind::Tensor) {
      const auto& other = g.value(node.args[1].value).meta;
      shared = other.shape.empty() && !self.shape.empty() && other.device == self.device;
    }
    const Spec* s = spec_for(node.op, shared);
    if (!s) continue;
    if (node.op == "aten::add.Scalar" && (node.args.size() != 3 || !is_one(node.args[2]))) continue;
    bool ok = true;
    for (int k : s->lists) {
      const auto& a = node.args[static_cast<size_t>(k)];
      if (a.kind != ir::Arg::Kind::Tensor) {
        ok = false;
        break;
      }
      const auto& m = g.value(a.value).meta;
      ok = m.shape == self.shape && m.dtype == self.dtype && m.device == self.device;
      if (!ok) break;
    }
    if (!ok) continue;
    std::string key =
        node.op + "|" + c10::toString(self.dtype) + "|" + self.device.str() + "|" + std::to_string(depth[i]);
    for (int k : s->keep) key += "|" + ir::print_arg(node.args[static_cast<size_t>(k)]);
    if (s->shared_operand) key += "|shared%" + std::to_string(node.args[1].value);
    groups[key].push_back(i);
    spec[i] = s;
  }
  // One multi-tensor node per group of two or more.
  std::vector<int> member_of(n, -1);  // node -> index into fused
  std::vector<ir::Node> fused;
  std::vector<size_t> fused_at;  // the group's last member: where it runs if nothing forces earlier
  size_t folded = 0;
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    const auto& first = g.nodes[members.front()];
    const Spec& s = *spec[members.front()];
    ir::Node f;
    f.op = s.foreach_op;
    f.phase = ir::Phase::Optimizer;
    f.returns_list = true;
    for (int k : s.lists) {
      std::vector<ir::ValueId> vs;
      for (auto m : members) vs.push_back(g.nodes[m].args[static_cast<size_t>(k)].value);
      f.args.push_back(ir::Arg::tensor_list(std::move(vs)));
    }
    if (s.shared_operand) f.args.push_back(first.args[1]);
    for (int k : s.keep) f.args.push_back(first.args[static_cast<size_t>(k)]);
    for (auto m : members) f.outputs.push_back(g.nodes[m].outputs[0]);
    for (auto m : members) member_of[m] = static_cast<int>(fused.size());
    fused_at.push_back(members.back());
    fused.push_back(std::move(f));
    folded += members.size();
  }
  if (fused.empty()) return 0;
  // Topological re-emission: units are the untouched nodes and the fused nodes, each with the
  // graph position it prefers (its own, or its group's last member's); a unit runs once every
  // value it reads exists, the earliest preferred position first.
  struct Unit {
    size_t at;
    int single = -1, multi = -1;
  };
  std::vector<Unit> units;
  std::vector<int> unit_of_node(n, -1);
  for (size_t i = 0; i < n; ++i)
    if (member_of[i] < 0) {
      unit_of_node[i] = static_cast<int>(units.size());
      units.push_back({i, static_cast<int>(i), -1});
    }
  const int first_multi = static_cast<int>(units.size());
  for (size_t f = 0; f < fused.size(); ++f) units.push_back({fused_at[f], -1, static_cast<int>(f)});
  for (size_t i = 0; i < n; ++i)
    if (member_of[i] >= 0) unit_of_node[i] = first_multi + member_of[i];
  auto unit_node = [&](const Unit& u) -> const ir::Node& {
    return u.single >= 0 ? g.nodes[static_cast<size_t>(u.single)] : fused[static_cast<size_t>(u.multi)];
  };
  std::vector<std::vector<int>> readers(units.size());
  std::vector<int> waiting(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u) {
    std::set<int> deps;
    for (auto v : ir::Graph::node_inputs(unit_node(units[u]))) {
      const auto p = g.value(v).producer;
      if (p >= 0) deps.insert(unit_of_node[static_cast<size_t>(p)]);
    }
    deps.erase(static_cast<int>(u));
    waiting[u] = static_cast<int>(deps.size());
    for (int d : deps) readers[static_cast<size_t>(d)].push_back(static_cast<int>(u));
  }
  using Item = std::pair<size_t, int>;  // (preferred position, unit)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (size_t u = 0; u < units.size(); ++u)
    if (waiting[u] == 0) ready.push({units[u].at, static_cast<int>(u)});
  std::vector<ir::Node> out;
  out.reserve(units.size());
  while (!ready.empty()) {
    const int u = ready.top().second;
    ready.pop();
    out.push_back(unit_node(units[static_cast<size_t>(u)]));
    for (int r : readers[static_cast<size_t>(u)])
      if (--waiting[static_cast<size_t>(r)] == 0) ready.push({units[static_cast<size_t>(r)].at, r});
  }
  if (out.size() != units.size()) return 0;  // a cycle cannot happen (equal depths); keep the graph if it did
  g.nodes = std::move(out);
  g.reindex();
  return folded;
}

}  // namespace kiln
