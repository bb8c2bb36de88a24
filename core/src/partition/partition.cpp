// Convex grouping of claimed nodes.
//
// Nodes are visited in graph (topological) order. `reach[v]` is the set of groups that hold an
// ancestor of value v (its producer's own group included). A claimed node n may join group G, the
// group of one of its direct producers, unless
//   - another producer p of n lies outside G yet depends on G: a path G -> ... -> p -> n would leave
//     G and come back, so G could not run as one step (convexity); or
//   - n depends on a group X that itself depends on G: joining would make G and X depend on each
//     other, and no order could run both (group cycles; `group_deps` tracks group-level edges).
// When no group fits, n starts a new one. Groups only gain nodes later in the order, so a group
// checked convex stays convex.
#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>

#include "kiln/internal/ir_text.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/op_info.h"

namespace kiln {

void validate_claims(const ir::Graph& g, const std::vector<int64_t>& claimed, const std::string& plugin) {
  std::vector<char> seen(g.nodes.size(), 0);
  for (auto c : claimed) {
    if (c < 0 || static_cast<size_t>(c) >= g.nodes.size())
      throw std::invalid_argument("plugin '" + plugin + "' claimed node " + std::to_string(c) + ", but the graph has " +
                                  std::to_string(g.nodes.size()) + " nodes");
    if (seen[c]) throw std::invalid_argument("plugin '" + plugin + "' claimed node " + std::to_string(c) + " twice");
    seen[c] = 1;
  }
}

namespace {

// A collective (node_issues_collective: an all_reduce of the gradients) is issued as soon as the
// groups it reads have run: a group it depends on takes no later node, so that the collective
// overlaps what comes after it (overlap_collectives put it right after its inputs) instead of
// waiting for a group that grew past it. Its wait_tensor waits where it stands.

// Second phase: a node joins the group of one of its producers, so chains that start at graph
// inputs (an optimizer's update of its state) begin groups of their own, which the first phase
// never merges. Here a group A merges with a group B that reads it when nothing else connects
// them: no path A -> (another unit) -> B. Contracting such an edge keeps the unit graph acyclic
// and both groups convex. Passes repeat until nothing merges, one merge per pass.
void merge_adjacent_groups(const ir::Graph& g, Partition& p) {
  const size_t n_nodes = g.nodes.size();
  const bool collectives = std::any_of(g.nodes.begin(), g.nodes.end(), node_issues_collective);
  for (bool changed = true; changed;) {
    changed = false;
    const int32_t n_groups = static_cast<int32_t>(p.groups.size());
    if (n_groups < 2) return;
    // Units: eager node i is unit i, group k is unit n_nodes + k.
    auto unit_of = [&](int32_t node) {
      return p.group_of[node] < 0 ? node : static_cast<int32_t>(n_nodes) + p.group_of[node];
    };
    const size_t n_units = n_nodes + static_cast<size_t>(n_groups);
    std::vector<std::vector<int32_t>> succ(n_units);
    for (size_t i = 0; i < n_nodes; ++i)
      for (auto v : ir::Graph::node_inputs(g.nodes[i])) {
        const int32_t prod = g.value(v).producer;
        if (prod < 0) continue;
        const int32_t a = unit_of(prod), b = unit_of(static_cast<int32_t>(i));
        if (a != b) succ[a].push_back(b);
      }
    for (auto& s : succ) {
      std::sort(s.begin(), s.end());
      s.erase(std::unique(s.begin(), s.end()), s.end());
    }
    // Whether `to` is reachable from `from` other than by the direct edge.
    std::vector<int32_t> seen(n_units, -1);
    int32_t stamp = 0;
    auto other_path = [&](int32_t from, int32_t to) {
      ++stamp;
      std::vector<int32_t> stack;
      for (auto s : succ[from])
        if (s != to) stack.push_back(s);
      while (!stack.empty()) {
        const int32_t u = stack.back();
        stack.pop_back();
        if (u == to) return true;
        if (seen[u] == stamp) continue;
        seen[u] = stamp;
        for (auto s : succ[u]) stack.push_back(s);
      }
      return false;
    };
    // The collectives each unit feeds (reaches): A and B merge only when they feed the same ones,
    // or a collective that waited for A alone would wait for B too.
    std::vector<std::vector<int32_t>> feeds(n_units);
    if (collectives) {
      std::vector<std::vector<int32_t>> pred(n_units);
      for (size_t u = 0; u < n_units; ++u)
        for (auto s : succ[u]) pred[s].push_back(static_cast<int32_t>(u));
      for (size_t i = 0; i < n_nodes; ++i) {
        if (!node_issues_collective(g.nodes[i])) continue;
        std::vector<char> seen(n_units, 0);
        std::vector<int32_t> stack{unit_of(static_cast<int32_t>(i))};
        while (!stack.empty()) {
          const int32_t u = stack.back();
          stack.pop_back();
          if (seen[u]) continue;
          seen[u] = 1;
          feeds[u].push_back(static_cast<int32_t>(i));
          for (auto q : pred[u]) stack.push_back(q);
        }
      }
    }
    // Forward nodes computed again in the backward (Phase::Recompute) never share a group with
    // forward nodes: merged, they would be computed in the forward and kept again.
    std::vector<char> has_forward(static_cast<size_t>(n_groups), 0), has_recompute(static_cast<size_t>(n_groups), 0);
    for (size_t i = 0; i < n_nodes; ++i) {
      if (p.group_of[i] < 0) continue;
      if (g.nodes[i].phase == ir::Phase::Forward) has_forward[static_cast<size_t>(p.group_of[i])] = 1;
      if (g.nodes[i].phase == ir::Phase::Recompute) has_recompute[static_cast<size_t>(p.group_of[i])] = 1;
    }
    // One merge per pass: two merges that are each safe on this pass's graph can together make
    // a cycle (A->B and C->D with paths A~>D and C~>B), so the graph is rebuilt after each.
    std::vector<int32_t> merged_into(n_groups, -1);
    for (int32_t a = 0; a < n_groups && !changed; ++a) {
      const int32_t ua = static_cast<int32_t>(n_nodes) + a;
      for (auto ub : succ[ua]) {
        if (ub < static_cast<int32_t>(n_nodes)) continue;
        const int32_t b = ub - static_cast<int32_t>(n_nodes);
        if (p.groups[b].backend != p.groups[a].backend || feeds[ua] != feeds[ub] || other_path(ua, ub)) continue;
        if ((has_forward[static_cast<size_t>(a)] && has_recompute[static_cast<size_t>(b)]) ||
            (has_recompute[static_cast<size_t>(a)] && has_forward[static_cast<size_t>(b)]))
          continue;
        merged_into[b] = a;
        changed = true;
        break;
      }
    }
    if (!changed) break;
    // Renumber: groups that absorbed another keep their place, absorbed ones go.
    std::vector<int32_t> new_id(n_groups, -1);
    int32_t next = 0;
    for (int32_t k = 0; k < n_groups; ++k)
      if (merged_into[k] < 0) new_id[k] = next++;
    for (int32_t k = 0; k < n_groups; ++k)
      if (merged_into[k] >= 0) new_id[k] = new_id[merged_into[k]];
    std::vector<PartitionGroup> groups(static_cast<size_t>(next));
    for (int32_t k = 0; k < n_groups; ++k)
      if (merged_into[k] < 0) groups[new_id[k]].backend = p.groups[k].backend;
    for (size_t i = 0; i < n_nodes; ++i)
      if (p.group_of[i] >= 0) {
        p.group_of[i] = new_id[p.group_of[i]];
        groups[p.group_of[i]].nodes.push_back(static_cast<int32_t>(i));
      }
    p.groups = std::move(groups);
  }
}

// Third phase: views at a group's end run eagerly. A view whose result leaves its group (read
// only outside it, or a graph output) would be a group output, which the backend must write into
// memory of its own: a copy of every element (gpt's backward handed a plugin `view` then `permute`
// of one gradient as two outputs, two copies of 3 MB, the transposed one column by column; a group
// of nothing but views copied what eager makes in no time). Eagerly it is metadata over the
// group's output of its base. Only views that see all of their base (as many elements or more:
// view, reshape, permute, t, expand, detach, ...) leave: a slice's base may be much larger than
// the slice, and the group would have to write all of it. Removing a node that nothing in its
// group reads keeps the group convex and the unit graph acyclic (its readers were outside already).
// `readers[v]`: the nodes that read value v.
// A view with a base and results that are each as large as it is (view, reshape, permute, expand...;
// not a slice of a larger base).
bool sees_all_of_its_base(const ir::Graph& g, const ir::Node& n) {
  const auto ins = ir::Graph::node_inputs(n);
  if (ins.empty() || n.outputs.empty()) return false;
  const int64_t base = g.value(ins.front()).meta.numel();
  for (auto v : n.outputs)
    if (v == ir::kNoValue || g.value(v).meta.numel() < base) return false;
  return true;
}

void leave_trailing_views_out(const ir::Graph& g, const std::vector<std::vector<int32_t>>& readers, Partition& p) {
  bool removed = false;
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    auto& nodes = p.groups[gi].nodes;
    for (size_t k = nodes.size(); k-- > 0;) {
      const ir::Node& n = g.nodes[static_cast<size_t>(nodes[k])];
      const OpInfo& info = op_info(n.op);
      if (!info.is_view || info.is_mutable || !sees_all_of_its_base(g, n)) continue;
      bool leaves = true;
      for (auto v : n.outputs)
        for (auto r : readers[v]) leaves = leaves && p.group_of[r] != static_cast<int32_t>(gi);
      if (!leaves) continue;
      p.group_of[nodes[k]] = -1;
      nodes.erase(nodes.begin() + static_cast<long>(k));
      ++p.views_left_eager;
      removed = true;
    }
  }
  if (!removed) return;
  std::vector<int32_t> new_id(p.groups.size(), -1);
  std::vector<PartitionGroup> kept;
  for (size_t gi = 0; gi < p.groups.size(); ++gi)
    if (!p.groups[gi].nodes.empty()) {
      new_id[gi] = static_cast<int32_t>(kept.size());
      kept.push_back(std::move(p.groups[gi]));
    }
  for (auto& gr : p.group_of)
    if (gr >= 0) gr = new_id[static_cast<size_t>(gr)];
  p.groups = std::move(kept);
}

}  // namespace

Partition partition_graph(const ir::Graph& g, const std::vector<int64_t>& claimed,
                          const std::vector<int32_t>& claimed_by, bool views_at_ends_run_eagerly) {
  Partition p;
  const size_t n_nodes = g.nodes.size();
  p.group_of.assign(n_nodes, -1);
  if (!claimed_by.empty() && claimed_by.size() != claimed.size())
    throw std::logic_error("kiln partition: a backend for each claimed node, or none");
  std::vector<char> is_claimed(n_nodes, 0);
  std::vector<int32_t> owner(n_nodes, 0);  // the claiming backend of each claimed node
  for (size_t k = 0; k < claimed.size(); ++k) {
    is_claimed.at(static_cast<size_t>(claimed[k])) = 1;
    if (!claimed_by.empty()) owner[static_cast<size_t>(claimed[k])] = claimed_by[k];
  }

  // Groups a value depends on (its producer's group included). Small sorted vectors: most values
  // depend on few groups.
  std::vector<std::vector<int32_t>> reach(g.values.size());
  auto contains = [](const std::vector<int32_t>& s, int32_t x) { return std::binary_search(s.begin(), s.end(), x); };
  auto merge_into = [](std::vector<int32_t>& dst, const std::vector<int32_t>& src) {
    std::vector<int32_t> out;
    out.reserve(dst.size() + src.size());
    std::set_union(dst.begin(), dst.end(), src.begin(), src.end(), std::back_inserter(out));
    dst.swap(out);
  };
  auto producer_group = [&](ir::ValueId v) -> int32_t {
    const int32_t prod = g.value(v).producer;
    return prod < 0 ? -1 : p.group_of[prod];
  };

  // group_deps[X]: the groups X's nodes have ancestors in.
  std::vector<std::vector<int32_t>> group_deps;
  std::vector<char> sealed;       // a collective read the group: it takes no more nodes
  std::vector<char> has_forward;  // the group holds a forward node
  auto depends_on = [&](int32_t from, int32_t target) {
    std::vector<char> seen(group_deps.size(), 0);
    std::vector<int32_t> stack = {from};
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      if (x == target) return true;
      if (seen[x]) continue;
      seen[x] = 1;
      for (auto d : group_deps[x]) stack.push_back(d);
    }
    return false;
  };

  for (size_t i = 0; i < n_nodes; ++i) {
    const ir::Node& n = g.nodes[i];
    const auto inputs = ir::Graph::node_inputs(n);
    std::vector<int32_t> deps;
    for (auto v : inputs) merge_into(deps, reach[v]);
    int32_t group = -1;
    if (is_claimed[i]) {
      for (auto v : inputs) {
        const int32_t candidate = producer_group(v);
        if (candidate < 0 || p.groups[candidate].backend != owner[i] || sealed[candidate]) continue;
        // A forward node computed again in the backward stays out of the forward's groups (there it
        // would be computed in the forward and kept again: rematerialize).
        if (n.phase == ir::Phase::Recompute && has_forward[candidate]) continue;
        bool ok = true;
        for (auto u : inputs)
          if (producer_group(u) != candidate && contains(reach[u], candidate)) ok = false;
        for (auto x : deps)
          if (ok && x != candidate && depends_on(x, candidate)) ok = false;
        if (ok) {
          group = candidate;
          break;
        }
      }
      if (group < 0) {
        group = static_cast<int32_t>(p.groups.size());
        p.groups.emplace_back().backend = owner[i];
        group_deps.emplace_back();
        sealed.push_back(0);
        has_forward.push_back(0);
      }
      if (n.phase == ir::Phase::Forward) has_forward[group] = 1;
      for (auto x : deps)
        if (x != group) merge_into(group_deps[group], {x});
      p.group_of[i] = group;
      p.groups[group].nodes.push_back(static_cast<int32_t>(i));
      merge_into(deps, {group});
    } else if (node_issues_collective(n)) {
      for (auto x : deps) sealed[x] = 1;
    }
    for (auto v : n.outputs)
      if (v != ir::kNoValue) reach[v] = deps;
  }

  std::vector<std::vector<int32_t>> readers(g.values.size());
  for (size_t i = 0; i < n_nodes; ++i)
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) readers[v].push_back(static_cast<int32_t>(i));
  merge_adjacent_groups(g, p);
  if (views_at_ends_run_eagerly) leave_trailing_views_out(g, readers, p);

  // Each group's inputs and outputs.
  std::vector<char> is_graph_output(g.values.size(), 0);
  for (const auto& o : g.outputs) is_graph_output[o.value] = 1;
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    auto& grp = p.groups[gi];
    std::set<ir::ValueId> seen_in;
    for (auto ni : grp.nodes) {
      for (auto v : ir::Graph::node_inputs(g.nodes[ni]))
        if (producer_group(v) != static_cast<int32_t>(gi) && seen_in.insert(v).second) grp.inputs.push_back(v);
      for (auto v : g.nodes[ni].outputs) {
        if (v == ir::kNoValue) continue;
        bool escapes = is_graph_output[v];
        for (auto r : readers[v]) escapes = escapes || p.group_of[r] != static_cast<int32_t>(gi);
        if (escapes) grp.outputs.push_back(v);
      }
    }
  }

  // Order: Kahn's algorithm over units (eager nodes and whole groups), ties broken by the position
  // of the unit's first node so that the order stays close to the captured one.
  const size_t n_units = n_nodes;  // unit id: node index for eager nodes, first node for groups
  std::vector<int32_t> unit_of(n_nodes);
  for (size_t i = 0; i < n_nodes; ++i)
    unit_of[i] = p.group_of[i] < 0 ? static_cast<int32_t>(i) : p.groups[p.group_of[i]].nodes.front();
  std::vector<std::set<int32_t>> succ(n_units);
  std::vector<int32_t> indegree(n_units, 0);
  for (size_t i = 0; i < n_nodes; ++i)
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) {
      const int32_t prod = g.value(v).producer;
      if (prod < 0) continue;
      const int32_t a = unit_of[prod], b = unit_of[i];
      if (a != b && succ[a].insert(b).second) ++indegree[b];
    }
  // Random ops keep their captured order among themselves: each draws from the generator state the
  // one before it left, as in the eager step.
  int32_t last_random = -1;
  for (size_t i = 0; i < n_nodes; ++i) {
    if (!node_draws_random_numbers(g.nodes[i])) continue;
    const int32_t b = unit_of[i];
    if (last_random >= 0 && last_random != b && succ[last_random].insert(b).second) ++indegree[b];
    last_random = b;
  }
  std::set<int32_t> ready;
  for (size_t i = 0; i < n_nodes; ++i)
    if (unit_of[i] == static_cast<int32_t>(i) && indegree[i] == 0) ready.insert(static_cast<int32_t>(i));
  while (!ready.empty()) {
    const int32_t u = *ready.begin();
    ready.erase(ready.begin());
    p.order.push_back(p.group_of[u] < 0 ? u : -(p.group_of[u] + 1));
    for (auto s : succ[u])
      if (--indegree[s] == 0) ready.insert(s);
  }
  size_t units = 0;
  for (size_t i = 0; i < n_nodes; ++i) units += unit_of[i] == static_cast<int32_t>(i);
  if (p.order.size() != units) throw std::logic_error("kiln partition: the groups formed a cycle (a bug in kiln)");
  return p;
}

std::string partition_key(const ir::Graph& g, const std::vector<int64_t>& claimed,
                          const std::vector<int32_t>& claimed_by, bool views_at_ends_run_eagerly) {
  std::string key;
  key.reserve(g.nodes.size() * 48 + claimed.size() * 12);
  auto put = [&](int64_t x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
  put(views_at_ends_run_eagerly);
  put(static_cast<int64_t>(g.values.size()));
  for (const auto& n : g.nodes) {
    key += n.op;
    key += '\0';
    const auto ins = ir::Graph::node_inputs(n);
    put(static_cast<int64_t>(ins.size()));
    for (auto v : ins) put(v);
    put(static_cast<int64_t>(n.outputs.size()));
    for (auto v : n.outputs) put(v);
    const OpInfo& info = op_info(n.op);
    put(node_issues_collective(n) * 2 + node_draws_random_numbers(n));
    if (info.is_view && !info.is_mutable) put(sees_all_of_its_base(g, n));
  }
  put(static_cast<int64_t>(g.outputs.size()));
  for (const auto& o : g.outputs) put(o.value);
  put(static_cast<int64_t>(claimed.size()));
  for (auto c : claimed) put(c);
  for (auto b : claimed_by) put(b);
  return key;
}

std::string print_partition(const ir::Graph& g, const Partition& p) {
  std::ostringstream os;
  auto ids = [](const std::vector<ir::ValueId>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", %" : "%") + std::to_string(v[i]);
    return s;
  };
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    const auto& grp = p.groups[gi];
    os << "group " << gi << " (" << grp.nodes.size() << " nodes) inputs [" << ids(grp.inputs) << "] outputs ["
       << ids(grp.outputs) << "]\n";
    for (auto ni : grp.nodes) os << "  node " << ni << " " << g.nodes[ni].op << "\n";
  }
  size_t eager = 0;
  for (auto x : p.group_of) eager += x < 0;
  os << "eager: " << eager << " nodes\norder:";
  for (auto u : p.order) os << " " << (u >= 0 ? "n" + std::to_string(u) : "G" + std::to_string(-u - 1));
  os << "\n";
  return os.str();
}

}  // namespace kiln
