// overlap_collectives: each all_reduce as early as its inputs allow, so that the gradients of the
// last layers are on the wire while the backward of the first layers still computes (what c10d's
// reducer does with its bucket hooks).
//
// The captured step runs the gradient reducer after the whole backward: every bucket's flatten,
// all_reduce and wait come last. A functional graph may run in any order that respects its edges,
// so this pass moves, for the k-th all_reduce A_k, everything A_1..A_k need (their ancestors) before
// everything else, keeping the captured order within each part:
//
//   [ancestors of A_1, A_1] [ancestors of A_2 not yet placed, A_2] ... [the rest, waits included]
//
// The all_reduces keep their order (every rank issues them in the same order, as NCCL and Gloo
// require), each wait_tensor stays where the reducer put it (so it waits as late as the step allows)
// and nodes that must keep their order among themselves keep it: random ops (each draws from the
// generator state the one before it left) and in-place ops; when one of them has to move up, all
// of them before it move up too.
#include <algorithm>
#include <vector>

#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {

namespace {

// An op that writes into an argument (in place or out=), as its schema says; for an op the
// dispatcher does not know, a name ending in '_' (before its overload).
bool writes_in_place(const ir::Node& n) {
  const OpInfo& info = op_info(n.op);
  if (info.found) return info.is_mutable;
  const auto dot = n.op.find('.');
  const std::string base = n.op.substr(0, dot);
  return !base.empty() && base.back() == '_';
}

}  // namespace

size_t overlap_collectives(ir::Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<size_t> reduces, ordered;
  for (size_t i = 0; i < n; ++i) {
    if (node_issues_collective(g.nodes[i])) reduces.push_back(i);
    if (node_draws_random_numbers(g.nodes[i]) || writes_in_place(g.nodes[i])) ordered.push_back(i);
  }
  if (reduces.empty()) return 0;

  // block[i]: the part node i is placed in (reduces.size() for the rest).
  std::vector<size_t> block(n, reduces.size());
  size_t moved = 0;
  for (size_t k = 0; k < reduces.size(); ++k) {
    std::vector<size_t> stack{reduces[k]};
    auto take = [&](size_t i) {
      if (block[i] != reduces.size()) return;  // placed in this part or an earlier one
      block[i] = k;
      stack.push_back(i);
    };
    block[reduces[k]] = k;
    while (!stack.empty()) {
      const size_t i = stack.back();
      stack.pop_back();
      for (auto v : ir::Graph::node_inputs(g.nodes[i])) {
        const int32_t p = g.value(v).producer;
        if (p >= 0) take(static_cast<size_t>(p));
      }
      // An order-keeping node moves up only with every order-keeping node before it.
      if (std::binary_search(ordered.begin(), ordered.end(), i))
        for (size_t o : ordered) {
          if (o >= i) break;
          take(o);
        }
    }
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return block[a] < block[b]; });
  for (size_t i = 0; i < n; ++i) moved += order[i] != i;
  if (moved == 0) return 0;
  std::vector<ir::Node> nodes;
  nodes.reserve(n);
  for (size_t i : order) nodes.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(nodes);
  g.reindex();
  return moved;
}

}  // namespace kiln
