// Materialization: which values of a lowered subgraph get a buffer, which buffer, and the order
// to compute them in.
#include "materialize.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>

#include "lowering.h"

namespace kiln::inductor {

using plugin::Graph;
using plugin::Node;
using plugin::Unimplemented;

namespace {

void alias_extern_output(LoweredGraph* L, int64_t out) {
  auto val = [L](int64_t v) -> ValueInfo& { return L->values[static_cast<size_t>(v)]; };
  ValueInfo& o = val(out);
  if (o.kind != ValueInfo::Kind::View) return;
  int root = o.src;
  while (val(root).kind == ValueInfo::Kind::View && !val(root).materialized) root = val(root).src;
  ValueInfo& r = val(root);
  // A result already placed (an output itself, or aliased by another output) keeps its buffer.
  if (r.kind != ValueInfo::Kind::Extern || r.buffer >= 0) return;
  if (r.ty != o.ty || r.shape != o.shape || r.storage_offset != o.storage_offset) return;
  for (size_t d = 0; d < o.shape.size(); ++d)
    if (o.shape[d] != 1 && o.strides[d] != r.strides[d]) return;
  // The views must map every index to itself (dims of extent 1 aside).
  ExprPool trial;
  Idx idx;
  for (size_t d = 0; d < o.shape.size(); ++d) idx.push_back(Index::var(trial.new_var()));
  const Expr& x = trial.at(L->compute(trial, static_cast<int>(out), idx));
  if (x.k != Expr::K::Load || x.value != root || !x.logical_known || x.logical.size() != idx.size()) return;
  for (size_t d = 0; d < idx.size(); ++d)
    if (o.shape[d] != 1 && x.logical[d].key() != idx[d].key()) return;
  r.buffer = o.buffer;
  o.alias_of = root;
}

// An output that is a view of a value computed in the group (a reshape of a GELU's result that the
// backward keeps, a layer norm's output seen as [rows, features] for the next matmul, a matmul's
// [rows, features] result seen as [batch, time, features] for the attention's backward) takes the
// value's place in memory when the two are the same memory: the value is computed straight into
// the output's buffer (an extern kernel writes it there) instead of into scratch and copied. Same
// memory means the same dtype, both dense (as many elements as their buffers span) and every index
// of the output addressing the element the view reads.
void alias_computed_output(LoweredGraph* L, int64_t out) {
  auto val = [L](int64_t v) -> ValueInfo& { return L->values[static_cast<size_t>(v)]; };
  ValueInfo& o = val(out);
  if (o.kind != ValueInfo::Kind::View && o.kind != ValueInfo::Kind::Reshape) return;
  int root = o.src;
  while (val(root).kind == ValueInfo::Kind::View && !val(root).materialized) root = val(root).src;
  ValueInfo& r = val(root);
  if (r.kind != ValueInfo::Kind::Pointwise && r.kind != ValueInfo::Kind::Reduction && r.kind != ValueInfo::Kind::Extern)
    return;
  if (r.buffer >= 0 || r.ty != o.ty || r.storage_offset != 0 || o.storage_offset != 0) return;
  if (r.numel() == 0 || r.numel() != o.numel() || r.extent() != r.numel() || o.extent() != o.numel()) return;
  const bool was_materialized = r.materialized;
  r.materialized = true;  // so that the view reads it from memory: the load's offset is the test
  ExprPool trial;
  Idx idx;
  for (size_t d = 0; d < o.shape.size(); ++d)
    idx.push_back(o.shape[d] == 1 ? Index::constant(0) : Index::var(trial.new_var()));
  const Expr& x = trial.at(L->compute(trial, static_cast<int>(out), idx));
  if (x.k != Expr::K::Load || x.value != root || x.idx.key() != LoweredGraph::offset(o, idx).key()) {
    r.materialized = was_materialized;
    return;
  }
  r.buffer = o.buffer;
  o.alias_of = root;
}

// What extern node `node` reads: its arguments, or more where neighbours folded into it.
std::vector<int64_t> extern_reads(const Graph& g, const LoweredGraph& L, int node) {
  auto it = L.extern_inputs.find(node);
  return it != L.extern_inputs.end() ? it->second : g.node(node).inputs();
}

}  // namespace

// Buffers: inputs and outputs are the execute() tensors; every other materialized value gets a
// scratch slot. Pointwise values read by several consumers get a buffer when recomputing them
// would cost more than a load.
void materialize(const Graph& g, LoweredGraph* L) {
  auto val = [L](int64_t v) -> ValueInfo& { return L->values[static_cast<size_t>(v)]; };
  const auto outs = g.outputs();
  const auto ins = g.inputs();
  for (size_t i = 0; i < ins.size(); ++i) val(ins[i]).buffer = static_cast<int>(i);
  std::set<int64_t> seen;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (!seen.insert(outs[j]).second) throw Unimplemented("a value is output twice");
    if (val(outs[j]).kind == ValueInfo::Kind::Input) throw Unimplemented("an input is passed through as an output");
    val(outs[j]).materialized = true;
    val(outs[j]).buffer = static_cast<int>(ins.size() + j);
  }
  // An output that is an extern kernel's result seen through views that change nothing (the
  // detach of a matmul's weight gradient, a transpose of a transpose) gets the kernel's result
  // written straight into its buffer; otherwise the result would go to scratch and be copied.
  for (size_t j = 0; j < outs.size(); ++j) alias_extern_output(L, outs[j]);
  for (size_t j = 0; j < outs.size(); ++j) alias_computed_output(L, outs[j]);
  // Extern arguments must be tensors in memory.
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    Node n = g.node(static_cast<int64_t>(i));
    // Lowered as an extern kernel (an extern op the CUDA kernels compute is not one).
    if (n.outputs().empty() || n.outputs()[0] < 0 || val(n.outputs()[0]).kind != ValueInfo::Kind::Extern) continue;
    // A node folded into a matmul reads nothing itself: the matmul reads what it needs.
    if (val(n.outputs()[0]).ext.node != static_cast<int>(i)) continue;
    for (int64_t v : extern_reads(g, *L, static_cast<int>(i))) {
      int root = static_cast<int>(v);
      while (!val(root).materialized &&
             (val(root).kind == ValueInfo::Kind::View || val(root).kind == ValueInfo::Kind::Reshape))
        root = val(root).src;
      val(root).materialized = true;
    }
  }
  for (auto& info : L->values) {
    if ((info.kind == ValueInfo::Kind::Reduction || info.kind == ValueInfo::Kind::Extern) && !info.dead)
      info.materialized = true;
  }
  for (size_t v = 0; v < L->values.size(); ++v) {
    ValueInfo& info = L->values[v];
    if (info.materialized || info.kind != ValueInfo::Kind::Pointwise || info.users < 2) continue;
    ExprPool trial;
    Idx idx;
    for (size_t d = 0; d < info.shape.size(); ++d) idx.push_back(Index::var(trial.new_var()));
    L->compute(trial, static_cast<int>(v), idx);
    if (trial.size() > 12) info.materialized = true;
  }
  const size_t first_scratch = ins.size() + outs.size();
  for (size_t v = 0; v < L->values.size(); ++v) {
    ValueInfo& info = L->values[v];
    if (!info.materialized || info.buffer >= 0) continue;
    info.buffer = static_cast<int>(first_scratch + L->scratch_bytes.size());
    L->scratch_bytes.push_back(std::max<int64_t>(info.extent(), 1) * static_cast<int64_t>(ty_size(info.ty)));
  }
  // The order to compute materialized values in: dependencies first (found by evaluating each
  // definition once), creation order among independent ones.
  std::vector<int> cand;
  for (size_t v = 0; v < L->values.size(); ++v)
    if (L->values[v].materialized && L->values[v].kind != ValueInfo::Kind::Input && L->values[v].alias_of < 0)
      cand.push_back(static_cast<int>(v));
  // A value computed by the extern it aliases.
  auto producer = [&](int v) {
    return L->values[static_cast<size_t>(v)].alias_of >= 0 ? L->values[static_cast<size_t>(v)].alias_of : v;
  };
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return L->values[a].order < L->values[b].order; });
  std::map<int, std::vector<int>> deps;
  for (int v : cand) {
    const ValueInfo& info = L->values[static_cast<size_t>(v)];
    std::vector<int>& d = deps[v];
    if (info.kind == ValueInfo::Kind::Extern) {
      for (int64_t in : extern_reads(g, *L, info.ext.node)) {
        int root = static_cast<int>(in);
        while (!val(root).materialized &&
               (val(root).kind == ValueInfo::Kind::View || val(root).kind == ValueInfo::Kind::Reshape))
          root = val(root).src;
        d.push_back(producer(root));
      }
      continue;
    }
    ExprPool trial;
    Idx idx;
    for (size_t k = 0; k < info.shape.size(); ++k) idx.push_back(Index::var(trial.new_var()));
    if (info.kind == ValueInfo::Kind::Reduction) {
      Idx red;
      for (size_t k = 0; k < info.red.red_shape.size(); ++k) red.push_back(Index::var(trial.new_var()));
      info.red.body(trial, idx, red);
    } else {
      L->compute(trial, v, idx);
    }
    for (size_t e = 0; e < trial.size(); ++e) {
      const Expr& x = trial.at(static_cast<int>(e));
      if (x.k == Expr::K::Load && x.value >= 0 && x.value != v) d.push_back(producer(x.value));
    }
  }
  std::vector<char> state(L->values.size(), 0);
  std::vector<int> order;
  std::function<void(int)> visit = [&](int v) {
    if (state[static_cast<size_t>(v)] == 2 || !deps.count(v)) return;
    if (state[static_cast<size_t>(v)] == 1) throw std::logic_error("cycle among materialized values");
    state[static_cast<size_t>(v)] = 1;
    for (int d : deps[v]) visit(d);
    state[static_cast<size_t>(v)] = 2;
    order.push_back(v);
  };
  for (int v : cand) visit(v);
  L->order = std::move(order);
}

}  // namespace kiln::inductor
